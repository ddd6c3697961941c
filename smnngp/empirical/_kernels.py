"""Empirical NNGP and NTK of any JAX function ``f(params, x, **kwargs)``, with neural-tangents 0.6.5's API.

For one draw of the parameters ``theta`` the empirical kernels are

* NNGP: ``K(x1, x2) = f(theta, x1) f(theta, x2)^T``;
* NTK: ``Theta(x1, x2) = J(x1) J(x2)^T`` with ``J(x) = d f(theta, x) / d theta`` summed over every parameter
  leaf, ``Theta = sum_w J_w(x1) J_w(x2)^T``.

Both are laid out as ``zip(f(x1).shape, f(x2).shape)`` with ``trace_axes`` summed over (and divided by their
size) and ``diagonal_axes`` kept once (see `smnngp.empirical._axes`). For a pytree-valued ``f`` each output
leaf gets its own kernel (cross-covariances between leaves are not computed), as in neural-tangents.

Three exact NTK algorithms (Novak, Sohl-Dickstein and Schoenholz, "Fast Finite Width Neural Tangent Kernel",
ICML 2022) are offered; they agree to rounding:

* Jacobian contraction: ``J_w(x)`` by reverse mode for every leaf ``w``, then ``sum_w J_w(x1) . J_w(x2)``;
* NTK-vector products: the columns ``Theta e_j = J(x1) [J(x2)^T e_j]`` as one VJP and one JVP per output
  basis vector ``e_j`` of ``f(x2)``, so no Jacobian is ever held;
* structured derivatives (`smnngp.empirical._structured`): ``J_w = (df/dy)(dy/dw)`` for the primitive ``y``
  that consumes ``w``, contracted without forming ``J_w`` when ``dy/dw`` has known structure.
"""

from __future__ import annotations

import collections
import enum
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.empirical import _axes
from smnngp.empirical._setup import _out_leaves_and_axes, _Setup
from smnngp.empirical._structured import structured_derivatives_ntk_fn

__all__ = [
    "NtkImplementation",
    "DEFAULT_NTK_IMPLEMENTATION",
    "empirical_nngp_fn",
    "empirical_ntk_fn",
    "empirical_kernel_fn",
    "empirical_ntk_vp_fn",
    "linearize",
    "taylor_expand",
]


class NtkImplementation(enum.IntEnum):
    """How the empirical NTK is computed; the integer values are neural-tangents 0.6.5's.

    Attributes:
        AUTO: ``0``: lower the three exact methods for the given shapes and run the one whose XLA cost
            analysis reports the fewest floating-point operations (decided once per input shapes and cached).
        JACOBIAN_CONTRACTION: ``1`` (default): reverse-mode Jacobians per parameter leaf, contracted leaf by
            leaf, ``Theta = sum_w J_w(x1) J_w(x2)^T``.
        NTK_VECTOR_PRODUCTS: ``2``: one VJP and one JVP per output component of ``f(x2)``,
            ``Theta e_j = J(x1) (J(x2)^T e_j)``; cheap when parameters are many and the forward pass is cheap.
        STRUCTURED_DERIVATIVES: ``3``: primitive-level rules that contract ``(df/dy)(dy/dw)`` without forming
            ``dy/dw`` for ``dot_general`` and ``conv_general_dilated`` (see
            `smnngp.empirical._structured`).
    """

    AUTO = 0
    JACOBIAN_CONTRACTION = 1
    NTK_VECTOR_PRODUCTS = 2
    STRUCTURED_DERIVATIVES = 3


DEFAULT_NTK_IMPLEMENTATION = NtkImplementation.JACOBIAN_CONTRACTION


# ----------------------------------------------------------------------------------------------- linearisation


def _tree_sub(a, b):
    return jax.tree_util.tree_map(lambda u, v: u - v, a, b)


def _tree_add(a, b):
    return jax.tree_util.tree_map(lambda u, v: u + v, a, b)


