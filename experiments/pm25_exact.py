"""Exact NNGP and Student-t process posteriors on every PM2.5 training window, against SVGP / SVTP with M = 1,000
inducing inputs and the low-rank Bayesian LSTMs (issue 30, section 5).

Protocol:

* data: `experiments.data.timeseries.pm25_city_forecasting`: next-hour PM2.5 from the previous 24 hours' 15
  features (the windows, chronological 70/15/15 split and train-only scalers of ``lowrank-pm25``), inputs
  flattened to 360 dimensions. Two cities, each its own regression task: Beijing (29,213 / 6,260 / 6,260 windows)
  and Guangzhou (the same columns: 22,628 / 4,849 / 4,850 windows, its own scalers).
* kernel: the NNGP of a ReLU MLP (`smnngp.hyper.mlp_kernel`: ``depth`` x [Dense(W_std, b_std), ReLU], readout
  Dense(1, last_W_std, b_std)). Hyperparameters are chosen without the test windows, by marginal likelihood on a
  random subset of ``--hyper-subset`` training windows (`smnngp.hyper.fit_hyperparameters`: Adam, early stopping
  on the NLL of a random ``--hyper-val`` validation windows): first the Student-t model (W_std, b_std, noise,
  a, b; readout W_std = 1) at every depth of ``--depths``, the depth with the best validation NLL kept; then the
  Gaussian model at that depth (W_std, b_std, noise, last_W_std).
* models, all on ALL training windows of the city: (1) ``gp``: the exact NNGP posterior (`smnngp.posterior.fit`,
  ``prior=None``); (2) ``stp``: the exact Student-t process (``priors.InverseGamma(a, b)``, scaled noise); both
  with ``method=--method`` (default ``'auto'``, so the library picks the dense or the matrix-free path from the
  memory a fit needs; the path it chose and its diagnostics are recorded). The exact fits run in float64: when
  the dense path's ``posterior.dense_copies()`` N x N float64 matrices take more than 90% of the free memory
  (`smnngp.matfree.available_memory_bytes`), ``'auto'`` takes the mixed path (its float32 factor refined to
  float64 accuracy by CG) or the matrix-free one, never a float32 fit (``--exact-dtype float32`` forces one; the
  table says which).
  (3) ``svgp`` and (4) ``svtp`` (`smnngp.variational`, Gaussian likelihood): M = ``--num-inducing`` inducing
  inputs, a random subset of the training windows, trained with the kernel's scales and the noise (SVGP: from
  the GP's fitted values; SVTP: from the Student-t fit's, readout W_std fixed at 1 as sigma^2 carries the
  amplitude, prior InverseGamma(a, b) of that fit), minibatch Adam(``--lr``), batch ``--batch``, at most
  ``--steps`` steps, evaluated once an epoch, early stopping on the validation NLL (patience ``--patience``
  evaluations), the best parameters kept; float64.
* the low-rank LSTMs (Beijing only; the paper has no Guangzhou regression): the paper's Table 2 low-rank row and
  our ``lowrank-pm25`` numbers read from ``records/lowrank-pm25/results.json`` (never re-run here).

Metrics on the test windows, in ug/m^3 (target scaling undone; the NLL gets ``+ log y_std``): RMSE and MAE of the
predictive mean; NLL, the mean negative log predictive density of each model's own predictive (Gaussian for the
GP and SVGP, Student-t for the STP, the SVTP's equal-weight mixture over ``--num-samples`` draws of sigma^2);
PICP and MPIW of the central 95% interval; the coverage-based calibration error ``mean_p |observed(p) - p|``
over central levels p = 0.1, ..., 0.9, 0.95, 0.99 (the levels of `metrics.coverage_calibration`, computed in
closed form from the predictive's CDF: the central p interval holds y iff ``|2 F(y) - 1| <= p``); fit time
(the posterior fit, or the variational training) and the path. ``tail_ratio``, the mean ratio of the 99% to the
50% interval width (3.819 for a Gaussian, more for heavier tails), is recorded too.

Every hyperparameter search and every (city, model) is a resumable cell under ``OUT/cells``; an interrupted run
loses nothing finished. ``--quick``: the first 800 training, 200 validation and 300 test windows of each city,
depth 1, M = 50, a few optimisation steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time

import numpy as np

from experiments import progress, report
from experiments.report import Report, markdown_table

DESCRIPTION = "Exact NNGP / Student-t process on all PM2.5 training windows (Beijing, Guangzhou) vs SVGP / SVTP " \
              "at M = 1,000 and the low-rank LSTMs (issue 30)"

CITIES = ("beijing", "guangzhou")
MODELS = ("gp", "stp", "svgp", "svtp")
NAMES = {"gp": "NNGP (exact)", "stp": "Student-t process (exact)", "svgp": "SVGP", "svtp": "SVTP"}
# The singular-BNN paper's Table 2, low-rank row (Beijing): MAE, ECE, PICP (as in lowrank-pm25's PAPER table).
PAPER_LOWRANK = {"mae": 10.63, "ece": 0.114, "picp": 0.790}
LOWRANK_RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "records", "lowrank-pm25",
                              "results.json")
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)  # those of metrics.coverage_calibration
# the dense float64 path while its matrices take at most this share of free memory, else the mixed (float32 factor,
# float64 solves) or matrix-free path. Never a float32 fit: float32 factorisations of these kernels (dominated by a
# large constant part) need jitter of the order of the noise (a float32 Student-t fit of Beijing needed 2.2 and
# covered 48 % of the test targets with its 95 % intervals)
DENSE_SHARE = 0.9
QUICK = {"train": 800, "val": 200, "test": 300}


def add_arguments(parser):
    parser.add_argument("--cities", nargs="*", default=list(CITIES), choices=CITIES)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--depths", nargs="*", type=int, default=[1, 2, 3],
                        help="MLP depths tried for the kernel, chosen by validation NLL (default 1 2 3)")
    parser.add_argument("--hyper-subset", type=int, default=2000,
                        help="training windows of the marginal-likelihood hyperparameter fit (default 2,000)")
    parser.add_argument("--hyper-val", type=int, default=2000,
                        help="validation windows of its early stopping (default 2,000)")
    parser.add_argument("--hyper-steps", type=int, default=150, help="most Adam steps per hyperparameter fit")
    parser.add_argument("--method", default="auto", choices=("auto", "dense", "mixed", "cg"),
                        help="exact posteriors' path (posterior.fit's method; default auto: the library chooses)")
    parser.add_argument("--exact-dtype", default="auto", choices=("auto", "float32", "float64"),
                        help="precision of the exact fits (default auto: float64 when it fits in memory)")
    parser.add_argument("--num-inducing", type=int, default=1000, help="inducing inputs M (default 1,000)")
    parser.add_argument("--steps", type=int, default=2000, help="most SVGP / SVTP optimisation steps")
    parser.add_argument("--batch", type=int, default=256, help="SVGP / SVTP minibatch size (default 256)")
    parser.add_argument("--lr", type=float, default=1e-2, help="SVGP / SVTP Adam learning rate (default 1e-2)")
    parser.add_argument("--patience", type=int, default=5,
                        help="SVGP / SVTP: stop after this many evaluations (epochs) without a better validation NLL")
    parser.add_argument("--num-samples", type=int, default=500,
                        help="draws of sigma^2 in the SVTP's predictive mixture (default 500)")


def _check_args(args):
    positive = ("hyper_subset", "hyper_val", "hyper_steps", "num_inducing", "steps", "batch", "patience",
                "num_samples")
    for name in positive:
        value = getattr(args, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if not args.depths or any(d < 1 for d in args.depths):
        raise ValueError(f"--depths must be positive integers, got {args.depths}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if not args.cities or not args.models:
        raise ValueError("--cities and --models must name at least one each")


@contextlib.contextmanager
def _heartbeat(what: str, every: float = 5.0):
    """A status line (`experiments.progress.note`) every ``every`` seconds while one long library call runs."""
    stop = threading.Event()
    t0 = time.perf_counter()

    def beat():
        while not stop.wait(every):
            progress.note(f"{what}: {time.perf_counter() - t0:.0f} s")

    thread = threading.Thread(target=beat, name="pm25-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# ---------------------------------------------------------------------------------------------------------------
# data


class _Split:
    """One city's arrays as the models take them: flattened float64 inputs, float64 standardised targets."""

    def __init__(self, task, quick: bool):
        def take(x, y, n):
            x, y = (x, y) if n is None else (x[:n], y[:n])
            return x.reshape(x.shape[0], -1).astype(np.float64), y.astype(np.float64)

        q = QUICK if quick else dict.fromkeys(QUICK)
        self.city = task.city
        self.x, self.y = take(task.x_train, task.y_train, q["train"])
        self.xv, self.yv = take(task.x_val, task.y_val, q["val"])
        self.xt, self.yt = take(task.x_test, task.y_test, q["test"])
        self.y_mean, self.y_std = float(task.y_mean), float(task.y_std)

    def sizes(self):
        return {"train": int(self.x.shape[0]), "val": int(self.xv.shape[0]), "test": int(self.xt.shape[0]),
                "dim": int(self.x.shape[1])}


