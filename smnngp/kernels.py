"""The `Kernel` pytree and the evaluation of kernels at scale.

A `Kernel` carries the second moments of one layer's pre-activations in the
infinite-width limit, for two batches of inputs ``x1`` (N1 points) and ``x2``
(N2 points):

* ``nngp``: E[f(x1) f(x2)] per channel, the NNGP kernel;
* ``ntk``:  the neural tangent kernel (``None`` when it is not requested);
* ``cov1``: E[f(x1)^2] for each point of ``x1`` (the batch diagonal);
* ``cov2``: the same for ``x2``, ``None`` when ``x2`` is ``x1``.

Layouts (S spatial dimensions of sizes H, W, ...):

* no spatial dimensions: ``nngp`` is (N1, N2), ``cov1`` is (N1,);
* ``full=False`` (only same-position covariances are tracked):
  ``nngp`` is (N1, N2, H, W, ...), ``cov1`` is (N1, H, W, ...);
* ``full=True`` (all position pairs): ``nngp`` is (N1, N2, H, H', W, W', ...)
  with the two positions of each spatial dimension interleaved, and ``cov1``
  is (N1, H, H', W, W', ...).

The layer library decides ``full`` once per architecture: it is needed only
when a later layer mixes positions (average pooling, global pooling).

Besides the pytree this module evaluates a ``kernel_fn`` on large inputs:
`batched_kernel_fn` tiles ``x1 x x2`` into blocks, distributes blocks over all
local devices with `jax.sharding`, and assembles the result in host memory or,
given a directory, in memory-mapped ``.npy`` files that resume tile by tile
after an interruption and refuse inputs, settings or networks other than
their own (`tile_store_info` reads such a store and its cost);
`diagonal` evaluates k(x_i, x_i) alone in O(N).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import io
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "Kernel",
    "KernelTuple",
    "batched_kernel_fn",
    "diagonal",
    "tile_store_info",
    "kernel_memory_bytes",
    "ParametricKernel",
    "rbf",
    "softplus_inverse",
]

_VALID_GET = ("nngp", "ntk")


# neural-tangents' Kernel fields, in its order. The arrays are the pytree's leaves; the rest is static
# metadata (nt's ``pytree_node=False``), part of the tree structure.
_ARRAY_FIELDS = ("nngp", "ntk", "cov1", "cov2", "mask1", "mask2")
_META_FIELDS = ("x1_is_x2", "is_gaussian", "is_reversed", "is_input", "diagonal_batch", "diagonal_spatial",
                "shape1", "shape2", "batch_axis", "channel_axis")


def _diagonal_batch_reading(cov1, shape1, diagonal_spatial) -> bool:
    """Whether ``cov1`` holds each point's own covariances (its shape tells): `Kernel`'s default."""
    return cov1 is None or jnp.ndim(cov1) == 1 + (len(shape1) - 2) * (1 if diagonal_spatial else 2)


def _meta(**kw):
    return dataclasses.field(metadata={"pytree_node": False}, **kw)


@dataclasses.dataclass(frozen=True, eq=False, init=False, repr=False)
class Kernel:
    """Moments of one layer in the infinite-width limit (see module docstring): neural-tangents' ``Kernel``.

    A frozen dataclass with neural-tangents 0.6.5's sixteen fields, their order and meaning; the six array
    fields are the pytree's children, the ten others static metadata (``dataclasses.fields(k)[i].metadata
    ['pytree_node']`` is False for them, as in nt). Every field can be read by name through a ``kernel_fn``'s
    ``get`` (``get='cov1'``, ``get=('nngp', 'shape1')``) and changed with `replace`.

    Args:
        nngp: NNGP covariances between the points of ``x1`` and ``x2``, (N1, N2, ...) in the layout that
            ``diagonal_spatial`` selects.
        ntk: neural tangent kernel in the layout of ``nngp`` (a scalar zero before any layer has acted), or
            ``None`` when it is not computed.
        cov1: variances E[f(x1)^2] of the points of ``x1``, (N1, ...) (``diagonal_batch=True``), or their full
            covariance (N1, N1, ...) for a kernel returned by ``kernel_fn(..., diagonal_batch=False)``.
        cov2: the same for ``x2``, or ``None`` when ``x2`` is ``x1``.
        x1_is_x2: whether the kernel is of ``x1`` with itself (default: ``cov2 is None``).
        is_gaussian: whether the pre-activations are Gaussian (the last layer was affine), which an
            activation's closed form requires.
        is_reversed: neural-tangents' flag for reversed spatial axes; smnngp keeps spatial axes in order, so it
            is False (True raises ValueError).
        is_input: neural-tangents' flag for the kernel of the inputs before any layer (stored as given).
        diagonal_batch: whether ``cov1``/``cov2`` hold each point's own covariances only (default: read off
            the shape of ``cov1``).
        diagonal_spatial: whether only same-position covariances are held: ``nngp`` (N1, N2, H, W, ...);
            otherwise all position pairs, (N1, N2, H, H', W, W', ...) with the two positions of each spatial
            dimension interleaved, and ``cov1`` (N1, H, H', W, W', ...). Layers decide it once per
            architecture (all pairs are needed only when a later layer mixes positions).
        shape1: shape of the finite network's activations on ``x1`` (batch first, channels last; a tuple).
        shape2: the same for ``x2``.
        batch_axis: the batch axis of ``shape1``: 0, kernels are batch first (any other value raises ValueError).
        channel_axis: the channel axis of ``shape1`` (default: its last axis).
        mask1: boolean mask of the activations on ``x1`` in the canonical layout (batch first, channels last;
            axes of size 1 broadcast), True where an entry is masked (``kernel_fn(..., mask_constant=c)``), or
            ``None`` (default) when nothing is masked.
        mask2: the same for ``x2``; ``None`` with ``cov2=None`` means ``mask1``.
        full: smnngp's older keyword, ``not diagonal_spatial`` (keyword only; give one of the two).
    """

    nngp: Any
    ntk: Any
    cov1: Any
    cov2: Any
    x1_is_x2: bool = _meta()
    is_gaussian: bool = _meta()
    is_reversed: bool = _meta()
    is_input: bool = _meta()
    diagonal_batch: bool = _meta()
    diagonal_spatial: bool = _meta()
    shape1: tuple = _meta()
    shape2: tuple = _meta()
    batch_axis: int = _meta()
    channel_axis: int = _meta()
    mask1: Any = None
    mask2: Any = None

    def __init__(self, nngp, ntk, cov1, cov2, x1_is_x2=None, is_gaussian=False, is_reversed=False, is_input=False,
                 diagonal_batch=None, diagonal_spatial=None, shape1=None, shape2=None, batch_axis=0,
                 channel_axis=None, mask1=None, mask2=None, *, full=None):
        if shape1 is None or shape2 is None:
            raise TypeError("Kernel: shape1 and shape2 are required")
        if full is not None:
            if diagonal_spatial is not None and bool(diagonal_spatial) == bool(full):
                raise ValueError("Kernel: full and diagonal_spatial contradict each other")
            diagonal_spatial = not full
        if is_reversed:
            raise ValueError("Kernel: is_reversed=True cannot be held by smnngp, which keeps spatial axes in order "
                             "(neural-tangents' reversed layout is an internal optimisation of its own)")
        if int(batch_axis) != 0:
            raise ValueError(f"Kernel: batch_axis={batch_axis!r} cannot be held by smnngp, whose kernels are batch "
                             f"first (batch_axis=0)")
        shape1, shape2 = tuple(shape1), tuple(shape2)
        diagonal_spatial = True if diagonal_spatial is None else bool(diagonal_spatial)
        if diagonal_batch is None:
            diagonal_batch = _diagonal_batch_reading(cov1, shape1, diagonal_spatial)
        values = (nngp, ntk, cov1, cov2, cov2 is None if x1_is_x2 is None else bool(x1_is_x2), bool(is_gaussian),
                  bool(is_reversed), bool(is_input), bool(diagonal_batch), diagonal_spatial, shape1, shape2,
                  int(batch_axis), len(shape1) - 1 if channel_axis is None else int(channel_axis), mask1, mask2)
        for name, value in zip(_FIELD_NAMES, values):
            object.__setattr__(self, name, value)

    # -- pytree protocol (children: the arrays; aux: the static fields) ---------------------------------
    # A kernel inside a layer map may also carry the first moments of its activations (``_flow``, see
    # `smnngp.stax._flow`): its arrays are children after the six fields, its static part one more aux entry.
    def tree_flatten(self):
        arrays = tuple(getattr(self, n) for n in _ARRAY_FIELDS)
        meta = tuple(getattr(self, n) for n in _META_FIELDS)
        flow = getattr(self, "_flow", None)
        if flow is None:
            return arrays, meta + (None,)
        return arrays + flow.children(), meta + ((type(flow), flow.aux()),)

    @classmethod
    def tree_unflatten(cls, aux, children):
        k = object.__new__(cls)  # the fields were validated when the flattened kernel was built
        for name, value in zip(_ARRAY_FIELDS, children):
            object.__setattr__(k, name, value)
        for name, value in zip(_META_FIELDS, aux):
            object.__setattr__(k, name, value)
        if len(aux) > len(_META_FIELDS) and aux[-1] is not None:
            flow_type, flow_aux = aux[-1]
            object.__setattr__(k, "_flow", flow_type.rebuild(flow_aux, tuple(children[len(_ARRAY_FIELDS):])))
        return k

    # -- conveniences ----------------------------------------------------
    def replace(self, **changes) -> Kernel:
        """A copy with ``changes`` (any field by name; ``full=`` is read as ``diagonal_spatial=not full``)."""
        if "full" in changes:
            full = changes.pop("full")
            if "diagonal_spatial" in changes and bool(changes["diagonal_spatial"]) == bool(full):
                raise ValueError("Kernel.replace: full and diagonal_spatial contradict each other")
            changes["diagonal_spatial"] = not full
        unknown = set(changes) - set(_FIELD_NAMES)
        if unknown:
            raise TypeError(f"Kernel.replace: unknown fields {sorted(unknown)}; a Kernel's fields are "
                            f"{', '.join(_FIELD_NAMES)}")
        fields = {name: getattr(self, name) for name in _FIELD_NAMES}
        # Fields that default to a reading of others follow them when those change, unless given (or set
        # away from their default reading before).
        if "channel_axis" not in changes and "shape1" in changes and self.channel_axis == len(self.shape1) - 1:
            fields["channel_axis"] = None
        if "diagonal_batch" not in changes and self.diagonal_batch == _diagonal_batch_reading(
                self.cov1, self.shape1, self.diagonal_spatial) and any(
                n in changes for n in ("cov1", "shape1", "diagonal_spatial")):
            fields["diagonal_batch"] = None
        fields.update(changes)
        return Kernel(**fields)

    @property
    def full(self) -> bool:
        """smnngp's name: the covariances of all pairs of spatial positions are held (``not diagonal_spatial``)."""
        return not self.diagonal_spatial

    def mask(self, mask1, mask2) -> Kernel:
        """neural-tangents' remasking: the masks set and every covariance of a masked position zeroed."""
        from smnngp.stax import masking  # the mask machinery lives with the layers

        return masking.remask_kernel(self, mask1, mask2, "Kernel.mask")

    @property
    def spatial_ndim(self) -> int:
        """Number of spatial dimensions of the activations (0 for dense)."""
        return len(self.shape1) - 2

    @property
    def dtype(self):
        return self.nngp.dtype

    def __repr__(self) -> str:
        def desc(a):
            return None if a is None else f"{a.dtype}{list(a.shape)}"

        return (
            f"Kernel(nngp={desc(self.nngp)}, ntk={desc(self.ntk)}, cov1={desc(self.cov1)}, "
            f"cov2={desc(self.cov2)}, shape1={self.shape1}, shape2={self.shape2}, "
            f"diagonal_spatial={self.diagonal_spatial}, is_gaussian={self.is_gaussian}"
            + ("" if self.mask1 is None and self.mask2 is None else f", mask1={desc(self.mask1)}, "
               f"mask2={desc(self.mask2)}")
            + ")"
        )


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Kernel))
KERNEL_FIELDS = _FIELD_NAMES  # what a kernel_fn's ``get`` may name
jax.tree_util.register_pytree_node(Kernel, Kernel.tree_flatten, Kernel.tree_unflatten)


