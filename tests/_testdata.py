"""Tests and downloadable data: the guard behind the ``needs_data`` marker, and small stand-ins for the real sets.

The guard. A test that reads a registered data set is marked ``@pytest.mark.needs_data("yacht", ...)``;
``tests/conftest.py`` calls `require` before it runs. A set that `experiments.data.available` cannot provide (not in
``$SMNNGP_DATA_DIR``, not in the cache, and its download fails) skips the test with a one-line reason naming the
set and the way to enable it, or fails it when ``SMNNGP_REQUIRE_DATA=1`` (CI, which has the data, sets it in
``.ci/run``: a broken data path never passes as "skipped"). The answer is remembered per set for the process, and a
source whose download failed once is not tried again for the next set (an unreachable network costs one timeout).

The stand-ins. `yacht_like` (a `UCIData` with yacht's shape: 308 rows, 6 inputs, 20 public splits of 31 test rows,
a resistance that grows steeply with the Froude number) and `tanks_like` (a `CascadedTanks` simulated from the
benchmark's two-tank equations, 1,024 + 1,024 samples at 4 s) let the experiments' code paths run without the
download. `patched(monkeypatch)` serves them in-process through ``experiments.data.load_uci`` / ``load``;
``python -m tests._testdata EXPERIMENT ARGS...`` runs the command line with them (what `run_on_standins` does), the
other sets still coming from the registry. Tests on the real files stay beside them (see the needs_data marks).
"""

from __future__ import annotations

import os
import sys

import numpy as np

REQUIRE_ENV = "SMNNGP_REQUIRE_DATA"
STANDIN_NAMES = ("yacht", "cascaded-tanks")

_answers: dict[str, bool] = {}
_failed_sources: set[str] = set()


