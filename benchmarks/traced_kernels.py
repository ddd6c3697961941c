"""Time the kernel of a Flax model read by `smnngp.traced` against the same network written with `smnngp.stax`.

Usage (from the project root)::

    .venv/bin/python benchmarks/traced_kernels.py [--repeats 5] [--rounds 1] [--cases mlp4_relu,resnet]

Issue 41's target: for networks that exist in stax, the traced ``kernel_fn`` runs within 1.2x of the stax one,
first call and steady state — the interpreter must build the same XLA program, not a slower one. Each (spelling,
case) pair runs in a fresh Python process (no compile cache or warm state shared), the two spellings alternating;
``--rounds R`` repeats every measurement in R processes and keeps the best times. A worker jits ``kernel_fn``
with ``static_argnames='get'`` and times the float64 train-train kernel (``x2=None``, ``get=('nngp', 'ntk')``):
the first call (for the traced spelling: tracing the Flax program, reading it, tracing the kernel, compiling,
running) and the best of ``--repeats`` steady calls. Before the timed call each worker evaluates the same network
on a tiny input, so that backend start-up is charged to neither.

Check before timing (issue 49): the exact reference of each row is the stax kernel of the same network on the same
inputs, computed in the same run; the parent records ``max |traced - stax| / max |stax|`` for the NNGP and the NTK
in each row (``check``) with a stated tolerance (``TOL``: the two spellings must build the same computation, so
they agree to rounding) and prints ``WRONG (err ...)`` instead of the ratios of a row above it. It prints the
ratios (traced / stax: 1.0 is parity) and writes ``benchmarks/results/traced_kernels.json``. ``--n`` changes the
number of inputs of every case (a smoke test; the timings are then not the issue's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check, ratio_text, scale_relative_error, time_first_and_steady, worker_setup, write_results  # noqa: E402,E501

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "traced_kernels.json"
SEED = 0
# stated tolerance: max |traced - stax| / max |stax| per kernel (same computation: rounding only, ~1e-16 measured)
TOL = 1e-10

# name -> (label, input shape)
CASES = {
    "mlp4_relu": ("MLP-4 ReLU, 2,000 points (tiled)", (2000, 8)),
    "mlp3_erf": ("MLP-3 erf, 1,000 points", (1000, 13)),
    "mlp3_gelu": ("MLP-3 exact GELU, 1,000 points", (1000, 13)),
    "resnet": ("dense ResNet, 2 blocks, 1,000 points", (1000, 8)),
    "layernorm": ("MLP-3 with LayerNorm, 1,000 points", (1000, 8)),
    "cnn_flatten": ("CNN-3 ReLU + Flatten, 200 8x8x3 images (diagonal spatial)", (200, 8, 8, 3)),
    "attention": ("self-attention block (softmax, residual) + ReLU + Flatten, 200 sequences of 16 x 8",
                  (200, 16, 8)),
    "attention_4heads": ("4-head self-attention block (heads split by a reshape) + ReLU + Flatten, 200 sequences "
                         "of 16 x 8", (200, 16, 8)),
    "wrn": ("WideResNet, 2 blocks + avg pool + Flatten, 64 8x8x3 images (all position pairs)", (64, 8, 8, 3)),
}


def _networks(case: str):
    """``(stax kernel_fn, traced kernel_fn)`` of one case: the same network in both spellings."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from smnngp import stax, traced

    bias = {"params/Dense_*/bias": traced.Bias(0.05)}  # not LayerNorm's offsets: fixed, as in stax
    dense = dict(W_std=1.0, b_std=0.05)
    width = 512

    if case in ("mlp4_relu", "mlp3_erf", "mlp3_gelu"):
        depth = 4 if case == "mlp4_relu" else 3
        act, layer = {"mlp4_relu": (nn.relu, stax.Relu()), "mlp3_erf": (jax.scipy.special.erf, stax.Erf()),
                      "mlp3_gelu": (lambda x: nn.gelu(x, approximate=False), stax.Gelu())}[case]

        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(depth):
                    x = act(nn.Dense(width)(x))
                return nn.Dense(1)(x)

        stax_net = stax.serial(*[stax.Dense(width, **dense), layer] * depth, stax.Dense(1, **dense))
    elif case == "resnet":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                h = nn.Dense(width)(x)
                for _ in range(2):
                    h = h + nn.Dense(width)(nn.relu(nn.Dense(width)(nn.relu(h))))
                return nn.Dense(1)(nn.relu(h))

        block = stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(
            stax.Relu(), stax.Dense(width, **dense), stax.Relu(), stax.Dense(width, **dense))), stax.FanInSum())
        stax_net = stax.serial(stax.Dense(width, **dense), block, block, stax.Relu(), stax.Dense(1, **dense))
    elif case == "layernorm":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(3):
                    x = nn.relu(nn.LayerNorm(epsilon=1e-12)(nn.Dense(width)(x)))
                return nn.Dense(1)(x)

        stax_net = stax.serial(*[stax.Dense(width, **dense), stax.LayerNorm(eps=1e-12), stax.Relu()] * 3,
                               stax.Dense(1, **dense))
    elif case == "cnn_flatten":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(3):
                    x = nn.relu(nn.Conv(width, (3, 3))(x))
                return nn.Dense(1)(x.reshape((x.shape[0], -1)))

        conv = dict(W_std=1.0, b_std=0.05, padding="SAME")
        stax_net = stax.serial(*[stax.Conv(width, (3, 3), **conv), stax.Relu()] * 3, stax.Flatten(),
                               stax.Dense(1, **dense))
    elif case == "wrn":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.Conv(width, (3, 3))(x)
                x = x + nn.Conv(width, (3, 3))(nn.relu(nn.Conv(width, (3, 3))(nn.relu(x))))
                h = nn.Conv(width, (3, 3))(nn.relu(nn.Conv(width, (3, 3), strides=(2, 2))(nn.relu(x))))
                x = h + nn.Conv(width, (3, 3), strides=(2, 2))(x)
                x = nn.avg_pool(nn.relu(x), (2, 2), strides=(2, 2))
                return nn.Dense(1)(x.reshape((x.shape[0], -1)))

        conv = dict(W_std=1.0, b_std=0.05, padding="SAME")

        def block(strides, shortcut):
            main = stax.serial(stax.Relu(), stax.Conv(width, (3, 3), strides, **conv), stax.Relu(),
                               stax.Conv(width, (3, 3), **conv))
            return stax.serial(stax.FanOut(2), stax.parallel(main, shortcut), stax.FanInSum())

        stax_net = stax.serial(stax.Conv(width, (3, 3), **conv), block((1, 1), stax.Identity()),
                               block((2, 2), stax.Conv(width, (3, 3), (2, 2), **conv)), stax.Relu(),
                               stax.AvgPool((2, 2), (2, 2)), stax.Flatten(), stax.Dense(1, **dense))
    elif case == "attention":
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.Dense(width)(x)
                k = nn.Dense(width, use_bias=False)(x)
                v = nn.Dense(width, use_bias=False)(x)
                a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", 0.5 * k, k) / width, axis=-1)
                x = nn.relu(x + nn.Dense(width)(jnp.einsum("bts,bsd->btd", a, v)))
                return nn.Dense(1)(x.reshape((x.shape[0], -1)))

        attention = stax.GlobalSelfAttention(width, width, width, 1, linear_scaling=True, W_query_std=0.5,
                                             b_std=0.05)
        stax_net = stax.serial(stax.Dense(width, **dense), stax.FanOut(2),
                               stax.parallel(stax.Identity(), attention), stax.FanInSum(), stax.Relu(),
                               stax.Flatten(), stax.Dense(1, **dense))
    elif case == "attention_4heads":
        heads = 4

        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.Dense(width)(x)
                split = x.shape[:2] + (heads, width // heads)
                k = nn.Dense(width, use_bias=False)(x).reshape(split)
                v = nn.Dense(width, use_bias=False)(x).reshape(split)
                a = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", 0.5 * k, k) / (width // heads), axis=-1)
                o = jnp.einsum("bhts,bshd->bthd", a, v).reshape(x.shape)
                x = nn.relu(x + nn.Dense(width)(o))
                return nn.Dense(1)(x.reshape((x.shape[0], -1)))

        attention = stax.GlobalSelfAttention(width, width // heads, width // heads, heads, linear_scaling=True,
                                             W_query_std=0.5, b_std=0.05)
        stax_net = stax.serial(stax.Dense(width, **dense), stax.FanOut(2),
                               stax.parallel(stax.Identity(), attention), stax.FanInSum(), stax.Relu(),
                               stax.Flatten(), stax.Dense(1, **dense))
    else:
        raise ValueError(f"unknown case {case!r}; cases: {sorted(CASES)}")
    model = Net()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((2,) + tuple(CASES[case][1][1:])))
    if case in ("cnn_flatten", "wrn", "attention", "attention_4heads"):
        bias = {"params/*/bias": traced.Bias(0.05)}
    _, _, traced_kfn = traced.infinite_width(model.apply, params, priors=bias)
    return stax_net[2], traced_kfn


