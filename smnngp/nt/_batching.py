"""neural-tangents' ``batch``: a kernel function evaluated tile by tile, with nt 0.6.5's signature and contract.

`smnngp.kernels.batched_kernel_fn` is smnngp's own tiler for large kernels (host-memory results, tiles sharded
over devices in one program, N in the tens of thousands). ``batch`` here keeps neural-tangents' contract
instead: any kernel function ``kernel_fn(x1, x2=None, *args, **kwargs)`` (a `smnngp.stax` ``kernel_fn``, an
empirical or Monte-Carlo one), its arguments passed through unchanged (``get`` only if the caller gives it),
a `Kernel` (or nested lists of inputs and Kernels, for `parallel` networks) as first argument, results of
the same type as ``kernel_fn``'s (JAX arrays, named tuples, `Kernel` objects with every field), and usable
under `jax.jit`.

Like neural-tangents, it compiles the tile function and reuses it for every tile (a ``kernel_fn`` evaluated
operation by operation on each tile costs several times more): one compiled program per tile shape and per
value of the arguments that are not arrays, kept for every batched function of the same ``kernel_fn``
(`smnngp.kernels.compiled_tile_fn`, shared with `smnngp.kernels.batched_kernel_fn`). The last tile of a number
of points that ``batch_size`` does not divide is padded with copies of the last point and cut back
(`smnngp.kernels.pad_to`), so a symmetric kernel ``K(x, x)`` compiles two programs (the tiles on the diagonal,
``kernel_fn(tile, None)``, and those above it; the tiles below are their mirror images, `smnngp.kernels.swap_pairs`)
and a kernel ``K(x1, x2)`` one, the second of those. A kernel function that cannot be compiled (an argument that is
neither an array nor hashable, or a body that needs concrete values) is called as it is on each tile, operation by
operation.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.empirical._axes import symmetric_kwargs, tile_kwargs
from smnngp.kernels import Kernel, compiled_tile_fn, pad_to, split_static, swap_pairs

__all__ = ["batch"]

# What a kernel function raises when it cannot be traced (a tracer turned into a Python value, an output that is
# not an array, an unhashable static argument): the tile is then evaluated without compiling.
_NOT_TRACEABLE = (TypeError, jax.errors.JAXIndexError)


def batch(kernel_fn: Callable, batch_size: int = 0, device_count: int = -1, store_on_device: bool = True) -> Callable:
    """Evaluate ``kernel_fn`` on tiles of ``batch_size`` points of ``x1`` and of ``x2``, with neural-tangents
    0.6.5's signature.

    The batched function ``batched(x1_or_kernel, x2=None, *args, **kwargs)`` cuts the inputs (every array
    of a nested list of inputs, along its first axis) into tiles, calls ``kernel_fn(x1_tile, x2_tile, *args,
    **kwargs)`` on every pair of tiles, and assembles the results: arrays (and the arrays of named tuples)
    with the two batch axes first are put together block by block; a `Kernel` gets its ``nngp``/``ntk`` by
    blocks, ``cov1`` from the tiles of ``x1``, ``cov2`` from those of ``x2``, and its other fields from the
    kernel of one tile, with the shapes of the whole batch. With ``x2=None`` the tiles on the diagonal are
    computed as ``kernel_fn(x1_tile, None)`` (what makes them equal to the unbatched kernel where a layer
    tells "x2 is x1" apart, as `Dropout`), and a tile below the diagonal is the mirror image of the one above
    it (computed once). A `Kernel` as first argument (one a ``kernel_fn`` returned) is cut into the same tiles,
    so batched kernel functions compose.

    The tile function is compiled with `jax.jit` once per tile shape and reused, as in neural-tangents: array
    leaves of ``args``/``kwargs`` are traced, every other leaf (``get``, flags, numbers) is static. A
    ``kernel_fn`` that cannot be compiled is called on each tile as it is.

    Differences from neural-tangents: ``batch_size`` need not divide the number of points (the last tile is
    padded with copies of the last point and cut back, so it shares the others' compiled program); the tiles
    are spread over ``device_count`` local devices by placing each tile's inputs on its device (JAX runs them
    at once) rather than by `jax.pmap`; outside `jax.jit`, ``store_on_device=False`` moves each result to the
    CPU as it arrives (JAX arrays either way).

    Args:
        kernel_fn: ``kernel_fn(x1, x2, *args, **kwargs)`` returning arrays of shape (N1, N2, ...), named tuples
            of them, `Kernel` objects, or (nested) lists of those.
        batch_size: points per tile, a non-negative int (``0``: one tile holding all points).
        device_count: local devices to spread the tiles over; ``-1`` for all, ``0`` for the default device.
        store_on_device: keep results on the device that computed them (``False``: on the CPU).

    Returns:
        ``batched(x1_or_kernel, x2=None, *args, **kwargs)`` returning what ``kernel_fn`` returns on the whole
        inputs.

    Raises:
        TypeError: if ``kernel_fn`` is not callable.
        ValueError: if ``batch_size`` is negative or ``device_count`` is below -1 or above the number of local
            devices; when called, if ``x1`` and ``x2`` differ in structure or a Kernel comes with an ``x2``.
    """
    if not callable(kernel_fn):
        raise TypeError(f"batch: kernel_fn must be callable, got {type(kernel_fn).__name__}")
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 0:
        raise ValueError(f"batch: batch_size must be a non-negative integer, got {batch_size!r}")
    local = jax.local_devices()
    if not isinstance(device_count, (int, np.integer)) or device_count < -1 or device_count > len(local):
        raise ValueError(f"batch: device_count must be -1, 0 or at most {len(local)} (local devices), "
                         f"got {device_count!r}")
    devices = local if device_count == -1 else local[: max(device_count, 1)]
    cpu = jax.devices("cpu")[0]
    compiled = compiled_tile_fn(kernel_fn)
    uncompilable = set()  # the static parts of the arguments with which kernel_fn could not be traced

    def call(a, b, args, kwargs):
        """kernel_fn on one tile: compiled, or as it is where it cannot be."""
        try:
            key = (jax.tree_util.tree_structure((a, b)), split_static((tuple(args), dict(kwargs)))[1])
        except TypeError:  # an argument neither an array nor hashable
            return kernel_fn(a, b, *args, **kwargs)
        if key not in uncompilable:
            try:
                return compiled(a, b, args, kwargs)
            except _NOT_TRACEABLE:
                uncompilable.add(key)
        # Called as it is: where the failure was kernel_fn's own error, it is raised again here, unchanged.
        return kernel_fn(a, b, *args, **kwargs)

    def batched(x1_or_kernel, x2=None, *args, **kwargs):
        leaves1, tree1 = jax.tree_util.tree_flatten(x1_or_kernel, is_leaf=_is_kernel)
        if not leaves1:
            raise ValueError("batch: x1 holds no arrays")
        from_kernel = any(isinstance(leaf, Kernel) for leaf in leaves1)
        if x2 is not None and not jax.tree_util.tree_leaves(x2):
            x2 = None  # (None, None) for a two-input network means x2 = x1, as in neural-tangents
        if from_kernel and x2 is not None:
            raise ValueError("batch: with a Kernel as first argument, x2 must be None (the Kernel holds both inputs)")
        leaves2 = None
        if x2 is not None:
            leaves2, tree2 = jax.tree_util.tree_flatten(x2, is_leaf=_is_kernel)
            if tree2 != tree1:
                raise ValueError(f"batch: x1 and x2 must have the same structure, got {tree1} and {tree2}")
        n1 = _batch_size_of(leaves1[0], 0)
        n2 = _batch_size_of(leaves1[0], 1) if from_kernel else n1 if leaves2 is None else _batch_size_of(leaves2[0], 0)
        same = x2 is None and (not from_kernel or all(leaf.x1_is_x2 for leaf in leaves1 if isinstance(leaf, Kernel)))
        # Every tile has b1 x b2 points: the last ones are padded with copies of the last point (then cut back).
        b1 = min(batch_size or n1, n1)
        b2 = min(batch_size or n2, n2)
        rows = [(s, min(s + b1, n1)) for s in range(0, n1, b1)]
        cols = [(s, min(s + b2, n2)) for s in range(0, n2, b2)]
        traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves((x1_or_kernel, x2)))
        # K(x, x) is symmetric: with x2=None (and the same per-point keywords on both sides) a tile below the
        # diagonal is the mirror image of one above it, when the layout of every result is known
        mirror = same and not from_kernel and symmetric_kwargs(kwargs)

        def tile_inputs(i, j):
            r, c = rows[i], cols[j]
            own = same and i == j and r == c
            if from_kernel:
                a = [_slice_kernel(leaf, r, c, own, b1, b2) if isinstance(leaf, Kernel) else leaf for leaf in leaves1]
                b = None
            else:
                a = [pad_to(leaf[r[0]:r[1]], b1) for leaf in leaves1]
                b = None if own else [pad_to(leaf[c[0]:c[1]], b2) for leaf in (leaves1 if leaves2 is None else leaves2)]
            if not traced and len(devices) > 1:
                a, b = jax.device_put((a, b), devices[(i * len(cols) + j) % len(devices)])
            a = jax.tree_util.tree_unflatten(tree1, a)
            b = None if b is None else jax.tree_util.tree_unflatten(tree1, b)
            return a, b, _pad_kwargs(tile_kwargs(kwargs, r, c, n1, n2), kwargs, b1, b2)

        def evaluate(i, j):
            a, b, kw = tile_inputs(i, j)
            out = _trim(call(a, b, args, kw), rows[i][1] - rows[i][0], cols[j][1] - cols[j][0], b1, b2)
            if not traced and (not store_on_device or len(devices) > 1):
                # the tiles meet on one device (the first, or the CPU) to be put together
                out = jax.device_put(out, devices[0] if store_on_device else cpu)
            return out

        def mirrored(i, j):
            return mirror and j < i and rows[j] == cols[j] and rows[i] == cols[i]

        done = {}
        for i in range(len(rows)):
            for j in range(len(cols)):
                if not mirrored(i, j):
                    done[i, j] = evaluate(i, j)
                    if (i, j) == (0, 0):
                        mirror = mirror and _mirrorable(done[0, 0])
        tiles = [[_mirror(done[j, i]) if mirrored(i, j) else done[i, j] for j in range(len(cols))]
                 for i in range(len(rows))]
        return _assemble(tiles, same, n1, n2)

    return batched


def _pad_kwargs(tiled: dict, given: dict, b1: int, b2: int) -> dict:
    """The per-point keywords that `tile_kwargs` cut to a tile (pairs ``(for x1, for x2)``), padded as the tile's
    inputs are; the others as they are."""
    out = {}
    for name, v in tiled.items():
        if v is given[name]:
            out[name] = v
        else:
            first, second = v
            out[name] = (jax.tree_util.tree_map(lambda t: pad_to(t, b1), first),
                         None if second is None else jax.tree_util.tree_map(lambda t: pad_to(t, b2), second))
    return out


def _mirrorable(result) -> bool:
    """Whether the transpose of every part of a tile's result is known: Kernels, and arrays of at most 2 axes."""
    return all(leaf is None or isinstance(leaf, Kernel) or jnp.ndim(leaf) <= 2
               for leaf in jax.tree_util.tree_leaves(result, is_leaf=_is_kernel))


