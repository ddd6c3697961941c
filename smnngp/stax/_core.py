"""The `Layer` type, the public ``kernel_fn`` and the helpers every layer family shares.

Input validation, the input kernel (second moments of the inputs), the symmetric tiling of ``x2=None``
kernels, scale checks, and the spatial window sums used by convolutions and pooling.
"""

from __future__ import annotations

import enum
import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp._checks import check_finite
from smnngp.kernels import KERNEL_FIELDS, Kernel, canonical_get, select
from smnngp.stax import masking as _masking

_PADDINGS = ("SAME", "VALID", "CIRCULAR")


class Padding(enum.Enum):
    """Padding of convolutions and pooling; a member or its name (any case) may be passed as ``padding=``.

    ``CIRCULAR`` wraps around (periodic boundary); ``SAME`` and ``VALID`` are XLA's zero paddings.
    """

    CIRCULAR = "CIRCULAR"
    SAME = "SAME"
    VALID = "VALID"


def padding_name(padding) -> str:
    """``padding`` (a `Padding` member or a string) as one of 'SAME', 'VALID', 'CIRCULAR' (not validated)."""
    return str(getattr(padding, "name", padding)).upper()


class Layer(tuple):
    """``(init_fn, apply_fn, kernel_fn)`` with the internals combinators need.

    Attributes (internal): ``name``; ``shape_fn(input_shape) -> output_shape``
    (raises ValueError naming the layer on incompatible shapes); ``kernel_map``
    (``kernel_map(k, **kwargs)``: Kernel -> Kernel, lists for branches; the
    keyword arguments are those a caller passes to ``kernel_fn`` beyond
    ``x1, x2, get``, such as ``pattern``, and combinators hand them to every
    child); ``needs_full(out_full) -> bool``, whether the layer's input kernel
    must track all position pairs given whether its output must;
    ``symmetric``, whether k(x2, x1) is exactly k(x1, x2) with its points
    swapped (false for quadrature, whose rule is not symmetric); ``layout``,
    ``(batch_axis, channel_axis)`` of the finite activations the layer takes,
    or ``None`` when the layer works in any layout; ``masking``, how the layer
    treats masked inputs (``mask_constant``): a `smnngp.stax.masking.MaskRule`,
    ``masking.COMPOSITE`` for layers whose children treat them, or ``None`` when
    the layer rejects masked inputs with an error naming it.

    Kernels are always held in the canonical layout (batch axis first,
    channels last, the remaining axes in their order in between), and so are
    ``Kernel.shape1`` / ``shape2``; the public ``kernel_fn`` moves the axes of
    its inputs there according to the ``layout`` of the first layer that has
    one. A layer with a ``layout`` reads its finite shapes in that layout in
    ``shape_fn``, ``init_fn`` and ``apply_fn``, and canonical shapes in
    ``kernel_map``.
    """

    def __new__(cls, name, init_fn, apply_fn, shape_fn, kernel_map, needs_full, symmetric=True, layout=None,
                masking=None, means=None):
        if not _accepts_kwargs(kernel_map):
            kernel_map = _ignore_kwargs(kernel_map)
        if layout is not None:
            layout = (int(layout[0]), int(layout[1]))
        kernel_map = _masked_kernel_map(name, kernel_map, masking, layout)
        kernel_map = _flow_kernel_map(name, kernel_map, means, apply_fn, layout)
        apply_fn = _masked_apply(name, apply_fn, masking, layout)
        public_kernel_fn = _make_public_kernel_fn(name, shape_fn, kernel_map, needs_full, symmetric, layout)
        # As in neural-tangents, the three functions carry the layer's name ('Conv' for Conv(8, (3, 3))): programs
        # (nt's own tests among them) tell layers apart by ``init_fn.__name__``.
        init_fn = _named(init_fn, _bare_name(name))
        for fn in (apply_fn, public_kernel_fn):
            fn.__name__ = _bare_name(name)
        self = super().__new__(cls, (init_fn, apply_fn, public_kernel_fn))
        self.masking = masking
        self.name = name
        self.shape_fn = shape_fn
        self.kernel_map = kernel_map
        self.needs_full = needs_full
        self.symmetric = symmetric
        self.layout = layout
        return self

    def __repr__(self) -> str:
        return f"<smnngp.stax layer {self.name}>"


def _flow_kernel_map(name, kernel_map, means, apply_fn, layout):
    """``kernel_map`` whose output carries the flow (first moments, shared sources: `smnngp.stax._flow`) that the
    layer's rule ``means`` makes of its input's: 'composite' for layers that handle flows themselves, 'linear'
    for a parameter-free map applied alike to every channel, a rule function, or ``None`` (mean unknown)."""
    from smnngp.stax import _flow

    if means == "composite":
        return kernel_map
    if means == "linear":
        rule = _flow.linear(apply_fn, layout)
    else:
        rule = _flow.UNKNOWN if means is None else means

    def kmap(k, **kwargs):
        out = kernel_map(k, **kwargs)
        return _flow.attach(out, rule(_flow.of(k), k, out, name))

    return kmap


def _bare_name(name: str) -> str:
    """'Conv' of a layer named 'Conv(8, (3, 3))'."""
    return name.split("(", 1)[0]


def _named(fn, name: str):
    """``fn`` with ``__name__ = name``: renamed in place when it is a closure of its own layer, wrapped when it is
    a module-level function that other layers share."""
    if "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        fn.__name__ = name
        return fn

    def named(*args, **kwargs):
        return fn(*args, **kwargs)

    named.__name__ = named.__qualname__ = name
    named.__doc__ = fn.__doc__
    return named


