"""A grammar of small architectures for the differential kernel tester (issue 49, part 1).

Four families of networks, each a ``spec``: a tuple of blocks, the last one the read-out ``("dense", W_std, b_std)``
(``n_out`` channels). The dense family (`draw_spec`, `draw_mlp`; inputs `inputs()`, (4, 3)) starts with
``("dense", W_std, b_std)``. Blocks:

* ``("dense", W_std, b_std)``: a fully connected layer (W_std in [0.5, 2], b_std 0 or in [0.05, 0.5]), applied per
  position to images and sequences;
* ``("act", act)``: an activation, ``act`` a tuple ``(name, *args)`` (see ``ACTS``);
* ``("layernorm",)``: layer normalisation over the channels; ``("layernorm", axes)``: over ``axes`` (the positions
  and the channels: ``(1, 2, 3)`` for images, ``(1, 2)`` for sequences);
* ``("res", combine, left, right)``: ``FanOut(2)``, ``parallel(left, right)`` and ``FanInSum`` /
  ``FanInProd`` / ``FanInConcat`` (channel axis) for ``combine`` "sum" / "prod" / "concat"; a branch is
  ``("id",)``, ``("act", act)``, ``("dense_act", W_std, b_std, act)``, ``("conv_act", f, W_std, b_std, act)`` (an
  f x f 'SAME' convolution, then the activation) or an attention block;
* ``("conv", f, padding, stride, W_std, b_std)``: an f x f convolution (NHWC), 'SAME' or 'VALID', stride 1 or 2;
* ``("pool", "avg" | "sum", window, stride, padding)``: window pooling over the image's positions;
* ``("flatten",)`` / ``("gap",)``: the read-out's input, by flattening or a global average over the positions;
* ``("attn", mechanism, heads, QK, W_value_std, W_out_std, b_std)``: dot-product self-attention over the positions,
  scores divided by the key width with queries tied to keys (``stax.GlobalSelfAttention(linear_scaling=True)``);
* ``("inputs2", d_a, d_b, combine, branch_a, branch_b)`` (first block of a two-input network): the two inputs
  through their own chains of blocks (``branch_a``, ``branch_b``, each a tuple of blocks starting with a dense
  layer), then summed, multiplied or concatenated over the channels.

The convolutional family (`draw_conv_spec`, inputs `conv_inputs()`, (4, 5, 5, 2)) starts with a convolution and
reads out by ``("flatten",)`` or ``("gap",)`` then ``("dense", ...)``; the attention family
(`draw_attention_spec`, inputs `sequence_inputs()`, (4, 5, 3)) is a dense one over sequences with attention blocks
(and no Exp: see ``SEQ_ACTS``); the two-input family (`draw_multi_spec`, inputs `multi_inputs(spec)`, a list of two
arrays) starts with ``("inputs2", ...)``. ``draw_family`` draws any of them, ``family_inputs`` gives a network's
inputs and ``AUDIT_OPTIONS`` the options of ``audit_one`` per family.

Each spec is emitted twice: as `smnngp.stax` combinators (``to_stax``) and as plain JAX (``to_plain``: a function
``apply(params, x)`` written with jnp / lax ops, a params pytree and the `smnngp.traced` priors naming every leaf).
``Chooser`` draws the choices either from a seeded ``random.Random`` (the long audit) or from Hypothesis' ``draw``
(the fast test), so both walk one grammar.
"""

from __future__ import annotations

import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import smnngp
from smnngp import stax, traced

# name -> (stax layer factory, plain-JAX function factory); the args are drawn by ``_draw_act``
ACTS = {
    "relu": (lambda: stax.Relu(), lambda: jax.nn.relu),
    "erf": (lambda: stax.Erf(), lambda: jax.scipy.special.erf),
    "gelu": (lambda: stax.Gelu(), lambda: (lambda x: jax.nn.gelu(x, approximate=False))),
    "leaky": (lambda alpha: stax.LeakyRelu(alpha), lambda alpha: (lambda x: jnp.where(x > 0, x, alpha * x))),
    "abs": (lambda: stax.Abs(), lambda: jnp.abs),
    "sin": (lambda: stax.Sin(), lambda: jnp.sin),
    "cos": (lambda: stax.Cos(), lambda: jnp.cos),
    "exp": (lambda a, b: stax.Exp(a, b), lambda a, b: (lambda x: a * jnp.exp(b * x))),
    "abrelu": (lambda a, b: stax.ABRelu(a, b),
               lambda a, b: (lambda x: a * jnp.minimum(x, 0.0) + b * jnp.maximum(x, 0.0))),
}
# activations whose kernels are closed forms that stay well inside Monte Carlo's reach (no heavy tails)
MLP_ACTS = ("relu", "erf", "gelu", "leaky", "abs", "sin", "cos", "abrelu")


class Chooser:
    """Choices from a seeded ``random.Random`` or, with ``draw``, from Hypothesis."""

    def __init__(self, rng: random.Random | None = None, draw=None):
        self.rng, self.draw = rng, draw

    def choice(self, seq):
        seq = list(seq)
        if self.draw is not None:
            from hypothesis import strategies as st

            return self.draw(st.sampled_from(seq))
        return seq[self.rng.randrange(len(seq))]

    def uniform(self, lo: float, hi: float) -> float:
        if self.draw is not None:
            from hypothesis import strategies as st

            v = self.draw(st.floats(lo, hi, allow_nan=False, allow_infinity=False))
        else:
            v = self.rng.uniform(lo, hi)
        return round(float(v), 3)

    def integer(self, lo: int, hi: int) -> int:
        if self.draw is not None:
            from hypothesis import strategies as st

            return self.draw(st.integers(lo, hi))
        return self.rng.randint(lo, hi)