def required() -> bool:
    """Whether a missing data set fails a test instead of skipping it (``SMNNGP_REQUIRE_DATA`` set, not ``0``)."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def _can_have(name: str) -> bool:
    from experiments.data import available, get_dataset, is_available

    if name not in _answers:
        sources = {f.source for f in get_dataset(name).files.values()}
        if not is_available(name) and sources & _failed_sources:
            return False  # not remembered: another source's mirror may be set before the next ask
        _answers[name] = available(name)
        if not _answers[name]:
            _failed_sources.update(sources)
    return _answers[name]


def missing(names) -> list[str]:
    """The data sets among ``names`` that cannot be had here (see the module docstring)."""
    return [name for name in names if not _can_have(name)]


def unavailable_message(names) -> str:
    from experiments.data import ENV_DATA_DIR, cache_dir

    where = os.environ.get(ENV_DATA_DIR)
    state = f"{ENV_DATA_DIR}={where}" if where else f"{ENV_DATA_DIR} unset"
    sets = ", ".join(names)
    return (f"needs data set {sets}: not in $SMNNGP_DATA_DIR ({state}) nor the cache ({cache_dir()}), and the "
            f"download failed; set {ENV_DATA_DIR} to a copy of the data (e.g. ../shared/data) or allow network "
            f"access ({REQUIRE_ENV}=1 makes this a failure)")


def skip_or_fail(message: str) -> None:
    """Skip the running test for want of data with ``message``; under ``SMNNGP_REQUIRE_DATA=1`` fail it instead."""
    import pytest

    if required():
        pytest.fail(f"{REQUIRE_ENV}=1, but the test {message}", pytrace=False)
    skip = pytest.skip.Exception(message)
    # reported at the test's own location, as a skipif mark's skip is (pytest's flag), not at this line: the -rs
    # summary then lists each test skipped for want of data instead of one line for all of them
    skip._use_item_location = True
    raise skip


def require(names) -> None:
    """Skip the running test (fail it under ``SMNNGP_REQUIRE_DATA=1``) unless every set in ``names`` can be had."""
    absent = missing(names)
    if absent:
        skip_or_fail(unavailable_message(absent))


# ---------------------------------------------------------------------------------------------------------------
# stand-ins


def yacht_like(seed: int = 0):
    """A `UCIData` named ``yacht`` with the real set's shape and splits layout (308 x 6, 20 splits, 31 test rows).

    Inputs span the real columns' ranges (the Froude number on its 14 grid values); the target, like the
    residuary resistance, is small below Froude 0.3 and steep above (mean ~10, std ~17; the real one's 10 and
    15), plus noise of sd 0.5."""
    from experiments.data import UCIData

    rng = np.random.default_rng(seed)
    n = 308
    lows = np.array([-5.0, 0.53, 4.34, 2.81, 2.73, 0.125])
    highs = np.array([0.0, 0.60, 5.14, 5.35, 3.64, 0.45])
    X = lows + (highs - lows) * rng.uniform(size=(n, 6))
    X[:, 5] = rng.choice(np.linspace(0.125, 0.45, 14), size=n)
    y = 0.15 * np.exp(18.5 * (X[:, 5] - 0.125)) * (1.0 + 0.2 * (X[:, 1] - 0.565) / 0.035) + 0.5 * rng.normal(size=n)
    splits = []
    for _ in range(20):
        perm = rng.permutation(n)
        splits.append((np.sort(perm[31:]), np.sort(perm[:31])))
    return UCIData("yacht", X, y, splits)


def tanks_like(seed: int = 0):
    """A `CascadedTanks` simulated from the benchmark's model (Schoukens et al. 2016, eq. 1-2): water flows from
    the upper tank into the lower one through a square-root law, ``h1' = -k1 sqrt(h1) + k4 u``, ``h2' = k2 sqrt(h1)
    - k3 sqrt(h2)``, both levels saturating at 10 (overflow), ``y = h2`` plus noise of sd 0.02. The input is a
    random-phase multisine in [1, 9] V as the benchmark's; two records of 1,024 samples at ``ts = 4`` s."""
    from experiments.data import CascadedTanks

    rng = np.random.default_rng(seed)
    ts, substeps, n = 4.0, 8, 1024
    k1, k2, k3, k4 = 0.06, 0.06, 0.06, 0.03
    records = []
    for _ in range(2):
        t = np.arange(n) * ts
        freqs = np.arange(1, 21) / (n * ts)
        phases = rng.uniform(0, 2 * np.pi, size=20)
        u = np.sin(2 * np.pi * freqs[:, None] * t[None, :] + phases[:, None]).sum(0)
        u = np.clip(5.0 + 4.0 * u / np.abs(u).max(), 1.0, 9.0)
        h1 = h2 = 5.0
        y = np.empty(n)
        for i in range(n):
            y[i] = h2
            for _ in range(substeps):
                dt = ts / substeps
                h1n = min(max(h1 + dt * (-k1 * np.sqrt(h1) + k4 * u[i]), 0.0), 10.0)
                h2 = min(max(h2 + dt * (k2 * np.sqrt(h1) - k3 * np.sqrt(h2)), 0.0), 10.0)
                h1 = h1n
        records += [u, y + 0.02 * rng.normal(size=n)]
    return CascadedTanks(*records, ts)


def _serving(load_uci, load):
    standins = {"yacht": yacht_like, "cascaded-tanks": tanks_like}

    def patched_load_uci(name):
        return standins[name]() if name == "yacht" else load_uci(name)

    def patched_load(name):
        return standins[name]() if name in standins else load(name)

    return patched_load_uci, patched_load


def patched(monkeypatch) -> None:
    """Serve the stand-ins in this process through ``experiments.data.load_uci`` and ``experiments.data.load``."""
    import experiments.data as data

    load_uci, load = _serving(data.load_uci, data.load)
    monkeypatch.setattr(data, "load_uci", load_uci)
    monkeypatch.setattr(data, "load", load)


def run_on_standins(*args, **kwargs):
    """`_cli.run_experiment` of ``python -m tests._testdata *args``: the command line, the stand-ins as its data."""
    from _cli import run_experiment

    return run_experiment(*args, module="tests._testdata", **kwargs)


def main(argv: list[str]) -> int:
    import experiments.data as data

    data.load_uci, data.load = _serving(data.load_uci, data.load)
    from experiments.__main__ import main as experiments_main

    return experiments_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
