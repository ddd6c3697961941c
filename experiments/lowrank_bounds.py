"""Bounds against rank from trained networks (singular-BNN paper Sec. 3.3-3.5, Figures 1 and 3; notes section 5),
on digits so it runs anywhere.

1. Singular-value decay: a deterministic MLP ``64-H-H-10`` (ReLU) is trained; for its hidden ``H x H`` matrix we
   report the singular values, the Eckart-Young-Mirsky tail energy ``sum_{i>r} sigma_i^2`` and energy retention
   against rank, and the loss bound of Thm 3.6 with the cross-entropy's Lipschitz constant sqrt(2) (Table 5)
   and ``R`` the largest norm of the hidden layer's inputs on the training set.
2. Rank sweep: the same network with its hidden matrix low-rank (``A B^T``, mean-field Gaussian factors) is
   trained variationally at each rank of ``--ranks``, and once full-rank (mean-field BBB); for each we report the
   training 0/1 error (the bounded loss, in [0, 1]), the test accuracy, ``C_max`` (the largest per-coordinate
   ``KL(q_i || p)`` over the hidden layer's factors, `finite.lowrank_theory.coordinate_kl`), the PAC-Bayes bound
   of Thm D.4 with delta = 0.05 (`pac_bayes_rank_curve`), the complexity ratio sqrt(r (m + n) / (m n)) and the
   Gaussian-complexity bound of Thm E.17 with Maurer's constant set to 1 (so only its trend in r is meaningful).
3. Induced covariance (Figure 1): the closed-form correlation of ``vec(W)`` for a trained low-rank layer's top-left
   8 x 8 block, beside the diagonal of the mean-field one.
"""

from __future__ import annotations

import os

import numpy as np

from experiments import report
from experiments.report import Report, markdown_table

DESCRIPTION = "tail energy, PAC-Bayes and Gaussian-complexity bounds against rank from trained networks " \
              "(singular-BNN paper Figures 1 and 3)"


def add_arguments(parser):
    parser.add_argument("--hidden", type=int, default=256, help="hidden width H (default 256)")
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--epochs", type=int, default=60, help="training epochs per model (default 60)")


def _data(quick):
    from experiments.data import load_images

    d = load_images("digits")
    x_tr = d.x_train.reshape(len(d.x_train), -1).astype(np.float32)
    x_te = d.x_test.reshape(len(d.x_test), -1).astype(np.float32)
    y_tr, y_te = np.asarray(d.y_train), np.asarray(d.y_test)
    if quick:
        x_tr, y_tr, x_te, y_te = x_tr[:400], y_tr[:400], x_te[:150], y_te[:150]
    return x_tr, y_tr, x_te, y_te


def _train(model, x, y, key, epochs, bayes, progress):
    from finite import lowrank

    return lowrank.fit(model, model.init(key), x, y, key, likelihood="categorical", num_epochs=epochs,
                       batch_size=128, learning_rate=1e-3, prior=lowrank.ScaleMixturePrior() if bayes else None,
                       kl_weight=1.0 if bayes else 0.0, warmup_epochs=min(20, epochs), progress=progress)


def _decay(args, data, seed):
    """Part 1: the deterministic network's hidden matrix."""
    import jax

    from finite import lowrank
    from finite import lowrank_theory as th

    x_tr, y_tr, x_te, y_te = data
    H = args.hidden
    model = lowrank.mlp((x_tr.shape[1], H, H, 10), "deterministic")
    fit = _train(model, x_tr, y_tr, jax.random.PRNGKey(seed), args.epochs, False, not args.quiet)
    W = np.asarray(fit.params[1].W, np.float64)
    h1 = np.asarray(jax.nn.relu(x_tr @ np.asarray(fit.params[0].W) + np.asarray(fit.params[0].b)))
    radius = float(np.max(np.linalg.norm(h1, axis=1)))
    ranks = np.array(sorted({r for r in args.ranks if r <= H} | {H}))
    acc = float(np.mean(np.argmax(np.asarray(model.apply(fit.params, x_te)), 1) == y_te))
    return {"singular_values": th.singular_values(W).tolist(), "ranks": ranks.tolist(),
            "tail_energy": th.tail_energy(W, ranks).tolist(),
            "energy_retention": th.energy_retention(W, ranks).tolist(),
            "eym_bound": th.eym_loss_bound(W, ranks, th.LIPSCHITZ["cross_entropy"], radius).tolist(),
            "radius": radius, "test_accuracy": acc}


