"""Shape layers: `Index` (with its helper `Slice`), `ImageResize`, `DotGeneral`.

Each is a fixed linear map y = A x of the activations that leaves the (infinitely wide) channel axis alone, so
its kernel is A applied on both sides of the input covariance, K' = A K A^T, along every pair of kernel axes.
Kernels stay in the canonical layout (batch first, channels last); the finite layers work in the layout
``(batch_axis, channel_axis)`` they are given.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import Layer, _from_canonical, _single_shape, canonical_shape, to_canonical
from smnngp.stax.pooling import _check_axis, _from_canonical_shape, _resolve_axes

__all__ = ["Index", "Slice", "ImageResize", "DotGeneral"]


def _map_all(k: Kernel, fn, **changes) -> Kernel:
    """Apply ``fn(mat, batch_ndim)`` to nngp, ntk (unless it is the scalar zero), cov1 and cov2."""
    ntk = k.ntk
    if ntk is not None and jnp.ndim(ntk) > 0:
        ntk = fn(ntk, 2)
    return k.replace(nngp=fn(k.nngp, 2), ntk=ntk, cov1=fn(k.cov1, 1),
                     cov2=None if k.cov2 is None else fn(k.cov2, 1), **changes)


# ---------------------------------------------------------------------------
# Index and Slice
# ---------------------------------------------------------------------------


class _Slice:
    """``Slice[1:10, :, ::-1]`` returns the index ``(slice(1, 10), slice(None), slice(None, None, -1))``.

    Index expressions such as ``1, :, 2:8:3`` cannot be written as function arguments; ``Slice[...]`` turns them
    into the tuple that `Index` takes.
    """

    def __getitem__(self, idx):
        return idx

    def __repr__(self) -> str:
        return "smnngp.stax.Slice"


Slice = _Slice()


def _full_index(idx, ndim: int, layer: str) -> tuple:
    """``idx`` (an int, slice, Ellipsis or tuple of those) as one int or slice per axis of an ``ndim``-array."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    for s in idx:
        is_int = isinstance(s, (int, np.integer)) and not isinstance(s, bool)
        if not (s is Ellipsis or isinstance(s, slice) or is_int):
            raise NotImplementedError(
                f"{layer}: only integers, slices and '...' are supported in the index, got {s!r} (build the index "
                f"with stax.Slice[...])"
            )
    if sum(s is Ellipsis for s in idx) > 1:
        raise ValueError(f"{layer}: an index can have only one '...'")
    n_real = sum(s is not Ellipsis for s in idx)
    if n_real > ndim:
        raise ValueError(f"{layer}: too many indices ({n_real}) for an input with {ndim} axes")
    out = []
    for s in idx:
        if s is Ellipsis:
            out += [slice(None)] * (ndim - n_real)
        else:
            out.append(int(s) if isinstance(s, (int, np.integer)) else s)
    out += [slice(None)] * (ndim - len(out))
    return tuple(out)


def _index_shape(shape, full_idx, layer: str) -> tuple[int, ...]:
    out = []
    for n, s in zip(shape, full_idx):
        if isinstance(s, int):
            if not -n <= s < n:
                raise ValueError(f"{layer}: index {s} is out of range for an axis of size {n} (input shape {shape})")
            continue
        out.append(len(range(*s.indices(n))))
    return tuple(out)


