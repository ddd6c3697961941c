"""The Cascaded Tanks experiments (sparse-Bayes paper) in their fast modes, and the protocol's data split."""

import json

import numpy as np
import pytest
from _cli import run_experiment as _run
from _testdata import patched, run_on_standins


def test_split_holds_out_validation_and_never_touches_the_test_record(monkeypatch):
    """On the simulated stand-in (tests/_testdata.py): the split's bookkeeping, not the benchmark's numbers."""
    patched(monkeypatch)
    from experiments import tanks
    from experiments.data import load

    d = load("cascaded-tanks")
    s = tanks.split(256, 19)
    assert len(s.train[0]) == 768 and len(s.val[0]) == 256 + 19 and len(s.test[0]) == 1024
    # detrended by the training part's means only
    np.testing.assert_allclose(s.offset, (d.u_est[:768].mean(), d.y_est[:768].mean()))
    np.testing.assert_allclose(s.val[1][19:] + s.offset[1], d.y_est[768:])
    np.testing.assert_allclose(s.test[1] + s.offset[1], d.y_val)
    with pytest.raises(ValueError, match="validation"):
        tanks.split(1000, 19)
    assert tanks.mean_std_best([1.0, 3.0, np.nan])["mean"] == 2.0


@pytest.mark.needs_data("cascaded-tanks")
def test_tanks_simulation_quick_and_resume(tmp_path):
    res = _run("tanks-simulation", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    summary = results["summary"]
    assert set(summary) == {"honest/ours", "honest/conventional", "honest/none"}
    for row in summary.values():
        assert row["test"]["n"] == 2 and 0 < row["test"]["best"] <= row["test"]["mean"]
        # RMSE over 1,024 samples with the first 19 exact is below the RMSE over the 1,005 simulated ones
        assert row["test"]["mean"] <= row["test_excl"]["mean"] + 1e-12
        assert 0 < row["frac"] <= 1
    assert results["hmc"]["draws_total"] == 5
    md = (tmp_path / "results.md").read_text()
    assert "0.344" in md and "2.063" in md  # the paper's Table 3 beside ours
    assert (tmp_path / "tanks_simulation.png").exists() and (tmp_path / "tanks_sparsity.png").exists()
    again = _run("tanks-simulation", "--quick", "--quiet", "--out", str(tmp_path), timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "results.json").read_text())["results"]["summary"] == summary


def test_tanks_onestep_quick(tmp_path):
    # on the simulated trace (tests/_testdata.py); test_tanks_simulation_quick_and_resume runs the real record
    res = run_on_standins("tanks-onestep", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())["results"]["summary"]
    assert set(summary) == {f"{r}/{m}" for r in ("0.5", "1") for m in ("ours-row", "gl-row", "none")}
    for key, row in summary.items():
        assert row["test"]["n"] == 2 and np.isfinite(row["test"]["mean"])
        assert row["frac"] == 1.0 if key.endswith("none") else row["frac"] <= 1.0
    assert summary["0.5/none"]["n"] < summary["1/none"]["n"]
    md = (tmp_path / "results.md").read_text()
    assert "2.23%" in md and "0.0472" in md  # the paper's Table 2 and best RMSE beside ours
    assert (tmp_path / "tanks_onestep.png").exists()


def test_tanks_simulation_report_prints_nan_for_missing_numbers():
    """Stored cells hold null for NaN: a short HMC run without R-hat, or a band whose free runs all diverged, is
    reported as nan, not a crash (a 3-draw quick run once raised TypeError here)."""
    from types import SimpleNamespace

    from experiments import tanks_simulation as ts

    args = SimpleNamespace(seed=0, quick=True, repeats=2, rounds=2, epochs=40, hessian="exact", groups=["row"],
                           lams=[1e-3], validation=256, hmc_chains=1, hmc_samples=3, hmc_warmup=6)
    band = {"coverage": None, "mpiw": None, "rmse_of_mean": None, "diverged": 4, "draws_total": 4,
            "linearised": {"coverage": 0.5, "mpiw": 1.0}}
    unc = {"bands": {key: band for key in ts.LAPLACE_BANDS}, "draws": 4}
    hmc = {"coverage": None, "mpiw": None, "rmse_of_mean": None, "rmse_per_draw_median": None, "diverged": 3,
           "draws_total": 3, "fraction_remaining": 1.0, "seconds": 15.0, "group": "row",
           "diagnostics": {"acceptance": 0.0, "divergences": 3, "rhat_params": None}}
    md = ts._markdown(args, {}, unc, hmc)
    assert "4 of 4" in md and "3 of 3 free runs diverged" in md and "max R-hat of the weights nan" in md
