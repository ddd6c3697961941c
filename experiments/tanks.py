"""The Cascaded Tanks protocol shared by ``tanks-onestep`` and ``tanks-simulation`` (sparse-Bayes paper, section 5).

The benchmark's estimation record (1,024 samples) trains, its validation record (1,024 samples) is the *test*
record of the paper's Tables 2-3. Model selection never looks at the test record: the last ``validation``
samples of the estimation record are held out to choose lambda, the group structure and the outer round
(``honest`` protocol); the paper's choice on the test record is a separate, named protocol. Signals are
detrended by the means of the training part (the authors' preprocessing; no scaling).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

PAPER_TABLE3 = [("NOMAD (Brunot et al. 2017)", 0.376), ("PWARX (Mattsson et al. 2018)", 0.350),
                ("Volterra feedback (Schoukens & Scheiwe 2016)", 0.397),
                ("Polynomial feedback (Schoukens & Scheiwe 2016)", 0.487), ("LTI (Schoukens & Scheiwe 2016)", 0.588),
                ("DNN without regularisation, best of 20", 0.777), ("Sparse Bayesian DNN (paper, best)", 0.344)]
PAPER_DNN_MEAN_STD = (2.0634, 1.6375)
RATIOS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Table 2: percentage of weights remaining, (conventional group lasso, ours) per ratio
PAPER_TABLE2 = {0.05: (46.36, 61.52), 0.1: (3.27, 2.01), 0.2: (2.23, 2.95), 0.3: (2.78, 3.42), 0.4: (1.94, 2.14),
                0.5: (3.04, 2.71), 0.6: (3.91, 2.79), 0.7: (3.18, 2.30), 0.8: (10.98, 2.50), 0.9: (51.26, 9.79),
                1.0: (9.78, 2.23)}
PAPER_BEST_ONESTEP = (0.0472, 0.7)  # best one-step RMSE, at 70 % of the data


class TanksSplit(NamedTuple):
    """Detrended records: ``train`` = the first ``N - validation`` estimation samples, ``val`` = the held-out
    estimation samples preceded by ``lag`` samples of history, ``est`` = the whole estimation record, ``test`` =
    the benchmark's validation record; each a ``(u, y)`` pair. ``offset`` = (u mean, y mean) removed."""

    train: tuple
    val: tuple
    est: tuple
    test: tuple
    offset: tuple
    ts: float


def split(validation: int, lag: int) -> TanksSplit:
    """The honest split of the estimation record (module docstring)."""
    from experiments.data import load

    d = load("cascaded-tanks")
    n = len(d.u_est)
    if not (0 <= validation < n - 2 * lag):
        raise ValueError(f"tanks: validation must be in [0, {n - 2 * lag}), got {validation}")
    ntr = n - validation
    mu, my = float(np.mean(d.u_est[:ntr])), float(np.mean(d.y_est[:ntr]))
    u, y = d.u_est - mu, d.y_est - my
    return TanksSplit((u[:ntr], y[:ntr]), (u[ntr - lag:], y[ntr - lag:]), (u, y), (d.u_val - mu, d.y_val - my),
                      (mu, my), d.ts)


def mean_std_best(values) -> dict:
    """``{"mean", "std", "best", "n"}`` of finite values (std with ddof = 1, as the paper's 20-run figures)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "best": float("nan"), "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "best": float(v.min()),
            "n": int(v.size)}


def round_log(log, rounds: int):
    """A `finite.ard.fit_repeats` progress callback printing one line per round or repeat (via ``log``)."""
    import time

    start = time.perf_counter()

    def report(t, _):
        log(f"    {t + 1}/{rounds} done ({time.perf_counter() - start:.0f} s)")
    return report
