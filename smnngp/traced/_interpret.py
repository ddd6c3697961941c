"""Interpret a traced program, primitive by primitive, as operations on infinite-width variables.

`classify` sorts the program's variables by what they depend on (the input alone, the random parameters alone,
or both) and finds where the input enters the network (`Frontier`); `evaluate_data` computes the input's
preprocessing on actual arrays; `Interpreter` runs the rest on kernels. Every operation that has no
infinite-width limit here raises `TracedError`, naming the primitive, the user's source line and the reason.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp import stax
from smnngp.traced._errors import TracedError
from smnngp.traced._moments import Moments
from smnngp.traced._positions import PositionMap, Reposition
from smnngp.traced._priors import Bias, Weight
from smnngp.traced._program import Op, Program
from smnngp.traced._values import (
    ONES,
    Affine,
    BiasTerm,
    Concat,
    Const,
    DataIn,
    Field,
    FieldProduct,
    Mapped,
    Mixed,
    Nonlin,
    Param,
    PerEx,
    PerExChannels,
    PerPos,
)

# Primitives that act entry by entry (the chains of an activation are made of them).
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "exp", "exp2", "log", "log1p", "expm1",
    "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erf", "erfc", "erf_inv", "sqrt", "rsqrt", "cbrt", "integer_pow", "pow", "square", "select_n", "gt", "lt",
    "ge", "le", "eq", "ne", "convert_element_type", "clamp", "atan2", "floor", "ceil", "round", "is_finite",
    "not", "and", "or", "copy", "copy_p", "reduce_precision", "nextafter", "rem",
})
_PASS_THROUGH = frozenset({"copy", "copy_p", "optimization_barrier"})
# The most groups of units a per-channel constant may split a field into (one part of the kernel computation each).
MAX_CHANNEL_GROUPS = 32


def refuse(op: Op, why: str) -> TracedError:
    return TracedError(f"smnngp.traced: `{op.name}` at {op.where}: {why}")


# -- which variables depend on what --------------------------------------------------------------------------

def classify(program: Program) -> tuple[dict[int, str], list[int]]:
    """Kinds of the variables ('const', 'data', 'param', 'field') and the data variables that enter the network
    (the frontier: input-only values that an operation combines with a parameter or an activation)."""
    kind = {v: "const" for v in program.consts}
    kind[program.x_var] = "data"
    for v in program.params_vars:
        kind[v] = "param"
    frontier: list[int] = []
    for op in program.ops:
        kinds = {kind[i] for i in op.ins}
        if "field" in kinds or ("data" in kinds and "param" in kinds):
            out = "field"
            for i in op.ins:
                if kind[i] == "data" and i not in frontier:
                    frontier.append(i)
        elif "data" in kinds:
            out = "data"
        elif "param" in kinds:
            out = "param"
        else:
            out = "const"
        for o in op.outs:
            kind[o] = out
    return kind, frontier


def evaluate_data(program: Program, kind: dict[int, str], x, wanted: list[int]) -> list:
    """The values of the data variables ``wanted`` for the input ``x`` (the operations on the input alone)."""
    env = {program.x_var: x}
    need = set(wanted)
    for op in reversed(program.ops):  # only what the wanted values need
        if any(o in need for o in op.outs):
            need.update(i for i in op.ins if kind[i] == "data")
    for op in program.ops:
        if not any(o in need for o in op.outs):
            continue
        args = [env[i] if i in env else program.consts[i] for i in op.ins]
        out = op.prim.bind(*args, **op.params)
        for o, val in zip(op.outs, out if op.prim.multiple_results else [out]):
            env[o] = val
    return [env[v] for v in wanted]


# -- the interpreter ----------------------------------------------------------------------------------------

def _uniform_scalar(value, op: Op, what: str) -> float:
    arr = np.asarray(value)
    flat = arr.reshape(-1)
    if flat.size == 0:
        raise refuse(op, f"{what} is empty")
    same = flat == flat[0]
    if arr.dtype.kind == "f" and np.isnan(flat[0]):
        same = np.isnan(flat)
    if not np.all(same):
        raise refuse(op, f"{what} varies along the width or batch axis (values from {flat.min()} to "
                         f"{flat.max()}); here a fixed vector must be constant along the width (constants per "
                         f"channel are read entrywise on a Gaussian pre-activation only, where they split its units "
                         f"into groups: batch normalisation before the nonlinearity)")
    return float(flat[0]) if arr.dtype.kind in "fc" else flat[0].item()


class Interpreter:
    """Runs a program's network part on the kernel ``k0`` of its input (one `Moments` per evaluation)."""

    def __init__(self, program: Program, priors: list, random_index: list[int], deg: int,
                 recognised: dict | None = None, report: dict | None = None):
        self.program = program
        self.position = {id(op): i for i, op in enumerate(program.ops)}
        self.priors = priors  # per random leaf (in params_vars order)
        self.random_index = random_index  # position of each random leaf among all leaves (for messages)
        self.deg = deg
        self.kind, self.frontier = classify(program)
        # activation of each chain, by the position of the operation that ends it: programs traced at other batch
        # sizes have the same operations in the same order and share the dict
        self.recognised: dict = {} if recognised is None else recognised
        self.fan_in: dict = {}  # fan-in of each weight leaf
        self.first_use: dict = {}  # (view, contracted axis, fan-in) of each weight leaf's first use
        self.activation_report: dict = {} if report is None else report  # chain -> (source line, how read)
        self._part: tuple = ()  # the part of a concatenation an operation is applied to (names its activations)
        self._restricted: dict = {}  # (id(term), units) -> (term, the term restricted to those units)
        if not self.frontier:
            raise TracedError("smnngp.traced: the model's output does not depend on both the input and a random "
                              "parameter; there is no kernel to compute")
        found = [self._frontier_roles(v) for v in self.frontier]
        self.in_roles, self.in_spatial = found[0]
        # the input enters through several values (a recurrent network's steps x[:, t], the input and a transform
        # of it, relu(x) and x in a residual block): arrays of one shape and layout; their kernel is that of the
        # values stacked along a new leading position axis, with every pair of positions
        self.stacked = len(self.frontier) > 1
        if self.stacked:
            shapes = {tuple(program.avals[v].shape) for v in self.frontier}
            if len(shapes) > 1 or any(f != found[0] for f in found):
                op = next(op for op in program.ops if any(i in self.frontier[1:] for i in op.ins))
                raise refuse(op, f"the input enters the network through {len(self.frontier)} values of shapes "
                                 f"{sorted(shapes)} and layouts {sorted({f[0] for f in found})}; several values "
                                 f"are taken when they have one shape and one layout")
        # the stax layer of each spatial operation (convolution, pooling, flattening), by position: they say
        # whether the input's kernel must hold every pair of positions or only their diagonal (`needs_full`)
        self.spatial_layers: dict = {}

    def _frontier_roles(self, v: int):
        """Roles of the axes of ``v``, where the input enters the network (batch, features, spatial in between),
        read off the operation that takes it in, and the sizes of its spatial axes."""
        shape = tuple(self.program.avals[v].shape)
        op = next(op for op in self.program.ops if v in op.ins)
        nd = len(shape)
        if op.name == "conv_general_dilated" and op.ins[0] == v:
            spec = op.params["dimension_numbers"].lhs_spec
            batch, feature = spec[0], spec[1]
        elif op.name == "dot_general":
            (lc, rc), _ = op.params["dimension_numbers"]
            side = lc if op.ins[0] == v else rc
            if len(side) != 1:
                raise refuse(op, "the input enters a weight through a contraction over several axes")
            feature = side[0]
            batch = 1 - feature if nd == 2 else 0
            if batch == feature:
                raise refuse(op, "the input's first (batch) axis is contracted with a weight")
        else:
            raise refuse(op, "the input enters the network through an operation other than a dense layer or a "
                             "convolution against a random weight")
        roles, spatial = [], []
        for a, size in enumerate(shape):
            if a == batch:
                roles.append("b")
            elif a == feature:
                roles.append("f")
            else:
                roles.append(f"s{len(spatial)}")
                spatial.append(size)
        return tuple(roles), tuple(spatial)

    @property
    def layout(self) -> tuple:
        """(batch axis, channel axis) of the input where it enters the network."""
        return self.in_roles.index("b"), self.in_roles.index("f")

    def needs_full(self) -> bool:
        """Whether the input's kernel must hold all pairs of spatial positions (the network's output has none):
        each operation's stax layer says so for its input given its output, back from the output."""
        if self.stacked:
            return True
        full = {o: False for o in self.program.out_vars}
        for op in reversed(self.program.ops):
            if all(self.kind[o] == "data" for o in op.outs):
                continue
            out_full = any(full.get(o, False) for o in op.outs)
            layer = self.spatial_layers.get(self.position[id(op)])
            in_full = layer.needs_full(out_full) if layer is not None else out_full
            if in_full:
                for i in op.ins:
                    full[i] = True
        return bool(full.get(self.frontier[0], False))

    # values of variables
    def _value(self, env, i):
        if i in env:
            return env[i]
        if i in self.program.consts:
            return Const(self.program.consts[i])
        raise KeyError(i)

    def run(self, k0):
        """The output's `Kernel` (and whether the evaluation is symmetric in x1, x2)."""
        stacked = None
        if self.stacked:  # k0 holds the values' kernel with the stacking axis first: one value's for the fields
            sp = tuple(self.in_spatial)
            stacked, k0 = k0, k0.replace(nngp=k0.nngp[:, :, 0, 0], cov1=k0.cov1[:, 0, 0],
                                         cov2=None if k0.cov2 is None else k0.cov2[:, 0, 0],
                                         shape1=(k0.shape1[0],) + sp + (k0.shape1[-1],),
                                         shape2=(k0.shape2[0],) + sp + (k0.shape2[-1],), full=bool(sp))
        m = Moments(k0, self.deg, self.recognised, self.activation_report, stacked)
        self._part, self._restricted = (), {}
        env: dict = {}
        for pos, v in enumerate(self.program.params_vars):
            env[v] = Param(pos, tuple(self.program.avals[v].shape), 1.0, ())
        for i, v in enumerate(self.frontier):
            env[v] = DataIn(self.in_roles, i if self.stacked else None)
        for op in self.program.ops:
            if all(self.kind[o] == "data" for o in op.outs):
                continue  # the input's preprocessing: evaluated before
            ins = [self._value(env, i) for i in op.ins]
            outs = self.apply(op, ins, m)
            for o, val in zip(op.outs, outs):
                env[o] = val
        if len(self.program.out_vars) != 1:
            raise TracedError(f"smnngp.traced: the model returns {len(self.program.out_vars)} arrays; it must "
                              f"return one (the network's output)")
        out = self._value(env, self.program.out_vars[0])
        if isinstance(out, Concat):
            raise TracedError("smnngp.traced: the model's output is a concatenation along the width of parts with "
                              "different kernels: its outputs are not identically distributed, so there is no one "
                              "output kernel; end the model with a dense layer after the concatenation")
        if not isinstance(out, Field):
            raise TracedError(f"smnngp.traced: the model's output is not an infinite-width activation (it is "
                              f"{type(out).__name__}); it must end in a layer with random weights")
        if out.roles != ("b", "w"):
            raise TracedError(f"smnngp.traced: the model's output has axes {out.roles}; expected (batch, width) "
                              f"(flatten or pool spatial axes before the readout)")
        k = m.field_or_zero(out, out)
        n_out = self.program.avals[self.program.out_vars[0]].shape[-1]
        k = k.replace(shape1=(k0.shape1[0], n_out), shape2=(k0.shape2[0], n_out), is_gaussian=out.gaussian)
        return k, m.symmetric

    def _origin(self, op: Op):
        """What names an activation made by ``op`` (recognition is cached by it): the operation, and the part of a
        concatenation it was applied to."""
        pos = self.position[id(op)]
        return pos if not self._part else (pos, "part") + self._part

    # dispatch
    def apply(self, op: Op, ins, m: Moments):
        name = op.name
        if name in _PASS_THROUGH:
            return ins
        if name == "split":
            return self._split(op, ins[0])
        if any(isinstance(v, Concat) for v in ins) and name not in ("dot_general", "conv_general_dilated",
                                                                    "concatenate"):
            return [self._concat_op(op, ins, m)]
        if any(isinstance(v, PerPos) for v in ins) and name != "dot_general":
            return [self._perpos(op, ins)]
        if name == "stop_gradient":
            if any(isinstance(v, (Field, FieldProduct, Param)) for v in ins):
                raise refuse(op, "stop_gradient of an activation or a parameter changes the NTK; it has no rule here")
            return ins
        if name == "dot_general":
            return [self._dot_general(op, ins, m)]
        if name == "conv_general_dilated":
            return [self._conv(op, ins)]
        if name == "reduce_window_sum":
            return [self._sum_pool(op, ins[0])]
        if name in ELEMENTWISE:
            return [self._entrywise(op, ins, m)]
        if any(isinstance(v, PerExChannels) for v in ins):
            raise refuse(op, "a per-example statistic times a constant per channel (a normalisation's scale) is "
                             "read only as the factor of an activation")
        if name == "reduce_sum":
            return [self._reduce_sum(op, ins[0], m)]
        if name in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims"):
            return [self._reshape(op, ins[0])]
        if name == "transpose":
            return [self._transpose(op, ins[0])]
        if name in ("slice", "pad", "rev"):
            return [self._move_positions(op, ins)]
        if name == "concatenate":
            return [self._concatenate(op, ins)]
        if name in ("reduce_max", "reduce_min", "argmax", "argmin", "reduce_prod"):
            raise refuse(op, "a maximum, minimum or product over an axis has no Gaussian limit here")
        if name in ("reduce_window_max", "reduce_window_min", "reduce_window", "select_and_gather_add"):
            raise refuse(op, "max or min pooling has no Gaussian limit here (average or sum pooling has)")
        if name in ("cond", "while", "switch"):
            raise refuse(op, "control flow that depends on the input or the parameters has no infinite-width "
                             "limit here")
        raise refuse(op, "this primitive has no infinite-width rule in smnngp.traced")

    # -- parameters and weights --------------------------------------------------------------------------
    def _prior(self, param: Param):
        return self.priors[param.leaf]

    def _dot_general(self, op: Op, ins, m: Moments):
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        a, b = ins
        if isinstance(a, Concat) or isinstance(b, Concat):
            c, other = (a, b) if isinstance(a, Concat) else (b, a)
            if not isinstance(other, Param) or lb or rb:
                raise refuse(op, f"a concatenation along the width (channels) contracted with "
                                 f"{type(other).__name__} (attention scores or weights of concatenated activations): "
                                 f"only a random weight (a dense layer) is applied to a concatenation here")
            _check_parts(op, c, "a dense layer")
        if isinstance(a, Field) and isinstance(b, Field) and (lb or rb):
            return self._attention_logits(op, a, b, m)
        if any(isinstance(v, PerPos) for v in ins):
            return self._attend(op, a, b)
        if any(isinstance(v, Const) and not np.any(np.asarray(v.value)) for v in ins):
            # a weight times an exact zero (a recurrent network's zero initial state): zero
            aval = self.program.avals[op.outs[0]]
            return Const(np.zeros(aval.shape, aval.dtype))
        if lb or rb:
            raise refuse(op, "a batched contraction (vmap over examples or heads) is not supported yet")
        weight_left = isinstance(a, Param) and isinstance(b, (Field, DataIn, Concat))
        if weight_left:  # W @ x.T (a vmapped W @ x, as Equinox's Linear): (width, batch), transposed later
            a, b, lc, rc = b, a, rc, lc
        if not (isinstance(b, Param) and isinstance(a, (Field, DataIn, Concat))):
            if isinstance(a, Field) and isinstance(b, Field):
                raise refuse(op, "a product of two activations contracted over the width (attention scores) is "
                                 "not supported yet")
            if isinstance(a, (Field, DataIn)) and isinstance(b, Const) or isinstance(b, (Field, DataIn)):
                raise refuse(op, "an activation is multiplied by a fixed matrix; mark the matrix as a random "
                                 "weight (priors={...: Weight()}) or compute it from the input alone")
            raise refuse(op, f"unsupported operands {type(a).__name__} and {type(b).__name__}")
        # Flax's DenseGeneral into and out of attention heads: a (features, heads, width) kernel splits the width
        # into heads; a (heads, width, features) kernel contracted over both axes merges them
        into_heads = (not weight_left and len(lc) == len(rc) == 1 and rc[0] == 0 and len(b.shape) == 3
                      and a.roles[lc[0]] in ("w", "f") and "h" not in a.roles)
        from_heads = (not weight_left and len(lc) == len(rc) == 2 and sorted(rc) == [0, 1] and len(b.shape) == 3
                      and sorted(a.roles[i] for i in lc) == ["h", "w"])
        if not (into_heads or from_heads) and (len(lc) != 1 or a.roles[lc[0]] not in ("w", "f")
                                               or len(b.shape) != 2 or len(rc) != 1):
            raise refuse(op, f"the contraction {op.params['dimension_numbers']} is not a dense layer over the "
                             f"feature axis (batch, ..., features) @ (features, width)")
        fan_in = math.prod(b.shape[i] for i in rc)
        n_out = b.shape[-1] if into_heads or from_heads else b.shape[1 - rc[0]]
        prior, W_std = self._weight(op, b, fan_in, "a weight", rc[0])
        layer = stax.Dense(n_out, W_std=W_std, parameterization=prior.parameterization)
        free = tuple(r for i, r in enumerate(a.roles) if i not in lc)
        if into_heads:
            free = free + ("h",)
        if "b" not in free:
            raise refuse(op, f"activations with axes {a.roles} enter a weight without their batch axis")
        if "h" in a.roles and not from_heads:
            raise refuse(op, "one weight applied to each attention head's part of the width separately; merge "
                             "the heads (reshape to (..., heads * width)) before the projection")
        term = Affine((b.leaf, b.view, rc[0]), a, layer)
        return Field(((term, 1.0),), ("w",) + free if weight_left else free + ("w",), n_out, self._spatial(a))

    # -- attention ----------------------------------------------------------------------------------------
    def _attention_logits(self, op: Op, a: Field, b: Field, m: Moments) -> PerPos:
        """``q . k`` over the width, per example and pair of positions: in the limit the covariance of the two
        fields at those positions of one input (deterministic), still to be divided by the width."""
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        batch = tuple(a.roles[i] for i in lb)
        ok = (len(lc) == len(rc) == 1 and a.roles[lc[0]] == "w" and b.roles[rc[0]] == "w"
              and batch == tuple(b.roles[i] for i in rb) and sorted(batch) in (["b"], ["b", "h"])
              and ("h" in a.roles) == ("h" in batch) and ("h" in b.roles) == ("h" in batch))
        if not ok:
            raise refuse(op, f"a product of activations with axes {a.roles} and {b.roles} that is not a contraction "
                             f"over the width per example (and per head) (attention scores)")
        free_a = [r for i, r in enumerate(a.roles) if i not in tuple(lc) + tuple(lb)]
        free_b = [r for i, r in enumerate(b.roles) if i not in tuple(rc) + tuple(rb)]
        if free_a != ["s0"] or free_b != ["s0"] or len(a.spatial) != 1:
            raise refuse(op, f"attention scores over positions {free_a} x {free_b}; this version attends over one "
                             f"position axis (a sequence: flatten the positions of an image first)")
        self.spatial_layers[self.position[id(op)]] = _ALL_PAIRS
        k = m.field(a, b)
        size = a.spatial[0]
        if k is None:
            v1, v2 = jnp.zeros((m.n1, size, size), m.dtype), jnp.zeros((m.n2, size, size), m.dtype)
        else:
            v1, v2 = k.cov1, k.cov2
        roles = batch + ("s0", "k0")
        if "h" in batch:  # every head has the same scores in the limit: one head's values, a head axis of size one
            where = batch.index("h")
            v1, v2 = jnp.expand_dims(v1, where), None if v2 is None else jnp.expand_dims(v2, where)
        return PerPos(v1, None if m.x2_is_x1 else v2, roles, power=1, power_width=a.width)

    def _attend(self, op: Op, a, b) -> Field:
        """Attention weights (per example, query and key position) applied to a field's positions."""
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        weights_first = isinstance(a, PerPos)
        w, f = (a, b) if weights_first else (b, a)
        wc, fc, wb, fb = (lc, rc, lb, rb) if weights_first else (rc, lc, rb, lb)
        if not isinstance(f, Field) or len(wc) != 1 or len(fc) != 1:
            raise refuse(op, "attention weights contracted with something other than one axis of an activation")
        if w.power:
            raise refuse(op, "attention scores summed over the width but not divided by it grow without bound; "
                             "divide them by the width (1 / n_key scaling)")
        batch = tuple(w.roles[i] for i in wb)
        if (batch != tuple(f.roles[i] for i in fb) or sorted(batch) not in (["b"], ["b", "h"])
                or ("h" in f.roles) != ("h" in batch) or f.roles[fc[0]] != "s0"):
            raise refuse(op, f"attention weights with axes {w.roles} applied to activations with axes {f.roles} "
                             f"other than per example (and per head) over the positions")
        contracted = w.roles[wc[0]]
        free = [r for i, r in enumerate(w.roles) if i not in tuple(wc) + tuple(wb)]
        if sorted([contracted] + free) != ["k0", "s0"]:
            raise refuse(op, f"attention weights with axes {w.roles}")
        # (batch, [head,] output position, summed position); every head's weights are the same in the limit (their
        # scores are, and only uniform constants enter them): head 0's serve all
        head = (w.roles.index("h"),) if "h" in batch else ()
        order = (w.roles.index("b"),) + head + (w.roles.index(free[0]), wc[0])
        mats = [None if v is None else jnp.transpose(v, order) for v in (w.v1, w.v2)]
        if head:
            mats = [None if v is None else v[:, 0] for v in mats]
        self.spatial_layers[self.position[id(op)]] = _ALL_PAIRS
        weights = PerPos(mats[0], mats[1], ("b", "s0", "k0"))
        f_free = [r for i, r in enumerate(f.roles) if i not in tuple(fc) + tuple(fb)]
        roles = batch + ("s0", *f_free) if weights_first else batch + (*f_free, "s0")
        key = self.position[id(op)]
        if len(f.terms) == 1 and isinstance(f.terms[0][0], Affine) and isinstance(f.terms[0][0].inp, Field):
            # A (x W) = (A x) W: mixing the positions commutes with the value projection, so mix the projection's
            # input and project after, as stax's attention does (one mixing of the input's kernel serves the NNGP
            # and the NTK when the input's NTK is its NNGP)
            (proj, coef), = f.terms
            mixed = proj.inp.like(((Mixed(weights, proj.inp, key), 1.0),), roles=None)
            return Field(((Affine(proj.weight, mixed, proj.layer, proj.units), coef),), roles, f.width, f.spatial)
        return Field(((Mixed(weights, f, key), 1.0),), roles, f.width, f.spatial)

    def _perpos(self, op: Op, ins) -> PerPos:
        """Operations on attention scores and weights: entrywise arithmetic (softmax, scaling), reductions over
        positions, reshapes, broadcasts and transposes, done on their values for x1 and for x2."""
        name = op.name
        pps = [v for v in ins if isinstance(v, PerPos)]
        if any(isinstance(v, (Field, FieldProduct, Param, DataIn, PerEx)) for v in ins):
            raise refuse(op, "attention scores or weights combined entrywise with an activation, a parameter or "
                             "the input have no rule here")
        p = pps[0]
        if name in ("stop_gradient", "convert_element_type", "reduce_precision"):
            return p
        out_shape = tuple(self.program.avals[op.outs[0]].shape)
        if name in ("div", "mul") and p.power:
            mean, scalings, factor = _scale_sum(op, ins, p, "attention scores summed over the width are combined "
                                                            "with another value before they are divided by the width")
            if mean:
                return PerPos(_scaled_values(p.v1, factor), _scaled_values(p.v2, factor), p.roles)
            return PerPos(p.v1, p.v2, p.roles, 1, p.power_width, scalings)
        for v in pps:
            if v.power:
                raise refuse(op, f"attention scores summed over a width of {v.power_width}{_width_scaling(v)}, "
                                 f"never divided by "
                                 f"the width: they grow without bound with the width (1 / sqrt(n_key) scaling has "
                                 f"Gaussian scores and no closed form here); divide by the width (1 / n_key scaling)")

        def values(which):
            return [v.v1 if which == 1 or v.v2 is None else v.v2 for v in pps]

        def run(which):
            vals = iter(values(which))
            n = next(iter(values(which))).shape[p.roles.index("b")]
            params = dict(op.params)
            b_out = None  # the output axis of the batch, for the operations whose parameters hold a batch size
            if name == "broadcast_in_dim":
                dims = params["broadcast_dimensions"]
                b_out = dims[p.roles.index("b")]
            elif name == "reshape":
                b_out = 0
                if out_shape[0] != self.program.avals[op.ins[0]].shape[0]:
                    raise refuse(op, "a reshape that moves the batch axis of attention weights")
            if b_out is not None:
                key = "shape" if name == "broadcast_in_dim" else "new_sizes"
                shape = list(params[key])
                shape[b_out] = n
                if "h" in roles:  # one head's values stand for all (size one along the head axis)
                    shape[roles.index("h")] = 1
                params[key] = tuple(shape)
            args = []
            for v in ins:
                if isinstance(v, PerPos):
                    args.append(next(vals))
                else:
                    c = _uniform_scalar(v.value, op, "a constant with attention scores")
                    args.append(c)
            arrays = [x for x in args if not isinstance(x, (bool, int, float))]
            if len(args) > 1:
                target = np.broadcast_shapes(*[jnp.shape(x) for x in arrays])
                args = [jnp.broadcast_to(jnp.asarray(x, arrays[0].dtype) if isinstance(x, (bool, int, float))
                                         else x, target) for x in args]
            out = op.prim.bind(*args, **params)
            if name == "reduce_sum" and "h" in p.roles and p.roles.index("h") in op.params["axes"]:
                out = out * self.program.avals[op.ins[0]].shape[p.roles.index("h")]  # a sum over equal heads
            return out

        if name in ("reduce_max", "reduce_min", "reduce_sum"):
            axes = tuple(op.params["axes"])
            if any(p.roles[ax] == "b" for ax in axes):
                raise refuse(op, "a reduction over the batch axis of attention scores (batch statistics)")
            roles = tuple(r for i, r in enumerate(p.roles) if i not in axes)
        elif name in ("broadcast_in_dim", "reshape", "squeeze"):
            roles = self._roles_after(op, p.roles, out_shape)
        elif name == "transpose":
            roles = tuple(p.roles[i] for i in op.params["permutation"])
        elif name in ELEMENTWISE:
            roles = max((v.roles for v in pps), key=lambda r: sum(x != "1" for x in r))
        else:
            raise refuse(op, "this operation on attention scores has no rule here")
        return PerPos(run(1), None if all(v.v2 is None for v in pps) else run(2), roles)

    def _spatial(self, v) -> tuple:
        return self.in_spatial if isinstance(v, DataIn) else v.spatial

    def _weight(self, op: Op, p: Param, fan_in: int, what: str, orientation: int = 0):
        """The prior of a weight leaf used once, its standard deviation times sqrt(fan_in) (W_std)."""
        prior = self._prior(p)
        if not isinstance(prior, Weight):
            raise refuse(op, f"parameter {self.random_index[p.leaf]} is used as {what} but its prior is "
                             f"{type(prior).__name__}")
        # a weight used several times (tied weights, a recurrent network's step): every use must multiply the
        # same view of it over the same fan-in; the moments of two uses then pair up through one map (Tensor
        # Programs). A use of its transpose (tied input/output embeddings, a tied autoencoder's decoder) is
        # correlated with every earlier use by a term of its own (NETSOR-T's correction), not computed here.
        use = (p.view, orientation, fan_in)
        first = self.first_use.setdefault(p.leaf, use)
        self.fan_in[p.leaf] = fan_in
        if first != use:
            what_now = "its transpose" if first[2] != fan_in or first[1] != orientation else "another view of it"
            raise refuse(op, f"the weight {self.random_index[p.leaf]} is used again as {what_now} (fan-in {fan_in}, "
                             f"where an earlier use had {first[2]}): a weight and its transpose are correlated "
                             f"in the limit by a term smnngp.traced does not compute, and a tied output "
                             f"embedding read out with 1/sqrt(width) scaling has a mean that grows with the width; "
                             f"untie the weights (a separate readout matrix)")
        return prior, math.sqrt(prior.variance(fan_in) * p.scale**2 * fan_in)

    def _conv(self, op: Op, ins):
        """A convolution of activations (or the input) with a random filter: stax `Conv` on the kernel."""
        lhs, rhs = ins
        if isinstance(lhs, Concat):
            _check_parts(op, lhs, "a convolution")
        if not (isinstance(rhs, Param) and isinstance(lhs, (Field, DataIn, Concat))):
            raise refuse(op, f"a convolution of {type(lhs).__name__} with {type(rhs).__name__}; the filter must be "
                             f"a random weight leaf and the input an activation (or the model's input)")
        prm = op.params
        if any(d != 1 for d in tuple(prm["lhs_dilation"]) + tuple(prm["rhs_dilation"])):
            raise refuse(op, "a dilated or transposed convolution (lhs_dilation / rhs_dilation other than 1) is "
                             "not supported yet")
        if prm["feature_group_count"] != 1 or prm["batch_group_count"] != 1:
            raise refuse(op, "a grouped (depthwise) convolution is not supported yet")
        dn = prm["dimension_numbers"]
        lspec, rspec, ospec = tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec)
        roles = lhs.roles
        if roles[lspec[0]] != "b" or roles[lspec[1]] not in ("w", "f"):
            raise refuse(op, f"a convolution whose batch and feature axes {lspec[:2]} are not the batch and width "
                             f"axes of activations with axes {roles}")
        nd = len(lspec) - 2
        sp_roles = [roles[lspec[2 + j]] for j in range(nd)]
        spatial_in = self._spatial(lhs)
        canon = [int(r[1:]) for r in sp_roles]
        if sorted(canon) != list(range(len(spatial_in))):
            raise refuse(op, f"a {nd}-D convolution of activations with spatial sizes {spatial_in}")
        filt, strides, pads = [0] * nd, [0] * nd, [(0, 0)] * nd
        for j, i in enumerate(canon):
            filt[i] = int(rhs.shape[rspec[2 + j]])
            strides[i] = int(prm["window_strides"][j])
            pads[i] = tuple(int(q) for q in prm["padding"][j])
        padding = _padding_name(op, spatial_in, filt, strides, pads)
        fan_in = int(rhs.shape[rspec[1]]) * math.prod(filt)
        n_out = int(rhs.shape[rspec[0]])
        prior, W_std = self._weight(op, rhs, fan_in, "a convolution filter")
        layer = stax.Conv(n_out, tuple(filt), tuple(strides), padding, W_std=W_std,
                          parameterization=prior.parameterization)
        self.spatial_layers[self.position[id(op)]] = layer
        out_shape = self.program.avals[op.outs[0]].shape
        out_roles = [""] * (nd + 2)
        out_roles[ospec[0]], out_roles[ospec[1]] = "b", "w"
        sizes = [0] * nd
        for j, i in enumerate(canon):
            out_roles[ospec[2 + j]] = sp_roles[j]
            sizes[i] = int(out_shape[ospec[2 + j]])
        term = Affine((rhs.leaf, rhs.view, "conv"), lhs, layer)
        return Field(((term, 1.0),), tuple(out_roles), n_out, tuple(sizes))

    def _sum_pool(self, op: Op, v):
        """``reduce_window_sum`` over spatial axes (average pooling divides it by the window): stax `SumPool`."""
        if not isinstance(v, Field):
            raise refuse(op, f"pooling of {type(v).__name__}")
        prm = op.params
        if any(d != 1 for d in tuple(prm["base_dilation"]) + tuple(prm["window_dilation"])):
            raise refuse(op, "a dilated pooling window is not supported")
        n = len(v.spatial)
        window, strides, pads = [1] * n, [1] * n, [(0, 0)] * n
        for a, role in enumerate(v.roles):
            w, st, pad = prm["window_dimensions"][a], prm["window_strides"][a], tuple(prm["padding"][a])
            if role.startswith("s"):
                i = int(role[1:])
                window[i], strides[i], pads[i] = int(w), int(st), (int(pad[0]), int(pad[1]))
            elif (w, st, pad) != (1, 1, (0, 0)):
                raise refuse(op, f"pooling along the {'batch' if role == 'b' else 'width'} axis")
        if not n:
            raise refuse(op, "pooling of activations without spatial axes")
        padding = _padding_name(op, v.spatial, window, strides, pads)
        layer = stax.SumPool(tuple(window), tuple(strides), padding)
        return self._mapped(op, v, layer, v.roles, v.width, "pool", (tuple(window), tuple(strides), padding))

    def _mapped(self, op: Op, v: Field, layer, roles, width, kind, config, sizes=None) -> Field:
        """``v`` through the linear spatial map ``layer`` (its output has the roles and width given, and the
        spatial sizes ``sizes``, by default those of the operation's output)."""
        self.spatial_layers[self.position[id(op)]] = layer
        if sizes is None:
            out_shape = self.program.avals[op.outs[0]].shape
            sizes = [0] * sum(r.startswith("s") for r in roles)
            for a, r in enumerate(roles):
                if r.startswith("s"):
                    sizes[int(r[1:])] = int(out_shape[a])
        term = Mapped(layer, v, (kind, config, v.roles, v.spatial))
        return Field(((term, 1.0),), tuple(roles), width, tuple(sizes))

    def _bias(self, op: Op, p: Param, f: Field, sign: float) -> Field:
        prior = self._prior(p)
        if not isinstance(prior, Bias):
            raise refuse(op, f"parameter {self.random_index[p.leaf]} is added to an activation but its prior is "
                             f"{type(prior).__name__}")
        width = f.width
        leaf_shape = tuple(self.program.avals[self.program.params_vars[p.leaf]].shape)
        w_axis = f.roles.index("w") if "w" in f.roles else -1
        # a positional embedding: the leaf also runs along spatial axes (one entry per unit and position)
        positional = tuple(sorted(int(f.roles[a][1:]) for a in p.carrying()
                                  if a < len(f.roles) and f.roles[a].startswith("s")))
        per_width = tuple(a for a in p.carrying() if not (a < len(f.roles) and f.roles[a].startswith("s")))
        entries = width * math.prod(f.spatial[i] for i in positional)
        aligned = len(p.shape) in (0, len(f.roles)) and per_width in ((), (w_axis,))
        if math.prod(leaf_shape) != entries or not aligned or (width > 1 and per_width != (w_axis,)):
            raise refuse(op, f"a bias of shape {leaf_shape} (seen as {p.shape}) added to activations of width "
                             f"{width} with axes {f.roles}; a bias holds one entry per unit of the width (a "
                             f"positional embedding one per unit and position)")
        var = prior.b_std**2 * p.scale**2
        ntk = var if prior.parameterization == "ntk" else p.scale**2
        return f.like(((BiasTerm((p.leaf, p.view), var, ntk, positional), sign),))

    def _param_op(self, op: Op, ins):
        """Views of a random leaf: rescaling, negation, conversion."""
        p = next(v for v in ins if isinstance(v, Param))
        others = [v for v in ins if v is not p]
        if op.name in ("convert_element_type", "copy", "copy_p"):
            return p
        if op.name == "neg":
            return Param(p.leaf, p.shape, -p.scale, p.view)
        if op.name in ("mul", "div") and len(others) == 1 and isinstance(others[0], Const):
            c = _uniform_scalar(others[0].value, op, "the factor of a random parameter")
            if op.name == "div" and ins[0] is not p:
                raise refuse(op, "a random parameter in a denominator")
            return Param(p.leaf, p.shape, p.scale * c if op.name == "mul" else p.scale / c, p.view)
        raise refuse(op, "this operation on a random parameter, before it meets the input, has no rule (only "
                         "reshapes, transposes and constant factors)")

    # -- shapes ------------------------------------------------------------------------------------------
    def _reshape(self, op: Op, v):
        out_shape = tuple(self.program.avals[op.outs[0]].shape)
        if isinstance(v, Param):
            unit_only = [s for s in out_shape if s != 1] == [s for s in v.shape if s != 1]
            view = v.view if math.prod(out_shape) == math.prod(v.shape) and unit_only else \
                v.view + (("reshape", out_shape),)
            carrying = v.carrying()
            if op.name == "broadcast_in_dim":
                carry = tuple(op.params["broadcast_dimensions"][a] for a in carrying)
            elif unit_only:  # axes of size one added or removed: the entries keep their order
                old = [a for a, s in enumerate(v.shape) if s != 1]
                new = [a for a, s in enumerate(out_shape) if s != 1]
                carry = tuple(new[old.index(a)] for a in carrying)
            else:
                carry = None
            return Param(v.leaf, out_shape, v.scale, view, carry)
        if isinstance(v, PerEx):
            non_unit = [r for r in v.roles if r != "1"]
            roles = self._roles_after(op, v.roles, out_shape)
            if [r for r in roles if r not in ("1", "w")] != [r for r in non_unit if r != "w"]:
                raise refuse(op, "a reshape mixes the batch axis of a per-example statistic")
            return PerEx(v.v1, v.v2, roles, v.zero, v.power, v.power_width, v.scalings)
        if isinstance(v, Field) and v.spatial and op.name == "reshape":
            in_shape = tuple(self.program.avals[op.ins[0]].shape)
            if (v.roles[0] == "b" and len(out_shape) == 2 and out_shape[0] == in_shape[0]
                    and set(v.roles[1:]) == {"w"} | {f"s{i}" for i in range(len(v.spatial))}):
                # flattening (batch, spatial..., width) in any order of the non-batch axes
                return self._mapped(op, v, stax.Flatten(), ("b", "w"), int(out_shape[1]), "flatten", ())
            moved = self._reposition(op, v, in_shape, out_shape)
            if moved is not None:
                return moved
        if isinstance(v, FieldProduct) and v.spatial and op.name == "reshape":
            in_shape = tuple(self.program.avals[op.ins[0]].shape)
            if v.roles[0] == "b" and len(out_shape) == 2 and out_shape[0] == in_shape[0]:
                raise refuse(op, f"flattening a product of two activations with axes {v.roles} (an entrywise "
                                 f"product of spatial fields): flattening and pooling are supported for "
                                 f"activations, not yet for their products; an affine layer after the product "
                                 f"makes it an activation")
        if isinstance(v, Field) and op.name == "reshape":
            heads = self._heads_reshape(op, v, out_shape)
            if heads is not None:
                return heads
        if isinstance(v, (Field, FieldProduct)):
            roles = self._roles_after(op, v.roles, out_shape)
            if [r for r in roles if r != "1"] != [r for r in v.roles if r != "1"]:
                raise refuse(op, f"a reshape of activations with axes {v.roles} to shape {out_shape}; this "
                                 f"version keeps activations as (batch, width)")
            if isinstance(v, Field):
                return v.like(v.terms, roles)
            return FieldProduct(v.left, v.right, roles, v.width, v.spatial)
        raise refuse(op, f"a reshape of {type(v).__name__}")

    def _reposition(self, op: Op, v: Field, in_shape: tuple, out_shape: tuple) -> Field | None:
        """The block of spatial axes (contiguous, in canonical order) reshaped, the other axes kept: an image's
        positions flattened into a sequence (for attention) or a sequence folded back into an image."""
        d = len(v.spatial)
        axes = [a for a, r in enumerate(v.roles) if r.startswith("s")]
        if [v.roles[a] for a in axes] != [f"s{i}" for i in range(d)] or axes != list(range(axes[0], axes[0] + d)):
            return None
        pre, post = in_shape[:axes[0]], in_shape[axes[0] + d:]
        n = len(out_shape) - len(pre) - len(post)
        if n < 1 or tuple(out_shape[:len(pre)]) != pre or tuple(out_shape[len(pre) + n:]) != post:
            return None
        after = tuple(int(s) for s in out_shape[len(pre):len(pre) + n])
        if after == tuple(v.spatial):
            return None
        roles = v.roles[:axes[0]] + tuple(f"s{i}" for i in range(n)) + v.roles[axes[0] + d:]
        return self._mapped(op, v, Reposition(v.spatial, after), roles, v.width, "reposition", (v.spatial, after))

    def _move_positions(self, op: Op, ins):
        """``slice`` (with strides), ``pad`` with zeros (negative: cropping; interior: zeros between positions) and
        ``rev`` of an activation along its spatial axes: a `PositionMap` of the kernel; a slice (or reversal) along
        the width: part of the units (`_reindex`)."""
        v = ins[0]
        if isinstance(v, Param):
            raise refuse(op, f"{op.name} of a random parameter (part of a weight's columns) is not supported yet; "
                             f"slice the weight's output instead (`jnp.split(h @ W, 3, axis=-1)` is read)")
        if not isinstance(v, (Field, Concat)):
            raise refuse(op, f"{op.name} of {type(v).__name__} has no rule here")
        prm = op.params
        sources = [tuple(range(n)) for n in v.spatial]
        width_src = None
        for a, role in enumerate(v.roles):
            n = int(self.program.avals[op.ins[0]].shape[a])
            if op.name == "slice":
                start, limit = int(prm["start_indices"][a]), int(prm["limit_indices"][a])
                stride = 1 if prm["strides"] is None else int(prm["strides"][a])
                src, moved = tuple(range(start, limit, stride)), (start, limit, stride) != (0, n, 1)
            elif op.name == "pad":
                lo, hi, interior = (int(c) for c in prm["padding_config"][a])
                src = []
                for i in range(n):
                    src += [i] + ([-1] * interior if i < n - 1 else [])
                src = ([-1] * max(lo, 0) + src[max(-lo, 0):])
                src = src + [-1] * max(hi, 0) if hi >= 0 else src[:hi]
                src, moved = tuple(src), (lo, hi, interior) != (0, 0, 0)
            else:
                src, moved = tuple(range(n - 1, -1, -1)), a in prm["dimensions"] and n > 1
            if role.startswith("s"):
                sources[int(role[1:])] = src
            elif role == "w" and moved and op.name != "pad":
                width_src = src
            elif moved:
                what = {"b": "the batch axis (examples)", "w": "the width (channels padded with zeros)"}.get(
                    role, f"an axis {role}")
                raise refuse(op, f"{op.name} along {what} is not supported; along spatial axes it is")
        if op.name == "pad":
            fill = ins[1]
            if not isinstance(fill, Const) or np.any(np.asarray(fill.value) != 0):
                raise refuse(op, "padding an activation with a value other than zero")
        return self._move(op, v, tuple(sources), width_src, (op.name, tuple(sources)))

    def _split(self, op: Op, v) -> list:
        """``jnp.split``: each output a slice of ``v`` (along the width: part of its units, a fused projection
        split into queries, keys and values; along a spatial axis: part of its positions)."""
        axis, sizes = int(op.params["axis"]), [int(n) for n in op.params["sizes"]]
        if isinstance(v, Param):
            raise refuse(op, "a split of a random parameter (a fused weight split into its parts) is not supported "
                             "yet; split the weight's output instead (`jnp.split(h @ W, 3, axis=-1)` is read)")
        if not isinstance(v, (Field, Concat)):
            raise refuse(op, f"a split of {type(v).__name__} has no rule here")
        role = v.roles[axis]
        if not (role == "w" or role.startswith("s")):
            what = {"b": "the batch axis (examples)"}.get(role, f"an axis {role}")
            raise refuse(op, f"a split along {what} is not supported; along the width or a spatial axis it is")
        outs, offset = [], 0
        for i, size in enumerate(sizes):
            part = tuple(range(offset, offset + size))
            sources = [tuple(range(n)) for n in v.spatial]
            if role == "w":
                outs.append(self._move(op, v, tuple(sources), part, None))
            else:
                sources[int(role[1:])] = part
                outs.append(self._move(op, v, tuple(sources), None, ("split", i, tuple(sources))))
            offset += size
        return outs

    def _move(self, op: Op, v, sources: tuple, width_src, config):
        """``v`` (a field or a concatenation) with its positions moved (``sources``, per spatial axis) and then
        restricted to the units ``width_src`` (None: all)."""
        if isinstance(v, Concat):
            moved = []
            for p in v.parts:
                if not isinstance(p, Field):
                    raise refuse(op, f"{op.name} of a concatenation of products of activations has no rule here")
                moved.append(self._position_map(op, p, sources, config))
            v = Concat(tuple(moved), v.units, v.roles, moved[0].spatial)
        else:
            v = self._position_map(op, v, sources, config)
        if width_src is not None:
            try:
                v = self._reindex(v, tuple(width_src))
            except _Unsplittable as e:
                raise refuse(op, f"a slice along the width (part of the units) of an activation that is not "
                                 f"Gaussian ({e.what}) is not supported yet; slices of a weight's output are read "
                                 f"(a fused query-key-value projection split in three: slice before the "
                                 f"nonlinearity)") from None
        return v

    def _position_map(self, op: Op, v: Field, sources: tuple, config) -> Field:
        if sources == tuple(tuple(range(n)) for n in v.spatial):
            return v
        return self._mapped(op, v, PositionMap(sources), v.roles, v.width, "positions", config,
                            sizes=tuple(len(s) for s in sources))

    # -- parts of the width ---------------------------------------------------------------------------------
    def _reindex(self, v, src: tuple):
        """The units ``src`` of ``v`` (a field or a concatenation), in that order: each part of ``v`` restricted to
        the units it holds there (`_restrict`); one field when one part holds them all, else a `Concat`.
        `_Unsplittable` when a part that is not Gaussian would have to be cut."""
        if isinstance(v, Field):
            return v if src == tuple(range(v.width)) else self._restrict(v, src)
        where = {u: (k, i) for k, units in enumerate(v.units) for i, u in enumerate(units)}
        picked: dict = {}
        for j, u in enumerate(src):
            k, i = where[u]
            idx, pos = picked.setdefault(k, ([], []))
            idx.append(i)
            pos.append(j)
        parts, units = [], []
        for k in sorted(picked):
            idx, pos = picked[k]
            part = v.parts[k]
            if tuple(idx) != tuple(range(len(v.units[k]))):
                part = self._restrict(part, tuple(idx))
            parts.append(part)
            units.append(tuple(pos))
        if len(parts) == 1:
            return parts[0]
        return Concat(tuple(parts), tuple(units), v.roles, v.spatial)

    def _restrict(self, f, idx: tuple) -> Field:
        """The units ``idx`` of a Gaussian field (a weight's output, a bias, their sums and spatial maps): each
        term restricted to them (`_restrict_term`). An activation's units are not split (`_Unsplittable`)."""
        if isinstance(f, Concat):
            return self._reindex(f, idx)
        if not isinstance(f, Field):
            raise _Unsplittable("a product of two activations")
        terms = tuple((self._restrict_term(t, idx), c) for t, c in f.terms)
        return Field(terms, f.roles, len(idx), f.spatial)

    def _restrict_term(self, t, idx: tuple):
        """A term on the units ``idx`` of its width. ``W a`` on some of ``W``'s columns is a weight of its own
        (different columns are independent); the same restriction twice is the same term."""
        if t is ONES:
            return t
        key = (id(t), idx)
        if key in self._restricted:
            return self._restricted[key][1]
        if isinstance(t, Affine):
            new = Affine(t.weight, t.inp, t.layer, _compose_units(t.units, idx))
        elif isinstance(t, BiasTerm):
            new = BiasTerm(t.leaf, t.variance, t.ntk, t.positional, _compose_units(t.units, idx))
        elif isinstance(t, Mixed):  # attention mixes positions unit by unit
            new = Mixed(t.weights, self._restrict(t.inp, idx), t.key)
        elif isinstance(t, Mapped) and t.key[0] != "flatten":  # pooling and moves act on each unit alike
            new = Mapped(t.layer, self._restrict(t.inp, idx), t.key)
        elif isinstance(t, Mapped):
            raise _Unsplittable("a flattened activation, whose units are positions and channels")
        else:
            raise _Unsplittable(f"the nonlinearity at {t.where}" if isinstance(t, Nonlin) else type(t).__name__)
        self._restricted[key] = (t, new)
        return new

    def _onto(self, v, units: tuple) -> list:
        """``v`` (a field or a concatenation of the whole width) on each part of the split ``units``."""
        if isinstance(v, Concat) and v.units == units:
            return list(v.parts)
        return [self._reindex(v, u) for u in units]

    def _concatenate(self, op: Op, ins):
        """Concatenation along a spatial axis (sequences joined, a class token put in front): the sum of the parts,
        each padded with zeros to the whole length. Parts must be independent of one another (a random token and
        an activation, two independent branches). Along the width: a `Concat`."""
        d = int(op.params["dimension"])
        fields = [v for v in ins if isinstance(v, (Field, Concat))]
        if not fields:
            raise refuse(op, "a concatenation of values that are not activations")
        roles = fields[0].roles
        if roles[d] == "w":
            return self._concat_width(op, ins, d)
        if any(isinstance(v, Concat) for v in ins):
            raise refuse(op, "a concatenation along a spatial axis of concatenations along the width is not "
                             "supported yet")
        if not roles[d].startswith("s"):
            what = {"b": "the batch axis"}.get(roles[d], f"axis {roles[d]}")
            raise refuse(op, f"a concatenation along {what} is not supported; along the width or a spatial axis "
                             f"it is")
        axis = int(roles[d][1:])
        sizes = [int(self.program.avals[i].shape[d]) for i in op.ins]
        total, offset, parts = sum(sizes), 0, []
        for v, size in zip(ins, sizes):
            if isinstance(v, Param):
                v = self._param_field(op, v, roles, fields[0])
            elif isinstance(v, Const) and not np.any(np.asarray(v.value)):
                offset += size
                continue
            elif not isinstance(v, Field) or v.roles != roles:
                raise refuse(op, f"a concatenation of {type(v).__name__} with activations of axes {roles}")
            sources = [tuple(range(n)) for n in v.spatial]
            sources[axis] = tuple([-1] * offset + list(range(size)) + [-1] * (total - offset - size))
            parts.append(self._position_map(op, v, tuple(sources), ("concatenate", offset, tuple(sources))))
            offset += size
        out = parts[0]
        for part in parts[1:]:
            out = _add_fields(out, part)
        return out

    def _concat_width(self, op: Op, ins, d: int) -> Concat:
        """Activations side by side along the width (DenseNet's ``concatenate([h, f(h)], -1)``): a `Concat`, whose
        parts keep their own units; the next layer's kernel is the width-weighted average of theirs."""
        parts, units, offset = [], [], 0
        first = next(v for v in ins if isinstance(v, (Field, Concat)))
        for v, var in zip(ins, op.ins):
            size = int(self.program.avals[var].shape[d])
            if isinstance(v, Param):
                v = self._bias(op, v, Field((), first.roles, size, first.spatial), 1.0)
            if isinstance(v, DataIn):
                raise refuse(op, "a concatenation of the input (a finite number of features) with activations along "
                                 "the width: the input's share of the width vanishes in the limit, while the finite "
                                 "network keeps it; concatenate activations (the input after a dense layer)")
            if isinstance(v, Const):
                raise refuse(op, "a fixed value concatenated with activations along the width (channels of zeros "
                                 "or constants) is not supported yet")
            if not isinstance(v, (Field, Concat)):
                raise refuse(op, f"a concatenation along the width of {type(v).__name__} with activations")
            if v.roles != first.roles or v.spatial != first.spatial or v.width != size:
                raise refuse(op, f"a concatenation along the width of activations with axes {v.roles} and "
                                 f"{first.roles} (spatial sizes {v.spatial} and {first.spatial})")
            if isinstance(v, Concat):
                parts += list(v.parts)
                units += [tuple(offset + u for u in us) for us in v.units]
            else:
                parts.append(v)
                units.append(tuple(range(offset, offset + size)))
            offset += size
        return Concat(tuple(parts), tuple(units), first.roles, first.spatial)

    # -- operations on a concatenation along the width: part by part ------------------------------------------
    def _concat_op(self, op: Op, ins, m: Moments):
        name = op.name
        c = next(v for v in ins if isinstance(v, Concat))
        if name in ELEMENTWISE:
            return self._concat_elementwise(op, ins, m)
        if name == "reduce_sum":
            return self._concat_reduce(op, c, m)
        if name in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose"):
            return self._concat_layout(op, c)
        if name in ("slice", "pad", "rev"):
            return self._move_positions(op, ins)
        if name == "reduce_window_sum":
            _check_parts(op, c, "pooling")
            pooled = tuple(self._sum_pool(op, p) for p in c.parts)
            return Concat(pooled, c.units, c.roles, pooled[0].spatial)
        raise refuse(op, "this operation on a concatenation along the width (channels) has no rule here")

    def _entrywise(self, op: Op, ins, m: Moments):
        """An entrywise operation: a statistic per channel applied to a field, constants per channel that split a
        field's units (`_per_channel`), or the rules of `_elementwise`."""
        if any(isinstance(v, PerExChannels) for v in ins):
            return self._scale_per_channel(op, ins, m)
        grouped = self._per_channel(op, ins, m)
        return grouped if grouped is not None else self._elementwise(op, ins, m)

    def _statistic_per_channel(self, op: Op, ins):
        """``s * c`` (or ``s / c``) for a per-example statistic ``s`` and a constant ``c`` that varies along one axis
        only, where ``s`` has size one: a `PerExChannels` (None otherwise)."""
        if op.name not in ("mul", "div") or len(ins) != 2:
            return None
        p, c = ins if isinstance(ins[0], PerEx) else ins[::-1]
        if not (isinstance(p, PerEx) and isinstance(c, Const)) or p.power or (op.name == "div" and ins[1] is not c):
            return None
        arr = np.asarray(c.value)
        if arr.ndim != len(self.program.avals[op.outs[0]].shape) or arr.ndim != len(p.roles):
            return None
        varying = [a for a in range(arr.ndim) if arr.shape[a] > 1 and not np.all(arr == np.take(arr, [0], axis=a))]
        if len(varying) != 1 or p.roles[varying[0]] != "1":
            return None
        if op.name == "div":
            arr = 1.0 / arr
        return PerExChannels(p, arr)

    def _scale_per_channel(self, op: Op, ins, m: Moments):
        """A field (or a concatenation) times a `PerExChannels`: times the statistic, then times the constant per
        channel (which splits its units into groups, `_per_channel`)."""
        pc = next(v for v in ins if isinstance(v, PerExChannels))
        others = [v for v in ins if v is not pc]
        if op.name != "mul" or len(others) != 1 or not isinstance(others[0], (Field, Concat)):
            raise refuse(op, "a per-example statistic times a constant per channel (a normalisation's scale) is "
                             "read only as the factor of an activation")
        f = others[0]
        scaled = (self._concat_elementwise if isinstance(f, Concat) else self._entrywise)(op, [f, pc.perex], m)
        const = Const(pc.const)
        if isinstance(scaled, Concat):
            return self._concat_elementwise(op, [scaled, const], m)
        return self._entrywise(op, [scaled, const], m)

    def _concat_elementwise(self, op: Op, ins, m: Moments):
        """An entrywise operation with a concatenation: applied part by part, each operand on each part's units
        (a field of the whole width restricted to them, a constant per channel sliced, a bias split)."""
        concats = [v for v in ins if isinstance(v, Concat)]
        units = concats[0].units
        for other in concats[1:]:
            if other.units != units:
                units = _refine(units, other.units)
        n = concats[0].width
        w_axis = concats[0].roles.index("w")
        per_operand = []
        try:
            for v in ins:
                if isinstance(v, Param) and op.name in ("add", "sub"):
                    v = self._bias(op, v, Field((), concats[0].roles, n, concats[0].spatial), 1.0)
                if isinstance(v, (Field, Concat)):
                    if v.width != n:
                        raise refuse(op, f"a concatenation along the width of {n} units combined entrywise with an "
                                         f"activation of width {v.width}")
                    per_operand.append(self._onto(v, units))
                elif isinstance(v, Const):
                    arr = np.asarray(v.value)
                    if arr.ndim == 0 or arr.ndim <= w_axis or arr.shape[w_axis] == 1:
                        per_operand.append([v] * len(units))
                    else:
                        per_operand.append([Const(np.take(arr, np.asarray(u), axis=w_axis)) for u in units])
                elif isinstance(v, PerEx):
                    per_operand.append([v] * len(units))
                elif isinstance(v, PerExChannels) and v.const.shape[w_axis] == n:
                    per_operand.append([PerExChannels(v.perex, np.take(v.const, np.asarray(u), axis=w_axis))
                                        for u in units])
                else:
                    raise refuse(op, f"a concatenation along the width combined entrywise with "
                                     f"{type(v).__name__} has no rule here")
        except _Unsplittable as e:
            raise refuse(op, f"a concatenation along the width combined entrywise with an activation that is not "
                             f"split into the same parts ({e.what}: its units would have to be split, which is "
                             f"supported for Gaussian fields only)") from None
        parts, out_units = [], []
        outer = self._part
        for k, us in enumerate(units):
            self._part = outer + (k,)
            try:
                out = self._entrywise(op, [vals[k] for vals in per_operand], m)
            finally:
                self._part = outer
            if isinstance(out, Concat):  # a constant per channel split this part further
                parts += list(out.parts)
                out_units += [tuple(us[i] for i in sub) for sub in out.units]
            elif isinstance(out, (Field, FieldProduct)):
                parts.append(out)
                out_units.append(us)
            else:
                raise refuse(op, f"an entrywise operation on a concatenation along the width gives "
                                 f"{type(out).__name__}; it has no rule here")
        roles = max((p.roles for p in parts), key=len)
        return Concat(tuple(parts), tuple(out_units), roles, concats[0].spatial)

    def _concat_reduce(self, op: Op, c: Concat, m: Moments):
        """A mean over the width of a concatenation: the width-weighted average of its parts' means (layer
        normalisation of a DenseNet's concatenation); a sum over other axes (global pooling): part by part."""
        axes = tuple(op.params["axes"])
        summed = {c.roles[a] for a in axes}
        results = [self._reduce_sum(op, p, m) for p in c.parts]
        if "w" not in summed:
            return Concat(tuple(results), c.units, results[0].roles, results[0].spatial)
        n = c.width
        v1 = sum(r.v1 * (len(u) / n) for r, u in zip(results, c.units))
        v2 = None if all(r.v2 is None for r in results) else sum(
            (r.v1 if r.v2 is None else r.v2) * (len(u) / n) for r, u in zip(results, c.units))
        return PerEx(v1, v2, results[0].roles, all(r.zero for r in results), power=1, power_width=n)

    def _concat_layout(self, op: Op, c: Concat) -> Concat:
        """Axes of size one added or removed, or permuted, on every part alike."""
        out_shape = tuple(self.program.avals[op.outs[0]].shape)
        if op.name == "transpose":
            roles = tuple(c.roles[p] for p in op.params["permutation"])
        else:
            in_shape = tuple(self.program.avals[op.ins[0]].shape)
            if [s for s in out_shape if s != 1] != [s for s in in_shape if s != 1]:
                raise refuse(op, f"a reshape of a concatenation along the width with axes {c.roles} to shape "
                                 f"{out_shape} (flattening, attention heads, positions regrouped) is not supported "
                                 f"yet; apply a dense layer or a convolution to the concatenation first")
            roles = self._roles_after(op, c.roles, out_shape)
            if [r for r in roles if r != "1"] != [r for r in c.roles if r != "1"]:
                raise refuse(op, f"a reshape of a concatenation along the width with axes {c.roles} to shape "
                                 f"{out_shape}")
        parts = tuple(p.like(p.terms, roles) if isinstance(p, Field) else
                      FieldProduct(p.left, p.right, roles, p.width, p.spatial) for p in c.parts)
        return Concat(parts, c.units, roles, c.spatial)

    def _per_channel(self, op: Op, ins, m: Moments):
        """An entrywise operation of fields with a constant per channel that takes a few values along the width
        (batch normalisation in inference mode: running statistics, scales and offsets per channel): the units
        grouped by their values, each group a part of a `Concat` with uniform constants (exact with each group's
        share of the width fixed as it grows). None when no constant varies along the width only."""
        fields = [v for v in ins if isinstance(v, Field)]
        if not fields or any(isinstance(v, (FieldProduct, Param, DataIn, PerPos, Concat)) for v in ins):
            return None
        f = fields[0]
        out_shape = tuple(self.program.avals[op.outs[0]].shape)
        if "w" not in f.roles or len(f.roles) != len(out_shape):
            return None
        # (on a part of a concatenation the output's shape is the whole's: the constants are the part's already)
        w_axis, n = f.roles.index("w"), f.width
        if n < 2 or any(g.roles.index("w") != w_axis if "w" in g.roles else True for g in fields):
            return None
        columns = []
        for v in ins:
            if not isinstance(v, Const):
                continue
            arr = np.asarray(v.value)
            if arr.ndim != len(out_shape) or arr.shape[w_axis] != n:
                continue
            rows = np.moveaxis(arr, w_axis, -1).reshape(-1, n)
            if not np.all(rows == rows[:1]):
                return None  # varies along another axis: refused with the constant's own message
            if np.all(rows[0] == rows[0, 0]):
                continue
            columns.append(rows[0])
        if not columns:
            return None
        groups: dict = {}
        for j, key in enumerate(zip(*[c.tolist() for c in columns])):
            groups.setdefault(key, []).append(j)
        if len(groups) > MAX_CHANNEL_GROUPS:
            raise refuse(op, f"a constant per channel that takes {len(groups)} different values along the width "
                             f"(batch normalisation in inference mode with trained statistics, scales or offsets): "
                             f"each value is a part of its own in the kernel (exact with each value's share of the "
                             f"width fixed), and more than {MAX_CHANNEL_GROUPS} is too many; constants equal "
                             f"across the channels are read as one")
        units = tuple(tuple(g) for g in groups.values())
        try:
            split = [Concat(tuple(self._onto(g, units)), units, g.roles, g.spatial) if isinstance(g, Field) else g
                     for g in ins]
        except _Unsplittable as e:
            raise refuse(op, f"a constant per channel that varies along the width (batch normalisation in inference "
                             f"mode with statistics, scales or offsets that differ across channels) applied to an "
                             f"activation that is not Gaussian ({e.what}) is not supported yet: it splits the units "
                             f"into groups, which is done for Gaussian fields (normalisation before the "
                             f"nonlinearity) only; constants equal across the channels are read anywhere") from None
        return self._concat_elementwise(op, split, m)

    def _param_field(self, op: Op, p: Param, roles: tuple, like: Field) -> Field:
        """A random leaf standing as an activation (a class token concatenated with a sequence): a bias field,
        one draw per unit, or per unit and position when the leaf runs along spatial axes."""
        shape = tuple(int(n) for n in p.shape)
        spatial = [0] * len(like.spatial)
        for a, r in enumerate(roles):
            if r.startswith("s"):
                spatial[int(r[1:])] = shape[a]
        return self._bias(op, p, Field((), roles, like.width, tuple(spatial)), 1.0)

    def _heads_reshape(self, op: Op, v: Field, out_shape: tuple) -> Field | None:
        """Attention heads: the width split into (heads, width per head), or the two merged back. The coordinates
        of a field are exchangeable, so the split only renames axes; the limit takes the width per head to
        infinity with the number of heads fixed (the ``'h'`` axis)."""
        in_shape = tuple(self.program.avals[op.ins[0]].shape)
        roles = v.roles
        if "h" not in roles and "w" in roles:
            i = roles.index("w")
            if (len(out_shape) == len(in_shape) + 1 and out_shape[:i] == in_shape[:i]
                    and out_shape[i + 2:] == in_shape[i + 1:] and min(out_shape[i], out_shape[i + 1]) > 1):
                return Field(v.terms, roles[:i] + ("h", "w") + roles[i + 1:], out_shape[i + 1], v.spatial)
        if "h" in roles:
            i = min(roles.index("h"), roles.index("w"))
            if (abs(roles.index("h") - roles.index("w")) == 1 and len(out_shape) == len(in_shape) - 1
                    and out_shape[:i] == in_shape[:i] and out_shape[i + 1:] == in_shape[i + 2:]):
                width = in_shape[i] * in_shape[i + 1]
                return Field(v.terms, roles[:i] + ("w",) + roles[i + 2:], width, v.spatial)
        return None

    def _roles_after(self, op: Op, roles: tuple, out_shape: tuple) -> tuple:
        """Roles after a reshape / broadcast that only adds or removes axes of size one (or broadcasts them)."""
        name = op.name
        if name == "broadcast_in_dim":
            dims = op.params["broadcast_dimensions"]
            out = ["1"] * len(out_shape)
            for r, d in zip(roles, dims):
                out[d] = r
            for d, size in enumerate(out_shape):
                if out[d] == "1" and size != 1:
                    out[d] = "w*"  # broadcast along a new axis: only the width may be broadcast into
            if any(r == "w*" for r in out):
                if "w" in out or sum(r == "w*" for r in out) > 1 or out.index("w*") != len(out) - 1:
                    raise refuse(op, f"a broadcast to shape {out_shape} of values with axes {roles}")
                out[out.index("w*")] = "w"
            return tuple(out)
        # match the axes in order by size; axes of size one without a role come and go
        items = [(r, s) for r, s in zip(roles, self.program.avals[op.ins[0]].shape) if not (s == 1 and r == "1")]
        out, i = [], 0
        for size in out_shape:
            if i < len(items) and items[i][1] == size:
                out.append(items[i][0])
                i += 1
            elif size == 1:
                out.append("1")
            else:
                raise refuse(op, f"a reshape to {out_shape} that merges or splits axes {roles}")
        if items[i:]:
            raise refuse(op, f"a reshape to {out_shape} that drops axes {[r for r, _ in items[i:]]} of {roles}")
        return tuple(out)

    def _transpose(self, op: Op, v):
        perm = op.params["permutation"]
        if isinstance(v, Param):
            shape = tuple(v.shape[p] for p in perm)
            carry = tuple(sorted(list(perm).index(a) for a in v.carrying()))
            return Param(v.leaf, shape, v.scale, v.view + (("transpose", tuple(perm)),), carry)
        if isinstance(v, Field):
            return v.like(v.terms, tuple(v.roles[p] for p in perm))
        raise refuse(op, f"a transpose of {type(v).__name__}")

    # -- entrywise operations ----------------------------------------------------------------------------
    def _elementwise(self, op: Op, ins, m: Moments):
        name = op.name
        if any(isinstance(v, Param) for v in ins):
            fields = [v for v in ins if isinstance(v, Field)]
            if fields and name in ("add", "sub"):
                f = fields[0]
                p = next(v for v in ins if isinstance(v, Param))
                bias = self._bias(op, p, f, -1.0 if (name == "sub" and ins[1] is p) else 1.0)
                lead = f if (name == "add" or ins[0] is f) else _scale_field(f, -1.0)
                return _add_fields(lead, bias)
            if not fields and not any(isinstance(v, (PerEx, DataIn)) for v in ins):
                return self._param_op(op, ins)
            raise refuse(op, "a random parameter combined entrywise with an activation other than by adding it "
                             "(a random gate or scale) has no rule here")
        if any(isinstance(v, DataIn) for v in ins):
            raise refuse(op, "the input combined entrywise with an activation")
        has_field = any(isinstance(v, (Field, FieldProduct)) for v in ins)
        if not has_field:
            return self._perex_op(op, ins)
        linear = self._linear(op, ins)
        if linear is not None:
            return linear
        return self._nonlinear(op, ins)

    def _linear(self, op: Op, ins):
        """Add, subtract, negate, scale: the field stays a combination of its terms (real floating values only:
        arithmetic on a comparison's booleans, or their conversion to numbers, is a function of the chain)."""
        name = op.name
        if any(isinstance(v, FieldProduct) for v in ins):
            return None
        if not all(self._floating(v) for v in op.ins + op.outs):
            return None
        if name in ("convert_element_type", "reduce_precision"):
            return ins[0]
        if name == "neg":
            return _scale_field(ins[0], -1.0)
        if name in ("add", "sub"):
            a, b = ins
            sign = -1.0 if name == "sub" else 1.0
            if isinstance(a, Field) and isinstance(b, Field):
                return self._fuse(op, _add_fields(a, _scale_field(b, sign)))
            f, other, f_first = (a, b, True) if isinstance(a, Field) else (b, a, False)
            if isinstance(other, Const) and not f_first and name == "sub":
                # c - F
                c = _uniform_scalar(other.value, op, "a constant added to an activation")
                return _add_ones(_scale_field(f, -1.0), c)
            if isinstance(other, Const):
                c = _uniform_scalar(other.value, op, "a constant added to an activation")
                return _add_ones(f, c * (sign if f_first else 1.0))
            if isinstance(other, PerEx):
                self._check_power(op, other)
                if other.zero:
                    return f if (f_first or name == "add") else _scale_field(f, -1.0)
                lead = f if (f_first or name == "add") else _scale_field(f, -1.0)
                coef = other if (name == "add" or not f_first) else _perex_neg(other)
                return _add_fields(lead, f.like(((ONES, coef),)))
            return None
        if name in ("mul", "div"):
            a, b = ins
            if isinstance(a, Field) and isinstance(b, Field):
                return None
            f, other, f_first = (a, b, True) if isinstance(a, Field) else (b, a, False)
            if name == "div" and not f_first:
                return None  # c / F: nonlinear
            if isinstance(other, Const):
                c = _uniform_scalar(other.value, op, "a constant factor of an activation")
                return _scale_field(f, c if name == "mul" else 1.0 / c)
            if isinstance(other, PerEx):
                self._check_power(op, other)
                if other.zero:
                    if name == "div":
                        raise refuse(op, "an activation divided by an exactly zero statistic")
                    return f.like(())
                coef = other if name == "mul" else _perex_apply(lambda v: 1.0 / v, other)
                return _scale_field(f, coef)
        return None

    def _floating(self, v: int) -> bool:
        """Whether the program's variable ``v`` (an operand or a result) holds real floating-point values."""
        return bool(jnp.issubdtype(self.program.avals[v].dtype, jnp.floating))

    def _fuse(self, op: Op, f: Field) -> Field:
        """``f`` with the terms that are functions of one Gaussian pre-activation made one activation.

        Nonlinear terms of one base ``g`` (``0.3 min(g, 0) + 1.7 max(g, 0)``, ``tanh(g) + sin(g) / 2``), with
        ``alpha g`` when ``f`` holds that multiple of the base (``relu(g) + g``), are one function of ``g``:
        they become one `Nonlin` term, whose activation is named by value (a closed form when it is one, the
        quadrature of the one function when it is not), so that its kernel does not depend on how the sum was
        spelled. The all-ones vector stays a term of its own (its moments with an activation are its mean, in
        closed form where the activation has one), and so do the terms of other bases (other Gaussians) and
        nonlinear terms with a per-example coefficient."""
        groups: dict = {}
        for t, c in f.terms:
            if isinstance(t, Nonlin) and not isinstance(c, PerEx):
                groups.setdefault(_base_key(t.base), []).append((t, c))
        terms = list(f.terms)
        for k, members in enumerate(groups.values()):
            base = members[0][0].base
            alpha, claimed = _multiple_of(terms, base)
            if len(members) + bool(claimed) < 2:
                continue
            fused = Nonlin(_combination(alpha, [(t.fn, c) for t, c in members]), base, None, op.where,
                           origin=(self._origin(op), k))
            drop = {id(t) for t, _ in members} | claimed
            kept = []
            for t, c in terms:
                if id(t) not in drop:
                    kept.append((t, c))
                elif fused is not None:  # the fused term takes the place of the first of its parts
                    kept.append((fused, 1.0))
                    fused = None
            terms = kept
        return f.like(terms)

    def _nonlinear(self, op: Op, ins):
        """A function of one Gaussian field (an activation's chain), or the product of two fields."""
        if any(isinstance(v, PerEx) for v in ins):
            raise refuse(op, "a nonlinearity whose shape depends on a per-example statistic (it is not a function "
                             "of one Gaussian with fixed parameters)")
        fields = [v for v in ins if isinstance(v, (Field, FieldProduct))]
        if any(isinstance(v, FieldProduct) for v in fields):
            raise refuse(op, "a nonlinear function of the product of two activations that are not functions of "
                             "one Gaussian")
        funcs = [_as_function(v) for v in fields]
        if all(f is not None for f in funcs) and len({_base_key(b) for b, _ in funcs}) == 1:
            fn = self._compose(op, ins, {id(v): f for v, (_, f) in zip(fields, funcs)})
            nl = Nonlin(fn, funcs[0][0], _product_pair(op, ins), op.where, origin=self._origin(op))
            return fields[0].like(((nl, 1.0),))
        pair = _product_pair(op, ins)
        if pair is not None:
            return FieldProduct(pair[0], pair[1], pair[0].roles, pair[0].width, pair[0].spatial)
        raise refuse(op, "a nonlinearity applied to several independent activations, or to their sum (a function "
                         "of more than one Gaussian); only a sum of Gaussians (affine layers, biases) enters an "
                         "activation")

    def _compose(self, op: Op, ins, fns):
        """``u -> prim(operands)`` with each field replaced by its function of the base ``u``."""
        consts = []
        for v in ins:
            if isinstance(v, Const):
                consts.append(_uniform_scalar(v.value, op, "a constant in an activation"))
            else:
                consts.append(None)
        prim, params = op.prim, op.params

        def fn(u):
            args = []
            for v, c in zip(ins, consts):
                if c is None:
                    args.append(fns[id(v)](u))
                else:
                    dt = op_dtype(v, u)
                    args.append(jnp.broadcast_to(jnp.asarray(c, dt), jnp.shape(u)))
            return prim.bind(*args, **params)

        def op_dtype(v, u):
            dt = np.asarray(v.value).dtype
            return u.dtype if dt.kind == "f" else dt

        return fn

    # -- reductions over the width -------------------------------------------------------------------------
    def _reduce_sum(self, op: Op, v, m: Moments):
        axes = tuple(op.params["axes"])
        if isinstance(v, PerEx):
            raise refuse(op, "a sum over the batch of per-example statistics (batch statistics)")
        if not isinstance(v, (Field, FieldProduct)):
            raise refuse(op, f"a sum of {type(v).__name__}")
        roles = v.roles
        summed = {roles[a] for a in axes}
        if "b" in summed:
            raise refuse(op, "a sum over the batch axis: batch statistics (batch normalisation, a mean over "
                             "examples) couple the examples and have no per-example kernel")
        spatial = {f"s{i}" for i in range(len(getattr(v, "spatial", ())))}
        if spatial and summed - {"1"} == spatial and isinstance(v, Field):
            # a sum (a mean, once divided) over every spatial axis: global pooling
            out_roles = tuple(r for i, r in enumerate(roles) if i not in axes)
            return self._mapped(op, v, stax.GlobalSumPool(), out_roles, v.width, "global", ())
        if spatial and "w" in summed:
            where = ("and every spatial axis" if spatial <= summed else
                     "at each position" if not summed & spatial else f"and the spatial axes {sorted(summed & spatial)}")
            raise refuse(op, f"a sum over the width (channels) {where} of spatial activations with axes {roles} "
                             f"(a layer norm over the channels, or over every axis, of a convolutional or sequence "
                             f"layer): statistics over the width are supported for activations without spatial "
                             f"axes, not yet per position")
        if spatial and summed - {"1"} == spatial:
            raise refuse(op, f"global pooling (a sum over every spatial axis) of a {type(v).__name__} with axes "
                             f"{roles} (a product of two activations): global pooling is supported for "
                             f"activations, not yet for their products; an affine layer after the product makes "
                             f"it an activation")
        if spatial:
            raise refuse(op, f"a sum over the spatial axes {sorted(summed - {'1'})} of activations with axes "
                             f"{roles}: only a sum over every spatial axis (global pooling) is supported; "
                             f"reduce_window_sum pools part of them")
        if summed - {"1"} != {"w"}:
            raise refuse(op, f"a sum over axes {axes} with roles {roles}")
        out_roles = tuple(r for i, r in enumerate(roles) if i not in axes)
        if isinstance(v, FieldProduct):
            k = m.field_or_zero(v.left, v.right)
            out = PerEx(k.cov1, k.cov2, out_roles, power=1)
            out.power_width = v.width
            return out
        return _field_mean(v, m, out_roles)

    # -- per-example statistics ----------------------------------------------------------------------------
    def _check_power(self, op: Op, p: PerEx):
        if p.power != 0:
            raise refuse(op, f"a sum over a width of {p.power_width}{_width_scaling(p)}, not divided by the width "
                             f"(as a mean is), grows without bound with the width; use a mean")

    def _perex_op(self, op: Op, ins):
        perex = [v for v in ins if isinstance(v, PerEx)]
        if not perex:
            raise refuse(op, f"unsupported operands {[type(v).__name__ for v in ins]}")
        channels = self._statistic_per_channel(op, ins)
        if channels is not None:
            return channels
        name = op.name
        roles = ("b",) + ("1",) * (len(self.program.avals[op.outs[0]].shape) - 1)
        # dividing (multiplying) a sum over the width by the width (its inverse) makes it a mean
        if name in ("div", "mul") and len(ins) == 2 and any(v.power for v in perex):
            p = perex[0]
            mean, scalings, factor = _scale_sum(op, ins, p, "a sum over the width combined with another statistic "
                                                            "before it is divided by the width")
            if mean:
                return PerEx(_scaled_values(p.v1, factor), _scaled_values(p.v2, factor), roles, p.zero, 0)
            return PerEx(p.v1, p.v2, roles, p.zero, 1, p.power_width, scalings)
        for p in perex:
            self._check_power(op, p)
        consts = [None if isinstance(v, PerEx) else _uniform_scalar(v.value, op, "a constant") for v in ins]

        def side(which):
            args = [c if c is not None else (v.v1 if which == 1 or v.v2 is None else v.v2)
                    for v, c in zip(ins, consts)]
            ref = next(a for a in args if not isinstance(a, (bool, int, float)))
            full = []
            for a in args:
                if isinstance(a, float):
                    a = jnp.asarray(a, ref.dtype)
                full.append(jnp.broadcast_to(jnp.asarray(a), jnp.shape(ref)))
            return op.prim.bind(*full, **op.params)

        zero = (name == "mul" and any(p.zero for p in perex)) or (
            name in ("square", "neg", "convert_element_type") and perex[0].zero) or (
            name == "integer_pow" and perex[0].zero and op.params["y"] > 0)
        v2 = None if all(p.v2 is None for p in perex) else side(2)
        return PerEx(side(1), v2, roles, zero)


