"""Next-hour PM2.5 forecasting with Bayesian LSTMs (singular-BNN paper section 4.3, appendix G.4; Tables 2, 10, 11;
notes section 3.2), Guangzhou as the out-of-distribution set.

Protocol:

* data: `experiments.data.pm25_forecasting` (24-hour windows of 15 features, chronological 70/15/15 split of the
  41,733 Beijing windows, the paper's counts; scaler fitted on the training windows only);
* network: 2-layer LSTM, H = 64, head on the last hidden state (`finite.lowrank.lstm`); methods: deterministic,
  deep ensemble (5 members trained in parallel), full-rank BBB, low-rank (ranks 14 / 20, head rank 1), LR-SVD
  (the low-rank model initialised by SVD from the trained deterministic network) and rank-1 multiplicative;
* training: Gaussian likelihood with a learned noise, Adam(1e-3), batch 64, KL weight 0.09 / N_train (the
  paper's lambda), one weight draw per step shared by the batch; at most ``--epochs`` epochs (paper: up to 150)
  with early stopping on the validation MAE (patience ``--patience``; paper 30) keeping the best epoch;
* prediction: S Monte-Carlo draws of f; the predictive is the mixture of N(f_s, sigma^2) (deep ensemble: the
  members' means with the variance pooled from validation residuals, as the paper says); 95% intervals from the
  mixture; all metrics in ug/m^3 after undoing the target scaling;
* metrics: MAE, RMSE, NLL, CRPS, coverage-based ECE (`metrics.coverage_calibration`), PICP and MPIW of the 95%
  interval, interval score; AUROC / AUPR for telling Guangzhou windows from Beijing test windows by the
  predictive standard deviation; selective prediction (MAE at 100%, 95%, ..., 70% retention, most uncertain
  first out); parameter counts.

Nothing is chosen on the test windows. Each (seed, method) is a resumable cell under ``OUT/cells``; the paper's
Table 2 sits beside ours.
"""

from __future__ import annotations

import os
import time

import numpy as np

from experiments import report
from experiments.report import Report, markdown_table

DESCRIPTION = "Bayesian LSTMs (low-rank, full-rank, rank-1, ensembles) on Beijing PM2.5 with Guangzhou as OOD " \
              "(singular-BNN paper Table 2)"

METHODS = ("deterministic", "ensemble", "bbb", "lowrank", "lowrank-svd", "rank1")
NAMES = {"deterministic": "Deterministic", "ensemble": "Deep Ensemble (5)", "bbb": "Full-Rank BBB",
         "lowrank": "Low-Rank (r=14,20)", "lowrank-svd": "LR-SVD", "rank1": "Rank-1 Mult."}
# Table 2: MAE, ECE, PICP, AUROC-OOD, AUPR-OOD, params (thousands); None where the paper prints a dash
PAPER = {"deterministic": (10.79, None, None, 0.5, 0.5, 33), "bbb": (10.55, 0.111, 0.788, 0.492, 0.743, 132),
         "lowrank": (10.63, 0.114, 0.790, 0.710, 0.861, 47), "lowrank-svd": (10.70, 0.139, 0.773, 0.687, 0.812, 47),
         "rank1": (10.80, 0.307, 0.449, 0.580, 0.751, 66), "ensemble": (10.45, 0.317, 0.310, 0.730, 0.883, 330)}
RETENTION = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


def add_arguments(parser):
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--epochs", type=int, default=40, help="maximum epochs (paper 150; default 40)")
    parser.add_argument("--patience", type=int, default=8, help="early-stopping patience in epochs (paper 30)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (paper: 4 runs)")
    parser.add_argument("--num-samples", type=int, default=100, help="Monte-Carlo draws (paper 150)")
    parser.add_argument("--ood-windows", type=int, default=10_000,
                        help="Guangzhou windows scored for OOD detection (a fixed random subset; default 10,000)")


def _kind(method: str) -> str:
    return {"ensemble": "deterministic", "lowrank-svd": "lowrank"}.get(method, method)


