"""A model's forward pass as a flat list of primitive operations (the jaxpr with its calls inlined).

`trace` runs ``jax.make_jaxpr`` on ``apply_fn(params, x)`` and flattens every call-like equation (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ...) into its body, so that the interpreter sees one sequence
of primitives. Each variable is an integer; literals and the jaxpr's closed-over constants are folded into
`Program.consts` as concrete arrays, and so is every operation whose inputs are all constant (evaluated once,
outside any trace), so that the interpreter only meets operations that involve the input or the parameters. A
``lax.scan`` (a recurrent network) is written out step by step, and operations the output does not need are
dropped.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore
from jax.extend import source_info_util
from jax.extend.core import primitives

from smnngp.traced._errors import TracedError

# Equations whose body is inlined: calls that do not change what the body computes.
CALL_PRIMITIVES = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
})


# The longest loop (`lax.scan`) written out step by step.
MAX_UNROLL = 1000


@dataclasses.dataclass(frozen=True)
class Op:
    """One primitive: ``outs = prim.bind(*ins, **params)``; ``where`` is the user's source line."""

    prim: Any
    params: dict
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    where: str

    @property
    def name(self) -> str:
        return self.prim.name


@dataclasses.dataclass
class Program:
    """The flattened forward pass: ``params_vars`` (one per random parameter leaf), ``x_var``, ``out_vars``, ``ops``
    (the operations that involve the input or a parameter), ``consts`` (concrete values) and ``avals``."""

    params_vars: tuple[int, ...]
    x_var: int
    out_vars: tuple[int, ...]
    ops: list[Op]
    consts: dict[int, np.ndarray]
    avals: dict[int, Any]


