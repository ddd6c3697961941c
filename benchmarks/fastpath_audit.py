"""Every fast path against the exact one, at the sizes users run (issue 49).

Usage (from the project root)::

    python benchmarks/fastpath_audit.py [--sizes 500 1000 2000 4000] [--max-n 4000] [--n-test 200] [--out PATH]

Problem: that of ``benchmarks/scale.py`` (``d = 8`` standard-normal inputs, ``y = sin(x w) + 0.1 e``, an RBF kernel
of lengthscale 2 and variance 1, noise 0.01, Student-t process with an ``InverseGamma(2, 2)`` scale prior). At each
N the exact reference is the dense float64 path of the same run, and each fast path's outputs are compared with it:

* ``cg-solve``: ``method='cg'``, variances by CG solves (``CG(variance='solve')``): mean, variance, log ML;
* ``cg-love``: ``method='cg'`` with ``CG(variance='love')``: the variance (certified to ``love_tol`` or solved);
  the row records how many test points LOVE solved;
* ``cg-grad``: the Gaussian log ML's gradient in the kernel's hyperparameters from ``matfree.marginal_terms`` and
  ``marginal_terms_grad`` (stochastic trace estimates) against ``jax.grad`` of the dense log ML;
* ``mixed``: ``method='mixed'`` (float32 factor, float64 CG): mean, variance, log ML;
* ``importance``: a ``BurrXII(2, 3)`` scale prior (importance sampling over sigma^2), ``method='cg'`` against
  ``method='dense'`` with the same draws: mean, variance, log ML;
* ``cg-samples``: joint posterior draws (``sample_f``) of the matrix-free posterior against the dense one's with
  the same key (the same sigma^2 and normal draws, so they differ only by the solver);
* ``svgp-Z=X``: the SVGP with inducing inputs at the training inputs and q(v) at the ELBO's maximiser
  (`smnngp.variational.optimal_gaussian_q`) against the exact GP (noise 0.01): mean, variance, and the ELBO against
  the exact log ML (equal up to the jitter on K_ZZ).

Variances are positive, and their error is the largest relative error over the test points
(``|fast - exact| / exact``). Means and draws cross zero, where a pointwise relative error measures nothing; their
error is relative to their scale, ``max |fast - exact| / max |exact|`` (also stated in posterior standard
deviations for the mean). A log ML's error is taken relative to its magnitude and also stated in reported standard
errors of the stochastic log-determinant (half the log-determinant's: ``log ML = ... - log|C| / 2``). Each row has a
stated tolerance (``TOL``) and is marked ``ok`` or ``WRONG``. Sizes above ``--max-n`` are skipped (the dense
reference must fit). The SVTP is not audited at Z = X: with its unscaled noise the exact Student-t posterior is
outside its variational family, so no setting of it equals the exact one.

Writes ``records/benchmarks/fastpath_audit_<device>.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_results  # noqa: E402
from _common import pointwise_relative_error as _max_rel  # noqa: E402
from _common import scale_relative_error as _scale_rel  # noqa: E402

NOISE = 0.01
# stated tolerances: relative error per output (log ML: relative, or within 4 reported standard errors)
TOL = {"mean": 1e-4, "variance": 1e-3, "variance-mixed": 1e-6, "mean-mixed": 1e-6,
       "log_ml-mixed": 1e-8, "gradient": 0.1, "samples": 1e-3, "svgp": 1e-5}


def _in_stds(fast, exact, variance):
    import numpy as np

    return float(np.max(np.abs(np.asarray(fast, float) - np.asarray(exact, float)) / np.sqrt(np.asarray(variance))))


def audit(n: int, n_test: int = 200, *, precond_rank: int = 200, love_rank: int = 100, seed: int = 0,
          log=print) -> list[dict]:
    """The audit's rows at one N: ``{"path", "output", "error", "tol", "ok", ...}`` per fast path and output."""
    import jax
    import jax.flatten_util
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from scale import _data

    from smnngp import kernels, matfree, posterior, priors, variational

    x, y, xt = (jnp.asarray(a) for a in _data(n, n_test, seed))
    kernel = kernels.rbf(2.0, 1.0)
    prior = priors.InverseGamma(2.0, 2.0)
    rows = []

    def row(path, output, error, tol, **extra):
        ok = bool(error <= tol)
        rows.append({"n": n, "path": path, "output": output, "error": error, "tol": tol, "ok": ok, **extra})
        log(f"  N = {n:>6,}  {path:<11} {output:<9} error {error:9.2e}  tol {tol:8.1e}  {'ok' if ok else 'WRONG'}"
            + "".join(f"  {k} {v}" for k, v in extra.items()))

    t0 = time.perf_counter()
    dense = posterior.fit(kernel, x, y, prior, noise=NOISE, method="dense")
    pd = dense.predict(xt)
    ref = {"mean": np.asarray(pd.mean), "variance": np.asarray(pd.variance),
           "log_ml": float(dense.log_marginal_likelihood)}
    log(f"  N = {n:>6,}  dense reference {time.perf_counter() - t0:.1f} s")
    rank = min(precond_rank, n)
    for variance in ("solve", "love"):
        opts = matfree.CG(precond_rank=rank, variance=variance, love_rank=love_rank)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", matfree.ConvergenceWarning)
            post = posterior.fit(kernel, x, y, prior, noise=NOISE, method="cg", cg=opts)
            p = post.predict(xt)
        solved = sum("LOVE" in str(w.message) for w in caught)
        path = f"cg-{variance}"
        if variance == "solve":
            row(path, "mean", _scale_rel(p.mean, ref["mean"]), TOL["mean"],
                stds=f"{_in_stds(p.mean, ref['mean'], ref['variance']):.1e}")
            se = post.diagnostics["logdet_stderr"] / 2
            err = abs(float(post.log_marginal_likelihood) - ref["log_ml"])
            row(path, "log_ml", err / abs(ref["log_ml"]), 4 * se / abs(ref["log_ml"]) + 1e-8,
                stderrs=round(err / se, 2) if se > 0 else None)
            row(path, "variance", _max_rel(p.variance, ref["variance"]), TOL["variance"])
            key = jax.random.PRNGKey(seed + 1)
            few = xt[:50]
            row("cg-samples", "draws", _scale_rel(post.sample_f(key, few, 5), dense.sample_f(key, few, 5)),
                TOL["samples"])
        else:
            row(path, "variance", _max_rel(p.variance, ref["variance"]), opts.love_tol,
                love_fell_back_to_solves=bool(solved))
    # the Gaussian log ML's gradient in (lengthscale, variance), BBMM against autodiff of the dense value
    op = matfree.KernelOperator(kernel, x, NOISE)
    terms = matfree.marginal_terms(op, y[:, None], matfree.CG(precond_rank=rank, num_probes=32))
    g_theta, _ = matfree.marginal_terms_grad(op, terms, -0.5, -0.5)

    def dense_log_ml(theta):
        c = kernel.apply(theta, x, x) + NOISE * jnp.eye(n, dtype=x.dtype)
        chol = jnp.linalg.cholesky(c)
        a = jax.scipy.linalg.cho_solve((chol, True), y)
        return -0.5 * y @ a - jnp.sum(jnp.log(jnp.diagonal(chol)))

    g_ref = jax.grad(dense_log_ml)(kernel.theta)
    flat = jax.flatten_util.ravel_pytree
    row("cg-grad", "gradient", float(jnp.linalg.norm(flat(g_theta)[0] - flat(g_ref)[0])
                                     / jnp.linalg.norm(flat(g_ref)[0])), TOL["gradient"])
    mixed = posterior.fit(kernel, x, y, prior, noise=NOISE, method="mixed")
    pm = mixed.predict(xt)
    row("mixed", "mean", _scale_rel(pm.mean, ref["mean"]), TOL["mean-mixed"])
    row("mixed", "variance", _max_rel(pm.variance, ref["variance"]), TOL["variance-mixed"])
    se = mixed.diagnostics.get("logdet_stderr", 0.0) / 2
    row("mixed", "log_ml", abs(float(mixed.log_marginal_likelihood) - ref["log_ml"]) / abs(ref["log_ml"]),
        TOL["log_ml-mixed"] + 4 * se / abs(ref["log_ml"]))
    burr = priors.BurrXII(2.0, 3.0)
    key = jax.random.PRNGKey(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", posterior.SmallESSWarning)
        d_is = posterior.fit(kernel, x, y, burr, noise=NOISE, method="dense", key=key, num_samples=2000)
        c_is = posterior.fit(kernel, x, y, burr, noise=NOISE, method="cg", key=key, num_samples=2000,
                             cg=matfree.CG(precond_rank=rank))
    pdi, pci = d_is.predict(xt), c_is.predict(xt)
    row("importance", "mean", _scale_rel(pci.mean, pdi.mean), TOL["mean"])
    row("importance", "variance", _max_rel(pci.variance, pdi.variance), TOL["variance"])
    se = c_is.diagnostics["logdet_stderr"] / 2
    row("importance", "log_ml", abs(float(c_is.log_marginal_likelihood) - float(d_is.log_marginal_likelihood))
        / abs(float(d_is.log_marginal_likelihood)), 4 * se / abs(float(d_is.log_marginal_likelihood)) + 1e-8)
    # SVGP at Z = X, q(v) at its optimum, against the exact GP
    gp = posterior.fit(kernel, x, y, priors.Delta(1.0), noise=NOISE, method="dense")
    pg = gp.predict(xt)
    model = variational.svgp(kernel, variational.Gaussian(NOISE, trainable=False), x, train_inducing=False,
                             train_kernel=False)
    params = variational.optimal_gaussian_q(model, variational.init(model), x, y)
    pf = variational.predict_f(model, params, xt)
    row("svgp-Z=X", "mean", _scale_rel(pf.mean[:, 0], pg.mean), TOL["svgp"])
    row("svgp-Z=X", "variance", _max_rel(pf.variance[:, 0], pg.variance - NOISE), TOL["svgp"])
    lml = float(gp.log_marginal_likelihood)
    row("svgp-Z=X", "elbo", abs(float(variational.elbo(model, params, (x, y))) - lml) / abs(lml), TOL["svgp"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    parser.add_argument("--max-n", type=int, default=4000, help="largest N audited (the dense reference must fit)")
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--precond-rank", type=int, default=200)
    parser.add_argument("--love-rank", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)
    rows = []
    for n in sorted(s for s in args.sizes if s <= args.max_n):
        print(f"N = {n:,}", flush=True)
        rows += audit(n, args.n_test, precond_rank=args.precond_rank, love_rank=args.love_rank,
                      log=lambda s: print(s, flush=True))
    sizes = sorted({r["n"] for r in rows})
    keys = list(dict.fromkeys((r["path"], r["output"]) for r in rows))
    print("\nlargest relative error per output (WRONG: above its stated tolerance)")
    print(f"{'path':<11} {'output':<9}" + "".join(f"{n:>12,}" for n in sizes))
    for path, output in keys:
        cells = []
        for n in sizes:
            r = next((r for r in rows if (r["n"], r["path"], r["output"]) == (n, path, output)), None)
            cells.append("" if r is None else f"{r['error']:.1e}{'' if r['ok'] else '!'}")
        print(f"{path:<11} {output:<9}" + "".join(f"{c:>12}" for c in cells))
    wrong = [r for r in rows if not r["ok"]]
    print(f"\n{len(wrong)} of {len(rows)} outputs WRONG" + "".join(
        f"\n  N = {r['n']:,} {r['path']} {r['output']}: {r['error']:.3g} > {r['tol']:.3g}" for r in wrong))
    device = jax.local_devices()[0]
    name = "cpu" if device.platform == "cpu" else device.device_kind.replace(" ", "-")
    write_results(args.out or ROOT / "records" / "benchmarks" / f"fastpath_audit_{name}.json",
                  {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                   "tolerances": TOL, "rows": rows, "num_wrong": len(wrong)})


if __name__ == "__main__":
    main()