def _scale_sum(op: Op, ins, p, combined: str) -> tuple[bool, tuple, float]:
    """A constant factor on the sum over the width ``p`` (``p.power == 1``): ``(mean, scalings, factor)``.

    A factor may be a power of sqrt(width) (one over the width, one over its square root) or a plain constant
    that happens to equal one; both readings are kept (``scalings``: pairs of the powers of sqrt(width) and the
    other constants). Once a reading reaches one over the width the sum is a mean (``mean``), its values to be
    multiplied by that reading's constants (``factor``): ``QK * s / d``, ``s / sqrt(d) * QK / sqrt(d)`` and
    ``0.25 * s / 16`` at width 16 are all means. `TracedError` with ``combined`` when the other operand is not a
    constant (or the sum is a denominator)."""
    other = ins[1] if ins[0] is p else ins[0]
    if not isinstance(other, Const) or (op.name == "div" and ins[1] is p):
        raise refuse(op, combined)
    c = _uniform_scalar(other.value, op, "a constant factor")
    factor = c if op.name == "mul" else 1.0 / c
    root = math.sqrt(p.power_width)
    powers = [h for h in (-2, -1, 1, 2) if abs(factor * root ** -h - 1.0) <= 1e-6]
    readings = []
    for halves, const in p.scalings:
        readings += [(halves + h, const) for h in powers] + [(halves, const * factor)]
    for halves, const in readings:
        if halves == -2:
            return True, (), const
    return False, tuple(dict.fromkeys(readings))[:8], 1.0


