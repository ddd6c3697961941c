"""Output-axis bookkeeping shared by the empirical kernels (neural-tangents 0.6.5's conventions).

An empirical kernel between outputs ``f1 = f(x1)`` and ``f2 = f(x2)`` (same number of axes ``d``) is laid
out "zipped": for each output axis ``i`` in order, a *traced* axis is summed over (``K = sum_i f1_i f2_i``)
and absent from the result, a *diagonal* axis appears once (``K_i = f1_i f2_i``), and any other axis appears
twice, as the pair ``(i of f1, i of f2)``. The result is divided by the product of the traced sizes.
Every kernel here is built with integer-labelled `jnp.einsum`, so this one labelling is the single source
of the convention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from smnngp._axes import canonical_axes

__all__ = []


class OutputLabels:
    """Einsum labels of the output axes of ``f(x1)`` and ``f(x2)`` and of the zipped kernel.

    Args:
        shape1: shape of one output leaf of ``f(x1)``.
        shape2: shape of the same leaf of ``f(x2)``.
        trace_axes: output axes summed over.
        diagonal_axes: output axes kept once.
        start: first free integer label.

    Raises:
        ValueError: if the leaves differ in rank, or in size along a traced or diagonal axis.
    """

    def __init__(self, shape1, shape2, trace_axes, diagonal_axes, start: int = 0):
        if len(shape1) != len(shape2):
            raise ValueError(f"empirical kernel: f(x1) and f(x2) have different ranks, {shape1} and {shape2}")
        d = len(shape1)
        self.trace = canonical_axes(trace_axes, d, "empirical kernel", "trace") if d else ()
        self.diag = canonical_axes(diagonal_axes, d, "empirical kernel", "diagonal") if d else ()
        both = set(self.trace) & set(self.diag)
        if both:
            raise ValueError(f"empirical kernel: axes {sorted(both)} are both traced and diagonal")
        self.l1, self.l2, self.out = [], [], []
        nxt = start
        for i in range(d):
            if i in self.trace or i in self.diag:
                if shape1[i] != shape2[i]:
                    raise ValueError(f"empirical kernel: f(x1) and f(x2) differ along traced/diagonal axis {i}: "
                                     f"{shape1} vs {shape2}")
                self.l1.append(nxt)
                self.l2.append(nxt)
                if i in self.diag:
                    self.out.append(nxt)
                nxt += 1
            else:
                self.l1.append(nxt)
                self.l2.append(nxt + 1)
                self.out += [nxt, nxt + 1]
                nxt += 2
        self.next = nxt
        self.size = int(np.prod([shape1[i] for i in self.trace], dtype=np.int64))
        self.shape = tuple(s for i in range(d) if i not in self.trace
                           for s in ((shape1[i],) if i in self.diag else (shape1[i], shape2[i])))

    def fresh(self, n: int) -> list[int]:
        """``n`` new labels, distinct from all used so far."""
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def pair_contract(a, b, trace_axes, diagonal_axes, n_out: int):
    """Zipped kernel of two arrays whose first ``n_out`` axes are output axes and the rest are summed over.

    ``K = sum_{traced, trailing} a[o1, t] b[o2, t] / |traced|`` with the zipped output layout.

    Args:
        a: array of shape ``out1 + rest``.
        b: array of shape ``out2 + rest``.
        trace_axes: output axes to trace.
        diagonal_axes: output axes to keep once.
        n_out: number of leading output axes.

    Returns:
        The zipped kernel.
    """
    lab = OutputLabels(a.shape[:n_out], b.shape[:n_out], trace_axes, diagonal_axes)
    rest = lab.fresh(a.ndim - n_out)
    k = jnp.einsum(a, lab.l1 + rest, b, lab.l2 + rest, lab.out, precision=jax.lax.Precision.HIGHEST)
    return k / lab.size


def trace_and_diagonal(full, n_out: int, trace_axes, diagonal_axes):
    """Zip a full kernel of shape ``out1 + out2`` (``n_out`` axes each), tracing and diagonalising axes."""
    lab = OutputLabels(full.shape[:n_out], full.shape[n_out:], trace_axes, diagonal_axes)
    return jnp.einsum(full, lab.l1 + lab.l2, lab.out) / lab.size


def same_inputs(x1, x2):
    """Traced boolean: whether two pytrees of arrays are equal (shapes and values)."""
    l1, t1 = jax.tree_util.tree_flatten(x1)
    l2, t2 = jax.tree_util.tree_flatten(x2)
    if t1 != t2 or any(jnp.shape(a) != jnp.shape(b) for a, b in zip(l1, l2)):
        return jnp.asarray(False)
    return jnp.all(jnp.asarray([jnp.array_equal(a, b) for a, b in zip(l1, l2)]))


def none_if_empty(x2):
    """``None`` for ``x2=None`` and for a pytree of ``None`` (``(None, None)`` for a network with two inputs,
    as neural-tangents accepts), else ``x2``."""
    return None if x2 is None or not jax.tree_util.tree_leaves(x2) else x2


def _leading(tree) -> int | None:
    """The leading size shared by a pytree's array leaves that can hold per-point values (not PRNG keys)."""
    leaves = jax.tree_util.tree_leaves(tree)
    sizes = set()
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if (dtype is None or jnp.ndim(leaf) == 0 or dtype == jnp.uint32
                or jnp.issubdtype(dtype, jax.dtypes.prng_key)):
            return None
        sizes.add(jnp.shape(leaf)[0])
    return sizes.pop() if len(sizes) == 1 else None


