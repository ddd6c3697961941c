"""Proposal ablation for the mask moves (Kong et al. 2023, section 6.5, Figures 3 and 5).

The active-node ratio (active nodes over the initially active 2 x 1,000)
through burn-in for the nine birth x death proposal pairs of
`samplers.masks` (uniform (13), sensitivity (14), informed (15)) on Yacht
(first public split, lambda = 0.1, the UCI settings of `experiments.mbnn_uci`).
The paper's claim: uniform births with sensitivity deaths (its proposal) prune
fastest, and the first-order "informed" proposals do poorly. Line style
encodes the birth proposal and colour the death proposal, as in the paper.
Every pair is saved when it finishes (``OUT/cells/``), so a rerun resumes.

Each pair compiles its own sampler (about 20 s on a CPU core whatever the
width), so the quick mode runs the three pairs of a Latin square
(`QUICK_PAIRS`): the paper's uniform-sensitivity pair and two more, so that
every proposal is used once for births and once for deaths.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np

from experiments.report import Report, markdown_table, write_json_atomic

DESCRIPTION = "mask proposal ablation on Yacht: active-node ratio through burn-in, 9 birth x death pairs (Fig. 3)"

PROPOSALS = ("uniform", "sensitivity", "informed")
STYLE = {"uniform": "-", "sensitivity": "--", "informed": ":"}
COLOR = {"uniform": "tab:blue", "sensitivity": "tab:red", "informed": "tab:green"}
QUICK_PAIRS = (("uniform", "sensitivity"), ("sensitivity", "informed"), ("informed", "uniform"))


def add_arguments(parser):
    parser.add_argument("--dataset", default="yacht", help="UCI set (default yacht)")
    parser.add_argument("--iterations", type=int, default=None, help="burn-in iterations traced (default 400)")
    parser.add_argument("--width", type=int, default=None, help="initially active width (default 1000)")
    parser.add_argument("--chains", type=int, default=None, help="chains per pair (default 2, quick 1)")


def run(args) -> Report:
    import jax

    from experiments.data import load_uci
    from experiments.data.uci import minmax_split
    from samplers.mbnn import sample, uci_sampler

    q = args.quick
    s = dict(width=args.width or (30 if q else 1000), iterations=args.iterations or (40 if q else 400),
             chains=args.chains or (1 if q else 2), leapfrog=20, n_mh=10, n_max=3, prior_scale=1.0, lam=0.1)
    xtr, ytr, _, _ = minmax_split(load_uci(args.dataset), 0)
    traces, rows = {}, []
    pairs = QUICK_PAIRS if q else tuple(itertools.product(PROPOSALS, PROPOSALS))
    for birth, death in pairs:
        path = os.path.join(args.out, "cells", f"{birth}-{death}.json")
        cfg = dict(s, dataset=args.dataset)
        if os.path.exists(path):
            with open(path) as fh:
                saved = json.load(fh)
            if saved["settings"] == cfg:
                traces[(birth, death)] = np.asarray(saved["ratio"])
        if (birth, death) not in traces:
            sampler = uci_sampler(xtr, ytr, s["lam"], width=s["width"], prior_scale=s["prior_scale"],
                                  leapfrog=s["leapfrog"], n_mh=s["n_mh"], n_max=s["n_max"], birth=birth, death=death)
            res = sample(sampler, jax.random.PRNGKey(args.seed), num_chains=s["chains"], num_burnin=s["iterations"],
                         num_samples=1, thinning=1, progress=True)
            ratio = res.traces["active"].sum(-1).mean(0)[: s["iterations"]] / (2.0 * s["width"])
            write_json_atomic(path, dict(settings=cfg, ratio=ratio.tolist(), seconds=res.seconds))
            traces[(birth, death)] = ratio
        r = traces[(birth, death)]
        rows.append([birth, death, f"{r[len(r) // 4]:.3f}", f"{r[len(r) // 2]:.3f}", f"{r[-1]:.3f}"])
    fig = _figure(args.out, traces, args.dataset)
    final = {f"{b}-{d}": float(r[-1]) for (b, d), r in traces.items()}
    fastest = min(final, key=final.get)
    md = [f"# Mask proposal ablation on {args.dataset} (paper Figures 3 and 5)", "",
          markdown_table(["birth", "death", "ratio at 1/4", "ratio at 1/2", "ratio at end"], rows), "",
          f"Lowest final active ratio: {fastest} (the paper's proposal is uniform-sensitivity). Settings: "
          f"width {s['width']} active of {int(round(1.1 * s['width']))}, {s['iterations']} burn-in iterations, "
          f"{s['chains']} chains averaged, lambda {s['lam']}, {s['n_mh']} moves per iteration.", "",
          f"![ablation]({fig})"]
    if q:
        md.insert(1, "**Quick mode**: narrow network, a short burn-in and 3 of the 9 pairs (each proposal once for "
                  "births and once for deaths); not comparable to the paper.\n")
    return Report(results=dict(settings=s, final_ratio=final, fastest=fastest,
                               traces={f"{b}-{d}": r.tolist() for (b, d), r in traces.items()}), markdown="\n".join(md),
                  figures=[fig])


def _figure(out, traces, dataset):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (birth, death), r in traces.items():
        ax.plot(np.arange(1, len(r) + 1), r, STYLE[birth], color=COLOR[death], label=f"birth {birth} / death {death}")
    ax.set_xlabel("burn-in iteration")
    ax.set_ylabel("active nodes / initially active")
    ax.set_yscale("log")
    ax.set_title(f"{dataset}: line = birth proposal, colour = death proposal")
    ax.legend(fontsize=6)
    fig.tight_layout()
    name = "proposal_ablation.png"
    os.makedirs(out, exist_ok=True)
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name
