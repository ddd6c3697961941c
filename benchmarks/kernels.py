"""Time NNGP + NTK kernel evaluation of `smnngp.stax` against neural-tangents 0.6.5.

Usage (from the project root)::

    .venv/bin/python benchmarks/kernels.py [--repeats 3] [--cases mlp4_relu,resnet]

Each library runs in its own fresh Python process (ours in this interpreter's
environment, neural-tangents in the pinned oracle environment from
``SMNNGP_ORACLE_VENV``, default ``.venv-oracle``, built by
``bash scripts/make_golden.sh``) with the same thread settings and the same
inputs, drawn here with a fixed seed and handed over in a temporary .npz.
For every case the worker jits ``kernel_fn`` with ``static_argnames='get'``,
computes the float64 train-train kernel (``x2=None``, ``get=('nngp', 'ntk')``)
and reports the first call (compile + run) and the best of ``--repeats``
steady-state calls after it, each timed up to ``block_until_ready``.
The parent checks that both libraries' kernels agree, prints a table of
ratios (ours / neural-tangents, below 1 means we are faster) and writes
``benchmarks/results/kernels.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "kernels.json"
SEED = 0
THREADS = "2"

# name -> (description, input shape)
CASES = {
    "mlp4_relu": ("MLP-4 ReLU", (2000, 8)),
    "mlp3_erf": ("MLP-3 Erf", (1000, 13)),
    "cnn4_relu": ("CNN-4 ReLU", (200, 8, 8, 1)),
    "resnet": ("dense ResNet", (500, 6)),
}


def build(stax, name: str):
    """The architecture of case ``name`` from either library's ``stax`` (same names in both)."""
    if name == "mlp4_relu":
        hidden = [layer for _ in range(4) for layer in (stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu())]
        return stax.serial(*hidden, stax.Dense(1, W_std=1.0, b_std=0.0))
    if name == "mlp3_erf":
        hidden = [layer for _ in range(3) for layer in (stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf())]
        return stax.serial(*hidden, stax.Dense(1, W_std=1.0, b_std=0.0))
    if name == "cnn4_relu":
        conv = [
            layer
            for _ in range(4)
            for layer in (stax.Conv(64, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu())
        ]
        return stax.serial(*conv, stax.Flatten(), stax.Dense(10))
    if name == "resnet":

        def block():
            branch = stax.serial(stax.Relu(), stax.Dense(256, 1.3, 0.1), stax.Erf(), stax.Dense(256, 1.1))
            return stax.serial(stax.FanOut(2), stax.parallel(branch, stax.Identity()), stax.FanInSum())

        return stax.serial(stax.Dense(256, 1.2, 0.1), block(), block(), stax.Relu(), stax.Dense(1))
    raise ValueError(f"unknown case {name!r}; choose from {sorted(CASES)}")


# ---------------------------------------------------------------------------
# Worker: runs in a fresh process, for one library
# ---------------------------------------------------------------------------


def worker(library: str, inputs_path: str, out_path: str, repeats: int) -> None:
    """Time every case in ``inputs_path`` with one library; save kernels (.npz) and timings (.json)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    try:  # no persistent compilation cache: every first call must compile
        jax.config.update("jax_enable_compilation_cache", False)
    except (AttributeError, KeyError, ValueError):
        pass
    import jax.numpy as jnp

    if library == "ours":
        sys.path.insert(0, str(ROOT))
        from smnngp import stax
    else:
        import warnings

        warnings.filterwarnings("ignore")
        from neural_tangents import stax

    # Pay the one-off runtime start-up (backend, dispatch, first compile) before any case is timed.
    jax.block_until_ready(jax.jit(lambda a: jnp.tanh(a @ a.T).sum())(jnp.ones((4, 3))))

    data = np.load(inputs_path)
    kernels, timings = {}, {}
    for name in data.files:
        x = jax.device_put(jnp.asarray(data[name], jnp.float64))
        jax.block_until_ready(x)
        kernel_fn = jax.jit(build(stax, name)[2], static_argnames="get")

        start = time.perf_counter()
        out = jax.block_until_ready(kernel_fn(x, None, get=("nngp", "ntk")))
        first = time.perf_counter() - start

        steady = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(kernel_fn(x, None, get=("nngp", "ntk")))
            steady.append(time.perf_counter() - start)

        kernels[f"{name}.nngp"] = np.asarray(out.nngp)
        kernels[f"{name}.ntk"] = np.asarray(out.ntk)
        timings[name] = {"first": first, "steady": min(steady), "steady_all": steady}

    np.savez(out_path + ".npz", **kernels)
    info = {"jax": jax.__version__, "jaxlib": jax.lib.__version__, "timings": timings}
    if library == "nt":
        import neural_tangents

        info["neural_tangents"] = neural_tangents.__version__
    Path(out_path + ".json").write_text(json.dumps(info))


# ---------------------------------------------------------------------------
# Parent: inputs, workers, comparison, report
# ---------------------------------------------------------------------------


def make_inputs(names) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {name: rng.standard_normal(CASES[name][1]) for name in names}


def thread_env() -> dict[str, str]:
    """The same environment for both workers: fixed thread counts, quiet logs, CPU only."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = THREADS
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("PYTHONPATH", None)
    return env


def run_worker(python: str, library: str, inputs_path: str, out_path: str, repeats: int):
    cmd = [python, str(Path(__file__).resolve()), "--worker", library, "--inputs", inputs_path, "--out", out_path]
    cmd += ["--repeats", str(repeats)]
    proc = subprocess.run(cmd, env=thread_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"{library} worker failed with exit code {proc.returncode}")
    info = json.loads(Path(out_path + ".json").read_text())
    return info, dict(np.load(out_path + ".npz"))


def keep_best(best: dict | None, info: dict) -> dict:
    """Merge one worker's report into the best so far: per case, the fastest first and steady calls."""
    if best is None:
        for t in info["timings"].values():
            t["first_all"] = [t["first"]]
        return info
    for name, t in info["timings"].items():
        b = best["timings"][name]
        b["first_all"].append(t["first"])
        b["steady_all"] += t["steady_all"]
        b["first"] = min(b["first"], t["first"])
        b["steady"] = min(b["steady"], t["steady"])
    return best


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def print_table(names, ours, nt) -> None:
    head = f"{'case':14s} {'ours 1st':>9s} {'NT 1st':>9s} {'ratio':>6s}   {'ours run':>9s} {'NT run':>9s} {'ratio':>6s}"
    print(head)
    print("-" * len(head))
    for name in names:
        o = ours[name]
        if nt is None:
            print(
                f"{CASES[name][0]:14s} {o['first']:9.3f} {'-':>9s} {'-':>6s}   {o['steady']:9.4f} {'-':>9s} {'-':>6s}"
            )
            continue
        n = nt[name]
        r1, r2 = o["first"] / n["first"], o["steady"] / n["steady"]
        print(
            f"{CASES[name][0]:14s} {o['first']:9.3f} {n['first']:9.3f} {r1:6.2f}   "
            f"{o['steady']:9.4f} {n['steady']:9.4f} {r2:6.2f}"
        )
    print("times in seconds; ratio = ours / neural-tangents (below 1: we are faster)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="steady-state calls after the first (best is kept)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument(
        "--rounds", type=int, default=1, help="fresh worker processes per library, alternated; the best times are kept"
    )
    parser.add_argument("--worker", choices=("ours", "nt"), help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    if args.worker:
        worker(args.worker, args.inputs, args.out, args.repeats)
        return

    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown or not names:
        parser.error(f"--cases: unknown {unknown}; choose from {','.join(CASES)}")

    oracle = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle"))
    oracle_python = oracle / "bin" / "python"
    have_oracle = oracle_python.exists()
    if not have_oracle:
        print(f"neural-tangents oracle not found at {oracle}; build it with `bash scripts/make_golden.sh`")
        print("(or point SMNNGP_ORACLE_VENV at an existing one). Timing smnngp only.\n")

    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = os.path.join(tmp, "inputs.npz")
        np.savez(inputs_path, **make_inputs(names))
        ours_info = ours_k = nt_info = nt_k = None
        for _ in range(args.rounds):
            # Alternate the libraries so that a busy spell on the machine hits both alike.
            info, ours_k = run_worker(sys.executable, "ours", inputs_path, os.path.join(tmp, "ours"), args.repeats)
            ours_info = keep_best(ours_info, info)
            if have_oracle:
                info, nt_k = run_worker(str(oracle_python), "nt", inputs_path, os.path.join(tmp, "nt"), args.repeats)
                nt_info = keep_best(nt_info, info)

    report = {
        "commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": THREADS},
        "protocol": {
            "dtype": "float64",
            "x2": None,
            "get": ["nngp", "ntk"],
            "repeats": args.repeats,
            "rounds": args.rounds,
            "seed": SEED,
        },
        "ours": {"jax": ours_info["jax"], "jaxlib": ours_info["jaxlib"]},
        "neural_tangents": None,
        "cases": {},
    }
    if nt_info is not None:
        report["neural_tangents"] = {k: nt_info[k] for k in ("neural_tangents", "jax", "jaxlib")}

    print(f"smnngp on jax {ours_info['jax']}", end="")
    print(f"; neural-tangents {nt_info['neural_tangents']} on jax {nt_info['jax']}" if nt_info else "")
    for name in names:
        entry = {"label": CASES[name][0], "input_shape": list(CASES[name][1]), "ours": ours_info["timings"][name]}
        if nt_info is not None:
            nt_t = nt_info["timings"][name]
            errors = {f: relative_error(ours_k[f"{name}.{f}"], nt_k[f"{name}.{f}"]) for f in ("nngp", "ntk")}
            entry.update(
                nt=nt_t,
                ratio_first=ours_info["timings"][name]["first"] / nt_t["first"],
                ratio_steady=ours_info["timings"][name]["steady"] / nt_t["steady"],
                max_abs_diff_over_max_abs=errors,
            )
            print(
                f"  {CASES[name][0]:14s} agreement (max |ours - NT| / max |NT|): "
                f"nngp {errors['nngp']:.1e}, ntk {errors['ntk']:.1e}"
            )
        report["cases"][name] = entry
    print()
    print_table(names, ours_info["timings"], nt_info["timings"] if nt_info else None)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
