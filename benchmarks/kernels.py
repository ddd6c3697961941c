"""Time NNGP + NTK kernel evaluation of `smnngp.stax` against neural-tangents 0.6.5.

Usage (from the project root)::

    .venv/bin/python benchmarks/kernels.py [--repeats 3] [--rounds 1] [--cases mlp4_relu,resnet]

Every (library, case) pair runs in a fresh Python process, so that no compile
cache or warm state leaks from one measurement into the next: ours in this
interpreter's environment, neural-tangents in the pinned oracle environment at
``SMNNGP_ORACLE_VENV`` (default ``.venv-oracle``, built by
``bash scripts/make_golden.sh``), both with the same thread settings and the
same inputs, drawn here with a fixed seed and handed over in a temporary .npz.

A worker jits ``kernel_fn`` with ``static_argnames='get'`` and times
the float64 train-train kernel (``x2=None``, ``get=('nngp', 'ntk')``): the first
call (trace + compile + run) and the best of ``--repeats`` steady-state calls
after it, each up to ``block_until_ready``. ``--rounds R`` repeats every
measurement in R fresh processes, alternating the libraries, and keeps the best
times (useful on a busy machine).

The cases: the four of the first release (MLP-4 ReLU, MLP-3 Erf, CNN-4 ReLU
with Flatten, a dense ResNet) and four that exercise the layers added for
issue 29: a Myrtle-5 CNN with GlobalAvgPool on 32 x 32 x 3 images (all pairs
of positions: ``diagonal_spatial=False``), a 2-layer attention network on
length-64 sequences, an MLP with LayerNorm and Dropout, and a graph network
with ``Aggregate`` (a random graph per input, passed as ``pattern``). Before
the timed call, each worker runs the same architecture on a tiny input, so
that backend start-up and the library's first trace of each layer are not
charged to the case.

Batched rows (issue 50): ``nt.batch(kernel_fn, batch_size=4)(x, None, get)`` of Myrtle-5 on 12 images of
32 x 32 x 3, with ``get='nngp'`` and ``get=('nngp', 'ntk')``, the kernel of a data set tile by tile as
neural-tangents' users compute it (its Myrtle notebook): ``smnngp.nt.batch`` against nt's own ``batch``, neither
wrapped in ``jit`` (nt's documentation says not to), the first call and the best steady call, after the same
warm-up on a tiny input. ``--cases myrtle5_batch24`` adds a larger row (24 images, tiles of 8; not in the default
list: nt takes minutes for it). Each batched row is checked before its ratio is printed (`_common.check`): ours
against our unbatched ``kernel_fn(x, None, get)`` (computed after the timing, so that it warms nothing) to 1e-12 of
the kernel's scale, and against nt's batched values where nt ran; a row past its tolerances prints ``WRONG``.

The parent checks that both libraries' kernels agree, prints a table of ratios
(ours / neural-tangents: below 1 means we are faster) with the memory XLA plans
for each compiled call, and writes ``benchmarks/results/kernels.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check, check_text, ratio_text, time_first_and_steady, worker_setup, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "kernels.json"
SEED = 0
THREADS = "2"

# name -> (label, input shape, warm-up input shape)
CASES = {
    "mlp4_relu": ("MLP-4 ReLU", (2000, 8), (2, 8)),
    "mlp3_erf": ("MLP-3 Erf", (1000, 13), (2, 13)),
    "cnn4_relu": ("CNN-4 ReLU", (200, 8, 8, 1), (2, 4, 4, 1)),
    "resnet": ("dense ResNet", (500, 6), (2, 6)),
    "myrtle5": ("Myrtle-5 GAP", (4, 32, 32, 3), (2, 8, 8, 3)),
    "attention2": ("attention-2", (24, 64, 8), (2, 4, 8)),
    "ln_dropout": ("LN+Dropout MLP", (1000, 12), (2, 12)),
    "graph": ("graph (Aggregate)", (40, 16, 6), (2, 3, 6)),
}
# Batched rows: name -> (label, architecture (a CASES name), input shape, warm-up input shape, batch_size, get).
BATCHED = {
    "myrtle5_batch_nngp": ("Myrtle-5 batch nngp", "myrtle5", (12, 32, 32, 3), (2, 8, 8, 3), 4, "nngp"),
    "myrtle5_batch_both": ("Myrtle-5 batch both", "myrtle5", (12, 32, 32, 3), (2, 8, 8, 3), 4, ("nngp", "ntk")),
    "myrtle5_batch24": ("Myrtle-5 b8 N=24 nngp", "myrtle5", (24, 32, 32, 3), (2, 8, 8, 3), 8, "nngp"),
}
DEFAULT_BATCHED = ("myrtle5_batch_nngp", "myrtle5_batch_both")
# batched against unbatched (the same library, float64 rounding), and against nt (all entries: the ReLU NTK's
# square-root singularity at coincident points, which nt's tiles meet as kernel_fn(tile, tile); off the diagonal)
BATCH_TOL = {"nngp": 1e-12, "ntk": 1e-12, "nngp_vs_nt": 1e-6, "ntk_vs_nt": 1e-6,
             "nngp_vs_nt_off_diagonal": 1e-10, "ntk_vs_nt_off_diagonal": 1e-10}


def label(name: str) -> str:
    return BATCHED[name][0] if name in BATCHED else CASES[name][0]


def input_shape(name: str) -> tuple:
    return BATCHED[name][2] if name in BATCHED else CASES[name][1]


# Cases whose kernel_fn takes a graph pattern: (N, nodes, nodes) adjacency, drawn with the inputs.
PATTERN_CASES = ("graph",)


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
    if name == "myrtle5":  # Shankar et al. (2020), 'Neural kernels without tangents': 4 conv layers + readout

        def conv_relu():
            return [stax.Conv(128, (3, 3), padding="SAME", W_std=2**0.5, b_std=0.0), stax.Relu()]

        pool = stax.AvgPool((2, 2), strides=(2, 2))
        return stax.serial(*conv_relu(), *conv_relu(), pool, *conv_relu(), pool, *conv_relu(), pool,
                           stax.GlobalAvgPool(), stax.Dense(10, W_std=1.0))
    if name == "attention2":

        def block():
            return [stax.GlobalSelfAttention(n_chan_out=64, n_chan_key=64, n_chan_val=64, n_heads=4,
                                             W_key_std=1.0, W_value_std=1.2, W_query_std=1.0, W_out_std=1.0),
                    stax.Relu(), stax.Dense(64, W_std=1.4, b_std=0.05)]

        return stax.serial(stax.Dense(64, W_std=1.2, b_std=0.1), *block(), *block(), stax.GlobalAvgPool(),
                           stax.Dense(1))
    if name == "ln_dropout":
        hidden = [layer for _ in range(3)
                  for layer in (stax.Dense(512, W_std=1.5, b_std=0.05), stax.LayerNorm(), stax.Relu(),
                                stax.Dropout(0.9, mode="train"))]
        return stax.serial(*hidden, stax.Dense(1))
    if name == "graph":

        def gcn():
            return [stax.Dense(64, W_std=1.3, b_std=0.05), stax.Aggregate(), stax.Relu()]

        return stax.serial(*gcn(), *gcn(), *gcn(), stax.GlobalAvgPool(), stax.Dense(1))
    raise ValueError(f"unknown case {name!r}; choose from {sorted(CASES)}")


# ---------------------------------------------------------------------------
# Worker: one library, one case, in a fresh process
# ---------------------------------------------------------------------------


def worker(library: str, case: str, inputs_path: str, out_path: str, repeats: int) -> None:
    """Time ``case`` with one library; save its kernels (.npz) and timings (.json) under ``out_path``."""
    import jax
    import jax.numpy as jnp

    stax, _ = worker_setup(library)

    import resource

    inputs = np.load(inputs_path)
    if case in BATCHED:
        batched_worker(library, case, stax, inputs, out_path, repeats)
        return

    def call_args(x, pattern):
        # x2 = None: the train-train kernel; a graph case passes its adjacency for both arguments.
        return {} if pattern is None else {"pattern": (pattern, pattern)}

    # Backend start-up and the library's first trace of each layer type are not the case's cost: the same
    # architecture runs once on a tiny input first (its own compilation, not reused by the timed call).
    tiny = jnp.ones(CASES[case][2], jnp.float64)
    tiny_pattern = jnp.ones((tiny.shape[0], tiny.shape[1], tiny.shape[1])) if case in PATTERN_CASES else None
    warm = jax.jit(lambda a, kw: build(stax, case)[2](a, None, ("nngp", "ntk"), **kw))
    jax.block_until_ready(warm(tiny, call_args(tiny, tiny_pattern)))

    x = jax.block_until_ready(jax.device_put(jnp.asarray(inputs[case], jnp.float64)))
    pattern = jnp.asarray(inputs[case + "__pattern"], jnp.float64) if case in PATTERN_CASES else None
    kw = call_args(x, pattern)
    kernel_fn = jax.jit(lambda a, kw: build(stax, case)[2](a, None, ("nngp", "ntk"), **kw))

    out, first, steady = time_first_and_steady(kernel_fn, x, kw, repeats=repeats)
    # Memory: what XLA plans for the compiled call (temporaries + outputs), and the process's peak resident set.
    planned = None
    try:
        stats = kernel_fn.lower(x, kw).compile().memory_analysis()
        planned = int(stats.temp_size_in_bytes + stats.output_size_in_bytes) or None  # 0: not reported
    except Exception:  # noqa: BLE001 - a backend without memory analysis: report the resident peak only
        pass
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    np.savez(out_path + ".npz", nngp=np.asarray(out.nngp), ntk=np.asarray(out.ntk))
    info = {"jax": jax.__version__, "jaxlib": jax.lib.__version__, "device": jax.devices()[0].device_kind,
            "first": first, "steady": steady,
            "planned_bytes": planned, "peak_rss_bytes": peak_rss}
    if library == "nt":
        import neural_tangents

        info["neural_tangents"] = neural_tangents.__version__
    Path(out_path + ".json").write_text(json.dumps(info))


def batched_worker(library: str, case: str, stax, inputs, out_path: str, repeats: int) -> None:
    """Time ``batch(kernel_fn, batch_size)(x, None, get)`` with one library (its own ``batch``); ours also saves
    the unbatched ``kernel_fn(x, None, get)`` (as ``ref_<field>``), computed after the timed calls."""
    import resource

    import jax
    import jax.numpy as jnp

    if library == "ours":
        from smnngp import nt as library_nt
    else:
        import neural_tangents as library_nt

    _, arch, _, tiny_shape, batch_size, get = BATCHED[case]
    kernel_fn = build(stax, arch)[2]
    # As for the unbatched rows: backend start-up and the first trace of each layer type are not the row's cost.
    tiny = jnp.ones(tiny_shape, jnp.float64)
    jax.block_until_ready(jax.jit(lambda a: build(stax, arch)[2](a, None, get))(tiny))

    x = jax.block_until_ready(jax.device_put(jnp.asarray(inputs[case], jnp.float64)))
    batched = library_nt.batch(kernel_fn, batch_size=batch_size)
    out, first, steady = time_first_and_steady(lambda a: batched(a, None, get), x, repeats=repeats)
    names = (get,) if isinstance(get, str) else tuple(get)
    fields = {n: np.asarray(out if isinstance(get, str) else getattr(out, n)) for n in names}
    if library == "ours":
        ref = jax.jit(lambda a: kernel_fn(a, None, get))(x)
        fields.update({"ref_" + n: np.asarray(ref if isinstance(get, str) else getattr(ref, n)) for n in names})
    np.savez(out_path + ".npz", **fields)
    info = {"jax": jax.__version__, "jaxlib": jax.lib.__version__, "device": jax.devices()[0].device_kind,
            "first": first, "steady": steady, "planned_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if library == "nt":
        info["neural_tangents"] = library_nt.__version__
    Path(out_path + ".json").write_text(json.dumps(info))


def batch_check(ours: dict, nt: dict | None) -> dict:
    """`_common.check` of a batched row: ours against our unbatched kernel, and against nt's batch where it ran."""
    errors = {}
    for f in (k for k in ours if not k.startswith("ref_")):
        errors[f] = kernel_error(ours[f], ours["ref_" + f])["all"]
        if nt is not None:
            e = kernel_error(ours[f], nt[f])
            errors[f + "_vs_nt"], errors[f + "_vs_nt_off_diagonal"] = e["all"], e["off_diagonal"]
    reference = "our unbatched kernel_fn(x, None, get)" + ("; nt 0.6.5's batch, same inputs" if nt else "")
    return check(errors, BATCH_TOL, reference)


