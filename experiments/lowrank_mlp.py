"""The singular-BNN paper's MNIST protocol (App. I.1-I.2; Tables 14-18; notes sections 3.4-3.5) on any image set
of the data registry: scikit-learn's digits by default (runs anywhere), MNIST / Fashion-MNIST when present.

Protocol as the paper states it: MLP ``d-1200-1200-10`` (ReLU, linear logits); models full-rank BBB (mean-field
Gaussian weights, deterministic biases), low-rank Gaussian and low-rank Laplace (hidden rank 25, output rank 10,
deterministic biases), rank-1 multiplicative; prior ``0.5 N(0, 1) + 0.5 N(0, e^-12)``; KL scale ``1 / N_train``
ramped linearly over the first 20 epochs; Adam(1e-3), batch 128, 50 epochs, one run per seed; predictions from
T = 50 weight draws. Metrics: accuracy, NLL, Brier (per class, the paper's scale), ECE with 15 equal-mass bins
(the paper's main column) and the binning variants of Table 16, mean mutual information. Images are flattened
and scaled to [0, 1] (the paper divides MNIST by 126; we keep the registry's [0, 1]). Table 14's parameter counts
are computed in closed form for the 784-input network whatever the data set.
"""

from __future__ import annotations

import os
import time

import numpy as np

from experiments import report
from experiments.report import Report, markdown_table

DESCRIPTION = "full-rank vs low-rank (Gaussian, Laplace) vs rank-1 Bayesian MLPs, MNIST protocol " \
              "(singular-BNN paper Tables 14-18)"

MODELS = ("bbb", "lowrank-gaussian", "lowrank-laplace", "rank1")
NAMES = {"bbb": "Full-Rank BBB", "lowrank-gaussian": "Low-Rank Gaussian", "lowrank-laplace": "Low-Rank Laplace",
         "rank1": "Rank-1 Multiplicative"}
PAPER_PARAMS = {"bbb": 4_788_010, "lowrank-gaussian": 245_810, "lowrank-laplace": 245_810, "rank1": 2_406_398}
# Table 15 (MNIST) and Table 17 (Fashion-MNIST): accuracy %, NLL, Brier, ECE (EM 15), MI
PAPER = {"mnist": {"bbb": (98.15, 0.0795, 0.0048, 0.0082, 0.1243), "lowrank-gaussian": (97.32, 0.0924, 0.0059,
                                                                                         0.0104, 0.0956),
                   "lowrank-laplace": (97.21, 0.0607, 0.0043, 0.0117, 0.0823),
                   "rank1": (98.21, 0.1156, 0.0071, 0.0187, 0.2104)},
         "fashion-mnist": {"bbb": (89.21, 0.3583, 0.1591, 0.0262, 0.0317),
                           "lowrank-gaussian": (88.69, 0.3186, 0.1623, 0.0114, 0.0354),
                           "lowrank-laplace": (87.70, 0.3421, 0.1755, 0.0135, 0.0404),
                           "rank1": (89.07, 0.6928, 0.1846, 0.0794, 0.0038)}}
ECE_VARIANTS = (("equal-mass", 15), ("equal-width", 15), ("equal-mass", 10), ("equal-width", 30))


def add_arguments(parser):
    parser.add_argument("--dataset", default="digits", help="image set of the data registry (default digits)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--epochs", type=int, default=50, help="epochs (paper 50)")
    parser.add_argument("--hidden", type=int, default=1200, help="hidden width (paper 1200)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (paper: one run, seed 42)")
    parser.add_argument("--num-samples", type=int, default=50, help="weight draws at test time (paper 50)")


def build(model: str, d_in: int, hidden: int = 1200, num_classes: int = 10):
    """The paper's network for ``model`` (one of `MODELS`) with ``d_in`` inputs."""
    from finite import lowrank

    sizes = (d_in, hidden, hidden, num_classes)
    if model == "bbb":
        return lowrank.mlp(sizes, "bbb", bias="deterministic")
    if model == "rank1":
        return lowrank.mlp(sizes, "rank1", bias="deterministic")
    family = model.split("-")[1]
    return lowrank.mlp(sizes, "lowrank", rank=(25, 25, 10), bias="deterministic", family=family)


