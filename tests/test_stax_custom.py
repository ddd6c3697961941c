"""User-written layers with neural-tangents' decorators (`smnngp.stax.layer`, `requires`, `supports_masking`).

Properties: custom layers whose kernels are closed forms of built-in ones (a bias-free dense layer, u^2, an average
over positions: docs/examples/nt_custom_layer.py) give the built-in network's NNGP and NTK to 1e-12, with and without
masked inputs and same-position or all-pairs covariances; their finite networks have the shapes and masks
``init_fn`` / ``mask_fn`` say; a declared layout moves the inputs' axes; the `Diagonal` algebra; every misuse is
named. (Agreement with neural-tangents 0.6.5 itself: tests/test_examples_nt.py runs the example against its golden
file.)
"""

from __future__ import annotations

import functools
import os
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.kernels import Kernel
from smnngp.stax import Bool, Diagonal


@functools.cache
def _example():
    """The example program's namespace, run once per worker on first use (not at collection, in every worker), in
    its fast mode. SMNNGP_FAST is set only for that run: a worker's environment is inherited by every subprocess the
    later tests start (experiments, the docs build)."""
    before = os.environ.get("SMNNGP_FAST")
    os.environ["SMNNGP_FAST"] = "1"
    try:
        return runpy.run_path(str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "nt_custom_layer.py"))
    finally:
        if before is None:
            del os.environ["SMNNGP_FAST"]
        else:
            os.environ["SMNNGP_FAST"] = before


def Square(*args, **kwargs):
    return _example()["Square"](*args, **kwargs)


def ScaledDense(*args, **kwargs):
    return _example()["ScaledDense"](*args, **kwargs)


def MeanOverPositions(*args, **kwargs):
    return _example()["MeanOverPositions"](*args, **kwargs)

TOL = dict(rtol=1e-12, atol=1e-12)


def _x(n, seed, length=5, chan=3):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(n, length, chan)))


def _close(a, b):
    for name in ("nngp", "ntk"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), **TOL)


@pytest.mark.parametrize("pooled", [False, True], ids=["flatten", "mean-over-positions"])
def test_custom_layers_give_the_builtin_kernels(pooled):
    head = [stax.Conv(16, (2,), padding="CIRCULAR", W_std=1.2, b_std=0.1)]
    tail_c = [MeanOverPositions(), stax.Dense(1)] if pooled else [stax.Flatten(), stax.Dense(1)]
    tail_b = [stax.GlobalAvgPool(), stax.Dense(1)] if pooled else [stax.Flatten(), stax.Dense(1)]
    custom = stax.serial(*head, Square(), ScaledDense(16, W_std=0.8), stax.Erf(), *tail_c)
    builtin = stax.serial(*head, stax.Monomial(2), stax.Dense(16, W_std=0.8), stax.Erf(), *tail_b)
    x1, x2 = _x(5, 0), _x(4, 1)
    for a, b in ((x1, x2), (x1, None)):
        _close(custom[2](a, b, get=("nngp", "ntk")), builtin[2](a, b, get=("nngp", "ntk")))
    # the custom layers see all position pairs only where the average needs them
    k_custom = stax.serial(*head, Square(), ScaledDense(16))[2](x1, x2)
    assert k_custom.full and k_custom.nngp.shape == (5, 4, 5, 5)
    k_diag = stax.serial(*head, Square(), ScaledDense(16))[2](x1, x2, diagonal_spatial=True)
    np.testing.assert_allclose(k_diag.nngp, jnp.diagonal(k_custom.nngp, axis1=2, axis2=3), **TOL)


def test_masked_custom_layers_match_builtin_masking():
    x1, x2 = _x(5, 2, length=6), _x(4, 3, length=6)
    x1 = x1.at[0, 4:].set(-7.0).at[3, 2:].set(-7.0)
    x2 = x2.at[1, 5:].set(-7.0)
    custom = stax.serial(ScaledDense(16, W_std=1.4), Square(), stax.Dense(16, b_std=0.1), stax.Relu(),
                         stax.GlobalAvgPool(), stax.Dense(1))
    builtin = stax.serial(stax.Dense(16, W_std=1.4), stax.Monomial(2), stax.Dense(16, b_std=0.1), stax.Relu(),
                          stax.GlobalAvgPool(), stax.Dense(1))
    kc = custom[2](x1, x2, get=("nngp", "ntk"), mask_constant=-7.0)
    _close(kc, builtin[2](x1, x2, get=("nngp", "ntk"), mask_constant=-7.0))
    unmasked = custom[2](x1, x2, get="nngp")
    assert not np.allclose(kc.nngp, unmasked)  # the mask changed the kernel
    # finite network: mask_fn reduces the channels, the values are those of the unmasked computation
    layer_init, layer_apply, _ = ScaledDense(8)
    out_shape, params = layer_init(jax.random.PRNGKey(0), x1.shape)
    out = layer_apply(params, x1, mask_constant=-7.0)
    assert out_shape == (5, 6, 8) and out.masked_value.shape == out_shape and out.mask.shape == (5, 6, 1)
    np.testing.assert_array_equal(out.mask[..., 0], np.asarray(x1[..., 0] == -7.0))


