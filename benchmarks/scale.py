"""Exact GP / Student-t process fit + predict at large N: our dense and matrix-free paths against GPyTorch.

Usage (from the project root; GPyTorch comes with ``pip install -e ".[bench]"`` after a CPU build of torch)::

    python benchmarks/scale.py [--sizes 2000 5000 10000] [--n-test 1000] [--dtype float64] [--kernel rbf]
                               [--repeats 1]
                               [--cases ours-dense ours-mixed ours-cg gpytorch-chol gpytorch-cg] [--timeout 1800]
                               [--quick]

Problem: ``d = 8`` standard-normal inputs, ``y = sin(x w) + 0.1 e`` (one output), an RBF kernel
(lengthscale 2, variance 1; ``--kernel mlp``: the NNGP of a 3-layer ReLU MLP, our cases only), noise 0.01, 1,000
test points. Each case at each N runs in a fresh process (so that
its peak memory is its own): one first call, then ``--repeats`` timed calls of the whole fit + predict (mean and
variance at every test point); the best of those is the steady time.

* ``ours-dense``: ``posterior.fit(rbf, x, y, InverseGamma(2, 2), noise=0.01, method='dense')`` + ``predict``;
* ``ours-mixed``: the same with ``method='mixed'`` (float64 inputs): the float32 factor in one float32 buffer,
  refined by CG with float64 kernel tiles to relative residual ``--mixed-tol`` (1e-10: float64 accuracy), the
  log-determinant's float32 part exact and its correction by ``--probes`` SLQ probes, variances by CG solves;
* ``ours-cg``: the same with ``method='cg'``: CG to relative residual ``--tol`` with a pivoted-Cholesky
  preconditioner of rank ``--rank``, ``--probes`` SLQ probes, LOVE variances of ``--love-rank`` steps;
* ``gpytorch-chol``: GPyTorch's exact GP (fixed hyperparameters), Cholesky forced
  (``max_cholesky_size`` above N): the marginal log likelihood, then the predictive mean and variance;
* ``gpytorch-cg``: the same through GPyTorch's default large-N path (``max_cholesky_size(0)``), at the same
  tolerance, preconditioner rank, probes and LOVE size (``fast_pred_var``, ``max_root_decomposition_size``);
* ``gpytorch-cg-exact``: GPyTorch's CG path with exact predictive variances (no ``fast_pred_var``: one CG solve
  with every test point's covariance column, as ours does where LOVE cannot certify a variance). GPyTorch's LOVE
  variances were 9-19 times the exact ones on this problem (issue 49), so this is the anchor whose answer matches
  ours.

The Student-t process costs what the Gaussian process costs (the same solve and log-determinant), which is why its
anchor is GPyTorch's Gaussian exact GP. Ratios ours / GPyTorch are taken at the same N between the matching paths
(dense and mixed against Cholesky, matrix-free against both CG cases); the mixed path's log ML is also compared with the
dense one of the same run. Peak memory is the device's peak in use on a GPU, the process's
peak resident set on the CPU (which includes the runtime's own ~0.3-0.5 GB). Each case may use 95 % of the device
(``XLA_PYTHON_CLIENT_MEM_FRACTION=.95`` unless set: JAX's default allocator cap is 75 %). A case that fails (out of
memory, ``--timeout``) is recorded as such and larger N is not tried for it.

Benchmarks check before they time (issue 49): at each N a first worker computes the exact reference, the dense
float64 fit (Student-t for our cases, the Gaussian GP for GPyTorch's), and every row records the error of its
predictive mean (relative to the mean's scale, max |a - b| / max |b|: means cross zero), its largest relative error
of the variance, and the log ML's relative error against it (``check``; tolerances
``CHECK_TOL``, the log ML's widened by 4 reported standard errors where the log-determinant is stochastic; a
matrix-free row's mean is held to ``max(CHECK_TOL, 10 tol)``: CG bounds the relative residual by ``--tol``, not the
error, and both libraries' means sit at 0.8-1.6 times ``tol`` from the exact one at the same iteration count). A row
whose answer is wrong is printed ``WRONG`` and gets no ratio (``WRONG (err ...)`` in its place). Where the reference
does not fit, the rows are unchecked.

Writes ``benchmarks/results/scale-<device>.json`` (``--quick``: ``scale-quick.json``, a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, pointwise_relative_error, scale_relative_error, write_results  # noqa: E402

CASES = ("ours-dense", "ours-mixed", "ours-cg", "gpytorch-chol", "gpytorch-cg", "gpytorch-cg-exact")
MATRIX_FREE = ("ours-cg", "gpytorch-cg", "gpytorch-cg-exact")
D, NOISE, LENGTHSCALE = 8, 0.01, 2.0


def _data(n, n_test, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.normal(size=D) / np.sqrt(D)
    x, xt = rng.normal(size=(n, D)), rng.normal(size=(n_test, D))
    return x, np.sin(x @ w) + 0.1 * rng.normal(size=n), xt


KERNELS = ("rbf", "mlp")


def _kernel(name):
    """The benchmark's kernel: an RBF ``ParametricKernel`` (lengthscale 2, variance 1), or the NNGP of a 3-layer
    ReLU MLP (``stax``, widths 512, W_std 1.5, b_std 0.05), issue 30's second kernel at N = 10^6."""
    from smnngp import kernels, posterior, stax

    if name == "rbf":
        return kernels.rbf(LENGTHSCALE, 1.0)
    layers = [layer for _ in range(3) for layer in (stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu())]
    return posterior.as_kernel_callable(stax.serial(*layers, stax.Dense(1, W_std=1.0))[2])


