"""Graph layers: `Aggregate` (pattern-based neighbourhood aggregation, Du et al. 2019, "Graph Neural Tangent
Kernel").

A graph network holds one feature vector per node; the nodes are the positions of one or more spatial axes
of the activations (N, X_1, ..., X_S, C). An aggregation replaces every node's features by the weighted sum of
those of its predecessors:

    y[n, j, c] = sum_i A[n, i, j] x[n, i, c],

with ``A[n]`` the (weighted) adjacency of graph ``n`` (``A[n, i, j]`` is the weight of the arc i -> j). The
map is linear and acts on node axes only, so in the infinite-width limit the NNGP and the NTK transform alike:

    K'(x_a, x_b)[j, j'] = sum_{i, i'} A_a[i, j] K(x_a, x_b)[i, i'] A_b[i', j'],

i.e. ``K'[a, b] = A_a^T K[a, b] A_b`` for every pair of inputs, and every variance ``cov(x_a)`` by
``A_a^T cov(x_a) A_a``. Two storage formats of ``A`` are supported, with the same numbers:

* ``"DENSE"``: ``A`` as an array (N, X_i1..X_iK, X_i1..X_iK), a matrix product (O(V^2) memory, O(V^3) time);
* ``"SPARSE"``: ``A`` as integer edge lists (N, E, K, 2) of (tail, head) node coordinates, each edge of weight
  1 (repeated edges add up), and sums over edges by `jax.ops.segment_sum` (O(V E) time for the kernel, never an
  (V, V) adjacency matrix). An edge with a negative coordinate is padding and is dropped.
"""

from __future__ import annotations

import enum
import math
import string
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import Layer, _is_concrete, _single_shape, self_covariances, to_canonical

__all__ = ["Aggregate", "AggregateImplementation"]


class AggregateImplementation(enum.Enum):
    """How `Aggregate` receives its graphs: ``DENSE`` adjacency arrays or ``SPARSE`` edge lists.

    Either member (or its value, the string) may be passed as ``Aggregate(implementation=...)``.
    """

    DENSE = "DENSE"
    SPARSE = "SPARSE"


_IMPLEMENTATIONS = ("DENSE", "SPARSE")
_HIGHEST = lax.Precision.HIGHEST


def _identity(p):
    return p


