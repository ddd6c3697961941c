"""The singular-BNN paper's toy regression (App. I.3, after Blundell et al. 2015; Tables 19-20, Figure 20; notes
section 3.6), variational and with BlackJAX HMC.

Protocol, as the paper states it:

* data: ``y = x + 0.3 sin(2 pi (x + e)) + 0.3 sin(4 pi (x + e)) + e``, ``e ~ N(0, 0.02^2)``; 1,024 training
  inputs ``x ~ U[-0.1, 0.6]``, 2,048 test inputs ``x ~ U[-0.25, 0.85]`` (so a third of the test range is
  extrapolation), the plot grid ``[-0.5, 1.5]``;
* network 1-100-100-1, tanh; full-rank BNN (every weight and bias mean-field Gaussian: 20,802 parameters) and
  low-rank BNN (the 100 x 100 hidden matrix as ``A B^T`` with rank 16, input and output layers full-rank:
  7,202 parameters);
* prior ``0.5 N(0, 2^2) + 0.5 N(0, (e^-6)^2)`` with a Monte-Carlo KL; Gaussian likelihood with the noise fixed at
  0.02; Adam(5e-4), batch 128, 800 epochs, KL weight ``1e-4 / N`` ramped linearly over 760 epochs;
* metrics: test RMSE of a single pass (one weight draw) and of the MC-200 mean; the median width of the
  epistemic 5-95% band (S = 100 draws of f) in domain (x in [0, 0.5]) and out of domain (x in [0.5, 1.5]) and
  their ratio (the paper calls the 5-95% width an "IQR");
* HMC (our addition): the same low-rank network with A, B and the full-rank layers as the position, the same
  prior and likelihood, sampled with `samplers.driver` (NUTS, windowed adaptation, several chains), its band
  widths, R-hat of f on the grid, and the singular values of the sampled ``A B^T``.

Each piece is a resumable cell under ``OUT/cells``; the HMC run also checkpoints while it samples.
"""

from __future__ import annotations

import math
import os

import numpy as np

from experiments import report
from experiments.report import Report, markdown_table

DESCRIPTION = "low-rank vs full-rank BNN on the toy regression, VI and HMC (singular-BNN paper Tables 19-20)"

NOISE = 0.02
PAPER_RMSE = {"fullrank": (0.49623, 0.49528), "lowrank": (0.50732, 0.50296)}  # single pass, MC-200 (Table 19)
PAPER_BANDS = {"fullrank": (0.0254, 0.0483, 1.90, 20802), "lowrank": (0.0467, 0.0940, 2.01, 7202)}  # Table 20
IN_DOMAIN, OUT_OF_DOMAIN = (0.0, 0.5), (0.5, 1.5)


def add_arguments(parser):
    parser.add_argument("--epochs", type=int, default=800, help="training epochs (paper 800)")
    parser.add_argument("--rank", type=int, default=16, help="rank of the hidden matrix (paper 16)")
    parser.add_argument("--hmc-chains", type=int, default=4, help="HMC chains (default 4)")
    parser.add_argument("--hmc-warmup", type=int, default=1000, help="HMC warm-up iterations per chain")
    parser.add_argument("--hmc-samples", type=int, default=250, help="kept HMC draws per chain")
    parser.add_argument("--hmc-thinning", type=int, default=4, help="HMC iterations per kept draw")
    parser.add_argument("--hmc-max-doublings", type=int, default=10, help="NUTS tree depth limit (default 10)")
    parser.add_argument("--no-hmc", action="store_true", help="variational models only")


def toy_data(seed: int, n_train: int = 1024, n_test: int = 2048):
    """The paper's toy set: ``(x_train, y_train, x_test, y_test)``, each (n, 1) float32."""
    rng = np.random.default_rng(seed)

    def f(x):
        e = NOISE * rng.standard_normal(x.shape)
        return x + 0.3 * np.sin(2 * np.pi * (x + e)) + 0.3 * np.sin(4 * np.pi * (x + e)) + e

    x_tr = rng.uniform(-0.1, 0.6, (n_train, 1))
    x_te = rng.uniform(-0.25, 0.85, (n_test, 1))
    return tuple(a.astype(np.float32) for a in (x_tr, f(x_tr), x_te, f(x_te)))


