"""Masked BNN on the noisy cubic (Kong et al. 2023, section 6.1, Figure 1; notes section 3.2).

Data (Hernandez-Lobato and Adams 2015): ``x ~ U(-4, 4)``, ``y = x^3 + N(0, 9)``,
20 training points, 1,000 fresh test points. Model: two hidden ReLU layers
of 1,000 nodes (physical width 1,100 with 1,000 active at the start, as the
authors' code), Cauchy(0, 0.3) on every weight, ``sigma^2 ~ InvGamma(1, 1)``,
inputs and targets unscaled. mBNN: ``lambda = 0.1``, ``N_max = 3``, two mask
moves per iteration; BNN: the same sampler with all nodes on and no moves.
HMC: 30 leapfrog steps, initial step ``0.1 / n``, dual averaging during
burn-in. Schedule (paper): 300 burn-in "samples" x thinning 10 = 3,000
iterations, then 1,000 draws every 10 iterations, per chain.

Reported: coverage of the 95% predictive interval of ``y`` (mixture
quantiles) on the test points (paper: mBNN 95.3%, BNN 98.6%), RMSE, NLL and
CRPS, active nodes, HMC/mask acceptance, divergences and R-hat/ESS of
``sigma^2`` and of the test predictions over the chains; the figure shows
both predictive bands.
"""

from __future__ import annotations

import json
import os

import numpy as np

from experiments import metrics
from experiments.report import Report, jsonable, markdown_table, write_json_atomic

DESCRIPTION = "masked BNN vs BNN on the noisy cubic: coverage of 95-percent intervals (paper 95.3 vs 98.6) and bands"

PAPER = {"mbnn": 0.953, "bnn": 0.986}


def add_arguments(parser):
    parser.add_argument("--chains", type=int, default=None, help="chains per model (default 4, quick 2)")
    parser.add_argument("--width", type=int, default=None, help="initially active width (default 1000)")
    parser.add_argument("--burnin", type=int, default=None, help="burn-in iterations (default 3000)")
    parser.add_argument("--samples", type=int, default=None, help="draws per chain (default 1000)")
    parser.add_argument("--thinning", type=int, default=None, help="iterations between draws (default 10)")
    parser.add_argument("--models", default="mbnn,bnn", help="comma-separated: mbnn, bnn")


def make_data(seed: int, n_train: int = 20, n_test: int = 1000):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, (n_train + n_test, 1))
    y = x[:, 0] ** 3 + 3.0 * rng.normal(size=n_train + n_test)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def settings(args) -> dict:
    quick = args.quick
    s = dict(chains=2 if quick else 4, width=50 if quick else 1000, burnin=150 if quick else 3000,
             samples=30 if quick else 1000, thinning=3 if quick else 10, lam=0.1, prior_scale=0.3,
             leapfrog=30, n_mh=2, n_max=3, step_scale=0.5)
    for k in ("chains", "width", "burnin", "samples", "thinning"):
        if getattr(args, k, None) is not None:
            s[k] = int(getattr(args, k))
    return s