def _mirror(result):
    """The result of the transposed tile: (x2 tile, x1 tile) from (x1 tile, x2 tile)."""

    def flip(leaf):
        if isinstance(leaf, Kernel):
            return leaf.replace(nngp=swap_pairs(leaf.nngp, leaf.diagonal_spatial),
                                ntk=swap_pairs(leaf.ntk, leaf.diagonal_spatial),
                                cov1=leaf.cov2, cov2=leaf.cov1, mask1=leaf.mask2, mask2=leaf.mask1,
                                shape1=leaf.shape2, shape2=leaf.shape1)
        return swap_pairs(leaf, True)  # at most 2 axes (see _mirrorable)

    return jax.tree_util.tree_map(flip, result, is_leaf=_is_kernel)


def _is_kernel(x) -> bool:
    return isinstance(x, Kernel)


def _batch_size_of(leaf, axis: int) -> int:
    if isinstance(leaf, Kernel):
        return int(leaf.nngp.shape[axis])
    shape = jnp.shape(leaf)
    if not shape:
        raise ValueError("batch: inputs must have a batch axis, got a scalar")
    return int(shape[0])


def _per_point(a) -> bool:
    """Whether a Kernel's mask has one entry per point (not one broadcast over the batch)."""
    return a is not None and a.shape[0] > 1


