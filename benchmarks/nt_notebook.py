"""neural-tangents' Myrtle notebook, run unchanged through `smnngp.nt` and through neural-tangents 0.6.5 (issue 50).

    python benchmarks/nt_notebook.py --notebook PATH/myrtle_kernel_with_neural_tangents.ipynb

The notebook is nt's tutorial for whole-data-set kernels (``notebooks/myrtle_kernel_with_neural_tangents.ipynb`` in
the neural-tangents repository): Myrtle-5's NNGP and NTK of CIFAR-shaped inputs, jitted and through ``nt.batch``,
each cell timed by IPython's ``%%timeit``. It is not part of nt's PyPI distribution and is never committed here:
give its path (``--notebook`` or ``$SMNNGP_NT_NOTEBOOK``), e.g. from a clone of the repository.

Each engine runs in its own fresh process, one after the other (never side by side on the same cores): ours with
``scripts/nt_conformance/shim`` first on ``PYTHONPATH`` (a package named ``neural_tangents`` that is `smnngp.nt`),
nt in its pinned oracle environment (``$SMNNGP_ORACLE_VENV``, default ``.venv-oracle``; ``bash
scripts/make_golden.sh`` builds it with IPython). The worker runs every code cell in one IPython shell, as Jupyter
would, with two changes: lines that start with ``!`` (the pip installs and ``nvidia-smi``) are dropped, and comment
lines above a ``%%timeit`` are dropped (Colab, where the notebook was written, runs them; IPython wants a cell
magic on the first line). It records
each cell's wall time and what ``%%timeit`` printed. Before anything is timed as a comparison, the two engines'
kernels are compared: after the notebook, each worker evaluates the notebook's own batched ``ker_fn`` (NNGP and
NTK) on 20 inputs of ``input_x``'s shape drawn by NumPy (the notebook's own ``jax.random`` inputs differ between
nt's jax 0.4.23 and current JAX), and the two results must agree to 1e-10 relative to their scale, or no ratio is
printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import check, check_text, ratio_text, scale_relative_error, write_results  # noqa: E402

SHIM = ROOT / "scripts" / "nt_conformance" / "shim"
TOLERANCE = 1e-10
CHECK_POINTS = 20  # inputs of the check (two tiles and a half of the notebook's batch_size=10)


def code_cells(notebook: Path, timeit_runs: int | None = None) -> list[str]:
    """The notebook's code cells, shell-escape lines (``!...``) dropped; cells left empty are skipped. With
    ``timeit_runs``, each ``%%timeit`` becomes ``%%timeit -r timeit_runs -n 1`` (that many calls, the first one
    compiling, in place of IPython's calibration and 7 runs)."""
    try:
        nb = json.loads(Path(notebook).read_text())
    except FileNotFoundError:
        raise SystemExit(f"nt_notebook: no notebook at {notebook}; pass --notebook PATH to nt's "
                         f"myrtle_kernel_with_neural_tangents.ipynb") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"nt_notebook: {notebook} is not a notebook (JSON): {e}") from None
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = [line for line in src.splitlines() if not line.lstrip().startswith("!")]
        code = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
        if code and lines[code[0]].startswith("%%"):
            lines = lines[code[0]:]  # comments above a cell magic (Colab runs them; IPython wants the magic first)
            if timeit_runs is not None and lines[0].strip() == "%%timeit":
                lines[0] = f"%%timeit -r {int(timeit_runs)} -n 1"
        kept = "\n".join(lines)
        if kept.strip() and not all(line.lstrip().startswith("#") or not line.strip() for line in kept.splitlines()):
            cells.append(kept)
    if not cells:
        raise SystemExit(f"nt_notebook: {notebook} has no code cells")
    return cells


def worker(notebook: Path, out: Path, timeit_runs: int | None) -> None:
    """Run the cells in one IPython shell; write per-cell times and the final kernels (``out``: JSON + .npz)."""
    import numpy as np
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = code_cells(notebook, timeit_runs)
    records, start = [], time.perf_counter()
    for i, src in enumerate(cells):
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            result = shell.run_cell(src, store_history=True)
        dt = time.perf_counter() - t0
        printed = buf.getvalue().strip()
        first = src.strip().splitlines()[0][:70]
        print(f"  cell {i + 1}/{len(cells)}: {dt:7.1f} s  {first}  {printed[-90:]}", file=sys.stderr, flush=True)
        if not result.success:
            err = result.error_in_exec or result.error_before_exec
            raise SystemExit(f"nt_notebook worker: cell {i + 1} failed: {type(err).__name__}: {err}")
        records.append({"cell": i + 1, "first_line": first, "seconds": dt, "printed": printed[-400:]})
    total = time.perf_counter() - start
    # the check: the notebook's own batched kernel_fn, after the notebook, on inputs of its input's shape drawn by
    # NumPy (the notebook's jax.random inputs differ between jax 0.4.23 and current JAX: threefry's default changed)
    ns = shell.user_ns
    shape = (CHECK_POINTS,) + tuple(ns["input_x"].shape[1:])
    x = np.random.default_rng(0).standard_normal(shape)
    k = ns["ker_fn"](x, None, ("nngp", "ntk"))
    np.savez(out.with_suffix(".npz"), nngp=np.asarray(k.nngp), ntk=np.asarray(k.ntk))
    out.write_text(json.dumps({"cells": records, "total_seconds": total}))


