"""The fully connected layer `Dense` (finite network, NNGP and NTK), and the affine pieces convolutions share.

The convolutions (`Conv`, `ConvTranspose`, `ConvLocal`) live in `smnngp.stax.conv`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import (
    Layer,
    _check_parameterization,
    _check_std,
    _single_shape,
    _std_value,
)

__all__ = ["Dense"]


def _check_s(s, layer: str) -> tuple[int, int]:
    """The width multipliers ``s = (s_in, s_out)`` as two positive Python ints, or a ValueError naming the layer."""
    try:
        pair = tuple(s)
    except TypeError:
        raise ValueError(f"{layer}: s must be a pair (s_in, s_out) of positive integers, got {s!r}") from None
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                                 for v in pair):
        raise ValueError(f"{layer}: s must be a pair (s_in, s_out) of positive integers, got {s!r}")
    return int(pair[0]), int(pair[1])


def _affine_scale(W_std, b_std):
    """``mat -> W_std^2 mat + b_std^2`` (no shift when ``b_std`` is None): the moments of ``x W + b``."""
    b_var = None if b_std is None else b_std**2

    def affine(mat):
        if mat is None:
            return None
        mat = W_std**2 * mat
        return mat if b_var is None else mat + b_var

    return affine


def _unpack_params(params, layer: str):
    """``(W, b)`` from a layer's parameters, or a ValueError naming the layer."""
    try:
        W, b = params
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: parameters must be a pair (W, b) as init_fn returns them, got "
                         f"{type(params).__name__}") from None
    return W, b


def _bias(b, expected: tuple, layer: str):
    """``b`` reshaped to neural-tangents' bias shape ``expected``, or None; a ValueError naming the layer.

    Accepted are ``expected`` itself and any shape that broadcasts to it (``(width,)`` for a batch of vectors, a
    scalar): what numpy broadcasting lets neural-tangents add to its outputs. The missing leading axes are added
    here explicitly, so that ``out + b`` never relies on rank promotion.
    """
    if b is None:
        return None
    shape, expected = tuple(jnp.shape(b)), tuple(expected)
    if not shape:
        return jnp.asarray(b)  # a scalar bias: adding it never promotes ranks
    tail = expected[len(expected) - len(shape):]
    if len(shape) > len(expected) or any(s not in (1, e) for s, e in zip(shape, tail)):
        raise ValueError(f"{layer}: bias has shape {shape}, expected {expected} (the shape init_fn draws, as "
                         f"neural-tangents does: 1 on every axis but the channels) or a shape that broadcasts to it")
    b = jnp.reshape(b, (1,) * (len(expected) - len(shape)) + shape)
    return b if b.shape == expected else jnp.broadcast_to(b, expected)