def _slice_kernel(k: Kernel, r, c, own: bool, b1: int, b2: int) -> Kernel:
    """The kernel of points r[0]:r[1] of x1 against c[0]:c[1] of x2 (of x1 itself when ``own``), as one of b1 x b2
    points: a short last tile is padded with copies of its last point, as the inputs are."""

    def rows(a, lo, hi, size):
        # per-point values are cut (and padded); a mask of one entry broadcasts over the batch
        return pad_to(a[lo:hi], size) if _per_point(a) else a

    def pair(a):
        return a if a is None or jnp.ndim(a) < 2 else pad_to(pad_to(a[r[0]:r[1], c[0]:c[1]], b1, 0), b2, 1)

    cov2_src, mask2_src = (k.cov1, k.mask1) if k.cov2 is None else (k.cov2, k.mask2)
    return k.replace(
        nngp=pair(k.nngp), ntk=pair(k.ntk),
        cov1=rows(k.cov1, *r, b1), cov2=None if own else rows(cov2_src, *c, b2),
        mask1=rows(k.mask1, *r, b1), mask2=None if own else rows(mask2_src, *c, b2),
        x1_is_x2=own,
        shape1=(b1,) + tuple(k.shape1[1:]), shape2=(b2,) + tuple(k.shape2[1:]),
    )


