"""Choosing the free-run fine-tuning schedule of ``tanks-simulation`` on validation data only.

For ``--repeats`` initialisations, Algorithm 1 (row + column groups, ``--lam``, exact Hessians) is trained on the
first 768 estimation samples, its round chosen by the free-run RMSE on the last 256 (the experiment's honest
protocol), and the chosen network is fine-tuned on the free-run error of the same 768 samples under each schedule
``EPOCHS:LR`` given on the command line. Printed: per schedule the validation free-run RMSE (simulated part) per
repeat, its mean and median. The test record is never loaded.

    SMNNGP_DATA_DIR=../shared/data python scripts/tanks_finetune_study.py 300:1e-3 1000:1e-3 1000:3e-3

The output of the command in RESULTS.md section 4 is ``records/tanks-simulation/finetune_study.log``.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("schedules", nargs="+", help="EPOCHS:LR, e.g. 300:1e-3")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--lam", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=1.0)
    a = p.parse_args()
    jax.config.update("jax_enable_x64", True)

    from experiments import tanks, tanks_simulation
    from finite import ard

    lag = tanks_simulation.LAG
    split = tanks.split(256, lag)
    model = ard.mlp(tanks_simulation.SIZES)
    Z, t = ard.narx_regressors(*split.train, lag)
    uv, yv = (np.asarray(x) for x in split.val)
    ut, yt = (np.asarray(x) for x in split.train)

    def val_rmse(params):
        return float(ard.simulation_rmse(ard.simulate(model, params, uv, yv, lag), yv, lag, include_initial=False))

    def evaluate(params):
        s = ard.simulate(model, params, uv, yv, lag)
        return {"sim": ard.simulation_rmse(s, yv, lag, include_initial=False)}

    config = ard.ArdConfig(group="row+column", hessian="exact")
    keys = jax.random.split(jax.random.PRNGKey(0), a.repeats)
    scores = {s: [] for s in a.schedules}
    base = []
    for r in range(a.repeats):
        res = ard.fit(model, keys[r], Z, t, config, lam=a.lam, evaluate=evaluate)
        sim = np.asarray(res.metrics["sim"])
        params, state, k = ard.select_round(res, np.where(np.isfinite(sim), sim, np.inf))
        base.append(val_rmse(params))
        line = [f"repeat {r}: round {k}, one-step trained {base[-1]:.3f}"]
        for s in a.schedules:
            epochs, lr = s.split(":")
            t0 = time.perf_counter()
            tuned, _ = ard.finetune_simulation(model, params, state.masks, ut, yt, lag, epochs=int(epochs),
                                               learning_rate=float(lr), clip_norm=a.clip or None)
            scores[s].append(val_rmse(tuned))
            line.append(f"{s} {scores[s][-1]:.3f} ({time.perf_counter() - t0:.0f} s)")
        print("; ".join(line), flush=True)
    print(f"one-step trained: mean {np.mean(base):.3f}, median {np.median(base):.3f}")
    for s, v in scores.items():
        print(f"{s}: validation free-run RMSE mean {np.mean(v):.3f}, median {np.median(v):.3f}")


if __name__ == "__main__":
    main()
