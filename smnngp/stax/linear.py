"""Affine layers: `Dense` and `Conv` (finite network, NNGP and NTK)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax import lax

from smnngp.kernels import Kernel
from smnngp.stax._core import (
    _PADDINGS,
    Layer,
    _check_parameterization,
    _check_std,
    _diag_window_sum,
    _out_sizes,
    _pad_axes,
    _single_shape,
    _spatial_pads,
    _std_value,
    _window_sum,
)

# ---------------------------------------------------------------------------
# Affine layers
# ---------------------------------------------------------------------------

__all__ = ["Dense", "Conv"]


def Dense(
    out_dim: int,
    W_std: float = 1.0,
    b_std: float | None = None,
    parameterization: str = "ntk",
) -> Layer:
    """Fully connected layer acting on the last (channel) axis.

    ``b_std=None`` means no bias. See the module docstring for the two
    parameterisations.

    Args:
        out_dim: number of output channels (a positive int); the finite width of the layer.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        parameterization: ``'ntk'`` (default) or ``'standard'``.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping (N, ..., C_in) to (N, ..., out_dim); its parameters
        are ``(W, b)`` with ``W`` of shape (C_in, out_dim) and ``b`` of shape (out_dim,) or ``None``.

    Raises:
        ValueError: if ``out_dim`` is not a positive integer, a concrete ``W_std`` is not positive and finite,
            a concrete ``b_std`` is negative or not finite, or ``parameterization`` is unknown.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
    """
    layer = f"Dense({out_dim})"
    if not isinstance(out_dim, (int, np.integer)) or out_dim < 1:
        raise ValueError(f"Dense: out_dim must be a positive integer, got {out_dim!r}")
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    _check_parameterization(parameterization, layer)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    b_var = None if b_std is None else b_std**2

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        return shape[:-1] + (int(out_dim),)

    def init_fn(key, input_shape):
        out_shape = shape_fn(tuple(input_shape))
        fan_in = input_shape[-1]
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, (fan_in, out_dim))
        b = None if b_std is None else jax.random.normal(kb, (out_dim,))
        if parameterization == "standard":
            W = W * (W_std / math.sqrt(fan_in))
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = params
        if x.shape[-1] != W.shape[0]:
            raise ValueError(
                f"{layer}: input has {x.shape[-1]} features but W expects {W.shape[0]} (input shape {x.shape})"
            )
        out = x @ W.astype(x.dtype)
        if parameterization == "ntk":
            out = out * (W_std / math.sqrt(x.shape[-1]))
            if b is not None:
                out = out + b_std * b.astype(x.dtype)
        elif b is not None:
            out = out + b.astype(x.dtype)
        return out

    def affine(mat):
        mat = W_std**2 * mat
        return mat if b_var is None else mat + b_var

    def kernel_map(k: Kernel) -> Kernel:
        ntk = k.ntk
        nngp = affine(k.nngp)
        if ntk is not None:
            if parameterization == "ntk":
                ntk = nngp + W_std**2 * ntk
            else:
                ntk = float(k.shape1[-1]) * k.nngp + W_std**2 * ntk
                if b_var is not None:
                    ntk = ntk + 1.0
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=affine(k.cov1),
            cov2=None if k.cov2 is None else affine(k.cov2),
            shape1=shape_fn(k.shape1),
            shape2=shape_fn(k.shape2),
            is_gaussian=True,
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)



def Conv(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    W_std: float = 1.0,
    b_std: float | None = None,
    parameterization: str = "ntk",
) -> Layer:
    """Convolution over 1-D (N, W, C) or 2-D (N, H, W, C) inputs, filters (..., C_in, C_out).

    ``padding`` is 'SAME', 'VALID' or 'CIRCULAR' (periodic boundary). The fan-in
    is C_in * prod(filter_shape).

    Args:
        out_chan: number of output channels (a positive int).
        filter_shape: spatial size of the filter, 1 or 2 positive ints (one per spatial axis).
        strides: stride per spatial axis, positive ints; ``None`` means stride 1 everywhere.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        parameterization: ``'ntk'`` (default) or ``'standard'``.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping (N, *spatial, C_in) to (N, *spatial_out, out_chan);
        its parameters are ``(W, b)`` with ``W`` of shape ``filter_shape + (C_in, out_chan)``.

    Raises:
        ValueError: if ``filter_shape`` does not have 1 or 2 positive entries, ``out_chan`` is not a positive
            integer, ``strides`` does not match ``filter_shape``, ``padding`` or ``parameterization`` is
            unknown, or a concrete scale is out of range.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
    """
    filter_shape = tuple(int(f) for f in filter_shape)
    nd = len(filter_shape)
    layer = f"Conv({out_chan}, {filter_shape})"
    if nd not in (1, 2):
        raise ValueError(f"{layer}: filter_shape must have 1 or 2 entries, got {filter_shape}")
    if any(f < 1 for f in filter_shape):
        raise ValueError(f"{layer}: filter sizes must be positive, got {filter_shape}")
    if not isinstance(out_chan, (int, np.integer)) or out_chan < 1:
        raise ValueError(f"Conv: out_chan must be a positive integer, got {out_chan!r}")
    strides = (1,) * nd if strides is None else tuple(int(s) for s in strides)
    if len(strides) != nd or any(s < 1 for s in strides):
        raise ValueError(f"{layer}: strides must be {nd} positive integers, got {strides}")
    padding = str(padding).upper()
    if padding not in _PADDINGS:
        raise ValueError(f"{layer}: padding must be one of {_PADDINGS}, got {padding!r}")
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    _check_parameterization(parameterization, layer)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    b_var = None if b_std is None else b_std**2
    filter_size = math.prod(filter_shape)
    circular = padding == "CIRCULAR"
    dn = ("NWC", "WIO", "NWC") if nd == 1 else ("NHWC", "HWIO", "NHWC")

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) != nd + 2:
            raise ValueError(
                f"{layer}: a {nd}-D convolution needs inputs of rank {nd + 2} (batch, {nd} spatial, "
                f"channels), got shape {shape}"
            )
        spatial = shape[1:-1]
        if padding == "VALID" and any(n < f for n, f in zip(spatial, filter_shape)):
            raise ValueError(f"{layer}: VALID padding needs spatial size >= filter, got input shape {shape}")
        return (shape[0],) + _out_sizes(spatial, filter_shape, strides, padding) + (int(out_chan),)

    def init_fn(key, input_shape):
        out_shape = shape_fn(tuple(input_shape))
        c_in = input_shape[-1]
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, filter_shape + (c_in, out_chan))
        b = None if b_std is None else jax.random.normal(kb, (out_chan,))
        if parameterization == "standard":
            W = W * (W_std / math.sqrt(c_in * filter_size))
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = params
        if x.ndim != nd + 2:
            raise ValueError(f"{layer}: input of rank {nd + 2} expected, got shape {x.shape}")
        if x.shape[-1] != W.shape[-2]:
            raise ValueError(f"{layer}: input has {x.shape[-1]} channels but W expects {W.shape[-2]}")
        if circular:
            pads = _spatial_pads(x.shape[1:-1], filter_shape, strides, "SAME")
            x = _pad_axes(x, tuple(range(1, nd + 1)), pads, True)
        out = lax.conv_general_dilated(
            x, W.astype(x.dtype), strides, "VALID" if circular else padding, dimension_numbers=dn,
            precision=lax.Precision.HIGHEST,
        )
        if parameterization == "ntk":
            out = out * (W_std / math.sqrt(x.shape[-1] * filter_size))
            if b is not None:
                out = out + b_std * b.astype(x.dtype)
        elif b is not None:
            out = out + b.astype(x.dtype)
        return out

    def conv_moments(k: Kernel):
        spatial = k.shape1[1:-1]
        pads = _spatial_pads(spatial, filter_shape, strides, "SAME" if circular else padding)
        outs = _out_sizes(spatial, filter_shape, strides, padding)

        def op(mat, batch_ndim):
            if k.full:
                for i in range(nd):
                    a = batch_ndim + 2 * i
                    mat = _diag_window_sum(mat, a, a + 1, filter_shape[i], strides[i], pads[i], circular, outs[i])
            else:
                axes = tuple(range(batch_ndim, batch_ndim + nd))
                mat = _window_sum(mat, axes, filter_shape, strides, pads, circular)
            return mat * (1.0 / filter_size)

        return op

    def kernel_map(k: Kernel) -> Kernel:
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        op = conv_moments(k)

        def affine(mat):
            mat = W_std**2 * mat
            return mat if b_var is None else mat + b_var

        conv_nngp = op(k.nngp, 2)
        nngp = affine(conv_nngp)
        ntk = k.ntk
        if ntk is not None:
            conv_ntk = op(ntk, 2) if ntk.ndim else ntk
            if parameterization == "ntk":
                ntk = nngp + W_std**2 * conv_ntk
            else:
                fan_in = float(k.shape1[-1] * filter_size)
                ntk = fan_in * conv_nngp + W_std**2 * conv_ntk
                if b_var is not None:
                    ntk = ntk + 1.0
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=affine(op(k.cov1, 1)),
            cov2=None if k.cov2 is None else affine(op(k.cov2, 1)),
            shape1=shape_fn(k.shape1),
            shape2=shape_fn(k.shape2),
            is_gaussian=True,
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)
