"""Where a first call of ``kernel_fn`` goes: trace, lowering, XLA compilation and the first run, timed apart.

Usage (from the project root)::

    .venv/bin/python benchmarks/kernels_compile.py [--cases mlp4_relu,attention2] [--untiled] [--steady 10]

The cases and inputs are those of `benchmarks/kernels.py` (smnngp only, float64, ``x2=None``,
``get=('nngp', 'ntk')``). Each case runs in this process after a warm-up on a tiny input of its own
architecture, as there: ``jax.jit(...).trace``, ``.lower()``, ``.compile()`` and the first call are timed one by
one, then the best and median of ``--steady`` further calls, and the size of the optimised program (HLO
instructions). ``--untiled`` also times each case with the symmetric tiling of ``x2=None`` kernels switched off
(`smnngp.stax._core._SYMMETRIC_MIN_ENTRIES`), the two variants alternated call by call so that a busy spell on the
machine hits both alike. ``--nt-program`` also times neural-tangents' own program for each case compiled by
*this* JAX: the oracle environment (``SMNNGP_ORACLE_VENV``, default ``.venv-oracle``) traces nt's ``kernel_fn``
and exports it (StableHLO, `jax.experimental.export`), and this process lowers, compiles and runs the export
(``pip install flatbuffers`` to read it; in the ``bench`` extra). The row separates what the toolchain costs
(the same program compiled by jaxlib 0.4.23 and by ours) from what our program costs (ours and nt's on one
compiler); its trace column is nt's trace in its own environment. RESULTS §1 quotes its figures; run it at two
commits to compare them.

Check before timing (issue 49): each row's kernels (NNGP and NTK, from its compiled program) are compared with the
exact reference of the same run, our ``kernel_fn(x, x)`` (``x2`` passed: the general path, which neither the
symmetric tiling nor the ``x2=None`` shortcuts take), as ``max |row - ref| / max |ref|`` over all entries and off
the diagonal (`kernels.relative_error`: at coincident points the ReLU arc-cosine kernel's square-root singularity
turns last-bit differences into ~1e-8 in the NTK). A row above the tolerances ``TOL`` prints ``WRONG (err ...)``
instead of its timings.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check, worker_setup, wrong_text  # noqa: E402
from kernels import CASES, PATTERN_CASES, ROOT, build, make_inputs, relative_error, worker_env  # noqa: E402

# stated tolerances, max |row - ref| / max |ref|: over all entries (the ReLU diagonal: ~1e-8 measured) and off the
# diagonal (float64 rounding)
TOL = {"nngp": 1e-6, "ntk": 1e-6, "nngp_off_diagonal": 1e-10, "ntk_off_diagonal": 1e-10}


def kernel_check(kernels, ref) -> dict:
    """`_common.check` of ``(nngp, ntk)`` against the reference ``(nngp, ntk)``."""
    import numpy as np

    errors = {}
    for f, a, b in zip(("nngp", "ntk"), kernels, ref):
        a, b = np.asarray(a, float), np.asarray(b, float)
        e = relative_error(a, b) if a.shape == b.shape and np.all(np.isfinite(a)) else \
            {"all": float("inf"), "off_diagonal": float("inf")}
        errors[f], errors[f + "_off_diagonal"] = e["all"], e["off_diagonal"]
    return check(errors, TOL, "our kernel_fn(x, x) (x2 passed: the general path), same inputs")


def timed_first_call(fn, args):
    """``(compiled, (trace, lower, compile, first run))`` of the jitted ``fn`` on ``args``, in seconds, with the
    garbage collector off (as `_common.time_first_and_steady`). On a JAX without ``jit(...).trace`` (nt's 0.4.23)
    the trace is timed with the lowering and reported as 0."""
    import jax

    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        staged = fn.trace(*args) if hasattr(fn, "trace") else fn
        t1 = time.perf_counter()
        lowered = staged.lower() if hasattr(fn, "trace") else fn.lower(*args)
        t2 = time.perf_counter()
        exe = lowered.compile()
        t3 = time.perf_counter()
        jax.block_until_ready(exe(*args))
        t4 = time.perf_counter()
    finally:
        gc.enable()
    return exe, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)


def export_nt(names, out_dir: str) -> None:
    """In the oracle environment: trace nt's ``kernel_fn`` of each case and write its export to ``out_dir``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.export import export, serialization

    stax, _ = worker_setup("nt")
    inputs = make_inputs(names)
    for name in names:
        x = jnp.asarray(inputs[name], jnp.float64)
        args = [x] + ([jnp.asarray(inputs[name + "__pattern"], jnp.float64)] if name in PATTERN_CASES else [])

        def kernel(a, *pattern, name=name):
            kw = {"pattern": (pattern[0], pattern[0])} if pattern else {}
            return tuple(build(stax, name)[2](a, None, ("nngp", "ntk"), **kw))

        tiny = [jnp.ones(CASES[name][2], jnp.float64)]
        if name in PATTERN_CASES:
            tiny.append(jnp.ones((2,) + CASES[name][2][1:2] * 2, jnp.float64))
        jax.block_until_ready(jax.jit(kernel)(*tiny))  # as for ours: layer types traced once before the timing
        _, (trace, lower, comp, first) = timed_first_call(jax.jit(kernel), args)
        own = {"trace": trace + lower, "compile": comp, "first": first}  # nt's, in its own environment
        exported = export.export(jax.jit(kernel))(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args])
        Path(out_dir, name + ".bin").write_bytes(serialization.serialize(exported))
        Path(out_dir, name + ".own.json").write_text(json.dumps(own))