def tile_kwargs(kwargs: dict, rows, cols, n1: int, n2: int) -> dict:
    """Keyword arguments of a kernel function cut to the tile of points ``rows`` of x1 and ``cols`` of x2.

    A per-point value is a 2-tuple ``(for x1, for x2)`` whose first element has ``n1`` leading entries and whose
    second has ``n2`` (or is ``None``), as neural-tangents' ``pattern=(pattern1, pattern2)``; each side is
    sliced. Any other value (parameters, keys, flags) is passed unchanged.
    """
    out = {}
    for name, v in kwargs.items():
        if (isinstance(v, tuple | list) and len(v) == 2 and _leading(v[0]) == n1
                and (v[1] is None or _leading(v[1]) == n2)):
            a = jax.tree_util.tree_map(lambda t: t[rows[0]:rows[1]], v[0])
            b = None if v[1] is None else jax.tree_util.tree_map(lambda t: t[cols[0]:cols[1]], v[1])
            out[name] = (a, b)
        else:
            out[name] = v
    return out


def symmetric_kwargs(kwargs: dict) -> bool:
    """Whether every per-point keyword pair ``(for x1, for x2)`` gives x2 what it gives x1 (the same object, or
    ``None``): then the kernel of ``x`` against itself is symmetric, and a tile below the diagonal is the mirror
    image of one above it."""
    return all(not (isinstance(v, tuple | list) and len(v) == 2) or v[1] is None or v[1] is v[0]
               for v in kwargs.values())


def flip_pairs(a, diagonal_spatial: bool = False):
    """A kernel array of interleaved ``(x1, x2)`` axes, batch pair first, as the kernel of x2 against x1: the
    batch pair swapped, and every later pair too unless ``diagonal_spatial`` (then the later axes are single)."""
    if a is None or jnp.ndim(a) < 2:
        return a
    order = [1, 0] + list(range(2, a.ndim))
    if not diagonal_spatial:
        for s in range(2, a.ndim - 1, 2):
            order[s], order[s + 1] = s + 1, s
    return jnp.transpose(a, order)


