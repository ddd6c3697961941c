"""A grammar of small architectures for the differential kernel tester (issue 49, part 1).

A network is a ``spec``: a tuple of blocks, always ``("dense", W_std, b_std)`` first and the read-out
``("dense", W_std, b_std)`` (one output) last. Blocks:

* ``("dense", W_std, b_std)``: a fully connected layer (W_std in [0.5, 2], b_std 0 or in [0.05, 0.5]);
* ``("act", act)``: an activation, ``act`` a tuple ``(name, *args)`` (see ``ACTS``);
* ``("layernorm",)``: layer normalisation over the channels;
* ``("res", combine, left, right)``: ``FanOut(2)``, ``parallel(left, right)`` and ``FanInSum`` /
  ``FanInProd`` / ``FanInConcat`` (channel axis) for ``combine`` "sum" / "prod" / "concat"; a branch is
  ``("id",)``, ``("act", act)`` or ``("dense_act", W_std, b_std, act)``.

Each spec is emitted twice: as `smnngp.stax` combinators (``to_stax``) and as plain JAX (``to_plain``: a function
``apply(params, x)`` written with jnp ops, a params pytree and the `smnngp.traced` priors naming every leaf).
``Chooser`` draws the choices either from a seeded ``random.Random`` (the long audit) or from Hypothesis' ``draw``
(the fast test), so both walk one grammar.
"""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np

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


def describe(spec) -> str:
    def act(a):
        return a[0] + ("(" + ",".join(f"{v:g}" for v in a[1:]) + ")" if len(a) > 1 else "")

    def branch(b):
        if b[0] == "id":
            return "Id"
        if b[0] == "act":
            return act(b[1])
        return f"[D({b[1]:g},{b[2]:g})>{act(b[3])}]"

    out = []
    for blk in spec:
        if blk[0] == "dense":
            out.append(f"D({blk[1]:g},{blk[2]:g})")
        elif blk[0] == "act":
            out.append(act(blk[1]))
        elif blk[0] == "layernorm":
            out.append("LN")
        else:
            out.append(f"{blk[1]}({branch(blk[2])}|{branch(blk[3])})")
    return " > ".join(out)


# ---------------------------------------------------------------- stax

def _stax_dense(width, w, b):
    return stax.Dense(width, W_std=w, b_std=b)


def _stax_act(a):
    return ACTS[a[0]][0](*a[1:])


def _stax_branch(br, width):
    if br[0] == "id":
        return stax.Identity()
    if br[0] == "act":
        return _stax_act(br[1])
    return stax.serial(_stax_dense(width, br[1], br[2]), _stax_act(br[3]))


def to_stax(spec, width: int = 16, n_out: int = 1):
    """The (init_fn, apply_fn, kernel_fn) triple of ``spec`` in `smnngp.stax`; read-out of ``n_out`` channels."""
    layers = []
    for i, blk in enumerate(spec):
        if blk[0] == "dense":
            layers.append(_stax_dense(n_out if i == len(spec) - 1 else width, blk[1], blk[2]))
        elif blk[0] == "act":
            layers.append(_stax_act(blk[1]))
        elif blk[0] == "layernorm":
            layers.append(stax.LayerNorm())
        else:
            fan_in = {"sum": stax.FanInSum, "prod": stax.FanInProd, "concat": lambda: stax.FanInConcat(-1)}
            layers.append(stax.serial(stax.FanOut(2),
                                      stax.parallel(_stax_branch(blk[2], width), _stax_branch(blk[3], width)),
                                      fan_in[blk[1]]()))
    return stax.serial(*layers)


# ---------------------------------------------------------------- plain JAX for smnngp.traced

def to_plain(spec, width: int = 16, d_in: int = 3, n_out: int = 1):
    """``(apply, params, priors)``: the same network written in plain JAX for `smnngp.traced.infinite_width`.

    Every weight ``W<i>`` is an ``(fan_in, fan_out)`` matrix of prior ``Weight(W_std)`` (variance W_std^2 / fan_in,
    'ntk' parameterisation as stax's Dense), every bias ``b<i>`` a vector of prior ``Bias(b_std)``.
    """
    params, priors = {}, {}
    counter = [0]

    def new_dense(fan_in, fan_out, w, b):
        i = counter[0]
        counter[0] += 1
        params[f"W{i}"] = jnp.zeros((fan_in, fan_out))
        priors[f"W{i}"] = traced.Weight(w)
        params[f"b{i}"] = jnp.zeros((fan_out,))
        priors[f"b{i}"] = traced.Bias(b)
        return i

    program = []   # closures h, p -> h, built while the widths are tracked
    cur = d_in

    def dense_op(i):
        return lambda p, h: h @ p[f"W{i}"] + p[f"b{i}"][None, :]

    def act_op(a):
        fn = ACTS[a[0]][1](*a[1:])
        return lambda p, h: fn(h)

    def layernorm_op(p, h):
        m = jnp.mean(h, axis=-1, keepdims=True)
        v = jnp.mean((h - m) ** 2, axis=-1, keepdims=True)
        return (h - m) / jnp.sqrt(v + 1e-12)

    for n, blk in enumerate(spec):
        if blk[0] == "dense":
            out = n_out if n == len(spec) - 1 else width
            program.append(dense_op(new_dense(cur, out, blk[1], blk[2])))
            cur = out
        elif blk[0] == "act":
            program.append(act_op(blk[1]))
        elif blk[0] == "layernorm":
            program.append(layernorm_op)
        else:
            ops, widths = [], []
            for br in blk[2:]:
                if br[0] == "id":
                    ops.append(lambda p, h: h)
                    widths.append(cur)
                elif br[0] == "act":
                    ops.append(act_op(br[1]))
                    widths.append(cur)
                else:
                    d, a = dense_op(new_dense(cur, width, br[1], br[2])), act_op(br[3])
                    ops.append(lambda p, h, d=d, a=a: a(p, d(p, h)))
                    widths.append(width)
            left, right = ops
            if blk[1] == "sum":
                program.append(lambda p, h, l=left, r=right: l(p, h) + r(p, h))
            elif blk[1] == "prod":
                program.append(lambda p, h, l=left, r=right: l(p, h) * r(p, h))
            else:
                program.append(lambda p, h, l=left, r=right: jnp.concatenate([l(p, h), r(p, h)], axis=-1))
                cur = sum(widths)
                continue
            if widths[0] != widths[1]:
                raise ValueError(f"branch widths differ: {widths}")

    def apply(p, x):
        h = x
        for op in program:
            h = op(p, h)
        return h

    return apply, params, priors