def Aggregate(
    aggregate_axis: int | Sequence[int] | None = None,
    batch_axis: int = 0,
    channel_axis: int = -1,
    to_dense: Callable | None = _identity,
    implementation: str = "DENSE",
) -> Layer:
    """Aggregation over the arcs of a graph: y[n, j] = sum_i A[n, i, j] x[n, i] (graph neural networks).

    The nodes of a graph are the positions of the ``aggregate_axis`` axes (all axes other than the batch and
    channel axes when ``None``); several axes make one node per tuple of positions, and axes not aggregated
    are processed independently. The adjacency of each input comes with the call, as the keyword ``pattern``
    of ``apply_fn(params, x, pattern=A)`` and ``pattern=(A1, A2)`` of ``kernel_fn(x1, x2, pattern=(A1, A2))``
    (one pattern per batch of inputs; with ``x2=None`` pass ``(A1, A1)``). ``pattern=None`` (or
    ``(None, None)``) is the identity adjacency: the layer passes its input through unchanged.

    Kernel (both implementations): K'[a, b] = A1[a]^T K[a, b] A2[b] over the node axes of the all-pairs
    covariances, the same map for the NNGP and the NTK, and cov1[a] -> A1[a]^T cov1[a] A1[a] (cov2 with A2).

    Pattern formats (K = number of aggregated axes, X_i1..X_iK their sizes, V their product):

    * ``implementation="DENSE"``: ``to_dense(pattern)`` is a float array (N, X_i1..X_iK, X_i1..X_iK) whose
      entry [n, i, j] is the weight of the arc from tail node i to head node j of graph n; ``to_dense``
      (identity by default) decodes any other format on the fly.
    * ``implementation="SPARSE"``: an integer array (N, E, K, 2) (or (N, E, 2) when K = 1) listing E arcs of
      weight 1 per graph, the trailing axis holding (tail, head) coordinates; repeated arcs add their weights,
      and an arc with any negative coordinate is padding (dropped), so that graphs of one batch may have
      different numbers of edges. The kernel sums over edges with `jax.ops.segment_sum` in O(V E (N1 N2))
      time and never forms a (V, V) adjacency.

    Args:
        aggregate_axis: axis or axes of the inputs (in their own layout) holding the graph's nodes; ``None``
            (default) means every axis except the batch and channel axes.
        batch_axis: batch axis of the inputs (default 0).
        channel_axis: channel axis of the inputs (default -1); infinite for the kernel.
        to_dense: with ``"DENSE"``, a function that turns the given ``pattern`` into the dense array described
            above, called on every pattern at every call; identity by default (``None`` also means identity).
            Ignored with ``"SPARSE"``.
        implementation: ``"DENSE"`` (default; matrix products, for dense graphs) or ``"SPARSE"`` (segment
            sums over edge lists, for graphs with E of the order of V), case-insensitive, or an
            `AggregateImplementation` member.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters whose output has the shape of its input;
        its kernel tracks the covariances of all pairs of positions.

    Raises:
        ValueError: if ``implementation`` is unknown, ``batch_axis`` equals ``channel_axis``, or (when the
            input shape is known) ``aggregate_axis`` is out of range or names the batch or channel axis; at
            call time, if a pattern has the wrong shape or dtype, a sparse pattern has an edge outside the
            graph (when concrete), or a pattern is given for inputs without node axes.
        NotImplementedError: if exactly one of ``pattern1``, ``pattern2`` is ``None``.
    """
    impl = str(getattr(implementation, "value", implementation)).upper()
    if impl not in _IMPLEMENTATIONS:
        raise ValueError(f"Aggregate: implementation must be 'DENSE' or 'SPARSE', got {implementation!r}")
    if aggregate_axis is None:
        agg_spec = None
    elif isinstance(aggregate_axis, (int, np.integer)):
        agg_spec = (int(aggregate_axis),)
    else:
        agg_spec = tuple(aggregate_axis)
        if not all(isinstance(a, (int, np.integer)) for a in agg_spec):
            raise ValueError(f"Aggregate: aggregate_axis must be None, an int or a sequence of ints, "
                             f"got {aggregate_axis!r}")
        agg_spec = tuple(int(a) for a in agg_spec)
    batch_axis, channel_axis = int(batch_axis), int(channel_axis)
    decode = _identity if to_dense is None else to_dense
    layer = f"Aggregate(aggregate_axis={aggregate_axis!r}, implementation={impl!r})"
    layout = None if (batch_axis, channel_axis) == (0, -1) else (batch_axis, channel_axis)

    def axes(ndim: int):
        """(batch axis, channel axis, aggregated axes) of inputs of rank ``ndim``, all non-negative, sorted."""
        b, c = batch_axis % ndim, channel_axis % ndim
        if b == c:
            raise ValueError(f"{layer}: batch_axis {batch_axis} and channel_axis {channel_axis} are the same axis "
                             f"of inputs of rank {ndim}")
        if agg_spec is None:
            return b, c, tuple(i for i in range(ndim) if i not in (b, c))
        agg = set()
        for a in agg_spec:
            if not -ndim <= a < ndim:
                raise ValueError(f"{layer}: aggregate_axis {a} is out of range for inputs of rank {ndim}")
            if a % ndim in (b, c):
                which = "batch" if a % ndim == b else "channel"
                raise ValueError(f"{layer}: aggregate_axis {a} is the {which} axis; aggregation runs over the "
                                 f"spatial (node) axes only")
            agg.add(a % ndim)
        return b, c, tuple(sorted(agg))

    def canonical_agg(ndim: int):
        """Positions of the aggregated axes among the spatial axes of the canonical layout (N, spatial, C)."""
        b, c, agg = axes(ndim)
        rest = [i for i in range(ndim) if i not in (b, c)]
        return tuple(rest.index(a) for a in agg)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        axes(len(shape))
        return shape

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def node_axes(cshape, what: str):
        """Spatial indices and sizes of the aggregated axes of canonical shape ``cshape``; raises without any."""
        spatial = canonical_agg(len(cshape))
        if not spatial:
            raise ValueError(f"{layer}: {what} given for inputs of shape {tuple(cshape)} that have no node axes "
                             f"(no axis besides batch and channel) to aggregate over")
        return spatial, tuple(cshape[1 + s] for s in spatial)

    def dense_pattern(p, n_batch: int, sizes, dtype, what: str):
        p = jnp.asarray(decode(p))
        want = (n_batch,) + tuple(sizes) * 2
        if tuple(p.shape) != want:
            raise ValueError(f"{layer}: {what} must have shape {want} (batch, then the aggregated axes as tails, "
                             f"then as heads), got {tuple(p.shape)}")
        return p.astype(dtype)

    def sparse_pattern(p, n_batch: int, sizes, what: str):
        """Flat (tail, head) node ids (N, E) of each edge; padding edges get tail 0 and head V (dropped)."""
        p = jnp.asarray(p)
        k = len(sizes)
        if not jnp.issubdtype(p.dtype, jnp.integer):
            raise ValueError(f"{layer}: {what} of a SPARSE aggregation must be an integer edge list, "
                             f"got dtype {p.dtype}")
        if k == 1 and p.ndim == 3:
            p = p[:, :, None, :]
        if p.ndim != 4 or p.shape[0] != n_batch or p.shape[2] != k or p.shape[3] != 2:
            extra = " or (batch, n_edges, 2)" if k == 1 else ""
            raise ValueError(f"{layer}: {what} must have shape (batch={n_batch}, n_edges, {k}, 2){extra} "
                             f"(tail and head coordinates of each edge), got {tuple(p.shape)}")
        size = jnp.asarray(sizes, p.dtype)[:, None]
        if _is_concrete(p):
            arr = np.asarray(p)
            over = arr >= np.asarray(sizes)[:, None]
            if over.any():
                n, e, ax, end = (int(i[0]) for i in np.nonzero(over))
                raise ValueError(f"{layer}: edge {e} of graph {n} in {what} has {('tail', 'head')[end]} coordinate "
                                 f"{int(arr[n, e, ax, end])} on aggregated axis {ax}, outside 0..{sizes[ax] - 1}")
        valid = jnp.all((p >= 0) & (p < size[None, None]), axis=(2, 3))
        strides = np.array([math.prod(sizes[i + 1:]) for i in range(k)], dtype=np.int64)
        flat = jnp.einsum("neks,k->nes", p.astype(jnp.int32), jnp.asarray(strides, jnp.int32))
        n_nodes = math.prod(sizes)
        tails = jnp.where(valid, flat[..., 0], 0)
        heads = jnp.where(valid, flat[..., 1], n_nodes)
        return tails, heads

    # -- finite network -------------------------------------------------------------------------------------

    def apply_fn(params, x, *, pattern=None, **kwargs):
        shape_fn(tuple(x.shape))
        if pattern is None:
            return x
        ndim = x.ndim
        b, c, _ = axes(ndim)
        xc = to_canonical(x, layout)
        spatial, sizes = node_axes(xc.shape, "a pattern")
        n = xc.shape[0]
        if impl == "DENSE":
            p = dense_pattern(pattern, n, sizes, xc.dtype, "pattern")
            out = _dense_nodes(xc, p, spatial)
        else:
            tails, heads = sparse_pattern(pattern, n, sizes, "pattern")
            out = _sparse_nodes(xc, tails, heads, spatial)
        if layout is None:
            return out
        return jnp.moveaxis(out, (0, ndim - 1), (b, c))

    # -- kernel -------------------------------------------------------------------------------------------------

    def kernel_map(k: Kernel, pattern=None, **kwargs) -> Kernel:
        if pattern is None:
            return k
        if not isinstance(pattern, (tuple, list)) or len(pattern) != 2:
            raise ValueError(f"{layer}: kernel_fn takes pattern=(pattern1, pattern2), one pattern per batch of "
                             f"inputs, got {type(pattern).__name__}")
        p1, p2 = pattern
        if p1 is None and p2 is None:
            return k
        if p1 is None or p2 is None:
            raise NotImplementedError(f"{layer}: exactly one of pattern1, pattern2 is None; give both (the "
                                      f"identity adjacency as an explicit pattern) or neither")
        spatial, sizes = node_axes(k.shape1, "pattern")
        n1, n2 = k.shape1[0], k.shape2[0]
        dtype = k.nngp.dtype
        if impl == "DENSE":
            a1 = dense_pattern(p1, n1, sizes, dtype, "pattern1")
            a2 = dense_pattern(p2, n2, sizes, dtype, "pattern2")

            def pair(mat):
                return _dense_pairs(mat, a1, a2, spatial, 2)

            def self1(mat):
                return _dense_pairs(mat, a1, a1, spatial, 1)

            def self2(mat):
                return _dense_pairs(mat, a2, a2, spatial, 1)
        else:
            t1, h1 = sparse_pattern(p1, n1, sizes, "pattern1")
            t2, h2 = sparse_pattern(p2, n2, sizes, "pattern2")

            def pair(mat):
                return _sparse_pairs(mat, (t1, h1), (t2, h2), spatial, sizes, 2)

            def self1(mat):
                return _sparse_pairs(mat, (t1, h1), (t1, h1), spatial, sizes, 1)

            def self2(mat):
                return _sparse_pairs(mat, (t2, h2), (t2, h2), spatial, sizes, 1)

        def maybe(fn, mat):
            return mat if mat is None or jnp.ndim(mat) == 0 else fn(mat)

        nngp = pair(k.nngp)
        cov1 = self_covariances(k, nngp)  # x2 is x1: read off the new nngp
        if cov1 is not None:
            return k.replace(nngp=nngp, ntk=maybe(pair, k.ntk), cov1=cov1)
        return k.replace(nngp=nngp, ntk=maybe(pair, k.ntk), cov1=maybe(self1, k.cov1),
                         cov2=maybe(self2, k.cov2))

    def needs_full(out_full: bool) -> bool:
        return True

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, needs_full, True, layout,
                 masking.MaskRule(remask=True), means=_flow.ZERO_PRESERVING)