def Index(idx, batch_axis: int = 0, channel_axis: int = -1) -> Layer:
    """NumPy basic indexing of the activations, y = x[idx].

    Selecting positions is a linear map, and its kernel selects the same positions on both sides of every pair
    of kernel axes: K'(i, j) = K(idx(i), idx(j)), with the batch index applied to x1 and to x2 alike. An integer
    removes its (spatial) axis.

    Args:
        idx: an integer, a slice, ``...`` or a tuple of those, as in ``x[idx]``; build it with `Slice`, e.g.
            ``Index(Slice[::2, :4, :4])``.
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters.

    Raises:
        NotImplementedError: for index entries other than integers, slices and ``...``; when the kernel is
            computed, if the channel axis is indexed (other than ``:``) or the batch axis is indexed with an
            integer (the kernel needs a batch axis).
        ValueError: when called, if the index has too many entries or an integer is out of range.
        TypeError: if an axis is not an integer.
    """
    layer = f"Index({idx!r})"
    layout = (_check_axis(batch_axis, "batch_axis", layer), _check_axis(channel_axis, "channel_axis", layer))
    _full_index(idx, 64, layer)  # rejects unsupported entries now

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        return _index_shape(shape, _full_index(idx, len(shape), layer), layer)

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        return x[_full_index(idx, x.ndim, layer)]

    def kernel_map(k: Kernel) -> Kernel:
        ndim = len(k.shape1)
        user_shape = _from_canonical_shape(k.shape1, layout)
        b, c = _resolve_axes(layout, ndim, layer, user_shape)
        full_idx = _full_index(idx, ndim, layer)
        if full_idx[c] != slice(None):
            raise NotImplementedError(f"{layer}: indexing the channel axis {c}, which is infinitely wide in the "
                                      f"kernel, is not supported (use ':' there)")
        if isinstance(full_idx[b], int):
            raise NotImplementedError(f"{layer}: an integer index on the batch axis {b} removes it, and kernels need "
                                      f"a batch axis; use a slice such as {full_idx[b]}:{full_idx[b] + 1}")
        canon = (full_idx[b],) + tuple(s for i, s in enumerate(full_idx) if i not in (b, c)) + (full_idx[c],)
        spatial = canon[1:-1]
        pair = tuple(s for s in spatial for _ in range(2)) if k.full else spatial

        def op(mat, batch_ndim):
            return mat[(canon[0],) * batch_ndim + pair]

        shapes = {f"shape{i}": _index_shape(s, canon, layer) for i, s in ((1, k.shape1), (2, k.shape2))}
        return _map_all(k, op, **shapes)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full, layout=layout,
                 means=_flow.ZERO_PRESERVING)


# ---------------------------------------------------------------------------
# ImageResize
# ---------------------------------------------------------------------------


