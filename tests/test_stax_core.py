"""The public kernel_fn's keywords and composition (smnngp.stax._core), and smnngp.nt.batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.kernels import Kernel
from smnngp.nt import batch

jax.config.update("jax_enable_x64", True)

RNG = np.random.RandomState(0)
X1 = jnp.asarray(RNG.normal(size=(3, 5, 5, 2)))
X2 = jnp.asarray(RNG.normal(size=(2, 5, 5, 2)))


def conv_net(*tail):
    return stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                       stax.Conv(8, (3, 3), padding="SAME", W_std=1.2, b_std=0.2), *tail)


def spatial_diag(mat):
    return jnp.einsum("abhhww->abhw", mat)


@pytest.mark.parametrize("x2", [X2, None], ids=["x2", "x2none"])
def test_diagonal_spatial_is_the_diagonal_of_the_full_kernel(x2):
    # AvgPool mixes positions, so the exact same-position kernel needs all pairs inside the network.
    net = conv_net(stax.Relu(), stax.AvgPool((2, 2), padding="SAME"), stax.Conv(4, (2, 2), W_std=1.1))
    full = net[2](X1, x2)
    diag = net[2](X1, x2, diagonal_spatial=True)
    assert full.nngp.ndim == 6 and diag.nngp.shape == full.nngp.shape[:2] + (4, 4)
    np.testing.assert_allclose(diag.nngp, spatial_diag(full.nngp), rtol=1e-13, atol=0)
    np.testing.assert_allclose(diag.ntk, spatial_diag(full.ntk), rtol=1e-13, atol=0)
    np.testing.assert_allclose(diag.cov1, jnp.einsum("ahhww->ahw", full.cov1), rtol=1e-13, atol=0)


def test_diagonal_spatial_has_no_effect_without_spatial_output():
    net = conv_net(stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    a, b = net[2](X1, X2, "ntk"), net[2](X1, X2, "ntk", diagonal_spatial=True)
    np.testing.assert_array_equal(a, b)


def test_diagonal_batch_false_gives_full_batch_covariances():
    net = conv_net()
    k = net[2](X1, X2, diagonal_batch=False)
    np.testing.assert_allclose(k.cov1, net[2](X1, None, "nngp"), rtol=1e-12)
    np.testing.assert_allclose(k.cov2, net[2](X2, None, "nngp"), rtol=1e-12)
    kn = net[2](X1, None, diagonal_batch=False)
    assert kn.cov2 is None and kn.cov1.shape == (3, 3, 5, 5, 5, 5)
    # get with a string returns the same kernels whatever diagonal_batch says
    np.testing.assert_array_equal(net[2](X1, X2, "nngp", diagonal_batch=False), net[2](X1, X2, "nngp"))


@pytest.mark.parametrize("split", [1, 2, 4])
def test_kernel_as_first_argument_composes(split):
    layers = [stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
              stax.AvgPool((2, 2), (2, 2)), stax.Conv(8, (2, 2), W_std=1.2, b_std=0.1), stax.Erf(),
              stax.Flatten(), stax.Dense(1)]
    whole = stax.serial(*layers)[2](X1, X2)
    head, tail = stax.serial(*layers[:split]), stax.serial(*layers[split:])
    k = tail[2](head[2](X1, X2))
    assert isinstance(k, Kernel)
    np.testing.assert_allclose(k.nngp, whole.nngp, rtol=1e-13)
    np.testing.assert_allclose(k.ntk, whole.ntk, rtol=1e-13)
    np.testing.assert_allclose(tail[2](head[2](X1, X2), get="ntk"), whole.ntk, rtol=1e-13)


def test_kernel_argument_errors_name_the_problem():
    head = conv_net()
    pooled = stax.serial(stax.AvgPool((2, 2)), stax.Flatten(), stax.Dense(1))
    with pytest.raises(ValueError, match="all pairs of positions"):
        pooled[2](head[2](X1, X2, diagonal_spatial=True))
    with pytest.raises(ValueError, match="x2 must be None"):
        pooled[2](head[2](X1, X2), X2)
    with pytest.raises(ValueError, match="NTK was asked for"):
        pooled[2](head[2](X1, X2).replace(ntk=None), get="ntk")
    with pytest.raises(ValueError, match="diagonal_batch=False cannot be composed"):
        stax.Relu()[2](head[2](X1, X2, diagonal_batch=False))
    with pytest.raises(TypeError, match="diagonal_spatial must be True, False or None"):
        head[2](X1, X2, diagonal_spatial="yes")
    with pytest.raises(TypeError, match="unexpected keyword"):
        head[2](X1, X2, diagnal_spatial=True)


def test_batch_matches_the_unbatched_kernel():
    net = stax.serial(stax.Dense(16, 1.5, 0.1), stax.Relu(), stax.Dense(16, 1.2, 0.05), stax.Erf(), stax.Dense(1))
    x = RNG.normal(size=(11, 3))
    y = RNG.normal(size=(5, 3))
    ref = net[2](x, y)
    for size in (0, 2, 4, 11):
        out = batch(net[2], batch_size=size)(x, y, ("nngp", "ntk"))
        np.testing.assert_allclose(out.nngp, ref.nngp, rtol=1e-12)
        np.testing.assert_allclose(out.ntk, ref.ntk, rtol=1e-12)
    sym = batch(net[2], batch_size=3, device_count=0)(x, None, "ntk")
    np.testing.assert_allclose(sym, net[2](x, None, "ntk"), rtol=1e-12)
    cnn = conv_net(stax.Flatten(), stax.Dense(1))
    np.testing.assert_allclose(batch(cnn[2], 2)(X1, X2, "nngp", diagonal_spatial=True), cnn[2](X1, X2, "nngp"),
                               rtol=1e-13)


def test_batch_mirrors_the_tiles_of_a_symmetric_kernel():
    """With x2=None a tile below the diagonal is the transpose of the one above it: each pair of tiles is computed
    once, full-spatial Kernels come out exact (every spatial pair swapped), and the rule is not used when the
    per-point keywords of the two sides differ."""
    net = conv_net()
    x = jnp.concatenate([X1, X2])  # 5 points: tiles of 2, 2, 1
    calls = []

    def counting(x1, x2=None, *args, **kwargs):
        calls.append(x2 is None)
        return net[2](x1, x2, *args, **kwargs)

    ref = net[2](x, None)
    out = batch(counting, batch_size=2)(x, None)
    # the tile function is compiled (traced once per kind of tile: the diagonal ones, kernel_fn(a, None), and the
    # ones above it); that 3 + 3 tiles run and none below is checked in tests/test_nt_batch_compiled.py
    assert calls == [True, False]
    assert out.nngp.shape == ref.nngp.shape == (5, 5, 5, 5, 5, 5)
    for name in ("nngp", "ntk", "cov1"):
        np.testing.assert_allclose(getattr(out, name), getattr(ref, name), rtol=1e-12, err_msg=name)
    assert out.cov2 is None and out.x1_is_x2

    def outer(x1, x2=None, *, w):
        a, b = w
        return jnp.outer(a, a if b is None else b)

    w1, w2 = jnp.arange(5.0), jnp.arange(5.0) + 10.0
    np.testing.assert_array_equal(batch(outer, 2)(x, None, w=(w1, w2)), np.outer(w1, w2))
    np.testing.assert_array_equal(batch(outer, 2)(x, None, w=(w1, w1)), np.outer(w1, w1))


def test_kernel_fn_takes_neural_tangents_layout_keywords():
    net = stax.serial(stax.Dense(4), stax.Relu(), stax.Dense(1))
    x = jnp.asarray(RNG.normal(size=(3, 2)))
    ref = net[2](x, None, "nngp")
    np.testing.assert_array_equal(net[2](x, None, "nngp", batch_axis=0, channel_axis=-1), ref)
    np.testing.assert_array_equal(net[2](x, None, "nngp", batch_axis=-2, channel_axis=1), ref)
    with pytest.raises(ValueError, match=r"batch first and channels last .*batch_axis=1, channel_axis=0"):
        net[2](x, None, "nngp", batch_axis=1, channel_axis=0)
    with pytest.raises(ValueError, match="out of range"):
        net[2](x, None, "nngp", channel_axis=2)
    with pytest.raises(TypeError, match="batch_axis must be an int"):
        net[2](x, None, "nngp", batch_axis="0")


def test_batch_rejects_bad_arguments():
    net = stax.serial(stax.Dense(4), stax.Relu(), stax.Dense(1))
    with pytest.raises(ValueError, match="batch_size"):
        batch(net[2], batch_size=-1)
    with pytest.raises(ValueError, match="device_count"):
        batch(net[2], device_count=len(jax.local_devices()) + 1)
    with pytest.raises(TypeError, match="callable"):
        batch("kernel")


def test_batch_with_dropout_matches_the_unbatched_kernel():
    # Train-mode Dropout adds noise where an activation meets itself, i.e. only on k(x, x): a symmetric
    # batched kernel must evaluate its diagonal tiles as kernel_fn(tile, None).
    net = stax.serial(stax.Dense(16, 1.5, 0.1), stax.Relu(), stax.Dropout(0.8), stax.Dense(16, 1.2), stax.Relu(),
                      stax.Dense(1))
    x = RNG.normal(size=(9, 3))
    ref = net[2](x, None, ("nngp", "ntk"))
    for size in (2, 4, 9):
        out = batch(net[2], batch_size=size)(x, None, ("nngp", "ntk"))
        np.testing.assert_allclose(out.nngp, ref.nngp, rtol=1e-12)
        np.testing.assert_allclose(out.ntk, ref.ntk, rtol=1e-12)