class KernelTuple(NamedTuple):
    """What ``kernel_fn(x1, x2, get=('nngp', 'ntk'))`` returns."""

    nngp: Any
    ntk: Any


def canonical_get(get, valid: Sequence[str] = _VALID_GET) -> tuple[tuple[str, ...] | None, bool]:
    """Validate ``get``; return (names or None for all, whether a single array is wanted).

    Names are case-insensitive (``'NTK'`` is ``'ntk'``, as in neural-tangents) and must be unique; ``valid``
    lists the names the caller can return (a ``kernel_fn`` of `smnngp.stax` returns any `Kernel` field).
    """
    if get is None:
        return None, False
    if isinstance(get, str):
        names, single = (get,), True
    elif isinstance(get, (tuple, list)):
        names, single = tuple(get), False
        if not names:
            raise ValueError("get: an empty tuple asks for nothing; use 'nngp', 'ntk' or both")
    else:
        raise TypeError(f"get must be None, a string or a tuple of strings, got {type(get).__name__}")
    for name in names:
        if not isinstance(name, str) or name.lower() not in valid:
            raise ValueError(f"get: unknown kernel {name!r}; valid keys are {tuple(valid)}")
    names = tuple(name.lower() for name in names)
    if len(set(names)) < len(names):
        raise ValueError(f"get: every name must appear once, got {get!r}")
    return names, single


@functools.cache
def _tuple_type(names: tuple[str, ...]):
    """One named-tuple class per field order (KernelTuple for the usual one)."""
    if names == ("nngp", "ntk"):
        return KernelTuple
    return NamedTuple("Kernels", [(n, Any) for n in names])


def pack(names: tuple[str, ...], single: bool, values) -> Any:
    """Return ``values`` (one per name) in the structure ``get`` asked for."""
    values = tuple(values)
    return values[0] if single else _tuple_type(names)(*values)


def select(k: Kernel, get) -> Any:
    """Return what ``get`` asks for from a finished kernel (any of its fields by name)."""
    names, single = canonical_get(get, _FIELD_NAMES)
    if names is None:
        return k
    return pack(names, single, (getattr(k, n) for n in names))


# ---------------------------------------------------------------------------
# Evaluating kernels at scale
# ---------------------------------------------------------------------------