# ---------------------------------------------------------------------------------------------------------------
# The linear maps, on canonical arrays
# ---------------------------------------------------------------------------------------------------------------


def _dense_nodes(x, p, spatial):
    """y[n, j, c] = sum_i p[n, i, j] x[n, i, c] over the aggregated axes ``spatial`` of x (N, spatial..., C)."""
    letters = iter(string.ascii_letters)
    n = next(letters)
    sub = [next(letters) for _ in range(x.ndim - 2)]
    ch = next(letters)
    heads = {s: next(letters) for s in spatial}
    out = [heads.get(i, l) for i, l in enumerate(sub)]
    p_sub = n + "".join(sub[s] for s in spatial) + "".join(heads[s] for s in spatial)
    eq = f"{n}{''.join(sub)}{ch},{p_sub}->{n}{''.join(out)}{ch}"
    return jnp.einsum(eq, x, p, precision=_HIGHEST)


def _dense_pairs(mat, p1, p2, spatial, batch_ndim: int):
    """A1[a]^T M[a, b] A2[b] over the aggregated axes of an all-pairs covariance.

    ``mat`` is (N1, N2, X_1, X_1', ..., X_S, X_S') for ``batch_ndim=2`` or (N1, X_1, X_1', ...) with
    ``batch_ndim=1`` (then p1 and p2 are the same graphs); M'[.., j, j'] = sum_{i,i'} p1[a, i, j] M[.., i, i']
    p2[b, i', j'] with i, j ranging over the tuples of aggregated positions.
    """
    letters = iter(string.ascii_letters)
    a = next(letters)
    b = next(letters) if batch_ndim == 2 else a
    n_spatial = (mat.ndim - batch_ndim) // 2
    left = [next(letters) for _ in range(n_spatial)]
    right = [next(letters) for _ in range(n_spatial)]
    head_l = {s: next(letters) for s in spatial}
    head_r = {s: next(letters) for s in spatial}
    batch = a + (b if batch_ndim == 2 else "")
    m_sub = batch + "".join(left[i] + right[i] for i in range(n_spatial))
    o_sub = batch + "".join(head_l.get(i, left[i]) + head_r.get(i, right[i]) for i in range(n_spatial))
    p1_sub = a + "".join(left[s] for s in spatial) + "".join(head_l[s] for s in spatial)
    p2_sub = b + "".join(right[s] for s in spatial) + "".join(head_r[s] for s in spatial)
    # Two matrix products, left then right, each O(V^3) per pair of inputs.
    mid = batch + "".join(head_l.get(i, left[i]) + right[i] for i in range(n_spatial))
    half = jnp.einsum(f"{p1_sub},{m_sub}->{mid}", p1, mat, precision=_HIGHEST)
    return jnp.einsum(f"{mid},{p2_sub}->{o_sub}", half, p2, precision=_HIGHEST)