def run_model(kind, s, x, y, x_eval, seed, checkpoint=None, progress=True):
    """Sample one model; returns (draws of f at x_eval (chains, S, m), sigma2 (chains, S), diagnostics)."""
    import jax
    import jax.numpy as jnp

    from finite.masked import masked_mlp
    from samplers.mbnn import MaskedBNN, diagnostics, mbnn_sampler, sample

    width = s["width"]
    if kind == "mbnn":
        net = masked_mlp(1, (int(round(1.1 * width)),) * 2, (width, width))
        lam = s["lam"]
    else:
        net = masked_mlp(1, (width, width))
        lam = None
    model = MaskedBNN(net, x, y, prior_scale=s["prior_scale"], lam=lam, sigma2_prior=(1.0, 1.0))
    sampler = mbnn_sampler(model, num_integration_steps=s["leapfrog"], step_size=0.1 / len(y), n_mh=s["n_mh"],
                           n_max=s["n_max"], step_scale=s["step_scale"])
    xe = jnp.asarray(x_eval, jnp.float32)
    res = sample(sampler, jax.random.PRNGKey(seed), num_chains=s["chains"], num_burnin=s["burnin"],
                 num_samples=s["samples"], thinning=s["thinning"],
                 functions={"f": lambda p, m, s2, b: net.apply(p, m, xe, b)[:, 0]},
                 checkpoint=checkpoint, progress=progress)
    diag = diagnostics(res, s["burnin"], keys=("sigma2", "f"))
    diag["seconds"] = res.seconds
    diag["active_trace"] = res.traces["active"].mean(0)[:: max(1, res.iterations // 200)].tolist()
    return res.draws["f"], res.draws["sigma2"], diag


def run(args) -> Report:
    s = settings(args)
    x, y, xt, yt = make_data(args.seed)
    grid = np.linspace(-6, 6, 200)[:, None]
    x_eval = np.concatenate([xt, grid])
    os.makedirs(args.out, exist_ok=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in ("mbnn", "bnn"):
            raise ValueError(f"mbnn-polynomial: unknown model {m!r} (choose mbnn, bnn)")
    rows, results, bands = [], {}, {}
    for m in models:
        res, band = _model_result(m, s, args, x, y, x_eval, yt)
        results[m] = res
        bands[m] = band
        diag = res["diagnostics"]
        rows.append([m.upper() if m == "bnn" else "mBNN", f"{100 * res['coverage']:.1f}%",
                     f"{100 * PAPER[m]:.1f}%", f"{res['mean_width']:.2f}", f"{res['rmse']:.2f}", f"{res['nll']:.3f}",
                     f"{res['crps']:.3f}", "/".join(f"{a:.0f}" for a in diag["final_active"]),
                     f"{diag['hmc_acceptance']:.2f}", f"{diag['mask_acceptance']:.2f}", diag["divergences"],
                     f"{diag['rhat_f']:.3f}", f"{diag['ess_f']:.0f}", f"{diag['seconds']:.0f}"])
    fig = _figure(args.out, x, y, grid[:, 0], bands, results)
    head = ["model", "coverage", "paper", "mean 95% width", "RMSE", "NLL", "CRPS", "active (l1/l2)", "HMC acc",
            "mask moves acc/it", "divergences (after burn-in)", "max R-hat f", "min ESS f", "seconds"]
    md = ["# Masked BNN: noisy cubic (paper section 6.1, Figure 1)", "",
          markdown_table(head, rows), "",
          f"Settings: {s['chains']} chains; width {s['width']} active (mBNN physical {int(round(1.1 * s['width']))}); "
          f"burn-in {s['burnin']} iterations, {s['samples']} draws every {s['thinning']} per chain; "
          f"Cauchy(0, {s['prior_scale']}); lambda {s['lam']}; {s['leapfrog']} leapfrog steps; "
          f"{s['n_mh']} mask moves per iteration. Coverage: 95% equal-tailed interval of the Gaussian-mixture "
          f"predictive of y on {len(yt)} fresh test points. R-hat/ESS over chains (BlackJAX).", "",
          f"![bands]({fig})"]
    if args.quick:
        md.insert(1, "**Quick mode**: narrow network and short chains; not comparable to the paper.\n")
    return Report(results=dict(settings=s, models=results), markdown="\n".join(md), figures=[fig])


def _model_result(m, s, args, x, y, x_eval, yt):
    """Sample (or reload) one model: its metrics and its band on the plotting grid.

    A finished model is kept in ``<out>/model_<m>.json`` with the settings and
    seed it was run with, so that ``--models mbnn`` and ``--models bnn`` can be
    run one after the other (or a run cut short resumed) and the report still
    holds both; a file from other settings is ignored and overwritten.
    """
    seed = args.seed + 1 + ("mbnn", "bnn").index(m)  # per model, whatever the order of --models
    path = os.path.join(args.out, f"model_{m}.json")
    if os.path.exists(path):
        with open(path) as fh:
            kept = json.load(fh)
        if kept.get("settings") == s and kept.get("seed") == seed:
            print(f"mbnn-polynomial: {m} reused from {path}")
            return kept["result"], tuple(np.asarray(b) for b in kept["band"])
    chk = os.path.join(args.out, f"checkpoint_{m}.pkl")
    f, s2, diag = run_model(m, s, x, y, x_eval, seed, checkpoint=chk)
    f = f.reshape(-1, f.shape[-1]).astype(float)
    sig = np.sqrt(s2.reshape(-1).astype(float))
    ft, fg = f[:, : len(yt)], f[:, len(yt):]
    lo, hi = metrics.mixture_interval(ft, sig)
    res = dict(coverage=metrics.coverage(yt, lo, hi), rmse=metrics.rmse(yt, ft.mean(0)),
               nll=metrics.mixture_nll(yt, ft, sig), crps=metrics.mixture_crps(yt, ft, sig),
               mean_width=float(np.mean(hi - lo)), diagnostics=diag)
    band = (fg.mean(0),) + tuple(metrics.mixture_interval(fg, sig))
    write_json_atomic(path, jsonable(dict(settings=s, seed=seed, result=res, band=band)))
    if os.path.exists(chk):
        os.remove(chk)
    return res, band


def _figure(out, x, y, grid, bands, results):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(bands), figsize=(5 * len(bands), 4), sharey=True, squeeze=False)
    for ax, (m, (mean, lo, hi)) in zip(axes[0], bands.items()):
        ax.fill_between(grid, lo, hi, color="tab:blue", alpha=0.25, label="95% predictive")
        ax.plot(grid, mean, color="tab:blue", label="mean")
        ax.plot(grid, grid**3, color="tab:red", label="x^3")
        ax.scatter(x[:, 0], y, color="k", s=12, zorder=3, label="data")
        ax.set_title(f"{'mBNN' if m == 'mbnn' else 'BNN'}: coverage {100 * results[m]['coverage']:.1f}%")
        ax.set_ylim(-150, 150)
        ax.set_xlabel("x")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    name = "polynomial_bands.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