# ---------------------------------------------------------------------------------------------------------------
# hyperparameters (no test windows)


def _hyper_cell(args, d: _Split, log):
    from smnngp import hyper

    rng = np.random.default_rng(args.seed)
    sub = np.sort(rng.choice(d.x.shape[0], min(args.hyper_subset, d.x.shape[0]), replace=False))
    vsub = np.sort(rng.choice(d.xv.shape[0], min(args.hyper_val, d.xv.shape[0]), replace=False))
    common = dict(activation="relu", max_steps=args.hyper_steps, eval_every=max(1, min(25, args.hyper_steps)),
                  seed=args.seed, progress=not args.quiet)
    data = (d.x[sub], d.y[sub], d.xv[vsub], d.yv[vsub])
    grid = []
    for depth in args.depths:
        log(f"{d.city}: Student-t hyperparameters, depth {depth}, on {len(sub):,} training windows")
        f = hyper.fit_hyperparameters(*data, "student_t", depth=depth, **common)
        grid.append({"depth": depth, "val_nll": f.val_nll, "params": f.params, "steps": f.steps,
                     "seconds": f.seconds})
    best = min(grid, key=lambda g: g["val_nll"])
    log(f"{d.city}: depth {best['depth']} (validation NLL {best['val_nll']:.4f}); Gaussian hyperparameters")
    g = hyper.fit_hyperparameters(*data, "gaussian", depth=best["depth"], **common)
    return {"depth": best["depth"], "subset": int(len(sub)), "val_subset": int(len(vsub)), "grid": grid,
            "student_t": best["params"], "student_t_val_nll": best["val_nll"], "gaussian": g.params,
            "gaussian_val_nll": g.val_nll, "gaussian_steps": g.steps, "gaussian_seconds": g.seconds}


