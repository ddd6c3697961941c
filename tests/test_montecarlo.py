"""Finite networks built by `init_fn`/`apply_fn` converge to `kernel_fn`.

* NNGP: the empirical second moment of the outputs over M = 2,000 random
  initialisations of width 512 (2,048 for the one-hidden-layer network) must match ``kernel_fn(...).nngp`` entrywise
  within 4 standard errors (SE of the mean of f(x_i) f(x_j) over draws).
  With 15 entries per architecture and Gaussian-ish errors, a correct kernel
  fails this with probability < 1e-3; a kernel off by 10% fails it surely
  (10% is > 6 SE here). The finite-width bias of the second moment, O(1 / width), is
  about 0.2% at width 512, far inside 4 SE (~3% of an entry at M = 2,000); the width is
  kept small because drawing M hidden 512 x 512 matrices is most of the test's time.
* NTK: the empirical NTK (Jacobian contraction over all parameters) of
  width-2,048 networks, averaged over 4 draws, is within 5% relative
  Frobenius error of ``.ntk``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import empirical_ntk, monte_carlo_nngp

M = 2000
CHUNK = 250


def _archs():
    return {
        "mlp_erf_relu": (
            stax.serial(stax.Dense(512, 1.5, 0.1), stax.Erf(), stax.Dense(512, 1.2, 0.2), stax.Relu(),
                        stax.Dense(1, 1.0, 0.0)),
            (5, 3),
        ),
        "mlp_gelu_standard": (
            stax.serial(stax.Dense(2048, 1.3, 0.3, parameterization="standard"), stax.Gelu(),
                        stax.Dense(1, 1.1, 0.1, parameterization="standard")),
            (5, 4),
        ),
        "cnn_relu_avgpool": (
            stax.serial(stax.Conv(512, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                        stax.AvgPool((2, 2), strides=(2, 2)), stax.Flatten(), stax.Dense(1, 1.0)),
            (5, 4, 4, 2),
        ),
    }


@pytest.mark.parametrize("name", sorted(_archs()))
def test_empirical_nngp_within_4_standard_errors(name):
    layer, shape = _archs()[name]
    x = jax.random.normal(jax.random.PRNGKey(1), shape, dtype=jnp.float32)
    emp, se = monte_carlo_nngp(layer[0], layer[1], x, jax.random.PRNGKey(2), M, CHUNK)
    k = np.asarray(layer[2](x.astype(jnp.float64), None, "nngp"))
    iu = np.triu_indices(shape[0])
    z = np.abs(emp - k)[iu] / se[iu]
    assert z.max() < 4.0, f"{name}: worst entry is {z.max():.2f} SE away; emp={emp[iu]}, kernel={k[iu]}"


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
    emp = sum(np.asarray(empirical_ntk(layer[1], layer[0](k, x.shape)[1], x)) for k in keys) / len(keys)
    ntk = np.asarray(layer[2](x, None, "ntk"))
    err = np.linalg.norm(emp - ntk) / np.linalg.norm(ntk)
    assert err < 0.05, f"{name}: relative Frobenius error {err:.3f}"


def test_empirical_ntk_of_a_linear_layer_is_exact():
    # For one Dense layer the parameter gradient is deterministic: the empirical NTK
    # equals the infinite-width NTK for every draw, and is the same for every output channel.
    layer = stax.Dense(3, W_std=1.7, b_std=0.4)
    x1 = jax.random.normal(jax.random.PRNGKey(5), (4, 6), dtype=jnp.float64)
    x2 = jax.random.normal(jax.random.PRNGKey(6), (3, 6), dtype=jnp.float64)
    _, params = layer[0](jax.random.PRNGKey(7), x1.shape)
    np.testing.assert_allclose(empirical_ntk(layer[1], params, x1, x2), layer[2](x1, x2, "ntk"), rtol=1e-12)