def _model(kind: str, rank: int):
    from finite import lowrank

    if kind == "fullrank":
        return lowrank.mlp((1, 100, 100, 1), "bbb", activation="tanh", bias="bayes")
    return lowrank.mlp((1, 100, 100, 1), ("bbb", "lowrank", "bbb"), rank=(None, rank, None), activation="tanh",
                       bias="bayes")


def band_widths(f_samples, grid) -> dict:
    """Median width of the 5-95% band of ``f_samples`` (S, n) over the grid points in and out of domain."""
    lo, hi = np.percentile(f_samples, [5, 95], axis=0)
    width = hi - lo
    inside = (grid >= IN_DOMAIN[0]) & (grid <= IN_DOMAIN[1])
    outside = (grid >= OUT_OF_DOMAIN[0]) & (grid <= OUT_OF_DOMAIN[1])
    w_in, w_out = float(np.median(width[inside])), float(np.median(width[outside]))
    return {"in_domain": w_in, "out_of_domain": w_out, "ratio": w_out / w_in}


def _vi_cell(args, kind, data, seed, log):
    import jax

    from experiments import metrics
    from finite import lowrank

    x_tr, y_tr, x_te, y_te = data
    model = _model(kind, args.rank)
    key = jax.random.PRNGKey(seed)
    k_init, k_fit, k_pred = jax.random.split(key, 3)
    params = model.init(k_init)
    warm = max(1, round(args.epochs * 760 / 800))
    fit = lowrank.fit(model, params, x_tr, y_tr, k_fit, likelihood="gaussian", num_epochs=args.epochs,
                      batch_size=128, learning_rate=5e-4, prior=lowrank.toy_prior(), kl_weight=1e-4,
                      warmup_epochs=warm, noise_std=NOISE, progress=not args.quiet)
    f_te = np.asarray(lowrank.predict(model, fit.params, x_te, k_pred, 200))[..., 0]  # (200, n)
    grid = np.linspace(-0.5, 1.5, 401, dtype=np.float32)[:, None]
    f_grid = np.asarray(lowrank.predict(model, fit.params, grid, jax.random.fold_in(k_pred, 1), 100))[..., 0]
    cell = {"params": model.num_params(),
            "rmse_single": metrics.rmse(y_te[:, 0], f_te[0]), "rmse_mc200": metrics.rmse(y_te[:, 0], f_te.mean(0)),
            "bands": band_widths(f_grid, grid[:, 0]), "final_loss": float(fit.history["loss"][-1]),
            "grid_mean": f_grid.mean(0).tolist(), "grid_lo": np.percentile(f_grid, 5, axis=0).tolist(),
            "grid_hi": np.percentile(f_grid, 95, axis=0).tolist()}
    log(f"{kind}: RMSE {cell['rmse_single']:.4f} / {cell['rmse_mc200']:.4f}, bands {cell['bands']}")
    return cell