def _kernel_fn(hp, model: str):
    from smnngp import hyper

    p = hp["gaussian" if model in ("gp", "svgp") else "student_t"]
    return hyper.mlp_kernel(hp["depth"], "relu", p["W_std"], p["b_std"], p.get("last_W_std", 1.0))


# ---------------------------------------------------------------------------------------------------------------
# scoring


def _pit(pred, y):
    """The predictive's CDF at the targets, on the host in float64 (Student-t by scipy: numpyro's incomplete beta
    loses accuracy at the 10^4-10^5 degrees of freedom of an exact fit)."""
    import numpyro.distributions as dist
    from scipy import stats

    if isinstance(pred, dist.StudentT):
        return stats.t.cdf(y, np.asarray(pred.df, np.float64), np.asarray(pred.loc, np.float64),
                           np.asarray(pred.scale, np.float64))
    if isinstance(pred, dist.Normal):
        return stats.norm.cdf(y, np.asarray(pred.loc, np.float64), np.asarray(pred.scale, np.float64))
    return np.asarray(pred.cdf(y), np.float64)


def _intervals(pred, level):
    """Central ``level`` interval, scaled units: `posterior.interval` for Normal / Student-t predictives, the
    equal-weight mixture's by `metrics.mixture_interval` (the SVTP)."""
    import numpyro.distributions as dist

    from experiments import metrics
    from smnngp import posterior

    if isinstance(pred, (dist.Normal, dist.StudentT)):
        lo, hi = posterior.interval(pred, level)
        return np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    comp = pred.component_distribution  # batch (n, 1, S): the S components of each point
    scale = np.asarray(comp.scale, np.float64)
    loc = np.broadcast_to(np.asarray(comp.loc, np.float64), scale.shape)
    S = scale.shape[-1]
    return metrics.mixture_interval(loc.reshape(-1, S).T, scale.reshape(-1, S).T, level)