def _cell(args, data, seed, model_name, log):
    import jax
    import jax.numpy as jnp

    from experiments import metrics
    from finite import lowrank

    x_tr = data.x_train.reshape(data.x_train.shape[0], -1).astype(np.float32)
    x_te = data.x_test.reshape(data.x_test.shape[0], -1).astype(np.float32)
    model = build(model_name, x_tr.shape[1], args.hidden, data.num_classes)
    key = jax.random.PRNGKey(seed)
    k_init, k_fit, k_pred = jax.random.split(key, 3)
    t0 = time.perf_counter()
    fit = lowrank.fit(model, model.init(k_init), x_tr, np.asarray(data.y_train), k_fit, likelihood="categorical",
                      num_epochs=args.epochs, batch_size=128, learning_rate=1e-3,
                      prior=lowrank.ScaleMixturePrior(0.5, 1.0, float(np.exp(-6.0))), kl_weight=1.0,
                      warmup_epochs=min(20, args.epochs), progress=not args.quiet)
    seconds = time.perf_counter() - t0
    logits = lowrank.predict(model, fit.params, jnp.asarray(x_te), k_pred, args.num_samples, batch_size=10)
    sample_probs = np.asarray(jax.nn.softmax(logits.astype(jnp.float64), axis=-1))
    probs = sample_probs.mean(0)
    probs = probs / probs.sum(1, keepdims=True)
    y = np.asarray(data.y_test)
    cell = {"params": model.num_params(), "train_seconds": seconds, "accuracy": metrics.accuracy(probs, y),
            "nll": metrics.categorical_nll(probs, y), "brier_per_class": metrics.brier_score(probs, y) / probs.shape[1],
            "mi": float(np.mean(metrics.mutual_information(sample_probs))),
            "ece": {f"{b}-{n}": metrics.expected_calibration_error(probs, y, n, b) for b, n in ECE_VARIANTS}}
    log(f"seed {seed} {model_name}: accuracy {cell['accuracy']:.4f}, NLL {cell['nll']:.4f} ({seconds:.0f} s)")
    return cell


def run(args) -> Report:
    from experiments.data import load_images

    data = load_images(args.dataset)
    if args.quick:
        args.epochs, args.hidden, args.seeds, args.num_samples = 3, 100, 1, 5
        data = data._replace(x_train=data.x_train[:512], y_train=data.y_train[:512], x_test=data.x_test[:200],
                             y_test=data.y_test[:200])
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    config = {k: getattr(args, k) for k in ("dataset", "epochs", "hidden", "num_samples", "quick")}
    cells = {}
    for seed in range(args.seed, args.seed + args.seeds):
        for m in args.models:
            path = os.path.join(args.out, "cells", f"seed{seed}_{m}.json")
            cells[(seed, m)] = report.cell(path, config, lambda s=seed, mm=m: _cell(args, data, s, mm, log), log=log)
    counts = {m: build(m, 784).num_params() for m in MODELS}
    summary = _summarise(cells)
    return Report(results={"config": config, "summary": summary, "mnist_param_counts": counts,
                           "cells": {f"seed{s}_{m}": c for (s, m), c in cells.items()}},
                  markdown=_markdown(args, summary, counts))


def _summarise(cells):
    from experiments.metrics import mean_se

    acc = {}
    for (_, m), c in cells.items():
        d = acc.setdefault(m, {"params": c["params"]})
        for k in ("accuracy", "nll", "brier_per_class", "mi"):
            d.setdefault(k, []).append(c[k])
        for k, v in c["ece"].items():
            d.setdefault(f"ece_{k}", []).append(v)
    return {m: {k: (v if k == "params" else mean_se(v)) for k, v in d.items()} | {"seeds": len(d["nll"])}
            for m, d in acc.items()}


def _markdown(args, summary, counts) -> str:
    paper = PAPER.get(args.dataset, PAPER["mnist"])
    rows = []
    for m in MODELS:
        if m not in summary:
            continue
        s = summary[m]
        f = lambda k, scale=1.0, d=4: f"{scale * s[k][0]:.{d}f} ± {scale * s[k][1]:.{d}f}"  # noqa: E731
        rows.append([NAMES[m], f("accuracy", 100, 2), f("nll"), f("brier_per_class"), f("ece_equal-mass-15"),
                     f("mi"), f"{s['params']:,}", s["seeds"]])
        p = paper[m]
        rows.append([f"  paper ({'Fashion-MNIST' if args.dataset == 'fashion-mnist' else 'MNIST'})", p[0], p[1], p[2],
                     p[3], p[4], "", ""])
    ece_rows = [[NAMES[m]] + [f"{summary[m][f'ece_{b}-{n}'][0]:.4f}" for b, n in ECE_VARIANTS]
                for m in MODELS if m in summary]
    count_rows = [[NAMES[m], f"{counts[m]:,}", f"{PAPER_PARAMS[m]:,}", "✓" if counts[m] == PAPER_PARAMS[m] else "✗",
                   f"{counts['bbb'] / counts[m]:.1f}x"] for m in MODELS]
    md = [f"# MNIST protocol on {args.dataset} (singular-BNN paper Tables 14-18)", ""]
    if args.quick:
        md += ["**Quick mode**: 512 images, hidden width 100, 3 epochs: not the paper's setting.", ""]
    md += [markdown_table(["model", "accuracy (%)", "NLL", "Brier / C", "ECE (EM, 15)", "MI", "params", "seeds"],
                          rows), "",
           f"Hidden width {args.hidden}, {args.epochs} epochs, {args.num_samples} test draws; mean ± standard error "
           "over seeds. Paper rows are MNIST / Fashion-MNIST (60,000 images): compare orderings, not values.", "",
           "ECE under other binnings (paper Table 16):", "",
           markdown_table(["model"] + [f"{'EM' if b == 'equal-mass' else 'EW'}, B={n}" for b, n in ECE_VARIANTS],
                          ece_rows), "",
           "Parameter counts of the 784-1200-1200-10 networks in closed form (paper Table 14):", "",
           markdown_table(["model", "ours", "paper", "equal", "compression"], count_rows)]
    return "\n".join(md)
