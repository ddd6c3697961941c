"""Structured-derivatives empirical NTK (Novak, Sohl-Dickstein and Schoenholz, ICML 2022, sec. 4).

For a parameter leaf ``w`` consumed by exactly one primitive ``y = g(u, w)``,
``J_w(x) = (df/dy)(dy/dw)`` and the NTK contribution ``J_w(x1) . J_w(x2)`` can be contracted without ever
forming ``dy/dw``. With ``G = df/dy`` (one row per output component) and ``u`` the other operand:

* ``dot_general``: ``y[b, i, o] = sum_c u[b, i, c] w[b, c, o]`` (``b`` batch, ``c`` contracted, ``i`` free in
  ``u``, ``o`` free in ``w``) gives
  ``Theta_w = sum_{b,c,o,i,i'} G1[., b, i, o] u1[b, i, c] u2[b, i', c] G2[., b, i', o]``;
* ``conv_general_dilated`` (``w`` the kernel, no feature/batch groups): with ``P = patches(u)`` (the
  ``C_in * prod(window)`` values each output position sees), ``y[n, s, o] = sum_k P[n, s, k] W[o, k]`` and
  ``Theta_w = sum G1[., n, s, o] P1[n, s, k] P2[n', s', k] G2[., n', s', o]``.

Each is one 4-operand `jnp.einsum` whose contraction order is chosen by ``opt_einsum`` (``optimize=True``):
the order that forms ``J_w`` first is among the candidates, so a rule never costs more FLOPs than Jacobian
contraction for that leaf, and it wins when ``u1 u2^T`` (or ``P1 P2^T``) is small. A leaf reaches its
primitive through shape-only aliases (``reshape``, ``transpose``, ``squeeze``, ``expand_dims``,
``convert_element_type``, ``copy``) and through nested ``jit`` calls; these preserve ``J . J``.

Rules exist for ``dot_general`` and ``conv_general_dilated`` only. Every other leaf (one used more than once,
used by any other primitive -- biases through ``broadcast_in_dim``/``add``, scales through ``mul``, inside a
``custom_jvp``/``custom_vjp`` call, a ``scan`` or a ``while`` -- or returned as an output) falls back to
Jacobian contraction for that leaf: its ``J_w`` is taken by reverse mode in the same backward pass that gives
the ``G``'s. The ``G``'s come from one VJP per output component with respect to zero perturbations added to
the outputs of the rule primitives.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from smnngp.empirical import _axes
from smnngp.empirical._setup import _Setup

__all__ = ["structured_derivatives_ntk_fn"]

_ALIASES = {"reshape", "transpose", "squeeze", "expand_dims", "convert_element_type", "copy", "copy_p"}
_CALLS = {"pjit", "jit", "closed_call", "core_call"}
_RULES = {"dot_general", "conv_general_dilated"}


def _is_literal(v):
    return type(v).__name__ == "Literal"


def _sub_jaxpr(eqn):
    j = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    return j


class _Program:
    """A jaxpr of ``p -> f(p, x, **kw)`` with the uses of each parameter leaf found.

    ``uses[leaf]`` lists ``(use_id, eqn, operand_index)`` of the non-alias primitives that read the leaf
    (through aliases and nested jit calls); a leaf is *structured* when it has exactly one use, that use
    has a rule and the leaf is never an output. Use ids number the rule primitives in evaluation order.
    """

    def __init__(self, fn, n_leaves, example_args):
        self.closed = jax.make_jaxpr(fn)(*example_args)
        self.n_leaves = n_leaves
        self.uses = {i: [] for i in range(n_leaves)}
        self.escaped = set()
        self.counter = 0
        jaxpr = self.closed.jaxpr
        tags = {v: i for i, v in enumerate(jaxpr.invars[:n_leaves])}
        self._scan(jaxpr, tags)
        self._mark_outputs(jaxpr, tags)
        self.structured = {}
        for leaf, uses in self.uses.items():
            if leaf in self.escaped or len(uses) != 1:
                continue
            uid, eqn, k = uses[0]
            if _rule_applies(eqn, k):
                self.structured[leaf] = uid

    def _scan(self, jaxpr, tags):
        for eqn in jaxpr.eqns:
            hits = [(k, tags[v]) for k, v in enumerate(eqn.invars) if not _is_literal(v) and v in tags]
            name = eqn.primitive.name
            sub = _sub_jaxpr(eqn) if name in _CALLS else None
            if sub is not None and (hits or self._has_rule(getattr(sub, "jaxpr", sub))):
                sub_jaxpr = getattr(sub, "jaxpr", sub)
                sub_tags = {sub_jaxpr.invars[k]: leaf for k, leaf in hits}
                self._scan(sub_jaxpr, sub_tags)
                self._mark_outputs(sub_jaxpr, sub_tags)
                continue
            if name in _RULES:
                uid = self.counter
                self.counter += 1
            else:
                uid = None
            if not hits:
                continue
            if name in _ALIASES and len(hits) == 1 and len(eqn.outvars) == 1:
                tags[eqn.outvars[0]] = hits[0][1]
                continue
            for k, leaf in hits:
                self.uses[leaf].append((uid, eqn, k))

    def _mark_outputs(self, jaxpr, tags):
        # A leaf passed into a call whose output is the leaf itself: treat as escaped (no rule).
        for v in jaxpr.outvars:
            if not _is_literal(v) and v in tags:
                self.escaped.add(tags[v])

    def run(self, leaves, rest, deltas, capture):
        """Evaluate with ``deltas[uid]`` added to rule outputs; returns ``(outputs, {uid: other operand})``."""
        jaxpr = self.closed.jaxpr
        return self._eval(jaxpr, self.closed.consts, list(leaves) + list(rest), deltas, capture)

    def _eval(self, jaxpr, consts, args, deltas, capture, counter=None):
        counter = [0] if counter is None else counter
        env = {}
        captured = {}

        def read(v):
            return v.val if _is_literal(v) else env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = c
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            sub = _sub_jaxpr(eqn) if name in _CALLS else None
            if sub is not None and self._has_rule(getattr(sub, "jaxpr", sub)):
                sj = getattr(sub, "jaxpr", sub)
                sc = getattr(sub, "consts", [])
                outvals, cap = self._eval(sj, sc, invals, deltas, capture, counter)
                captured.update(cap)
            else:
                bind_params = eqn.primitive.get_bind_params(eqn.params)
                if isinstance(bind_params, tuple):  # older JAX: (subfuns, params)
                    subfuns, bind_params = bind_params
                    invals = list(subfuns) + invals
                with eqn.ctx.manager:
                    outvals = eqn.primitive.bind(*invals, **bind_params)
                if not eqn.primitive.multiple_results:
                    outvals = [outvals]
                if name in _RULES:
                    uid = counter[0]
                    counter[0] += 1
                    if uid in capture:
                        captured[uid] = invals[1 - capture[uid]]
                    if uid in deltas:
                        outvals = [outvals[0] + deltas[uid]]
            for v, o in zip(eqn.outvars, outvals):
                env[v] = o
        return [read(v) for v in jaxpr.outvars], captured

    @staticmethod
    @functools.cache
    def _has_rule(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in _RULES:
                return True
            sub = _sub_jaxpr(eqn) if eqn.primitive.name in _CALLS else None
            if sub is not None and _Program._has_rule(getattr(sub, "jaxpr", sub)):
                return True
        return False


def _rule_applies(eqn, k):
    name = eqn.primitive.name
    if len(eqn.invars) != 2 or (not _is_literal(eqn.invars[0]) and eqn.invars[0] is eqn.invars[1]):
        return False
    if name == "dot_general":
        return True
    if name == "conv_general_dilated":
        p = eqn.params
        return k == 1 and p["feature_group_count"] == 1 and p["batch_group_count"] == 1
    return False


def structured_derivatives_ntk_fn(f, trace_axes, diagonal_axes, vmap_axes):
    """The structured-derivatives NTK function (see the module docstring for the equations).

    Args:
        f: network ``f(params, x, **kwargs)``.
        trace_axes: output axes summed over.
        diagonal_axes: output axes kept once.
        vmap_axes: as in `smnngp.empirical.empirical_ntk_fn`.

    Returns:
        ``ntk_fn(x1, x2, params, **apply_fn_kwargs)`` with the layout of the other implementations.
    """

    def ntk_fn(x1, x2, params, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        s = _Setup(f, params, vmap_axes, x1, x2, apply_fn_kwargs)
        leaves, ptree = jax.tree_util.tree_flatten(params)
        n = len(leaves)

        def example(x, kw):
            if not s.vmapped:
                return x, kw
            take = functools.partial(jax.tree_util.tree_map, lambda t, a: jnp.take(t, 0, axis=a))
            return take(x, s.x_axis), {k: (take(v, s.kw_axes[k]) if k in s.kw_axes else v) for k, v in kw.items()}

        def as_fn(n_rest_tree):
            def full(*flat):
                x, args = jax.tree_util.tree_unflatten(n_rest_tree, list(flat[n:]))
                return s.side(x, dict(zip(s.keys, args)))(ptree.unflatten(list(flat[:n])))

            return full

        def side(x, kw):
            """Fallback Jacobians, G's and captured operands of one side (per example when vmapped)."""
            x_ex, kw_ex = example(x, kw)
            rest_ex, rest_tree = jax.tree_util.tree_flatten((x_ex, s.args(kw_ex)))
            prog = _Program(as_fn(rest_tree), n, list(leaves) + rest_ex)
            fallback = [i for i in range(n) if i not in prog.structured]
            capture = {uid: prog.uses[leaf][0][2] for leaf, uid in prog.structured.items()}
            y_avals = {uid: prog.uses[leaf][0][1].outvars[0].aval for leaf, uid in prog.structured.items()}

            def derivatives(x, *args):
                rest = jax.tree_util.tree_leaves((x, list(args)))

                def g(fb, deltas):
                    lv = list(leaves)
                    for i, leaf in zip(fallback, fb):
                        lv[i] = leaf
                    return prog.run(lv, rest, deltas, capture)

                deltas0 = {uid: jnp.zeros(a.shape, a.dtype) for uid, a in y_avals.items()}
                fb0 = [leaves[i] for i in fallback]
                outs, pullback, cap = jax.vjp(g, fb0, deltas0, has_aux=True)
                per_out = []
                for k, o in enumerate(outs):
                    def one(e, k=k):
                        cot = [jnp.zeros_like(t) for t in outs]
                        cot[k] = e
                        return pullback(cot)

                    jf, gs = jax.vmap(one)(_axes.std_basis(o.shape, o.dtype))
                    reshape = functools.partial(lambda t, sh: t.reshape(sh + t.shape[1:]), sh=o.shape)
                    per_out.append((jax.tree_util.tree_map(reshape, jf), jax.tree_util.tree_map(reshape, gs)))
                return per_out, cap

            if s.vmapped:
                derivatives = jax.vmap(derivatives, in_axes=s.in_axes(), out_axes=0)
            return prog, derivatives(x, *s.args(kw))

        prog, (per1, cap1) = side(x1, s.kw1)
        per2, cap2 = (per1, cap1) if x2 is None else side(x2, s.kw2)[1]
        uid_leaf = {uid: leaf for leaf, uid in prog.structured.items()}
        use_eqn = {leaf: prog.uses[leaf][0] for leaf in prog.structured}

        leaves1, leaves2, axes = jax.tree_util.tree_leaves(s.fx1), jax.tree_util.tree_leaves(s.fx2), None
        axes = jax.tree_util.tree_leaves(s.fx_axis) if s.vmapped else [None] * len(leaves1)
        kernels = []
        for k, (o1, o2, ax) in enumerate(zip(leaves1, leaves2, axes)):
            (jf1, g1), (jf2, g2) = per1[k], per2[k]
            lab = _axes.OutputLabels(o1.shape, o2.shape, trace_axes, diagonal_axes)
            d = len(o1.shape)
            # Labels of the leading (output) axes of the per-example arrays; the example axis leads when vmapped.
            if s.vmapped:
                order = [ax] + [i for i in range(d) if i != ax]
                lead1, lead2 = [lab.l1[i] for i in order], [lab.l2[i] for i in order]
                ex1, ex2 = [lab.l1[ax]], [lab.l2[ax]]
            else:
                lead1, lead2, ex1, ex2 = lab.l1, lab.l2, [], []
            n_lead = d
            total = jnp.zeros(lab.shape, o1.dtype)
            for a, b in zip(jf1, jf2):
                rest = lab.fresh(a.ndim - n_lead)
                total = total + jnp.einsum(a, lead1 + rest, b, lead2 + rest, lab.out,
                                           precision=jax.lax.Precision.HIGHEST)
            for uid, leaf in uid_leaf.items():
                _, eqn, opnd = use_eqn[leaf]
                total = total + _rule_term(eqn, opnd, g1[uid], g2[uid], cap1[uid], cap2[uid],
                                           lead1, lead2, ex1, ex2, lab)
            kernels.append(total / lab.size)
        return jax.tree_util.tree_structure(s.fx1).unflatten(kernels)

    return ntk_fn


