"""Where a first call of ``kernel_fn`` goes: trace, lowering, XLA compilation and the first run, timed apart.

Usage (from the project root)::

    .venv/bin/python benchmarks/kernels_compile.py [--cases mlp4_relu,attention2] [--untiled] [--steady 10]

The cases and inputs are those of `benchmarks/kernels.py` (smnngp only, float64, ``x2=None``,
``get=('nngp', 'ntk')``). Each case runs in this process after a warm-up on a tiny input of its own
architecture, as there: ``jax.jit(...).trace``, ``.lower()``, ``.compile()`` and the first call are timed one by
one, then the best and median of ``--steady`` further calls, and the size of the optimised program (HLO
instructions). ``--untiled`` also times each case with the symmetric tiling of ``x2=None`` kernels switched off
(`smnngp.stax._core._SYMMETRIC_MIN_ENTRIES`), the two variants alternated call by call so that a busy spell on the
machine hits both alike. RESULTS §1 quotes its figures; run it at two commits to compare them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import worker_setup  # noqa: E402
from kernels import CASES, PATTERN_CASES, build, make_inputs  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--untiled", action="store_true", help="also time every case without the symmetric tiling")
    parser.add_argument("--steady", type=int, default=10, help="calls after the first (best and median reported)")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        parser.error(f"--cases: unknown {unknown}; choose from {','.join(CASES)}")
    if args.steady < 1:
        parser.error("--steady must be at least 1")

    import jax
    import jax.numpy as jnp

    stax, _ = worker_setup("ours")
    from smnngp.stax import _core

    tiled_threshold = _core._SYMMETRIC_MIN_ENTRIES
    variants = {"tiled": tiled_threshold, **({"untiled": 2**62} if args.untiled else {})}
    inputs = make_inputs(names)
    print(f"{'case':18s} {'variant':8s} {'trace':>7s} {'lower':>7s} {'compile':>8s} {'1st run':>8s} "
          f"{'best':>8s} {'median':>8s} {'HLO ops':>8s}")
    for name in names:
        x = jnp.asarray(inputs[name], jnp.float64)
        kw = {}
        if name in PATTERN_CASES:
            pattern = jnp.asarray(inputs[name + "__pattern"], jnp.float64)
            kw = {"pattern": (pattern, pattern)}
        tiny = jnp.ones(CASES[name][2], jnp.float64)
        tiny_kw = {"pattern": (jnp.ones((2,) + CASES[name][2][1:2] * 2),) * 2} if name in PATTERN_CASES else {}
        compiled, rows = {}, {}
        for variant, threshold in variants.items():
            _core._SYMMETRIC_MIN_ENTRIES = threshold
            warm = jax.jit(lambda a, k: build(stax, name)[2](a, None, ("nngp", "ntk"), **k))
            jax.block_until_ready(warm(tiny, tiny_kw))
            fn = jax.jit(lambda a, k: build(stax, name)[2](a, None, ("nngp", "ntk"), **k))
            t0 = time.perf_counter()
            traced = fn.trace(x, kw)
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            exe = lowered.compile()
            t3 = time.perf_counter()
            jax.block_until_ready(exe(x, kw))
            t4 = time.perf_counter()
            ops = sum(" = " in line for line in exe.as_text().splitlines())
            compiled[variant] = exe
            rows[variant] = {"phases": (t1 - t0, t2 - t1, t3 - t2, t4 - t3), "ops": ops, "steady": []}
        _core._SYMMETRIC_MIN_ENTRIES = tiled_threshold
        for _ in range(args.steady):
            for variant, exe in compiled.items():
                start = time.perf_counter()
                jax.block_until_ready(exe(x, kw))
                rows[variant]["steady"].append(time.perf_counter() - start)
        for variant, row in rows.items():
            steady = sorted(row["steady"])
            trace, lower, comp, first = row["phases"]
            phases = f"{trace:7.3f} {lower:7.3f} {comp:8.3f} {first:8.3f}"
            print(f"{CASES[name][0]:18s} {variant:8s} {phases} {steady[0]:8.4f} {steady[len(steady) // 2]:8.4f} "
                  f"{row['ops']:8d}")
    print("seconds; trace / lower / compile / 1st run: the phases of a first call; best / median: later calls")


if __name__ == "__main__":
    main()