def _width_scaling(p) -> str:
    """How a sum over the width was scaled, for messages."""
    halves, const = p.scalings[0]
    total = const * math.sqrt(p.power_width) ** halves
    return "" if total == 1.0 else f" and scaled by {total:.6g}"


def _scaled_values(v, factor: float):
    return v if v is None or factor == 1.0 else v * factor


class _AllPairs:
    """The rule of attention for `Interpreter.needs_full`: its input's kernel needs every pair of positions."""

    @staticmethod
    def needs_full(out_full: bool) -> bool:
        return True


_ALL_PAIRS = _AllPairs()


def _padding_name(op: Op, sizes, window, strides, pads) -> str:
    """'VALID' or 'SAME' for the explicit padding a traced convolution or pooling carries."""
    pads = [tuple(p) for p in pads]
    if all(p == (0, 0) for p in pads):
        return "VALID"
    if pads == [tuple(p) for p in lax.padtype_to_pads(tuple(sizes), tuple(window), tuple(strides), "SAME")]:
        return "SAME"
    raise refuse(op, f"padding {pads} is neither 'VALID' nor 'SAME' for window {tuple(window)} and strides "
                     f"{tuple(strides)} (circular or uneven padding is not supported yet)")


class _Unsplittable(Exception):
    """Raised where part of the units of a value that is not Gaussian is needed; ``what`` names it."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _compose_units(units, idx: tuple) -> tuple:
    """The units ``idx`` of a term that holds ``units`` of its weight (None: all, in order)."""
    return tuple(idx) if units is None else tuple(units[i] for i in idx)


def _check_parts(op: Op, c: Concat, what: str):
    """A concatenation entering ``what`` must be made of activations (not of products of them)."""
    if not all(isinstance(p, Field) for p in c.parts):
        raise refuse(op, f"{what} applied to a concatenation along the width of products of activations (an "
                         f"entrywise product not yet reduced); only activations enter a weight")


def _refine(a: tuple, b: tuple) -> tuple:
    """The common refinement of two splits of the units into parts: units grouped by the pair of parts that hold
    them, in the order of ``a``'s parts (a part of ``a`` that ``b`` does not cut keeps its order)."""
    of_b = {u: i for i, units in enumerate(b) for u in units}
    groups: dict = {}
    for i, units in enumerate(a):
        for u in units:
            groups.setdefault((i, of_b[u]), []).append(u)
    return tuple(tuple(g) for g in groups.values())


