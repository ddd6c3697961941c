"""The empirical NTK of a finite convolutional ResNet approaching its infinite-width limit, written against
neural-tangents' API.

For a network ``f(theta, x)`` the empirical NTK at parameters ``theta`` is ``Theta_hat(x, x') = J(x) J(x')^T``
with ``J = df/dtheta`` (``nt.empirical_ntk_fn``); the Monte-Carlo kernels average ``J J^T`` and ``f f^T`` over
``n_samples`` independent initialisations (``nt.monte_carlo_kernel_fn``). As the number of channels ``n`` grows,
both converge to the deterministic limits that ``kernel_fn(x1, x2, 'ntk')`` / ``'nngp'`` compute in closed form; a
single draw's relative error shrinks like ``1 / sqrt(n)``.

The network: a 3x3 convolution, two residual blocks ``x + Conv(Relu(Conv(Relu(x))))`` (``FanOut``, ``parallel``,
``FanInSum``), global average pooling and a dense readout. The numbers printed are relative Frobenius errors
``||K_hat - K|| / ||K||`` per width. The NTK's error shrinks with the width; the Monte-Carlo NNGP's does not by much:
``f f^T`` of a single output fluctuates by O(1) at any width, so its error is set by ``n_samples``, not ``n``.
The Monte-Carlo kernels use ``NtkImplementation.STRUCTURED_DERIVATIVES`` (the default Jacobian contraction,
batched over samples, hits a convolution batching rule that current JAX does not implement).

With its two imports changed to neural-tangents', the program runs unchanged under neural-tangents 0.6.5
(``tests/test_examples_nt.py``: the infinite-width kernels agree to round-off; the finite-width errors are random,
so there the conclusion is compared).

Run: ``python docs/examples/nt_resnet_empirical_ntk.py`` (``SMNNGP_FAST=1``: two widths, four samples).
"""

import os

import jax
import numpy as np

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
WIDTHS = (16, 128) if FAST else (16, 64, 256, 1024)
N_SAMPLES = 4 if FAST else 16
RESULTS = {}


def block(width):
    residual = stax.serial(stax.Relu(), stax.Conv(width, (3, 3), padding="SAME", W_std=1.4),
                           stax.Relu(), stax.Conv(width, (3, 3), padding="SAME", W_std=1.4))
    return stax.serial(stax.FanOut(2), stax.parallel(residual, stax.Identity()), stax.FanInSum())


def resnet(width):
    return stax.serial(
        stax.Conv(width, (3, 3), padding="SAME", W_std=1.4, b_std=0.1),
        block(width), block(width),
        stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1, W_std=1.4, b_std=0.1))


x = jax.numpy.asarray(np.random.RandomState(0).normal(size=(3, 4, 4, 2)))

kernel_fn = resnet(1)[2]
limit = kernel_fn(x, None, ("nngp", "ntk"))
RESULTS["nngp_limit"] = np.asarray(limit.nngp)
RESULTS["ntk_limit"] = np.asarray(limit.ntk)


def rel_frobenius(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


for width in WIDTHS:
    init_fn, apply_fn, _ = resnet(width)
    _, params = jax.jit(init_fn, static_argnums=1)(jax.random.PRNGKey(1), x.shape)
    ntk_single = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=0))(x, None, params)
    mc_fn = nt.monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(2), N_SAMPLES, vmap_axes=0,
                                     implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES)
    mc = mc_fn(x, None, ("nngp", "ntk"))
    errors = {"ntk_single": rel_frobenius(ntk_single, limit.ntk),
              "ntk_mc": rel_frobenius(mc.ntk, limit.ntk),
              "nngp_mc": rel_frobenius(mc.nngp, limit.nngp)}
    for key, value in errors.items():
        RESULTS.setdefault(f"err_{key}", []).append(value)
    print(f"width {width:5d}: relative error of one draw's NTK {errors['ntk_single']:.3f}, "
          f"of the {N_SAMPLES}-sample Monte-Carlo NTK {errors['ntk_mc']:.3f} and NNGP {errors['nngp_mc']:.3f}")

RESULTS = {k: np.asarray(v) for k, v in RESULTS.items()}
RESULTS["widths"] = np.asarray(WIDTHS)