def _hmc_cell(args, data, seed, out, log):
    """NUTS on the low-rank network's weights (A, B and the full-rank layers), same prior and likelihood."""
    import jax
    import jax.numpy as jnp

    from experiments import metrics
    from finite import lowrank
    from samplers import driver

    x_tr, y_tr, x_te, y_te = data
    model = _model("lowrank", args.rank)
    prior = lowrank.toy_prior()
    x, y = jnp.asarray(x_tr), jnp.asarray(y_tr)
    r = args.rank

    def weights(pos):
        return (lowrank.DenseWeights(pos["W1"], pos["b1"]), lowrank.FactorWeights(pos["A"], pos["B"], pos["b2"]),
                lowrank.DenseWeights(pos["W3"], pos["b3"]))

    def logdensity(pos):
        f = model.forward(weights(pos), x)
        loglik = jnp.sum(-0.5 * ((y - f) / NOISE) ** 2) - y.size * math.log(NOISE * math.sqrt(2 * math.pi))
        return loglik + sum(jnp.sum(prior.log_prob(v)) for v in jax.tree_util.tree_leaves(pos))

    def init(key):
        ks = jax.random.split(key, 4)
        s = lambda k, shape, scale: scale * jax.random.normal(k, shape)  # noqa: E731
        return {"W1": s(ks[0], (1, 100), 1.0), "b1": jnp.zeros(100), "A": s(ks[1], (100, r), (1 / r) ** 0.25 * 0.3),
                "B": s(ks[2], (100, r), (1 / r) ** 0.25 * 0.3), "b2": jnp.zeros(100),
                "W3": s(ks[3], (100, 1), 0.1), "b3": jnp.zeros(1)}

    grid = jnp.linspace(-0.5, 1.5, 401)[:, None]
    xt = jnp.asarray(x_te)
    functions = {"f_grid": lambda p: model.forward(weights(p), grid)[:, 0],
                 "f_test": lambda p: model.forward(weights(p), xt)[:, 0],
                 "singular_values": lambda p: jnp.linalg.svd(p["A"] @ p["B"].T, compute_uv=False)[: r + 2]}
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    # one checkpoint file per setting: the driver refuses to resume a checkpoint written with other settings
    ckpt = (f"seed{seed}_hmc_c{args.hmc_chains}_w{args.hmc_warmup}_s{args.hmc_samples}_t{args.hmc_thinning}"
            f"_d{args.hmc_max_doublings}.ckpt")
    res = driver.sample(logdensity, jax.random.PRNGKey(seed + 100), init, num_chains=args.hmc_chains,
                        num_warmup=args.hmc_warmup, num_samples=args.hmc_samples, thinning=args.hmc_thinning,
                        kernel="nuts", adaptation="window", functions=functions, keep_position=False,
                        max_num_doublings=args.hmc_max_doublings,
                        chunk=25, checkpoint=os.path.join(out, "cells", ckpt),
                        progress=not args.quiet)
    f_grid = res.draws["f_grid"].reshape(-1, grid.shape[0])
    f_test = res.draws["f_test"]
    diag = driver.diagnostics(res, keys=["f_grid"])
    sv = res.draws["singular_values"].reshape(-1, res.draws["singular_values"].shape[-1])
    pooled = f_test.reshape(-1, f_test.shape[-1])
    cell = {"params": 2 * 100 + 2 * 100 * r + 100 + 100 + 1, "chains": args.hmc_chains,
            "rmse_single": metrics.rmse(y_te[:, 0], pooled[-1]), "rmse_mc200": metrics.rmse(y_te[:, 0], pooled.mean(0)),
            "bands": band_widths(f_grid, np.asarray(grid[:, 0])), "seconds": res.seconds,
            "diagnostics": {k: v for k, v in diag.items() if np.isscalar(v)},
            "singular_values_median": np.median(sv, 0).tolist(),
            "numerical_rank": float(np.mean(np.sum(sv > 1e-6 * sv[:, :1], axis=1))),
            "grid_mean": f_grid.mean(0).tolist(), "grid_lo": np.percentile(f_grid, 5, axis=0).tolist(),
            "grid_hi": np.percentile(f_grid, 95, axis=0).tolist()}
    log(f"hmc: RMSE {cell['rmse_single']:.4f} / {cell['rmse_mc200']:.4f}, bands {cell['bands']}, "
        f"diagnostics {cell['diagnostics']}")
    return cell


def run(args) -> Report:
    if args.quick:
        args.epochs, args.hmc_chains, args.hmc_warmup, args.hmc_samples, args.hmc_thinning = 40, 2, 40, 10, 1
        args.hmc_max_doublings = 4
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    data = toy_data(args.seed)
    config = {"epochs": args.epochs, "rank": args.rank, "quick": args.quick}
    cells = {}
    for kind in ("fullrank", "lowrank"):
        path = os.path.join(args.out, "cells", f"seed{args.seed}_vi_{kind}.json")
        cells[kind] = report.cell(path, config, lambda k=kind: _vi_cell(args, k, data, args.seed, log), log=log)
    if not args.no_hmc:
        hconf = {**config, **{k: getattr(args, k) for k in ("hmc_chains", "hmc_warmup", "hmc_samples",
                                                             "hmc_thinning", "hmc_max_doublings")}}
        path = os.path.join(args.out, "cells", f"seed{args.seed}_hmc.json")
        cells["hmc"] = report.cell(path, hconf, lambda: _hmc_cell(args, data, args.seed, args.out, log), log=log)
    fig = _figure(args.out, cells, data)
    return Report(results={"config": config, "cells": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("grid")}
                                                       for k, v in cells.items()}},
                  markdown=_markdown(args, cells), figures=[fig])


