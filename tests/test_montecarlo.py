"""Finite networks built by `init_fn`/`apply_fn` converge to `kernel_fn`.

* NNGP: the empirical second moment of the outputs over M = 2,000 random
  initialisations of width 1,024 must match ``kernel_fn(...).nngp`` entrywise
  within 4 standard errors (SE of the mean of f(x_i) f(x_j) over draws).
  With 15 entries per architecture and Gaussian-ish errors, a correct kernel
  fails this with probability < 1e-3; a kernel off by 10% fails it surely
  (10% is > 6 SE here).
* NTK: the empirical NTK (Jacobian contraction over all parameters) of
  width-2,048 networks, averaged over 4 draws, is within 5% relative
  Frobenius error of ``.ntk``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax

M = 2000
CHUNK = 250


def _archs():
    return {
        "mlp_erf_relu": (
            stax.serial(stax.Dense(1024, 1.5, 0.1), stax.Erf(), stax.Dense(1024, 1.2, 0.2), stax.Relu(),
                        stax.Dense(1, 1.0, 0.0)),
            (5, 3),
        ),
        "mlp_gelu_standard": (
            stax.serial(stax.Dense(2048, 1.3, 0.3, parameterization="standard"), stax.Gelu(),
                        stax.Dense(1, 1.1, 0.1, parameterization="standard")),
            (5, 4),
        ),
        "cnn_relu_avgpool": (
            stax.serial(stax.Conv(1024, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                        stax.AvgPool((2, 2), strides=(2, 2)), stax.Flatten(), stax.Dense(1, 1.0)),
            (5, 4, 4, 2),
        ),
    }


def _outputs(layer, x, key, n_draws):
    init_fn, apply_fn, _ = layer

    @jax.jit
    def draw(keys):
        def one(k):
            _, params = init_fn(k, x.shape)
            return apply_fn(params, x)[:, 0]

        return jax.vmap(one)(keys)

    keys = jax.random.split(key, n_draws)
    return np.concatenate([np.asarray(draw(keys[i : i + CHUNK])) for i in range(0, n_draws, CHUNK)])


@pytest.mark.parametrize("name", sorted(_archs()))
def test_empirical_nngp_within_4_standard_errors(name):
    layer, shape = _archs()[name]
    x = jax.random.normal(jax.random.PRNGKey(1), shape, dtype=jnp.float32)
    f = _outputs(layer, x, jax.random.PRNGKey(2), M).astype(np.float64)  # (M, n)
    prods = f[:, :, None] * f[:, None, :]
    emp = prods.mean(0)
    se = prods.std(0, ddof=1) / np.sqrt(M)
    k = np.asarray(layer[2](x.astype(jnp.float64), None, "nngp"))
    iu = np.triu_indices(shape[0])
    z = np.abs(emp - k)[iu] / se[iu]
    assert z.max() < 4.0, f"{name}: worst entry is {z.max():.2f} SE away; emp={emp[iu]}, kernel={k[iu]}"


def _empirical_ntk(layer, x, key):
    init_fn, apply_fn, _ = layer
    _, params = init_fn(key, x.shape)
    jac = jax.jacrev(lambda p: apply_fn(p, x)[:, 0])(params)
    leaves = [j.reshape(x.shape[0], -1) for j in jax.tree_util.tree_leaves(jac)]
    return sum(l @ l.T for l in leaves)


@pytest.mark.parametrize(
    "name,layer,shape",
    [
        ("mlp_relu_erf", stax.serial(stax.Dense(2048, 1.4, 0.1), stax.Relu(), stax.Dense(2048, 1.2, 0.1),
                                     stax.Erf(), stax.Dense(1, 1.0, 0.1)), (6, 3)),
        ("mlp_relu_standard", stax.serial(stax.Dense(2048, 1.4, 0.1, parameterization="standard"), stax.Relu(),
                                          stax.Dense(1, 1.0, 0.1, parameterization="standard")), (6, 3)),
        ("cnn_relu_gap", stax.serial(stax.Conv(2048, (3,), padding="SAME", W_std=1.3, b_std=0.2), stax.Relu(),
                                     stax.GlobalAvgPool(), stax.Dense(1, 1.0)), (6, 5, 2)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_empirical_ntk_within_5_percent(name, layer, shape):
    x = jax.random.normal(jax.random.PRNGKey(3), shape, dtype=jnp.float64)
    keys = jax.random.split(jax.random.PRNGKey(4), 4)
    emp = sum(np.asarray(_empirical_ntk(layer, x, k)) for k in keys) / len(keys)
    ntk = np.asarray(layer[2](x, None, "ntk"))
    err = np.linalg.norm(emp - ntk) / np.linalg.norm(ntk)
    assert err < 0.05, f"{name}: relative Frobenius error {err:.3f}"
