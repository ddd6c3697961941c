"""Post-burn-in step-size choices of the masked-BNN sampler on one UCI split (the Energy mixing study).

Runs the paper's 400-iteration burn-in once (4 chains, mBNN lambda 0.1, cached in ``--cache``), then continues
the same burnt-in chains for ``--iterations`` iterations under each variant ``POOL-SCALE``: POOL is ``chain``
(each chain keeps its own adapted step) or ``min`` (every chain takes the smallest), SCALE the fraction of the
adapted step used after burn-in. Prints, per block of 250 iterations and per chain, the HMC acceptance,
divergent trajectories, step, sigma^2, log-likelihood and accepted mask moves. Only training data are used.

    SMNNGP_DATA_DIR=../shared/data python scripts/mbnn_step_diagnostic.py --dataset energy --split 1 \
        chain-0.5 min-0.5 chain-0.25

The output of that command is ``records/mbnn-uci/energy_step_diagnostic.log``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import mbnn_uci
from experiments.data import load_uci
from experiments.data.uci import minmax_split
from samplers.mbnn import pool_min_step, sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+", help="POOL-SCALE, e.g. chain-0.5 min-0.5")
    p.add_argument("--dataset", default="energy", choices=mbnn_uci.DATASETS)
    p.add_argument("--split", type=int, default=1)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--cache", default=None, help="burn-in state file (default /tmp/mbnn_burn_DATASET_SPLIT.pkl)")
    a = p.parse_args()
    xtr, ytr, _, _ = minmax_split(load_uci(a.dataset), a.split)

    def sampler_for(scale):
        s = dict(width=1000, prior_scale=1.0, leapfrog=20, n_mh=10, n_max=3, step_scale=scale)
        return mbnn_uci.build_sampler("mbnn-0.1", xtr, ytr, s)

    cache = a.cache or f"/tmp/mbnn_burn_{a.dataset}_{a.split}.pkl"
    if not os.path.exists(cache):
        t = time.time()
        res = sample(sampler_for(0.5), jax.random.PRNGKey(a.split), num_chains=4, num_burnin=400, num_samples=1,
                     thinning=1, progress=False)
        with open(cache, "wb") as fh:
            pickle.dump(jax.tree_util.tree_map(np.asarray, res.state), fh)
        print("burn-in seconds", time.time() - t, flush=True)
    with open(cache, "rb") as fh:
        st0 = jax.tree_util.tree_map(jnp.asarray, pickle.load(fh))
    print("adapted steps", np.exp(np.asarray(st0.da.log_step_size_avg)), "sigma2", np.asarray(st0.sigma2), flush=True)
    for tag in a.variants:
        pool, scale = tag.split("-")
        st = st0
        if pool == "min":
            st = pool_min_step(st)
        elif pool != "chain":
            raise SystemExit(f"variant {tag!r}: POOL must be 'chain' or 'min'")
        t = time.time()
        res = sample(sampler_for(float(scale)), jax.random.PRNGKey(100 + a.split), num_chains=4, num_burnin=0,
                     num_samples=a.iterations // 100, thinning=100, progress=False, init_state=st)
        tr = res.traces
        print(tag, "seconds", round(time.time() - t), flush=True)
        for i in range(0, tr["sigma2"].shape[1], 250):
            sl = slice(i, i + 250)
            print(f"{tag} it {i:5d} acc {np.round(tr['hmc_acceptance'][:, sl].mean(1), 2)} "
                  f"div {tr['divergent'][:, sl].sum(1)} eps {np.round(tr['step_size'][:, sl].mean(1) * 1e4, 2)}e-4 "
                  f"sig2 {np.round(tr['sigma2'][:, sl].mean(1), 3)} ll {np.round(tr['loglik'][:, sl].mean(1), 0)} "
                  f"mask {tr['mask_accepted'][:, sl].sum(1)}", flush=True)


if __name__ == "__main__":
    main()