def _body(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if isinstance(sub, jcore.ClosedJaxpr):
            return sub.jaxpr, sub.consts
        if isinstance(sub, jcore.Jaxpr):
            return sub, ()
    return None


def _package_dirs(names) -> tuple[str, ...]:
    import importlib.util

    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(os.path.abspath(p) + os.sep for p in spec.submodule_search_locations)
    return tuple(dirs)


_DIRS: dict = {}


def where(source_info) -> str:
    """``file:line (function)`` of the innermost frame of the user's code that made an equation, with the
    framework frame it ran in (a Flax layer's ``__call__``) in brackets."""
    if not _DIRS:
        _DIRS["internal"] = _package_dirs(("jax", "jaxlib", "smnngp"))
        _DIRS["framework"] = _package_dirs(("flax", "equinox"))
    frames = getattr(getattr(source_info, "traceback", None), "frames", None) or []
    library = None
    for frame in frames:
        path = os.path.abspath(frame.file_name)
        if path.startswith(_DIRS["internal"]):
            continue
        here = f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
        if path.startswith(_DIRS["framework"]):
            library = library or here
            continue
        return here if library is None else f"{here} [in {library}]"
    return library or source_info_util.summarize(source_info)


class _Builder:
    def __init__(self):
        self.count = 0
        self.ops: list[Op] = []
        self.consts: dict[int, Any] = {}
        self.avals: dict[int, Any] = {}

    def new(self, shape, dtype) -> int:
        self.count += 1
        self.avals[self.count] = jax.ShapeDtypeStruct(tuple(shape), dtype)
        return self.count

    def const(self, value) -> int:
        value = value if isinstance(value, jax.Array) else np.asarray(value)
        i = self.new(np.shape(value), value.dtype)
        self.consts[i] = value
        return i

    def read(self, env, atom) -> int:
        if isinstance(atom, jcore.Literal):
            return self.const(atom.val)
        return env[atom]

    def inline(self, jaxpr, consts, args: list[int], outer: str = "") -> list[int]:
        env: dict = {}
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = self.const(c)
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            ins = [self.read(env, a) for a in eqn.invars]
            body = _body(eqn) if eqn.primitive.name in CALL_PRIMITIVES else None
            here = where(eqn.source_info) or outer  # equations inside a call may carry no traceback
            if body is not None:
                sub, sub_consts = body
                # custom_vjp_call_jaxpr and friends pass extra leading operands in some versions: the body takes
                # the last len(invars) of them
                outs = self.inline(sub, sub_consts, ins[len(ins) - len(sub.invars):], here)
            elif eqn.primitive.name == "scan" and not all(i in self.consts for i in ins):
                outs = self.unroll(eqn, ins, here)
            else:
                outs = self.emit(eqn.primitive, dict(eqn.params), ins, [v.aval for v in eqn.outvars], here)
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [self.read(env, a) for a in jaxpr.outvars]

    def emit(self, prim, params: dict, ins: list[int], out_avals, here: str) -> list[int]:
        """One primitive: folded into a constant when its inputs are all constant, else an `Op`."""
        outs = [self.new(a.shape, a.dtype) for a in out_avals]
        if all(i in self.consts for i in ins):
            # constant folding, eagerly even when kernel_fn itself is being traced
            with jax.ensure_compile_time_eval():
                vals = prim.bind(*[self.consts[i] for i in ins], **params)
            vals = vals if prim.multiple_results else [vals]
            for o, val in zip(outs, vals):
                self.consts[o] = val
        else:
            self.ops.append(Op(prim, params, tuple(ins), tuple(outs), here))
        return outs

    def unroll(self, eqn, ins: list[int], here: str) -> list[int]:
        """A ``lax.scan`` written out step by step: the body inlined ``length`` times, the carry threaded through,
        each step's slice of the scanned arrays taken and the per-step outputs stacked."""
        prm = eqn.params
        length = int(prm["length"])
        if "num_consts" in prm:
            n_consts, n_carry = int(prm["num_consts"]), int(prm["num_carry"])
        else:  # newer jax: the operands' groups (constants, carry, scanned) as a flat tree, ft_in
            n_consts, n_carry = (len(list(group.vals)) for group in prm["ft_in"].unpack()[:2])
        if length > MAX_UNROLL:
            raise TracedError(f"smnngp.traced: `scan` at {here}: a loop of {length} steps is written out step by "
                              f"step, and more than {MAX_UNROLL} steps is too long a program")
        body = prm["jaxpr"]
        consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        steps = range(length - 1, -1, -1) if prm.get("reverse") else range(length)
        ys_by_step = {}
        for t in steps:
            x_t = [self.index(x, t, here) for x in xs]
            out = self.inline(body.jaxpr, body.consts, list(consts) + list(carry) + x_t, here)
            carry, ys_by_step[t] = out[:n_carry], out[n_carry:]
        n_ys = len(eqn.outvars) - n_carry
        ys = [self.stack([ys_by_step[t][k] for t in range(length)], here) for k in range(n_ys)]
        return list(carry) + ys

    def index(self, x: int, t: int, here: str) -> int:
        """``x[t]`` along the leading axis."""
        shape = tuple(self.avals[x].shape)
        dtype = self.avals[x].dtype
        sliced = self.emit(primitives.slice_p, {"start_indices": (t,) + (0,) * (len(shape) - 1),
                                                "limit_indices": (t + 1,) + shape[1:], "strides": None},
                           [x], [jax.ShapeDtypeStruct((1,) + shape[1:], dtype)], here)[0]
        return self.emit(primitives.squeeze_p, {"dimensions": (0,)}, [sliced],
                         [jax.ShapeDtypeStruct(shape[1:], dtype)], here)[0]

    def stack(self, values: list[int], here: str) -> int:
        """The values stacked along a new leading axis."""
        shape = tuple(self.avals[values[0]].shape)
        dtype = self.avals[values[0]].dtype
        rows = [self.emit(primitives.broadcast_in_dim_p, {"shape": (1,) + shape,
                                                          "broadcast_dimensions": tuple(range(1, len(shape) + 1)),
                                                          "sharding": None},
                          [v], [jax.ShapeDtypeStruct((1,) + shape, dtype)], here)[0] for v in values]
        return self.emit(primitives.concatenate_p, {"dimension": 0}, rows,
                         [jax.ShapeDtypeStruct((len(values),) + shape, dtype)], here)[0]


def trace(apply_fn, leaves, treedef, random: list[bool], x_shape, dtype) -> Program:
    """Trace ``apply_fn(params, x)`` at an input of ``x_shape`` / ``dtype`` into a `Program`; the leaves marked
    ``random`` are its inputs (``Program.params_vars``, in order), the others constants at their values."""

    def fn(random_leaves, x):
        it = iter(random_leaves)
        full = [next(it) if r else leaf for leaf, r in zip(leaves, random)]
        return apply_fn(jax.tree_util.tree_unflatten(treedef, full), x)

    x_example = jax.ShapeDtypeStruct(tuple(x_shape), dtype)
    leaf_structs = [jax.ShapeDtypeStruct(np.shape(leaf), getattr(leaf, "dtype", None) or np.asarray(leaf).dtype)
                    for leaf, r in zip(leaves, random) if r]
    closed = jax.make_jaxpr(fn)(leaf_structs, x_example)
    builder = _Builder()
    invars = [builder.new(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    outs = builder.inline(closed.jaxpr, closed.consts, invars)
    # only the operations the output needs (a loop's unused per-step outputs, values computed and dropped)
    needed, ops = set(outs), []
    for op in reversed(builder.ops):
        if any(o in needed for o in op.outs):
            ops.append(op)
            needed.update(op.ins)
    return Program(tuple(invars[:-1]), invars[-1], tuple(outs), ops[::-1], builder.consts, builder.avals)
