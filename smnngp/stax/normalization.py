"""Normalisation and noise layers: `LayerNorm`, `Dropout` (finite network, NNGP and NTK).

Both act position-wise on the kernel: an entry k(x_a, h; x_b, h') of the NNGP or NTK (points a, b;
positions h, h') is multiplied by a factor that depends on the variances of its two ends only, so both
layers work with the covariances of all position pairs (``full=True``) and with same-position ones.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import Layer, _fmt, _single_shape, _spatial_diagonal

__all__ = ["LayerNorm", "Dropout"]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _centred(k: Kernel, var_axes: tuple) -> Kernel:
    """The kernel of z - mu for activations z with non-zero means m (after an activation): mu is the average of
    z over the normalised axes, which converges to the average mbar of m over the normalised positions, so
    E[(z - mbar)(z' - mbar')] = K - mbar m' - m mbar' + mbar mbar' (with the channels alone, mbar = m:
    K - m m'). The means come from the kernel's flow (`smnngp.stax._flow`); the gradient of mu is negligible in the
    limit, so the NTK is unchanged."""
    flow = _flow.of(k)
    if flow.status == "unknown" or _flow.has_masks(k) or 0 in var_axes:
        why = ("masked inputs" if _flow.has_masks(k) else "a normalisation over the batch" if 0 in var_axes
               else f"an input whose mean is unknown ({flow.why})")
        raise NotImplementedError(
            f"LayerNorm: the infinite-width kernel of activations with non-zero means is computed from those means; "
            f"not for {why}. Put an affine layer (Dense, Conv) right before LayerNorm")
    if flow.status == "zero":
        return k
    m1, m2 = _flow._sides(flow)

    def bar(m):
        return jnp.broadcast_to(jnp.mean(m, axis=var_axes, keepdims=True), m.shape) if var_axes else m

    b1, b2 = bar(m1), bar(m2)
    prod = _flow._products

    def centre(mat, a1, a2, c1, c2, pairs):
        return mat - prod(a1, c2, k, pairs) - prod(c1, a2, k, pairs) + prod(a1, a2, k, pairs)

    return k.replace(nngp=centre(k.nngp, b1, b2, m1, m2, True), cov1=centre(k.cov1, b1, b1, m1, m1, False),
                     cov2=None if k.cov2 is None else centre(k.cov2, b2, b2, m2, m2, False))


def _same_position(mat, batch_ndim: int, full: bool):
    """Same-position entries of a batch-diagonal covariance: (N, H, H', W, W') -> (N, H, W) when ``full``."""
    return _spatial_diagonal(mat, batch_ndim) if full else mat


def _spread(v, first: bool, n_batch_axes: int, batch_slot: int, full: bool):
    """Reshape same-position variances (N, H, W) to broadcast against a kernel.

    The kernel has ``n_batch_axes`` leading batch axes (2 for nngp/ntk, 1 for cov1/cov2); ``v``'s batch
    axis goes to ``batch_slot``. With ``full`` every spatial size is placed on the first (``first``) or the
    second axis of its interleaved position pair, so that the product of a ``first`` and a second factor is
    the outer product over positions; otherwise the spatial axes are shared.
    """
    shape = [1] * n_batch_axes
    shape[batch_slot] = v.shape[0]
    for size in v.shape[1:]:
        shape += ([size, 1] if first else [1, size]) if full else [size]
    return v.reshape(shape)


def _diagonal_scale(shape, n_batch_axes: int, full: bool, factor):
    """``factor`` on the entries whose two ends are the same point and position, 1 elsewhere.

    ``shape`` is that of a kernel with ``n_batch_axes`` batch axes (2: the pairs (a, b) of nngp, whose
    ends coincide when a == b; 1: cov1, whose ends are the same point). With ``full`` the spatial axes come
    in pairs (h, h') that must coincide; otherwise every entry is a same-position one.
    """
    # Index comparisons, not a constant: an N x N mask built in numpy became an 8 MB constant of the program
    # (compiled into it and read from memory on every call).
    pairs = ([(0, 1)] if n_batch_axes == 2 else []) + (
        [(i, i + 1) for i in range(n_batch_axes, len(shape), 2)] if full else [])
    if not pairs:
        return jnp.asarray(factor)
    mask = None
    for i, j in pairs:
        same = lax.broadcasted_iota(jnp.int32, shape, i) == lax.broadcasted_iota(jnp.int32, shape, j)
        mask = same if mask is None else mask & same
    return jnp.where(mask, factor, 1.0)


# ---------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------


def LayerNorm(axis=-1, eps: float = 1e-12, batch_axis: int = 0, channel_axis: int = -1) -> Layer:
    """Layer normalisation over ``axis``: y = (x - mean_A x) / sqrt(eps + var_A x), A the axes in ``axis``.

    Infinite-width kernel (channels infinite). Normalising over the channels (which ``axis`` must include)
    of zero-mean Gaussian pre-activations removes a mean that vanishes in the limit and divides by the
    channel average of x^2, which converges to the variance q(x, p) = cov(x, p; x, p) at each point x and
    position p. With the other normalised axes A' (spatial ones, or the batch) the divisor is the mean of
    q over A', written qbar(x, p) (constant along A'). For every pair of ends (x, p), (y, p'):

        K'(x, p; y, p')   = K(x, p; y, p')   / sqrt((eps + qbar(x, p)) (eps + qbar(y, p'))),
        NTK'(x, p; y, p') = NTK(x, p; y, p') / sqrt((eps + qbar(x, p)) (eps + qbar(y, p'))),

    and the same for the variances cov1, cov2 (ends of the same point). Only same-position variances enter
    the factor, so the map works both with all position pairs and with same-position covariances.

    Args:
        axis: axis or axes normalised over, in the layout given by ``batch_axis`` / ``channel_axis``
            (an int or a sequence of ints; negative values count from the end). Must include the channel axis
            for ``kernel_fn``; may include spatial axes and the batch axis.
        eps: non-negative constant added to the variance (a number; may be traced).
        batch_axis: batch axis of the finite activations (default 0).
        channel_axis: channel axis of the finite activations (default -1).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters that keeps the shape of its input.

    Raises:
        ValueError: if an axis is out of range or repeated, ``eps`` is negative or not finite, or (in
            ``kernel_fn``) ``axis`` does not include the channel axis.
        TypeError: if ``axis`` is not an int or a sequence of ints, or ``eps`` is not a number.
        NotImplementedError: in ``kernel_fn``, when the input of the layer is not Gaussian (no affine layer
            right before it): the mean over channels then does not vanish.
    """
    axes = (axis,) if isinstance(axis, (int, np.integer)) else axis
    try:
        axes = tuple(axes)
    except TypeError:
        raise TypeError(f"LayerNorm: axis must be an int or a sequence of ints, got {axis!r}") from None
    if not axes or not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        raise TypeError(f"LayerNorm: axis must be an int or a non-empty sequence of ints, got {axis!r}")
    axes = tuple(int(a) for a in axes)
    for name, value in (("batch_axis", batch_axis), ("channel_axis", channel_axis)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"LayerNorm: {name} must be an int, got {value!r}")
    layer = f"LayerNorm(axis={axis}, eps={_fmt(eps)})"
    if not isinstance(eps, jax.core.Tracer):
        if not isinstance(eps, numbers.Real):
            raise TypeError(f"{layer}: eps must be a number, got {type(eps).__name__}")
        if not (math.isfinite(float(eps)) and float(eps) >= 0):
            raise ValueError(f"{layer}: eps must be non-negative and finite, got {eps}")
        eps = float(eps)

    def resolve(ndim: int):
        """(batch, channel, normalised axes) of activations of rank ``ndim``, in the layer's layout."""
        b, c = batch_axis % ndim, channel_axis % ndim
        if not (-ndim <= batch_axis < ndim and -ndim <= channel_axis < ndim) or b == c:
            raise ValueError(f"{layer}: batch_axis={batch_axis} and channel_axis={channel_axis} must be two "
                             f"distinct axes of activations of rank {ndim}")
        if any(not -ndim <= a < ndim for a in axes):
            raise ValueError(f"{layer}: axis {axis} is out of range for activations of rank {ndim}")
        norm = sorted({a % ndim for a in axes})
        if len(norm) != len(axes):
            raise ValueError(f"{layer}: axis {axis} names an axis twice")
        return b, c, norm

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        resolve(len(shape))
        return shape

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, mask=None, **kwargs):
        _, _, norm = resolve(x.ndim)
        # With a mask, mean and variance divide by the number of unmasked entries (as neural-tangents does,
        # the variance's sum still runs over every entry).
        mean = masking.masked_mean(x, mask, tuple(norm), keepdims=True)
        var = masking.masked_mean(jnp.square(x - mean), mask, tuple(norm), keepdims=True)
        return (x - mean) / jnp.sqrt(eps + var)

    def kernel_map(k: Kernel) -> Kernel:
        ndim = len(k.shape1)
        b, c, norm = resolve(ndim)
        if c not in norm:
            raise ValueError(
                f"{layer}: kernel_fn needs the channel axis ({channel_axis}) among the normalised axes, got "
                f"axis={axis}: only the average over infinitely many channels converges"
            )
        spatial = [i for i in range(ndim) if i not in (b, c)]
        # Axes of the same-position variances (N, *spatial) that are averaged: 0 for the batch, 1 + i for the
        # i-th spatial axis (kernels hold the spatial axes in the order of the finite layout).
        var_axes = tuple(([0] if b in norm else []) + [1 + spatial.index(i) for i in norm if i in spatial])
        if not k.is_gaussian:
            k = _centred(k, var_axes)

        m1, m2 = masking.kernel_masks(k, layer) if masking.has_masks(k) else (None, None)

        def normaliser(cov, m):
            v = _same_position(cov, 1, k.full)
            if var_axes and m is not None:  # the mean of eps + q over unmasked positions
                return masking.masked_mean(eps + v, m, var_axes, keepdims=True)
            if var_axes:
                v = jnp.mean(v, axis=var_axes, keepdims=True)
            return eps + v

        q1 = normaliser(k.cov1, m1)
        q2 = q1 if k.cov2 is None else normaliser(k.cov2, m2)

        # One inverse square root per point and position, multiplied in pairs: mat / sqrt(q q') as an array
        # of pairs would take a square root per entry (an array of its own that every covariance reads).
        r1 = 1 / jnp.sqrt(q1)
        r2 = r1 if k.cov2 is None else 1 / jnp.sqrt(q2)

        def cross(mat):
            if mat is None or mat.ndim == 0:
                return mat
            return mat * (_spread(r1, True, 2, 0, k.full) * _spread(r2, False, 2, 1, k.full))

        def own(mat, r):
            return mat * (_spread(r, True, 1, 0, k.full) * _spread(r, False, 1, 0, k.full))

        return k.replace(
            nngp=cross(k.nngp),
            ntk=cross(k.ntk),
            cov1=own(k.cov1, r1),
            cov2=None if k.cov2 is None else own(k.cov2, r2),
        )

    def means(flow, k_in, out, name):
        # centred over the channels alone, every channel has mean zero; over positions too, each position keeps
        # its offset from the positions' average
        ndim = len(k_in.shape1)
        b, c, norm = resolve(ndim)
        if set(norm) == {c}:
            return _flow.Flow("zero", labels=flow.labels)
        return _flow.ZERO_PRESERVING(flow, k_in, out, name)

    # Normalising over the batch couples the points of a batch: the kernel of a tile is not a block of the
    # kernel of the whole batch, so the symmetric tiling of x2=None kernels must stay off (symmetric=False).
    symmetric = not any(
        (batch_axis % nd) in {a % nd for a in axes}
        for nd in range(2, 9)
        if -nd <= batch_axis < nd and all(-nd <= a < nd for a in axes)
    )
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full, symmetric,
                 (batch_axis, channel_axis), masking.MaskRule(wants_mask=True), means=means)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