def _rank_cell(args, data, seed, rank):
    """Part 2: one model of the sweep (``rank = 0``: full-rank BBB hidden layer)."""
    import jax

    from finite import lowrank
    from finite import lowrank_theory as th

    x_tr, y_tr, x_te, y_te = data
    H = args.hidden
    sizes = (x_tr.shape[1], H, H, 10)
    if rank:
        model = lowrank.mlp(sizes, ("bbb", "lowrank", "bbb"), rank=(None, rank, None))
    else:
        model = lowrank.mlp(sizes, "bbb")
    fit = _train(model, x_tr, y_tr, jax.random.PRNGKey(seed + 17), args.epochs, True, not args.quiet)
    key = jax.random.PRNGKey(seed + 99)
    probs_tr = np.asarray(jax.nn.softmax(lowrank.predict(model, fit.params, x_tr, key, 20), -1)).mean(0)
    probs_te = np.asarray(jax.nn.softmax(lowrank.predict(model, fit.params, x_te, key, 20), -1)).mean(0)
    hidden = fit.params[1]
    prior = lowrank.ScaleMixturePrior()
    factors = [hidden.A, hidden.B] if rank else [hidden.W]
    c_max = max(float(np.max(th.coordinate_kl(np.asarray(f.mu, np.float64),
                                              np.asarray(jax.nn.softplus(f.rho), np.float64), prior)))
                for f in factors)
    if rank:
        mean_w = np.asarray(hidden.A.mu, np.float64) @ np.asarray(hidden.B.mu, np.float64).T
    else:
        mean_w = np.asarray(hidden.W.mu, np.float64)
    spectral = [th.spectral_norm(np.asarray(p.W.mu if hasattr(p, "W") else p.A.mu @ p.B.mu.T, np.float64))
                for p in fit.params]
    x_fro = float(np.linalg.norm(x_tr))
    w1_fro = float(np.linalg.norm(np.asarray(fit.params[0].W.mu)))
    gc = th.gaussian_complexity_bound(x_fro, len(x_tr), w1_fro, (H, H, 10), (H, rank or H, 10), spectral)
    cell = {"rank": rank, "train_error": float(np.mean(np.argmax(probs_tr, 1) != y_tr)),
            "test_accuracy": float(np.mean(np.argmax(probs_te, 1) == y_te)), "c_max": c_max,
            "gaussian_complexity": float(gc), "params": model.num_params(),
            "mean_singular_values": th.singular_values(mean_w)[: max(rank, 1) + 2].tolist()}
    if rank and rank <= 16:  # Figure 1: closed-form correlation of the 8 x 8 top-left block of W
        sl = slice(0, 8)
        var = lambda f: np.asarray(jax.nn.softplus(f.rho), np.float64)[sl] ** 2  # noqa: E731
        cov = th.lowrank_weight_covariance(np.asarray(hidden.A.mu, np.float64)[sl], var(hidden.A),
                                           np.asarray(hidden.B.mu, np.float64)[sl], var(hidden.B))
        cell["correlation_block"] = th.covariance_to_correlation(cov).tolist()
    return cell


def run(args) -> Report:
    from finite import lowrank_theory as th

    if args.quick:
        args.hidden, args.ranks, args.epochs = 32, [1, 4, 16], 3
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    data = _data(args.quick)
    config = {"hidden": args.hidden, "epochs": args.epochs, "quick": args.quick}
    cdir = os.path.join(args.out, "cells")
    decay = report.cell(os.path.join(cdir, f"seed{args.seed}_decay.json"), config,
                        lambda: _decay(args, data, args.seed), log=log)
    sweep = {}
    for r in [r for r in args.ranks if r < args.hidden] + [0]:
        sweep[r] = report.cell(os.path.join(cdir, f"seed{args.seed}_rank{r}.json"), config,
                               lambda rr=r: _rank_cell(args, data, args.seed, rr), log=log)
        log(f"rank {r or 'full'}: train error {sweep[r]['train_error']:.4f}, test accuracy "
            f"{sweep[r]['test_accuracy']:.4f}, C_max {sweep[r]['c_max']:.3g}")
    ranks = [r for r in sweep if r]
    n_train, H = len(data[0]), args.hidden
    curve = th.pac_bayes_rank_curve(ranks, H, H, {"lowrank": [sweep[r]["train_error"] for r in ranks],
                                                  "full": sweep[0]["train_error"]},
                                    max(sweep[r]["c_max"] for r in ranks), n_train,
                                    c_max_full=sweep[0]["c_max"])
    results = {"config": config, "decay": decay, "sweep": {str(k): v for k, v in sweep.items()},
               "pac_bayes": {k: np.asarray(v).tolist() for k, v in curve.items()},
               "critical_rank": th.critical_rank(ranks, curve["lowrank"])}
    figs = _figures(args.out, decay, sweep, curve, ranks)
    return Report(results=results, markdown=_markdown(args, decay, sweep, curve, ranks, results["critical_rank"]),
                  figures=figs)