def _accepts_kwargs(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD for p in params)


def _ignore_kwargs(kernel_map):
    """A ``kernel_map(k)`` that takes no call-time keywords, as ``kernel_map(k, **kwargs)``."""

    def wrapped(k, **kwargs):
        return kernel_map(k)

    return wrapped


def _unsupported(name):
    return ValueError(f"{name}: masked inputs (mask_constant or a MaskedArray) are not supported by this layer")


def _masked_apply(name, apply_fn, rule, layout):
    """``apply_fn`` that also takes ``mask_constant=`` and `MaskedArray` inputs (see `smnngp.stax.masking`).

    Without either, the layer's own ``apply_fn`` runs unchanged. Otherwise the input is zeroed where masked,
    the layer runs (given ``mask=`` when it asks for it), and the output mask follows the layer's rule.
    """

    def apply(params, x, *, mask_constant=None, **kwargs):
        if rule == _masking.COMPOSITE:
            if mask_constant is not None:
                kwargs["mask_constant"] = mask_constant
            return apply_fn(params, x, **kwargs)
        if mask_constant is None and not _masking.is_masked_input(x):
            return apply_fn(params, x, **kwargs)
        values, masks = _masking.split_masked(x, mask_constant)
        if masks is None or (isinstance(masks, list) and all(m is None for m in masks)):
            return apply_fn(params, values, **kwargs)
        if rule is None:
            raise _unsupported(name)
        if rule.wants_mask:
            kwargs["mask"] = masks
        out = apply_fn(params, values, **kwargs)
        many = isinstance(values, list)
        shapes = [tuple(v.shape) for v in values] if many else tuple(values.shape)
        if rule.finite_fn is not None:
            return _masking.MaskedArray(out, rule.finite_fn(masks, shapes))
        if rule.fn is None:
            return _masking.MaskedArray(out, masks)
        if many:
            cmasks = [None if m is None else to_canonical(jnp.broadcast_to(m, s), layout)
                      for m, s in zip(masks, shapes)]
            cshapes = [canonical_shape(s, layout) for s in shapes]
        else:
            cmasks, cshapes = to_canonical(masks, layout), canonical_shape(shapes, layout)
        out_mask = rule.fn(cmasks, cshapes)
        return _masking.MaskedArray(out, _from_canonical(out_mask, rule.out_layout or layout))

    return apply


def _from_canonical(x, layout):
    """Inverse of `to_canonical`: move axes (0, -1) of ``x`` back to ``layout = (batch_axis, channel_axis)``."""
    if layout is None or x.ndim < 2:
        return x
    b, c = layout[0] % x.ndim, layout[1] % x.ndim
    if (b, c) == (0, x.ndim - 1):
        return x
    return jnp.moveaxis(x, (0, x.ndim - 1), (b, c))


def _masked_kernel_map(name, kernel_map, rule, layout):
    """``kernel_map`` that carries the kernel's masks through the layer (unchanged when the kernel has none)."""
    if rule == _masking.COMPOSITE:
        return kernel_map

    def kmap(k, **kwargs):
        if not _masking.has_masks(k):
            return kernel_map(k, **kwargs)
        if rule is None:
            raise _unsupported(name)
        many = isinstance(k, list)
        if rule.fn is None:
            m1, m2 = ([ki.mask1 for ki in k], [ki.mask2 for ki in k]) if many else (k.mask1, k.mask2)
        elif many:
            m1 = rule.fn([ki.mask1 for ki in k], [ki.shape1 for ki in k])
            m2 = (None if all(ki.mask2 is None for ki in k)
                  else rule.fn([ki.mask2 for ki in k], [ki.shape2 for ki in k]))
        else:
            m1 = None if k.mask1 is None else rule.fn(k.mask1, k.shape1)
            m2 = None if k.mask2 is None else rule.fn(k.mask2, k.shape2)
        out = kernel_map(k, **kwargs)
        if rule.remask:
            return _masking.remask_kernel(out, m1, m2, name)
        return out.replace(mask1=m1, mask2=m2)

    return kmap


def self_covariances(k: Kernel, nngp):
    """Each point's full covariance with itself read off ``nngp`` (the layer's new nngp computed from ``k``),
    or ``None`` where that does not apply.

    With ``cov2=None`` (the kernel of ``x1`` with itself) and full covariances over position pairs, each point's
    covariance with itself, (H, H', W, W', ...), is the nngp's entry (i, i): as many numbers per point as the nngp
    has per pair of points. Read off the new nngp, it is bit for bit the nngp's diagonal (which the arc-cosine
    kernels' square-root singularity at coincident points wants) and costs a strided slice instead of the
    layer's map a second time. The activations and `Aggregate` use it: a graph network of three `Aggregate` +
    `Relu` blocks traced in 0.028 s instead of 0.043 s and compiled 1,230 -> 902 instructions, 0.24 -> 0.20 s.
    Applied after every layer instead (affine ones included), the slices cut XLA's fusions apart and the same
    network's steady call took 0.011 s instead of 0.006 s.
    """
    if (k.cov2 is None and k.full and k.spatial_ndim > 0 and jnp.ndim(nngp) == jnp.ndim(k.cov1) + 1
            and nngp.shape[0] == nngp.shape[1] == k.cov1.shape[0]):
        return _batch_diagonal(nngp)
    return None


def first_layout(layers):
    """The ``layout`` of the first layer that has one (that of a composition's input), or ``None``."""
    for l in layers:
        if l.layout is not None:
            return l.layout
    return None