def kernel_memory_bytes(kernel_fn: Callable, x1, x2, get=("nngp", "ntk")) -> int:
    """Peak temporary memory XLA plans for one call, in bytes (compiled, not run).

    Falls back to a size estimate (8 live copies of the largest intermediate)
    when the backend reports no memory analysis.

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get=...)`` as built by :mod:`smnngp.stax`.
        x1: first inputs, an array or a ``jax.ShapeDtypeStruct`` (only shape and dtype are used).
        x2: second inputs, an array or a ``jax.ShapeDtypeStruct``.
        get: which kernels the call computes, as for ``kernel_fn`` (default both NNGP and NTK).

    Returns:
        Bytes XLA plans for temporaries plus outputs of the compiled call; without a memory analysis, 8 times
        the size of the largest output (an estimate).
    """
    fn = jax.jit(lambda a, b: kernel_fn(a, b, get=get))
    compiled = fn.lower(x1, x2).compile()
    try:
        stats = compiled.memory_analysis()
        if stats is not None:
            return int(stats.temp_size_in_bytes + stats.output_size_in_bytes)
    except (AttributeError, NotImplementedError):  # pragma: no cover - backend dependent
        pass
    out = jax.eval_shape(lambda a, b: kernel_fn(a, b, get=get), x1, x2)
    sizes = [math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(out)]
    return 8 * max(sizes)


# -- tiles: what `batched_kernel_fn` and `smnngp.nt.batch` share ----------------------------------------------


_TRACED = object()  # the place of an array leaf in a StaticArgs


class StaticArgs:
    """The non-array part of a kernel function's extra arguments: their pytree structure and every leaf that is
    not an array (strings such as ``get``, flags, Python numbers, callables), hashable so that it can be a static
    argument of `jax.jit` (one compilation per distinct value, as neural-tangents' ``batch`` closes over them).

    Two are equal when their structures are and their static leaves are of the same types and equal (``1`` and
    ``1.0`` differ: they would trace to different dtypes).

    Raises:
        TypeError: when built, if a static leaf (or the structure) is not hashable, naming it.
    """

    __slots__ = ("treedef", "values", "_hash")

    def __init__(self, treedef, values: tuple):
        self.treedef = treedef
        self.values = values
        try:
            self._hash = hash((treedef, tuple((type(v), v) for v in values if v is not _TRACED)))
        except TypeError as err:
            bad = next((v for v in values if v is not _TRACED and not _hashable(v)), None)
            what = f"argument {bad!r} of type {type(bad).__name__}" if bad is not None else f"structure {treedef}"
            raise TypeError(f"kernel_fn {what} is neither an array nor hashable, so it cannot be a static argument "
                            f"of a compiled tile") from err

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if not isinstance(other, StaticArgs) or self._hash != other._hash or self.treedef != other.treedef:
            return False
        return all(type(a) is type(b) and _static_equal(a, b) for a, b in zip(self.values, other.values))

    def merge(self, dynamic):
        """The arguments again, from the array leaves ``dynamic`` (in the order `split_static` gave them)."""
        it = iter(dynamic)
        return jax.tree_util.tree_unflatten(self.treedef, [next(it) if v is _TRACED else v for v in self.values])


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _static_equal(a, b) -> bool:
    if a is b:
        return True
    same = a == b
    return bool(same) if isinstance(same, (bool, np.bool_)) else False