def time_export(name: str, out_dir: str, steady: int) -> None:
    """In a child process of this environment: lower, compile and run nt's exported program of case ``name``."""
    import jax
    import jax.numpy as jnp

    worker_setup("ours")
    jax.block_until_ready(jax.jit(lambda a: a + 1)(jnp.ones(3)))  # backend start-up is not the case's cost
    exported = jax.export.deserialize(bytearray(Path(out_dir, name + ".bin").read_bytes()))
    inputs = make_inputs([name])
    args = [jnp.asarray(inputs[name], jnp.float64)]
    if name in PATTERN_CASES:
        args.append(jnp.asarray(inputs[name + "__pattern"], jnp.float64))
    exe, (trace, lower, comp, first) = timed_first_call(jax.jit(exported.call), args)
    times = []
    for _ in range(steady):
        start = time.perf_counter()
        out = jax.block_until_ready(exe(*args))
        times.append(time.perf_counter() - start)
    np.savez(Path(out_dir, name + ".out.npz"), nngp=np.asarray(out[0]), ntk=np.asarray(out[1]))
    own = json.loads(Path(out_dir, name + ".own.json").read_text())
    print(json.dumps({"phases": (own["trace"], trace + lower, comp, first), "steady": times, "own": own,
                      "ops": sum(" = " in line for line in exe.as_text().splitlines())}))