def run_engine(engine: str, notebook: Path, tmp: Path, timeout: float, timeit_runs: int | None) -> dict:
    env = dict(os.environ)
    if engine == "ours":
        python = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    else:
        oracle = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle"))
        python = str(oracle / "bin" / "python")
        if not Path(python).exists():
            raise SystemExit(f"nt_notebook: no oracle environment at {oracle} (bash scripts/make_golden.sh)")
        env.pop("PYTHONPATH", None)
        # IPython adds $VIRTUAL_ENV's packages to the path: the caller's environment must not leak into the oracle's
        env["VIRTUAL_ENV"] = str(oracle)
    env["JAX_PLATFORMS"] = "cpu"
    out = tmp / f"{engine}.json"
    print(f"{engine}: running the notebook ({python})", flush=True)
    t0 = time.perf_counter()
    cmd = [python, __file__, "--worker", "--notebook", str(notebook), "--worker-out", str(out)]
    if timeit_runs is not None:
        cmd += ["--timeit-runs", str(timeit_runs)]
    proc = subprocess.run(cmd, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"nt_notebook: the {engine} worker failed (exit {proc.returncode})")
    rec = json.loads(out.read_text())
    rec["process_seconds"] = time.perf_counter() - t0
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebook", type=Path, default=os.environ.get("SMNNGP_NT_NOTEBOOK"),
                    help="nt's myrtle_kernel_with_neural_tangents.ipynb (default $SMNNGP_NT_NOTEBOOK)")
    ap.add_argument("--engines", nargs="+", default=["nt", "ours"], choices=["nt", "ours"])
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per engine")
    ap.add_argument("--timeit-runs", type=int, default=None,
                    help="rewrite each %%%%timeit as %%%%timeit -r N -n 1 (N calls per timed cell; default: unchanged, "
                         "IPython's calibration and 7 runs, which takes nt about an hour on 2 CPU cores)")
    ap.add_argument("--out", type=Path, default=ROOT / "records" / "benchmarks" / "nt_myrtle_notebook_cpu.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.notebook is None:
        ap.error("give --notebook PATH (nt's myrtle_kernel_with_neural_tangents.ipynb) or set SMNNGP_NT_NOTEBOOK")
    if args.worker:
        worker(args.notebook, args.worker_out, args.timeit_runs)
        return
    import tempfile

    import numpy as np

    if args.timeit_runs is not None and args.timeit_runs < 1:
        ap.error(f"--timeit-runs must be >= 1, got {args.timeit_runs}")
    code_cells(args.notebook)  # a bad path fails here, before any worker starts
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        for engine in args.engines:
            runs[engine] = run_engine(engine, args.notebook, Path(d), args.timeout, args.timeit_runs)
            runs[engine]["kernels"] = dict(np.load(Path(d) / f"{engine}.npz"))
    verdict = None
    if set(runs) == {"nt", "ours"}:
        errors = {name: scale_relative_error(runs["ours"]["kernels"][name], runs["nt"]["kernels"][name])
                  for name in ("nngp", "ntk")}
        verdict = check(errors, {name: TOLERANCE for name in errors}, "nt 0.6.5, the notebook's batched ker_fn")
    print()
    names = list(runs)
    print(f"{'cell':<6}" + "".join(f"{n + ' (s)':>12}" for n in names) + "  first line")
    cells = runs[names[0]]["cells"]
    for j, c in enumerate(cells):
        print(f"{c['cell']:<6}" + "".join(f"{runs[n]['cells'][j]['seconds']:12.1f}" for n in names)
              + f"  {c['first_line']}")
    print(f"{'total':<6}" + "".join(f"{runs[n]['total_seconds']:12.1f}" for n in names))
    report = {"notebook": str(args.notebook.name), "tolerance": TOLERANCE, "timeit_runs": args.timeit_runs,
              "runs": {n: {k: v for k, v in r.items() if k != "kernels"} for n, r in runs.items()}}
    if verdict is not None:
        ratio = runs["ours"]["total_seconds"] / runs["nt"]["total_seconds"]
        print(f"\nkernels, ours against nt: {check_text(verdict)}")
        print(f"whole notebook, ours / nt: {ratio_text(ratio, verdict)} (target <= 0.5x)")
        report.update(check=verdict, ratio=ratio if verdict["ok"] else None)
    write_results(args.out, report)


if __name__ == "__main__":
    main()