def _model(method: str):
    from finite import lowrank

    kind = _kind(method)
    ranks = dict(rank_ih=14, rank_hh=20) if kind == "lowrank" else {}
    return lowrank.lstm(15, 64, 1, 2, kind, **ranks)


def _chunked(fn, x, size=2048):
    return np.concatenate([np.asarray(fn(x[i:i + size])) for i in range(0, x.shape[0], size)], axis=-1)


def _train(model, params, task, key, args, *, bayes: bool, log, members: int = 0):
    """Epochs of `finite.lowrank.fit` (or `fit_ensemble`) with early stopping on the validation MAE (scaled
    units); returns ``(best params, noise std, epochs run, best epoch)``."""
    import jax
    import optax

    from finite import lowrank

    n = task.x_train.shape[0]
    prior = lowrank.ScaleMixturePrior() if bayes else None
    best, best_epoch, since, noise = (np.inf, None, None), 0, 0, 1.0
    opt_state = None
    optimizer = optax.adam(1e-3)  # one object: the compiled epoch is reused across the calls
    for e in range(args.epochs):
        k = jax.random.fold_in(key, e)
        common = dict(likelihood="gaussian", num_epochs=1, batch_size=64, optimizer=optimizer, prior=prior,
                      kl_weight=0.09, num_data=n, noise_std=noise, learn_noise=True, opt_state=opt_state)
        if members:
            fit = lowrank.fit_ensemble(model, task.x_train, task.y_train, k, num_members=members, params=params,
                                       **common)
        else:
            fit = lowrank.fit(model, params, task.x_train, task.y_train, k, **common)
        params, noise, opt_state = fit.params, fit.noise_std, fit.opt_state
        if members:
            f_val = _chunked(lambda xb: lowrank.ensemble_apply(model, params, xb)[..., 0], task.x_val)
            mae = float(np.mean(np.abs(f_val.mean(0) - task.y_val)))
        else:
            if bayes:  # mean of a few draws, with the same keys every epoch
                f_val = _chunked(lambda xb: lowrank.predict(model, params, xb, jax.random.PRNGKey(7), 4)[..., 0],
                                 task.x_val).mean(0)
            else:
                f_val = _chunked(lambda xb: model.apply(params, xb)[..., 0], task.x_val)
            mae = float(np.mean(np.abs(f_val - task.y_val)))
        if mae < best[0]:
            best, best_epoch, since = (mae, params, noise), e + 1, 0
        else:
            since += 1
        log(f"  epoch {e + 1}: validation MAE {mae * task.y_std:.2f} (best {best[0] * task.y_std:.2f} at "
            f"{best_epoch})")
        if since >= args.patience:
            break
    return best[1], best[2], e + 1, best_epoch