def nt_program_row(name: str, out_dir: str, steady: int):
    """The timings of nt's program for ``name`` on this JAX (a child process: an XLA crash ends only it), or
    the reason there are none."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cases", name, "--time-export", out_dir,
           "--steady", str(steady)]
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        return f"failed in this JAX's XLA (exit code {proc.returncode})"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def export_programs(names, out_dir: str) -> None:
    """Have the oracle environment export nt's program of each case to ``out_dir``."""
    oracle_python = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle")) / "bin" / "python"
    if not oracle_python.exists():
        raise SystemExit(f"--nt-program: no oracle environment at {oracle_python.parent.parent} "
                         f"(build it with `bash scripts/make_golden.sh` or set SMNNGP_ORACLE_VENV)")
    try:
        import flatbuffers  # noqa: F401  (jax.export.deserialize needs it)
    except ImportError:
        raise SystemExit("--nt-program: reading nt's export needs flatbuffers (pip install flatbuffers, "
                         "or the bench extra)") from None
    cmd = [str(oracle_python), str(Path(__file__).resolve()), "--cases", ",".join(names), "--export-nt", out_dir]
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"--nt-program: exporting nt's programs failed with exit code {proc.returncode}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--untiled", action="store_true", help="also time every case without the symmetric tiling")
    parser.add_argument("--steady", type=int, default=10, help="calls after the first (best and median reported)")
    parser.add_argument("--nt-program", action="store_true",
                        help="also time neural-tangents' program for each case, compiled by this JAX")
    parser.add_argument("--export-nt", help=argparse.SUPPRESS)
    parser.add_argument("--time-export", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        parser.error(f"--cases: unknown {unknown}; choose from {','.join(CASES)}")
    if args.steady < 1:
        parser.error("--steady must be at least 1")
    if args.export_nt:
        export_nt(names, args.export_nt)
        return
    if args.time_export:
        time_export(names[0], args.time_export, args.steady)
        return

    import jax
    import jax.numpy as jnp

    stax, _ = worker_setup("ours")
    from smnngp.stax import _core

    tiled_threshold = _core._SYMMETRIC_MIN_ENTRIES
    variants = {"tiled": tiled_threshold, **({"untiled": 2**62} if args.untiled else {})}
    inputs = make_inputs(names)
    tmp = tempfile.TemporaryDirectory()
    if args.nt_program:
        export_programs(names, tmp.name)
    print(f"{'case':18s} {'variant':8s} {'trace':>7s} {'lower':>7s} {'compile':>8s} {'1st run':>8s} "
          f"{'best':>8s} {'median':>8s} {'HLO ops':>8s} {'err':>9s} {'err off':>9s}")
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
            exe, phases = timed_first_call(fn, (x, kw))
            ops = sum(" = " in line for line in exe.as_text().splitlines())
            compiled[variant] = exe
            rows[variant] = {"phases": phases, "ops": ops, "steady": []}
        _core._SYMMETRIC_MIN_ENTRIES = tiled_threshold
        outputs = {}
        for _ in range(args.steady):
            for variant, exe in compiled.items():
                start = time.perf_counter()
                outputs[variant] = jax.block_until_ready(exe(x, kw))
                rows[variant]["steady"].append(time.perf_counter() - start)
        reference = jax.jit(lambda a, k: build(stax, name)[2](a, a, ("nngp", "ntk"), **k))(x, kw)
        reference = (np.asarray(reference.nngp), np.asarray(reference.ntk))
        for variant, out in outputs.items():
            rows[variant]["check"] = kernel_check((out.nngp, out.ntk), reference)
        own = None
        if args.nt_program:
            row = nt_program_row(name, tmp.name, args.steady)
            if isinstance(row, str):
                print(f"{CASES[name][0]:18s} {'nt prog':8s} {row}")
            else:
                with np.load(Path(tmp.name, name + ".out.npz")) as nt_out:
                    row["check"] = kernel_check((nt_out["nngp"], nt_out["ntk"]), reference)
                rows["nt prog"], own = row, row["own"]
        for variant, row in rows.items():
            if not row["check"]["ok"]:  # the timing of a wrong answer is no timing of this computation
                print(f"{CASES[name][0]:18s} {variant:8s} {wrong_text(row['check'])}")
                continue
            steady = sorted(row["steady"])
            trace, lower, comp, first = row["phases"]
            phases = f"{trace:7.3f} {lower:7.3f} {comp:8.3f} {first:8.3f}"
            errs = row["check"]["errors"]
            err_all = max(errs["nngp"], errs["ntk"])
            err_off = max(errs["nngp_off_diagonal"], errs["ntk_off_diagonal"])
            print(f"{CASES[name][0]:18s} {variant:8s} {phases} {steady[0]:8.4f} {steady[len(steady) // 2]:8.4f} "
                  f"{row['ops']:8d} {err_all:9.1e} {err_off:9.1e}")
        if own is not None:
            print(f"{CASES[name][0]:18s} {'nt own':8s} {own['trace']:7.3f} {'':7s} {own['compile']:8.3f} "
                  f"{own['first']:8.3f}")
    print("seconds; trace / lower / compile / 1st run: the phases of a first call; best / median: later calls; "
          "err (off): max |kernel - ref| / max |ref| over the NNGP and NTK (off the diagonal) against our "
          f"kernel_fn(x, x), tolerance {TOL['ntk']:.0e} ({TOL['ntk_off_diagonal']:.0e})")
    if args.nt_program:
        print("nt prog: neural-tangents' program compiled and run by this JAX, in a child process (its trace column is "
              "nt's trace + lowering in its own environment, its lower column the lowering of the import here); "
              "nt own: the same program traced + lowered, compiled and first run by nt's own JAX (jaxlib 0.4.23)")
    tmp.cleanup()


if __name__ == "__main__":
    main()