# -- field algebra ------------------------------------------------------------------------------------------

def _scale_field(f: Field, c) -> Field:
    if isinstance(c, float) and c == 1.0:
        return f
    return f.like((t, _mul_coef(k, c)) for t, k in f.terms)


def _mul_coef(a, b):
    if isinstance(a, PerEx) or isinstance(b, PerEx):
        pa = a if isinstance(a, PerEx) else None
        pb = b if isinstance(b, PerEx) else None
        if pa is not None and pb is not None:
            return PerEx(pa.v1 * pb.v1, None if pa.v2 is None and pb.v2 is None else
                         (pa.v2 if pa.v2 is not None else pa.v1) * (pb.v2 if pb.v2 is not None else pb.v1),
                         pa.roles)
        p, s = (pa, b) if pa is not None else (pb, a)
        return _perex_apply(lambda v: v * s, p)
    return a * b


def _perex_apply(fn, p: PerEx) -> PerEx:
    return PerEx(fn(p.v1), None if p.v2 is None else fn(p.v2), p.roles, p.zero, p.power, p.power_width,
                 p.scalings)


def _perex_neg(p: PerEx) -> PerEx:
    return _perex_apply(lambda v: -v, p)


def _add_fields(a: Field, b: Field) -> Field:
    if a.width != b.width:
        raise TracedError(f"smnngp.traced: adding activations of widths {a.width} and {b.width}")
    if a.spatial != b.spatial:
        raise TracedError(f"smnngp.traced: adding activations of spatial sizes {a.spatial} and {b.spatial}")
    terms = list(a.terms)
    for t, c in b.terms:
        for j, (u, d) in enumerate(terms):
            if u is t and not isinstance(c, PerEx) and not isinstance(d, PerEx):
                terms[j] = (u, d + c)
                break
        else:
            terms.append((t, c))
    terms = [(t, c) for t, c in terms if isinstance(c, PerEx) or c != 0.0]
    roles = a.roles if len(a.roles) >= len(b.roles) else b.roles
    return Field(tuple(terms), roles, a.width, a.spatial)