def _score(pred, d: _Split) -> dict:
    """Test metrics of a predictive over the (scaled) test targets, in ug/m^3."""
    from experiments import metrics

    y, ys, ym = d.yt, d.y_std, d.y_mean
    mean = np.asarray(pred.mean, np.float64).reshape(-1)
    lpd = np.asarray(pred.log_prob(_shaped(pred, y)), np.float64).reshape(-1)
    pit = _pit(pred, _shaped(pred, y)).reshape(-1)
    observed = [float(np.mean(np.abs(2 * pit - 1) <= p)) for p in LEVELS]
    lo, hi = _intervals(pred, 0.95)
    y_ug, mean_ug = y * ys + ym, mean * ys + ym
    lo_ug, hi_ug = lo.reshape(-1) * ys + ym, hi.reshape(-1) * ys + ym
    lo99, hi99 = _intervals(pred, 0.99)
    lo50, hi50 = _intervals(pred, 0.50)
    return {"rmse": metrics.rmse(y_ug, mean_ug), "mae": float(np.mean(np.abs(y_ug - mean_ug))),
            "nll": float(-lpd.mean() + math.log(ys)), "picp": metrics.picp(y_ug, lo_ug, hi_ug),
            "mpiw": metrics.mpiw(lo_ug, hi_ug), "interval_score": metrics.interval_score(y_ug, lo_ug, hi_ug, 0.05),
            "ece": float(np.mean(np.abs(np.asarray(observed) - np.asarray(LEVELS)))),
            "calibration": {"levels": list(LEVELS), "observed": observed},
            "tail_ratio": float(np.mean((hi99 - lo99).reshape(-1) / (hi50 - lo50).reshape(-1))),
            "mean_std": float(np.mean(np.sqrt(np.asarray(pred.variance, np.float64))) * ys)}


def _shaped(pred, y):
    """``y`` shaped as the predictive's batch (the variational predictives carry an output axis)."""
    return np.asarray(y).reshape(pred.batch_shape)


# ---------------------------------------------------------------------------------------------------------------
# the models


def _exact_dtype(n: int, choice: str, method: str = "auto") -> tuple[str, str, str]:
    """``(dtype, why, method)``: float64 always (unless forced); with ``method='auto'``, the dense path while its
    matrices take at most `DENSE_SHARE` of the free memory, else the library's own choice among the mixed and
    matrix-free paths."""
    from smnngp import matfree, posterior

    if choice != "auto":
        return choice, "--exact-dtype", method
    free = matfree.available_memory_bytes()
    copies = posterior.dense_copies()
    need = copies * n * n * 8
    if free is None:
        return "float64", "free memory unknown", method
    why = (f"dense float64 needs {copies:g} x {n:,}^2 x 8 B = {need / 2**30:.1f} GiB, "
           f"{free / 2**30:.1f} GiB free")
    if method == "auto" and need > DENSE_SHARE * free:
        method = "mixed" if need / 2 <= DENSE_SHARE * free else "cg"
    return "float64", why, method