def test_declared_layout_moves_the_axes():
    @stax.layer
    def ChannelsFirstSquare():
        def init_fn(key, input_shape):
            return input_shape, ()

        def apply_fn(params, x, **kwargs):
            return x ** 2

        @stax.requires(batch_axis=0, channel_axis=1, diagonal_spatial=Diagonal())
        def kernel_fn(k, **kwargs):
            return Square()[2](k)  # a Kernel in, the built-in composition of Square's map

        return init_fn, apply_fn, kernel_fn

    x = _x(4, 4)
    net_cf = stax.serial(ChannelsFirstSquare(), stax.Dense(8, channel_axis=1), stax.Relu(),
                         stax.GlobalAvgPool(channel_axis=1), stax.Dense(1))
    net = stax.serial(Square(), stax.Dense(8), stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    np.testing.assert_allclose(net_cf[2](jnp.swapaxes(x, 1, 2), get="nngp"), net[2](x, get="nngp"), **TOL)
    shape, _ = net_cf[0](jax.random.PRNGKey(0), (4, 3, 5))
    assert shape == (4, 1)


def test_jit_and_kernel_inputs():
    net = stax.serial(stax.Dense(8), Square(), ScaledDense(4), stax.Dense(1))
    x = _x(3, 5)[:, 0, :]
    direct = net[2](x, x, get="ntk")
    np.testing.assert_allclose(jax.jit(net[2], static_argnames="get")(x, x, get="ntk"), direct, **TOL)
    k = stax.serial(stax.Dense(8), Square())[2](x, x)
    np.testing.assert_allclose(stax.serial(ScaledDense(4), stax.Dense(1))[2](k, get="ntk"), direct, **TOL)


def test_nt_field_names_on_the_kernel():
    k = stax.Conv(4, (2,))[2](_x(3, 6), None, diagonal_spatial=True)
    assert k.diagonal_spatial and not k.full and k.diagonal_batch and k.x1_is_x2
    assert (k.batch_axis, k.channel_axis, k.is_reversed, k.is_input) == (0, 2, False, False)
    assert k.replace(diagonal_spatial=False).full
    assert k.replace(channel_axis=1, batch_axis=0).nngp is k.nngp  # a layer dropping axes names its last one
    with pytest.raises(ValueError, match="is_reversed"):
        k.replace(is_reversed=True)
    with pytest.raises(ValueError, match="batch_axis"):
        k.replace(batch_axis=1)
    with pytest.raises(ValueError, match="contradict"):
        k.replace(full=True, diagonal_spatial=True)
    # nt's metadata fields are stored as given (nt's tests reset x1_is_x2 and is_gaussian this way)
    assert not k.replace(x1_is_x2=False).x1_is_x2 and k.replace(is_gaussian=True).is_gaussian
    with pytest.raises(TypeError, match="unknown fields"):
        k.replace(nngpp=k.nngp)
    kb = stax.Dense(2)[2](_x(3, 7)[:, 0, :], None, diagonal_batch=False)
    assert not kb.diagonal_batch


def test_diagonal_algebra():
    assert not bool(Diagonal()) and bool(Diagonal(output=Bool.MAYBE)) and bool(Diagonal(Bool.YES, Bool.YES))
    assert not bool(Diagonal(Bool.MAYBE, Bool.YES))
    assert Diagonal(Bool.YES, Bool.YES) & Diagonal(Bool.NO, Bool.MAYBE) == Diagonal(Bool.NO, Bool.MAYBE)
    assert Bool.MAYBE & Bool.YES == Bool.MAYBE
    # a pooling layer (needs all pairs, diagonal afterwards) after an elementwise one (diagonal suffices):
    pool, act = Diagonal(Bool.NO, Bool.YES), Diagonal()
    assert act >> pool == Diagonal(Bool.NO, Bool.YES)   # the activation must then see all pairs too
    assert pool >> act == pool                           # after the pooling everything may be diagonal
    assert (pool << act) == (act >> pool)
    assert Diagonal(Bool.YES, Bool.MAYBE) >> Diagonal(Bool.MAYBE) == Diagonal(Bool.YES, Bool.NO)
    assert Diagonal(Bool.YES, Bool.MAYBE) >> Diagonal(Bool.NO) == Diagonal(Bool.NO, Bool.NO)


def test_misuse_is_named():
    def triple(kernel_fn):
        return (lambda key, s: (s, ())), (lambda p, x, **kw: x), kernel_fn

    @stax.layer
    def NeedsBatch():
        return triple(stax.requires(diagonal_batch=False)(lambda k, **kw: k))

    with pytest.raises(NotImplementedError, match="NeedsBatch.*diagonal_batch=False"):
        NeedsBatch()

    @stax.layer
    def TwoFns():
        return triple(lambda k: k)[:2]

    with pytest.raises(ValueError, match="TwoFns: a layer function must return"):
        TwoFns()

    @stax.layer
    def ReturnsArray():
        return triple(lambda k, **kw: k.nngp)

    with pytest.raises(TypeError, match="ReturnsArray: kernel_fn must return a Kernel"):
        ReturnsArray()[2](_x(2, 8)[:, 0, :])
    x = _x(3, 9).at[0, 3:].set(-7.0)
    with pytest.raises(ValueError, match="MeanOverPositions: masked inputs"):
        stax.serial(stax.Dense(4), MeanOverPositions())[2](x, get="nngp", mask_constant=-7.0)
    diag = stax.Conv(4, (2,))[2](_x(3, 10), None, diagonal_spatial=True)
    assert isinstance(diag, Kernel)
    with pytest.raises(ValueError, match="MeanOverPositions.*all pairs of positions"):
        MeanOverPositions()[2](diag)

    def needs_pairs(k, **kwargs):
        return k

    with pytest.raises(ValueError, match="needs_pairs requires the covariances of all pairs of spatial"):
        stax.requires(diagonal_spatial=False)(needs_pairs)(diag)
    assert stax.requires(diagonal_spatial=Diagonal())(needs_pairs)(diag) is diag
    with pytest.raises(TypeError, match="remask_kernel"):
        stax.supports_masking("yes")
    with pytest.raises(TypeError, match="channel_axis must be an int"):
        stax.requires(channel_axis="last")