def _cell(args, task, seed, method, log):
    import jax
    import jax.numpy as jnp

    from experiments import metrics
    from finite import lowrank

    key = jax.random.PRNGKey(seed)
    k_init, k_fit, k_pred, k_det = jax.random.split(key, 4)
    model = _model(method)
    bayes = _kind(method) != "deterministic"
    t0 = time.perf_counter()
    if method == "ensemble":
        params, noise, epochs, best_epoch = _train(model, None, task, k_fit, args, bayes=False, log=log, members=5)
    else:
        if method == "lowrank-svd":  # the deterministic twin first, then SVD warm start (App. F.9)
            det = _model("deterministic")
            det_params, _, _, _ = _train(det, det.init(k_det), task, jax.random.fold_in(k_fit, 1), args, bayes=False,
                                         log=log)
            params = model.from_deterministic(det_params, k_init)
        else:
            params = model.init(k_init)
        params, noise, epochs, best_epoch = _train(model, params, task, k_fit, args, bayes=bayes, log=log)
    seconds = time.perf_counter() - t0
    S = args.num_samples
    rng = np.random.default_rng(seed)
    ood_idx = np.sort(rng.choice(task.x_ood.shape[0], min(args.ood_windows, task.x_ood.shape[0]), replace=False))

    def draws(x):
        """(S or K, n) draws of f in scaled units."""
        if method == "ensemble":
            return _chunked(lambda xb: lowrank.ensemble_apply(model, params, xb)[..., 0], x)
        if not bayes:
            return _chunked(lambda xb: model.apply(params, xb)[None, :, 0], x)
        return _chunked(lambda xb: lowrank.predict(model, params, jnp.asarray(xb), k_pred, S, batch_size=10)[..., 0],
                        x, size=1024)

    f_val, f_te, f_ood = draws(task.x_val), draws(task.x_test), draws(task.x_ood[ood_idx])
    if method == "ensemble":  # noise pooled from validation residuals of the ensemble mean
        sigma = float(np.sqrt(np.mean((f_val.mean(0) - task.y_val) ** 2)))
    else:
        sigma = float(np.mean(noise))
    ys, ym = task.y_std, task.y_mean
    y = task.y_test * ys + ym
    mu = f_te * ys + ym  # (S, n) mixture means in ug/m^3
    sd = sigma * ys
    mean = mu.mean(0)
    std = np.sqrt(mu.var(0) + sd**2)
    std_ood = np.sqrt((f_ood * ys).var(0) + sd**2)
    lo, hi = metrics.mixture_interval(mu, sd, 0.95)
    y_draws = mu[np.arange(200) % mu.shape[0]] + sd * rng.standard_normal((200, mu.shape[1]))
    err = np.abs(mean - y)
    order = np.argsort(std, kind="stable")
    selective = {f"{r:.2f}": float(np.mean(err[order[: int(round(r * err.size))]])) for r in RETENTION}
    is_ood = np.r_[np.zeros(y.size, bool), np.ones(std_ood.size, bool)]
    score = np.r_[std, std_ood]
    cal = metrics.coverage_calibration(y, y_draws)
    cell = {"params": model.num_params() * (5 if method == "ensemble" else 1), "epochs": epochs,
            "best_epoch": best_epoch, "train_seconds": seconds, "noise_sd": sd,
            "mae": float(err.mean()), "rmse": metrics.rmse(y, mean), "nll": metrics.mixture_nll(y, mu, sd),
            "crps": metrics.mixture_crps(y, mu[:50], sd), "ece": cal["ece"], "calibration": cal,
            "picp": metrics.picp(y, lo, hi), "mpiw": metrics.mpiw(lo, hi),
            "interval_score": metrics.interval_score(y, lo, hi, 0.05),
            "auroc_ood": metrics.ood_auroc(score, is_ood), "aupr_ood": metrics.ood_aupr(score, is_ood),
            "selective_mae": selective}
    log(f"seed {seed} {method}: MAE {cell['mae']:.2f}, PICP {cell['picp']:.3f}, AUROC-OOD {cell['auroc_ood']:.3f} "
        f"({epochs} epochs, {seconds:.0f} s)")
    return cell


def run(args) -> Report:
    import jax

    from experiments.data import pm25_forecasting

    task = pm25_forecasting()
    if args.quick:
        args.epochs, args.patience, args.seeds, args.num_samples, args.ood_windows = 1, 1, 1, 8, 300
        args.methods = [m for m in args.methods if m in ("deterministic", "lowrank", "ensemble")]
        task = task._replace(x_train=task.x_train[:640], y_train=task.y_train[:640], x_val=task.x_val[:256],
                             y_val=task.y_val[:256], x_test=task.x_test[:300], y_test=task.y_test[:300])
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    jax.config.update("jax_enable_x64", False)
    config = {k: getattr(args, k) for k in ("epochs", "patience", "num_samples", "ood_windows", "quick")}
    cells = {}
    for seed in range(args.seed, args.seed + args.seeds):
        for m in args.methods:
            path = os.path.join(args.out, "cells", f"seed{seed}_{m}.json")
            cells[(seed, m)] = report.cell(path, config, lambda s=seed, mm=m: _cell(args, task, s, mm, log), log=log)
    summary = _summarise(cells)
    fig = _figure(args.out, cells, args.seed)
    return Report(results={"config": config, "summary": summary,
                           "cells": {f"seed{s}_{m}": c for (s, m), c in cells.items()}},
                  markdown=_markdown(args, summary, cells, task.x_test.shape[0]), figures=[fig])