def ImageResize(
    shape: Sequence[int],
    method,
    antialias: bool = True,
    precision=lax.Precision.HIGHEST,
    batch_axis: int = 0,
    channel_axis: int = -1,
) -> Layer:
    """Resize the activations with `jax.image.resize`; an entry ``-1`` of ``shape`` keeps that axis.

    Linear and nearest-neighbour resizing are separable linear maps, y = (R_1 x R_2 x ...) x with one matrix
    R_d per resized axis, so the kernel is resized along both axes of every pair:
    K'(i, j) = sum_{a, b} R(i, a) R(j, b) K(a, b), i.e. `jax.image.resize` of the kernel with every
    spatial size doubled into its pair. Other methods ('cubic', 'lanczos3', 'lanczos5') work in the finite
    network only.

    Args:
        shape: the output shape, one entry per input axis (batch and channel included); -1 keeps an axis.
        method: a `jax.image.ResizeMethod` or its name ('linear', 'bilinear', 'trilinear', 'triangle',
            'nearest', 'cubic', 'lanczos3', 'lanczos5').
        antialias: whether linear downsampling uses an antialiasing (wider triangular) filter; no effect when
            upsampling or for 'nearest'.
        precision: `jax.lax.Precision` of the resizing contractions (default HIGHEST).
        batch_axis: the batch axis of the finite inputs (default 0).
        channel_axis: the channel axis of the finite inputs (default -1).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters.

    Raises:
        ValueError: if ``method`` is unknown, ``shape`` has entries other than -1 or positive integers, or the
            axes are out of range for ``shape``; when called, if ``shape`` does not have one entry per input
            axis; when the kernel is computed, if the channel axis is resized.
        NotImplementedError: when the kernel is computed with a method other than linear and nearest, or with
            the batch axis resized (which mixes the points, and kernels keep the variances of single points).
        TypeError: if ``shape`` or the axes are not integers.
    """
    layer = f"ImageResize({tuple(shape)!r}, {method!r})"
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{layer}: shape must be a sequence of integers") from None
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"{layer}: shape must be a sequence of integers, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if any(s != -1 and s < 1 for s in shape):
        raise ValueError(f"{layer}: shape entries must be positive sizes or -1 (keep), got {shape}")
    try:
        resize_method = (jax.image.ResizeMethod.from_string(method) if isinstance(method, str)
                         else jax.image.ResizeMethod(method))
    except (ValueError, TypeError):
        raise ValueError(f"{layer}: unknown resize method {method!r}") from None
    layout = (_check_axis(batch_axis, "batch_axis", layer), _check_axis(channel_axis, "channel_axis", layer))
    b, c = _resolve_axes(layout, len(shape), layer, shape)
    resizes_space = any(s != -1 for i, s in enumerate(shape) if i not in (b, c))
    target_canon = canonical_shape(shape, layout)

    def target(in_shape):
        return tuple(n if s == -1 else s for n, s in zip(in_shape, shape))

    def shape_fn(in_shape):
        in_shape = _single_shape(in_shape, layer)
        if len(in_shape) != len(shape):
            raise ValueError(f"{layer}: shape has {len(shape)} entries but the input has shape {in_shape}")
        return target(in_shape)

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        out_shape = shape_fn(tuple(x.shape))
        return jax.image.resize(x, out_shape, resize_method, antialias=antialias, precision=precision)

    def kernel_map(k: Kernel) -> Kernel:
        if resize_method not in (jax.image.ResizeMethod.LINEAR, jax.image.ResizeMethod.NEAREST):
            raise NotImplementedError(f"{layer}: only 'linear' and 'nearest' resizing have a kernel, got "
                                      f"{resize_method.name.lower()}")
        if target_canon[-1] != -1:
            raise ValueError(f"{layer}: resizing the channel axis is not defined for infinitely many channels; "
                             f"set shape[channel_axis] = -1")
        if target_canon[0] != -1:
            raise NotImplementedError(f"{layer}: resizing the batch axis mixes the points, which the kernel cannot "
                                      f"follow (it keeps single-point variances); set shape[batch_axis] = -1")
        if len(k.shape1) != len(shape):
            raise ValueError(f"{layer}: shape has {len(shape)} entries but the input activations have shape "
                             f"{_from_canonical_shape(k.shape1, layout)}")
        spatial_out = [n if s == -1 else s for n, s in zip(k.shape1[1:-1], target_canon[1:-1])]
        per_axis = [(n, n) for n in spatial_out] if k.full else [(n,) for n in spatial_out]
        spatial_axes = tuple(n for pair in per_axis for n in pair)

        def op(mat, batch_ndim):
            return jax.image.resize(mat, mat.shape[:batch_ndim] + spatial_axes, resize_method,
                                    antialias=antialias, precision=precision)

        shapes = {f"shape{i}": (s[0], *spatial_out, s[-1]) for i, s in ((1, k.shape1), (2, k.shape2))}
        return _map_all(k, op, **shapes)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full or resizes_space, layout=layout,
                 means=_flow.ZERO_PRESERVING)


# ---------------------------------------------------------------------------
# DotGeneral
# ---------------------------------------------------------------------------


def _dimension_numbers(dn, layer: str):
    try:
        (cs_a, cs_b), (bs_a, bs_b) = dn
        out = tuple(tuple(int(a) for a in axes) for axes in (cs_a, cs_b, bs_a, bs_b))
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, "
                         f"rhs_batch)), tuples of axes, got {dn!r}") from None
    if len(out[0]) != len(out[1]) or len(out[2]) != len(out[3]):
        raise ValueError(f"{layer}: contracting and batch dimensions must come in pairs, got {dn!r}")
    return out