def split_static(tree) -> tuple[list, StaticArgs]:
    """``(arrays, static)``: the array leaves of ``tree`` (NumPy or JAX arrays, tracers included), to be traced,
    and the rest as a `StaticArgs` (``static.merge(arrays)`` gives ``tree`` back).

    The one rule for which arguments of a tiled kernel function are compiled in and which are traced.

    Raises:
        TypeError: if a leaf that is not an array is not hashable.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [leaf for leaf in leaves if isinstance(leaf, (jax.Array, np.ndarray))]
    values = tuple(_TRACED if isinstance(leaf, (jax.Array, np.ndarray)) else leaf for leaf in leaves)
    return arrays, StaticArgs(treedef, values)


def compiled_tile_fn(kernel_fn: Callable, *, vmap: bool = False, in_shardings=None, out_shardings=None) -> Callable:
    """``run(x1, x2, args, kwargs)``: ``kernel_fn(x1, x2, *args, **kwargs)`` compiled once per tile shape and per
    value of the static part of ``args``/``kwargs`` (`split_static`), and reused for every tile of that shape.

    With ``vmap=True`` the leaves of ``x1`` and ``x2`` carry a leading axis of tiles and the call evaluates all of
    them in one program (``args``/``kwargs`` shared); ``in_shardings``/``out_shardings`` (for ``(x1, x2, arrays of
    args and kwargs)`` and for the result) are `jax.jit`'s. The same (hashable) ``kernel_fn`` and options give the
    same ``run`` and its compiled programs (the 64 latest kept), as neural-tangents' ``batch`` keeps one cache for
    every batched function of one ``kernel_fn``.

    Raises:
        TypeError: when ``run`` is called, if an argument that is not an array is not hashable.
    """
    try:
        return _cached_tile_fn(kernel_fn, vmap, in_shardings, out_shardings)
    except TypeError:  # a kernel_fn that cannot be a cache key: programs of its own
        return _tile_fn(kernel_fn, vmap, in_shardings, out_shardings)


def _tile_fn(kernel_fn, vmap, in_shardings, out_shardings):
    def tile(static, x1, x2, dynamic):
        args, kwargs = static.merge(dynamic)
        return kernel_fn(x1, x2, *args, **kwargs)

    if vmap:
        def body(static, x1, x2, dynamic):
            return jax.vmap(functools.partial(tile, static), in_axes=(0, 0, None))(x1, x2, dynamic)
    else:
        body = tile
    shardings = {k: v for k, v in (("in_shardings", in_shardings), ("out_shardings", out_shardings)) if v is not None}
    jitted = jax.jit(body, static_argnums=0, **shardings)

    def run(x1, x2, args=(), kwargs=None):
        dynamic, static = split_static((tuple(args), dict(kwargs or {})))
        return jitted(static, x1, x2, dynamic)

    return run


_cached_tile_fn = functools.lru_cache(maxsize=64)(_tile_fn)


def pad_to(x, size: int, axis: int = 0):
    """``x`` with its last entry along ``axis`` repeated up to ``size`` entries (NumPy in, NumPy out; else JAX).

    A tile padded with copies of a real point is still a valid input of any kernel function: the padded entries
    are computed as for real points and cut off afterwards, so that every tile has one shape (one compilation).
    """
    n = x.shape[axis]
    if n == size:
        return x
    if n > size:
        raise ValueError(f"pad_to: axis {axis} has {n} entries, more than {size}")
    xp = np if isinstance(x, np.ndarray) else jnp
    last = xp.take(x, np.array([n - 1]), axis=axis)
    return xp.concatenate([x, xp.repeat(last, size - n, axis=axis)], axis=axis)


def swap_pairs(block, diagonal_spatial: bool):
    """A kernel block k(a, b) as k(b, a): the batch pair of axes swapped, and every later pair of interleaved
    spatial axes too unless ``diagonal_spatial`` (then each later axis is one position shared by both points).
    NumPy in, NumPy out; else JAX. Arrays of fewer than 2 axes are returned as they are."""
    if block is None or np.ndim(block) < 2:
        return block
    ndim = np.ndim(block)
    order = [1, 0] + list(range(2, ndim))
    if not diagonal_spatial:
        for s in range(2, ndim - 1, 2):
            order[s], order[s + 1] = s + 1, s
    return np.transpose(block, order) if isinstance(block, np.ndarray) else jnp.transpose(block, order)


def _choose_batch_size(kernel_fn, x1, x2, get, max_memory_bytes: int, n_max: int) -> int:
    """Largest power-of-two tile whose compiled footprint stays under the cap."""
    b = 1
    while b * 2 <= n_max:
        b *= 2
    while b > 1:
        probe1 = jax.ShapeDtypeStruct((b,) + x1.shape[1:], x1.dtype)
        probe2 = jax.ShapeDtypeStruct((b,) + x2.shape[1:], x2.dtype)
        if kernel_memory_bytes(kernel_fn, probe1, probe2, get) <= max_memory_bytes:
            return b
        b //= 2
    return 1


def batched_kernel_fn(
    kernel_fn: Callable,
    batch_size: int | None = None,
    *,
    max_memory_bytes: int = 2**30,
    devices: Sequence[jax.Device] | None = None,
    progress: bool = False,
    path: str | os.PathLike | None = None,
    out_dtype=None,
) -> Callable:
    """Wrap ``kernel_fn`` so that large inputs are evaluated tile by tile, in memory or resumably on disk.

    ``x1`` and ``x2`` are cut into blocks of ``batch_size`` rows (chosen from
    ``max_memory_bytes`` when ``None``: the largest power of two whose compiled
    tile fits); the last block is padded with copies of the last point (cut off
    again), so every block has one shape. Groups of tiles are evaluated in one
    `jit` call whose tile axis is sharded over ``devices`` (all local devices by
    default) with a `NamedSharding`, so each device computes its own tiles; on
    several hosts initialised with `jax.distributed`, pass the global
    `jax.devices()`. Results are written into host (numpy) arrays, so N = 20,000
    needs only the output itself (3.2 GB per float64 kernel) plus one group of
    tiles.

    When ``x2`` is ``None`` only the tiles on and above the block diagonal are
    computed and the rest is filled by symmetry.

    The returned function has the signature ``fn(x1, x2=None, get=('nngp','ntk'),
    *args, **kwargs)`` and returns numpy arrays in the same structure as
    ``kernel_fn``; ``args`` and ``kwargs`` go to every call of ``kernel_fn``
    (the ``params`` of an empirical kernel, ``diagonal_spatial=True``): their
    array leaves are traced and replicated on every device, the other leaves are
    static (`split_static`, the rule `smnngp.nt.batch` follows too).

    **On disk, resumable** (``path``, a directory). Each requested kernel goes
    straight into a memory-mapped ``.npy`` file, ``<path>/nngp.npy``,
    ``<path>/ntk.npy`` (shape (N1, N2, ...), ``np.lib.format.open_memmap``),
    beside ``manifest.json`` (what is stored and what computing it cost) and
    ``done.npy`` (a bool array, one entry per tile). Per group of tiles the order
    is: compute, write the blocks (and their mirror images for ``K(x, x)``) into
    the files, flush them, then mark the tiles done, and only then account the
    time in the manifest; ``done.npy`` and ``manifest.json`` are replaced
    atomically (written to ``*.tmp``, fsynced, `os.replace`). A process killed at
    any point loses at most the group in flight (and, killed between marking and
    accounting, that group's seconds): calling ``fn`` again with the same
    arguments computes only the tiles not marked done. ``fn`` then returns
    read-only memory maps of the files (``np.load(..., mmap_mode='r')``), so a
    kernel larger than memory can be used in place; ``np.asarray(k)`` loads it.
    One process writes a store at a time (an exclusive ``flock`` on
    ``<path>/lock``, released when the process ends, however it ends).

    Nothing is mixed. The manifest records a fingerprint: the shapes, dtypes and
    SHA-256 of the bytes of ``x1`` (and ``x2``), ``get``, the batch size and the
    tile layout, the other arguments (static leaves by value, arrays by SHA-256)
    and each kernel's shape and dtypes; a call that differs in any of them raises
    ValueError naming what differs. The ``kernel_fn`` itself cannot be hashed, so
    on resuming the first finished tile is computed again and compared with the
    stored one: it must agree to ``1e-10`` (float64 tiles) or ``1e-5`` (float32
    tiles) of the largest entry of the stored tile, or the store is refused as a
    kernel of another ``kernel_fn`` (another network, other hyperparameters). The
    same program on the same inputs gives the same bits on one machine; other
    machines or programs (another ``get``) differ by a few roundings, which
    for float32 tiles is the 2e-7 measured below (the tolerance is 40 times
    that), while a kernel of other hyperparameters differs by far more
    (``b_std = 0.05`` beside ``0`` adds 2.5e-3).
    `tile_store_info` reads what a store holds and its honest pairs per second
    over every session that computed part of it.

    **float32 tiles.** The engine computes in the dtype of the inputs: pass
    float32 ``x1``/``x2`` for float32 tiles and ``out_dtype=np.float64`` to write
    them into float64 arrays or files (the Cholesky of a kernel regression wants
    float64). Measured on the Myrtle-5 NNGP (`smnngp.models.myrtle`, 32 x 32
    inputs, 2-core CPU, 2026-11): on 100 training and 50 test digits zero-padded
    to 32 x 32 (every pair correlated above 0.994) the float32 kernel is within
    2.3e-7 of the float64 one entrywise, relative (median 4e-8: one or two
    float32 roundings of the result; 1.9e-7 on standard normal 32 x 32 x 3
    inputs), and kernel regression on it (the ``dataset-kernel`` experiment's
    protocol) predicts the same class for every test image at every
    ``diag_reg`` from 1e-4 to 0.1 (88 % at the chosen 0.01; predicted means
    within 9e-4 relative at 1e-4, where the kernel's condition number, 2.4e6,
    magnifies the difference). float32 tiles were 1.6-2.5 times as fast (64
    CIFAR-shaped images: 10.6 / 12.7 / 15.1 pairs/s in float64 with tiles of
    4 / 8 / 16 images, 20.0 / 22.7 / 38.0 in float32, on a loaded CPU).
    Accumulating in float64 inside a tile has nothing to win: the float32
    kernel is already within about two roundings of the float64 one, and the
    sums in a tile are short (each layer's map adds at most 16 terms per entry:
    the input layer's sum over 3 channels, a 3 x 3 convolution's 9 shifted
    copies of the covariance, a 2 x 2 average pool's 16 on the pairs of
    positions, each followed by the ReLU's arc-cosine map, which renormalises by
    the variances); the tile's results are then stored, not summed further.

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get=...)`` to evaluate; it must return a named tuple of the requested
            kernels (as the kernels of :mod:`smnngp.stax` do).
        batch_size: rows per tile (a positive int), or ``None`` to choose it from ``max_memory_bytes`` (or, when
            resuming a store at ``path``, to take the stored one).
        max_memory_bytes: memory cap per tile in bytes when ``batch_size`` is ``None`` (positive; default 1 GiB).
        devices: devices over which the tiles are sharded; ``None`` means all local devices.
        progress: show a tqdm progress bar over the tiles (tiles finished in an earlier session count as done;
            the bar's rate and ETA are this session's) with this session's pairs per second beside it.
        path: a directory for a resumable store on disk (created if missing; it must be empty, or a store of
            `batched_kernel_fn`); ``None`` keeps the results in memory.
        out_dtype: dtype of the returned arrays (and files), e.g. ``np.float64`` for float32 tiles; ``None`` means
            the dtype of the tiles.

    Returns:
        Function ``fn(x1, x2=None, get=('nngp', 'ntk'))`` returning arrays of shape (N1, N2, ...) (NumPy arrays;
        read-only memory maps of the files when ``path`` is given): one array for a string ``get``, a named tuple
        for a tuple (``get=None`` means both kernels). It raises ValueError for inputs without a batch and a
        feature axis, or that differ beyond the batch axis; with ``path``: ValueError when the path is a file or
        cannot be created, holds other files, a corrupt store, or a kernel of other inputs or settings or of
        another ``kernel_fn``, PermissionError when the directory is not writable, and RuntimeError when another
        process is writing the store.

    Raises:
        ValueError: if ``batch_size`` is not a positive integer, ``max_memory_bytes`` is not positive or
            ``out_dtype`` is not a floating dtype.
        TypeError: if ``path`` is neither a string nor a path.
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_memory_bytes <= 0:
        raise ValueError(f"max_memory_bytes must be positive, got {max_memory_bytes}")
    if out_dtype is not None:
        out_dtype = np.dtype(out_dtype)
        if out_dtype.kind != "f":
            raise ValueError(f"batched_kernel_fn: out_dtype must be a floating dtype, got {out_dtype}")
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"batched_kernel_fn: path must be a directory name, got {type(path).__name__}")
        path = os.path.abspath(os.fspath(path))
    devs = list(jax.local_devices() if devices is None else devices)
    mesh = Mesh(np.array(devs), ("tiles",))
    tile_sharding = NamedSharding(mesh, PartitionSpec("tiles"))
    replicated = NamedSharding(mesh, PartitionSpec())

    one_tile = _OneTile(kernel_fn)
    tiles_fn = compiled_tile_fn(one_tile, vmap=True, in_shardings=(tile_sharding, tile_sharding, replicated),
                                out_shardings=replicated)

    def fn(x1, x2=None, get=("nngp", "ntk"), *args, **kwargs):
        names, single = canonical_get(get)
        if names is None:
            names, single = ("nngp", "ntk"), False
        if "pattern" in kwargs and kwargs["pattern"] is not None:
            raise ValueError("batched_kernel_fn: a per-point keyword (pattern) cannot be tiled; call kernel_fn "
                             "directly")
        x1 = np.asarray(x1)
        symmetric = x2 is None
        x2 = x1 if symmetric else np.asarray(x2)
        if x1.ndim < 2 or x2.ndim < 2:
            raise ValueError(f"batched_kernel_fn: inputs must be (batch, features...), got {x1.shape} and {x2.shape}")
        if x1.shape[1:] != x2.shape[1:]:
            raise ValueError(f"batched_kernel_fn: x1 {x1.shape} and x2 {x2.shape} differ beyond the batch axis")
        if x1.shape[0] == 0 or x2.shape[0] == 0:
            raise ValueError(f"batched_kernel_fn: inputs must hold at least one point, got {x1.shape} and {x2.shape}")
        store = None if path is None else _TileStore(path)
        try:
            return _tiles(store, x1, x2, symmetric, names, single, args, kwargs)
        finally:
            if store is not None:
                store.release()

    def _tiles(store, x1, x2, symmetric, names, single, args, kwargs):
        n1, n2 = x1.shape[0], x2.shape[0]
        b = batch_size
        if b is None and store is not None:
            b = store.stored_batch_size()
        if b is None:
            def sized(a, c, get):
                return kernel_fn(a, c, get, *args, **kwargs)

            b = _choose_batch_size(sized, x1, x2, names, max_memory_bytes, max(n1, n2))
        b1, b2 = min(b, n1), min(b, n2)
        t1, t2 = -(-n1 // b1), -(-n2 // b2)
        x1p = pad_to(x1, t1 * b1).reshape((t1, b1) + x1.shape[1:])
        x2p = pad_to(x2, t2 * b2).reshape((t2, b2) + x2.shape[1:])
        pairs = [(i, j) for i in range(t1) for j in range(t2) if not (symmetric and j < i)]
        # One tile's results, traced but not computed: the shapes and dtypes of the outputs, known before any tile.
        specs = jax.eval_shape(lambda a, c: one_tile(a, c, names, False, *args, **kwargs),
                               jax.ShapeDtypeStruct((b1,) + x1.shape[1:], x1.dtype),
                               jax.ShapeDtypeStruct((b2,) + x2.shape[1:], x2.dtype))
        tails = [tuple(s.shape[2:]) for s in specs]
        tile_dtypes = [np.dtype(s.dtype) for s in specs]
        shapes = [(n1, n2) + t for t in tails]
        dtypes = [d if out_dtype is None else out_dtype for d in tile_dtypes]

        def span(i, size, n):  # the rows of block i, cut at the last point
            return slice(i * size, min((i + 1) * size, n))

        def tile_pairs(i, j):
            r = min(b1, n1 - i * b1)
            return r * (r + 1) // 2 if symmetric and i == j else r * min(b2, n2 - j * b2)

        if store is None:
            outs = [np.empty(s, d) for s, d in zip(shapes, dtypes)]
            done = np.zeros((t1, t2), bool)
        else:
            fingerprint = {
                "x1": _array_fingerprint(x1),
                "x2": None if symmetric else _array_fingerprint(x2),
                "get": list(names),
                "batch_size": int(b),
                "tiles": {"rows": [b1, b2], "grid": [t1, t2], "symmetric": symmetric, "count": len(pairs),
                          "pairs": sum(tile_pairs(i, j) for i, j in pairs)},
                "arguments": _arguments_fingerprint(args, kwargs),
                "kernels": {n: {"file": f"{n}.npy", "shape": list(s), "dtype": str(d), "tile_dtype": str(td)}
                            for n, s, d, td in zip(names, shapes, dtypes, tile_dtypes)},
            }
            outs, done = store.open(fingerprint, names, shapes, dtypes, (t1, t2), devs)
        # The layout of the spatial axes, for mirroring: as asked, else read off the shape (interleaved pairs of
        # equal sizes, one per spatial axis of the inputs).
        diag_spatial = kwargs.get("diagonal_spatial")
        flats = [diag_spatial if diag_spatial is not None else
                 _reads_diagonal_spatial(np.empty((0, 0) + t), x1.ndim - 2) for t in tails]
        group = len(devs)

        def evaluate(self_pair, chunk):
            # Pad the last group by repeating a pair so every device has a tile.
            padded = chunk + [chunk[-1]] * (group - len(chunk))
            a = x1p[np.array([p[0] for p in padded])]
            c = x2p[np.array([p[1] for p in padded])]
            return [np.asarray(r) for r in tiles_fn(a, c, (names, self_pair) + tuple(args), kwargs)]

        if store is not None and store.resumed:
            first = next((p for p in pairs if done[p]), None)
            if first is not None:
                i, j = first
                r, c = span(i, b1, n1), span(j, b2, n2)
                start = time.perf_counter()
                fresh = [res[0][: r.stop - r.start, : c.stop - c.start]
                         for res in evaluate(symmetric and i == j, [first])]
                store.verify(first, names, fresh, [o[r, c] for o in outs], tile_dtypes, time.perf_counter() - start)
        # Groups of tiles: with x2 = None, the diagonal tiles form groups of their own (see one_tile).
        batches = []
        for self_pair in ((True, False) if symmetric else (False,)):
            todo = [p for p in pairs if not done[p] and (not symmetric or (p[0] == p[1]) == self_pair)]
            batches += [(self_pair, todo[s : s + group]) for s in range(0, len(todo), group)]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(pairs), initial=len(pairs) - sum(len(chunk) for _, chunk in batches),
                       desc="kernel tiles", unit="tile")
        session_pairs, session_seconds, kinds_run = 0, 0.0, set()
        try:
            for self_pair, chunk in batches:
                start = time.perf_counter()
                results = evaluate(self_pair, chunk)
                for out, res, flat in zip(outs, results, flats):
                    for g, (i, j) in enumerate(chunk):
                        r, c = span(i, b1, n1), span(j, b2, n2)
                        blk = res[g][: r.stop - r.start, : c.stop - c.start]
                        out[r, c] = blk
                        if symmetric and i != j:
                            out[c, r] = swap_pairs(blk, flat)
                n_pairs = sum(tile_pairs(i, j) for i, j in chunk)
                if store is not None:  # a group of a kind already run in this call is past its compilation
                    store.finish(chunk, n_pairs, start, steady=self_pair in kinds_run)
                kinds_run.add(self_pair)
                session_pairs += n_pairs
                session_seconds += time.perf_counter() - start
                if bar is not None:
                    bar.set_postfix_str(f"{session_pairs / session_seconds:.4g} pairs/s", refresh=False)
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
        if store is not None:
            outs = store.read_only()
        return pack(names, single, outs)

    return fn