def to_canonical(x, layout):
    """Move ``layout = (batch_axis, channel_axis)`` of ``x`` to (0, -1); ``None`` leaves ``x`` as it is."""
    if layout is None or x.ndim < 2:
        return x
    b, c = layout[0] % x.ndim, layout[1] % x.ndim
    if b == c:
        raise ValueError(f"batch_axis and channel_axis must differ, both are axis {b} of shape {tuple(x.shape)}")
    if (b, c) == (0, x.ndim - 1):
        return x
    return jnp.moveaxis(x, (b, c), (0, x.ndim - 1))


def canonical_shape(shape, layout):
    """The shape ``to_canonical`` gives an array of ``shape``."""
    shape = tuple(shape)
    if layout is None or len(shape) < 2:
        return shape
    b, c = layout[0] % len(shape), layout[1] % len(shape)
    rest = [s for i, s in enumerate(shape) if i not in (b, c)]
    return (shape[b], *rest, shape[c])


def _as_layer(obj, where: str) -> Layer:
    if not isinstance(obj, Layer):
        raise TypeError(
            f"{where}: expected a layer built by smnngp.stax (an (init_fn, apply_fn, kernel_fn) "
            f"Layer), got {type(obj).__name__}"
        )
    return obj


# ---------------------------------------------------------------------------
# Input validation and the public kernel_fn
# ---------------------------------------------------------------------------


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_input(x, name: str):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"kernel_fn: {name} must be an array, got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(
            f"kernel_fn: {name} must have a batch axis and a feature axis, got shape {tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"kernel_fn: {name} must be floating point, got dtype {x.dtype}")
    if _is_concrete(x):
        check_finite(x, name, "kernel_fn")


def _input_kernel(x1, x2, full: bool, want_ntk: bool) -> Kernel:
    """Second moments of the inputs, averaged over the channel (last) axis."""
    n_chan = x1.shape[-1]
    spatial = x1.ndim - 2
    letters = "hwdefg"[:spatial]
    if spatial == 0:
        sub_pair, sub_self = "ac,bc->ab", "ac,ac->a"
    elif full:
        a_sp = letters
        b_sp = letters.upper()
        inter = "".join(l + u for l, u in zip(a_sp, b_sp))
        sub_pair = f"a{a_sp}c,b{b_sp}c->ab{inter}"
        sub_self = f"a{a_sp}c,a{b_sp}c->a{inter}"
    else:
        sub_pair = f"a{letters}c,b{letters}c->ab{letters}"
        sub_self = f"a{letters}c,a{letters}c->a{letters}"
    prec = lax.Precision.HIGHEST
    scale = 1.0 / n_chan
    x2_is_x1 = x2 is None
    xb = x1 if x2_is_x1 else x2
    nngp = jnp.einsum(sub_pair, x1, xb, precision=prec) * scale
    if x2_is_x1:
        # Take the batch diagonal of nngp itself so that k(x, x) and var(x) are the
        # same floating-point numbers: the arc-cosine kernels have a square-root
        # singularity at correlation 1, which would amplify a last-bit mismatch.
        cov1 = _batch_diagonal(nngp)
    else:
        cov1 = jnp.einsum(sub_self, x1, x1, precision=prec) * scale
    cov2 = None if x2_is_x1 else jnp.einsum(sub_self, x2, x2, precision=prec) * scale
    ntk = jnp.zeros((), x1.dtype) if want_ntk else None
    k = Kernel(nngp, ntk, cov1, cov2, shape1=x1.shape, shape2=xb.shape, full=full, is_gaussian=False)
    from smnngp.stax import _flow

    return _flow.attach(k, _flow.input_flow(x1, x2))


# With x2=None, a network whose output has no spatial axes (dense inputs, or spatial ones reduced by Flatten or
# GlobalAvgPool) and whose input kernel has at least _SYMMETRIC_MIN_ENTRIES entries (N^2 times the position pairs;
# 2^20 float64 entries are 8 MB, past the cache of a core)
# is evaluated tile pair by tile pair (`_symmetric_kernel_map`): T (T + 1) / 2 of the T^2 tiles, one after another
# in a `lax.map`, each small enough (_TILE_ENTRIES) that a layer's covariances stay in the processor's cache from
# one layer to the next. On 2 CPU cores the MLP-4 ReLU kernel of 2,000 points took 0.57 s untiled and 0.21 s in
# tiles of 256 points, a CNN-4 of 200 8x8 images 0.32 s and 0.21 s (the untiled path streams every N x N
# intermediate through memory, once per layer); below 2^20 entries the loop costs more than it saves.
_TILE_ENTRIES = 2**16
_SYMMETRIC_MIN_ENTRIES = 2**20
# An (x1, x2) kernel of as many entries is tiled too (`_cross_kernel_map`), in larger tiles: Myrtle-5's NNGP and NTK of
# 10 x 10 CIFAR-shaped images (1M position pairs per image pair) on this 2-core CPU took 2.99 / 7.48 s untiled,
# 4.39 / 4.90 s in tiles of one image, 3.15 / 4.16 in tiles of 2, 2.63 / 3.81 in tiles of 5 (issue 50;
# `python benchmarks/cross_tiles.py --sides 0 1 2 5` reruns the sweep, each setting checked against the untiled call).
_CROSS_TILES = True
_CROSS_TILE_ENTRIES = 2**25  # tiles of 5 such images


