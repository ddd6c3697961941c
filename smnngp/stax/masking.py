"""Masked inputs: `MaskedArray`, `unmask_fn` and the mask machinery every layer shares.

A network called as ``apply_fn(params, x, mask_constant=c)`` or ``kernel_fn(x1, x2, mask_constant=c)`` treats
the entries of its inputs equal to ``c`` (``NaN`` matches ``NaN``) as missing: variable-length sequences
padded with ``c`` at the end, pixels set to ``c``. With M the boolean mask of the entries and x the inputs,

* the inputs become x' = x where not M, 0 where M, and each layer sees its input zeroed where it is masked;
* each layer maps the mask forward with its own rule (a `MaskRule`): a channel-mixing layer masks a position
  when every one of its channels is masked, M'[n, p] = AND_c M[n, p, c]; a convolution or pooling window
  takes the mask of its centre pixel; a global pooling masks a point whose every position is masked; a sum
  of branches masks an entry masked in every branch (AND), a concatenation concatenates the masks;
* the finite network returns ``MaskedArray(value, mask)`` and ``unmask_fn(apply_fn)`` returns
  value * (1 - mask);
* in the kernel, covariances that involve a masked position are set to zero after the layers that would
  otherwise leave them non-zero (``remask``):
  K(x, p; y, q) = 0 when M1[x, p] or M2[y, q]; layers that average over positions use the unmasked ones only
  (global average pooling: sum_{p, q} K(x, p; y, q) / #{(p, q): neither masked}), attention gives masked keys
  zero weight (their logits are -inf before a softmax, 0 otherwise), LayerNorm normalises spatially by the
  mean variance over unmasked positions.

Masks are held by `smnngp.kernels.Kernel` (``mask1``, ``mask2``) in the canonical layout (batch first,
channels last). Channel-wise different masks (a channel axis of size > 1) are only allowed where a layer
reduces the channels (Dense, Conv, attention) or keeps every entry apart (Flatten): elsewhere the kernel
cannot represent them, and the layer raises.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MaskedArray", "unmask_fn"]


@dataclasses.dataclass(frozen=True)
class MaskedArray:
    """An array (or a pytree of arrays) with a boolean mask; what ``apply_fn(..., mask_constant=c)`` returns.

    Args:
        masked_value: the values; entries where ``mask`` is True are meaningless (`unmask_fn` zeroes them).
        mask: boolean array broadcastable to ``masked_value``, True where an entry is masked.
    """

    masked_value: Any
    mask: Any


jax.tree_util.register_dataclass(MaskedArray, data_fields=["masked_value", "mask"], meta_fields=[])


def _zeroed(x, mask):
    """x where not mask, 0 where mask (``None`` mask: x unchanged)."""
    if mask is None:
        return x
    return jnp.where(mask, jnp.zeros((), x.dtype), x)


def unmask_fn(fn):
    """Wrap ``fn`` so that every `MaskedArray` it returns becomes its values with masked entries set to zero.

    ``unmask_fn(fn)(*args) = tree_map(lambda a: where(a.mask, 0, a.masked_value), fn(*args))`` over the
    `MaskedArray` leaves of the output; plain arrays pass unchanged.

    Args:
        fn: a function returning arrays, `MaskedArray` objects or pytrees of them (an ``apply_fn``).

    Returns:
        A function with the signature of ``fn`` that returns plain arrays.

    Raises:
        TypeError: if ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"unmask_fn: expected a function, got {type(fn).__name__}")

    def unmasked(*args, **kwargs):
        out = fn(*args, **kwargs)
        return jax.tree_util.tree_map(
            lambda a: _zeroed(a.masked_value, a.mask) if isinstance(a, MaskedArray) else a,
            out, is_leaf=lambda a: isinstance(a, MaskedArray))

    unmasked.__name__ = f"unmask_fn({getattr(fn, '__name__', 'fn')})"
    unmasked.__doc__ = fn.__doc__
    return unmasked


def entry_mask(x, mask_constant):
    """The boolean mask x == mask_constant (x is NaN for a NaN constant); ``None`` for ``mask_constant=None``."""
    if mask_constant is None:
        return None
    if not isinstance(mask_constant, jax.core.Tracer):
        if math.isnan(float(mask_constant)):
            return jnp.isnan(x)
        return x == mask_constant
    return jnp.where(jnp.isnan(mask_constant), jnp.isnan(x), x == mask_constant)


def is_masked_input(x) -> bool:
    """Whether ``x`` (an input or a list of branch inputs) holds a `MaskedArray`."""
    if isinstance(x, MaskedArray):
        return True
    return isinstance(x, (list, tuple)) and any(isinstance(a, MaskedArray) for a in x)


def split_masked(x, mask_constant):
    """(values zeroed where masked, masks) of an input or a list of branch inputs (masks ``None`` when unmasked)."""
    if isinstance(x, (list, tuple)) and not hasattr(x, "shape"):
        pairs = [split_masked(a, mask_constant) for a in x]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(x, MaskedArray):
        value, mask = x.masked_value, x.mask
    else:
        value, mask = x, entry_mask(jnp.asarray(x), mask_constant)
    return _zeroed(value, mask), mask