class _OneTile:
    """``kernel_fn`` on one tile, returning the requested kernels as a tuple; equal for equal ``kernel_fn`` so that
    every `batched_kernel_fn` of one kernel function shares its compiled programs (`compiled_tile_fn`'s cache)."""

    __slots__ = ("kernel_fn",)

    def __init__(self, kernel_fn):
        self.kernel_fn = kernel_fn

    def __hash__(self):
        return hash((_OneTile, self.kernel_fn))

    def __eq__(self, other):
        return isinstance(other, _OneTile) and other.kernel_fn == self.kernel_fn

    def __call__(self, a, b, names, self_pair, *args, **kwargs):
        # A tile on the diagonal of a symmetric kernel is k(a, a): computed as kernel_fn(a, None), which is what
        # makes it the same as the unbatched kernel where a layer tells x2 = x1 apart (Dropout).
        out = self.kernel_fn(a, None if self_pair else b, names, *args, **kwargs)
        return tuple(getattr(out, n) for n in names)


# -- the store on disk of a resumable batched_kernel_fn ------------------------------------------------------------

_STORE_FORMAT = "smnngp.kernels.batched_kernel_fn tile store, version 1"
_MANIFEST, _DONE, _LOCK = "manifest.json", "done.npy", "lock"
# How close a tile computed again on resuming must be to the stored one, relative to the tile's largest entry, by
# the dtype the tiles are computed in (see batched_kernel_fn).
_VERIFY_RTOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}
_WORDS = {
    "x1": "x1",
    "x2": "x2",
    "get": "get (the kernels asked for)",
    "batch_size": "batch_size",
    "tiles": "tile layout",
    "arguments": "the other arguments of kernel_fn",
    "kernels": "the kernels' shapes or dtypes (out_dtype, or a kernel_fn with other outputs)",
}