def _exact_cell(args, d: _Split, hp, model: str, log):
    import jax
    import jax.numpy as jnp

    from smnngp import posterior, priors

    p = hp["gaussian" if model == "gp" else "student_t"]
    prior = None if model == "gp" else priors.InverseGamma(p["a"], p["b"])
    dtype, why, method = _exact_dtype(d.x.shape[0], args.exact_dtype, args.method)
    x, y = jnp.asarray(d.x, dtype), jnp.asarray(d.y, dtype)
    log(f"{d.city} {model}: exact fit on {d.x.shape[0]:,} windows in {dtype} ({why}), method={method!r}")
    t0 = time.perf_counter()
    with _heartbeat(f"{d.city} {model}: fitting"):
        post = posterior.fit(_kernel_fn(hp, model), x, y, prior, noise=p["noise"], method=method)
        jax.block_until_ready(post.log_marginal_likelihood)
    fit_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    with _heartbeat(f"{d.city} {model}: predicting {d.xt.shape[0]:,} test windows"):
        pred = post.predict(jnp.asarray(d.xt, dtype))
        jax.block_until_ready(pred.mean)
    predict_seconds = time.perf_counter() - t0
    cell = _score(pred, d) | {
        "fit_seconds": fit_seconds, "predict_seconds": predict_seconds, "method": post.method,
        "diagnostics": post.diagnostics, "dtype": dtype, "dtype_reason": why, "n_train": int(d.x.shape[0]),
        "log_marginal_likelihood": float(post.log_marginal_likelihood), "df": float(post.df)}
    log(f"{d.city} {model}: {post.method} {dtype}, fit {fit_seconds:.0f} s, RMSE {cell['rmse']:.2f}, "
        f"NLL {cell['nll']:.3f}")
    return cell


def _variational_cell(args, d: _Split, hp, model: str, log):
    import jax
    import jax.numpy as jnp

    from smnngp import hyper, priors
    from smnngp import variational as vi

    p = hp["gaussian" if model == "svgp" else "student_t"]
    scales = {k: p[k] for k in ("W_std", "b_std", "last_W_std") if k in p}
    kernel = hyper.mlp_parametric_kernel(hp["depth"], "relu", scales)
    key = jax.random.PRNGKey(args.seed)
    k_z, k_fit, k_pred = jax.random.split(key, 3)
    M = min(args.num_inducing, d.x.shape[0])
    Z = vi.stratified_inducing(d.x, None, M, k_z)  # a random subset of the training windows
    if model == "svgp":
        vmodel = vi.svgp(kernel, vi.Gaussian(p["noise"]), Z)
    else:  # the scaled noise eps of the Student-t fit, times the prior mean of sigma^2
        a, b = p["a"], p["b"]
        noise = p["noise"] * (b / (a - 1) if a > 1 else b / a)
        vmodel = vi.svtp(kernel, vi.Gaussian(noise), Z, prior=priors.InverseGamma(a, b))
    batch = min(args.batch, d.x.shape[0])
    log(f"{d.city} {model}: M = {M}, batch {batch}, at most {args.steps} steps")
    t0 = time.perf_counter()
    with _heartbeat(f"{d.city} {model}: training (the bar moves once an epoch)", every=15.0):
        fit = vi.fit(vmodel, vi.init(vmodel), jnp.asarray(d.x), jnp.asarray(d.y), key=k_fit, learning_rate=args.lr,
                     batch_size=batch, num_steps=args.steps, x_val=jnp.asarray(d.xv), y_val=jnp.asarray(d.yv),
                     stop_patience=args.patience, progress=not args.quiet)
    fit_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = vi.predict(vmodel, fit.params, jnp.asarray(d.xt), key=k_pred, num_samples=args.num_samples)
    jax.block_until_ready(pred.mean)
    predict_seconds = time.perf_counter() - t0
    steps = fit.history[-1]["step"] if fit.history else 0
    cell = _score(pred, d) | {
        "fit_seconds": fit_seconds, "predict_seconds": predict_seconds, "num_inducing": M, "steps": int(steps),
        "best_step": int(fit.best_step), "best_val_nll": float(fit.best_val_nll), "dtype": "float64",
        "elbo": float(fit.posterior.log_marginal_likelihood), "n_train": int(d.x.shape[0])}
    if model == "svtp":
        q = vi.scale_posterior(vmodel, fit.params)
        cell["q_sigma2"] = {"a": float(q.concentration), "b": float(q.rate)}
    log(f"{d.city} {model}: {steps} steps (best {fit.best_step}) in {fit_seconds:.0f} s, RMSE {cell['rmse']:.2f}, "
        f"NLL {cell['nll']:.3f}")
    return cell


