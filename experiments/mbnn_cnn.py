"""Masked Bayesian CNN by SGLD with mini-batch mask moves on scikit-learn's digits (Kong et al. 2023,
section 6.4 and Table 2 at a CPU scale; notes section 3.5).

Digits: 1,797 8 x 8 images, pixels scaled to [0, 1], a random 80/20 split per seed. Model: two 3 x 3
convolutions with (40, 80) physical channels of which (32, 64) are active at the start (the authors' 4/5),
channel masks after each ReLU, a dense readout; Cauchy(0, 0.1) on every weight (the authors' image prior),
mask prior lambda = 0.05. Sampler (`samplers.msgld`): BlackJAX SGLD with batch 100, step size annealed by a
cosine from ``--step`` to ``--step / 100`` during burn-in and then held, temperature 1 (``--temperature``);
one mask move every 10 batches on the current batch (log-likelihood scaled by n / B). Kept: one network every
``--thin`` epochs after burn-in. Reported, as in Table 2: accuracy, NLL and ECE of the averaged softmax, and
FLOPs (multiply-accumulates) and capacity (parameters) of the active network relative to the initially
active one. The paper's CIFAR-10 ResNet-18 runs need the data and a GPU; they are not run here.
"""

from __future__ import annotations

import math
import os
from functools import partial

import numpy as np

from experiments import metrics
from experiments.report import Report, markdown_table

DESCRIPTION = "masked Bayesian CNN by SGLD + mini-batch mask moves on digits: ACC, NLL, ECE, FLOPs, capacity"


def add_arguments(parser):
    parser.add_argument("--burnin", type=int, default=None, help="burn-in epochs (default 40, quick 3)")
    parser.add_argument("--samples", type=int, default=None, help="kept networks (default 5, quick 2)")
    parser.add_argument("--thin", type=int, default=None, help="epochs between kept networks (default 5, quick 1)")
    parser.add_argument("--step", type=float, default=3e-4, help="initial SGLD step size (default 3e-4)")
    parser.add_argument("--temperature", type=float, default=1.0, help="SGLD noise temperature (default 1)")


def run(args) -> Report:
    import jax
    import jax.numpy as jnp
    from sklearn.datasets import load_digits

    from finite.masked import masked_cnn
    from samplers.msgld import MSGLDState, msgld_epoch

    q = args.quick
    burnin = args.burnin or (3 if q else 40)
    n_samples = args.samples or (2 if q else 5)
    thin = args.thin or (1 if q else 5)
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    perm = np.random.default_rng(args.seed).permutation(len(y))
    n_te = len(y) // 5
    te, tr = perm[:n_te], perm[n_te:]
    xtr, ytr, xte, yte = jnp.asarray(X[tr]), jnp.asarray(y[tr]), jnp.asarray(X[te]), y[te]
    batch = 100
    nb = len(tr) // batch
    net = masked_cnn((8, 8, 1), (40, 80), (32, 64), 10)
    params, masks = net.init(jax.random.PRNGKey(args.seed))
    state = MSGLDState(params, masks)
    epoch = jax.jit(partial(msgld_epoch, net=net, batch_size=batch, prior_scale=0.1, lam=0.05, t_mh=10, n_mh=1,
                            temperature=args.temperature))
    base_flops, base_params = net.flops_and_capacity(masks)
    total_epochs = burnin + n_samples * thin
    probs, flops, caps, actives, accepted = [], [], [], [], []
    from tqdm.auto import tqdm
    for e in tqdm(range(total_epochs), desc="mBCNN", leave=False):
        if e < burnin:  # cosine from step to step / 100 over burn-in, per batch
            t = (e * nb + np.arange(nb)) / max(1, burnin * nb - 1)
            steps = args.step / 100 + 0.5 * (args.step - args.step / 100) * (1 + np.cos(math.pi * t))
        else:
            steps = np.full(nb, args.step / 100)
        state, acc = epoch(jax.random.PRNGKey(1000 + e), state, x=xtr, y=ytr, step_sizes=jnp.asarray(steps))
        accepted.append(int(acc))
        actives.append([int(np.asarray(m).sum()) for m in state.masks])
        if e >= burnin and (e - burnin + 1) % thin == 0:
            logits = net.apply(state.params, state.masks, xte)
            probs.append(np.asarray(jax.nn.softmax(logits, -1), float))
            f, c = net.flops_and_capacity(state.masks)
            flops.append(f / base_flops)
            caps.append(c / base_params)
    p = np.mean(probs, 0)
    res = dict(accuracy=float(np.mean(p.argmax(1) == yte)),
               nll=float(-np.mean(np.log(p[np.arange(len(yte)), yte] + 1e-12))),
               ece=metrics.expected_calibration_error(p, yte),
               flops=float(np.mean(flops)), capacity=float(np.mean(caps)),
               active_final=actives[-1], active_trace=actives, mask_moves_accepted=int(np.sum(accepted)),
               settings=dict(burnin=burnin, samples=n_samples, thin=thin, step=args.step,
                             temperature=args.temperature, channels=[40, 80], active=[32, 64], batch=batch))
    fig = _figure(args.out, actives, burnin)
    md = ["# Masked Bayesian CNN on digits (SGLD, paper Table 2 at CPU scale)", "",
          markdown_table(["ACC", "NLL", "ECE (top-label)", "FLOPs", "capacity", "active channels (end)",
                          "mask moves accepted"],
                         [[f"{res['accuracy']:.3f}", f"{res['nll']:.3f}", f"{res['ece']:.3f}",
                           f"{100 * res['flops']:.1f}%", f"{100 * res['capacity']:.1f}%",
                           "/".join(map(str, actives[-1])), res["mask_moves_accepted"]]]), "",
          f"{n_samples} networks kept every {thin} epochs after {burnin} burn-in epochs. FLOPs and capacity of the "
          "active network relative to the initially active (32, 64) channels. For scale, the paper's CIFAR-10 "
          "mBCNN: ACC 0.932, NLL 0.220, FLOPs 12.26%, capacity 3.47% (ResNet-18, not comparable).", "",
          f"![active channels]({fig})"]
    if q:
        md.insert(1, "**Quick mode**: a few epochs only.\n")
    return Report(results=res, markdown="\n".join(md), figures=[fig])


def _figure(out, actives, burnin):
    import matplotlib.pyplot as plt

    a = np.asarray(actives)
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(np.arange(1, len(a) + 1), a[:, 0], label="conv 1 (of 40)")
    ax.plot(np.arange(1, len(a) + 1), a[:, 1], label="conv 2 (of 80)")
    ax.axvline(burnin, color="k", ls=":", label="end of burn-in")
    ax.set_xlabel("epoch")
    ax.set_ylabel("active channels")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    name = "cnn_active_channels.png"
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