def tile_store_info(path) -> dict:
    """What the resumable store of `batched_kernel_fn` at ``path`` holds and what computing it has cost, read from
    its ``manifest.json`` and ``done.npy`` (nothing is computed or locked; a store being written can be read).

    Pairs are counted once: ``N (N + 1) / 2`` for ``K(x, x)``, ``N1 N2`` otherwise; compute seconds are the wall
    time of the groups of tiles (evaluation, writing, flushing and marking; the first group's compilation
    included), summed over every session that computed tiles, so ``pairs_per_second`` is the honest rate of a
    kernel computed over several sessions however often it was interrupted. ``steady_pairs_per_second`` leaves
    out the first group of each kind of tile (on and off the diagonal of ``K(x, x)``) of every call, whose time
    holds the compilation of its program: the rate to project a longer run from.

    Args:
        path: the directory given to `batched_kernel_fn` as ``path``.

    Returns:
        A dict: ``fingerprint`` (inputs, settings and kernels, as recorded), ``tiles_total``, ``tiles_done``,
        ``complete``, ``pairs_total``, ``tiles_computed``, ``pairs_computed``, ``compute_seconds``,
        ``pairs_per_second`` (``pairs_computed / compute_seconds``, ``None`` before the first tile),
        ``steady_pairs_per_second`` (``None`` before a second group of one kind), ``sessions`` (per session that
        computed tiles: its start, devices, ``tiles``, ``pairs``, ``seconds``, ``steady_pairs``,
        ``steady_seconds`` and the ``verify_seconds`` of the tile computed again on resuming) and ``created``.

    Raises:
        ValueError: if ``path`` holds no store or a corrupt one.
    """
    path = os.path.abspath(os.fspath(path))
    manifest = _read_manifest(path)
    if manifest is None:
        raise ValueError(f"tile_store_info: {path} holds no {_MANIFEST}: not a store of batched_kernel_fn")
    fp, totals = manifest["fingerprint"], manifest["totals"]
    done_file = os.path.join(path, _DONE)
    done = _read_done(done_file, tuple(fp["tiles"]["grid"])) if os.path.exists(done_file) else None
    tiles_done = 0 if done is None else int(done.sum())
    seconds, steady = float(totals["compute_seconds"]), float(totals["steady_seconds"])
    return {
        "fingerprint": fp,
        "tiles_total": int(fp["tiles"]["count"]),
        "tiles_done": tiles_done,
        "complete": tiles_done == int(fp["tiles"]["count"]),
        "pairs_total": int(fp["tiles"]["pairs"]),
        "tiles_computed": int(totals["tiles_computed"]),
        "pairs_computed": int(totals["pairs_computed"]),
        "compute_seconds": seconds,
        "pairs_per_second": totals["pairs_computed"] / seconds if seconds > 0 else None,
        "steady_pairs_per_second": totals["steady_pairs"] / steady if steady > 0 else None,
        "sessions": manifest["sessions"],
        "created": manifest.get("created"),
    }


def _corrupt(path, what) -> ValueError:
    return ValueError(f"batched_kernel_fn: the tile store at {path} is corrupt ({what}); delete the directory to "
                      "compute the kernel again")


def _read_manifest(path):
    """The manifest of the store at ``path`` (a dict), or None when there is none; ValueError when corrupt."""
    file = os.path.join(path, _MANIFEST)
    if not os.path.exists(file):
        return None
    try:
        with open(file) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as err:
        raise _corrupt(path, f"{_MANIFEST} cannot be read: {err}") from err
    try:
        ok = (manifest["format"] == _STORE_FORMAT and isinstance(manifest["sessions"], list)
              and all(isinstance(manifest["totals"][k], (int, float))
                      for k in ("tiles_computed", "pairs_computed", "compute_seconds", "steady_pairs",
                                "steady_seconds"))
              and set(_WORDS) <= set(manifest["fingerprint"])
              and all(isinstance(manifest["fingerprint"]["tiles"][k], int) for k in ("count", "pairs"))
              and len(manifest["fingerprint"]["tiles"]["grid"]) == 2)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise _corrupt(path, f"{_MANIFEST} is not a manifest of this version of batched_kernel_fn")
    return manifest