def linearize(f: Callable, params) -> Callable:
    """First-order Taylor expansion of ``f`` in its parameters around ``params``.

    ``f_lin(p, *args) = f(params, *args) + J(params) (p - params)``, one JVP per call.

    Args:
        f: function ``f(params, *args, **kwargs)`` returning a pytree of arrays.
        params: the expansion point (a pytree).

    Returns:
        ``f_lin(p, *args, **kwargs)`` with the signature of ``f``.
    """

    def f_lin(p, *args, **kwargs):
        fx, df = jax.jvp(lambda q: f(q, *args, **kwargs), (params,), (_tree_sub(p, params),))
        return _tree_add(fx, df)

    return f_lin


def taylor_expand(f: Callable, params, degree: int) -> Callable:
    """Taylor expansion of ``f`` of order ``degree`` in its parameters around ``params``.

    ``f_T(p) = sum_{k=0}^{degree} D^k f(params)[dp, ..., dp] / k!`` with ``dp = p - params``; the ``k``-th
    directional derivative is ``k`` nested JVPs along ``dp``.

    Args:
        f: function ``f(params, *args, **kwargs)`` returning a pytree of arrays.
        params: the expansion point.
        degree: order of the expansion (a non-negative int; 0 gives the constant ``f(params)``).

    Returns:
        ``f_tayl(p, *args, **kwargs)`` with the signature of ``f``.

    Raises:
        ValueError: if ``degree`` is negative or not an integer.
    """
    if not isinstance(degree, (int, np.integer)) or degree < 0:
        raise ValueError(f"taylor_expand: degree must be a non-negative integer, got {degree!r}")

    def f_tayl(p, *args, **kwargs):
        dp = _tree_sub(p, params)
        g = functools.partial(lambda q: f(q, *args, **kwargs))
        # derivs[k] is q -> D^k f(q)[dp,...,dp]; Horner-like accumulation of D^k f / k!.
        derivs = [g]
        for _ in range(degree):
            prev = derivs[-1]
            derivs.append(lambda q, prev=prev: jax.jvp(prev, (q,), (dp,))[1])
        out = None
        fact = 1.0
        for k, d in enumerate(derivs):
            fact = fact * max(k, 1)
            term = jax.tree_util.tree_map(lambda t, c=fact: t / c, d(params))
            out = term if out is None else _tree_add(out, term)
        return out

    return f_tayl


# ----------------------------------------------------------------------------------------------- NNGP