def kernel_error(a, b) -> dict[str, float]:
    """`relative_error`, or inf where the shapes differ or ``a`` is not finite."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return {"all": float("inf"), "off_diagonal": float("inf")}
    return relative_error(a, b)


# ---------------------------------------------------------------------------
# Parent: inputs, workers, comparison, report
# ---------------------------------------------------------------------------


def make_inputs(names) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    out = {}
    for name in names:
        out[name] = rng.standard_normal(input_shape(name))
        if name in PATTERN_CASES:  # a random undirected graph per input, with self-loops
            n, nodes = CASES[name][1][:2]
            edges = rng.random((n, nodes, nodes)) < 0.25
            out[name + "__pattern"] = ((edges | edges.transpose(0, 2, 1)) | np.eye(nodes, dtype=bool)).astype(float)
    return out


PLATFORM = "cpu"  # set by --platform: the backend every worker uses


def worker_env() -> dict[str, str]:
    """The same environment for both libraries: fixed thread counts, one backend (CPU unless --platform), quiet logs."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = THREADS
    env["JAX_PLATFORMS"] = PLATFORM
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    for var in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "PYTHONPATH"):
        env.pop(var, None)
    return env


def run_worker(python: str, library: str, case: str, inputs_path: str, out_path: str, repeats: int):
    cmd = [python, str(Path(__file__).resolve()), "--worker", library, "--cases", case]
    cmd += ["--inputs", inputs_path, "--out", out_path, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"{library} worker for {case} failed with exit code {proc.returncode}")
    info = json.loads(Path(out_path + ".json").read_text())
    with np.load(out_path + ".npz") as kernels:
        return info, {f: kernels[f] for f in kernels.files}


