"""Command line: `python -m experiments list` and `python -m experiments NAME [--out DIR] [--seed S] [--quick]`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

# XLA reads XLA_FLAGS once, when jax is first imported. The tanks experiments set this flag; it does NOT prevent
# the vmapped-Cholesky stall of JAX 0.10.2 (see finite.ard.fit_repeats), which they avoid by vectorize=False.
_EIGEN_OFF = "--xla_cpu_multi_thread_eigen=false"
if any(a in ("tanks-onestep", "tanks-simulation") for a in sys.argv[1:2]) and _EIGEN_OFF not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _EIGEN_OFF).strip()

# --quiet: tqdm reads TQDM_DISABLE when it is first imported, so it is set before anything imports it
if "--quiet" in sys.argv[2:]:
    os.environ["TQDM_DISABLE"] = os.environ["SMNNGP_QUIET"] = "1"

from experiments import EXPERIMENTS, progress, report


def _load(name):
    return importlib.import_module(EXPERIMENTS[name])


def build_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<18s} {_load(name).DESCRIPTION}" for name in EXPERIMENTS]
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Reproduce the papers' experiments. Each writes results.json, results.md and figures to --out.",
        epilog="experiments:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{list," + ",".join(EXPERIMENTS) + "}")
    sub.add_parser("list", help="list the experiments with a one-line description")
    for name in EXPERIMENTS:
        module = _load(name)
        p = sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        p.add_argument("--out", default=os.path.join("results", name), help="output directory (default: results/NAME)")
        p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        p.add_argument("--quick", action="store_true", help="fast mode (minutes at most), as run by CI")
        p.add_argument("--quiet", action="store_true", help="no progress bars or status lines (stderr); the "
                       "tables and the list of files written still print")
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
    return parser


def _enable_compilation_cache() -> str | None:
    """Keep compiled XLA programs on disk between runs (``$SMNNGP_JAX_CACHE``, default ``~/.cache/smnngp/jax``;
    ``off`` disables). A resumed or repeated long run then skips recompiling its programs (the masked sampler
    compiles one program per block shape, several seconds each)."""
    where = os.environ.get("SMNNGP_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "smnngp", "jax"))
    if where.lower() in ("off", "0", "none", ""):
        return None
    from smnngp._compilation_cache import enable_compilation_cache

    return enable_compilation_cache(where, min_compile_time_secs=1.0)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "list":
        for name in EXPERIMENTS:
            print(f"{name:<18s} {_load(name).DESCRIPTION}")
        return 0
    module = _load(args.command)
    if getattr(module, "SINGLE_THREADED_EIGEN", False) and _EIGEN_OFF not in os.environ.get("XLA_FLAGS", ""):
        print(f"note: {args.command} is meant to run with XLA_FLAGS={_EIGEN_OFF} (set when it is the first "
              "argument of python -m experiments); without it XLA's CPU runtime may stall", file=sys.stderr)
    progress.set_quiet(args.quiet)
    config = {k: v for k, v in vars(args).items() if k not in ("command", "out", "seed", "quiet")}
    if not args.quick:
        _enable_compilation_cache()
    start, started_at = time.perf_counter(), time.time()
    progress.note(f"{args.command}: started (output in {args.out})")
    rep = module.run(args)
    wall = time.perf_counter() - start
    report.write(args.out, args.command, config, args.seed, wall, rep)
    print(rep.markdown)
    print(f"\n{args.command} finished in {wall:.1f} s and wrote these files under {args.out}:")
    for f in _written_since(args.out, started_at):
        print(f"  {f}")
    return 0


def _written_since(out: str, since: float) -> list[str]:
    """The files under ``out`` written since ``since`` (a ``time.time()``), results first; cell and checkpoint
    files of resumable runs are summarised by their folder."""
    files, folders = [], {}
    for root, _, names in os.walk(out):
        for n in names:
            f = os.path.join(root, n)
            if os.path.getmtime(f) >= since - 1.0:
                rel = os.path.relpath(f, out)
                if os.sep in rel:
                    top = os.path.join(out, rel.split(os.sep)[0])
                    folders[top] = folders.get(top, 0) + 1
                else:
                    files.append(f)
    files.sort(key=lambda f: (not os.path.basename(f).startswith("results"), f))
    return files + [f"{d}{os.sep} ({k} file{'s' if k > 1 else ''})" for d, k in sorted(folders.items())]


if __name__ == "__main__":
    sys.exit(main())