# ---------------------------------------------------------------------------------------------------------------
# the run


def run(args) -> Report:
    import jax

    from experiments.data.timeseries import pm25_city_forecasting

    _check_args(args)
    jax.config.update("jax_enable_x64", True)  # the hyperparameter and variational fits factorise in float64
    if args.quick:  # caps, so that a test can ask for less
        args.depths = sorted(args.depths)[:1]
        args.hyper_subset, args.hyper_val = min(args.hyper_subset, 200), min(args.hyper_val, 200)
        args.hyper_steps, args.num_inducing = min(args.hyper_steps, 10), min(args.num_inducing, 50)
        args.steps, args.batch, args.num_samples = min(args.steps, 40), min(args.batch, 100), min(args.num_samples, 200)
    log = (lambda msg: None) if args.quiet else progress.note
    keys = {"hyper": ("depths", "hyper_subset", "hyper_val", "hyper_steps"), "exact": ("method", "exact_dtype"),
            "variational": ("num_inducing", "steps", "batch", "lr", "patience", "num_samples")}
    config = {k: getattr(args, k) for group in keys.values() for k in group} | {"quick": args.quick, "seed": args.seed}
    settings = {g: {k: config[k] for k in (*ks, "quick", "seed")} for g, ks in keys.items()}
    splits, hypers, cells = {}, {}, {}
    # the exact posteriors of every city first (the point of the experiment), then the variational baselines
    for group in ("exact", "variational"):
        for city in args.cities:
            if city not in splits:
                d = splits[city] = _Split(pm25_city_forecasting(city), args.quick)
                hypers[city] = report.cell(os.path.join(args.out, "cells", f"{city}_hyper.json"), settings["hyper"],
                                           lambda d=d: _hyper_cell(args, d, log), log=log)
            fit = _exact_cell if group == "exact" else _variational_cell
            for m in [m for m in args.models if (m in ("gp", "stp")) == (group == "exact")]:
                cells[(city, m)] = report.cell(
                    os.path.join(args.out, "cells", f"{city}_{m}.json"), settings[group] | {"hyper": settings["hyper"]},
                    lambda d=splits[city], hp=hypers[city], m=m, fit=fit: fit(args, d, hp, m, log), log=log)
    sizes = {city: splits[city].sizes() for city in args.cities}
    lowrank = _lowrank_record() if "beijing" in args.cities else None
    results = {"config": config, "sizes": sizes, "hyperparameters": hypers, "lowrank_lstm": lowrank,
               "paper_lowrank": PAPER_LOWRANK, "cells": {f"{c}_{m}": v for (c, m), v in cells.items()}}
    return Report(results=results, markdown=_markdown(args, cells, hypers, sizes, lowrank))


def _lowrank_record(path: str = LOWRANK_RECORD) -> dict | None:
    """Our ``lowrank-pm25`` low-rank LSTM numbers (means over its seeds) from its results.json, or ``None``."""
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        rec = json.load(fh)
    s = rec.get("results", {}).get("summary", {}).get("lowrank")
    if s is None:
        return None
    out = {k: s[k][0] for k in ("rmse", "mae", "nll", "picp", "mpiw", "ece") if k in s}
    return out | {"seeds": s.get("seeds"), "quick": bool(rec.get("config", {}).get("quick")),
                  "commit": rec.get("git_commit"), "source": os.path.relpath(path, os.path.dirname(LOWRANK_RECORD))}