def summarise(runs: list[dict]) -> dict:
    """Best first call and best steady call over the rounds, with every measurement kept."""
    firsts = [r["first"] for r in runs]
    steadies = [t for r in runs for t in r["steady"]]
    planned = [r["planned_bytes"] for r in runs if r.get("planned_bytes") is not None]
    return {"first": min(firsts), "steady": min(steadies), "first_all": firsts, "steady_all": steadies,
            "planned_bytes": max(planned) if planned else None,
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs)}


def relative_error(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """max |a - b| / max |b|, over all entries and off the diagonal k(x_i, x_i).

    The diagonal is reported apart because at coincident points the arc-cosine
    (ReLU) kernel has a square-root singularity that turns last-bit differences
    between a point's variance and its self-covariance into ~1e-8 in the NTK.
    """
    diff = np.abs(a - b)
    scale = np.max(np.abs(b))
    off = diff.copy()
    np.fill_diagonal(off, 0.0)
    return {"all": float(np.max(diff) / scale), "off_diagonal": float(np.max(off) / scale)}


def git_commit() -> str:
    try:
        from experiments.report import git_commit as commit  # the project's one implementation
    except ImportError:  # a bare machine (a lent GPU) without the experiments' dependencies
        return "unknown"
    return commit(str(ROOT))


def _mb(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def print_table(names, ours: dict, nt: dict | None) -> None:
    head = (f"{'case':18s} {'ours 1st':>9s} {'NT 1st':>9s} {'ratio':>6s}   {'ours run':>9s} {'NT run':>9s} "
            f"{'ratio':>6s}   {'ours MB':>8s} {'NT MB':>8s}")
    print(head)
    print("-" * len(head))
    for name in names:
        o = ours[name]
        if nt is None:
            cells = f"{o['first']:9.3f} {'-':>9s} {'-':>6s}   {o['steady']:9.4f} {'-':>9s} {'-':>6s}"
            mem = f"{_mb(o['peak_rss_bytes']):>8s} {'-':>8s}"
        else:
            n = nt[name]
            cells = (
                f"{o['first']:9.3f} {n['first']:9.3f} {o['first'] / n['first']:6.2f}   "
                f"{o['steady']:9.4f} {n['steady']:9.4f} {o['steady'] / n['steady']:6.2f}"
            )
            mem = f"{_mb(o['peak_rss_bytes']):>8s} {_mb(n['peak_rss_bytes']):>8s}"
        print(f"{label(name):18s} {cells}   {mem}")
    print("seconds; 1st = first call (trace + compile + run), run = best steady-state call;")
    print("ratio = ours / neural-tangents (below 1: we are faster); MB = the worker process's peak resident memory")
    print("(the JSON also records what XLA plans for the compiled call, where the backend reports it)")


def print_batched(names, timings: dict, kernels: dict, have_oracle: bool, report: dict) -> None:
    """The batched rows: checks first, then the timings with ratios (``WRONG`` in place of a ratio past a
    check); each row also goes into ``report['cases']``."""
    print("batched rows: batch(kernel_fn, batch_size)(x, None, get), no jit around it; checks (max |err| / max |ref|):")
    checks = {}
    for name in names:
        checks[name] = batch_check(kernels["ours"][name], kernels["nt"][name] if have_oracle else None)
        print(f"  {label(name):22s} {check_text(checks[name])}")
    head = (f"{'case':22s} {'N':>3s} {'tile':>4s} {'ours 1st':>9s} {'NT 1st':>9s} {'ratio':>6s}   {'ours run':>9s} "
            f"{'NT run':>9s} {'ratio':>6s}")
    print()
    print(head)
    print("-" * len(head))
    for name in names:
        _, arch, shape, _, batch_size, get = BATCHED[name]
        o = timings["ours"][name]
        entry = {"label": label(name), "architecture": arch, "input_shape": list(shape), "batch_size": batch_size,
                 "get": get, "ours": o, "check": checks[name]}
        if have_oracle:
            n = timings["nt"][name]
            entry.update(nt=n, ratio_first=o["first"] / n["first"], ratio_steady=o["steady"] / n["steady"])
            cells = (f"{o['first']:9.2f} {n['first']:9.2f} {ratio_text(entry['ratio_first'], checks[name]):>6s}   "
                     f"{o['steady']:9.2f} {n['steady']:9.2f} {ratio_text(entry['ratio_steady'], checks[name]):>6s}")
        else:
            cells = f"{o['first']:9.2f} {'-':>9s} {'-':>6s}   {o['steady']:9.2f} {'-':>9s} {'-':>6s}"
        print(f"{label(name):22s} {shape[0]:3d} {batch_size:4d} {cells}")
        report["cases"][name] = entry
    print("seconds; 1st = first call (trace + compile + run), run = best steady-state call; "
          "ratio = ours / neural-tangents")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="steady-state calls after the first (best is kept)")
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes per measurement (best is kept)")
    parser.add_argument("--cases", default=",".join(list(CASES) + list(DEFAULT_BATCHED)),
                        help=f"comma-separated subset of {','.join(list(CASES) + list(BATCHED))} (default: all but "
                             f"{','.join(sorted(set(BATCHED) - set(DEFAULT_BATCHED)))})")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "cuda"),
                        help="JAX backend of every worker (default cpu; the oracle environment is CPU-only, so with "
                             "cuda only smnngp is timed unless SMNNGP_ORACLE_VENV has a CUDA build)")
    parser.add_argument("--results", default=str(RESULTS), help="where to write the JSON report")
    parser.add_argument("--worker", choices=("ours", "nt"), help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES and c not in BATCHED]
    if unknown or not names:
        parser.error(f"--cases: unknown {unknown}; choose from {','.join(list(CASES) + list(BATCHED))}")
    if args.worker:
        worker(args.worker, names[0], args.inputs, args.out, args.repeats)
        return
    global PLATFORM
    PLATFORM = args.platform

    oracle = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle"))
    oracle_python = oracle / "bin" / "python"
    have_oracle = oracle_python.exists()
    if not have_oracle:
        print(f"neural-tangents oracle not found at {oracle}: build it with `bash scripts/make_golden.sh`")
        print("(or point SMNNGP_ORACLE_VENV at one). Timing smnngp only.\n")
    libraries = {"ours": sys.executable, **({"nt": str(oracle_python)} if have_oracle else {})}

    runs = {lib: {name: [] for name in names} for lib in libraries}
    kernels, versions = {lib: {} for lib in libraries}, {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = os.path.join(tmp, "inputs.npz")
        np.savez(inputs_path, **make_inputs(names))
        for _ in range(args.rounds):
            for name in names:
                # Alternate the libraries so that a busy spell on the machine hits both alike.
                for lib, python in libraries.items():
                    out_path = os.path.join(tmp, f"{lib}_{name}")
                    info, kernels[lib][name] = run_worker(python, lib, name, inputs_path, out_path, args.repeats)
                    runs[lib][name].append(info)
                    versions[lib] = {k: info[k] for k in ("neural_tangents", "jax", "jaxlib") if k in info}

    timings = {lib: {name: summarise(runs[lib][name]) for name in names} for lib in libraries}
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
            "gc": "one full collection before the first call, then off while the calls are timed, as timeit",
        },
        "ours": versions["ours"],
        "neural_tangents": versions.get("nt"),
        "cases": {},
    }
    line = f"smnngp on jax {versions['ours']['jax']}"
    if have_oracle:
        line += f"; neural-tangents {versions['nt']['neural_tangents']} on jax {versions['nt']['jax']}"
    print(line)
    plain = [n for n in names if n not in BATCHED]
    batched = [n for n in names if n in BATCHED]
    if have_oracle and plain:
        print("agreement, max |ours - NT| / max |NT| (in brackets: off the diagonal k(x_i, x_i)):")
    for name in plain:
        entry = {"label": label(name), "input_shape": list(input_shape(name)), "ours": timings["ours"][name]}
        if have_oracle:
            ours, nt = timings["ours"][name], timings["nt"][name]
            errors = {f: relative_error(kernels["ours"][name][f], kernels["nt"][name][f]) for f in ("nngp", "ntk")}
            entry.update(
                nt=nt,
                ratio_first=ours["first"] / nt["first"],
                ratio_steady=ours["steady"] / nt["steady"],
                max_abs_diff_over_max_abs=errors,
            )
            cells = ", ".join(f"{f} {e['all']:.1e} ({e['off_diagonal']:.1e})" for f, e in errors.items())
            print(f"  {label(name):14s} {cells}")
        report["cases"][name] = entry
    if plain:
        print()
        print_table(plain, timings["ours"], timings.get("nt"))
    if batched:
        if plain:
            print()
        print_batched(batched, timings, kernels, have_oracle, report)

    report["machine"]["platform_backend"] = PLATFORM
    write_results(Path(args.results), report)


if __name__ == "__main__":
    main()