def _segment_rows(m, tails, heads, n_nodes: int):
    """R[j, ...] = sum over edges e with head j of m[tail_e, ...] (heads equal to ``n_nodes`` are dropped)."""
    return jax.ops.segment_sum(m[tails], heads, num_segments=n_nodes)


def _sparse_pairs(mat, g1, g2, spatial, sizes, batch_ndim: int):
    """The kernel map of `_dense_pairs` from edge lists, by segment sums over edges (no (V, V) adjacency).

    For one pair of inputs with the aggregated axes flattened to V nodes and the rest to R, M (V, V, R):
    M1[j, i'] = sum_{e in E1: head_e = j} M[tail_e, i'] (rows), then M'[j, j'] = sum_{f in E2: head_f = j'}
    M1[j, tail_f] (columns): O(V (E1 + E2) R) operations per pair.
    """
    (t1, h1), (t2, h2) = g1, g2
    n_spatial = (mat.ndim - batch_ndim) // 2
    n_nodes = math.prod(sizes)
    lead = list(range(batch_ndim))
    first = [batch_ndim + 2 * s for s in spatial]
    second = [batch_ndim + 2 * s + 1 for s in spatial]
    rest = [batch_ndim + i for i in range(2 * n_spatial) if batch_ndim + i not in first + second]
    perm = lead + first + second + rest
    moved = jnp.transpose(mat, perm)
    moved_shape = moved.shape
    flat = moved.reshape(moved_shape[:batch_ndim] + (n_nodes, n_nodes, -1))

    def one_pair(m, ta, ha, tb, hb):
        m = _segment_rows(m, ta, ha, n_nodes)
        m = _segment_rows(jnp.swapaxes(m, 0, 1), tb, hb, n_nodes)
        return jnp.swapaxes(m, 0, 1)

    if batch_ndim == 2:
        over_b = jax.vmap(one_pair, in_axes=(0, None, None, 0, 0))
        out = jax.vmap(over_b, in_axes=(0, 0, 0, None, None))(flat, t1, h1, t2, h2)
    else:
        out = jax.vmap(one_pair)(flat, t1, h1, t2, h2)
    out = out.reshape(moved_shape)
    return jnp.transpose(out, np.argsort(perm))


def _sparse_nodes(x, tails, heads, spatial):
    """y[n, j, c] = sum over edges e of graph n with head j of x[n, tail_e, c], for x (N, spatial..., C)."""
    sizes = tuple(x.shape[1 + s] for s in spatial)
    n_nodes = math.prod(sizes)
    agg = [1 + s for s in spatial]
    perm = [0] + agg + [i for i in range(1, x.ndim) if i not in agg]
    moved = jnp.transpose(x, perm)
    flat = moved.reshape((x.shape[0], n_nodes, -1))
    out = jax.vmap(lambda m, t, h: _segment_rows(m, t, h, n_nodes))(flat, tails, heads)
    return jnp.transpose(out.reshape(moved.shape), np.argsort(perm))

