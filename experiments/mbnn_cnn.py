"""Masked Bayesian CNNs by SGLD with mini-batch mask moves (Kong et al. 2023, section 6.4 and Table 2; notes
section 3.5): scikit-learn's digits on the CPU, CIFAR-10 with the authors' masked ResNet-18 where the data
(and, for the paper's 200 epochs, a GPU) are present.

``--data digits`` (default): 1,797 8 x 8 images, pixels scaled to [0, 1], a random 80/20 split per seed.
Model: two 3 x 3 convolutions with (40, 80) physical channels of which (32, 64) are active at the start (the
authors' 4/5), channel masks after each ReLU, a dense readout; temperature 1; 40 burn-in epochs, 5 networks
kept every 5 epochs.

``--data cifar10``: the 50,000/10,000 split, per-channel standardisation with the training statistics,
random crop (pad 4) and horizontal flip. Model: `finite.masked_resnet.masked_resnet18` (physical widths 80 ...
640, 64 ... 512 active at the start, 17 channel masks, batch norm without a prior; ``--width`` scales it).
The authors' schedule: 100 burn-in epochs, 5 networks kept every 20 epochs, temperature 1/n (their noise
scale 1/sqrt(n)). On 2 CPU cores one epoch of the full network takes hours; use ``--subset`` and ``--width``
for a smoke run, a GPU for the paper's.

Both: Cauchy(0, 0.1) on the weights (the authors' image prior), mask prior lambda = 0.05, batch 100, one mask
move every 10 batches on the current batch (log-likelihood scaled by n / B), step size annealed by a cosine
from ``--step`` to ``--step / 100`` during burn-in and then held (`samplers.msgld`). Reported, as in Table 2:
accuracy, NLL and ECE of the averaged softmax, and FLOPs (multiply-accumulates) and capacity (parameters) of
the active network relative to the initially active one. The run checkpoints after every epoch to
``OUT/checkpoint.pkl`` and resumes from it when restarted with the same settings.
"""

from __future__ import annotations

import math
import os
import pickle
from functools import partial

import numpy as np

from experiments import metrics
from experiments.report import Report, markdown_table

DESCRIPTION = "masked Bayesian CNN by SGLD + mini-batch mask moves (digits; CIFAR-10 ResNet-18): Table 2 metrics"

# The paper's Table 2, CIFAR-10, mBNN column (ResNet-18, 3 seeds): mean (standard error).
PAPER_CIFAR10 = dict(accuracy=(0.932, 0.001), nll=(0.220, 0.005), ece=(0.008, 0.001), flops=(0.1226, 0.0006),
                     capacity=(0.0347, 0.0003))