def empirical_nngp_fn(f: Callable, trace_axes=(-1,), diagonal_axes=()) -> Callable:
    """One draw of the empirical NNGP ``f(theta, x1) f(theta, x2)^T`` (neural-tangents' signature).

    Args:
        f: network ``f(params, x, **kwargs)`` returning a pytree of arrays.
        trace_axes: output axes summed over in the kernel (divided by their total size).
        diagonal_axes: output axes on which only the diagonal of the kernel is kept.

    Returns:
        ``nngp_fn(x1, x2, params, **apply_fn_kwargs)``: ``x2=None`` means ``x2 = x1``; keyword arguments are
        split between the two sides (a 2-tuple gives one element to each side; an ``rng`` key is folded for
        ``x2 != x1``). The kernel of each output leaf has the zipped layout of ``zip(f(x1).shape,
        f(x2).shape)`` less traced axes, diagonal axes once.
    """

    def nngp_fn(x1, x2, params, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        kw1, kw2 = _axes.split_kwargs(apply_fn_kwargs, x1, x2)
        out1 = f(params, x1, **kw1)
        out2 = out1 if x2 is None else f(params, x2, **kw2)
        return jax.tree_util.tree_map(
            lambda a, b: _axes.pair_contract(a, b, trace_axes, diagonal_axes, a.ndim), out1, out2)

    return nngp_fn


# ----------------------------------------------------------------------------------------------- Jacobian contraction


def _jacobian_contraction_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes):
    def ntk_fn(x1, x2, params, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        s = _Setup(f, params, vmap_axes, x1, x2, apply_fn_kwargs)

        def jac(x, *args):
            return jax.jacrev(s.side(x, dict(zip(s.keys, args))))(params)

        if s.vmapped:
            jac = jax.vmap(jac, in_axes=s.in_axes(), out_axes=s.fx_axis)
        j1 = jac(x1, *s.args(s.kw1))
        j2 = j1 if x2 is None else jac(x2, *s.args(s.kw2))
        out_tree = jax.tree_util.tree_structure(s.fx1)
        j1 = out_tree.flatten_up_to(j1)
        j2 = out_tree.flatten_up_to(j2)
        kernels = []
        for o1, a, b in zip(jax.tree_util.tree_leaves(s.fx1), j1, j2):
            terms = [_axes.pair_contract(u, v, trace_axes, diagonal_axes, len(o1.shape))
                     for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
            kernels.append(functools.reduce(jnp.add, terms) if terms else _zero_kernel(s, o1, trace_axes,
                                                                                      diagonal_axes, params))
        return out_tree.unflatten(kernels)

    return ntk_fn


def _zero_kernel(s, o1, trace_axes, diagonal_axes, params):
    o2 = jax.tree_util.tree_leaves(s.fx2)[jax.tree_util.tree_leaves(s.fx1).index(o1)]
    lab = _axes.OutputLabels(o1.shape, o2.shape, trace_axes, diagonal_axes)
    return jnp.zeros(lab.shape, o1.dtype)


# ----------------------------------------------------------------------------------------------- NTK-vector products


def _ntk_vector_products_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes):
    def full_ntk(f1, f2, params, shape1, shape2, k):
        """Full (shape1 + shape2) kernel of output leaf k: columns J1 J2^T e_j, one per basis vector e_j."""
        out2, pullback = jax.vjp(f2, params)
        _, f2_tree = jax.tree_util.tree_flatten(out2)
        zeros = [jnp.zeros_like(o) for o in jax.tree_util.tree_leaves(out2)]

        def column(e):
            cot = list(zeros)
            cot[k] = e
            (tangent,) = pullback(f2_tree.unflatten(cot))
            return jax.tree_util.tree_leaves(jax.jvp(f1, (params,), (tangent,))[1])[k]

        cols = jax.vmap(column)(_axes.std_basis(shape2, zeros[k].dtype))  # (size2,) + shape1
        cols = cols.reshape(tuple(shape2) + tuple(shape1))
        n2 = len(shape2)
        return jnp.moveaxis(cols, list(range(n2)), list(range(len(shape1), len(shape1) + n2)))

    def ntk_fn(x1, x2, params, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        s = _Setup(f, params, vmap_axes, x1, x2, apply_fn_kwargs)
        leaves1, leaves2, axes = _out_leaves_and_axes(s)
        xb = x1 if x2 is None else x2
        kernels = []
        for k, (o1, o2, ax) in enumerate(zip(leaves1, leaves2, axes)):
            if not s.vmapped:
                full = full_ntk(s.side(x1, s.kw1), s.side(xb, s.kw2), params, o1.shape, o2.shape, k)
            else:
                e1 = o1.shape[:ax] + o1.shape[ax + 1:]
                e2 = o2.shape[:ax] + o2.shape[ax + 1:]

                def pair(a, b, args_a, args_b):
                    fa = s.side(a, dict(zip(s.keys, args_a)))
                    fb = s.side(b, dict(zip(s.keys, args_b)))
                    return full_ntk(fa, fb, params, e1, e2, k)

                ina = s.in_axes()
                inner = jax.vmap(pair, in_axes=(ina[0], None, ina[1:], None))
                outer = jax.vmap(inner, in_axes=(None, ina[0], None, ina[1:]))
                full = outer(x1, xb, s.args(s.kw1), s.args(s.kw2))  # (N2, N1, e1..., e2...)
                d = len(o1.shape)
                full = jnp.moveaxis(full, [1, 0], [ax, d + ax])
            kernels.append(_axes.trace_and_diagonal(full, len(o1.shape), trace_axes, diagonal_axes))
        return jax.tree_util.tree_structure(s.fx1).unflatten(kernels)

    return ntk_fn


# ----------------------------------------------------------------------------------------------- AUTO


def _auto_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes):
    """Pick, per input shapes, the exact method with the fewest FLOPs in XLA's cost analysis.

    Cost model: each of the three methods is lowered (``jax.jit(ntk_fn).lower``) for the actual shapes and
    XLA's ``cost_analysis()['flops']`` of the lowered, unoptimised HLO is read; it counts the multiply-adds
    of every dot, convolution and elementwise op, which is the cost measure of Novak et al. (2022, sec. 3-4:
    ``FP`` forward passes, ``O`` outputs, ``P`` parameters). The choice is cached by the shapes and dtypes of
    ``(x1, x2, params, kwargs)``; when no cost is available the default (Jacobian contraction) is used.
    """
    candidates = {impl: _IMPLEMENTATIONS[impl](f, trace_axes, diagonal_axes, vmap_axes)
                  for impl in (NtkImplementation.JACOBIAN_CONTRACTION, NtkImplementation.NTK_VECTOR_PRODUCTS,
                               NtkImplementation.STRUCTURED_DERIVATIVES)}
    cache = {}

    def choose(x1, x2, params, **kw):
        sig = jax.tree_util.tree_map(lambda a: (jnp.shape(a), jnp.result_type(a)), (x1, x2, params, kw))
        key = str(sig)
        if key not in cache:
            best, best_flops = NtkImplementation.JACOBIAN_CONTRACTION, np.inf
            for impl, fn in candidates.items():
                flops = _lowered_flops(fn, x1, x2, params, kw)
                if flops < best_flops:
                    best, best_flops = impl, flops
            cache[key] = best
        return cache[key]

    def ntk_fn(x1, x2, params, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        return candidates[choose(x1, x2, params, **apply_fn_kwargs)](x1, x2, params, **apply_fn_kwargs)

    ntk_fn.choose = choose
    return ntk_fn


def _lowered_flops(fn, x1, x2, params, kw) -> float:
    try:
        cost = jax.jit(lambda a, b, p, k: fn(a, b, p, **k)).lower(x1, x2, params, kw).cost_analysis()
    except Exception:  # noqa: BLE001 - a method that cannot lower for these inputs is simply not chosen
        return np.inf
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops", np.inf)
    return float(flops) if flops is not None and flops >= 0 else np.inf


# ----------------------------------------------------------------------------------------------- public API


_IMPLEMENTATIONS = {
    NtkImplementation.JACOBIAN_CONTRACTION: _jacobian_contraction_ntk_fn,
    NtkImplementation.NTK_VECTOR_PRODUCTS: _ntk_vector_products_ntk_fn,
    NtkImplementation.STRUCTURED_DERIVATIVES: structured_derivatives_ntk_fn,
    NtkImplementation.AUTO: _auto_ntk_fn,
}


def _implementation(implementation, who):
    try:
        return NtkImplementation(int(implementation))
    except (ValueError, TypeError):
        raise ValueError(f"{who}: implementation must be an NtkImplementation or one of 0, 1, 2, 3, "
                         f"got {implementation!r}") from None


def empirical_ntk_fn(f: Callable, trace_axes=(-1,), diagonal_axes=(), vmap_axes=None,
                     implementation=DEFAULT_NTK_IMPLEMENTATION) -> Callable:
    """One draw of the empirical NTK ``Theta(x1, x2) = sum_w J_w(x1) J_w(x2)^T`` (neural-tangents' signature).

    Args:
        f: network ``f(params, x, **kwargs)`` returning a pytree of arrays.
        trace_axes: output axes summed over (divided by their size).
        diagonal_axes: output axes on which only the kernel's diagonal is kept.
        vmap_axes: ``None`` (no batch structure), an int ``a`` (inputs, outputs batched along ``a``, keyword
            arguments not), or a triple ``(in_axes, out_axes, kwargs_axes)``; it certifies that ``f`` acts on
            each example independently, so Jacobians are taken per example.
        implementation: an `NtkImplementation` or its integer value.

    Returns:
        ``ntk_fn(x1, x2, params, **apply_fn_kwargs)`` returning, for each output leaf, the kernel in the
        zipped layout (``x2=None`` means ``x1``; keyword arguments are split as in `empirical_nngp_fn`).

    Raises:
        ValueError: for an unknown ``implementation``.
    """
    impl = _implementation(implementation, "empirical_ntk_fn")
    return _IMPLEMENTATIONS[impl](f, trace_axes, diagonal_axes, vmap_axes)


def empirical_kernel_fn(f: Callable, trace_axes=(-1,), diagonal_axes=(), vmap_axes=None,
                        implementation=DEFAULT_NTK_IMPLEMENTATION) -> Callable:
    """One draw of the empirical NNGP and/or NTK of ``f`` behind one ``get`` argument.

    Args:
        f: network ``f(params, x, **kwargs)``.
        trace_axes: output axes summed over.
        diagonal_axes: output axes kept once.
        vmap_axes: NTK only; see `empirical_ntk_fn`.
        implementation: NTK only; an `NtkImplementation` or its integer value.

    Returns:
        ``kernel_fn(x1, x2, get, params, **apply_fn_kwargs)``: ``get`` a string (``'nngp'`` or ``'ntk'``)
        returns that kernel; a tuple returns the named tuple ``EmpiricalKernel`` with those fields; ``None``
        means ``('nngp', 'ntk')``. For pytree outputs each leaf of the output tree holds its own result.

    Raises:
        ValueError: for an unknown ``implementation``; the returned function raises it for an unknown ``get``.
    """
    fns = {"nngp": empirical_nngp_fn(f, trace_axes, diagonal_axes),
           "ntk": empirical_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes, implementation)}

    def kernel_fn(x1, x2, get, params, **apply_fn_kwargs):
        return _dispatch_get("EmpiricalKernel", get, lambda g: fns[g](x1, x2, params, **apply_fn_kwargs))

    return kernel_fn


@functools.cache
def _named(name, fields):
    return collections.namedtuple(name, fields)


def _dispatch_get(name, get, compute):
    """Evaluate ``compute(g)`` for the requested kernels and package them as neural-tangents does."""
    single = isinstance(get, str)
    gets = ("nngp", "ntk") if get is None else ((get,) if single else tuple(get))
    for g in gets:
        if g not in ("nngp", "ntk"):
            raise ValueError(f"{name}: get must be 'nngp', 'ntk', a tuple of those or None, got {get!r}")
    results = {g: compute(g) for g in gets}
    if single:
        return results[get]
    cls = _named(name, gets)
    return jax.tree_util.tree_map(lambda *xs: cls(*xs), *[results[g] for g in gets])


def empirical_ntk_vp_fn(f: Callable, x1, x2, params, **apply_fn_kwargs) -> Callable:
    """NTK-vector product ``v -> Theta(x1, x2) v = J(x1) (J(x2)^T v)`` without forming the NTK.

    One VJP through ``f(., x2)`` and one JVP through ``f(., x1)``: the cost of about three forward passes.

    Args:
        f: network ``f(params, x, **kwargs)``.
        x1: first inputs.
        x2: second inputs; ``None`` means ``x1``.
        params: parameters at which the kernel is taken.
        **apply_fn_kwargs: keyword arguments of ``f``, split between the sides as in `empirical_nngp_fn`.

    Returns:
        ``ntk_vp(cotangents)``: ``cotangents`` shaped like ``f(params, x2)``, result shaped like
        ``f(params, x1)``.
    """
    kw1, kw2 = _axes.split_kwargs(apply_fn_kwargs, x1, x2)

    def f1(p):
        return f(p, x1, **kw1)

    def f2(p):
        return f(p, x1 if x2 is None else x2, **kw2)

    def ntk_vp(cotangents):
        (tangent,) = jax.vjp(f2, params)[1](cotangents)
        return jax.jvp(f1, (params,), (tangent,))[1]

    return ntk_vp