def _add_ones(f: Field, c: float) -> Field:
    if c == 0.0:
        return f
    return _add_fields(f, f.like(((ONES, c),)))


def _base_key(base: Field):
    return base.key()


def _as_function(f: Field):
    """``(base, fn)`` with ``f = fn(base)`` entrywise for one Gaussian field ``base``, or None.

    A Gaussian term may have a per-example coefficient (a normalised pre-activation is still Gaussian, with the
    per-example scale in its covariance); the nonlinear terms and the constant shift must have fixed ones."""
    gauss = [(t, c) for t, c in f.terms if t.gaussian]
    nonlin = [(t, c) for t, c in f.terms if isinstance(t, Nonlin)]
    ones = [c for t, c in f.terms if t is ONES]
    if any(isinstance(c, PerEx) for c in ones) or any(isinstance(c, PerEx) for _, c in nonlin):
        return None
    shift = sum(ones)
    if not nonlin:
        if not gauss:
            return None
        first = min(gauss, key=lambda tc: tc[0].uid)[1]
        if isinstance(first, PerEx) or any(isinstance(c, PerEx) for _, c in gauss):
            base, first = f.like(gauss), 1.0
        else:
            # the canonical base: the coefficient of its first term is 1 (so that F and -F, 2F share a base)
            base = f.like((t, c / first) for t, c in gauss)
        if first == 1.0:
            return base, (lambda u: u + shift) if shift else (lambda u: u)
        return base, (lambda u: first * u + shift) if shift else (lambda u: first * u)
    base = nonlin[0][0].base
    if any(_base_key(t.base) != _base_key(base) for t, _ in nonlin):
        return None
    alpha = 0.0
    if gauss:
        base_coefs = {id(t): c for t, c in base.terms}
        if {id(t) for t, _ in gauss} != set(base_coefs):
            return None
        ratios = set()
        for t, c in gauss:
            b = base_coefs[id(t)]
            if isinstance(c, PerEx) or isinstance(b, PerEx):
                if c is not b:
                    return None
                ratios.add(1.0)
            else:
                ratios.add(c / b)
        if len(ratios) != 1:
            return None
        alpha = ratios.pop()
    parts = [(t.fn, c) for t, c in nonlin]
    if not alpha and not shift and len(parts) == 1 and parts[0][1] == 1.0:
        return base, parts[0][0]  # keeps the chain's dtype (a comparison's booleans for select_n)

    def fn(u):
        out = alpha * u if alpha else 0.0
        for phi, c in parts:
            out = out + c * phi(u)
        return out + shift if shift else out

    return base, fn