def _path_text(c: dict) -> str:
    if "method" not in c:
        return f"variational, M = {c['num_inducing']:,}, {c['steps']:,} steps (best {c['best_step']:,})"
    text = f"{c['method']}, {c['dtype']}"
    diag = c["diagnostics"]
    if c["method"] in ("cg", "mixed"):
        text += f", {diag['cg_iterations']} CG iterations, residual {diag['cg_residual']:.1e}"
    elif diag.get("jitter"):
        text += f", jitter {diag['jitter']:.1e}"
    return text


def _markdown(args, cells, hypers, sizes, lowrank) -> str:
    f2 = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    header = ["model", "RMSE", "MAE", "NLL", "PICP (95%)", "MPIW", "calibration error", "fit time (s)", "path"]
    md = ["# Exact NNGP and Student-t process on all PM2.5 training windows (issue 30)", ""]
    if args.quick:
        md += [f"**Quick mode**: the first {QUICK['train']:,} training, {QUICK['val']} validation and "
               f"{QUICK['test']} test windows per city, depth 1, M = {args.num_inducing}, {args.steps} steps: not the "
               "full setting.", ""]
    for city in args.cities:
        s, hp = sizes[city], hypers[city]
        rows = []
        for m in args.models:
            c = cells[(city, m)]
            rows.append([NAMES[m], f2(c["rmse"]), f2(c["mae"]), f3(c["nll"]), f3(c["picp"]), f2(c["mpiw"]),
                         f3(c["ece"]), f"{c['fit_seconds']:.1f}", _path_text(c)])
        if city == "beijing":
            p = PAPER_LOWRANK
            rows.append(["Low-rank LSTM (paper Table 2)", "-", f2(p["mae"]), "-", f3(p["picp"]), "-", f3(p["ece"]),
                         "-", "LSTM, 4 runs"])
            if lowrank is None:
                rows.append(["Low-rank LSTM (ours, lowrank-pm25)", "not run", "", "", "", "", "", "", ""])
            else:
                lr = lowrank
                rows.append(["Low-rank LSTM (ours, lowrank-pm25)", f2(lr.get("rmse")), f2(lr.get("mae")),
                             f3(lr.get("nll")), f3(lr.get("picp")), f2(lr.get("mpiw")), f3(lr.get("ece")), "-",
                             f"LSTM, {lr['seeds']} seed(s), records/lowrank-pm25" + (" (quick)" if lr["quick"]
                                                                                      else "")])
        stp = hp["student_t"]
        gau = hp["gaussian"]
        md += [f"## {city.capitalize()}: {s['train']:,} training / {s['val']:,} validation / {s['test']:,} test "
               f"windows, {s['dim']} inputs", "", markdown_table(header, rows), "",
               f"Kernel: ReLU MLP NNGP, depth {hp['depth']} (of {args.depths}, by validation NLL), hyperparameters "
               f"by marginal likelihood on {hp['subset']:,} random training windows (early stopping on "
               f"{hp['val_subset']:,} validation windows). Student-t: W_std {stp['W_std']:.3g}, b_std "
               f"{stp['b_std']:.3g}, noise {stp['noise']:.3g}, InverseGamma({stp['a']:.3g}, {stp['b']:.3g}); "
               f"Gaussian: W_std {gau['W_std']:.3g}, b_std {gau['b_std']:.3g}, readout W_std "
               f"{gau['last_W_std']:.3g}, noise {gau['noise']:.3g}.", ""]
    md += ["Test metrics in ug/m^3; NLL per window (each model's own predictive); PICP and MPIW of the central 95% "
           "interval; calibration error: mean |observed - nominal| coverage of central intervals at 11 levels "
           "(0.1-0.9, 0.95, 0.99), from the predictive's CDF. Fit time: the exact posterior's fit (kernel and "
           "factorisation or solves; hyperparameter search excluded), or the variational training. Path: what "
           "`posterior.fit` ran (dense float64 while its matrices take at most 90% of the free memory, else the "
           "mixed path, a float32 factor refined to float64, or the matrix-free one). The low-rank LSTM rows are "
           "the singular-BNN paper's Table 2 and our lowrank-pm25 record (not re-run here); the paper has no "
           "Guangzhou regression."]
    return "\n".join(md)