def _ours(args, x, y, xt):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", args.dtype == "float64")
    sys.path.insert(0, str(ROOT))
    from smnngp import matfree, posterior, priors

    dt = jnp.float64 if args.dtype == "float64" else jnp.float32
    x, y, xt = (jnp.asarray(a, dt) for a in (x, y, xt))
    kernel = _kernel(args.kernel)
    method = args.case.split("-")[1]
    if method == "mixed":
        opts = matfree.CG(tol=args.mixed_tol, num_probes=args.probes, max_iter=args.max_iter)
    else:
        opts = matfree.CG(tol=args.tol, precond_rank=args.rank, num_probes=args.probes, variance="love",
                          love_rank=args.love_rank, max_iter=args.max_iter)

    def run():
        post = posterior.fit(kernel, x, y, priors.InverseGamma(2.0, 2.0), noise=NOISE, method=method, cg=opts)
        p = post.predict(xt)
        mean, var = jax.block_until_ready((p.mean, p.variance))
        extra = post.diagnostics
        return float(post.log_marginal_likelihood), mean, var, extra

    def peak():
        stats = jax.local_devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")

    return run, peak


def _gpytorch(args, x, y, xt):
    import gpytorch
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.float64 if args.dtype == "float64" else torch.float32
    X, Y, XT = (torch.as_tensor(a, dtype=dt, device=dev) for a in (x, y, xt))

    class GP(gpytorch.models.ExactGP):
        def __init__(self, lik):
            super().__init__(X, Y, lik)
            self.mean = gpytorch.means.ZeroMean()
            self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, a):
            return gpytorch.distributions.MultivariateNormal(self.mean(a), self.cov(a))

    chol = args.case == "gpytorch-chol"

    def run():
        lik = gpytorch.likelihoods.GaussianLikelihood().to(dev, dt)
        model = GP(lik).to(dev, dt)
        model.cov.base_kernel.lengthscale = LENGTHSCALE
        model.cov.outputscale = 1.0
        lik.noise = NOISE
        settings = [gpytorch.settings.max_cholesky_size(10**9 if chol else 0),
                    gpytorch.settings.cg_tolerance(args.tol), gpytorch.settings.eval_cg_tolerance(args.tol),
                    gpytorch.settings.max_cg_iterations(args.max_iter),
                    gpytorch.settings.max_preconditioner_size(args.rank),
                    gpytorch.settings.num_trace_samples(args.probes),
                    gpytorch.settings.fast_pred_var(args.case == "gpytorch-cg"),
                    gpytorch.settings.max_root_decomposition_size(args.love_rank)]
        with torch.no_grad():
            for s in settings:
                s.__enter__()
            try:
                mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
                model.train()
                lml = float(mll(model(X), Y)) * X.shape[0]
                model.eval()
                pred = lik(model(XT))
                mean, var = pred.mean, pred.variance
                if dev.type == "cuda":
                    torch.cuda.synchronize()
            finally:
                for s in reversed(settings):
                    s.__exit__(None, None, None)
        return lml, mean.cpu().numpy(), var.cpu().numpy(), {}

    def peak():
        return torch.cuda.max_memory_allocated() if dev.type == "cuda" else None

    return run, peak