def add_arguments(parser):
    parser.add_argument("--data", choices=("digits", "cifar10"), default="digits",
                        help="digits (CPU, default) or cifar10 (masked ResNet-18; data from the registry)")
    parser.add_argument("--width", type=float, default=1.0, help="ResNet-18 width multiplier (cifar10; default 1)")
    parser.add_argument("--subset", type=int, default=None, help="use only this many training images (smoke runs)")
    parser.add_argument("--burnin", type=int, default=None,
                        help="burn-in epochs (default: digits 40, cifar10 100; quick 3)")
    parser.add_argument("--samples", type=int, default=None, help="kept networks (default 5, quick 2)")
    parser.add_argument("--thin", type=int, default=None,
                        help="epochs between kept networks (default: digits 5, cifar10 20; quick 1)")
    parser.add_argument("--step", type=float, default=None,
                        help="initial SGLD step size (default: digits 3e-4, cifar10 1e-3)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="SGLD noise temperature (default: digits 1, cifar10 1/n)")


def _digits(seed):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_te = len(y) // 5
    te, tr = perm[:n_te], perm[n_te:]
    return X[tr], y[tr], X[te], y[te]


def _cifar10():
    from experiments import data

    d = data.load("cifar10")
    xtr = d.x_train.astype(np.float32) / 255.0
    mean, std = xtr.mean((0, 1, 2)), xtr.std((0, 1, 2))
    xte = (d.x_test.astype(np.float32) / 255.0 - mean) / std
    return (xtr - mean) / std, d.y_train, xte, d.y_test, (-mean / std).astype(np.float32)


def run(args) -> Report:
    import jax

    from finite.masked import masked_cnn
    from finite.masked_resnet import masked_resnet18
    from samplers.msgld import random_crop_flip

    q, cifar = args.quick, args.data == "cifar10"
    s = dict(burnin=args.burnin or (3 if q else 100 if cifar else 40), samples=args.samples or (2 if q else 5),
             thin=args.thin or (1 if q else 20 if cifar else 5), step=args.step or (1e-3 if cifar else 3e-4),
             batch=100, lam=0.05, prior_scale=0.1, t_mh=10, n_mh=1, data=args.data, seed=args.seed)
    if cifar:
        xtr, ytr, xte, yte, black = _cifar10()
        net = masked_resnet18((32, 32, 3), 10, width=args.width)
        augment = partial(random_crop_flip, pad=4, fill=black)
    else:
        xtr, ytr, xte, yte = _digits(args.seed)
        net = masked_cnn((8, 8, 1), (40, 80), (32, 64), 10)
        augment = None
    if args.subset:
        idx = np.random.default_rng(args.seed).permutation(len(ytr))[: args.subset]
        xtr, ytr = xtr[idx], ytr[idx]
    if len(ytr) < s["batch"]:
        raise ValueError(f"mbnn-cnn: {len(ytr)} training images cannot fill one batch of {s['batch']}")
    s.update(n_train=int(len(ytr)), channels=list(net.channels), active=list(net.active),
             temperature=args.temperature if args.temperature is not None else (1.0 / len(ytr) if cifar else 1.0))
    res = sgld_run(net, s, xtr, ytr, xte, yte, augment=augment, key=jax.random.PRNGKey(args.seed),
                   checkpoint=os.path.join(args.out, "checkpoint.pkl"))
    fig = _figure(args.out, res["active_trace"], s["burnin"], net)
    name = ("Masked ResNet-18 on CIFAR-10" if cifar else "Masked Bayesian CNN on digits") + " (SGLD, paper Table 2)"
    rows = [["ours", f"{res['accuracy']:.3f}", f"{res['nll']:.3f}", f"{res['ece']:.3f}",
             f"{100 * res['flops']:.2f}%", f"{100 * res['capacity']:.2f}%", res["mask_moves_accepted"]]]
    if cifar:
        p = PAPER_CIFAR10
        rows.append(["paper (mBNN)"] + [f"{p[k][0]:.3f} ({p[k][1]:.3f})" for k in ("accuracy", "nll", "ece")]
                    + [f"{100 * p[k][0]:.2f}% ({100 * p[k][1]:.2f})" for k in ("flops", "capacity")] + [""])
    md = [f"# {name}", "",
          markdown_table(["", "ACC", "NLL", "ECE (top-label)", "FLOPs", "capacity", "mask moves accepted"], rows), "",
          f"{s['samples']} networks kept every {s['thin']} epochs after {s['burnin']} burn-in epochs on "
          f"{s['n_train']} training images; FLOPs and capacity of the active network relative to the initially "
          f"active one; active channels at the end: {'/'.join(map(str, res['active_final']))}.", "",
          f"![active channels]({fig})"]
    if not cifar:
        md.insert(-2, "For scale, the paper's CIFAR-10 mBNN (ResNet-18, not comparable): ACC 0.932, NLL 0.220, "
                      "FLOPs 12.26%, capacity 3.47%.\n")
    if q or args.subset or args.width != 1.0:
        md.insert(1, "**Reduced run** (quick mode, a training subset or a narrower network): not the paper's "
                     "setting.\n")
    res["settings"] = s
    return Report(results=res, markdown="\n".join(md), figures=[fig])


def sgld_run(net, s: dict, xtr, ytr, xte, yte, *, augment=None, key=None, checkpoint=None, progress=True) -> dict:
    """Burn-in and sampling epochs of `samplers.msgld.msgld_epoch`; evaluation of the kept networks.

    ``s`` holds burnin, samples, thin, step, batch, lam, prior_scale, t_mh, n_mh, temperature. With
    ``checkpoint`` (a path) the state after every epoch is saved there atomically and a run with the same
    settings resumes from it.
    """
    import jax
    import jax.numpy as jnp
    from tqdm.auto import tqdm

    from samplers.msgld import MSGLDState, msgld_epoch

    key = jax.random.PRNGKey(0) if key is None else key
    params, masks = net.init(key)
    state = MSGLDState(params, masks, net.init_state(params) if hasattr(net, "init_state") else None)
    epoch_fn = jax.jit(partial(msgld_epoch, net=net, batch_size=s["batch"], prior_scale=s["prior_scale"],
                               lam=s["lam"], t_mh=s["t_mh"], n_mh=s["n_mh"], temperature=s["temperature"],
                               augment=augment))
    xtr_j, ytr_j = jnp.asarray(xtr), jnp.asarray(ytr)
    nb = len(ytr) // s["batch"]
    base_flops, base_params = net.flops_and_capacity(masks)
    total = s["burnin"] + s["samples"] * s["thin"]
    log = dict(probs=[], flops=[], caps=[], actives=[], accepted=[])
    start = 0
    config = {k: s[k] for k in sorted(s)}
    if checkpoint and os.path.exists(checkpoint):
        with open(checkpoint, "rb") as fh:
            saved = pickle.load(fh)
        if saved["config"] == config:
            start, log = saved["epoch"], saved["log"]
            state = jax.tree_util.tree_map(jnp.asarray, saved["state"])
    for e in tqdm(range(start, total), desc="SGLD epochs", leave=False, disable=not progress):
        if e < s["burnin"]:  # cosine from step to step / 100 over burn-in, per batch
            t = (e * nb + np.arange(nb)) / max(1, s["burnin"] * nb - 1)
            steps = s["step"] / 100 + 0.5 * (s["step"] - s["step"] / 100) * (1 + np.cos(math.pi * t))
        else:
            steps = np.full(nb, s["step"] / 100)
        state, acc = epoch_fn(jax.random.fold_in(key, 1000 + e), state, x=xtr_j, y=ytr_j,
                              step_sizes=jnp.asarray(steps))
        log["accepted"].append(int(acc))
        log["actives"].append([int(np.asarray(m).sum()) for m in state.masks])
        if e >= s["burnin"] and (e - s["burnin"] + 1) % s["thin"] == 0:
            log["probs"].append(predict_proba(net, state, xte))
            f, c = net.flops_and_capacity(state.masks)
            log["flops"].append(f / base_flops)
            log["caps"].append(c / base_params)
        if checkpoint:
            os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
            with open(checkpoint + ".tmp", "wb") as fh:
                pickle.dump(dict(config=config, epoch=e + 1, log=log,
                                 state=jax.tree_util.tree_map(np.asarray, state)), fh)
            os.replace(checkpoint + ".tmp", checkpoint)
    p = np.mean(log["probs"], 0)
    yte = np.asarray(yte)
    return dict(accuracy=float(np.mean(p.argmax(1) == yte)),
                nll=float(-np.mean(np.log(p[np.arange(len(yte)), yte] + 1e-12))),
                ece=metrics.expected_calibration_error(p, yte), flops=float(np.mean(log["flops"])),
                capacity=float(np.mean(log["caps"])), active_final=log["actives"][-1], active_trace=log["actives"],
                mask_moves_accepted=int(np.sum(log["accepted"])))


def predict_proba(net, state, x, batch: int = 500) -> np.ndarray:
    """Softmax of one network over ``x`` in batches (evaluation mode: running batch-norm statistics)."""
    import jax
    import jax.numpy as jnp

    out = []
    for i in range(0, len(x), batch):
        xb = jnp.asarray(x[i:i + batch])
        logits = net.apply(state.params, state.masks, xb) if state.net_state is None else \
            net.apply(state.params, state.masks, xb, state.net_state)
        out.append(np.asarray(jax.nn.softmax(logits, -1), float))
    return np.concatenate(out)


def _figure(out, actives, burnin, net):
    import matplotlib.pyplot as plt

    a = np.asarray(actives, float) / np.asarray(net.widths, float)
    fig, ax = plt.subplots(figsize=(5, 3))
    epochs = np.arange(1, len(a) + 1)
    if a.shape[1] <= 4:
        for j in range(a.shape[1]):
            ax.plot(epochs, a[:, j], label=f"layer {j + 1} (of {net.widths[j]})")
    else:  # ResNet: the mean over the 17 masks and its range
        ax.plot(epochs, a.mean(1), label="mean over masks")
        ax.fill_between(epochs, a.min(1), a.max(1), alpha=0.3, label="min-max")
    ax.axvline(burnin, color="k", ls=":", label="end of burn-in")
    ax.set_xlabel("epoch")
    ax.set_ylabel("active fraction of physical channels")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    name = "cnn_active_channels.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