def _rule_term(eqn, k, g1, g2, u1, u2, lead1, lead2, ex1, ex2, lab):
    """``sum G1 (dy/dw) (dy/dw)^T G2`` for one structured leaf, as one optimised einsum."""
    if eqn.primitive.name == "conv_general_dilated":
        p = eqn.params
        dn = p["dimension_numbers"]
        w_aval = eqn.invars[1].aval
        window = tuple(w_aval.shape[i] for i in dn.rhs_spec[2:])

        def patches(u):
            return jax.lax.conv_general_dilated_patches(
                u, window, p["window_strides"], p["padding"], lhs_dilation=p["lhs_dilation"],
                rhs_dilation=p["rhs_dilation"], dimension_numbers=dn, precision=jax.lax.Precision.HIGHEST)

        n_ex = len(ex1)
        if n_ex:
            u1 = jax.vmap(patches)(u1)
            u2 = jax.vmap(patches)(u2)
        else:
            u1, u2 = patches(u1), patches(u2)
        # Patches and y share the out layout; only the feature axis differs (K versus O).
        nd = u1.ndim - n_ex
        feat = dn.out_spec[1]
        py1, py2 = lab.fresh(nd), lab.fresh(nd)
        kk, oo = lab.fresh(2)
        pl1 = [kk if i == feat else py1[i] for i in range(nd)]
        pl2 = [kk if i == feat else py2[i] for i in range(nd)]
        yl1 = [oo if i == feat else py1[i] for i in range(nd)]
        yl2 = [oo if i == feat else py2[i] for i in range(nd)]
        return jnp.einsum(g1, lead1 + yl1, u1, ex1 + pl1, u2, ex2 + pl2, g2, lead2 + yl2, lab.out,
                          optimize=True, precision=jax.lax.Precision.HIGHEST)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    u_c, w_c = (lc, rc) if k == 1 else (rc, lc)
    u_b, w_b = (lb, rb) if k == 1 else (rb, lb)
    n_ex = len(ex1)
    u_nd = u1.ndim - n_ex
    w_nd = eqn.invars[k].aval.ndim
    u_free = [i for i in range(u_nd) if i not in u_c and i not in u_b]
    w_free = [i for i in range(w_nd) if i not in w_c and i not in w_b]
    c_lab = lab.fresh(len(u_c))
    b_lab = lab.fresh(len(u_b))
    f1, f2 = lab.fresh(len(u_free)), lab.fresh(len(u_free))
    o_lab = lab.fresh(len(w_free))
    ul1, ul2 = [None] * u_nd, [None] * u_nd
    for j, ax in enumerate(u_c):
        ul1[ax] = ul2[ax] = c_lab[j]
    for j, ax in enumerate(u_b):
        ul1[ax] = ul2[ax] = b_lab[j]
    for j, ax in enumerate(u_free):
        ul1[ax], ul2[ax] = f1[j], f2[j]
    # y = [batch..., lhs free..., rhs free...]
    if k == 1:
        yl1, yl2 = b_lab + f1 + o_lab, b_lab + f2 + o_lab
    else:
        yl1, yl2 = b_lab + o_lab + f1, b_lab + o_lab + f2
    return jnp.einsum(g1, lead1 + yl1, u1, ex1 + ul1, u2, ex2 + ul2, g2, lead2 + yl2, lab.out,
                      optimize=True, precision=jax.lax.Precision.HIGHEST)