def split_kwargs(kwargs: dict, x1, x2):
    """The keyword arguments of ``f`` on ``x1`` and on ``x2``.

    A 2-tuple value gives one element to each side; an ``rng`` key gives ``key`` to ``x1`` and to ``x2``
    the same key when ``x2`` equals ``x1`` (or is ``None``), else ``fold_in(key, 1)``, so that equal inputs
    see equal dropout masks; a pair of keys ``(k1, k2)`` is used as given except that ``k2`` becomes ``k1``
    when the inputs are equal and ``fold_in(k2, 1)`` when ``k1 == k2`` but the inputs differ. Any other value
    is passed to both.
    """
    k1, k2 = {}, {}
    for name, v in kwargs.items():
        if name == "rng" and x2 is not None and v is not None:
            same = same_inputs(x1, x2)
            if isinstance(v, tuple) and len(v) == 2:
                a, b = v
                b = jnp.where(same_inputs(a, b), jax.random.fold_in(b, 1), b)
                k1[name], k2[name] = a, jnp.where(same, a, b)
            else:
                k1[name], k2[name] = v, jnp.where(same, v, jax.random.fold_in(v, 1))
        elif isinstance(v, tuple) and len(v) == 2:
            k1[name], k2[name] = v
        else:
            k1[name] = k2[name] = v
    return k1, k2


def _like(axis, tree):
    """``axis`` with its lists and tuples turned into the containers of ``tree`` where the lengths agree (a
    network's parallel outputs come as a list, its inputs and their axes are often written as tuples)."""
    if isinstance(axis, list | tuple) and isinstance(tree, list | tuple) and len(axis) == len(tree):
        items = [_like(a, t) for a, t in zip(axis, tree)]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return axis


def canonical_vmap_axes(vmap_axes, x, fx, kwargs):
    """``(x_axis, fx_axis, kw_axes)`` from ``vmap_axes`` (an int, ``None``, or such a triple), as pytrees.

    An int axis applies to every leaf; axes are made non-negative. Returns ``(None, None, {})`` for ``None``.
    """
    if isinstance(vmap_axes, tuple) and len(vmap_axes) == 3:
        x_axis, fx_axis, kw_axes = vmap_axes
    else:
        x_axis, fx_axis, kw_axes = vmap_axes, vmap_axes, {}
    kw_axes = {} if kw_axes is None else kw_axes

    def per_leaf(axis, tree):
        if axis is None:
            return None
        if isinstance(axis, (int, np.integer)):
            axis = jax.tree_util.tree_map(lambda _: int(axis), tree)
        axis = _like(axis, tree)
        return jax.tree_util.tree_map(lambda a, t: int(a) % max(len(jnp.shape(t)), 1), axis, tree)

    if isinstance(kw_axes, (int, np.integer)):
        kw_axes = {k: kw_axes for k in kwargs}
    kw_axes = {k: per_leaf(a, kwargs[k]) for k, a in kw_axes.items() if k in kwargs}
    return per_leaf(x_axis, x), per_leaf(fx_axis, fx), kw_axes


def expand(tree, axes):
    """Insert a size-1 axis into every leaf of ``tree`` at its entry of ``axes`` (a matching pytree)."""
    if axes is None or tree is None:
        return tree
    return jax.tree_util.tree_map(lambda t, a: jnp.expand_dims(t, a), tree, axes)


def squeeze(tree, axes):
    """Remove the size-1 axis of every leaf of ``tree`` at its entry of ``axes``."""
    if axes is None:
        return tree
    return jax.tree_util.tree_map(lambda t, a: jnp.squeeze(t, a), tree, axes)


def move_example_axis(tree, axes):
    """Move the leading (vmapped example) axis of every leaf to its entry of ``axes``."""
    return jax.tree_util.tree_map(lambda t, a: jnp.moveaxis(t, 0, a), tree, axes)


def std_basis(shape, dtype):
    """The identity on arrays of ``shape``: an array of shape ``(size,) + shape``."""
    size = int(np.prod(shape, dtype=np.int64))
    return jnp.eye(size, dtype=dtype).reshape((size,) + tuple(shape))