def _read_done(file, grid):
    try:
        done = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise _corrupt(os.path.dirname(file), f"{_DONE} cannot be read: {err}") from err
    if done.dtype != np.bool_ or done.shape != tuple(grid):
        raise _corrupt(os.path.dirname(file), f"{_DONE} is {done.dtype} {done.shape}, not bool {tuple(grid)}")
    return done


def _replace_atomically(file, data: bytes) -> None:
    """Write ``file`` so that it is either the old or the new one whenever the process stops."""
    tmp = file + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, file)


def _npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _array_fingerprint(x) -> dict:
    x = np.ascontiguousarray(x)
    return {"shape": list(x.shape), "dtype": str(x.dtype),
            "sha256": hashlib.sha256(x.reshape(-1).view(np.uint8)).hexdigest()}


def _arguments_fingerprint(args, kwargs) -> dict:
    """The extra arguments of ``kernel_fn`` as `split_static` divides them: the static leaves by type and value
    (without the memory addresses of default reprs, which change from process to process), the arrays by
    fingerprint."""
    arrays, static = split_static((tuple(args), dict(kwargs)))

    def text(v):
        return re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(v).__name__}:{v!r}")

    return {"structure": re.sub(r" at 0x[0-9a-fA-F]+", "", str(static.treedef)),
            "static": [text(v) for v in static.values if v is not _TRACED],
            "arrays": [_array_fingerprint(np.asarray(a)) for a in arrays]}


def _differences(stored: dict, given: dict) -> list[str]:
    """What differs between two fingerprints, in words."""
    out = []
    for key in list(given) + [k for k in stored if k not in given]:
        a, b = stored.get(key), given.get(key)
        if a == b:
            continue
        if key in ("x1", "x2") and isinstance(a, dict) and isinstance(b, dict):
            for sub in ("shape", "dtype"):
                if a.get(sub) != b.get(sub):
                    out.append(f"{key} {sub}: stored {a.get(sub)}, given {b.get(sub)}")
            if a.get("shape") == b.get("shape") and a.get("dtype") == b.get("dtype"):
                out.append(f"{key}: other values (SHA-256 of the bytes differ)")
        elif key == "x2" and (a is None) != (b is None):
            out.append("x2: stored " + ("K(x, x), x2 None" if a is None else "K(x1, x2)") + ", given "
                       + ("x2 None" if b is None else "an x2"))
        else:
            out.append(f"{_WORDS.get(key, key)}: stored {a}, given {b}")
    return out


