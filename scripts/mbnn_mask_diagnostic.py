"""Why the masked-BNN chains of one UCI split disagree (masked-BNN mixing issue, section 1): mask moves after
burn-in, how far apart the chains' masks are up to node permutation, and how far apart their predictions are.

Runs the paper's burn-in once (4 chains, mBNN lambda 0.1, 400 iterations, the default sampler of ``mbnn-uci``;
cached in ``--cache``), then continues the same chains for ``--iterations`` iterations and prints:

* per chain, the mask moves accepted per 1,000 post-burn-in iterations (births, deaths) and the active counts;
* per pair of chains and hidden layer, the overlap of the active sets *up to node permutation*: each active node
  is represented by its activation on the training inputs, the nodes of the two chains are matched one to one
  (Hungarian algorithm on the absolute correlation of their activations), and the mean matched correlation and the
  fraction of the smaller set matched above 0.9 are reported (1 and 100 %: the same hidden features);
* per chain, the test RMSE of its predictive mean, and over the test points the between-chain spread of the
  predictive means against the within-chain standard deviation, and the R-hat of the test predictions.

Only the last state of each chain enters the overlap; the predictive numbers use one draw every ``--thinning``
iterations. The test targets are only read for the RMSE column (a diagnostic, never a choice).

    SMNNGP_DATA_DIR=../shared/data python scripts/mbnn_mask_diagnostic.py --dataset yacht --split 0
"""

from __future__ import annotations

import argparse
import os
import pickle
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment

from experiments import mbnn_uci
from experiments.data import load_uci
from experiments.data.uci import minmax_split
from finite.masked import node_activations
from samplers.driver import split_rhat
from samplers.mbnn import pool_min_step, sample


def hidden_activations(params, masks, x):
    """The post-ReLU activations of every hidden layer's *active* nodes on ``x``: a list of ``(n, active_l)``."""
    return [np.asarray(a)[:, np.asarray(m) > 0.5] for a, m in zip(node_activations(params, masks, x), masks)]


def matched_overlap(A, B) -> tuple[float, float]:
    """Mean absolute correlation of the one-to-one matching of the columns of ``A`` and ``B`` that maximises it,
    and the fraction of the smaller set matched above 0.9. Constant columns (nodes off on every input) correlate 0."""
    def standardise(X):
        X = X - X.mean(0)
        sd = X.std(0)
        return np.where(sd > 0, X / np.where(sd > 0, sd, 1.0), 0.0)

    C = np.abs(standardise(A).T @ standardise(B)) / A.shape[0]
    rows, cols = linear_sum_assignment(-C)
    matched = C[rows, cols]
    return float(matched.mean()), float(np.mean(matched > 0.9))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="yacht", choices=mbnn_uci.DATASETS)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--thinning", type=int, default=50)
    p.add_argument("--transfer", type=int, default=0, help="merge/split moves per iteration (default 0: the "
                   "paper's sampler), in burn-in and after")
    p.add_argument("--kappa", type=float, default=100.0, help="partner sharpness of the merge/split moves")
    p.add_argument("--cache", default=None, help="burn-in state file (default /tmp/mbnn_burn_DATASET_SPLIT[_tN].pkl)")
    a = p.parse_args()
    xtr, ytr, xte, yte = minmax_split(load_uci(a.dataset), a.split)
    s = dict(width=1000, prior_scale=1.0, leapfrog=20, n_mh=10, n_max=3, step_scale=0.5, n_transfer=a.transfer,
             transfer_kappa=a.kappa)
    pool = mbnn_uci.DATASET_SETTINGS.get(a.dataset, {}).get("pool_step")
    sampler = mbnn_uci.build_sampler("mbnn-0.1", xtr, ytr, s)
    net = sampler.model.net
    xe = jnp.asarray(xte, jnp.float32)
    tag = f"_t{a.transfer}k{a.kappa:g}" if a.transfer else ""
    cache = a.cache or f"/tmp/mbnn_burn_{a.dataset}_{a.split}{tag}.pkl"
    if not os.path.exists(cache):
        t = time.time()
        res = sample(sampler, jax.random.PRNGKey(a.split), num_chains=4, num_burnin=400, num_samples=1, thinning=1,
                     progress=True, pool_step=pool)
        with open(cache, "wb") as fh:
            pickle.dump(jax.tree_util.tree_map(np.asarray, res.state), fh)
        print(f"burn-in: {time.time() - t:.0f} s", flush=True)
    with open(cache, "rb") as fh:
        st = jax.tree_util.tree_map(jnp.asarray, pickle.load(fh))
    if pool == "min":
        st = pool_min_step(st)
    t = time.time()
    res = sample(sampler, jax.random.PRNGKey(100 + a.split), num_chains=4, num_burnin=0,
                 num_samples=a.iterations // a.thinning, thinning=a.thinning, progress=True, init_state=st,
                 functions={"f": lambda prm, m, s2, b: net.apply(prm, m, xe, b)[:, 0]})
    print(f"{a.dataset} split {a.split}: {a.iterations} post-burn-in iterations in {time.time() - t:.0f} s", flush=True)
    tr = res.traces
    per_k = 1000.0 / tr["sigma2"].shape[1]
    f = np.asarray(res.draws["f"], float)  # (chains, draws, n_test)
    for c in range(f.shape[0]):
        print(f"chain {c}: HMC acceptance {tr['hmc_acceptance'][c].mean():.2f}; mask moves accepted per 1,000 "
              f"iterations {tr['mask_accepted'][c].sum() * per_k:.1f} (births {tr['births'][c].sum() * per_k:.1f}, "
              f"deaths {tr['deaths'][c].sum() * per_k:.1f}; merges {tr['merges'][c].sum() * per_k:.1f}, splits "
              f"{tr['splits'][c].sum() * per_k:.1f}); active {np.asarray(tr['active'][c, -1]).tolist()}; "
              f"sigma^2 {tr['sigma2'][c].mean():.4f}; test RMSE of its predictive mean "
              f"{np.sqrt(np.mean((f[c].mean(0) - yte) ** 2)):.3f}", flush=True)
    params, masks = res.state.params, res.state.masks
    acts = [hidden_activations(jax.tree_util.tree_map(lambda v: v[c], params), tuple(m[c] for m in masks),
                               jnp.asarray(xtr, jnp.float32)) for c in range(f.shape[0])]
    for i in range(f.shape[0]):
        for j in range(i + 1, f.shape[0]):
            parts = []
            for layer in range(len(acts[i])):
                mean_corr, frac = matched_overlap(acts[i][layer], acts[j][layer])
                parts.append(f"layer {layer + 1}: matched |corr| {mean_corr:.2f}, {100 * frac:.0f} % above 0.9")
            print(f"chains {i}-{j}: " + "; ".join(parts), flush=True)
    between = f.mean(1).std(0)
    within = f.std(1).mean(0)
    rhat = np.asarray(split_rhat(f))
    print(f"predictions: between-chain sd of the predictive mean / within-chain sd, mean over test points "
          f"{np.mean(between / within):.2f} (max {np.max(between / within):.2f}); R-hat median "
          f"{np.nanmedian(rhat):.2f}, max {np.nanmax(rhat):.2f}", flush=True)


if __name__ == "__main__":
    main()
