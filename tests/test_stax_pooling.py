"""Pooling and shape layers: finite networks against their kernels, layouts, closed forms and errors.

Golden values from neural-tangents are in tests/golden/cases_pooling.py (run by tests/test_golden.py); here:

* Monte Carlo: width-256 networks through SumPool, ImageResize, Index, DotGeneral, (NCHW) GlobalSumPool; 400
  initialisations; the empirical output covariance must match the NNGP within 4 standard errors plus 3% of the
  kernel's scale (the finite-width bias of one hidden layer of width 256 is O(1/256); a wrong window, resize
  matrix, index or contraction moves entries by far more);
* layouts: NCHW layers give the kernels of the NHWC ones on transposed inputs, and their finite outputs are the
  transposed outputs;
* closed forms: GlobalSumPool is P^2 GlobalAvgPool, SumPool is |window|^2 AvgPool (VALID), nearest upsampling by
  an integer factor repeats the kernel's entries;
* errors name the layer and what is wrong.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import monte_carlo_nngp

S = stax


def _x(shape, seed=0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape))


def test_monte_carlo_matches_kernel():
    r = jnp.asarray(np.random.RandomState(3).normal(size=(3, 2)))
    net = S.serial(
        S.Conv(256, (3, 3), padding="SAME", W_std=1.5, b_std=0.1), S.Relu(),
        S.SumPool((2, 2), padding="SAME"),
        S.ImageResize((-1, 5, 7, -1), "linear"),
        S.Index(S.Slice[:, 1:4, ::2]),
        S.DotGeneral(rhs=r, dimension_numbers=(((1,), (0,)), ((), ()))),  # (N, 4, C, 2): H contracted
        S.Flatten(), S.Dense(1, W_std=1.0),
    )
    x = _x((4, 6, 5, 2))
    emp, se = monte_carlo_nngp(net[0], net[1], x, jax.random.PRNGKey(0), 400, 200)
    k = np.asarray(net[2](x, None, "nngp"))
    assert np.all(np.abs(emp - k) <= 4 * se + 0.03 * np.abs(k).max())


def test_monte_carlo_global_sum_pool_nchw():
    net = S.serial(S.GlobalSumPool(channel_axis=1), S.Dense(256, W_std=1.3, b_std=0.2), S.Erf(), S.Dense(1))
    x = _x((4, 3, 5, 4), 1) * 0.5
    emp, se = monte_carlo_nngp(net[0], net[1], x, jax.random.PRNGKey(1), 400, 200)
    k = np.asarray(net[2](x, None, "nngp"))
    assert np.all(np.abs(emp - k) <= 4 * se + 0.03 * np.abs(k).max())


@pytest.mark.parametrize("nchw, nhwc", [
    (S.AvgPool((2, 3), (2, 1), "SAME", normalize_edges=True, channel_axis=1), S.AvgPool((2, 3), (2, 1), "SAME", True)),
    (S.SumPool((2, 2), padding="CIRCULAR", channel_axis=1), S.SumPool((2, 2), padding="CIRCULAR")),
    (S.GlobalAvgPool(channel_axis=1), S.GlobalAvgPool()),
    (S.ImageResize((-1, -1, 3, 7), "linear", channel_axis=1), S.ImageResize((-1, 3, 7, -1), "linear")),
    (S.Index(S.Slice[:, :, 1:, ::2], channel_axis=1), S.Index(S.Slice[:, 1:, ::2, :])),
])
def test_channel_axis_1_is_the_transposed_layer(nchw, nhwc):
    x1, x2 = _x((3, 2, 5, 4)), _x((2, 2, 5, 4), 1)
    k1 = nchw[2](x1, x2)
    k2 = nhwc[2](jnp.moveaxis(x1, 1, -1), jnp.moveaxis(x2, 1, -1))
    for a, b in ((k1.nngp, k2.nngp), (k1.cov1, k2.cov1), (k1.cov2, k2.cov2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert k1.shape1 == k2.shape1
    y1, y2 = nchw[1]((), x1), nhwc[1]((), jnp.moveaxis(x1, 1, -1))
    np.testing.assert_allclose(y1, jnp.moveaxis(y2, -1, 1) if y2.ndim > 2 else y2, rtol=1e-12)
    assert nchw[0](None, x1.shape)[0] == y1.shape


def test_flatten_batch_axes():
    x = _x((4, 3, 2))  # batch on axis 1
    layer = S.Flatten(batch_axis=1, batch_axis_out=1)
    y = layer[1]((), x)
    assert y.shape == (8, 3) and layer[0](None, x.shape)[0] == (8, 3)
    np.testing.assert_allclose(y[:, 1], np.asarray(x[:, 1]).ravel())
    np.testing.assert_allclose(layer[2](x, None, "nngp"), S.Flatten()[2](jnp.moveaxis(x, 1, 0), None, "nngp"),
                               rtol=1e-12)


def test_closed_forms():
    x1, x2 = _x((3, 4, 6, 2)), _x((2, 4, 6, 2), 1)
    conv = S.serial(S.Conv(8, (3, 3), padding="SAME"), S.Relu())
    ks = S.serial(conv, S.GlobalSumPool())[2](x1, x2, "nngp")
    ka = S.serial(conv, S.GlobalAvgPool())[2](x1, x2, "nngp")
    np.testing.assert_allclose(ks, 24**2 * ka, rtol=1e-10)
    ks = S.serial(conv, S.SumPool((2, 3), (1, 2)))[2](x1, x2, "nngp")
    ka = S.serial(conv, S.AvgPool((2, 3), (1, 2)))[2](x1, x2, "nngp")
    np.testing.assert_allclose(ks, 36 * ka, rtol=1e-10)
    k = S.serial(conv, S.ImageResize((-1, 8, -1, -1), "nearest"))[2](x1, x2, "nngp")
    k0 = conv[2](x1, x2, "nngp")
    np.testing.assert_allclose(k, np.repeat(np.repeat(k0, 2, axis=2), 2, axis=3), rtol=1e-12)
    k = S.serial(conv, S.DotGeneral(rhs=-3.0))[2](x1, x2, "nngp")
    np.testing.assert_allclose(k, 9 * k0, rtol=1e-12)
    assert S.Slice[1:3, ..., 0] == (slice(1, 3), Ellipsis, 0)


def _raises(exc, match, fn, *args):
    with pytest.raises(exc, match=match):
        fn(*args)


def test_errors_name_the_layer():
    x = _x((2, 4, 5, 3))
    _raises(ValueError, r"SumPool\(\(2, 2\)\): padding", S.SumPool, (2, 2), None, "FULL")
    _raises(ValueError, r"SumPool\(\(9, 2\)\): VALID", S.SumPool((9, 2))[2], x)
    _raises(ValueError, r"AvgPool\(\(2, 2\)\): channel_axis=7 is out of range", S.AvgPool((2, 2), channel_axis=7)[2], x)
    _raises(ValueError, r"GlobalSumPool: needs spatial", S.GlobalSumPool()[2], _x((2, 3)))
    _raises(ValueError, r"Flatten\(0, 2\): batch_axis_out must be 0 or 1", S.Flatten, 0, 2)
    _raises(ValueError, r"ImageResize.*channel axis", S.ImageResize((-1, 3, 3, 5), "linear")[2], x)
    _raises(NotImplementedError, r"ImageResize.*batch axis", S.ImageResize((3, 3, 3, -1), "linear")[2], x)
    cubic = S.ImageResize((-1, 3, 3, -1), "cubic")
    _raises(NotImplementedError, r"ImageResize.*only 'linear' and 'nearest'", cubic[2], x)
    _raises(ValueError, r"ImageResize.*unknown resize method", S.ImageResize, (-1, 3, -1), "quadratic")
    _raises(ValueError, r"ImageResize.*4 entries", S.ImageResize((-1, 3, 3, -1), "linear")[2], _x((2, 4, 3)))
    _raises(NotImplementedError, r"Index.*channel axis", S.Index(S.Slice[..., :2])[2], x)
    _raises(NotImplementedError, r"Index.*batch axis", S.Index(S.Slice[0])[2], x)
    _raises(ValueError, r"Index.*out of range", S.Index(S.Slice[:, 9])[2], x)
    _raises(NotImplementedError, r"Index.*only integers", S.Index, S.Slice[:, [0, 1]])
    _raises(ValueError, r"DotGeneral\(lhs\): give at most one", lambda: S.DotGeneral(lhs=1.0, rhs=2.0))
    r = jnp.ones((3,))
    _raises(ValueError, r"DotGeneral\(rhs\): the channel axis", S.DotGeneral(
        rhs=r, dimension_numbers=(((3,), (0,)), ((), ())))[2], x)
    _raises(ValueError, r"DotGeneral\(rhs\): contracting the batch axis", S.DotGeneral(
        rhs=jnp.ones((2,)), dimension_numbers=(((0,), (0,)), ((), ())))[2], x)
    _raises(ValueError, r"DotGeneral\(rhs\): inputs of shape .* do not fit", S.DotGeneral(
        rhs=r, dimension_numbers=(((1,), (0,)), ((), ())))[2], x)