class MaskRule:
    """How a layer treats masks.

    Args:
        fn: ``fn(mask, shape) -> mask`` mapping the input mask to the output mask, both in the canonical layout
            (``shape`` the canonical shape of the input activations; lists for layers with several inputs);
            ``None`` keeps the mask.
        remask: whether the layer's kernel is zeroed wherever a position of its output is masked.
        wants_mask: whether ``apply_fn`` takes the input mask as ``mask=`` (in its own layout).
        out_layout: ``(batch_axis, channel_axis)`` of the finite outputs when they differ from the inputs'.
        finite_fn: ``finite_fn(mask, shape)`` in the finite layout, used by ``apply_fn`` instead of ``fn`` when
            the two layouts order the output differently (Flatten).
    """

    def __init__(self, fn=None, remask=False, wants_mask=False, out_layout=None, finite_fn=None):
        self.fn = fn
        self.remask = remask
        self.wants_mask = wants_mask
        self.out_layout = out_layout
        self.finite_fn = finite_fn


# A layer made of other layers (serial, parallel, repeat, FanOut): its children treat the masks.
COMPOSITE = "composite"


def has_masks(k) -> bool:
    """Whether a `Kernel` (or a list of them) carries a mask."""
    if isinstance(k, list):
        return any(has_masks(ki) for ki in k)
    return k.mask1 is not None or k.mask2 is not None


def reduce_channels(mask):
    """M'[n, p] = AND_c M[n, p, c] (canonical layout, keeps a channel axis of size 1)."""
    return jnp.all(mask, axis=-1, keepdims=True)


def positions(mask, layer: str):
    """The canonical mask (N, spatial..., 1) without its channel axis; raises when channels differ."""
    if mask.shape[-1] != 1:
        raise NotImplementedError(
            f"{layer}: masks that differ between channels (mask shape {tuple(mask.shape)}) have no "
            f"infinite-width kernel here; mask whole positions (every channel of a masked position equal to "
            f"mask_constant), or put a channel-mixing layer (Dense, Conv) first")
    return mask[..., 0]


def kernel_masks(k, layer: str):
    """Position masks (m1, m2) of a kernel: (N1, spatial...) and (N2, spatial...), m2 = m1 when x2 is x1."""
    m1 = None if k.mask1 is None else positions(k.mask1, layer)
    m2 = None if k.mask2 is None else positions(k.mask2, layer)
    if m2 is None and k.cov2 is None:
        m2 = m1
    return m1, m2


def _spread(m, first: bool, full: bool):
    """(N, H, W) -> (N, H, 1, W, 1) (first end of a pair) or (N, 1, H, 1, W) when ``full``; unchanged otherwise."""
    if not full or m.ndim == 1:
        return m
    shape = [m.shape[0]]
    for size in m.shape[1:]:
        shape += [size, 1] if first else [1, size]
    return m.reshape(shape)


def pair_mask(m1, m2, full: bool, cross: bool):
    """Mask of a covariance matrix: entry (x, p; y, q) is masked when m1[x, p] or m2[y, q].

    ``cross`` gives the (N1, N2, ...) mask of ``nngp``; otherwise the (N, ...) mask of a batch diagonal
    (``m2`` is ``m1`` there). ``None`` masks count as unmasked.
    """
    if m1 is None and m2 is None:
        return None
    if cross:
        a = None if m1 is None else _spread(m1, True, full)[:, None]
        b = None if m2 is None else _spread(m2, False, full)[None, :]
    else:
        a = None if m1 is None else _spread(m1, True, full)
        b = None if m1 is None else _spread(m1, False, full)
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def remask_kernel(k, mask1, mask2, layer: str):
    """``k`` with the new masks and every covariance that involves a masked position set to zero."""
    k = k.replace(mask1=mask1, mask2=mask2)
    m1, m2 = kernel_masks(k, layer)
    if m1 is None and m2 is None:
        return k
    full = k.full and k.spatial_ndim > 0
    own2 = m2 if k.mask2 is not None else m1
    ntk = k.ntk
    if ntk is not None and ntk.ndim > 0:
        ntk = _zeroed(ntk, pair_mask(m1, m2, full, True))
    return k.replace(
        nngp=_zeroed(k.nngp, pair_mask(m1, m2, full, True)),
        ntk=ntk,
        cov1=_zeroed(k.cov1, pair_mask(m1, None, full, False)),
        cov2=None if k.cov2 is None else _zeroed(k.cov2, pair_mask(own2, None, full, False)),
    )


def masked_mean(mat, mask, axes, keepdims: bool = False):
    """sum_{axes} mat / max(1, #unmasked entries along ``axes``): neural-tangents' average over unmasked entries.

    The sum runs over every entry (masked ones are zero in a remasked kernel); ``mask=None`` is the plain mean.
    """
    axes = tuple(a % mat.ndim for a in axes)
    if mask is None:
        return jnp.mean(mat, axis=axes, keepdims=keepdims)
    total = math.prod(mat.shape[a] for a in axes)
    masked = jnp.sum(jnp.broadcast_to(mask, mat.shape), axis=axes, keepdims=keepdims)
    count = jnp.maximum(total - masked, 1).astype(mat.dtype)
    return jnp.sum(mat, axis=axes, keepdims=keepdims) / count


def window_center_mask(mask, window, strides, pads, out_sizes, circular: bool):
    """Mask of a window op (conv, pooling) over the spatial axes of a canonical mask: the mask of each
    window's centre pixel, x[i * s - lo + (w - 1) // 2] (wrapped for circular padding, clipped otherwise)."""
    for i, (w, s, (lo, _), n_out) in enumerate(zip(window, strides, pads, out_sizes)):
        axis = 1 + i
        n_in = mask.shape[axis]
        if n_in == 1:
            continue
        idx = -lo + (w - 1) // 2 + s * np.arange(n_out)
        idx = np.mod(idx, n_in) if circular else np.clip(idx, 0, n_in - 1)
        mask = jnp.take(mask, idx, axis=axis)
    return mask
