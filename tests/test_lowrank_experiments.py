"""The singular-BNN experiments in their fast modes."""

import json

import pytest
from _cli import run_experiment as _run


def test_lowrank_toy_quick_and_resume(tmp_path):
    res = _run("lowrank-toy", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    cells = json.loads((tmp_path / "results.json").read_text())["results"]["cells"]
    # the paper's parameter counts (Table 20), from the closed form of finite.lowrank
    assert cells["fullrank"]["params"] == 20802 and cells["lowrank"]["params"] == 7202
    for c in cells.values():
        assert c["bands"]["in_domain"] > 0 and c["bands"]["out_of_domain"] > 0
        assert 0 < c["rmse_mc200"] < 1.0
    hmc = cells["hmc"]
    # every sampled A B^T has rank <= 16: the 17th singular value is round-off
    sv = hmc["singular_values_median"]
    assert len(sv) == 18 and sv[16] < 1e-5 * sv[0] and hmc["numerical_rank"] <= 16
    assert (tmp_path / "lowrank_toy_bands.png").exists()
    md = (tmp_path / "results.md").read_text()
    assert "0.49623" in md and "7,202" in md  # the paper's rows beside ours
    again = _run("lowrank-toy", "--quick", "--quiet", "--out", str(tmp_path), timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "results.json").read_text())["results"]["cells"] == cells


@pytest.mark.needs_data("pm25-beijing", "pm25-guangzhou")
def test_lowrank_pm25_quick(tmp_path):
    res = _run("lowrank-pm25", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())["results"]["summary"]
    assert set(summary) == {"deterministic", "ensemble", "lowrank"}
    for s in summary.values():
        assert 0.0 <= s["picp"][0] <= 1.0 and 0.0 <= s["auroc_ood"][0] <= 1.0 and s["mae"][0] > 0
        assert len(s["selective_mae"]) == 7
    # a deterministic network's predictive std is the constant noise: it cannot rank OOD windows
    assert summary["deterministic"]["auroc_ood"][0] == 0.5
    assert summary["ensemble"]["params"] == 5 * summary["deterministic"]["params"]
    assert summary["lowrank"]["params"] < summary["deterministic"]["params"]
    assert "10.63" in (tmp_path / "results.md").read_text()


def test_lowrank_mlp_quick_and_table14_counts(tmp_path):
    res = _run("lowrank-mlp", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    # Table 14 reproduced exactly, in closed form, whatever the data set
    assert results["mnist_param_counts"] == {"bbb": 4788010, "lowrank-gaussian": 245810, "lowrank-laplace": 245810,
                                             "rank1": 2406398}
    summary = results["summary"]
    assert set(summary) == {"bbb", "lowrank-gaussian", "lowrank-laplace", "rank1"}
    for s in summary.values():
        assert 0.1 <= s["accuracy"][0] <= 1.0 and s["mi"][0] >= 0.0 and s["nll"][0] > 0
    assert summary["lowrank-gaussian"]["params"] == summary["lowrank-laplace"]["params"] < summary["bbb"]["params"]


def test_lowrank_bounds_quick(tmp_path):
    import numpy as np

    res = _run("lowrank-bounds", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "results.json").read_text())["results"]
    decay = r["decay"]
    # Eckart-Young-Mirsky: tail energy falls with rank to 0 at full rank; retention rises to 1
    assert np.all(np.diff(decay["tail_energy"]) <= 1e-12) and decay["tail_energy"][-1] < 1e-8
    assert abs(decay["energy_retention"][-1] - 1) < 1e-12
    ratio = np.asarray(r["pac_bayes"]["ratio"])
    assert np.all(np.diff(ratio) > 0)  # sqrt(r (m + n) / (m n)) grows with r
    for cell in r["sweep"].values():
        assert cell["c_max"] > 0 and 0 <= cell["train_error"] <= 1
        assert len([s for s in cell["mean_singular_values"] if s > 1e-6 * cell["mean_singular_values"][0]]) <= \
            (cell["rank"] or 10**9)
    assert (tmp_path / "lowrank_bounds.png").exists()


def test_lowrank_transformer_quick_and_table8_counts(tmp_path):
    res = _run("lowrank-transformer", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "results.json").read_text())["results"]
    # Table 8 of the paper, to its printed rounding
    assert {m: round(v / 1e6, 2) for m, v in r["paper_counts"].items()} == {
        "deterministic": 9.92, "bbb": 19.84, "lowrank": 1.47, "rank1": 10.01}
    cells = r["cells"]
    assert set(cells) == {"deterministic", "bbb", "lowrank", "rank1"}
    assert cells["lowrank"]["params"] < cells["deterministic"]["params"] < cells["bbb"]["params"]
    for c in cells.values():
        assert 0 <= c["auroc_ood"] <= 1 and 0 <= c["accuracy"] <= 1


def test_generated_text_task_is_learnable_by_its_rule():
    import numpy as np

    from experiments.lowrank_transformer import generate_task

    x, y, _, _, x_ood = generate_task(0, 300, 16, 2000, 10, 50)
    assert x.shape == (2000, 16) and x[:, 0].max() == 0 and x_ood[:, 1:].min() >= 21 + (300 - 21) // 2
    cues = x[:, 1:]
    score = ((cues >= 1) & (cues <= 10)).sum(1) - ((cues >= 11) & (cues <= 20)).sum(1)
    decided = score != 0
    # the cue majority decides the label up to the 10% label noise
    agree = np.mean((score[decided] > 0).astype(int) == y[decided])
    assert 0.85 < agree < 0.95
    assert not np.isin(x_ood[:, 1:], np.arange(1, 21)).any()