def _tile_count(n_points: int, per_pair: int, target: int | None = None) -> int:
    """How many tiles the points are cut into so that one tile pair has about ``target`` (default _TILE_ENTRIES)
    entries."""
    target = _TILE_ENTRIES if target is None else target
    side = max(1, math.isqrt(max(1, target // max(per_pair, 1))))
    return max(1, -(-n_points // side))


def _batch_diagonal(mat):
    """(N, N, ...) -> (N, ...): the entries k(x_i, x_i), as every (N + 1)-th row of the flattened pairs.

    A strided slice rather than `jnp.diagonal`, whose gather XLA:CPU compiles into a kernel of its own.
    """
    n = mat.shape[0]
    return mat.reshape((n * n,) + mat.shape[2:])[:: n + 1]


def _swap_points(tiles, full: bool):
    """k(a, b) -> k(b, a) for stacked tiles (P, n, n, spatial...), position pairs included."""
    rest = list(range(3, tiles.ndim))
    if full:  # (H, H', W, W', ...) -> (H', H, W', W, ...)
        rest = [ax for i in range(0, len(rest), 2) for ax in (rest[i + 1], rest[i])]
    return jnp.transpose(tiles, [0, 2, 1] + rest)


def _point_tiles(x, tiles: int):
    """``x`` (N, ...) as ``tiles`` tiles of n points, (tiles, n, ...), the last padded with copies of the last point
    (their rows are cut off when the tiles are assembled); and n."""
    n = -(-x.shape[0] // tiles)
    if tiles * n > x.shape[0]:
        x = jnp.concatenate([x, jnp.repeat(x[-1:], tiles * n - x.shape[0], axis=0)])
    return x.reshape((tiles, n) + x.shape[1:]), n


def _tile_pair_fn(kernel_map, at, bt, var_a, var_b, full: bool, want_ntk: bool):
    """The kernel of tile ``r`` of ``at`` against tile ``c`` of ``bt``, given each tile's variances (read off its
    own diagonal, so that they are the same floating-point numbers as on the untiled path)."""
    from smnngp.stax import _flow

    shape_a, shape_b = at.shape[1:], bt.shape[1:]
    ntk = jnp.zeros((), at.dtype) if want_ntk else None

    def tile_pair(args):
        r, c = args
        k0 = _input_kernel(at[r], bt[c], full, False)
        k0 = _flow.attach(Kernel(k0.nngp, ntk, var_a[r], var_b[c], shape1=shape_a, shape2=shape_b, full=full,
                                 is_gaussian=False), _flow.input_flow(at[r], bt[c]))
        return _flow.strip(kernel_map(k0))

    return tile_pair


def _tile_variances(xt, full: bool):
    return jax.vmap(lambda a: _batch_diagonal(_input_kernel(a, a, full, False).nngp))(xt)


def _grid(t, source, rows: int, cols: int, n_rows: int, n_cols: int):
    """Tiles (P, n, m, spatial...) picked by ``source`` (T1, T2) into the (n_rows, n_cols, spatial...) kernel."""
    grid = t[source]  # (T1, T2, n, m, spatial...)
    grid = jnp.moveaxis(grid, 2, 1).reshape((rows * grid.shape[2], cols * grid.shape[3]) + grid.shape[4:])
    return grid[:n_rows, :n_cols]


def _symmetric_kernel_map(kernel_map, x, full: bool, want_ntk: bool, tiles: int):
    """``kernel_map`` of the input kernel of (x, x), computed on T (T + 1) / 2 of the T^2 tiles.

    k(x_j, x_i) is k(x_i, x_j) with its two points swapped, so the tiles below the
    block diagonal are mirrored from those above: (T + 1) / (2 T) of the work. The
    tile pairs run one after another (`jax.lax.map`), so that each pair's covariances
    stay in cache through all the layers; each pair gets the variances of its two
    tiles, and every point's variance is read off its own diagonal tile, so that
    k(x, x) and var(x) are the same floating-point numbers as on the untiled path.
    """
    n_points = x.shape[0]
    xt, n = _point_tiles(x, tiles)
    rows, cols = np.triu_indices(tiles)
    pair = {(int(i), int(j)): p for p, (i, j) in enumerate(zip(rows, cols))}
    on_diag = np.array([pair[i, i] for i in range(tiles)])
    var = _tile_variances(xt, full)
    tile_pair = _tile_pair_fn(kernel_map, xt, xt, var, var, full, want_ntk)
    out = jax.lax.map(tile_pair, (jnp.asarray(rows), jnp.asarray(cols)))
    # Tile (r, c) of the result is pair (r, c) for r <= c and pair (c, r) swapped below the
    # diagonal: one gather from [pairs, swapped off-diagonal pairs] reads each entry once.
    off_diag = np.flatnonzero(rows < cols)
    swapped = {(int(cols[p]), int(rows[p])): len(rows) + q for q, p in enumerate(off_diag)}
    source = np.array([[pair[r, c] if r <= c else swapped[r, c] for c in range(tiles)] for r in range(tiles)])

    def mirror(t, full):
        if t.ndim == 1:  # the same constant for every tile (an NTK that no layer has touched)
            return t[0]
        both = jnp.concatenate([t, _swap_points(t[off_diag], full)])
        return _grid(both, source, tiles, tiles, n_points, n_points)

    def assemble(k: Kernel) -> Kernel:
        cov1 = k.cov1[on_diag]
        return k.replace(
            nngp=mirror(k.nngp, k.full),
            ntk=None if k.ntk is None else mirror(k.ntk, k.full),
            cov1=cov1.reshape((tiles * n,) + cov1.shape[2:])[:n_points],
            cov2=None,
            x1_is_x2=True,
            shape1=(n_points,) + k.shape1[1:],
            shape2=(n_points,) + k.shape2[1:],
        )

    return [assemble(k) for k in out] if isinstance(out, list) else assemble(out)


def _cross_kernel_map(kernel_map, a, b, full: bool, want_ntk: bool, tiles_a: int, tiles_b: int):
    """``kernel_map`` of the input kernel of (a, b), computed tile pair by tile pair (`jax.lax.map` over all
    T_a T_b pairs, as `_symmetric_kernel_map` does over the upper triangle): a large (a, b) kernel's intermediates
    stay one tile pair in size instead of streaming N_a N_b entries through memory at every layer (Myrtle-5's NNGP
    and NTK of 10 x 10 CIFAR-shaped images: issue 50)."""
    na_points, nb_points = a.shape[0], b.shape[0]
    at, na = _point_tiles(a, tiles_a)
    bt, nb = _point_tiles(b, tiles_b)
    rows, cols = (x.reshape(-1) for x in np.indices((tiles_a, tiles_b)))
    tile_pair = _tile_pair_fn(kernel_map, at, bt, _tile_variances(at, full), _tile_variances(bt, full), full,
                              want_ntk)
    out = jax.lax.map(tile_pair, (jnp.asarray(rows), jnp.asarray(cols)))
    source = np.arange(tiles_a * tiles_b).reshape(tiles_a, tiles_b)

    def assemble(k: Kernel) -> Kernel:
        cov1, cov2 = k.cov1[source[:, 0]], k.cov2[source[0, :]]

        def grid(t):
            return t[0] if t.ndim == 1 else _grid(t, source, tiles_a, tiles_b, na_points, nb_points)

        return k.replace(
            nngp=grid(k.nngp),
            ntk=None if k.ntk is None else grid(k.ntk),
            cov1=cov1.reshape((tiles_a * na,) + cov1.shape[2:])[:na_points],
            cov2=cov2.reshape((tiles_b * nb,) + cov2.shape[2:])[:nb_points],
            shape1=(na_points,) + k.shape1[1:],
            shape2=(nb_points,) + k.shape2[1:],
        )

    return [assemble(k) for k in out] if isinstance(out, list) else assemble(out)


def _check_input_layout(name: str, x1, batch_axis, channel_axis) -> None:
    """Refuse an input layout other than batch first, channels last (the arrays of ``x1``; Kernels carry theirs)."""
    for axis, label in ((batch_axis, "batch_axis"), (channel_axis, "channel_axis")):
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise TypeError(f"kernel_fn of {name}: {label} must be an int, got {axis!r}")
    arrays = [leaf for leaf in jax.tree_util.tree_leaves(x1, is_leaf=lambda t: isinstance(t, Kernel))
              if not isinstance(leaf, Kernel)]
    for a in arrays:
        ndim = jnp.ndim(a)
        if ndim < 2:
            continue  # the shape check names what is wrong
        if not (-ndim <= batch_axis < ndim and -ndim <= channel_axis < ndim):
            raise ValueError(f"kernel_fn of {name}: batch_axis {batch_axis} or channel_axis {channel_axis} is out "
                             f"of range for inputs of shape {tuple(jnp.shape(a))}")
        if batch_axis % ndim != 0 or channel_axis % ndim != ndim - 1:
            raise ValueError(
                f"kernel_fn of {name}: inputs must be batch first and channels last (batch_axis=0, "
                f"channel_axis=-1), got batch_axis={batch_axis}, channel_axis={channel_axis} for inputs of shape "
                f"{tuple(jnp.shape(a))}; move the axes with jnp.moveaxis"
            )


def _make_public_kernel_fn(name, shape_fn, kernel_map, needs_full, symmetric, layout):
    def kernel_fn(x1, x2=None, get=None, *, pattern=None, diagonal_batch=None, diagonal_spatial=None,
                  mask_constant=None, batch_axis=0, channel_axis=-1, **unused):
        """The infinite-width kernel of the layer (see `smnngp.stax`).

        ``diagonal_spatial=True`` returns the covariances of same positions only
        (nngp (N1, N2, H, W, ...) instead of (N1, N2, H, H', W, W', ...)) for
        outputs with spatial axes; ``diagonal_batch=False`` makes ``cov1`` (and
        ``cov2``) of a returned `Kernel` the full (N1, N1, ...) covariance of
        ``x1`` with itself, as neural-tangents' ``diagonal_batch=False``.
        ``pattern=(pattern1, pattern2)`` goes to graph layers (`Aggregate`).
        ``mask_constant=c`` masks the input entries equal to ``c`` (see
        `smnngp.stax.masking`); the returned `Kernel` keeps the masks.
        ``batch_axis`` and ``channel_axis`` (neural-tangents' keywords) name the
        input layout; smnngp takes inputs batch first and channels last, the only
        values accepted (move other layouts with ``jnp.moveaxis``).
        """
        if unused:
            raise TypeError(f"kernel_fn of {name}: unexpected keyword arguments {sorted(unused)}")
        names, _ = canonical_get(get, KERNEL_FIELDS)
        for flag, value in (("diagonal_batch", diagonal_batch), ("diagonal_spatial", diagonal_spatial)):
            if value is not None and not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"kernel_fn of {name}: {flag} must be True, False or None, got {value!r}")
        diag_spatial = bool(diagonal_spatial)
        layer_kwargs = {} if pattern is None else {"pattern": pattern}
        _check_input_layout(name, x1, batch_axis, channel_axis)
        if isinstance(x1, Kernel):
            k = _apply_to_kernel(name, kernel_map, needs_full, x1, x2, layer_kwargs)
            return _finish(k, get, names, diag_spatial, None)
        if isinstance(x1, list | tuple):
            leaves, tree = jax.tree_util.tree_flatten(x1, is_leaf=lambda t: isinstance(t, Kernel))
            if leaves and all(isinstance(k, Kernel) for k in leaves):  # Kernels of a leading (nested) parallel
                k = _apply_to_kernel(name, kernel_map, needs_full, _as_lists(tree, leaves), x2, layer_kwargs)
                return _finish(k, get, names, diag_spatial, None)
        many = isinstance(x1, list | tuple)  # one input per branch of a leading `parallel` (nested for nested ones)
        if many:
            leaves1, tree = jax.tree_util.tree_flatten(x1, is_leaf=_is_input_leaf)
            if x2 is None or not jax.tree_util.tree_leaves(x2):
                leaves2 = [None] * len(leaves1)
            else:
                leaves2, tree2 = jax.tree_util.tree_flatten(x2, is_leaf=_is_input_leaf)
                if tree2 != tree:
                    raise ValueError(f"kernel_fn of {name}: x1 and x2 must be nested lists of the same structure, "
                                     f"got {tree} and {tree2}")
            inputs = [_prepare_input(name, a, b, mask_constant, layout) for a, b in zip(leaves1, leaves2)]
            x1, x2, mask1, mask2 = ([inp[i] for inp in inputs] for i in range(4))
            x2 = None if all(b is None for b in x2) else x2
            mask1 = None if all(m is None for m in mask1) else mask1
            mask2 = None if all(m is None for m in mask2) else mask2
            out_shape = shape_fn(_as_lists(tree, [tuple(a.shape) for a in x1]))
        else:
            x1, x2, mask1, mask2 = _prepare_input(name, x1, x2, mask_constant, layout)
            out_shape = shape_fn(tuple(x1.shape))  # raises with the layer name on incompatible shapes
        out_shapes = out_shape if isinstance(out_shape, list) else [out_shape]
        out_spatial = any(len(s) > 2 for s in out_shapes)
        canon = functools.partial(_canonical_or_none, layout=layout)
        x1, x2, mask1, mask2 = (jax.tree_util.tree_map(canon, v, is_leaf=lambda t: t is None)
                                for v in (x1, x2, mask1, mask2))
        full = needs_full(out_spatial and not diag_spatial)
        want_ntk = names is None or "ntk" in names

        def evaluate(a, b, want_ntk, ma, mb):
            if many:
                none = [None] * len(a)
                ks = [_input_kernel(ai, bi, full and ai.ndim > 2, want_ntk) for ai, bi in zip(a, b or none)]
                ks = [k if mai is None else _keep_flow(k.replace(mask1=mai, mask2=mbi), k)
                      for k, mai, mbi in zip(ks, ma or none, mb or none)]
                return kernel_map(_as_lists(tree, ks), **layer_kwargs)
            full_here = full and a.ndim > 2
            n_points, entries = a.shape[0], a.shape[0] ** 2 * math.prod(a.shape[1:-1]) ** (2 if full_here else 1)
            tile = symmetric and b is None and not out_spatial and entries >= _SYMMETRIC_MIN_ENTRIES
            if tile and not layer_kwargs and ma is None:
                tiles = _tile_count(n_points, entries // n_points**2)
                if tiles > 1:
                    return _symmetric_kernel_map(kernel_map, a, full_here, want_ntk, tiles)
            if (symmetric and b is not None and not out_spatial and not layer_kwargs and ma is None and mb is None
                    and _CROSS_TILES):
                cross = b.shape[0] * entries // n_points
                if cross >= _SYMMETRIC_MIN_ENTRIES:
                    per_pair = entries // n_points**2
                    ta = _tile_count(n_points, per_pair, _CROSS_TILE_ENTRIES)
                    tb = _tile_count(b.shape[0], per_pair, _CROSS_TILE_ENTRIES)
                    if ta * tb > 1:
                        return _cross_kernel_map(kernel_map, a, b, full_here, want_ntk, ta, tb)
            k0 = _input_kernel(a, b, full_here, want_ntk)
            if ma is not None:
                k0 = _keep_flow(k0.replace(mask1=ma, mask2=mb), k0)
            return kernel_map(k0, **layer_kwargs)

        k = evaluate(x1, x2, want_ntk, mask1, mask2)
        batch_covs = None
        if diagonal_batch is False and names is None:
            if layer_kwargs:
                raise ValueError(f"kernel_fn of {name}: diagonal_batch=False is not available with a pattern")
            batch_covs = (evaluate(x1, None, False, mask1, None),
                          None if x2 is None else evaluate(x2, None, False, mask2, None))
            if many:
                raise NotImplementedError(f"kernel_fn of {name}: diagonal_batch=False with a list of inputs")
        return _finish(k, get, names, diag_spatial, batch_covs)

    return kernel_fn


def _keep_flow(k: Kernel, source: Kernel) -> Kernel:
    """``k`` with the flow of ``source`` (`Kernel.replace` builds a kernel without one)."""
    from smnngp.stax import _flow

    return _flow.attach(k, _flow.of(source))


def _prepare_input(name, x1, x2, mask_constant, layout):
    """Checked arrays ``x1``, ``x2`` (or None) and their masks (None without ``mask_constant``)."""
    mask1 = mask2 = None
    if mask_constant is not None:
        x1, mask1 = _masking.split_masked(jnp.asarray(x1), mask_constant)
        if x2 is not None:
            x2, mask2 = _masking.split_masked(jnp.asarray(x2), mask_constant)
    _check_input(x1, "x1")
    if x2 is not None:
        _check_input(x2, "x2")
        if canonical_shape(x1.shape, layout)[1:] != canonical_shape(x2.shape, layout)[1:]:
            raise ValueError(
                f"kernel_fn of {name}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must agree beyond the batch axis"
            )
        if x1.dtype != x2.dtype:
            raise TypeError(f"kernel_fn of {name}: x1 is {x1.dtype} but x2 is {x2.dtype}")
    return jnp.asarray(x1), None if x2 is None else jnp.asarray(x2), mask1, mask2


def _is_input_leaf(t) -> bool:
    return not isinstance(t, list | tuple)


def _as_lists(tree, leaves):
    """``leaves`` put back into ``tree``'s nesting as lists (what `parallel` takes)."""

    def to_list(t):  # the positions stand in for the leaves, which may be tuples themselves (shapes)
        return [to_list(u) for u in t] if isinstance(t, list | tuple) else leaves[t]

    return to_list(jax.tree_util.tree_unflatten(tree, range(len(leaves))))


def _canonical_or_none(x, layout):
    return None if x is None else to_canonical(x, layout)


def _finish(k, get, names, diag_spatial: bool, batch_covs):
    """Apply the output keywords (``diagonal_spatial``, ``diagonal_batch``) and select what ``get`` asks for."""
    if isinstance(k, list):
        covs = [None] * len(k) if batch_covs is None else list(zip(*[c if isinstance(c, list) else [c] * len(k)
                                                                     for c in batch_covs]))
        return [_finish(ki, get, names, diag_spatial, ci) for ki, ci in zip(k, covs)]
    from smnngp.stax import _flow

    k = _flow.strip(k)
    if names is not None and "ntk" in names and k.ntk is None:
        raise ValueError("kernel_fn: the NTK was asked for, but the input Kernel has none (compute it with "
                         "get=None or a get that includes 'ntk')")
    if diag_spatial and k.full and k.spatial_ndim > 0:
        k = _map_covs(k, _spatial_diagonal, lambda m, b: m if m.ndim <= b else _spatial_diagonal(m, b), full=False)
    if batch_covs is not None:
        k11, k22 = batch_covs
        if diag_spatial and k11.full and k11.spatial_ndim > 0:
            k11 = k11.replace(nngp=_spatial_diagonal(k11.nngp, 2))
            k22 = None if k22 is None else k22.replace(nngp=_spatial_diagonal(k22.nngp, 2))
        k = k.replace(cov1=k11.nngp, cov2=None if k22 is None else k22.nngp)
    return select(k, get)


def _apply_to_kernel(name, kernel_map, needs_full, k: Kernel, x2, layer_kwargs):
    """``kernel_fn(k)`` for a `Kernel` ``k`` (one that another ``kernel_fn`` returned), or a list of them for a
    leading `parallel`: compose the maps."""
    if x2 is not None:
        raise ValueError(f"kernel_fn of {name}: with a Kernel as first argument, x2 must be None (the Kernel "
                         f"already holds both inputs)")
    for ki in jax.tree_util.tree_leaves(k, is_leaf=lambda t: isinstance(t, Kernel)):
        _check_kernel_input(name, needs_full, ki)
    return kernel_map(k, **layer_kwargs)


def _check_kernel_input(name, needs_full, k: Kernel):
    expected = 1 + k.spatial_ndim * (2 if k.full else 1)
    if k.cov1 is not None and k.cov1.ndim != expected:
        raise ValueError(
            f"kernel_fn of {name}: the input Kernel's cov1 has shape {tuple(k.cov1.shape)}, not the batch diagonal "
            f"({expected} axes) that layers take; a Kernel computed with diagonal_batch=False cannot be composed"
        )
    if k.spatial_ndim > 0 and not k.full and needs_full(False):
        raise ValueError(
            f"kernel_fn of {name}: the layers mix spatial positions and need the covariances of all pairs of "
            f"positions, but the input Kernel holds same-position covariances only (full=False); compute it "
            f"from a kernel_fn whose output keeps spatial axes, or with diagonal_spatial=False"
        )


def _std_value(value):
    """A layer scale as a Python float, or unchanged when it is traced (hyperparameter fitting under grad/jit)."""
    return value if isinstance(value, jax.core.Tracer) else float(value)


def _act_param(value, name: str, layer: str):
    """An activation's parameter: a finite Python float when concrete, unchanged when traced.

    Traced values (the leaves of a hyperparameter pytree under `jax.grad` / `jit`) cannot be
    inspected; their range is the caller's business (`parametric_kernel` keeps its leaves positive).
    """
    if isinstance(value, jax.core.Tracer):
        if jnp.ndim(value) != 0:
            raise ValueError(f"{layer}: {name} must be a scalar, got a traced array of shape {jnp.shape(value)}")
        return value
    return _finite_float(value, name, layer)


def _finite_float(value, name: str, layer: str) -> float:
    """``float(value)``, refused with the layer's name unless it is a finite number."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{layer}: {name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v):
        raise ValueError(f"{layer}: {name} must be finite, got {value}")
    return v


def _fmt(value) -> str:
    """A parameter in a layer's name: its value, or 'traced'."""
    return "traced" if isinstance(value, jax.core.Tracer) else repr(value)


def _check_std(value, name: str, layer: str, allow_none: bool):
    """Validate a concrete scale; traced scales (gradients w.r.t. W_std, b_std) are checked by their caller."""
    if isinstance(value, jax.core.Tracer):
        return
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{layer}: {name} must be a positive number, got None")
    v = _finite_float(value, name, layer)
    if name == "W_std" and v <= 0:
        raise ValueError(f"{layer}: W_std must be positive, got {value}")
    if name == "b_std" and v < 0:
        raise ValueError(f"{layer}: b_std must be non-negative, got {value}")


def _check_parameterization(p: str, layer: str):
    if p not in ("ntk", "standard"):
        raise ValueError(f"{layer}: parameterization must be 'ntk' or 'standard', got {p!r}")


def _single_shape(shape, layer: str):
    if not (isinstance(shape, tuple) and all(isinstance(s, (int, np.integer)) for s in shape)):
        raise ValueError(f"{layer}: expected one input, got a list of {len(shape)} branches")
    if len(shape) < 2:
        raise ValueError(f"{layer}: input shape {shape} needs a batch axis and a channel axis")
    return tuple(int(s) for s in shape)


def _map_covs(k: Kernel, fn, ntk_fn=None, **changes) -> Kernel:
    """Apply ``fn(mat, batch_ndim)`` to nngp, cov1, cov2 (and ntk via ``ntk_fn``)."""
    ntk = k.ntk
    if ntk is not None and ntk_fn is not None:
        ntk = ntk_fn(ntk, 2)
    return k.replace(
        nngp=fn(k.nngp, 2),
        cov1=fn(k.cov1, 1),
        cov2=None if k.cov2 is None else fn(k.cov2, 1),
        ntk=ntk,
        **changes,
    )



def _spatial_pads(in_sizes, window, strides, padding):
    """Per-dimension (lo, hi) zero padding for SAME/VALID, or the wrap padding for CIRCULAR."""
    if padding == "VALID":
        return [(0, 0)] * len(in_sizes)
    return [tuple(p) for p in lax.padtype_to_pads(tuple(in_sizes), tuple(window), tuple(strides), "SAME")]


def _out_sizes(in_sizes, window, strides, padding):
    pads = _spatial_pads(in_sizes, window, strides, padding)
    out = []
    for n, w, s, (lo, hi) in zip(in_sizes, window, strides, pads):
        size = (n + lo + hi - w) // s + 1
        out.append(size)
    return tuple(out)


def _pad_axes(x, axes, pads, circular: bool):
    """Pad ``x`` along ``axes`` (each with its (lo, hi)); wrap-around when circular."""
    widths = [(0, 0)] * x.ndim
    for ax, p in zip(axes, pads):
        widths[ax] = p
    if all(w == (0, 0) for w in widths):
        return x
    return jnp.pad(x, widths, mode="wrap" if circular else "constant")


def _diag_window_sum(x, axis_a, axis_b, window, stride, pad, circular, out_size):
    """sum_{d < window} x[i*s + d, j*s + d] over the pair of axes (axis_a, axis_b)."""
    x = _pad_axes(x, (axis_a, axis_b), (pad, pad), circular)
    span = stride * (out_size - 1) + 1
    total = None
    for d in range(window):
        piece = lax.slice_in_dim(x, d, d + span, stride, axis_a)
        piece = lax.slice_in_dim(piece, d, d + span, stride, axis_b)
        total = piece if total is None else total + piece
    return total


def _window_sum(x, axes, window, strides, pads, circular):
    """Box-filter sum over ``axes`` (reduce_window with zero or wrap padding)."""
    dims = [1] * x.ndim
    strd = [1] * x.ndim
    padding = [(0, 0)] * x.ndim
    for ax, w, s, p in zip(axes, window, strides, pads):
        dims[ax] = w
        strd[ax] = s
        padding[ax] = tuple(p)
    if circular:
        x = _pad_axes(x, axes, pads, True)
        padding = [(0, 0)] * x.ndim
    # Zero padding inside reduce_window: no padded copy of the kernel is written out first. The zero is a
    # concrete (numpy) scalar: under jit a jnp zero is traced, and reduce_window then falls back to its generic
    # form, which has no derivative (hyperparameter gradients through Conv and AvgPool).
    return lax.reduce_window(x, np.zeros((), x.dtype), lax.add, tuple(dims), tuple(strd), padding)


def _spatial_mean(mat, batch_ndim: int):
    """Mean over all axes after the batch ones.

    Written as a product with a vector of 1 / count: XLA:CPU fuses that with the
    elementwise kernel map before it, where a reduction goes to a library kernel
    that first writes out every broadcast constant of that map as a full array.
    """
    flat = mat.reshape(mat.shape[:batch_ndim] + (-1,))
    return flat @ jnp.full((flat.shape[-1],), 1.0 / flat.shape[-1], flat.dtype)


def _spatial_diagonal(mat, batch_ndim: int):
    """(batch..., H, H', W, W') -> (batch..., H, W): same-position entries.

    Each position pair (H, H) is merged into one axis of H^2 entries and every (H + 1)-th is kept: a strided
    slice, which XLA fuses into what reads it, where `jnp.diagonal`'s gather compiled into a large kernel of its own.
    """
    nd = (mat.ndim - batch_ndim) // 2
    for i in range(nd):
        ax = batch_ndim + i
        h = mat.shape[ax]
        if mat.shape[ax + 1] != h:  # not a pair of the same positions: the general diagonal
            mat = jnp.moveaxis(jnp.diagonal(mat, axis1=ax, axis2=ax + 1), -1, ax)
            continue
        merged = mat.reshape(mat.shape[:ax] + (h * h,) + mat.shape[ax + 2:])
        mat = lax.slice_in_dim(merged, 0, h * h, stride=h + 1, axis=ax)
    return mat