def _markdown(args, decay, sweep, curve, ranks, r_star) -> str:
    rows = []
    for i, r in enumerate(ranks):
        s = sweep[r]
        bound, ratio = np.asarray(curve["lowrank"])[i], np.asarray(curve["ratio"])[i]
        rows.append([r, f"{s['params']:,}", f"{s['train_error']:.4f}", f"{s['test_accuracy']:.4f}",
                     f"{s['c_max']:.3g}", f"{bound:.3f}", f"{ratio:.3f}", f"{s['gaussian_complexity']:.3g}"])
    f = sweep[0]
    full_bound = float(np.asarray(curve["full"]).ravel()[0])
    rows.append(["full (BBB)", f"{f['params']:,}", f"{f['train_error']:.4f}", f"{f['test_accuracy']:.4f}",
                 f"{f['c_max']:.3g}", f"{full_bound:.3f}", "1", f"{f['gaussian_complexity']:.3g}"])
    dec = [[r, f"{t:.4g}", f"{e:.4f}", f"{b:.4g}"] for r, t, e, b in
           zip(decay["ranks"], decay["tail_energy"], decay["energy_retention"], decay["eym_bound"])]
    md = [f"# Bounds against rank on digits (hidden width {args.hidden})", ""]
    if args.quick:
        md += ["**Quick mode**: hidden width 32, 3 epochs.", ""]
    md += ["Rank sweep of the hidden matrix (the other layers mean-field full-rank):", "",
           markdown_table(["rank", "params", "train 0/1 error", "test accuracy", "C_max", "PAC-Bayes bound",
                           "complexity ratio", "Gaussian complexity (c0 = 1)"], rows), "",
           "PAC-Bayes (Thm D.4, delta = 0.05, N = training images): "
           + (f"the bound stays below 1 (non-vacuous) up to rank {r_star}." if r_star is not None else
              "no rank gives a non-vacuous bound (below 1) here.")
           + f" The ratio column is sqrt(r (m + n) / (m n)) for m = n = {args.hidden}.", "",
           f"Singular values of the deterministic network's hidden matrix (test accuracy "
           f"{decay['test_accuracy']:.4f}); Thm 3.6 with L = sqrt(2), R = {decay['radius']:.3g}:", "",
           markdown_table(["rank", "tail energy", "energy retained", "EYM loss bound"], dec)]
    return "\n".join(md)


def _figures(out, decay, sweep, curve, ranks):
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
    sv = np.asarray(decay["singular_values"])
    axes[0].semilogy(np.arange(1, sv.size + 1), sv, ".-", ms=3)
    axes[0].set_xlabel("index")
    axes[0].set_ylabel("singular value")
    axes[0].set_title("hidden matrix, deterministic", fontsize=9)
    axes[1].plot(ranks, curve["lowrank"], "o-", label="low-rank")
    axes[1].axhline(float(np.asarray(curve["full"]).ravel()[0]), color="C3", ls="--", label="full-rank")
    axes[1].axhline(1.0, color="k", lw=0.8, ls=":")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("rank")
    axes[1].set_ylabel("PAC-Bayes bound")
    axes[1].legend(fontsize=8)
    corr = next((np.asarray(s["correlation_block"]) for s in sweep.values() if "correlation_block" in s), None)
    if corr is not None:
        im = axes[2].imshow(corr, cmap="RdBu_r", vmin=-1, vmax=1)
        axes[2].set_title("corr(vec W), 8 x 8 block, low-rank", fontsize=9)
        fig.colorbar(im, ax=axes[2], fraction=0.046)
    fig.tight_layout()
    name = "lowrank_bounds.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return [name]