def _summarise(cells):
    from experiments.metrics import mean_se

    keys = ("mae", "rmse", "nll", "crps", "ece", "picp", "mpiw", "interval_score", "auroc_ood", "aupr_ood")
    out = {}
    for (_, m), c in cells.items():
        acc = out.setdefault(m, {k: [] for k in keys} | {"selective": [], "params": c["params"]})
        for k in keys:
            acc[k].append(c[k])
        acc["selective"].append([c["selective_mae"][f"{r:.2f}"] for r in RETENTION])
    return {m: {k: (mean_se(v) if k in keys else v) for k, v in d.items() if k != "selective"}
            | {"selective_mae": np.mean(d["selective"], 0).tolist(), "seeds": len(d["mae"])} for m, d in out.items()}


def _markdown(args, summary, cells, n_test: int) -> str:
    rows = []
    for m in METHODS:
        if m not in summary:
            continue
        s = summary[m]
        f = lambda k, d=3: f"{s[k][0]:.{d}f} ± {s[k][1]:.{d}f}"  # noqa: E731
        rows.append([NAMES[m], f("mae", 2), f("ece"), f("picp"), f("auroc_ood"), f("aupr_ood"),
                     f"{s['params'] / 1000:.0f}K", f("crps", 2), f("nll", 3), s["seeds"]])
        p = PAPER[m]
        rows.append(["  paper", p[0], p[1] if p[1] is not None else "-", p[2] if p[2] is not None else "-", p[3],
                     p[4], f"{p[5]}K", "", "", ""])
    sel = [[NAMES[m]] + [f"{v:.2f}" for v in summary[m]["selective_mae"]] for m in METHODS if m in summary]
    md = ["# Beijing PM2.5, next-hour forecasting with Bayesian LSTMs (singular-BNN paper Table 2)", ""]
    if args.quick:
        md += ["**Quick mode**: 640 training windows, one epoch, few draws: not the paper's setting.", ""]
    epochs = [c["epochs"] for c in cells.values()]
    md += [markdown_table(["model", "MAE", "ECE", "PICP (95%)", "AUROC-OOD", "AUPR-OOD", "params", "CRPS", "NLL",
                           "seeds"], rows), "",
           f"Mean ± standard error over seeds. At most {args.epochs} epochs with early stopping on the validation MAE "
           f"(patience {args.patience}; {min(epochs)}-{max(epochs)} epochs run; paper: up to 150, patience 30); "
           f"{args.num_samples} draws of f; OOD: {args.ood_windows:,} Guangzhou windows against the {n_test:,} "
           "Beijing test windows, scored by the predictive standard deviation. ECE: mean |observed - nominal| "
           "coverage of central intervals at 11 levels. The paper's parameter counts include its own head and bias "
           "choices.", "",
           "Selective prediction, test MAE keeping the most certain fraction (paper Table 11):", "",
           markdown_table(["model"] + [f"{int(100 * r)}%" for r in RETENTION], sel)]
    return "\n".join(md)


def _figure(out, cells, seed) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for m in METHODS:
        c = cells.get((seed, m))
        if c is None:
            continue
        cal = c["calibration"]
        axes[0].plot(cal["levels"], cal["observed"], "o-", ms=3, label=NAMES[m])
        axes[1].plot([100 * r for r in RETENTION], [c["selective_mae"][f"{r:.2f}"] for r in RETENTION], "o-", ms=3,
                     label=NAMES[m])
    axes[0].plot([0, 1], [0, 1], "k:", lw=0.8)
    axes[0].set_xlabel("nominal coverage")
    axes[0].set_ylabel("observed coverage")
    axes[1].set_xlabel("retention (%)")
    axes[1].set_ylabel("test MAE")
    axes[1].invert_xaxis()
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    name = "pm25_calibration_selective.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