def _markdown(args, cells) -> str:
    names = {"fullrank": "Full-rank BNN (VI)", "lowrank": f"Low-rank BNN, r = {args.rank} (VI)",
             "hmc": f"Low-rank BNN, r = {args.rank} (HMC)"}
    rows = []
    for k, c in cells.items():
        b = c["bands"]
        rows.append([names[k], f"{c['rmse_single']:.4f}", f"{c['rmse_mc200']:.4f}", f"{b['in_domain']:.4f}",
                     f"{b['out_of_domain']:.4f}", f"{b['ratio']:.2f}x", f"{c['params']:,}"])
        paper_key = "fullrank" if k == "fullrank" else ("lowrank" if k == "lowrank" else None)
        if paper_key:
            (s, m), (bi, bo, ratio, n) = PAPER_RMSE[paper_key], PAPER_BANDS[paper_key]
            rows.append(["  paper", f"{s}", f"{m}", f"{bi}", f"{bo}", f"{ratio:.2f}x", f"{n:,}"])
    md = [f"# Toy regression: full-rank vs low-rank BNN (singular-BNN paper Tables 19-20), seed {args.seed}", ""]
    if args.quick:
        md += [f"**Quick mode**: {args.epochs} epochs and a short HMC run; not the paper's setting.", ""]
    md += [markdown_table(["model", "RMSE single pass", "RMSE MC-200", "5-95% band in domain",
                           "5-95% band out of domain", "ratio", "parameters"], rows), "",
           "Bands: median over the grid of the width of the 5-95% band of f over 100 draws (in domain x in [0, 0.5], "
           "out of domain x in [0.5, 1.5]); the test RMSE is dominated by the extrapolated third of the test range."]
    if "hmc" in cells:
        d = cells["hmc"]["diagnostics"]
        sv = cells["hmc"]["singular_values_median"]
        md += ["", f"HMC: {cells['hmc']['chains']} NUTS chains, {cells['hmc']['seconds']:.0f} s; "
               f"max R-hat of f on the grid {d.get('rhat_f_grid', float('nan')):.3f}, min bulk ESS "
               f"{d.get('ess_bulk_f_grid', float('nan')):.0f}; acceptance {d.get('acceptance', float('nan')):.2f}, "
               f"divergences {d.get('divergences', 'n/a')}. Median singular values of the sampled A B^T: "
               + ", ".join(f"{v:.3g}" for v in sv) + f" (numerical rank {cells['hmc']['numerical_rank']:.1f})."]
    return "\n".join(md)


def _figure(out, cells, data) -> str:
    import matplotlib.pyplot as plt

    x_tr, y_tr, _, _ = data
    grid = np.linspace(-0.5, 1.5, 401)
    fig, axes = plt.subplots(1, len(cells), figsize=(4 * len(cells), 3.2), sharey=True, squeeze=False)
    for ax, (k, c) in zip(axes[0], cells.items()):
        ax.plot(x_tr[:, 0], y_tr[:, 0], ".", ms=1, color="0.6")
        ax.plot(grid, c["grid_mean"], "C0")
        ax.fill_between(grid, c["grid_lo"], c["grid_hi"], color="C0", alpha=0.3)
        ax.set_title(k, fontsize=9)
        ax.set_ylim(-1.5, 2.5)
        ax.axvspan(*OUT_OF_DOMAIN, color="C3", alpha=0.05)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    name = "lowrank_toy_bands.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