def _reference(args, x, y, xt):
    """The exact answers the rows are checked against: the dense float64 Student-t fit (ours) and the dense
    float64 Gaussian one (GPyTorch's model), each's log ML, predictive mean and variance."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(ROOT))
    from smnngp import posterior, priors

    x, y, xt = (jnp.asarray(a, jnp.float64) for a in (x, y, xt))
    out = {}
    for name, prior in (("student_t", priors.InverseGamma(2.0, 2.0)), ("gaussian", None)):
        post = posterior.fit(_kernel(args.kernel), x, y, prior, noise=NOISE, method="dense")
        p = post.predict(xt)
        out[name] = (float(post.log_marginal_likelihood), np.asarray(p.mean, float), np.asarray(p.variance, float))
    return out


# a row's answer is checked against the dense float64 reference of the same run before it is timed against
# anything: the largest relative error of the predictive mean and variance over the test points, and the log ML's
# relative error, which for the stochastic log-determinants (mixed, cg) may also be 4 reported standard errors
CHECK_TOL = {"float64": {"mean": 1e-4, "variance": 1e-2, "log_ml": 1e-6},
             "float32": {"mean": 1e-2, "variance": 5e-2, "log_ml": 1e-3}}


def _check(rec, arrays, ref, case, dtype, cg_tol=None):
    """``{"errors", "tolerances", "ok"}`` of a row against the reference (GPyTorch's model is the Gaussian GP)."""
    import numpy as np

    kind = "gaussian" if case.startswith("gpytorch") else "student_t"
    lml, mean, var = float(ref[f"{kind}_0"]), ref[f"{kind}_1"], ref[f"{kind}_2"]

    def flat(a):
        return np.asarray(a, float).reshape(-1)

    # means cross zero: their error is relative to their scale; variances are positive: pointwise
    errors = {"mean": scale_relative_error(flat(arrays["mean"]), flat(mean)),
              "variance": pointwise_relative_error(flat(arrays["var"]), flat(var)),
              "log_ml": abs(rec["log_ml"] - lml) / abs(lml)}
    tols = dict(CHECK_TOL[dtype])
    if case in MATRIX_FREE and cg_tol is not None:  # CG stops at a relative residual, not a relative error
        tols["mean"] = max(tols["mean"], 10 * cg_tol)
    se = (rec.get("diagnostics") or {}).get("logdet_stderr")
    if se:
        tols["log_ml"] += 4 * (se / 2) / abs(lml)
    elif case in ("gpytorch-cg", "gpytorch-cg-exact"):  # stochastic, with no standard error reported
        tols["log_ml"] = max(tols["log_ml"], 1e-2)
    return {"errors": errors, "tolerances": tols, "ok": all(errors[k] <= tols[k] for k in errors)}


def worker(args):
    import resource

    import numpy as np

    x, y, xt = _data(args.n, args.n_test)
    if args.case == "reference":
        ref = _reference(args, x, y, xt)
        np.savez(args.arrays, **{f"{k}_{i}": np.asarray(v[i]) for k, v in ref.items() for i in range(3)})
        print("RESULT " + json.dumps({"log_ml": ref["student_t"][0]}))
        return
    run, peak = (_ours if args.case.startswith("ours") else _gpytorch)(args, x, y, xt)
    start = time.perf_counter()
    lml, mean, var, extra = run()
    first = time.perf_counter() - start
    steady = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        lml, mean, var, extra = run()
        steady.append(time.perf_counter() - start)
    if args.arrays:
        np.savez(args.arrays, mean=np.asarray(mean, float), var=np.asarray(var, float))
    device_peak = peak()
    out = {"first_s": first, "steady_s": min(steady) if steady else None, "log_ml": lml,
           "mean_head": np.asarray(mean, float)[:5].tolist(), "var_head": np.asarray(var, float)[:5].tolist(),
           "peak_bytes": device_peak if device_peak is not None else
           resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "peak_kind": "device" if device_peak is not None else "process RSS", "diagnostics": extra}
    print("RESULT " + json.dumps(out, default=float))


def _device_name():
    try:
        import jax

        d = jax.local_devices()[0]
        return d.device_kind.replace(" ", "-") if d.platform != "cpu" else "cpu"
    except Exception:  # noqa: BLE001 - the name is cosmetic
        return "unknown"


def main():
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000, 10000])
    parser.add_argument("--n-test", type=int, default=1000)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--kernel", choices=KERNELS, default="rbf",
                        help="rbf, or mlp: the NNGP of a 3-layer ReLU MLP (ours only: GPyTorch has no such kernel)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--mixed-tol", type=float, default=1e-10)
    parser.add_argument("--rank", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=16)
    parser.add_argument("--love-rank", type=int, default=100)
    parser.add_argument("--max-iter", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--quick", action="store_true", help="a smoke test at N = 300, 50 test points")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--arrays", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.sizes, args.n_test, args.repeats = [300], 50, 1
    if args.kernel != "rbf" and any(c.startswith("gpytorch") for c in args.cases):
        parser.error(f"--kernel {args.kernel}: GPyTorch has no such kernel; choose ours-* cases only")
    results, failed = [], set()
    passthrough = ["--n-test", str(args.n_test), "--dtype", args.dtype, "--kernel", args.kernel,
                   "--repeats", str(args.repeats),
                   "--tol", str(args.tol), "--mixed-tol", str(args.mixed_tol), "--rank", str(args.rank),
                   "--probes", str(args.probes),
                   "--love-rank", str(args.love_rank), "--max-iter", str(args.max_iter)]
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".95", **os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    def run_worker(n, case, arrays):
        cmd = [sys.executable, __file__, "--worker", "1", "--n", str(n), "--case", case, "--arrays", arrays,
               *passthrough]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            ok = proc.returncode == 0 and "RESULT " in proc.stdout
            return ok, json.loads(proc.stdout.split("RESULT ", 1)[1]) if ok else {
                "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]}
        except subprocess.TimeoutExpired:
            return False, {"error": [f"timeout after {args.timeout:.0f} s"]}

    tmp = tempfile.TemporaryDirectory()
    for n in args.sizes:
        # the exact reference of this N, computed in this run (dense, float64), before anything is timed
        ref_path = os.path.join(tmp.name, f"reference-{n}.npz")
        ref_ok, ref_rec = run_worker(n, "reference", ref_path)
        ref = dict(np.load(ref_path)) if ref_ok else None
        if not ref_ok:
            print(f"N = {n:>8,}  reference      failed ({ref_rec['error'][0][:80]}): rows unchecked", flush=True)
        for case in args.cases:
            if case in failed or case == "ours-mixed" and args.dtype != "float64":
                continue
            print(f"N = {n:>8,}  {case:<17}", end=" ", flush=True)
            arrays = os.path.join(tmp.name, f"{case}-{n}.npz")
            start = time.perf_counter()
            ok, rec = run_worker(n, case, arrays)
            rec.update(n=n, case=case, wall_s=time.perf_counter() - start)
            results.append(rec)
            if ok:
                steady = rec["steady_s"] if rec["steady_s"] is not None else rec["first_s"]
                rec["peak_over_n2"] = rec["peak_bytes"] / (n * n * (8 if args.dtype == "float64" else 4))
                check = ""
                if ref is not None:
                    rec["check"] = _check(rec, dict(np.load(arrays)), ref, case, args.dtype, args.tol)
                    errs = rec["check"]["errors"]
                    check = (f"  err mean {errs['mean']:.1e} var {errs['variance']:.1e} log ML {errs['log_ml']:.1e}"
                             + ("" if rec["check"]["ok"] else "  WRONG"))
                print(f"{steady:9.2f} s  (first {rec['first_s']:.1f} s)  peak {rec['peak_bytes'] / 2**30:7.2f} GiB "
                      f"= {rec['peak_over_n2']:.2f} N^2 ({rec['peak_kind']})  log ML {rec['log_ml']:.6g}{check}",
                      flush=True)
            else:
                failed.add(case)
                print(f"failed: {rec['error'][0][:100]}", flush=True)
    tmp.cleanup()
    print("\nratios (steady; first call where no repeat ran), ours / GPyTorch at the same N:")
    table, wrong = {}, {}
    for rec in results:
        if "error" not in rec:
            table[rec["n"], rec["case"]] = rec["steady_s"] if rec["steady_s"] is not None else rec["first_s"]
            if "check" in rec and not rec["check"]["ok"]:
                wrong[rec["n"], rec["case"]] = {k: v for k, v in rec["check"]["errors"].items()
                                                if v > rec["check"]["tolerances"][k]}
    ratios = []
    for n in args.sizes:
        for ours, theirs in (("ours-dense", "gpytorch-chol"), ("ours-mixed", "gpytorch-chol"),
                             ("ours-mixed", "ours-dense"), ("ours-cg", "gpytorch-cg"),
                             ("ours-cg", "gpytorch-cg-exact")):
            if (n, ours) in table and (n, theirs) in table:
                bad = [(c, wrong[n, c]) for c in (ours, theirs) if (n, c) in wrong]
                if bad:  # a timing of a wrong answer is no comparison
                    ratios.append({"n": n, "ours": ours, "anchor": theirs, "ratio": None, "wrong": dict(bad)})
                    print(f"  N = {n:>8,}  {ours:<11} / {theirs:<17} WRONG (err " + ", ".join(
                        f"{c}: " + ", ".join(f"{k} {v:.2g}" for k, v in e.items()) for c, e in bad) + ")")
                    continue
                r = table[n, ours] / table[n, theirs]
                ratios.append({"n": n, "ours": ours, "anchor": theirs, "ratio": r})
                print(f"  N = {n:>8,}  {ours:<11} / {theirs:<17} {r:6.2f}x")
        lml = {rec["case"]: rec for rec in results if rec["n"] == n and "error" not in rec}
        if "ours-mixed" in lml and "ours-dense" in lml:
            gap = abs(lml["ours-mixed"]["log_ml"] - lml["ours-dense"]["log_ml"])
            se = lml["ours-mixed"]["diagnostics"]["logdet_stderr"] / 2
            print(f"  N = {n:>8,}  mixed log ML - dense log ML: {gap:.3g} (reported standard error {se:.3g}, "
                  f"{gap / n:.2g} per point)")
    kernel = "" if args.kernel == "rbf" else f"-{args.kernel}"
    name = "scale-quick.json" if args.quick else f"scale-{_device_name()}-{args.dtype}{kernel}.json"
    write_results(args.out or ROOT / "benchmarks" / "results" / name,
                  {"quick": args.quick, "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "n",
                                                                                                        "case", "out",
                                                                                                        "arrays")},
                   "device": _device_name(), "results": results, "ratios": ratios})


if __name__ == "__main__":
    main()
