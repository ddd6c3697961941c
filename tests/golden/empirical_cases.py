"""Networks and settings of the empirical-kernel fixtures, shared by neural-tangents (generator) and smnngp (test).

Imports only jax and numpy: each network is a plain function ``f(params, x, **kwargs)`` whose parameters come
from a numpy seed, so both libraries differentiate the very same function.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _dense(rng, shapes):
    return {k: rng.standard_normal(s) / np.sqrt(max(s[0], 1)) for k, s in shapes.items()}


def _bias(h, b):
    """``h + b`` with ``b`` broadcast over ``h``'s leading axes explicitly (the tests run with rank promotion off)."""
    return h + jnp.reshape(b, (1,) * (h.ndim - 1) + (-1,))


def mlp(p, x, **kwargs):
    h = jnp.tanh(_bias(x @ p["W1"], p["b1"]))
    h = jnp.sin(_bias(h @ p["W2"], p["b2"]))
    return h @ p["W3"]


def cnn(p, x, **kwargs):
    dn = ("NHWC", "HWIO", "NHWC")
    h = _bias(jax.lax.conv_general_dilated(x, p["k1"], (1, 1), "SAME", dimension_numbers=dn), p["c1"])
    h = jnp.tanh(h)
    h = jax.lax.conv_general_dilated(h, p["k2"], (2, 2), "VALID", dimension_numbers=dn)
    h = jnp.sin(h)
    return h.reshape(h.shape[0], -1) @ p["W"]


def resnet(p, x, **kwargs):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.lax.conv_general_dilated(x, p["k0"], (1, 1), "SAME", dimension_numbers=dn)
    r = jnp.tanh(_bias(jax.lax.conv_general_dilated(h, p["k1"], (1, 1), "SAME", dimension_numbers=dn), p["c1"]))
    r = jax.lax.conv_general_dilated(r, p["k2"], (1, 1), "SAME", dimension_numbers=dn)
    h = jnp.sin(h + r)
    return jnp.mean(h, axis=(1, 2)) @ p["W"]


def attention(p, x, **kwargs):
    q, k, v = x @ p["Wq"], x @ p["Wk"], x @ p["Wv"]
    logits = jnp.einsum("nsd,ntd->nst", q, k) / np.sqrt(q.shape[-1])
    a = jax.nn.softmax(logits, axis=-1)
    h = jnp.einsum("nst,ntd->nsd", a, v) @ p["Wo"] + x
    return jnp.tanh(h) @ p["Wr"]


def networks():
    """``{name: (f, params, x1_shape, x2_shape)}`` with float64 numpy parameters from fixed seeds."""
    r = np.random.default_rng(0)
    return {
        "mlp": (mlp, _dense(r, {"W1": (4, 6), "b1": (6,), "W2": (6, 5), "b2": (5,), "W3": (5, 3)}),
                (3, 4), (2, 4)),
        "cnn": (cnn, _dense(r, {"k1": (2, 2, 2, 3), "c1": (3,), "k2": (2, 2, 3, 4), "W": (2 * 2 * 4, 2)}),
                (3, 4, 4, 2), (2, 4, 4, 2)),
        "resnet": (resnet, _dense(r, {"k0": (1, 1, 2, 3), "k1": (3, 3, 3, 3), "c1": (3,), "k2": (3, 3, 3, 3),
                                      "W": (3, 2)}), (3, 4, 4, 2), (2, 4, 4, 2)),
        "attention": (attention, _dense(r, {"Wq": (4, 4), "Wk": (4, 4), "Wv": (4, 4), "Wo": (4, 4),
                                            "Wr": (4, 2)}), (2, 3, 4), (3, 3, 4)),
    }


# (name suffix, trace_axes, diagonal_axes, vmap_axes, x2 given)
SETTINGS = [
    ("logits", (-1,), (), None, True),
    ("full", (), (), None, True),
    ("vmap", (-1,), (), 0, True),
    ("full_vmap_x2none", (), (), 0, False),
    ("diag_batch", (-1,), (0,), 0, False),
]


def inputs(name, x1_shape, x2_shape):
    r = np.random.default_rng(sum(map(ord, name)))
    return r.standard_normal(x1_shape), r.standard_normal(x2_shape)


def mc_init_fn(key, input_shape):
    """A 2-layer tanh MLP initialiser written with jax.random only (same stream in both libraries)."""
    k1, k2 = jax.random.split(key)
    d = input_shape[-1]
    return (input_shape[0], 2), {"W1": jax.random.normal(k1, (d, 16)) / np.sqrt(d),
                                 "W2": jax.random.normal(k2, (16, 2)) / 4.0}


def mc_apply_fn(p, x, **kwargs):
    return jnp.tanh(x @ p["W1"]) @ p["W2"]