def Dropout(rate, mode: str = "train") -> Layer:
    """Dropout with keep probability ``rate``: y = m x / rate, m ~ Bernoulli(rate) per entry (``'train'``).

    ``rate`` is the probability of KEEPING an entry (neural-tangents' convention; ``rate=1`` keeps all).
    In ``'test'`` mode the layer is the identity, in the finite network and in the kernel.

    Infinite-width kernel in ``'train'`` mode. The masks are independent across points, positions and
    channels, and E[m^2] / rate^2 = 1 / rate while E[m m'] / rate^2 = 1 for independent masks. An entry of
    a kernel whose two ends are one and the same activation (same point of the same batch, same position)
    is therefore multiplied by 1 / rate, every other entry is unchanged:

        cov'(x, p; x, p')  = cov(x, p; x, p') (1 / rate if p = p' else 1),
        K'(x_a, p; x_b, p') = K(x_a, p; x_b, p') (1 / rate if x1 is x2, a = b and p = p' else 1),

    and the same for the NTK. "x1 is x2" means ``kernel_fn`` was called with ``x2=None`` (the `Kernel`'s
    ``cov2`` is ``None``): with a separate ``x2`` the two batches are different draws and no entry of K is
    one activation with itself. The output is no longer Gaussian.

    Args:
        rate: keep probability, in (0, 1] (a number; may be traced, then unchecked).
        mode: ``'train'`` (default) or ``'test'``.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters that keeps the shape of its input;
        in ``'train'`` mode its ``apply_fn(params, x, rng=key)`` needs a PRNG key.

    Raises:
        ValueError: if ``mode`` is neither ``'train'`` nor ``'test'`` or a concrete ``rate`` is not in
            (0, 1]; from ``apply_fn`` in ``'train'`` mode when no ``rng`` is given.
        TypeError: if ``rate`` is not a number.
    """
    if mode not in ("train", "test"):
        raise ValueError(f"Dropout: mode must be 'train' or 'test', got {mode!r}")
    layer = f"Dropout({_fmt(rate)}, mode={mode!r})"
    if not isinstance(rate, jax.core.Tracer):
        if not isinstance(rate, numbers.Real) or isinstance(rate, bool):
            raise TypeError(f"{layer}: rate must be a number, got {type(rate).__name__}")
        if not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"{layer}: rate is the keep probability and must be in (0, 1], got {rate}")
        rate = float(rate)

    def shape_fn(shape):
        return _single_shape(shape, layer)

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, rng=None, **kwargs):
        if mode == "test":
            return x
        if rng is None:
            raise ValueError(
                f"{layer}: apply_fn needs a PRNG key in train mode: call apply_fn(params, x, rng=key) "
                f"(serial and parallel split it among their layers)"
            )
        keep = jax.random.bernoulli(rng, rate, x.shape)
        return jnp.where(keep, x / rate, jnp.zeros((), x.dtype))

    def kernel_map(k: Kernel) -> Kernel:
        if mode == "test":
            return k
        factor = 1.0 / rate

        def own(mat):
            if mat is None:
                return None
            if not k.full or k.spatial_ndim == 0:
                return mat * factor
            return mat * _diagonal_scale(mat.shape, 1, True, factor).astype(mat.dtype)

        def cross(mat):
            if mat is None or mat.ndim == 0 or k.cov2 is not None:
                return mat
            return mat * _diagonal_scale(mat.shape, 2, k.full, factor).astype(mat.dtype)

        return k.replace(nngp=cross(k.nngp), ntk=cross(k.ntk), cov1=own(k.cov1), cov2=own(k.cov2),
                         is_gaussian=False)

    # In train mode a diagonal block of an x2=None kernel is not the kernel of a tile with a copy of itself
    # (that is a second draw of the masks), so the symmetric tiling of x2=None kernels must stay off.
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full, mode == "test",
                 masking=masking.MaskRule(), means=_flow.PASS)