def _trim(result, m1: int, m2: int, b1: int, b2: int):
    """A padded tile's result cut back to its m1 x m2 real points."""
    if (m1, m2) == (b1, b2):
        return result

    def cut(leaf):
        if isinstance(leaf, Kernel):
            def pair(a):
                return a if a is None or jnp.ndim(a) < 2 else a[:m1, :m2]

            def along(a, m):
                return a[:m] if _per_point(a) else a

            return leaf.replace(nngp=pair(leaf.nngp), ntk=pair(leaf.ntk), cov1=along(leaf.cov1, m1),
                                cov2=along(leaf.cov2, m2), mask1=along(leaf.mask1, m1), mask2=along(leaf.mask2, m2),
                                shape1=(m1,) + tuple(leaf.shape1[1:]), shape2=(m2,) + tuple(leaf.shape2[1:]))
        return leaf if leaf is None or jnp.ndim(leaf) < 2 else leaf[:m1, :m2]

    return jax.tree_util.tree_map(cut, result, is_leaf=_is_kernel)


def _blocks(grid):
    """One array from a grid of tiles (N1 tiles by N2 tiles, batch axes first)."""
    if len(grid) == 1 and len(grid[0]) == 1:
        return grid[0][0]
    return jnp.concatenate([jnp.concatenate(row, axis=1) for row in grid], axis=0)


def _assemble(tiles, same: bool, n1: int, n2: int):
    """The whole result from the grid of per-tile results (same pytree structure in every tile)."""
    first = tiles[0][0]
    structure = jax.tree_util.tree_structure(first, is_leaf=_is_kernel)
    flat = [[jax.tree_util.tree_leaves(t, is_leaf=_is_kernel) for t in row] for row in tiles]
    out = []
    for idx, leaf in enumerate(flat[0][0]):
        grid = [[cell[idx] for cell in row] for row in flat]
        if isinstance(leaf, Kernel):
            out.append(_assemble_kernel(grid, same, n1, n2))
        elif leaf is None or jnp.ndim(leaf) < 2:
            out.append(leaf)  # a constant (an NTK no layer touched) is the same in every tile
        else:
            out.append(_blocks(grid))
    return jax.tree_util.tree_unflatten(structure, out)


def _assemble_kernel(grid, same: bool, n1: int, n2: int) -> Kernel:
    k0 = grid[0][0]
    if not k0.diagonal_batch and (len(grid) > 1 or len(grid[0]) > 1):
        raise NotImplementedError("batch: a Kernel with diagonal_batch=False (cov1 of all pairs of points) cannot be "
                                  "assembled from tiles; use batch_size=0")

    def pair(name):
        values = [[getattr(k, name) for k in row] for row in grid]
        return values[0][0] if values[0][0] is None or jnp.ndim(values[0][0]) < 2 else _blocks(values)

    def along(values):
        if values[0] is None or len(values) == 1:
            return values[0]
        if jnp.shape(values[0])[0] == 1 and all(jnp.shape(v)[0] == 1 for v in values):
            return values[0]  # a mask that broadcasts over the batch
        return jnp.concatenate(values, axis=0)

    diag = [grid[i][min(i, len(grid[i]) - 1)] for i in range(len(grid))]
    cov1 = along([k.cov1 for k in diag])
    mask1 = along([k.mask1 for k in diag])
    if same:
        cov2 = mask2 = None
    else:
        cov2 = along([k.cov2 for k in grid[0]])
        mask2 = along([k.mask2 for k in grid[0]])
    return k0.replace(nngp=pair("nngp"), ntk=pair("ntk"), cov1=cov1, cov2=cov2, mask1=mask1, mask2=mask2,
                      x1_is_x2=same and all(k.x1_is_x2 for k in diag),
                      shape1=(n1,) + tuple(k0.shape1[1:]), shape2=(n2,) + tuple(k0.shape2[1:]))