def _draw_act(c: Chooser, names=tuple(ACTS)):
    name = c.choice(names)
    if name == "leaky":
        return (name, c.uniform(0.05, 0.5))
    if name == "exp":
        return (name, c.uniform(0.3, 1.0), c.uniform(0.1, 0.3))   # small: a exp(b x), b <= 0.3
    if name == "abrelu":
        return (name, c.uniform(-1.0, 1.0), c.uniform(0.5, 2.0))
    return (name,)


def _draw_dense(c: Chooser):
    b = 0.0 if c.choice([True, False]) else c.uniform(0.05, 0.5)
    return ("dense", c.uniform(0.5, 2.0), b)


def _draw_branch(c: Chooser):
    kind = c.choice(["id", "act", "dense_act"])
    if kind == "id":
        return ("id",)
    if kind == "act":
        return ("act", _draw_act(c))
    _, w, b = _draw_dense(c)
    return ("dense_act", w, b, _draw_act(c))


def draw_spec(c: Chooser, max_blocks: int = 4, allow=("act", "dense", "layernorm", "res")) -> tuple:
    """A network: Dense, then up to ``max_blocks`` blocks of the kinds in ``allow``, then Dense(1)."""
    blocks = [_draw_dense(c)]
    for _ in range(c.integer(1, max_blocks)):
        kind = c.choice(allow)
        if kind == "act":
            blocks.append(("act", _draw_act(c)))
        elif kind == "dense":
            blocks.append(_draw_dense(c))
        elif kind == "layernorm":
            blocks.append(("layernorm",))
        else:
            blocks.append(("res", c.choice(["sum", "sum", "prod", "concat"]), _draw_branch(c), _draw_branch(c)))
    blocks.append(_draw_dense(c))
    return tuple(blocks)


def draw_mlp(c: Chooser) -> tuple:
    """A network known to be right: Dense-act-(Dense-act)-Dense(1) with closed-form activations."""
    blocks = [_draw_dense(c), ("act", _draw_act(c, MLP_ACTS))]
    if c.choice([True, False]):
        blocks += [_draw_dense(c), ("act", _draw_act(c, MLP_ACTS))]
    return tuple(blocks + [_draw_dense(c)])


# ---------------------------------------------------------------- the other families: images, sequences, two inputs

CONV_SIZE = 5        # conv_inputs(): 4 images of 5 x 5 positions and 2 channels (odd: 'SAME' stride 2 is centred)
ATTENTION_MECHANISMS = ("softmax", "identity", "relu", "abs")   # the attention weights both engines read
# Attention with unnormalised weights (identity, relu, abs) multiplies the variances it mixes: a pre-activation of
# variance 600 after one layer is common, and a exp(b x) of it is log-normal with log-scale b * sqrt(600) = 6, whose
# kernel (1e15) Monte Carlo cannot estimate. The sequence networks leave Exp out.
SEQ_ACTS = tuple(a for a in ACTS if a != "exp")


