"""SVGP against SVTP with a categorical (softmax) likelihood, clean, shifted and out-of-distribution
(scale-mixture paper section 4.4, Appendices C-D, Table 2; notes sections 2.3 and 3.4).

Protocol (``--dataset digits`` by default: scikit-learn's 1,797 8 x 8 images, the registry's stratified
1,347 / 450 split; a registered image set such as ``mnist`` where its files are present):

* a stratified tenth of the training images is held out for validation (plateau learning-rate reduction and
  early stopping on its NLL); the test images are used only to score;
* kernel: the NNGP of ``depth x [Conv(3 x 3, SAME) + ReLU] + Flatten + Dense`` (the authors' code: depth 4),
  ``W_std`` and ``b_std`` per layer trained with the variational parameters (`smnngp.stax.parametric_kernel`),
  initial ``W_std = sqrt 2``, ``b_std = 0.1``, readout ``W_std = 1`` (trained for the SVGP; fixed for the SVTP,
  whose sigma^2 is that amplitude);
* M inducing inputs from class-stratified training images (paper 400; ``--num-inducing``), trained;
  full-covariance whitened q(u); Adam(``--lr``) on minibatches of ``--batch``;
* SVTP: one sigma^2 ~ InvGamma(2, 2) shared across classes, q(sigma^2) = InvGamma(a, b);
* variants: ``clean`` (tested on the clean test set, on every shift of `experiments.shifts` at ``--severity``
  and, for the NLL-against-severity figure, on ``--sweep`` shifts at severities 1-5) and ``ood`` (classes 1, 4,
  8 removed from training, tested on the full test set; the AUROC of the predictive entropy for telling the
  removed classes from the others is reported too).

Metrics: accuracy, NLL = -mean log p(y | x) of the Monte-Carlo predictive (the paper's Table 2 prints it x 100),
Brier score, ECE (15 equal-width bins; equal-mass in results.json). Every (seed, variant, model) is a resumable
cell in ``OUT/cells``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from experiments import report
from experiments.report import Report, markdown_table

DESCRIPTION = "SVGP vs SVTP (softmax likelihood) on digits: clean, shifted, OOD; calibration (paper Table 2)"

MODELS = ("svgp", "svtp", "svtp-pinned")
OOD_CLASSES = (1, 4, 8)
# our test-set names beside the paper's Table 2 rows (MNIST family)
PAPER_ROWS = {"clean": "MNIST", "shot-noise": "MNIST + Shot", "impulse-noise": "MNIST + Impulse",
              "glass-blur": "MNIST + Glass Blur", "ood": "MNIST w. OOD"}


def add_arguments(parser):
    from experiments.shifts import IMAGE_SHIFTS

    parser.add_argument("--dataset", default="digits", help="image set of the data registry (default digits)")
    parser.add_argument("--num-inducing", type=int, default=200, help="inducing points M (paper 400; default 200)")
    parser.add_argument("--depth", type=int, default=4, help="convolutional layers of the kernel (default 4)")
    parser.add_argument("--steps", type=int, default=4000, help="maximum optimisation steps (default 4000)")
    parser.add_argument("--batch", type=int, default=100, help="minibatch size (default 100)")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    parser.add_argument("--severity", type=int, default=3, help="severity of the test shifts, 1..5 (default 3)")
    parser.add_argument("--shifts", nargs="*", default=list(IMAGE_SHIFTS), help="test shifts (default all)")
    parser.add_argument("--sweep", nargs="*", default=["shot-noise", "glass-blur"],
                        help="shifts evaluated at every severity 1..5 for the NLL-against-severity figure")
    parser.add_argument("--seeds", type=int, default=3, help="initialisations / validation splits (default 3)")
    parser.add_argument("--num-samples", type=int, default=500, help="Monte-Carlo draws of the predictive")
    parser.add_argument("--variants", nargs="*", default=["clean", "ood"], choices=["clean", "ood"],
                        help="training variants (default both; quick mode: clean)")
    parser.add_argument("--models", nargs="*", default=["svgp", "svtp"], choices=list(MODELS),
                        help="svgp, svtp (readout W_std pinned: sigma^2 is the amplitude), svtp-pinned (every W_std "
                             "pinned, only b_std trained); default svgp svtp")


def _scores(probs, labels):
    from experiments import metrics

    probs = np.asarray(probs, np.float64)
    probs = probs / probs.sum(1, keepdims=True)
    conf, acc, count = metrics.calibration_bins(probs, labels)
    return {"accuracy": metrics.accuracy(probs, labels), "nll": metrics.categorical_nll(probs, labels),
            "brier": metrics.brier_score(probs, labels), "ece": metrics.expected_calibration_error(probs, labels),
            "ece_equal_mass": metrics.expected_calibration_error(probs, labels, binning="equal-mass"),
            "reliability": {"confidence": conf, "accuracy": acc, "count": count}}


def _split_validation(y, seed):
    from experiments.data import stratified_split

    tr, val = stratified_split(y, max(1, len(y) // 10), seed)
    return np.sort(tr), np.sort(val)


def _run_cell(args, data, seed, variant, model_name, log):
    import jax
    import jax.numpy as jnp

    from experiments import metrics
    from experiments.shifts import apply_shift, remove_classes
    from smnngp import variational as vi

    x_tr, y_tr = data.x_train, np.asarray(data.y_train)
    if variant == "ood":
        x_tr, y_tr = remove_classes(x_tr, y_tr, OOD_CLASSES)
    tr, val = _split_validation(y_tr, seed)
    x_te, y_te = data.x_test, np.asarray(data.y_test)
    C = data.num_classes
    key = jax.random.PRNGKey(seed)
    k_z, k_fit, k_pred = jax.random.split(key, 3)
    x_fit = jnp.asarray(x_tr[tr], jnp.float64)
    Z = vi.stratified_inducing(x_fit, y_tr[tr], min(args.num_inducing, len(tr)), k_z)
    build = vi.svgp if model_name == "svgp" else vi.svtp
    from smnngp.models import cnn_kernel

    kernel = cnn_kernel(args.depth, train_amplitude=model_name == "svgp", pin_weights=model_name == "svtp-pinned")
    model = build(kernel, vi.Softmax(C), Z)
    t0 = time.perf_counter()
    fit = vi.fit(model, vi.init(model), x_fit, jnp.asarray(y_tr[tr]), key=k_fit, learning_rate=args.lr,
                 batch_size=min(args.batch, len(tr)), num_steps=args.steps,
                 x_val=jnp.asarray(x_tr[val], jnp.float64), y_val=jnp.asarray(y_tr[val]),
                 stop_patience=10, progress=not args.quiet)
    seconds = time.perf_counter() - t0

    def probs(x):
        return np.asarray(vi.predict(model, fit.params, jnp.asarray(x, jnp.float64), key=k_pred,
                                     num_samples=args.num_samples).probs)

    tests = {"clean": x_te}
    if variant == "clean":
        tests.update({s: apply_shift(s, x_te, args.severity, seed=seed) for s in args.shifts})
    cell = {"train_seconds": seconds, "steps": fit.history[-1]["step"] if fit.history else 0,
            "best_step": int(fit.best_step), "best_val_nll": float(fit.best_val_nll), "elbo_per_point":
            float(fit.posterior.log_marginal_likelihood) / len(tr), "tests": {}}
    for name, x in tests.items():
        p = probs(x)
        cell["tests"][name if variant == "clean" else "ood"] = _scores(p, y_te)
        if variant == "ood":
            removed = np.isin(y_te, OOD_CLASSES)
            cell["tests"]["ood"]["auroc_entropy"] = metrics.ood_auroc(metrics.predictive_entropy(p), removed)
    if variant == "clean":
        cell["sweep"] = {s: [_scores(probs(apply_shift(s, x_te, sev, seed=seed)), y_te)["nll"]
                             for sev in range(1, 6)] for s in args.sweep}
    if model_name != "svgp":
        q = vi.scale_posterior(model, fit.params)
        cell["q_sigma2"] = {"mean": float(q.mean), "a": float(q.concentration), "b": float(q.rate)}
    log(f"seed {seed} {variant} {model_name}: {cell['steps']} steps in {seconds:.0f} s, clean NLL "
        f"{cell['tests']['clean' if variant == 'clean' else 'ood']['nll']:.4f}")
    return cell


def run(args) -> Report:
    import jax

    from experiments.data import load_images

    jax.config.update("jax_enable_x64", True)
    if args.quick:
        args.num_inducing, args.depth, args.steps, args.seeds, args.num_samples = 30, 1, 60, 1, 50
        args.shifts, args.sweep, args.variants = args.shifts[:1], args.sweep[:1], ["clean"]
    if not 1 <= args.severity <= 5:
        raise ValueError(f"--severity must be in 1..5, got {args.severity}")
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    data = load_images(args.dataset)
    if args.quick:  # a few hundred images
        data = data._replace(x_train=data.x_train[:400], y_train=data.y_train[:400], x_test=data.x_test[:150],
                             y_test=data.y_test[:150])
    config = {k: getattr(args, k) for k in ("dataset", "num_inducing", "depth", "steps", "batch", "lr", "severity",
                                             "shifts", "sweep", "num_samples", "quick", "variants")}
    cells = {}
    for seed in range(args.seed, args.seed + args.seeds):
        for variant in args.variants:
            for m in args.models:
                path = os.path.join(args.out, "cells", f"seed{seed}_{variant}_{m}.json")
                cells[(seed, variant, m)] = report.cell(
                    path, config, lambda s=seed, v=variant, mm=m: _run_cell(args, data, s, v, mm, log), log=log)
    summary = _summarise(cells)
    figs = [_reliability_figure(args.out, cells, args.seed), _sweep_figure(args.out, cells, args.sweep)]
    md = _markdown(args, summary, cells)
    md += "\n\n" + "\n".join(f"![{f}]({f})" for f in figs) + "\n"
    return Report(results={"config": config, "summary": summary,
                           "cells": {f"seed{s}_{v}_{m}": c for (s, v, m), c in cells.items()}},
                  markdown=md, figures=figs)


def _summarise(cells):
    from experiments.metrics import mean_se

    acc = {}
    for (_, _, m), cell in cells.items():
        for test, sc in cell["tests"].items():
            for k, v in sc.items():
                if k != "reliability":
                    acc.setdefault(test, {}).setdefault(m, {}).setdefault(k, []).append(v)
    return {t: {m: {k: mean_se(v) for k, v in d.items()} | {"seeds": len(d["nll"])} for m, d in per.items()}
            for t, per in acc.items()}


def _markdown(args, summary, cells):
    from experiments.paper_tables import TABLE2

    rows = []
    for test, per in summary.items():
        if "svgp" not in per or "svtp" not in per:
            continue
        g, t = per["svgp"], per["svtp"]
        row = [test]
        for m in (g, t):
            row += [f"{100 * m['nll'][0]:.2f} ± {100 * m['nll'][1]:.2f}",
                    f"{100 * m['accuracy'][0]:.2f} ± {100 * m['accuracy'][1]:.2f}",
                    f"{m['ece'][0]:.3f}"]
        row += [f"{t['auroc_entropy'][0]:.3f} / {g['auroc_entropy'][0]:.3f}" if "auroc_entropy" in t else "",
                g["seeds"]]
        rows.append(row)
        paper = TABLE2.get(PAPER_ROWS.get(test, ""))
        if paper is not None:
            (gn, gns), (ga, gas), (tn, tns), (ta, tas) = paper
            rows.append([f"  paper: {PAPER_ROWS[test]}", f"{gn} ± {gns}", f"{ga} ± {gas}", "", f"{tn} ± {tns}",
                         f"{ta} ± {tas}", "", "", ""])
    header = ["test set", "SVGP NLL x100", "SVGP acc (%)", "SVGP ECE", "SVTP NLL x100", "SVTP acc (%)", "SVTP ECE",
              "OOD AUROC SVTP / SVGP", "seeds"]
    steps = [c["steps"] for c in cells.values()]
    secs = [c["train_seconds"] for c in cells.values()]
    md = [f"# SVGP vs SVTP on {args.dataset} (paper Table 2)", ""]
    if args.quick:
        md += ["**Quick mode**: a few hundred images, M = 30, one conv layer, 60 steps: not the paper's setting.", ""]
    md += [markdown_table(header, rows), "",
           f"Kernel: {args.depth} x [Conv 3x3 + ReLU] + Flatten + Dense NNGP, W_std/b_std trained; M = "
           f"{args.num_inducing} inducing images; Adam({args.lr}), batch {args.batch}, at most {args.steps} steps with "
           f"early stopping on a validation tenth ({min(steps)}-{max(steps)} steps run, {np.mean(secs):.0f} s per "
           f"model on average); shifts at severity {args.severity}; mean ± standard error over seeds; ECE with 15 "
           "equal-width bins. The OOD row is the model trained without classes 1, 4, 8 and tested on all classes "
           "(AUROC: predictive entropy separating the removed classes). Paper rows: MNIST (60,000 images, M = 400): "
           "compare the ordering of SVGP and SVTP, not the values."]
    pinned = [[test, f"{100 * p['nll'][0]:.2f} ± {100 * p['nll'][1]:.2f}",
               f"{100 * p['accuracy'][0]:.2f} ± {100 * p['accuracy'][1]:.2f}", f"{p['ece'][0]:.3f}", p["seeds"]]
              for test, per in summary.items() if (p := per.get("svtp-pinned")) is not None]
    if pinned:
        md += ["", "SVTP with every W_std pinned at its start (only b_std trained), so that sigma^2 alone carries "
               "the kernel's amplitude:", "",
               markdown_table(["test set", "NLL x100", "acc (%)", "ECE", "seeds"], pinned)]
    return "\n".join(md)


def _reliability_figure(out, cells, seed):
    import matplotlib.pyplot as plt

    clean = next((c["tests"] for (s, v, _), c in cells.items() if s == seed and v == "clean"), {})
    tests = [t for t in ("clean", "shot-noise", "glass-blur") if t in clean]
    tests += ["ood"] if any(s == seed and v == "ood" for (s, v, _) in cells) else []
    fig, axes = plt.subplots(1, len(tests), figsize=(3 * len(tests), 3), squeeze=False)
    for ax, test in zip(axes[0], tests):
        variant = "ood" if test == "ood" else "clean"
        for m, style in (("svgp", "o-"), ("svtp", "s--"), ("svtp-pinned", "^:")):
            if (seed, variant, m) not in cells:
                continue
            rel = cells[(seed, variant, m)]["tests"][test]["reliability"]
            ax.plot(rel["confidence"], rel["accuracy"], style, ms=3, label=m)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_title(test, fontsize=9)
        ax.set_xlabel("confidence")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    name = "svtp_reliability.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name


def _sweep_figure(out, cells, sweep):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    for shift in sweep:
        for m, style in (("svgp", "o-"), ("svtp", "s--"), ("svtp-pinned", "^:")):
            runs = [c["sweep"][shift] for (s, v, mm), c in cells.items() if v == "clean" and mm == m]
            if not runs:
                continue
            ax.plot(range(1, 6), np.mean(runs, 0), style, ms=3, label=f"{m} {shift}")
    ax.set_xlabel("severity")
    ax.set_ylabel("test NLL")
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "svtp_nll_by_severity.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