def Dense(
    out_dim: int,
    W_std: float = 1.0,
    b_std: float | None = None,
    batch_axis: int = 0,
    channel_axis: int = -1,
    parameterization: str = "ntk",
    s: tuple[int, int] = (1, 1),
) -> Layer:
    """Fully connected layer acting on the channel axis, with neural-tangents' signature.

    Finite network, with C the size of the input's channel axis:

    * ``'ntk'``: W ~ N(0, 1) of shape (C, out_dim), b ~ N(0, 1);
      z = W_std / sqrt(C) * x W + b_std * b;
    * ``'standard'`` with width multipliers ``s = (s_in, s_out)`` (Sohl-Dickstein et al. 2020,
      "On the infinite width limit of neural networks with a standard parameterization"): the layer has
      ``s_out * out_dim`` outputs, W ~ N(0, W_std^2 s_in / C), b ~ N(0, b_std^2), and
      z = x W / sqrt(s_in) + b, so that the pre-activation variance is W_std^2 / C per unit of input
      whatever ``s``. ``s`` is ignored by ``'ntk'``.

    Infinite width (K the input NNGP, Theta the input NTK):

    * NNGP: K' = W_std^2 K + b_std^2 (both parameterisations);
    * NTK ``'ntk'``: Theta' = K' + W_std^2 Theta;
    * NTK ``'standard'``: Theta' = (C / s_in) K + W_std^2 Theta + [1 if a bias], the gradient with
      respect to W contributing C / s_in times the input covariance and that to b one.

    Args:
        out_dim: number of output channels (a positive int); the finite width is ``s[1] * out_dim`` under
            ``'standard'``.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        batch_axis: axis of the finite inputs that holds the batch (default 0).
        channel_axis: axis of the finite inputs that holds the channels the layer mixes (default -1); the
            remaining axes are spatial and are kept.
        parameterization: ``'ntk'`` (default) or ``'standard'``.
        s: ``(s_in, s_out)``, positive integer width multipliers of the standard parameterisation.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` replacing the size of ``channel_axis`` with ``out_dim``
        (``s[1] * out_dim`` under ``'standard'``); its parameters are ``(W, b)`` with ``W`` of shape
        (C, width) and ``b`` of neural-tangents' shape: as many axes as the input, all 1 except ``channel_axis``
        which is ``width`` (``(1, width)`` for a batch of vectors); ``b`` is ``None`` without a bias. With the
        same key the draws are neural-tangents' (``W`` from the first and ``b`` from the second key of
        ``jax.random.split(key)``); bit for bit under ``jax_threefry_partitionable=False``, the random bits of
        the JAX neural-tangents 0.6.5 ran on.

    Raises:
        ValueError: if ``out_dim`` is not a positive integer, a concrete ``W_std`` is not positive and finite,
            a concrete ``b_std`` is negative or not finite, ``parameterization`` is unknown, ``s`` is not a
            pair of positive integers, ``batch_axis`` equals ``channel_axis`` or either is out of range
            for the input; from ``apply_fn``, if ``W`` or ``b`` does not fit the input.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
    """
    layer = f"Dense({out_dim})"
    if not isinstance(out_dim, (int, np.integer)) or out_dim < 1:
        raise ValueError(f"Dense: out_dim must be a positive integer, got {out_dim!r}")
    for axis_name, axis in (("batch_axis", batch_axis), ("channel_axis", channel_axis)):
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise ValueError(f"{layer}: {axis_name} must be an integer, got {axis!r}")
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    parameterization = str(parameterization).lower() if isinstance(parameterization, str) else parameterization
    _check_parameterization(parameterization, layer)
    s_in, s_out = _check_s(s, layer)
    standard = parameterization == "standard"
    width = int(out_dim) * (s_out if standard else 1)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    affine = _affine_scale(W_std, b_std)
    batch_axis, channel_axis = int(batch_axis), int(channel_axis)
    layout = None if (batch_axis, channel_axis) == (0, -1) else (batch_axis, channel_axis)

    def axes(ndim):
        if not (-ndim <= batch_axis < ndim and -ndim <= channel_axis < ndim):
            raise ValueError(f"{layer}: batch_axis={batch_axis} or channel_axis={channel_axis} is out of range "
                             f"for inputs of rank {ndim}")
        b, c = batch_axis % ndim, channel_axis % ndim
        if b == c:
            raise ValueError(f"{layer}: batch_axis and channel_axis must differ, both are axis {b}")
        return b, c

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        _, c = axes(len(shape))
        return shape[:c] + (width,) + shape[c + 1:]

    def bias_shape(ndim):
        # neural-tangents' shape: 1 on every axis but the channel axis, so that it broadcasts at equal rank.
        shape = [1] * ndim
        shape[axes(ndim)[1]] = width
        return tuple(shape)

    def init_fn(key, input_shape):
        # neural-tangents' draws: W from the first and b from the second key of split(key), both N(0, 1) at
        # their final shapes; 'standard' then rescales them (W by W_std / sqrt(C / s_in), b by b_std).
        input_shape = tuple(input_shape)
        out_shape = shape_fn(input_shape)
        fan_in = input_shape[axes(len(input_shape))[1]]
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, (fan_in, width))
        b = None if b_std is None else jax.random.normal(kb, bias_shape(len(input_shape)))
        if standard:
            W = W * (W_std / (fan_in / s_in) ** 0.5)
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = _unpack_params(params, layer)
        c = axes(x.ndim)[1]
        if jnp.ndim(W) != 2:
            raise ValueError(f"{layer}: W has shape {jnp.shape(W)}, expected (input features, {width})")
        if x.shape[c] != W.shape[0]:
            raise ValueError(
                f"{layer}: input has {x.shape[c]} features but W expects {W.shape[0]} (input shape {x.shape})"
            )
        b = _bias(b, bias_shape(x.ndim), layer)
        if c == x.ndim - 1:
            out = x @ W.astype(x.dtype)
        else:
            out = jnp.moveaxis(jnp.tensordot(x, W.astype(x.dtype), ((c,), (0,))), -1, c)
        if standard:
            if s_in != 1:
                out = out * (1.0 / math.sqrt(s_in))
            return out if b is None else out + b.astype(x.dtype)
        out = out * (W_std / math.sqrt(x.shape[c]))
        return out if b is None else out + b_std * b.astype(x.dtype)

    def canonical_out(shape):
        return tuple(shape[:-1]) + (width,)

    def kernel_map(k: Kernel) -> Kernel:
        nngp = affine(k.nngp)
        ntk = k.ntk
        if ntk is not None:
            if standard:
                ntk = (k.shape1[-1] / s_in) * k.nngp + W_std**2 * ntk
                if b_std is not None:
                    ntk = ntk + 1.0
            else:
                ntk = nngp + W_std**2 * ntk
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=affine(k.cov1),
            cov2=affine(k.cov2),
            shape1=canonical_out(k.shape1),
            shape2=canonical_out(k.shape2),
            is_gaussian=True,
        )

    # Masks: a position is masked when all its input channels are; the output is zeroed there.
    rule = masking.MaskRule(lambda m, shape: masking.reduce_channels(m), remask=True)
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full, layout=layout, masking=rule,
                 means=_flow.FRESH)