def _out_size(n: int, f: int, stride: int, padding: str) -> int:
    """Positions along one axis after a window of ``f`` with ``stride`` ('SAME' or 'VALID' padding)."""
    return -(-n // stride) if padding == "SAME" else -(-(n - f + 1) // stride)


def _draw_conv(c: Chooser, size: int):
    """``("conv", f, padding, stride, W_std, b_std)`` that fits an input of ``size`` positions per axis."""
    f = c.choice([3, 3, 2])
    padding = c.choice(["SAME", "VALID"])
    stride = c.choice([1, 1, 2])
    if padding == "VALID" and size < f:
        padding = "SAME"
    _, w, b = _draw_dense(c)
    return ("conv", f, padding, stride, w, b)


def _draw_pool(c: Chooser, size: int):
    kind = c.choice(["avg", "sum"])
    window = c.choice([2, 3])
    stride = c.choice([1, 2])
    padding = c.choice(["VALID", "SAME"])
    if padding == "VALID" and size < window:
        padding = "SAME"
    return ("pool", kind, window, stride, padding)


def _draw_attn(c: Chooser):
    """``("attn", mechanism, heads, QK, W_value_std, W_out_std, b_std)``."""
    mechanism = c.choice(("softmax", "softmax") + ATTENTION_MECHANISMS[1:])
    heads = c.choice([1, 1, 2])
    qk = c.uniform(0.3, 1.5)
    _, w_v, b = _draw_dense(c)
    w_o = c.uniform(0.5, 2.0)
    return ("attn", mechanism, heads, qk, w_v, w_o, b)


def _draw_conv_branch(c: Chooser):
    kind = c.choice(["id", "act", "conv_act"])
    if kind == "id":
        return ("id",)
    if kind == "act":
        return ("act", _draw_act(c))
    _, w, b = _draw_dense(c)
    return ("conv_act", c.choice([3, 3, 2]), w, b, _draw_act(c))


def _draw_seq_branch(c: Chooser):
    kind = c.choice(["id", "act", "dense_act", "attn", "attn"])
    if kind == "attn":
        return _draw_attn(c)
    if kind == "id":
        return ("id",)
    if kind == "act":
        return ("act", _draw_act(c, SEQ_ACTS))
    _, w, b = _draw_dense(c)
    return ("dense_act", w, b, _draw_act(c, SEQ_ACTS))


def _draw_readout(c: Chooser):
    return [(c.choice(["flatten", "gap"]),), _draw_dense(c)]


def draw_conv_spec(c: Chooser, max_blocks: int = 4, size: int = CONV_SIZE) -> tuple:
    """An image network: a convolution, then up to ``max_blocks`` blocks (convolutions, activations, layer norms
    over the channels or over positions and channels, pooling, residual blocks with convolutional branches), then
    Flatten or GlobalAvgPool and Dense. Every 'VALID' window fits the positions left (``size`` on the input)."""
    first = _draw_conv(c, size)
    blocks = [first]
    size = _out_size(size, first[1], first[3], first[2])
    for _ in range(c.integer(1, max_blocks)):
        kind = c.choice(["conv", "act", "act", "layernorm", "layernorm_all", "pool", "res", "res"])
        if kind == "conv":
            blk = _draw_conv(c, size)
            size = _out_size(size, blk[1], blk[3], blk[2])
        elif kind == "act":
            blk = ("act", _draw_act(c))
        elif kind == "layernorm":
            blk = ("layernorm",)
        elif kind == "layernorm_all":
            blk = ("layernorm", (1, 2, 3))
        elif kind == "pool":
            blk = _draw_pool(c, size)
            size = _out_size(size, blk[2], blk[3], blk[4])
        else:
            blk = ("res", c.choice(["sum", "sum", "prod", "concat"]), _draw_conv_branch(c), _draw_conv_branch(c))
        blocks.append(blk)
    return tuple(blocks + _draw_readout(c))


def draw_attention_spec(c: Chooser, max_blocks: int = 4) -> tuple:
    """A sequence network: Dense (per position), then up to ``max_blocks`` blocks (attention, attention in a
    residual block, activations other than Exp, dense layers, layer norms, residual blocks), at least one of them
    attention, then GlobalAvgPool or Flatten and Dense."""
    blocks = [_draw_dense(c)]
    for _ in range(c.integer(1, max_blocks)):
        kind = c.choice(["attn", "res_attn", "act", "act", "dense", "layernorm", "layernorm_all", "res"])
        if kind == "attn":
            blocks.append(_draw_attn(c))
        elif kind == "res_attn":
            blocks.append(("res", c.choice(["sum", "sum", "prod", "concat"]), ("id",), _draw_attn(c)))
        elif kind == "act":
            blocks.append(("act", _draw_act(c, SEQ_ACTS)))
        elif kind == "dense":
            blocks.append(_draw_dense(c))
        elif kind == "layernorm":
            blocks.append(("layernorm",))
        elif kind == "layernorm_all":
            blocks.append(("layernorm", (1, 2)))
        else:
            blocks.append(("res", c.choice(["sum", "sum", "prod", "concat"]), _draw_seq_branch(c),
                           _draw_seq_branch(c)))
    if not any(_has_attention(b) for b in blocks):
        blocks.insert(c.integer(1, len(blocks)), _draw_attn(c))
    return tuple(blocks + _draw_readout(c))


def _has_attention(blk) -> bool:
    return blk[0] == "attn" or (blk[0] == "res" and any(b[0] == "attn" for b in blk[2:]))


def _draw_input_branch(c: Chooser) -> tuple:
    blocks = [_draw_dense(c)]
    if c.choice([True, True, False]):
        blocks.append(("act", _draw_act(c)))
    if c.choice([True, False]):
        blocks += [_draw_dense(c), ("act", _draw_act(c))]
    return tuple(blocks)


def draw_multi_spec(c: Chooser, max_blocks: int = 3) -> tuple:
    """A network of two inputs (3 and 3 or 5 features): each through its own dense chain, then summed, multiplied
    or concatenated, then up to ``max_blocks`` blocks of the dense grammar, then Dense."""
    head = ("inputs2", 3, c.choice([3, 3, 5]), c.choice(["sum", "sum", "concat", "prod"]),
            _draw_input_branch(c), _draw_input_branch(c))
    blocks = [head]
    for _ in range(c.integer(0, max_blocks)):
        kind = c.choice(["act", "dense", "layernorm", "res"])
        if kind == "act":
            blocks.append(("act", _draw_act(c)))
        elif kind == "dense":
            blocks.append(_draw_dense(c))
        elif kind == "layernorm":
            blocks.append(("layernorm",))
        else:
            blocks.append(("res", c.choice(["sum", "sum", "prod", "concat"]), _draw_branch(c), _draw_branch(c)))
    blocks.append(_draw_dense(c))
    return tuple(blocks)


FAMILIES = ("dense", "conv", "attention", "multi")
# audit_one's options per family: the dense family keeps the defaults its long runs were made with; the others
# count a refusal raised from inside numpy / JAX as a crash, jit both kernels and retest a Monte-Carlo mismatch on
# networks 4 times wider
AUDIT_OPTIONS = {"dense": {}, "conv": dict(strict=True, jit=True, escalate=4),
                 "attention": dict(strict=True, jit=True, escalate=4), "multi": dict(strict=True, jit=True, escalate=4)}


def draw_family(family: str, c: Chooser, **kw) -> tuple:
    """A network of ``family`` (one of ``FAMILIES``)."""
    return {"dense": draw_spec, "conv": draw_conv_spec, "attention": draw_attention_spec,
            "multi": draw_multi_spec}[family](c, **kw)


def family_of(spec) -> str:
    if spec[0][0] == "inputs2":
        return "multi"
    if spec[0][0] == "conv":
        return "conv"
    if any(b[0] in ("flatten", "gap") or _has_attention(b) for b in spec):
        return "attention"
    return "dense"


def describe(spec) -> str:
    def act(a):
        return a[0] + ("(" + ",".join(f"{v:g}" for v in a[1:]) + ")" if len(a) > 1 else "")

    def attn(b):
        return f"Attn[{b[1]},h{b[2]},qk{b[3]:g},v{b[4]:g},o{b[5]:g},b{b[6]:g}]"

    def branch(b):
        if b[0] == "id":
            return "Id"
        if b[0] == "act":
            return act(b[1])
        if b[0] == "attn":
            return attn(b)
        if b[0] == "conv_act":
            return f"[C{b[1]}({b[2]:g},{b[3]:g})>{act(b[4])}]"
        return f"[D({b[1]:g},{b[2]:g})>{act(b[3])}]"

    out = []
    for blk in spec:
        if blk[0] == "dense":
            out.append(f"D({blk[1]:g},{blk[2]:g})")
        elif blk[0] == "act":
            out.append(act(blk[1]))
        elif blk[0] == "layernorm":
            out.append("LN" if len(blk) == 1 else "LN(" + ",".join(map(str, blk[1])) + ")")
        elif blk[0] == "conv":
            out.append(f"C{blk[1]}{blk[2][0]}/{blk[3]}({blk[4]:g},{blk[5]:g})")
        elif blk[0] == "pool":
            out.append(f"{blk[1]}pool{blk[2]}{blk[4][0]}/{blk[3]}")
        elif blk[0] == "flatten":
            out.append("Flatten")
        elif blk[0] == "gap":
            out.append("GAP")
        elif blk[0] == "attn":
            out.append(attn(blk))
        elif blk[0] == "inputs2":
            out.append(f"In{blk[1]},{blk[2]}:{blk[3]}({describe(blk[4])}|{describe(blk[5])})")
        else:
            out.append(f"{blk[1]}({branch(blk[2])}|{branch(blk[3])})")
    return " > ".join(out)


# ---------------------------------------------------------------- stax

def _stax_dense(width, w, b):
    return stax.Dense(width, W_std=w, b_std=b)


def _stax_act(a):
    return ACTS[a[0]][0](*a[1:])


def _stax_conv(width, f, padding, stride, w, b):
    return stax.Conv(width, (f, f), (stride, stride), padding, W_std=w, b_std=b)


def _stax_attn(width, blk):
    _, mechanism, heads, qk, w_v, w_o, b = blk
    return stax.GlobalSelfAttention(width, width // heads, width // heads, heads, linear_scaling=True,
                                    W_key_std=1.0, W_query_std=qk, W_value_std=w_v, W_out_std=w_o, b_std=b,
                                    attention_mechanism=mechanism.upper())


def _stax_branch(br, width):
    if br[0] == "id":
        return stax.Identity()
    if br[0] == "act":
        return _stax_act(br[1])
    if br[0] == "attn":
        return _stax_attn(width, br)
    if br[0] == "conv_act":
        return stax.serial(_stax_conv(width, br[1], "SAME", 1, br[2], br[3]), _stax_act(br[4]))
    return stax.serial(_stax_dense(width, br[1], br[2]), _stax_act(br[3]))


_STAX_FAN_IN = {"sum": stax.FanInSum, "prod": stax.FanInProd, "concat": lambda: stax.FanInConcat(-1)}


def _stax_layers(spec, width, n_out, readout=True):
    layers = []
    for i, blk in enumerate(spec):
        if blk[0] == "dense":
            layers.append(_stax_dense(n_out if readout and i == len(spec) - 1 else width, blk[1], blk[2]))
        elif blk[0] == "act":
            layers.append(_stax_act(blk[1]))
        elif blk[0] == "layernorm":
            layers.append(stax.LayerNorm() if len(blk) == 1 else stax.LayerNorm(axis=blk[1]))
        elif blk[0] == "conv":
            layers.append(_stax_conv(width, *blk[1:]))
        elif blk[0] == "pool":
            _, kind, window, stride, padding = blk
            pool = stax.AvgPool if kind == "avg" else stax.SumPool
            layers.append(pool((window, window), (stride, stride), padding))
        elif blk[0] == "flatten":
            layers.append(stax.Flatten())
        elif blk[0] == "gap":
            layers.append(stax.GlobalAvgPool())
        elif blk[0] == "attn":
            layers.append(_stax_attn(width, blk))
        elif blk[0] == "inputs2":
            branches = [stax.serial(*_stax_layers(b, width, n_out, readout=False)) for b in blk[4:]]
            layers.append(stax.serial(stax.parallel(*branches), _STAX_FAN_IN[blk[3]]()))
        else:
            layers.append(stax.serial(stax.FanOut(2),
                                      stax.parallel(_stax_branch(blk[2], width), _stax_branch(blk[3], width)),
                                      _STAX_FAN_IN[blk[1]]()))
    return layers


def to_stax(spec, width: int = 16, n_out: int = 1):
    """The (init_fn, apply_fn, kernel_fn) triple of ``spec`` in `smnngp.stax`; read-out of ``n_out`` channels."""
    return stax.serial(*_stax_layers(spec, width, n_out))


# ---------------------------------------------------------------- plain JAX for smnngp.traced

_DN = ("NHWC", "HWIO", "NHWC")
_ATTEND = {"softmax": lambda s: jax.nn.softmax(s, axis=-1), "identity": lambda s: s, "relu": jax.nn.relu,
           "abs": jnp.abs}


def to_plain(spec, width: int = 16, d_in: int = 3, n_out: int = 1, spatial: tuple = (), inputs: str = "tuple"):
    """``(apply, params, priors)``: the same network written in plain JAX for `smnngp.traced.infinite_width`.

    Every weight ``W<i>`` is an ``(fan_in, fan_out)`` matrix of prior ``Weight(W_std)`` (variance W_std^2 / fan_in,
    'ntk' parameterisation as stax's Dense), every bias ``b<i>`` a vector of prior ``Bias(b_std)``. A convolution's
    filter ``W<i>`` is ``(f, f, in, out)`` (HWIO, applied by ``lax.conv_general_dilated`` to NHWC activations), of
    prior ``Weight(W_std)``: its fan-in, f * f * in, is read off the program, as stax's Conv divides by it.
    Attention ``i`` has keys ``K<i>`` of prior ``Weight(1)``, queries ``QK`` times the keys (tied), scores divided
    by the key width (per head: the width split by a reshape), values ``V<i>`` of prior ``Weight(W_value_std)`` and
    an output projection ``W<i>``, ``b<i>`` (stax's GlobalSelfAttention with ``W_key_std=1, W_query_std=QK``).
    ``spatial``: the input's positions (``()`` for vectors); a two-input network takes ``(x_a, x_b)``
    (``inputs="tuple"``) or the two concatenated over the features (``inputs="concat"``, sliced in the program).
    """
    params, priors = {}, {}
    counter = [0]

    def new_index():
        i = counter[0]
        counter[0] += 1
        return i

    def new_dense(fan_in, fan_out, w, b):
        i = new_index()
        params[f"W{i}"] = jnp.zeros((fan_in, fan_out))
        priors[f"W{i}"] = traced.Weight(w)
        params[f"b{i}"] = jnp.zeros((fan_out,))
        priors[f"b{i}"] = traced.Bias(b)
        return i

    def new_conv(c_in, f, w, b):
        i = new_index()
        params[f"W{i}"] = jnp.zeros((f, f, c_in, width))
        priors[f"W{i}"] = traced.Weight(w)
        params[f"b{i}"] = jnp.zeros((width,))
        priors[f"b{i}"] = traced.Bias(b)
        return i

    def new_attn(c_in, blk):
        i = new_index()
        for name, shape, prior in (("K", (c_in, width), traced.Weight(1.0)),
                                   ("V", (c_in, width), traced.Weight(blk[4])),
                                   ("W", (width, width), traced.Weight(blk[5])), ("b", (width,), traced.Bias(blk[6]))):
            params[f"{name}{i}"] = jnp.zeros(shape)
            priors[f"{name}{i}"] = prior
        return i

    def bias(p, name, h):
        v = p[name]
        return v[None, :] if h.ndim == 2 else v.reshape((1,) * (h.ndim - 1) + (-1,))

    def dense_op(i):
        return lambda p, h: h @ p[f"W{i}"] + bias(p, f"b{i}", h)

    def conv_op(i, padding, stride):
        return lambda p, h: (lax.conv_general_dilated(h, p[f"W{i}"], (stride, stride), padding, dimension_numbers=_DN)
                             + bias(p, f"b{i}", h))

    def act_op(a):
        fn = ACTS[a[0]][1](*a[1:])
        return lambda p, h: fn(h)

    def layernorm_op(axes):
        def op(p, h):
            m = jnp.mean(h, axis=axes, keepdims=True)
            v = jnp.mean((h - m) ** 2, axis=axes, keepdims=True)
            return (h - m) / jnp.sqrt(v + 1e-12)
        return op

    def pool_op(kind, window, stride, padding):
        def op(p, h):
            dims, steps = (1, window, window, 1), (1, stride, stride, 1)
            s = lax.reduce_window(h, np.zeros((), h.dtype), lax.add, dims, steps, padding)
            return s / (window * window) if kind == "avg" else s
        return op

    def attn_op(i, mechanism, heads, qk):
        attend = _ATTEND[mechanism]

        def op(p, h):
            k, v = h @ p[f"K{i}"], h @ p[f"V{i}"]
            n, t, w = k.shape
            if heads == 1:
                a = attend(jnp.einsum("btd,bsd->bts", qk * k, k) / w)
                o = jnp.einsum("bts,bsd->btd", a, v)
            else:
                d = w // heads
                kh, vh = k.reshape(n, t, heads, d), v.reshape(n, t, heads, d)
                a = attend(jnp.einsum("bthd,bshd->bhts", qk * kh, kh) / d)
                o = jnp.einsum("bhts,bshd->bthd", a, vh).reshape(n, t, w)
            return o @ p[f"W{i}"] + bias(p, f"b{i}", o)
        return op

    def combine(kind, left, right):
        if kind == "sum":
            return lambda p, h, l=left, r=right: l(p, h) + r(p, h)
        if kind == "prod":
            return lambda p, h, l=left, r=right: l(p, h) * r(p, h)
        return lambda p, h, l=left, r=right: jnp.concatenate([l(p, h), r(p, h)], axis=-1)

    def run(program):
        def op(p, h):
            for o in program:
                h = o(p, h)
            return h
        return op

    def emit(blocks, cur, sp, readout):
        """The ops of ``blocks`` on activations of ``cur`` channels at positions ``sp``; (ops, channels, positions)."""
        program = []
        for n, blk in enumerate(blocks):
            if blk[0] == "dense":
                out = n_out if readout and n == len(blocks) - 1 else width
                program.append(dense_op(new_dense(cur, out, blk[1], blk[2])))
                cur = out
            elif blk[0] == "act":
                program.append(act_op(blk[1]))
            elif blk[0] == "layernorm":
                program.append(layernorm_op(-1 if len(blk) == 1 else tuple(blk[1])))
            elif blk[0] == "conv":
                _, f, padding, stride, w, b = blk
                program.append(conv_op(new_conv(cur, f, w, b), padding, stride))
                cur, sp = width, tuple(_out_size(m, f, stride, padding) for m in sp)
            elif blk[0] == "pool":
                _, kind, window, stride, padding = blk
                program.append(pool_op(kind, window, stride, padding))
                sp = tuple(_out_size(m, window, stride, padding) for m in sp)
            elif blk[0] == "flatten":
                program.append(lambda p, h: h.reshape(h.shape[0], -1))
                cur, sp = cur * math.prod(sp), ()
            elif blk[0] == "gap":
                program.append(lambda p, h: jnp.mean(h, axis=tuple(range(1, h.ndim - 1))))
                sp = ()
            elif blk[0] == "attn":
                program.append(attn_op(new_attn(cur, blk), *blk[1:4]))
                cur = width
            elif blk[0] == "inputs2":
                _, d_a, d_b, kind, branch_a, branch_b = blk
                ops_a, c_a, _ = emit(branch_a, d_a, (), False)
                ops_b, c_b, _ = emit(branch_b, d_b, (), False)
                fa, fb = run(ops_a), run(ops_b)
                if inputs == "tuple":
                    left, right = (lambda p, x: fa(p, x[0])), (lambda p, x: fb(p, x[1]))
                else:
                    left, right = (lambda p, x: fa(p, x[:, :d_a])), (lambda p, x: fb(p, x[:, d_a:]))
                program.append(combine(kind, left, right))
                if kind == "concat":
                    cur = c_a + c_b
                elif c_a != c_b:
                    raise ValueError(f"branch widths differ: {[c_a, c_b]}")
                else:
                    cur = c_a
            else:
                ops, widths = [], []
                for br in blk[2:]:
                    if br[0] == "id":
                        ops.append(lambda p, h: h)
                        widths.append(cur)
                    elif br[0] == "act":
                        ops.append(act_op(br[1]))
                        widths.append(cur)
                    elif br[0] == "attn":
                        ops.append(attn_op(new_attn(cur, br), *br[1:4]))
                        widths.append(width)
                    elif br[0] == "conv_act":
                        d, a = conv_op(new_conv(cur, br[1], br[2], br[3]), "SAME", 1), act_op(br[4])
                        ops.append(lambda p, h, d=d, a=a: a(p, d(p, h)))
                        widths.append(width)
                    else:
                        d, a = dense_op(new_dense(cur, width, br[1], br[2])), act_op(br[3])
                        ops.append(lambda p, h, d=d, a=a: a(p, d(p, h)))
                        widths.append(width)
                program.append(combine(blk[1], *ops))
                if blk[1] == "concat":
                    cur = sum(widths)
                elif widths[0] != widths[1]:
                    raise ValueError(f"branch widths differ: {widths}")
                else:   # two fresh layers after a concatenation: back to `width` channels
                    cur = widths[0]
        return program, cur, sp

    program, _, _ = emit(spec, d_in, tuple(spatial), True)
    apply = run(program)
    return (lambda p, x: apply(p, x)), params, priors


def inputs(key: int = 0, n: int = 4, d_in: int = 3):
    """Inputs of norm about sqrt(d_in): rows of a standard normal, one pair nearly parallel."""
    x = np.array(jax.random.normal(jax.random.PRNGKey(key), (n, d_in)), dtype=np.float64)
    x[-1] = 0.9 * x[0] + 0.1 * x[-1]
    return jnp.asarray(x)


def conv_inputs(key: int = 0, n: int = 4, size: int = CONV_SIZE, channels: int = 2):
    """Images (n, size, size, channels) of standard normal pixels, the last nearly parallel to the first."""
    x = np.array(jax.random.normal(jax.random.PRNGKey(key), (n, size, size, channels)), dtype=np.float64)
    x[-1] = 0.9 * x[0] + 0.1 * x[-1]
    return jnp.asarray(x)


def sequence_inputs(key: int = 0, n: int = 4, length: int = 5, d_in: int = 3):
    """Sequences (n, length, d_in) of standard normal entries, the last nearly parallel to the first."""
    x = np.array(jax.random.normal(jax.random.PRNGKey(key), (n, length, d_in)), dtype=np.float64)
    x[-1] = 0.9 * x[0] + 0.1 * x[-1]
    return jnp.asarray(x)


def multi_inputs(spec, key: int = 0, n: int = 4):
    """The list ``[x_a, x_b]`` of a two-input network (its first block says the features of each)."""
    _, d_a, d_b = spec[0][:3]
    return [inputs(key, n, d_a), inputs(key + 1, n, d_b)]


def family_inputs(spec):
    """The inputs a network of any family is audited on."""
    family = family_of(spec)
    if family == "multi":
        return multi_inputs(spec)
    return {"dense": inputs, "conv": conv_inputs, "attention": sequence_inputs}[family]()


# ---------------------------------------------------------------- the checks

# A refusal is clear when it is one of these with a message; anything else raised is a crash.
try:
    CLEAR = (ValueError, NotImplementedError, traced.TracedError)
except AttributeError:  # pragma: no cover
    CLEAR = (ValueError, NotImplementedError)

# With ``strict``, a refusal must also be raised by smnngp itself (or by this grammar, which refuses to build what
# stax refuses): a ValueError from inside numpy or JAX (an array of a tuple of inputs, a shape check of lax) is
# no deliberate refusal, it is a crash.
_OWN_CODE = (os.path.dirname(os.path.abspath(smnngp.__file__)) + os.sep, os.path.abspath(__file__))


def _raised_in(e: BaseException) -> str:
    """The file of the innermost frame of ``e``'s traceback."""
    tb, where = e.__traceback__, "?"
    while tb is not None:
        where = os.path.abspath(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return where


def _run(build, strict: bool = False):
    """("accepted", kernel) / ("refused", message) / ("crash", message)."""
    filtering = jax.config.jax_traceback_filtering
    if strict:   # JAX drops its own frames from tracebacks that cross its API; the origin needs them
        jax.config.update("jax_traceback_filtering", "off")
    try:
        return "accepted", build()
    except CLEAR as e:
        msg = f"{type(e).__name__}: {e}"
        if not str(e).strip():
            return "crash", "empty message " + msg
        where = _raised_in(e)
        if strict and not (where.startswith(_OWN_CODE[0]) or where == _OWN_CODE[1]):
            return "crash", f"raised outside smnngp ({where}): {msg}"
        return "refused", msg
    except Exception as e:  # noqa: BLE001 - a crash is a finding, recorded and failed
        return "crash", f"{type(e).__name__}: {e}"
    finally:
        if strict:
            jax.config.update("jax_traceback_filtering", filtering)


def _is_multi(x) -> bool:
    return isinstance(x, (list, tuple))


def _maybe_jit(kernel_fn, jit: bool):
    return jax.jit(kernel_fn, static_argnames="get") if jit else kernel_fn


def stax_kernel(spec, x, strict: bool = False, jit: bool = False):
    def build():
        _, _, kernel_fn = to_stax(spec)
        k = _maybe_jit(kernel_fn, jit)(list(x) if _is_multi(x) else x, None, ("nngp", "ntk"))
        return np.asarray(k[0]), np.asarray(k[1])
    return _run(build, strict)


def _plain_for(spec, x, width: int = 16, n_out: int = 1, inputs: str = "concat"):
    """``(apply, params, priors, x_in)``: the plain-JAX network of ``spec`` and its input (two inputs: the tuple,
    or the two concatenated over the features)."""
    if _is_multi(x):
        x_in = tuple(x) if inputs == "tuple" else jnp.concatenate(list(x), axis=-1)
        return (*to_plain(spec, width=width, n_out=n_out, inputs=inputs), x_in)
    return (*to_plain(spec, width=width, d_in=x.shape[-1], n_out=n_out, spatial=tuple(x.shape[1:-1])), x)


def traced_kernel(spec, x, strict: bool = False, inputs: str = "concat", jit: bool = False):
    def build():
        apply, params, priors, x_in = _plain_for(spec, x, inputs=inputs)
        _, _, kernel_fn = traced.infinite_width(apply, params, priors=priors)
        k = _maybe_jit(kernel_fn, jit)(x_in, None, ("nngp", "ntk"))
        # kernel_fn.activations takes one input shape: a tuple of inputs has none (its reading equals the
        # concatenated spelling's, which audit_one compares at 1e-8)
        how = [] if isinstance(x_in, tuple) else sorted({h for _, h in kernel_fn.activations(x_in.shape)})
        return np.asarray(k[0]), np.asarray(k[1]), how
    return _run(build, strict)


# Branches that start with a fresh random layer (a Gaussian independent of the other branch's given the input):
# their pairing with the other branch is a closed form in both engines.
FRESH_BRANCHES = ("dense_act", "conv_act", "attn")


def uses_quadrature(spec, how=()) -> bool:
    """Whether either engine may integrate numerically: functions of one Gaussian paired in a residual block
    (stax's joint terms, traced's fused chain), or traced reading an activation by quadrature. Convolutions,
    pooling, flattening, global pooling, attention (its weights are deterministic in the limit) and layer norms are
    exact linear or deterministic maps: they add no quadrature; an activation after a residual sum of the
    activations and attention outputs (a linear block: Gaussian in, Gaussian out) is no chain either."""
    if any("Numerical" in h or "quadrature" in h.lower() for h in how):
        return True
    for blk in spec:
        if blk[0] == "res" and blk[1] in ("sum", "prod") and all(b[0] not in FRESH_BRANCHES for b in blk[2:]):
            return True
        if blk[0] == "inputs2" and any(uses_quadrature(b) for b in blk[4:]):
            return True
    # an activation of an activation: traced fuses the chain into one function (maybe by quadrature)
    prev = None
    for blk in spec:
        if blk[0] == "act" and prev in ("act", "res"):
            return True
        prev = blk[0]
        if (prev == "res" and blk[1] in ("sum", "concat") and all(b[0] in ("id", "attn") for b in blk[2:])
                and any(b[0] == "attn" for b in blk[2:])):
            prev = "linear"
    return False


def rel_err(a, b) -> float:
    scale = max(np.max(np.abs(b)), 1e-300)
    return float(np.max(np.abs(a - b)) / scale)


def mc_samples(init_fn, apply_fn, x, draws: int, seed: int, chunk: int = 50):
    """Per-draw NNGP estimates f f^T / n_out, shape (draws, N, N), float64 (``x`` one array, or a list of them for a
    network of several inputs)."""
    shape = [a.shape for a in x] if _is_multi(x) else x.shape
    x = list(x) if _is_multi(x) else x

    def one(k):
        _, p = init_fn(k, shape)
        f = apply_fn(p, x)
        return f @ f.T / f.shape[-1]

    if _is_multi(x) or x.ndim < 4:
        fn = jax.jit(jax.vmap(one))
    else:   # convolutions: XLA compiles (and runs) one draw's convolution faster than a batch of filters
        fn = jax.jit(lambda ks: lax.map(one, ks))
    keys = jax.random.split(jax.random.PRNGKey(seed), draws)
    return np.concatenate([np.asarray(fn(keys[i:i + chunk])) for i in range(0, draws, chunk)])


def z_check(k, samples, z: float = 5.0, rel_atol: float = 0.02):
    """|k - mean| <= z * se + rel_atol * max diag(k), entrywise; returns (ok, worst z-score, mean, se)."""
    mean = samples.mean(0)
    se = samples.std(0, ddof=1) / np.sqrt(samples.shape[0])
    atol = rel_atol * float(np.max(np.abs(np.diag(k))))
    excess = np.abs(k - mean) - atol
    zs = np.where(excess > 0, excess / np.maximum(se, 1e-300), 0.0)
    return bool(np.all(zs <= z)), float(np.max(zs)), mean, se


def mc_stax(spec, x, width: int, draws: int, seed: int, n_out: int = 32, chunk: int = 50):
    init_fn, apply_fn, _ = to_stax(spec, width=width, n_out=n_out)
    return mc_samples(init_fn, apply_fn, x, draws, seed, chunk)


def mc_traced(spec, x, width: int, draws: int, seed: int, n_out: int = 32, chunk: int = 50):
    apply, params, priors, x_in = _plain_for(spec, x, width=width, n_out=n_out)
    init_fn, apply_fn, _ = traced.infinite_width(apply, params, priors=priors)
    return mc_samples(init_fn, apply_fn, x_in, draws, seed, chunk)


def audit_one(spec, x, *, width: int = 256, draws: int = 200, seed: int = 0, diff_tol: float = 1e-8,
              quad_tol: float = 1e-3, z: float = 5.0, rel_atol: float = 0.02, do_mc: bool = True,
              strict: bool = False, jit: bool = False, tuple_spellings: bool = True, escalate: int = 0) -> dict:
    """Everything the tester checks on one network, as a JSON-able record.

    ``x`` is one array, or the list of two for a two-input network: stax gets the list, traced the two concatenated
    over the features (sliced in the program, which traced reads as the input entering through two values), and
    the tuple itself as a second spelling (``traced_tuple``, and ``traced_tuple_jit`` through ``jax.jit``: accepted,
    refused or crashed; a kernel it accepts must equal the first one's; ``tuple_spellings=False`` skips them).
    ``strict``: a refusal raised from inside
    numpy or JAX rather than smnngp is a crash (see ``_run``); ``jit``: both kernels through ``jax.jit`` (one
    compilation instead of one per operation); ``escalate=k``: a Monte-Carlo mismatch is tested again on networks k
    times wider, which decide (finite-width bias, large where softmax attention meets large logits, falls like
    1 / width; an error of the kernel does not), the first test kept under ``"first"``."""
    rec = {"spec": describe(spec), "raw": repr(spec), "seed": seed}
    s_status, s_val = stax_kernel(spec, x, strict, jit)
    t_status, t_val = traced_kernel(spec, x, strict, jit=jit)
    rec["stax"] = s_status if s_status == "accepted" else f"{s_status}: {s_val}"[:300]
    rec["traced"] = t_status if t_status == "accepted" else f"{t_status}: {t_val}"[:300]
    rec["stax_status"], rec["traced_status"] = s_status, t_status
    if _is_multi(x) and tuple_spellings:
        for tag, tuple_jit in (("traced_tuple", False), ("traced_tuple_jit", True)):
            u_status, u_val = traced_kernel(spec, x, strict, inputs="tuple", jit=tuple_jit)
            rec[f"{tag}_status"] = u_status
            rec[tag] = u_status if u_status == "accepted" else f"{u_status}: {u_val}"[:300]
            if u_status == "accepted" and t_status == "accepted":
                e = max(rel_err(u_val[0], t_val[0]), rel_err(u_val[1], t_val[1]))
                rec[f"{tag}_diff"] = {"rel": e, "ok": bool(e <= diff_tol)}
    if t_status == "accepted":
        rec["traced_reads"] = t_val[2]
    if s_status == "accepted" and t_status == "accepted":
        quad = uses_quadrature(spec, t_val[2])
        tol = quad_tol if quad else diff_tol
        e_nngp, e_ntk = rel_err(t_val[0], s_val[0]), rel_err(t_val[1], s_val[1])
        rec["diff"] = {"nngp_rel": e_nngp, "ntk_rel": e_ntk, "tol": tol, "quadrature": quad,
                       "ok": bool(e_nngp <= tol and e_ntk <= tol)}
        if not rec["diff"]["ok"]:
            rec["diff"]["stax_nngp"] = s_val[0].round(6).tolist()
            rec["diff"]["traced_nngp"] = t_val[0].round(6).tolist()
    if do_mc:
        for name, status, val, mc in (("stax", s_status, s_val, mc_stax), ("traced", t_status, t_val, mc_traced)):
            if status != "accepted":
                continue
            if name == "traced" and s_status == "accepted" and rec.get("diff", {}).get("ok"):
                continue   # the same kernel as stax's, already checked against Monte Carlo
            try:
                samples = mc(spec, x, width, draws, seed + 1)
            except Exception as e:  # noqa: BLE001
                rec[f"mc_{name}"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
                continue
            ok, zmax, mean, se = z_check(val[0], samples, z, rel_atol)
            r = {"ok": ok, "zmax": zmax, "width": width, "draws": draws}
            if not ok:
                r.update(kernel=val[0].round(5).tolist(), mc_mean=mean.round(5).tolist(), mc_se=se.round(5).tolist())
            if not ok and escalate > 1:
                # finite-width bias falls like 1 / width, a wrong kernel stays wrong: the same test on networks
                # `escalate` times wider (fresh draws) decides, and the first test stays in the record
                try:
                    wide = mc(spec, x, width * escalate, draws, seed + 2, chunk=10)
                    ok2, zmax2, mean2, se2 = z_check(val[0], wide, z, rel_atol)
                    first, r = r, {"ok": ok2, "zmax": zmax2, "width": width * escalate, "draws": draws}
                    r["first"] = first
                    if not ok2:
                        r.update(mc_mean=mean2.round(5).tolist(), mc_se=se2.round(5).tolist())
                except Exception as e:  # noqa: BLE001
                    r["escalation_error"] = f"{type(e).__name__}: {e}"[:300]
            rec[f"mc_{name}"] = r
    return rec


def failures(rec) -> list:
    """What is wrong with a record: crashes (unclear refusals), stax-vs-traced and Monte-Carlo mismatches."""
    out = []
    for name in ("stax", "traced"):
        if rec[f"{name}_status"] == "crash":
            out.append(f"{name} crashed: {rec[name]}")
        if not rec.get(f"mc_{name}", {"ok": True})["ok"]:
            out.append(f"{name} vs Monte Carlo: {rec[f'mc_{name}']}")
    if not rec.get("diff", {"ok": True})["ok"]:
        out.append(f"stax vs traced: {rec['diff']}")
    for tag, what in (("traced_tuple", "tuple input"), ("traced_tuple_jit", "tuple input, jitted")):
        if rec.get(f"{tag}_status") == "crash":
            out.append(f"traced ({what}) crashed: {rec[tag]}")
        if not rec.get(f"{tag}_diff", {"ok": True})["ok"]:
            out.append(f"traced ({what}) vs traced (concatenated input): {rec[f'{tag}_diff']}")
    return out