def _multiple_of(terms, base: Field) -> tuple[float, set]:
    """``(alpha, ids)`` when the Gaussian terms among ``terms`` include ``alpha`` times every term of ``base`` (the
    ids of those terms), else ``(0.0, set())``. Per-example coefficients must be the base's own (alpha 1)."""
    coefs = {id(t): c for t, c in terms if t.gaussian}
    ratios = []
    for t, b in base.terms:
        c = coefs.get(id(t))
        if c is None:
            return 0.0, set()
        if isinstance(c, PerEx) or isinstance(b, PerEx):
            if c is not b:
                return 0.0, set()
            ratios.append(1.0)
        elif b == 0.0:
            return 0.0, set()
        else:
            ratios.append(c / b)
    alpha = ratios[0] if ratios else 0.0
    # the ratios of the base's rescaled coefficients may differ by a rounding
    if not ratios or alpha == 0.0 or any(abs(r - alpha) > 1e-12 * abs(alpha) for r in ratios):
        return 0.0, set()
    return alpha, {id(t) for t, _ in base.terms}


def _combination(alpha: float, parts):
    """``u -> alpha u + sum_i c_i phi_i(u)``: the one function of several terms of one base."""

    def fn(u):
        out = alpha * u if alpha else None
        for phi, c in parts:
            value = phi(u) if c == 1.0 else c * phi(u)
            out = value if out is None else out + value
        return out

    return fn


