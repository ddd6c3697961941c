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
local devices with `jax.sharding`, and assembles the result in host memory;
`diagonal` evaluates k(x_i, x_i) alone in O(N).
"""

from __future__ import annotations

import dataclasses
import functools
import math
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
) -> Callable:
    """Wrap ``kernel_fn`` so that large inputs are evaluated tile by tile.

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

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get=...)`` to evaluate; it must return a named tuple of the requested
            kernels (as the kernels of :mod:`smnngp.stax` do).
        batch_size: rows per tile (a positive int), or ``None`` to choose it from ``max_memory_bytes``.
        max_memory_bytes: memory cap per tile in bytes when ``batch_size`` is ``None`` (positive; default 1 GiB).
        devices: devices over which the tiles are sharded; ``None`` means all local devices.
        progress: show a tqdm progress bar over the groups of tiles.

    Returns:
        Function ``fn(x1, x2=None, get=('nngp', 'ntk'))`` returning NumPy arrays of shape (N1, N2, ...): one
        array for a string ``get``, a named tuple for a tuple (``get=None`` means both kernels). It raises
        ValueError for inputs without a batch and a feature axis, or that differ beyond the batch axis.

    Raises:
        ValueError: if ``batch_size`` is not a positive integer or ``max_memory_bytes`` is not positive.
    """
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_memory_bytes <= 0:
        raise ValueError(f"max_memory_bytes must be positive, got {max_memory_bytes}")
    devs = list(jax.local_devices() if devices is None else devices)
    mesh = Mesh(np.array(devs), ("tiles",))
    tile_sharding = NamedSharding(mesh, PartitionSpec("tiles"))
    replicated = NamedSharding(mesh, PartitionSpec())

    def one_tile(a, b, names, self_pair, *args, **kwargs):
        # A tile on the diagonal of a symmetric kernel is k(a, a): computed as kernel_fn(a, None), which is what
        # makes it the same as the unbatched kernel where a layer tells x2 = x1 apart (Dropout).
        out = kernel_fn(a, None if self_pair else b, names, *args, **kwargs)
        return tuple(getattr(out, n) for n in names)

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
        n1, n2 = x1.shape[0], x2.shape[0]
        b = batch_size
        if b is None:
            def sized(a, c, get):
                return kernel_fn(a, c, get, *args, **kwargs)

            b = _choose_batch_size(sized, x1, x2, names, max_memory_bytes, max(n1, n2))
        b1, b2 = min(b, n1), min(b, n2)
        t1, t2 = -(-n1 // b1), -(-n2 // b2)
        x1p = pad_to(x1, t1 * b1).reshape((t1, b1) + x1.shape[1:])
        x2p = pad_to(x2, t2 * b2).reshape((t2, b2) + x2.shape[1:])
        pairs = [(i, j) for i in range(t1) for j in range(t2) if not (symmetric and j < i)]
        group = len(devs)
        outs = [None] * len(names)
        # The layout of the spatial axes, for mirroring: as asked, else read off the shape (interleaved pairs of
        # equal sizes, one per spatial axis of the inputs).
        diag_spatial = kwargs.get("diagonal_spatial")
        # Groups of tiles: with x2 = None, the diagonal tiles form groups of their own (see one_tile).
        batches = []
        for self_pair in ((True, False) if symmetric else (False,)):
            todo = [p for p in pairs if (p[0] == p[1]) == self_pair] if symmetric else pairs
            batches += [(self_pair, todo[s : s + group]) for s in range(0, len(todo), group)]
        iterator = batches
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, desc="kernel tiles", unit="group")
        for self_pair, chunk in iterator:
            # Pad the last group by repeating a pair so every device has a tile.
            padded = chunk + [chunk[-1]] * (group - len(chunk))
            a = x1p[np.array([p[0] for p in padded])]
            c = x2p[np.array([p[1] for p in padded])]
            results = [np.asarray(r) for r in tiles_fn(a, c, (names, self_pair) + tuple(args), kwargs)]
            for r_idx, res in enumerate(results):
                if outs[r_idx] is None:
                    tail = res.shape[3:]
                    outs[r_idx] = np.empty((t1 * b1, t2 * b2) + tail, dtype=res.dtype)
                for g, (i, j) in enumerate(chunk):
                    blk = res[g]
                    outs[r_idx][i * b1 : (i + 1) * b1, j * b2 : (j + 1) * b2] = blk
                    if symmetric and i != j:
                        flat = _reads_diagonal_spatial(blk, x1.ndim - 2) if diag_spatial is None else diag_spatial
                        outs[r_idx][j * b2 : (j + 1) * b2, i * b1 : (i + 1) * b1] = swap_pairs(blk, flat)
        return pack(names, single, (o[:n1, :n2] for o in outs))

    return fn


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