def inputs(key: int = 0, n: int = 4, d_in: int = 3):
    """Inputs of norm about sqrt(d_in): rows of a standard normal, one pair nearly parallel."""
    x = np.array(jax.random.normal(jax.random.PRNGKey(key), (n, d_in)), dtype=np.float64)
    x[-1] = 0.9 * x[0] + 0.1 * x[-1]
    return jnp.asarray(x)


# ---------------------------------------------------------------- the checks

# A refusal is clear when it is one of these with a message; anything else raised is a crash.
try:
    CLEAR = (ValueError, NotImplementedError, traced.TracedError)
except AttributeError:  # pragma: no cover
    CLEAR = (ValueError, NotImplementedError)


def _run(build):
    """("accepted", kernel) / ("refused", message) / ("crash", message)."""
    try:
        return "accepted", build()
    except CLEAR as e:
        msg = f"{type(e).__name__}: {e}"
        return ("refused", msg) if str(e).strip() else ("crash", "empty message " + msg)
    except Exception as e:  # noqa: BLE001 - a crash is a finding, recorded and failed
        return "crash", f"{type(e).__name__}: {e}"


def stax_kernel(spec, x):
    def build():
        _, _, kernel_fn = to_stax(spec)
        k = kernel_fn(x, None, ("nngp", "ntk"))
        return np.asarray(k[0]), np.asarray(k[1])
    return _run(build)


def traced_kernel(spec, x):
    def build():
        apply, params, priors = to_plain(spec, d_in=x.shape[-1])
        _, _, kernel_fn = traced.infinite_width(apply, params, priors=priors)
        k = kernel_fn(x, None, ("nngp", "ntk"))
        how = sorted({h for _, h in kernel_fn.activations(x.shape)})
        return np.asarray(k[0]), np.asarray(k[1]), how
    return _run(build)


def uses_quadrature(spec, how=()) -> bool:
    """Whether either engine may integrate numerically: functions of one Gaussian paired in a residual block
    (stax's joint terms, traced's fused chain), or traced reading an activation by quadrature."""
    if any("Numerical" in h or "quadrature" in h.lower() for h in how):
        return True
    for blk in spec:
        if blk[0] == "res" and blk[1] in ("sum", "prod") and all(b[0] != "dense_act" for b in blk[2:]):
            return True
    # an activation of an activation: traced fuses the chain into one function (maybe by quadrature)
    prev = None
    for blk in spec:
        if blk[0] == "act" and prev in ("act", "res"):
            return True
        prev = blk[0]
    return False


def rel_err(a, b) -> float:
    scale = max(np.max(np.abs(b)), 1e-300)
    return float(np.max(np.abs(a - b)) / scale)


def mc_samples(init_fn, apply_fn, x, draws: int, seed: int, chunk: int = 50):
    """Per-draw NNGP estimates f f^T / n_out, shape (draws, N, N), float64."""
    def one(k):
        _, p = init_fn(k, x.shape)
        f = apply_fn(p, x)
        return f @ f.T / f.shape[-1]

    fn = jax.jit(jax.vmap(one))
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


def mc_stax(spec, x, width: int, draws: int, seed: int, n_out: int = 32):
    init_fn, apply_fn, _ = to_stax(spec, width=width, n_out=n_out)
    return mc_samples(init_fn, apply_fn, x, draws, seed)


def mc_traced(spec, x, width: int, draws: int, seed: int, n_out: int = 32):
    apply, params, priors = to_plain(spec, width=width, d_in=x.shape[-1], n_out=n_out)
    init_fn, apply_fn, _ = traced.infinite_width(apply, params, priors=priors)
    return mc_samples(init_fn, apply_fn, x, draws, seed)


def audit_one(spec, x, *, width: int = 256, draws: int = 200, seed: int = 0, diff_tol: float = 1e-8,
              quad_tol: float = 1e-3, z: float = 5.0, rel_atol: float = 0.02, do_mc: bool = True) -> dict:
    """Everything the tester checks on one network, as a JSON-able record."""
    rec = {"spec": describe(spec), "raw": repr(spec), "seed": seed}
    s_status, s_val = stax_kernel(spec, x)
    t_status, t_val = traced_kernel(spec, x)
    rec["stax"] = s_status if s_status == "accepted" else f"{s_status}: {s_val}"[:300]
    rec["traced"] = t_status if t_status == "accepted" else f"{t_status}: {t_val}"[:300]
    rec["stax_status"], rec["traced_status"] = s_status, t_status
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
    return out