def _lock_directory(path):
    """An exclusive lock on ``path/lock`` (held by the open file; the system drops it when the process ends)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return None
    fh = open(os.path.join(path, _LOCK), "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        fh.close()
        raise RuntimeError(f"batched_kernel_fn: the tile store at {path} is being written by another process (it "
                           f"holds {os.path.join(path, _LOCK)}); one writer at a time") from err
    return fh


class _TileStore:
    """The directory of one resumable `batched_kernel_fn` kernel: checked and locked when made, opened (created or
    resumed) by `open`, advanced group by group by `finish`, unlocked by `release`."""

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"batched_kernel_fn: path {path} exists and is not a directory (a tile store is a "
                             "directory)")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            raise ValueError(f"batched_kernel_fn: cannot create the tile store directory {path}: {err}") from err
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"batched_kernel_fn: the tile store directory {path} is not writable")
        self._lock = _lock_directory(path)
        try:
            self.manifest = _read_manifest(path)
            if self.manifest is None:
                stray = sorted(f for f in os.listdir(path) if f != _LOCK and not f.endswith(".tmp"))
                if stray:
                    raise ValueError(f"batched_kernel_fn: {path} holds files but no {_MANIFEST} ({', '.join(stray[:5])}"
                                     f"{', ...' if len(stray) > 5 else ''}): it is not a tile store of "
                                     "batched_kernel_fn; give an empty or a new directory")
        except BaseException:
            self.release()
            raise
        self.resumed = False
        self.outs = self.done = self.files = None
        self.session = None

    def stored_batch_size(self):
        """The batch size of the stored kernel, or None when there is none yet."""
        if self.manifest is None:
            return None
        b = self.manifest["fingerprint"]["batch_size"]
        return b if isinstance(b, int) and b > 0 else None

    def _write_manifest(self):
        _replace_atomically(os.path.join(self.path, _MANIFEST),
                            json.dumps(self.manifest, indent=1).encode())

    def open(self, fingerprint, names, shapes, dtypes, grid, devs):
        """``(arrays, done)``: the kernels' writable memory maps and the record of finished tiles, the store
        created when new; ValueError when it holds a kernel of another fingerprint or is corrupt."""
        fingerprint = json.loads(json.dumps(fingerprint))
        # The manifest first: every other file of the store exists only beside one.
        if self.manifest is not None:
            diffs = _differences(self.manifest["fingerprint"], fingerprint)
            if diffs:
                raise ValueError(f"batched_kernel_fn: the tile store at {self.path} holds a kernel of other inputs "
                                 f"or settings: {'; '.join(diffs)}. Give another path, or delete it to start again")
        else:
            self.manifest = {"format": _STORE_FORMAT, "fingerprint": fingerprint,
                             "totals": {"tiles_computed": 0, "pairs_computed": 0, "compute_seconds": 0.0,
                                        "steady_pairs": 0, "steady_seconds": 0.0},
                             "sessions": [], "created": _now()}
            self._write_manifest()
        self.files = [os.path.join(self.path, f"{n}.npy") for n in names]
        done_file = os.path.join(self.path, _DONE)
        if os.path.exists(done_file):
            self.done = _read_done(done_file, grid)
            self.outs = []
            for file, shape, dtype in zip(self.files, shapes, dtypes):
                try:
                    out = np.load(file, mmap_mode="r+", allow_pickle=False)
                except (OSError, ValueError) as err:
                    raise _corrupt(self.path, f"{os.path.basename(file)} cannot be opened: {err}") from err
                if out.shape != tuple(shape) or out.dtype != dtype:
                    raise _corrupt(self.path, f"{os.path.basename(file)} is {out.dtype} {out.shape}, the manifest "
                                              f"says {dtype} {tuple(shape)}")
                self.outs.append(out)
            self.resumed = True
        else:  # new, or stopped before its first record of finished tiles: (re)made empty
            self.outs = [np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=tuple(shape))
                         for file, shape, dtype in zip(self.files, shapes, dtypes)]
            self.done = np.zeros(grid, bool)
            _replace_atomically(done_file, _npy_bytes(self.done))
        self.session = {"started": _now(), "devices": [str(d) for d in devs], "tiles": 0, "pairs": 0,
                        "seconds": 0.0, "steady_pairs": 0, "steady_seconds": 0.0, "verify_seconds": 0.0}
        return self.outs, self.done

    def verify(self, tile, names, fresh, stored, tile_dtypes, seconds):
        """Refuse a store whose tile ``tile``, computed again (``fresh``), is not the one stored."""
        self.session["verify_seconds"] += seconds
        for name, new, old, dtype in zip(names, fresh, stored, tile_dtypes):
            new, old = np.asarray(new, np.float64), np.asarray(old, np.float64)
            scale = float(np.max(np.abs(old))) if old.size else 0.0
            diff = float(np.max(np.abs(new - old))) if old.size else 0.0
            rtol = _VERIFY_RTOL.get(np.dtype(dtype), float(np.finfo(dtype).eps) ** 0.5)
            if not (math.isfinite(scale) and math.isfinite(diff)) or diff > rtol * scale:
                raise ValueError(
                    f"batched_kernel_fn: the tile store at {self.path} holds a kernel of another kernel_fn (another "
                    f"network or other hyperparameters) on the same inputs: its {name} tile {tuple(tile)}, computed "
                    f"again, differs from the stored one by {diff:.3g}, {diff / scale if scale else math.inf:.3g} of "
                    f"the tile's largest entry {scale:.3g} (tolerance {rtol:g}). Give another path, or delete it to "
                    "start again")

    def finish(self, chunk, n_pairs, start, steady=False):
        """After a group's blocks are written: flush them, mark the tiles done, account the time (in this order);
        ``steady``: not the first group of its kind in this call (no compilation in its time)."""
        for out in self.outs:
            out.flush()
        for p in chunk:
            self.done[p] = True
        _replace_atomically(os.path.join(self.path, _DONE), _npy_bytes(self.done))
        seconds = time.perf_counter() - start
        if self.session["tiles"] == 0:
            self.manifest["sessions"].append(self.session)
        totals = self.manifest["totals"]
        self.session["tiles"] += len(chunk)
        self.session["pairs"] += int(n_pairs)
        self.session["seconds"] += seconds
        totals["tiles_computed"] += len(chunk)
        totals["pairs_computed"] += int(n_pairs)
        totals["compute_seconds"] += seconds
        if steady:
            for record in (self.session, totals):
                record["steady_pairs"] += int(n_pairs)
                record["steady_seconds"] += seconds
        self._write_manifest()

    def read_only(self):
        """The finished kernels as read-only memory maps of their files."""
        for out in self.outs:
            out.flush()
        self.outs = None
        return [np.load(file, mmap_mode="r", allow_pickle=False) for file in self.files]

    def release(self):
        """Drop the lock (the memory maps close when their arrays are freed)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _reads_diagonal_spatial(block, spatial_ndim: int) -> bool:
    """Whether a kernel block's axes after the batch pair are single positions (not interleaved pairs), read off
    its shape when the caller did not say: pairs when there are two axes of equal size per spatial axis."""
    rest = np.ndim(block) - 2
    pairs = rest > 0 and rest == 2 * spatial_ndim and all(
        block.shape[2 + 2 * i] == block.shape[3 + 2 * i] for i in range(rest // 2))
    return not pairs


def diagonal(kernel_fn: Callable, x, get=("nngp", "ntk"), batch_size: int = 1024):
    """k(x_i, x_i) for every row of ``x`` in O(N) time and memory.

    Evaluates ``kernel_fn`` on each single point (vectorised with `vmap`, in
    chunks of ``batch_size``), so the result is exactly the diagonal of the full
    kernel matrix without forming it. Returns arrays of shape (N, ...) in the
    structure ``get`` asks for.
    """
    names, single = canonical_get(get)
    if names is None:
        names, single = ("nngp", "ntk"), False
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"diagonal: x must be (batch, features...), got shape {x.shape}")

    fn = _diagonal_fn(kernel_fn, names)
    chunks = [fn(x[s : s + batch_size]) for s in range(0, x.shape[0], batch_size)]
    return pack(names, single, (jnp.concatenate([c[i] for c in chunks]) for i in range(len(names))))


@functools.lru_cache(maxsize=64)
def _diagonal_fn(kernel_fn: Callable, names: tuple[str, ...]):
    """Jitted per-point kernel, cached so repeated `diagonal` calls do not retrace."""

    def one(point):
        out = kernel_fn(point[None], None, get=names)
        return tuple(getattr(out, n)[0, 0] for n in names)

    return jax.jit(jax.vmap(one))


# --------------------------------------------------------------------------------------------
# Kernels with trainable hyperparameters


class ParametricKernel(NamedTuple):
    """A kernel whose hyperparameters are a pytree: the contract shared by hyperparameter fitting
    (`smnngp.hyper`) and the variational posteriors (`smnngp.variational`).

    ``apply(theta, x1, x2)`` returns the (N1, N2) covariance matrix (``x2=None`` means ``x1``); it is
    ``jit``-able and differentiable in ``theta``, a pytree of *unconstrained* arrays (``apply`` maps them to
    positive scales itself, e.g. by softplus), so that optax can step on ``theta`` directly. ``theta`` is the
    initial value; ``constrain(theta)`` returns the user-facing (positive) values as a dict.
    """

    apply: Callable
    theta: Any
    constrain: Callable

    def __call__(self, x1, x2=None):
        """The kernel at the current ``theta`` (a plain ``k(x1, x2)``)."""
        return self.apply(self.theta, x1, x2)

    def with_theta(self, theta) -> ParametricKernel:
        """The same kernel at other hyperparameters."""
        return self._replace(theta=theta)


def softplus_inverse(y):
    """``x`` with ``softplus(x) = y`` for ``y > 0`` (stable for large ``y``).

    Args:
        y: positive number or array.

    Returns:
        JAX array of the shape of ``y``: ``y + log(1 - exp(-y))`` (not finite for ``y <= 0``).
    """
    y = jnp.asarray(y)
    return y + jnp.log(-jnp.expm1(-y))


def rbf(lengthscale=1.0, variance=1.0) -> ParametricKernel:
    """Squared-exponential kernel ``variance * exp(-|x1 - x2|^2 / (2 lengthscale^2))``.

    Inputs of any per-point shape are flattened. ``lengthscale`` may be a scalar or one value per
    feature (ARD). Both are kept positive by softplus; they must be positive and finite.

    Args:
        lengthscale: initial lengthscale, a positive scalar or an array with one value per flattened feature.
        variance: initial signal variance, a positive scalar.

    Returns:
        `ParametricKernel` with ``theta = {'lengthscale': ..., 'variance': ...}`` holding the softplus inverses
        of the initial values; ``apply(theta, x1, x2)`` returns the (N1, N2) kernel matrix in the dtype of the
        inputs and ``constrain(theta)`` the positive values.

    Raises:
        ValueError: if ``lengthscale`` or ``variance`` is not positive and finite.
    """
    ls = np.asarray(lengthscale, dtype=float)
    var = float(variance)
    if not (np.all(np.isfinite(ls)) and np.all(ls > 0)):
        raise ValueError(f"rbf: lengthscale must be positive and finite, got {lengthscale!r}")
    if not (math.isfinite(var) and var > 0):
        raise ValueError(f"rbf: variance must be positive and finite, got {variance!r}")
    theta = {"lengthscale": softplus_inverse(jnp.asarray(ls)), "variance": softplus_inverse(jnp.asarray(var))}

    def constrain(theta):
        return {k: jax.nn.softplus(v) for k, v in theta.items()}

    def apply(theta, x1, x2=None):
        p = constrain(theta)
        a = jnp.reshape(x1, (x1.shape[0], -1))
        b = a if x2 is None else jnp.reshape(x2, (x2.shape[0], -1))
        ls = p["lengthscale"].astype(a.dtype)
        ls = ls if ls.ndim == 0 else ls[None, :]  # one per feature: broadcast over the rows
        a, b = a / ls, b / ls
        sq = jnp.sum(a**2, 1)[:, None] + jnp.sum(b**2, 1)[None, :] - 2.0 * a @ b.T
        return p["variance"].astype(a.dtype) * jnp.exp(-0.5 * jnp.clip(sq, 0.0, None))

    return ParametricKernel(apply, theta, constrain)
