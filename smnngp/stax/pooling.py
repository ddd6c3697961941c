"""Pooling and reshaping: `AvgPool`, `GlobalAvgPool`, `Flatten`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from smnngp.kernels import Kernel
from smnngp.stax._core import (
    _PADDINGS,
    Layer,
    _map_covs,
    _out_sizes,
    _single_shape,
    _spatial_diagonal,
    _spatial_mean,
    _spatial_pads,
    _window_sum,
)

# ---------------------------------------------------------------------------
# Pooling and reshaping
# ---------------------------------------------------------------------------

__all__ = ["AvgPool", "GlobalAvgPool", "Flatten"]


def AvgPool(
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    normalize_edges: bool = False,
) -> Layer:
    """Average pooling over spatial windows; ``strides=None`` means stride 1.

    With 'SAME' padding the window average divides by the full window size,
    unless ``normalize_edges`` (then by the number of real pixels).

    Args:
        window_shape: pooling window per spatial axis, positive ints.
        strides: stride per spatial axis, positive ints; ``None`` means stride 1.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        normalize_edges: with ``'SAME'`` padding, divide each window by its number of unpadded pixels instead
            of the window size; no effect otherwise.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping (N, *spatial, C) to
        (N, *spatial_out, C). Its kernel tracks the covariances of all pairs of positions.

    Raises:
        ValueError: if ``window_shape`` or ``strides`` are not positive integers of matching length, or
            ``padding`` is unknown.
    """
    window_shape = tuple(int(w) for w in window_shape)
    nd = len(window_shape)
    layer = f"AvgPool({window_shape})"
    strides = (1,) * nd if strides is None else tuple(int(s) for s in strides)
    if len(strides) != nd or any(s < 1 for s in strides) or any(w < 1 for w in window_shape):
        raise ValueError(f"{layer}: window and strides must be {nd} positive integers, got {window_shape}, {strides}")
    padding = str(padding).upper()
    if padding not in _PADDINGS:
        raise ValueError(f"{layer}: padding must be one of {_PADDINGS}, got {padding!r}")
    circular = padding == "CIRCULAR"
    size = math.prod(window_shape)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) != nd + 2:
            raise ValueError(f"{layer}: needs inputs of rank {nd + 2}, got shape {shape}")
        if padding == "VALID" and any(n < w for n, w in zip(shape[1:-1], window_shape)):
            raise ValueError(f"{layer}: VALID pooling needs spatial size >= window, got {shape}")
        return (shape[0],) + _out_sizes(shape[1:-1], window_shape, strides, padding) + (shape[-1],)

    def counts(spatial, pads):
        """Number of real (unpadded) pixels in each window, per dimension."""
        res = []
        for n, w, s, (lo, hi) in zip(spatial, window_shape, strides, pads):
            ones = np.pad(np.ones(n), (lo, hi))
            n_out = (n + lo + hi - w) // s + 1
            res.append(np.array([ones[i * s : i * s + w].sum() for i in range(n_out)]))
        return res

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        spatial = x.shape[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        out = _window_sum(x, tuple(range(1, nd + 1)), window_shape, strides, pads, circular)
        if normalize_edges and padding == "SAME":
            for i, c in enumerate(counts(spatial, pads)):
                shape = [1] * out.ndim
                shape[1 + i] = c.shape[0]
                out = out / jnp.asarray(c, x.dtype).reshape(shape)
            return out
        return out * (1.0 / size)

    def kernel_map(k: Kernel) -> Kernel:
        if not k.full:  # pragma: no cover - the requirement pass guarantees full
            raise RuntimeError(f"{layer}: internal error, kernel must track all position pairs")
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        spatial = k.shape1[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        cnt = counts(spatial, pads) if (normalize_edges and padding == "SAME") else None

        def op(mat, batch_ndim):
            axes, win, strd, pp = [], [], [], []
            for i in range(nd):
                a = batch_ndim + 2 * i
                axes += [a, a + 1]
                win += [window_shape[i]] * 2
                strd += [strides[i]] * 2
                pp += [pads[i]] * 2
            out = _window_sum(mat, tuple(axes), win, strd, pp, circular)
            if cnt is None:
                return out * (1.0 / size**2)
            for i, c in enumerate(cnt):
                for j in (0, 1):
                    shape = [1] * out.ndim
                    shape[batch_ndim + 2 * i + j] = c.shape[0]
                    out = out / jnp.asarray(c, out.dtype).reshape(shape)
            return out

        return _map_covs(k, op, op, shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2))

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True)


def GlobalAvgPool() -> Layer:
    """Mean over all spatial positions: (N, ..., C) -> (N, C).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; its inputs need at least one spatial axis.
    """
    layer = "GlobalAvgPool"

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) < 3:
            raise ValueError(f"{layer}: needs spatial dimensions, got input shape {shape}")
        return (shape[0], shape[-1])

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        return jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))

    def kernel_map(k: Kernel) -> Kernel:
        shapes = dict(shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2))
        return _map_covs(k, _spatial_mean, _spatial_mean, full=False, **shapes)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True)



def Flatten() -> Layer:
    """Flatten all non-batch axes: (N, H, W, C) -> (N, H*W*C).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters. Its kernel averages the same-position
        covariances over the spatial positions (the flattened channels), so it needs no position pairs.
    """
    layer = "Flatten"

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        return (shape[0], int(math.prod(shape[1:])))

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        return jnp.reshape(x, (x.shape[0], -1))

    def kernel_map(k: Kernel) -> Kernel:
        def op(mat, batch_ndim):
            if mat.ndim <= batch_ndim:
                return mat
            if k.full:
                mat = _spatial_diagonal(mat, batch_ndim)
            return _spatial_mean(mat, batch_ndim)

        return _map_covs(k, op, op, shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2), full=False)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: False)
