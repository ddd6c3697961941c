"""Time the empirical NTK of a finite ResNet-18-width CNN: `smnngp.empirical` against neural-tangents 0.6.5.

Usage (from the project root)::

    .venv/bin/python benchmarks/empirical_ntk.py [--repeats 3] [--rounds 1] [--implementations 3,1] [--size 16]

The network has ResNet-18's widths and depth: a 3x3 stem convolution with 64 channels, four stages of two basic
blocks (two 3x3 convolutions + ReLU with an identity or 1x1-projection shortcut) with 64, 128, 256 and 512
channels, strides of 2 between stages, global average pooling and a 10-way readout (about 11 million weights,
``Dense`` and ``Conv`` in NTK parameterisation; no batch normalisation: neither library's ``stax`` has it). The
NTK of ``--n`` images of ``--size`` x ``--size`` x 3 with themselves (``x2=None``), traced over the 10 logits,
float64, is computed by each ``NtkImplementation`` asked for (default: structured derivatives, the target of
issue 29, and Jacobian contraction for reference), ``jit``-compiled.

As in ``benchmarks/kernels.py`` (whose process and report helpers this script uses), each (library,
implementation) runs in a fresh process: ours here, neural-tangents in the oracle environment at
``SMNNGP_ORACLE_VENV`` (default ``.venv-oracle``). The parent draws the images and the weights once (with
`smnngp.stax`'s ``init_fn``, which draws neural-tangents' parameters bit for bit; drawing once keeps the two
workers independent of either library's key handling) and both workers load the same leaves into their own
parameter structure, so the kernels must agree, which the parent checks.
The first call (trace + compile + run) and the best steady-state call are reported apart, with ratios
ours / neural-tangents (below 1: we are faster), and written to ``benchmarks/results/empirical_ntk.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import time_first_and_steady, worker_setup, write_results  # noqa: E402
from kernels import THREADS, git_commit, summarise, worker_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "empirical_ntk.json"
NAMES = {1: "Jacobian contraction", 2: "NTK-vector products", 3: "structured derivatives"}


def resnet18_width(stax):
    """ResNet-18's widths and depth from either library's ``stax`` (same names in both)."""

    def block(channels, stride, project):
        main = stax.serial(stax.Conv(channels, (3, 3), (stride, stride), padding="SAME"), stax.Relu(),
                           stax.Conv(channels, (3, 3), padding="SAME"))
        short = stax.Conv(channels, (1, 1), (stride, stride), padding="SAME") if project else stax.Identity()
        return stax.serial(stax.FanOut(2), stax.parallel(main, short), stax.FanInSum(), stax.Relu())

    layers = [stax.Conv(64, (3, 3), padding="SAME"), stax.Relu()]
    for i, channels in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        layers += [block(channels, stride, i > 0), block(channels, 1, False)]
    return stax.serial(*layers, stax.GlobalAvgPool(), stax.Dense(10))


def worker(library: str, implementation: int, inputs_path: str, out_path: str, repeats: int) -> None:
    """Time one (library, implementation); save its kernel (.npz) and timings (.json) under ``out_path``."""
    import resource

    import jax
    import jax.numpy as jnp

    stax, emp = worker_setup(library)

    init_fn, apply_fn, _ = resnet18_width(stax)
    with np.load(inputs_path) as f:
        x = jnp.asarray(f["x"])
        leaves = [jnp.asarray(f[f"p{i}"]) for i in range(len(f.files) - 1)]
    structure = jax.tree_util.tree_structure(init_fn(jax.random.PRNGKey(0), x.shape)[1])
    shapes = [leaf.shape for leaf in jax.tree_util.tree_leaves(init_fn(jax.random.PRNGKey(0), x.shape)[1])]
    if shapes != [leaf.shape for leaf in leaves]:
        raise SystemExit(f"{library}: the network's weights do not have the shapes of the shared ones")
    params = jax.tree_util.tree_unflatten(structure, leaves)
    n_params = sum(int(np.prod(p.shape)) for p in leaves)
    ntk = jax.jit(emp.empirical_ntk_fn(apply_fn, vmap_axes=0, implementation=implementation))

    out, first, steady = time_first_and_steady(ntk, x, None, params, repeats=repeats)
    np.savez(out_path + ".npz", ntk=np.asarray(out))
    info = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "first": first, "steady": steady,
            "planned_bytes": None, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "n_params": n_params}
    if library == "nt":
        info["neural_tangents"] = emp.__version__
    Path(out_path + ".json").write_text(json.dumps(info))


def shared_inputs(n: int, size: int) -> dict[str, np.ndarray]:
    """The images ``x`` and the weights ``p0, p1, ...`` (leaves in order) both workers use."""
    import jax

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(ROOT))
    from smnngp import stax

    x = np.random.default_rng(0).standard_normal((n, size, size, 3))
    _, params = resnet18_width(stax)[0](jax.random.PRNGKey(1), x.shape)
    return {"x": x, **{f"p{i}": np.asarray(p) for i, p in enumerate(jax.tree_util.tree_leaves(params))}}


def run_worker(python, library, implementation, args, inputs_path, out_path):
    import subprocess

    cmd = [python, str(Path(__file__).resolve()), "--worker", library, "--implementations", str(implementation),
           "--inputs", inputs_path, "--repeats", str(args.repeats), "--out", out_path]
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"{library} worker (implementation {implementation}) failed with exit code {proc.returncode}")
    with np.load(out_path + ".npz") as f:
        return json.loads(Path(out_path + ".json").read_text()), f["ntk"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="steady-state calls after the first (best is kept)")
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes per measurement (best is kept)")
    parser.add_argument("--implementations", default="3,1", help="NtkImplementation values (1, 2, 3), comma-separated")
    parser.add_argument("--n", type=int, default=4, help="number of images")
    parser.add_argument("--size", type=int, default=16, help="image side in pixels")
    parser.add_argument("--results", default=str(RESULTS), help="where to write the JSON report")
    parser.add_argument("--worker", choices=("ours", "nt"), help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        impls = [int(s) for s in args.implementations.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--implementations must be integers among 1, 2, 3, got {args.implementations!r}")
    if not impls or any(i not in NAMES for i in impls):
        parser.error(f"--implementations must be among 1, 2, 3, got {args.implementations!r}")
    if min(args.repeats, args.rounds, args.n, args.size) < 1:
        parser.error("--repeats, --rounds, --n and --size must be at least 1")
    if args.worker:
        worker(args.worker, impls[0], args.inputs, args.out, args.repeats)
        return

    oracle_python = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle")) / "bin" / "python"
    libraries = {"ours": sys.executable, **({"nt": str(oracle_python)} if oracle_python.exists() else {})}
    if "nt" not in libraries:
        print(f"neural-tangents oracle not found at {oracle_python}: build it with `bash scripts/make_golden.sh`; "
              f"timing smnngp only")
    runs = {(lib, i): [] for lib in libraries for i in impls}
    kernels = {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = os.path.join(tmp, "inputs.npz")
        np.savez(inputs_path, **shared_inputs(args.n, args.size))
        for r in range(args.rounds):
            for i in impls:
                for lib, python in libraries.items():  # alternate: a busy spell hits both alike
                    print(f"round {r + 1}/{args.rounds}: {lib}, {NAMES[i]} ...", flush=True)
                    info, kernels[lib, i] = run_worker(python, lib, i, args, inputs_path,
                                                          os.path.join(tmp, f"{lib}_{i}"))
                    runs[lib, i].append(info)
    n_params = runs["ours", impls[0]][0]["n_params"]
    print(f"\nResNet-18-width CNN ({n_params / 1e6:.1f} M weights), empirical NTK of {args.n} images of "
          f"{args.size}x{args.size}x3 with themselves, traced over 10 logits, float64, {THREADS} threads")
    head = f"{'implementation':24s} {'ours 1st':>9s} {'NT 1st':>9s} {'ratio':>6s}   {'ours run':>9s} {'NT run':>9s} " \
           f"{'ratio':>6s}   {'|ours-NT|/|NT|':>14s}"
    print(head)
    print("-" * len(head))
    report = {"commit": git_commit(), "threads": THREADS, "n": args.n, "size": args.size, "n_params": n_params,
              "repeats": args.repeats, "rounds": args.rounds, "implementations": {}}
    for i in impls:
        o = summarise(runs["ours", i])
        entry = {"name": NAMES[i], "ours": o}
        if "nt" in libraries:
            t = summarise(runs["nt", i])
            err = float(np.max(np.abs(kernels["ours", i] - kernels["nt", i])) / np.max(np.abs(kernels["nt", i])))
            entry.update(nt=t, ratio_first=o["first"] / t["first"], ratio_steady=o["steady"] / t["steady"],
                         max_abs_diff_over_max_abs=err)
            print(f"{NAMES[i]:24s} {o['first']:9.2f} {t['first']:9.2f} {o['first'] / t['first']:6.2f}   "
                  f"{o['steady']:9.3f} {t['steady']:9.3f} {o['steady'] / t['steady']:6.2f}   {err:14.1e}")
        else:
            print(f"{NAMES[i]:24s} {o['first']:9.2f} {'-':>9s} {'-':>6s}   {o['steady']:9.3f} {'-':>9s} {'-':>6s}")
        report["implementations"][str(i)] = entry
    print("seconds; 1st = first call (trace + compile + run), run = best steady-state call; ratio = ours / NT")
    write_results(Path(args.results), report)


if __name__ == "__main__":
    main()
