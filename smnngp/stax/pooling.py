"""Pooling and reshaping: `AvgPool`, `SumPool`, `GlobalAvgPool`, `GlobalSumPool`, `Flatten`.

All of these are linear maps of the activations, so their kernels are the same maps applied on both sides of
the input covariance: for y = A x, E[y y'^T] = A E[x x'^T] A^T. Kernels stay in the canonical layout (batch
first, channels last); the finite layers read their inputs in the layout ``(batch_axis, channel_axis)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from smnngp.kernels import Kernel
from smnngp.stax import masking
from smnngp.stax._core import (
    _PADDINGS,
    Layer,
    _from_canonical,
    _map_covs,
    _out_sizes,
    _single_shape,
    _spatial_diagonal,
    _spatial_mean,
    _spatial_pads,
    _window_sum,
    canonical_shape,
    padding_name,
    to_canonical,
)

__all__ = ["AvgPool", "SumPool", "GlobalAvgPool", "GlobalSumPool", "Flatten"]


# ---------------------------------------------------------------------------
# Layout helpers (shared with smnngp.stax.shape)
# ---------------------------------------------------------------------------


def _check_axis(value, name: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{layer}: {name} must be an integer axis, got {value!r}")
    return int(value)


def _resolve_axes(layout, ndim: int, layer: str, shape) -> tuple[int, int]:
    """``(batch_axis, channel_axis)`` modulo ``ndim``, checked to be in range and distinct."""
    b, c = layout
    for name, a in (("batch_axis", b), ("channel_axis", c)):
        if not -ndim <= a < ndim:
            raise ValueError(f"{layer}: {name}={a} is out of range for an input of shape {tuple(shape)}")
    b, c = b % ndim, c % ndim
    if b == c:
        raise ValueError(f"{layer}: batch_axis and channel_axis are both axis {b} of input shape {tuple(shape)}")
    return b, c


def _from_canonical_shape(shape, layout) -> tuple[int, ...]:
    """Inverse of `canonical_shape`: put the first entry at ``batch_axis`` and the last at ``channel_axis``."""
    shape = tuple(shape)
    n = len(shape)
    if layout is None or n < 2:
        return shape
    b, c = layout[0] % n, layout[1] % n
    rest = iter(shape[1:-1])
    return tuple(shape[0] if i == b else shape[-1] if i == c else next(rest) for i in range(n))


def _spatial_sum(mat, batch_ndim: int):
    """Sum over all axes after the batch ones (a product with a vector of ones, see `_spatial_mean`)."""
    flat = mat.reshape(mat.shape[:batch_ndim] + (-1,))
    return flat @ jnp.ones((flat.shape[-1],), flat.dtype)


# ---------------------------------------------------------------------------
# Window pooling
# ---------------------------------------------------------------------------


def _int_tuple(values, name: str, layer: str) -> tuple[int, ...]:
    try:
        out = tuple(values)
    except TypeError:
        raise TypeError(f"{layer}: {name} must be a sequence of positive integers, got {values!r}") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in out):
        raise TypeError(f"{layer}: {name} must be a sequence of positive integers, got {values!r}")
    return tuple(int(v) for v in out)


def _pool(kind: str, window_shape, strides, padding, normalize_edges, batch_axis, channel_axis) -> Layer:
    """Window pooling (``kind`` 'avg' or 'sum') over the spatial axes of the layout ``(batch_axis, channel_axis)``.

    Finite layer: y[i] = s * sum_{d in window} x[i * stride + d] (zero or wrap padding), s = 1 / |window| for
    average pooling (1 / number of unpadded pixels with ``normalize_edges`` and 'SAME'), s = 1 for sum pooling.
    Kernel: the same window sum along both positions of every spatial pair,
    K'(i, j) = s_i s_j sum_{d, e in window} K(i * stride + d, j * stride + e).
    """
    name = "AvgPool" if kind == "avg" else "SumPool"
    window_shape = _int_tuple(window_shape, "window_shape", name)
    layer = f"{name}({window_shape})"
    nd = len(window_shape)
    strides = (1,) * nd if not strides else _int_tuple(strides, "strides", layer)
    if len(strides) != nd or any(s < 1 for s in strides) or any(w < 1 for w in window_shape):
        raise ValueError(f"{layer}: window and strides must be {nd} positive integers, got {window_shape}, {strides}")
    padding = padding_name(padding)
    if padding not in _PADDINGS:
        raise ValueError(f"{layer}: padding must be one of {_PADDINGS}, got {padding!r}")
    layout = (_check_axis(batch_axis, "batch_axis", layer), _check_axis(channel_axis, "channel_axis", layer))
    circular = padding == "CIRCULAR"
    size = math.prod(window_shape)
    edges = kind == "avg" and normalize_edges and padding == "SAME"

    def canonical_out(shape, shown):
        if len(shape) != nd + 2:
            raise ValueError(f"{layer}: needs inputs of rank {nd + 2} ({nd} spatial axes), got shape {shown}")
        if padding == "VALID" and any(n < w for n, w in zip(shape[1:-1], window_shape)):
            raise ValueError(f"{layer}: VALID pooling needs every spatial size >= window, got input shape {shown}")
        return (shape[0],) + _out_sizes(shape[1:-1], window_shape, strides, padding) + (shape[-1],)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        _resolve_axes(layout, len(shape), layer, shape)
        return _from_canonical_shape(canonical_out(canonical_shape(shape, layout), shape), layout)

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
        x = to_canonical(x, layout)
        spatial = x.shape[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        out = _window_sum(x, tuple(range(1, nd + 1)), window_shape, strides, pads, circular)
        if edges:
            for i, c in enumerate(counts(spatial, pads)):
                shape = [1] * out.ndim
                shape[1 + i] = c.shape[0]
                out = out / jnp.asarray(c, x.dtype).reshape(shape)
        elif kind == "avg":
            out = out * (1.0 / size)
        return _from_canonical(out, layout)

    def kernel_map(k: Kernel) -> Kernel:
        if not k.full:  # pragma: no cover - the requirement pass guarantees full
            raise RuntimeError(f"{layer}: internal error, kernel must track all position pairs")
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        spatial = k.shape1[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        cnt = counts(spatial, pads) if edges else None

        def op(mat, batch_ndim):
            if mat.ndim <= batch_ndim:  # the scalar zero NTK of the inputs
                return mat
            axes, win, strd, pp = [], [], [], []
            for i in range(nd):
                a = batch_ndim + 2 * i
                axes += [a, a + 1]
                win += [window_shape[i]] * 2
                strd += [strides[i]] * 2
                pp += [pads[i]] * 2
            out = _window_sum(mat, tuple(axes), win, strd, pp, circular)
            if kind == "sum":
                return out
            if cnt is None:
                return out * (1.0 / size**2)
            for i, c in enumerate(cnt):
                for j in (0, 1):
                    shape = [1] * out.ndim
                    shape[batch_ndim + 2 * i + j] = c.shape[0]
                    out = out / jnp.asarray(c, out.dtype).reshape(shape)
            return out

        shapes = dict(shape1=canonical_out(k.shape1, k.shape1), shape2=canonical_out(k.shape2, k.shape2))
        return _map_covs(k, op, op, **shapes)

    def mask_fn(mask, shape):
        """An output pixel is masked when the centre pixel of its window is."""
        mask = masking.positions(mask, layer)[..., None]
        spatial = shape[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        out = _out_sizes(spatial, window_shape, strides, "SAME" if circular else padding)
        return masking.window_center_mask(mask, window_shape, strides, pads, out, circular)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True, layout=layout,
                 masking=masking.MaskRule(mask_fn, remask=True), means="linear")


def AvgPool(
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    normalize_edges: bool = False,
    batch_axis: int = 0,
    channel_axis: int = -1,
) -> Layer:
    """Average pooling over spatial windows; ``strides=None`` means stride 1.

    y[i] = (1 / |window|) sum_{d in window} x[i * stride + d]; its kernel is
    K'(i, j) = (1 / |window|^2) sum_{d, e in window} K(i * stride + d, j * stride + e).
    With 'SAME' padding the window average divides by the full window size,
    unless ``normalize_edges`` (then by the number of real pixels).

    Args:
        window_shape: pooling window per spatial axis, positive ints.
        strides: stride per spatial axis, positive ints; ``None`` means stride 1.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        normalize_edges: with ``'SAME'`` padding, divide each window by its number of unpadded pixels instead
            of the window size; no effect otherwise.
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1); every other axis is spatial.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping (N, *spatial, C) to
        (N, *spatial_out, C) in the given layout. Its kernel tracks the covariances of all pairs of positions.

    Raises:
        ValueError: if ``window_shape`` or ``strides`` are not positive integers of matching length, or
            ``padding`` is unknown; when called, if the input's rank or spatial sizes do not fit the window or
            the axes are out of range.
        TypeError: if the window, strides or axes are not integers.
    """
    return _pool("avg", window_shape, strides, padding, normalize_edges, batch_axis, channel_axis)


def SumPool(
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    batch_axis: int = 0,
    channel_axis: int = -1,
) -> Layer:
    """Sum pooling over spatial windows; ``strides=None`` means stride 1.

    y[i] = sum_{d in window} x[i * stride + d] (zero padding for 'SAME', wrap-around for 'CIRCULAR'); its
    kernel is K'(i, j) = sum_{d, e in window} K(i * stride + d, j * stride + e).

    Args:
        window_shape: pooling window per spatial axis, positive ints.
        strides: stride per spatial axis, positive ints; ``None`` means stride 1.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1); every other axis is spatial.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; the kernel tracks all position pairs.

    Raises:
        ValueError: as `AvgPool`.
        TypeError: as `AvgPool`.
    """
    return _pool("sum", window_shape, strides, padding, False, batch_axis, channel_axis)


# ---------------------------------------------------------------------------
# Global pooling and flattening
# ---------------------------------------------------------------------------


def _global_pool(kind: str, batch_axis, channel_axis) -> Layer:
    """Global pooling: y = s sum_i x[i] over all spatial positions, s = 1 / P (average) or 1 (sum).

    Kernel: K' = s^2 sum_{i, j} K(i, j), the sum over all P^2 pairs of positions.
    """
    layer = "GlobalAvgPool" if kind == "avg" else "GlobalSumPool"
    layout = (_check_axis(batch_axis, "batch_axis", layer), _check_axis(channel_axis, "channel_axis", layer))
    reduce = _spatial_mean if kind == "avg" else _spatial_sum

    def reduce_kernel(mat, batch_ndim):
        return mat if mat.ndim <= batch_ndim else reduce(mat, batch_ndim)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        b, c = _resolve_axes(layout, len(shape), layer, shape)
        if len(shape) < 3:
            raise ValueError(f"{layer}: needs spatial dimensions, got input shape {shape}")
        return (shape[b], shape[c]) if b < c else (shape[c], shape[b])

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, mask=None, **kwargs):
        shape_fn(tuple(x.shape))
        b, c = layout[0] % x.ndim, layout[1] % x.ndim
        axes = tuple(i for i in range(x.ndim) if i not in (b, c))
        if kind == "avg":
            return masking.masked_mean(x, mask, axes)  # the mean over unmasked positions
        return jnp.sum(x, axis=axes)

    def kernel_map(k: Kernel) -> Kernel:
        if k.spatial_ndim < 1:
            raise ValueError(f"{layer}: needs spatial dimensions, got input activations of shape {k.shape1}")
        shapes = dict(shape1=(k.shape1[0], k.shape1[-1]), shape2=(k.shape2[0], k.shape2[-1]))
        if kind == "avg" and masking.has_masks(k) and k.full:
            # K'(x, y) = sum_{p, q} K(x, p; y, q) / #{(p, q): neither masked}
            m1, m2 = masking.kernel_masks(k, layer)
            own2 = m1 if k.mask2 is None else m2

            def avg(mat, mask, batch_ndim):
                if mat is None or mat.ndim <= batch_ndim:
                    return mat
                return masking.masked_mean(mat, mask, tuple(range(batch_ndim, mat.ndim)))

            return k.replace(
                nngp=avg(k.nngp, masking.pair_mask(m1, m2, True, True), 2),
                ntk=avg(k.ntk, masking.pair_mask(m1, m2, True, True), 2),
                cov1=avg(k.cov1, masking.pair_mask(m1, None, True, False), 1),
                cov2=avg(k.cov2, masking.pair_mask(own2, None, True, False), 1),
                full=False, **shapes)
        return _map_covs(k, reduce_kernel, reduce_kernel, full=False, **shapes)

    def mask_fn(mask, shape):
        """A point is masked when all its positions are."""
        mask = masking.positions(mask, layer)
        return jnp.all(mask, axis=tuple(range(1, mask.ndim)))[:, None]

    def finite_mask_fn(mask, shape):
        b, c = layout[0] % len(shape), layout[1] % len(shape)
        if mask.shape[c] != 1:
            masking.positions(jnp.moveaxis(mask, c, -1), layer)  # raises: channel-wise masks
        return jnp.all(mask, axis=tuple(i for i in range(len(shape)) if i not in (b, c)))

    rule = masking.MaskRule(mask_fn, wants_mask=kind == "avg", finite_fn=finite_mask_fn)
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True, layout=layout, masking=rule,
                 means="linear")


def GlobalAvgPool(batch_axis: int = 0, channel_axis: int = -1) -> Layer:
    """Mean over all spatial positions, which are removed: y = (1 / P) sum_i x[i].

    Kernel: K' = (1 / P^2) sum_{i, j} K(i, j) over all pairs of the P positions. The output keeps the order of
    the batch and channel axes: (N, C), or (C, N) when the channel axis comes first.

    Args:
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1); every other axis is spatial.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; its inputs need at least one spatial axis.

    Raises:
        ValueError: when called on inputs without spatial axes or with axes out of range.
        TypeError: if an axis is not an integer.
    """
    return _global_pool("avg", batch_axis, channel_axis)


def GlobalSumPool(batch_axis: int = 0, channel_axis: int = -1) -> Layer:
    """Sum over all spatial positions, which are removed: y = sum_i x[i].

    Kernel: K' = sum_{i, j} K(i, j) over all pairs of positions. The output keeps the order of the batch and
    channel axes.

    Args:
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1); every other axis is spatial.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; its inputs need at least one spatial axis.

    Raises:
        ValueError: when called on inputs without spatial axes or with axes out of range.
        TypeError: if an axis is not an integer.
    """
    return _global_pool("sum", batch_axis, channel_axis)


def Flatten(batch_axis: int = 0, batch_axis_out: int = 0) -> Layer:
    """Flatten all non-batch axes: (N, H, W, C) -> (N, H*W*C).

    Each output unit is one (position, channel) of the input, so the kernel of the flattened layer, averaged
    over its units, is the mean over positions of the same-position covariances: K' = (1 / P) sum_i K(i, i).

    Args:
        batch_axis: the batch axis of the finite inputs (default 0); the other axes are flattened in order.
        batch_axis_out: 0 (default) for outputs (N, features), 1 for (features, N); -2 and -1 are accepted too.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters. Its kernel needs no position pairs.

    Raises:
        ValueError: if ``batch_axis_out`` is not 0 or 1 (or -2, -1); when called, if ``batch_axis`` is out of
            range for the input.
        TypeError: if an axis is not an integer.
    """
    layer = "Flatten" if (batch_axis, batch_axis_out) == (0, 0) else f"Flatten({batch_axis}, {batch_axis_out})"
    batch_axis = _check_axis(batch_axis, "batch_axis", layer)
    batch_axis_out = _check_axis(batch_axis_out, "batch_axis_out", layer)
    if batch_axis_out not in (0, 1, -1, -2):
        raise ValueError(f"{layer}: batch_axis_out must be 0 or 1, got {batch_axis_out}")
    batch_last = batch_axis_out in (1, -1)
    # The kernel averages over every non-batch axis, so the channel axis of the layout only has to differ from
    # the batch axis when the inputs are moved to the canonical layout.
    layout = None if batch_axis == 0 else (batch_axis, 0)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if not -len(shape) <= batch_axis < len(shape):
            raise ValueError(f"{layer}: batch_axis={batch_axis} is out of range for an input of shape {shape}")
        n = shape[batch_axis]
        features = math.prod(s for i, s in enumerate(shape) if i != batch_axis % len(shape))
        return (features, n) if batch_last else (n, features)

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        out_shape = shape_fn(tuple(x.shape))
        x = jnp.moveaxis(x, batch_axis, -1 if batch_last else 0)
        return jnp.reshape(x, out_shape)

    def kernel_map(k: Kernel) -> Kernel:
        def op(mat, batch_ndim):
            if mat.ndim <= batch_ndim:
                return mat
            if k.full:
                mat = _spatial_diagonal(mat, batch_ndim)
            return _spatial_mean(mat, batch_ndim)

        shapes = dict(shape1=(k.shape1[0], math.prod(k.shape1[1:])), shape2=(k.shape2[0], math.prod(k.shape2[1:])))
        return _map_covs(k, op, op, full=False, **shapes)

    def mask_fn(mask, shape):
        """Each output unit is one input entry: the mask is flattened like the activations."""
        return jnp.broadcast_to(mask, shape).reshape(shape[0], -1)

    def finite_mask_fn(mask, shape):
        mask = jnp.moveaxis(jnp.broadcast_to(mask, shape), batch_axis, -1 if batch_last else 0)
        return mask.reshape(shape_fn(tuple(shape)))

    rule = masking.MaskRule(mask_fn, finite_fn=finite_mask_fn)
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: False, layout=layout, masking=rule,
                 means="linear")
