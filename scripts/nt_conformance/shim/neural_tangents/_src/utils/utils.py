"""The three axis helpers of ``neural_tangents._src.utils.utils`` that nt's test files call to build their
expected values (written for the shim; the test files use them, the library does not)."""

from collections.abc import Sequence

import jax.numpy as jnp


def unzip_axes(x, start_axis: int = 0, end_axis: int | None = None):
    """De-interleave paired axes: ``[..., X, X', Y, Y', ...] -> [..., X, Y, ..., X', Y', ...]`` on
    ``x.shape[start_axis:end_axis]`` (an even number of axes)."""
    end_axis = x.ndim if end_axis is None else end_axis % (x.ndim + 1)
    paired = list(range(start_axis, end_axis))
    if len(paired) % 2:
        raise ValueError(f"unzip_axes: an even number of axes is needed between {start_axis} and {end_axis}")
    order = list(range(start_axis)) + paired[0::2] + paired[1::2] + list(range(end_axis, x.ndim))
    return jnp.transpose(x, order)


def axis_after_dot(axis: int, contracting_dims: Sequence[int], batch_dims: Sequence[int],
                   lhs_ndim: int | None = None) -> int:
    """Where an operand's free ``axis`` lands in ``lax.dot_general``'s output (batch axes first, then the
    left operand's free axes, then the right's; ``lhs_ndim`` is given for an axis of the right operand)."""
    batch_dims = list(batch_dims)
    if axis in batch_dims:
        return batch_dims.index(axis)
    before = axis - sum(d < axis for d in contracting_dims) - sum(d < axis for d in batch_dims)
    offset = len(batch_dims)
    if lhs_ndim is not None:  # the left operand's free axes come first
        offset += lhs_ndim - len(batch_dims) - len(contracting_dims)
    return before + offset


def canonicalize_idx(idx, ndim: int) -> tuple:
    """``idx`` as a tuple of ``ndim`` ints and slices (``Ellipsis`` expanded, missing axes filled)."""
    if idx is Ellipsis or isinstance(idx, (int, slice)):
        idx = (idx,)
    idx = tuple(idx)
    if any(s is Ellipsis for s in idx):
        i = next(i for i, s in enumerate(idx) if s is Ellipsis)
        idx = idx[:i] + (slice(None),) * (ndim - len(idx) + 1) + idx[i + 1:]
    return idx + (slice(None),) * (ndim - len(idx))