def _product_pair(op: Op, ins):
    """(F, G) when ``op`` is F * G, F ** 2 or square(F) for fields F, G; else None."""
    name = op.name
    fields = [v for v in ins if isinstance(v, Field)]
    if name == "mul" and len(fields) == 2:
        return fields[0], fields[1]
    if name == "square" or (name == "integer_pow" and op.params.get("y") == 2):
        return ins[0], ins[0]
    return None


def _field_mean(f: Field, m: Moments, roles) -> PerEx:
    """Mean over the width: Gaussian terms contribute zero, the ones vector its coefficient, phi(g) E[phi(g)]."""
    total1 = total2 = None
    if f.spatial:
        raise TracedError("smnngp.traced: a mean over the width of activations with spatial axes (layer "
                          "normalisation of a convolutional layer) is not supported yet")
    for t, c in f.terms:
        if t.gaussian:
            continue
        if isinstance(t, Mapped):
            raise TracedError("smnngp.traced: a mean over the width of a pooled or flattened activation that is not "
                              "Gaussian (layer normalisation after pooling) is not supported yet")
        if t is ONES:
            m1 = jnp.ones((m.n1,), m.dtype)
            m2 = jnp.ones((m.n2,), m.dtype)
        else:
            m1, m2 = m.mean(t)
        c1, c2 = (c.v1, c.v2 if c.v2 is not None else c.v1) if isinstance(c, PerEx) else (c, c)
        total1 = c1 * m1 if total1 is None else total1 + c1 * m1
        total2 = c2 * m2 if total2 is None else total2 + c2 * m2
    if total1 is None:
        total1, total2 = jnp.zeros((m.n1,), m.dtype), jnp.zeros((m.n2,), m.dtype)
        out = PerEx(total1, None if m.x2_is_x1 else total2, roles, zero=True, power=1)
    else:
        out = PerEx(total1, None if m.x2_is_x1 else total2, roles, power=1)
    out.power_width = f.width
    return out