def DotGeneral(
    *,
    lhs=None,
    rhs=None,
    dimension_numbers=(((), ()), ((), ())),
    precision=None,
    batch_axis: int = 0,
    channel_axis: int = -1,
) -> Layer:
    """A contraction with a constant array: y = lax.dot_general(x, rhs) or lax.dot_general(lhs, x).

    With the constant R on one side the layer is linear in x and leaves the channel axis alone:
    y[o] = sum_a R[o, a] x[a] over the contracted axes a (dot_general batch axes shared elementwise). Its kernel
    contracts R on both sides of the input covariance, each copy with its own side of every kernel axis pair:
    K'(o, o') = sum_{a, a'} R[o, a] R[o', a'] K(a, a'). The output's axes are ordered as lax.dot_general
    orders them (batch dimensions, then the free axes of the left operand, then of the right), and the kernel
    keeps the canonical layout: the input's batch axis first, the other axes in that order, channels last.

    Args:
        lhs: the constant left operand, or ``None`` when the inputs are the left operand.
        rhs: the constant right operand, or ``None`` when the inputs are the right operand. With both ``None``
            the layer is the identity.
        dimension_numbers: ``((lhs_contracting_dims, rhs_contracting_dims), (lhs_batch_dims, rhs_batch_dims))``
            as in `jax.lax.dot_general`; a scalar constant with the default () multiplies the inputs.
        precision: `jax.lax.Precision` of the finite contraction (``None``: the backend's default).
        batch_axis: the batch axis of the finite inputs (default 0); it may be a dot_general batch dimension
            (then the constant's matching axis has one entry per point and x1, x2 need that many points).
        channel_axis: the channel axis of the finite inputs (default -1); it may not be contracted or batched.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters.

    Raises:
        ValueError: if both ``lhs`` and ``rhs`` are given or ``dimension_numbers`` is malformed; when called, if
            the shapes do not fit the contraction; when the kernel is computed, if the channel axis is
            contracted or batched.
        NotImplementedError: when the kernel is computed with the batch axis contracted (that mixes the points,
            and kernels keep the variances of single points).
        TypeError: if an axis is not an integer.
    """
    layer = "DotGeneral(lhs)" if lhs is not None else "DotGeneral(rhs)" if rhs is not None else "DotGeneral()"
    if lhs is not None and rhs is not None:
        raise ValueError(f"{layer}: give at most one of lhs and rhs (the inputs are the other operand)")
    layout = (_check_axis(batch_axis, "batch_axis", layer), _check_axis(channel_axis, "channel_axis", layer))
    dn = _dimension_numbers(dimension_numbers, layer)
    is_lhs = lhs is not None
    other = None if lhs is None and rhs is None else jnp.asarray(lhs if is_lhs else rhs)
    if is_lhs:
        other_cs, in_cs, other_bs, in_bs = dn
    else:
        in_cs, other_cs, in_bs, other_bs = dn

    def dot(x):
        if other is None:
            return x
        args = (other.astype(x.dtype), x) if is_lhs else (x, other.astype(x.dtype))
        return lax.dot_general(*args, (dn[:2], dn[2:]), precision=precision)

    def shape_fn(in_shape):
        in_shape = _single_shape(in_shape, layer)
        _resolve_axes(layout, len(in_shape), layer, in_shape)
        try:
            out = jax.eval_shape(dot, jax.ShapeDtypeStruct(in_shape, jnp.float32))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{layer}: inputs of shape {in_shape} do not fit the contraction with a constant of "
                             f"shape {tuple(other.shape)} and dimension_numbers {dimension_numbers!r}: {e}") from None
        return tuple(out.shape)

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        return dot(x)

    def plan(ndim: int, shown):
        """Where each output axis comes from: ('in', input axis) or ('other', constant axis), in y's order."""
        b, c = _resolve_axes(layout, ndim, layer, shown)
        n_other = other.ndim
        ics = [a % ndim for a in in_cs]
        ibs = [a % ndim for a in in_bs]
        ocs = [a % n_other for a in other_cs] if n_other else list(other_cs)
        obs = [a % n_other for a in other_bs] if n_other else list(other_bs)
        if c in ics or c in ibs:
            raise ValueError(f"{layer}: the channel axis {c} cannot be a contracting or batch dimension (it is "
                             f"infinitely wide in the kernel)")
        if b in ics:
            # ValueError, as neural-tangents for kernels of single-point variances (diagonal_batch=True, the only
            # kind smnngp carries)
            raise ValueError(f"{layer}: contracting the batch axis {b} mixes the points, which the kernel cannot "
                             f"follow (it keeps single-point variances, diagonal_batch=True)")
        in_free = [("in", a) for a in range(ndim) if a not in ics + ibs]
        other_free = [("other", j) for j in range(n_other) if j not in ocs + obs]
        order = [("in", a) for a in ibs] + (other_free + in_free if is_lhs else in_free + other_free)
        partner = dict(zip(obs + ocs, ibs + ics))  # constant axis -> input axis it meets
        return b, c, order, partner

    def kernel_map(k: Kernel) -> Kernel:
        if other is None:
            return k
        ndim = len(k.shape1)
        user1 = _from_canonical_shape(k.shape1, layout)
        b, c, order, partner = plan(ndim, user1)
        spatial = [a for a in range(ndim) if a not in (b, c)]  # input axes in canonical order
        letters = iter(string.ascii_letters)
        const = other.astype(k.nngp.dtype)

        def op(mat, batch_ndim):
            # Left / right letters of every input axis and every free constant axis.
            sides = {("in", b): (next(letters),) * 1}
            sides[("in", b)] += (next(letters),) if batch_ndim == 2 else sides[("in", b)]
            for a in spatial:
                left = next(letters)
                sides[("in", a)] = (left, next(letters) if k.full else left)
            for j in range(other.ndim):
                if j not in partner:
                    left = next(letters)
                    sides[("other", j)] = (left, next(letters) if k.full else left)
            mat_sub = "".join(sides[("in", b)][:batch_ndim])
            for a in spatial:
                mat_sub += "".join(sides[("in", a)][: 2 if k.full else 1])

            def const_sub(side):
                return "".join(sides[("in", partner[j])][side] if j in partner else sides[("other", j)][side]
                               for j in range(other.ndim))

            out = [ax for ax in order if ax != ("in", c)]
            out.remove(("in", b))
            out_sub = "".join(sides[("in", b)][:batch_ndim])
            for ax in out:
                out_sub += "".join(sides[ax][: 2 if k.full else 1])
            return jnp.einsum(f"{const_sub(0)},{mat_sub},{const_sub(1)}->{out_sub}", const, mat, const,
                              precision=lax.Precision.HIGHEST)

        def out_shape(s):
            user = _from_canonical_shape(s, layout)
            y = jax.eval_shape(dot, jax.ShapeDtypeStruct(user, jnp.float32)).shape
            return canonical_shape(y, (order.index(("in", b)), order.index(("in", c))))

        return _map_all(k, op, shape1=out_shape(k.shape1), shape2=out_shape(k.shape2))

    def finite_mask_fn(mask, in_shape):
        """Output mask in the finite layout: an output entry is masked when every input entry it sums is (the
        masked entries enter as zeros); the constant's free axes do not depend on the mask."""
        if other is None:
            return mask
        # Broadcast over every axis but the channel axis, whose size the mask keeps (1 for whole positions).
        c = _resolve_axes(layout, len(in_shape), layer, in_shape)[1]
        target = tuple(mask.shape[c] if i == c and mask.ndim == len(in_shape) else n for i, n in enumerate(in_shape))
        valid = (~jnp.broadcast_to(mask, target)).astype(jnp.float32)
        ones = jnp.ones(other.shape, jnp.float32)
        count = lax.dot_general(*((ones, valid) if is_lhs else (valid, ones)), (dn[:2], dn[2:]))
        return count == 0

    def mask_fn(mask, in_shape):
        """The same in the canonical layout (input and output batch first, channels last)."""
        if other is None:
            return mask
        user_shape = _from_canonical_shape(in_shape, layout)
        _, _, order, _ = plan(len(user_shape), user_shape)
        b, c = _resolve_axes(layout, len(user_shape), layer, user_shape)
        user_mask = _from_canonical(jnp.broadcast_to(mask, in_shape[:-1] + mask.shape[-1:]), layout)
        out = finite_mask_fn(user_mask, user_shape)
        return to_canonical(out, (order.index(("in", b)), order.index(("in", c))))

    # Contracting a spatial axis needs the covariances of all pairs of its positions.
    mixes = other is not None and any(a != batch_axis for a in in_cs)
    rule = masking.MaskRule(mask_fn, finite_fn=finite_mask_fn)
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full or mixes, layout=layout,
                 masking=rule, means=_flow.ZERO_PRESERVING)