def worker(spelling: str, case: str, data: str, repeats: int) -> None:
    worker_setup("ours")
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.load(data)["x"])
    stax_kfn, traced_kfn = _networks(case)
    kfn = jax.jit(stax_kfn if spelling == "stax" else traced_kfn, static_argnames="get")
    jax.block_until_ready(kfn(x[:2], None, get=("nngp", "ntk")))  # backend start-up, for both spellings
    out, first, steady = time_first_and_steady(lambda a: kfn(a, None, get=("nngp", "ntk")), x, repeats=repeats)
    np.savez(data + f".{spelling}.out.npz", nngp=np.asarray(out.nngp), ntk=np.asarray(out.ntk))
    print(json.dumps({"first": first, "steady": min(steady)}))


def _run(spelling: str, case: str, data: str, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", spelling, "--case", case, "--data", data, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{spelling} worker for {case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--n", type=int, help="inputs per case instead of the case's own (smoke test)")
    parser.add_argument("--worker", choices=("stax", "traced"), help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.case, args.data, args.repeats)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            parser.error(f"unknown case {c!r}; cases: {sorted(CASES)}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            label, shape = CASES[case]
            if args.n:
                shape, label = (args.n,) + tuple(shape[1:]), f"{label} [n = {args.n}]"
            data = str(Path(tmp) / f"{case}.npz")
            np.savez(data, x=np.random.default_rng(SEED).normal(size=shape))
            best = {"stax": None, "traced": None}
            for r in range(args.rounds):
                order = ("stax", "traced") if r % 2 == 0 else ("traced", "stax")
                for spelling in order:
                    t = _run(spelling, case, data, args.repeats)
                    b = best[spelling]
                    best[spelling] = t if b is None else {k: min(b[k], t[k]) for k in t}
                    print(f"  {case:10s} round {r + 1}/{args.rounds} {spelling:6s} first {t['first']:.3f} s, "
                          f"steady {t['steady']:.4f} s", flush=True)
            a, b = np.load(data + ".stax.out.npz"), np.load(data + ".traced.out.npz")
            errors = {k: scale_relative_error(b[k], a[k]) for k in ("nngp", "ntk")}
            verdict = check(errors, {k: TOL for k in errors}, "stax kernel_fn of the same network, same inputs")
            diff = max(errors.values())
            rows[case] = {"label": label, "shape": list(shape), "stax": best["stax"], "traced": best["traced"],
                          "ratio_first": best["traced"]["first"] / best["stax"]["first"] if verdict["ok"] else None,
                          "ratio_steady": best["traced"]["steady"] / best["stax"]["steady"] if verdict["ok"] else None,
                          "max_relative_difference": diff, "check": verdict}
    print(f"\n{'case':42s} {'first: stax / traced / ratio':>32s} {'steady: stax / traced / ratio':>36s}  max rel diff")
    for row in rows.values():
        s, t = row["stax"], row["traced"]
        if not row["check"]["ok"]:  # the timing of a wrong answer is no comparison
            print(f"{row['label']:42s} {ratio_text(None, row['check'])}")
            continue
        print(f"{row['label']:42s} {s['first']:9.3f} {t['first']:9.3f} {row['ratio_first']:7.2f}x "
              f"{s['steady']:11.4f} {t['steady']:9.4f} {row['ratio_steady']:7.2f}x   "
              f"{row['max_relative_difference']:.1e}")
    print(f"max rel diff: max |traced - stax| / max |stax| over the NNGP and NTK (tolerance {TOL:.0e})")
    write_results(Path(args.out), {"repeats": args.repeats, "rounds": args.rounds, "tolerance": TOL, "n": args.n,
                                   "cases": rows})


if __name__ == "__main__":
    main()
