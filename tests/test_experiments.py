"""The experiments' command line and the quickstart in its fast mode."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import ROOT
from _cli import run_experiment as _run
from _testdata import run_on_standins


def test_list_and_help_name_every_experiment():
    from experiments import EXPERIMENTS

    listing = _run("list")
    helptext = _run("--help")
    assert listing.returncode == 0 and helptext.returncode == 0
    for name in EXPERIMENTS:
        assert name in listing.stdout and name in helptext.stdout


def test_unknown_experiment_is_an_error():
    res = _run("no-such-experiment")
    assert res.returncode != 0 and "invalid choice" in res.stderr


def test_a_child_past_its_time_is_stopped_retried_and_reported_with_its_stack(tmp_path):
    """The test helper's guard against a hung experiment: stopped by SIGABRT, its Python stack shown, run again
    once (with a warning), then an error naming the command."""
    import pytest

    with pytest.warns(RuntimeWarning, match="attempt 1 of 2") as caught:
        with pytest.raises(TimeoutError, match=r"quickstart --quick .* ran past 3 s \(attempt 2 of 2\)") as err:
            _run("quickstart", "--quick", "--quiet", "--out", str(tmp_path), timeout=3, retries=1)
    assert "most recent call first" in str(err.value)
    assert "most recent call first" in str(caught[0].message)


def test_convergence_quick_writes_results(tmp_path):
    res = _run("convergence", "--quick", "--quiet", "--out", str(tmp_path), "--seed", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "width" not in res.stderr and "%|" not in res.stderr  # --quiet: no status lines, no bars
    assert str(tmp_path / "results.md") in res.stdout  # it still points at what it wrote
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["seed"] == 3 and payload["config"]["quick"] is True
    assert payload["git_commit"] and payload["wall_time_s"] > 0
    per_width = payload["results"]["per_width"]
    widths = sorted(int(w) for w in per_width)
    # Convergence: the empirical NTK error falls with width, and at the largest width the
    # covariance agrees with the NNGP within 4 standard errors entrywise.
    ntk = payload["results"]["empirical_ntk"]
    ntk_widths = sorted(int(w) for w in ntk)
    assert ntk[str(ntk_widths[-1])]["mean_rel_frobenius"] < ntk[str(ntk_widths[0])]["mean_rel_frobenius"]
    assert per_width[str(widths[-1])]["max_abs_z"] < 4.0
    assert (tmp_path / "results.md").read_text().startswith("# convergence")
    assert (tmp_path / "convergence_histograms.png").stat().st_size > 1000



def test_traced_convergence_quick(tmp_path):
    """Plain-JAX models (tanh MLP and RNN by quadrature, attention): the empirical NTK of networks drawn by the
    traced init_fn falls towards the traced NTK with the width, and the output covariance over 200 networks is
    within a few standard errors of the traced NNGP."""
    res = _run("traced-convergence", "--quick", "--quiet", "--out", str(tmp_path), "--draws", "200")
    assert res.returncode == 0, res.stderr[-3000:]
    models = json.loads((tmp_path / "results.json").read_text())["results"]["models"]
    assert sorted(models) == ["attention", "mlp_tanh", "rnn_tanh"]
    for name, r in models.items():
        small, large = (r["per_width"][w] for w in sorted(r["per_width"], key=int))
        assert large["ntk_mean_rel_frobenius"] < 0.7 * small["ntk_mean_rel_frobenius"], (name, r)
        assert large["max_abs_z"] < 4.5, (name, r)
    assert set(models["rnn_tanh"]["activations"]) == {"Quadrature(fn, n_theta=16, n_r=48)"}

def _run_readme_example(section: str):
    """Run the first python block under the README heading ``section``; return the finished process."""
    text = open(os.path.join(ROOT, "README.md")).read()
    block = text.split(section, 1)[1].split("```python", 1)[1].split("```", 1)[0]
    res = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_readme_kernels_example_runs():
    res = _run_readme_example("## Kernels")
    assert "(20, 100) (20, 100)" in res.stdout


def test_readme_scale_mixture_example_runs():
    res = _run_readme_example("## Scale mixtures of NNGPs")
    df, lml, ess = (float(v) for v in res.stdout.split())
    assert df == 44.0 and math.isfinite(lml) and ess > 3000


def test_readme_variational_example_runs():
    res = _run_readme_example("## Sparse variational GP and Student-t processes")
    shape, rest = res.stdout.strip().split(") ", 1)
    acc, scale = (float(v) for v in rest.split())
    # 200 steps of the SVTP on a one-layer conv NNGP already classify the digits well
    assert shape == "(450, 10" and acc > 0.85 and scale > 0


def test_quickstart_quick_writes_results(tmp_path):
    res = _run("quickstart", "--quick", "--out", str(tmp_path), "--seed", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "diabetes split 2/2: fitting the Burr XII" in res.stderr  # progress: which split, which model
    assert str(tmp_path / "heavy_tailed_bands.png") in res.stdout  # and it points at the files it wrote
    payload = json.loads((tmp_path / "results.json").read_text())
    summary = payload["results"]["summary"]
    assert set(summary["diabetes"]) == set(summary["heavy-tailed"]) == {"gaussian", "student_t", "burr12"}
    for model, s in summary["diabetes"].items():
        # diabetes targets have std ~77: a fitted model's RMSE is far below that and its NLL is finite
        assert math.isfinite(s["nll"][0]) and 40 < s["rmse"][0] < 70, (model, s)
    heavy = summary["heavy-tailed"]
    # what the quickstart shows a new user: with Student-t(2) noise the Student-t process's NLL is lower
    assert heavy["student_t"]["nll"][0] < heavy["gaussian"]["nll"][0], heavy
    assert payload["results"]["heavy_tailed_student_t_wins"] == 2
    assert (tmp_path / "heavy_tailed_bands.png").stat().st_size > 1000


@pytest.mark.needs_data("yacht")
def test_uci_regression_quick_two_protocols_two_splits(tmp_path):
    res = _run("uci-regression", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    payload = json.loads((tmp_path / "results.json").read_text())
    summary = payload["results"]["summary"]
    assert set(summary) == {"standard", "paper"}
    for protocol in summary.values():
        assert set(protocol) == {"yacht"}
        for ds, entry in protocol.items():
            for model in ("gaussian", "student_t", "burr12"):
                nll, rmse = entry[model]["nll"][0], entry[model]["rmse"][0]
                assert entry[model]["runs"] == 2 and math.isfinite(nll)
                # yacht's target std is ~15: a working model is far better than predicting the mean
                assert rmse < 3.0, (ds, model, rmse)
    # resumable: a rerun reads the finished runs instead of recomputing them
    again = _run("uci-regression", "--quick", "--out", str(tmp_path))
    assert again.returncode == 0 and "wrote" in again.stdout


def test_mbnn_polynomial_quick(tmp_path):
    res = _run("mbnn-polynomial", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    models = json.loads((tmp_path / "results.json").read_text())["results"]["models"]
    assert set(models) == {"mbnn", "bnn"}
    for name, m in models.items():
        # y = x^3 + N(0, 9): a working posterior covers most test points and its RMSE is near the noise sd 3
        assert 0.7 < m["coverage"] <= 1.0 and m["rmse"] < 8, (name, m)
        assert m["diagnostics"]["chains"] == 2
    assert models["mbnn"]["diagnostics"]["final_active"][0] < 50  # masks pruned from 50 active
    assert (tmp_path / "polynomial_bands.png").stat().st_size > 1000
    # finished models are kept per model: a second run (other order) reuses both instead of sampling again
    again = _run("mbnn-polynomial", "--quick", "--models", "bnn,mbnn", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "mbnn reused" in again.stdout and "bnn reused" in again.stdout
    models2 = json.loads((tmp_path / "results.json").read_text())["results"]["models"]
    assert models2["mbnn"]["coverage"] == models["mbnn"]["coverage"]
    assert models2["bnn"]["crps"] == models["bnn"]["crps"]


@pytest.mark.needs_data("yacht")
def test_mbnn_uci_quick(tmp_path):
    res = _run("mbnn-uci", "--quick", "--out", str(tmp_path / "uci"))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "uci" / "results.json").read_text())["results"]["summary"]
    assert set(summary["yacht"]) == {"bnn", "nsvi", "mbnn-0.1"}
    for name, entry in summary["yacht"].items():
        # yacht targets have std ~15: any working posterior predicts far better than the mean
        assert entry["splits"] == 2 and entry["rmse"][0] < 5 and math.isfinite(entry["nll"][0]), (name, entry)
        # a 95% interval of a Gaussian (mixture) is about 3.9 noise sds wide or wider
        assert 0 < 2 * entry["sigma_mean"] < entry["width_mean"], (name, entry)
    assert summary["yacht"]["mbnn-0.1"]["active"][0] < 40  # pruned from 40 active nodes


def test_mbnn_ablation_quick(tmp_path):
    # on the yacht-shaped stand-in (tests/_testdata.py): what is checked is the ablation's layout, not yacht's numbers
    res = run_on_standins("mbnn-ablation", "--quick", "--out", str(tmp_path / "abl"))
    assert res.returncode == 0, res.stderr[-3000:]
    final = json.loads((tmp_path / "abl" / "results.json").read_text())["results"]["final_ratio"]
    # quick mode: a Latin square of pairs, the paper's among them; each proposal births once and kills once
    pairs = [name.split("-") for name in final]
    assert len(pairs) == 3 and ["uniform", "sensitivity"] in pairs and all(0 < r <= 1.1 for r in final.values())
    assert sorted(b for b, _ in pairs) == sorted(d for _, d in pairs) == ["informed", "sensitivity", "uniform"]
    assert (tmp_path / "abl" / "proposal_ablation.png").stat().st_size > 1000


def test_mbnn_uci_records_the_sampler_and_reduced_widths(tmp_path):
    """Cells of the merge/split sampler and of a MODEL@WIDTH model say so in their settings and in the report;
    a bad width suffix is refused by name. On the yacht-shaped stand-in (tests/_testdata.py): no number of the real
    set is checked here (test_mbnn_uci_quick runs the real one)."""
    out = tmp_path / "uci"
    res = run_on_standins("mbnn-uci", "--quick", "--models", "mbnn-0.1,bnn@12", "--splits", "1", "--transfer",
                          "2", "--burnin", "20", "--samples", "4", "--thinning", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    mb = json.loads((out / "cells" / "yacht" / "mbnn-0.1" / "split00.json").read_text())
    bnn = json.loads((out / "cells" / "yacht" / "bnn@12" / "split00.json").read_text())
    assert mb["settings"]["n_transfer"] == 2 and mb["settings"]["width"] == 40
    import jax

    assert mb["device"] == jax.devices()[0].device_kind  # "cpu" in CI, the GPU's name on a GPU machine
    assert bnn["settings"]["width"] == 12 and bnn["active"] == [12.0, 12.0]
    report = (out / "results.md").read_text()
    assert "2 merge/split moves" in report and "| yacht | bnn@12 | 1 |" in report
    assert "(0.675)" in report  # the paper's full-width BNN numbers sit beside the reduced one
    res = _run("mbnn-uci", "--quick", "--models", "bnn@x", "--out", str(tmp_path / "bad"))
    assert res.returncode != 0 and "bnn@x" in res.stderr


def test_mbnn_uci_report_lists_every_unfinished_cell_with_why(tmp_path):
    """The table is complete in the sense the issue asks: a (data set, model) without all its splits is listed with
    the reason (CPU time with the remaining hours, or GPU scale for the full-width BNN)."""
    from experiments import mbnn_uci

    s = {"datasets": ["yacht"], "models": ["mbnn-0.1", "bnn", "bnn@100"], "splits": 3, "chains": 2, "width": 40,
         "burnin": 4, "samples": 2, "thinning": 2, "leapfrog": 3, "n_mh": 1, "n_max": 3, "prior_scale": 1.0,
         "step_scale": 0.5}
    cfg = mbnn_uci._cfg(s, "yacht", "mbnn-0.1")
    cell = {key: 1.0 for key in mbnn_uci.METRICS}
    cell.update(active=[10.0, 5.0], wall_seconds=1800.0, settings=cfg,
                diagnostics={"rhat_f": 1.05, "hmc_acceptance": 0.8})
    path = Path(mbnn_uci._cell_path(tmp_path, "yacht", "mbnn-0.1", 0))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cell))  # written before cells recorded their device: this CPU
    gpu = dict(cell, settings=mbnn_uci._cfg(s, "yacht", "bnn"), wall_seconds=60.0, device="NVIDIA H200")
    path = Path(mbnn_uci._cell_path(tmp_path, "yacht", "bnn", 0))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(gpu))
    report = mbnn_uci._aggregate(tmp_path, s)
    notes = report.results["unfinished"]
    assert len(notes) == 3, notes
    assert "yacht / mbnn-0.1: 1 of 3 splits finished" in notes[0] and "1.0 h of CPU" in notes[0]
    assert "GPU-scale" in notes[1] and "yacht / bnn: 1 of 3 splits finished (NVIDIA H200, 60 s per split)" in notes[1]
    assert "scripts/run_bnn_gpu.sh" in notes[1]
    assert "yacht / bnn@100: 0 of 3" in notes[2] and "lack of CPU time" in notes[2]
    assert "| yacht | mbnn-0.1 | 1 |" in report.markdown and "**Not finished**" in report.markdown
    # the time column says where a row ran: nothing added for this CPU, the accelerator's name otherwise
    assert "| 1800 |" in report.markdown and "| 60 (NVIDIA H200) |" in report.markdown


def test_readme_masked_bnn_example_runs():
    res = _run_readme_example("## Masked Bayesian neural networks")
    assert "(2, 20, 50) True" in res.stdout


def test_mbnn_cnn_quick(tmp_path):
    res = _run("mbnn-cnn", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "results.json").read_text())["results"]
    assert out["accuracy"] > 0.8 and 0 < out["flops"] <= 1.3 and 0 < out["capacity"] <= 1.3, out


def test_compilation_cache_location_and_switch(tmp_path):
    code = ("import jax; from experiments.__main__ import _enable_compilation_cache as e; w = e(); "
            "print(w, jax.config.jax_compilation_cache_dir)")
    where = tmp_path / "xla"
    on = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        env=dict(os.environ, SMNNGP_JAX_CACHE=str(where)), timeout=120)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == [str(where), str(where)] and where.is_dir()
    off = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, SMNNGP_JAX_CACHE="off"), timeout=120)
    assert off.returncode == 0, off.stderr
    assert off.stdout.split()[0] == "None" and off.stdout.split()[1] != str(where)


def test_mbnn_uci_table_flags_chains_that_did_not_mix(tmp_path):
    from experiments import mbnn_uci
    from experiments.__main__ import build_parser

    args = build_parser().parse_args(["mbnn-uci", "--quick", "--aggregate-only", "--out", str(tmp_path)])
    s = mbnn_uci.settings(args)
    for model, acc, rhat in (("bnn", 0.7, 1.02), ("mbnn-0.1", 0.04, 2.6)):
        cfg = mbnn_uci._cfg(s, "yacht", model)
        for k in range(2):
            path = mbnn_uci._cell_path(str(tmp_path), "yacht", model, k)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as fh:
                spread = dict(sigma_mean=0.5, width_mean=2.0) if (model, k) == ("bnn", 0) else {}
                json.dump(dict(coverage=0.95, rmse=0.6, nll=0.9, crps=0.3, active=[100, 80], settings=cfg,
                               wall_seconds=1.0, diagnostics=dict(hmc_acceptance=acc, rhat_f=rhat), **spread), fh)
    md = mbnn_uci.run(args).markdown
    # cells written before the spread fields existed are tabulated without them
    assert "| 0.5 / 2 (1 of 2) |" in md and "| (100, 80) (120, 76) | - |" in md
    warning = md[md.index("Mixing warning"):]
    assert "yacht/mbnn-0.1 (HMC acceptance 0.04, max R-hat 2.60)" in warning and "yacht/bnn" not in warning


def test_mbnn_uci_rhat_is_judged_against_independent_draws(tmp_path):
    """With 20 draws per chain, a max R-hat of 1.15 over 31 test points and 20 splits is what independent draws
    give (not flagged, the reference shown beside it); 1.5 is flagged. Cells without n_test get no reference.
    A resumed cell's time is its sampling time summed over runs, not the last run's wall time."""
    from experiments import mbnn_uci
    from experiments.__main__ import build_parser

    args = build_parser().parse_args(["mbnn-uci", "--aggregate-only", "--datasets", "yacht", "--models",
                                      "mbnn-0.1,mbnn-0.125,bnn", "--out", str(tmp_path)])
    s = mbnn_uci.settings(args)
    for model, rhat, n_test in (("mbnn-0.1", 1.15, 31), ("mbnn-0.125", 1.5, 31), ("bnn", 1.15, None)):
        cfg = mbnn_uci._cfg(s, "yacht", model)
        for k in range(20):
            path = mbnn_uci._cell_path(str(tmp_path), "yacht", model, k)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            cell = dict(coverage=0.95, rmse=0.6, nll=0.9, crps=0.3, active=[100, 80], settings=cfg, wall_seconds=1.0,
                        diagnostics=dict(hmc_acceptance=0.8, rhat_f=rhat if k == 3 else 1.05))
            if model == "mbnn-0.125":  # resumed cells: sampling time summed over runs exceeds the last run's wall time
                cell["seconds"] = 41.0
            if n_test:
                cell["n_test"] = n_test
            with open(path, "w") as fh:
                json.dump(cell, fh)
    rep = mbnn_uci.run(args)
    yacht = rep.results["summary"]["yacht"]
    assert 1.1 < yacht["mbnn-0.1"]["rhat_f_iid"] < yacht["mbnn-0.1"]["rhat_f_iid_q95"] < 1.3
    assert math.isnan(yacht["bnn"]["rhat_f_iid"])
    md = rep.markdown
    assert f"| 1.15 ({yacht['mbnn-0.1']['rhat_f_iid']:.2f}) |" in md and "| 1.15 | 1 |" in md
    warning = md[md.index("Mixing warning"):]
    assert "yacht/mbnn-0.125" in warning and "yacht/mbnn-0.1 " not in warning
    assert "yacht/bnn" in warning  # no reference: the conventional 1.1
    assert yacht["mbnn-0.125"]["seconds_per_split_by_device"] == {"cpu": 41.0}
    assert yacht["mbnn-0.1"]["seconds_per_split_by_device"] == {"cpu": 1.0}


def test_mbnn_uci_times_are_kept_apart_by_device(tmp_path):
    """A row whose splits ran on this CPU and on an accelerator shows each device's mean time and split count,
    never their average, and the unfinished-cell estimate gives the remaining time on each device."""
    from experiments import mbnn_uci
    from experiments.__main__ import build_parser

    args = build_parser().parse_args(["mbnn-uci", "--aggregate-only", "--datasets", "yacht", "--models",
                                      "mbnn-0.1,mbnn-0.125", "--splits", "4", "--out", str(tmp_path)])
    s = mbnn_uci.settings(args)
    runs = {"mbnn-0.1": [("cpu", 1000.0), ("cpu", 2000.0), ("NVIDIA H100", 100.0)],
            "mbnn-0.125": [("NVIDIA H100", 200.0)]}
    for model, ran in runs.items():
        cfg = mbnn_uci._cfg(s, "yacht", model)
        for k, (device, sec) in enumerate(ran):
            path = mbnn_uci._cell_path(str(tmp_path), "yacht", model, k)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            cell = dict(coverage=0.95, rmse=0.6, nll=0.9, crps=0.3, active=[100, 80], settings=cfg, wall_seconds=sec,
                        diagnostics=dict(hmc_acceptance=0.8, rhat_f=1.05))
            if k != 1:  # a cell written before devices were recorded ran on this CPU
                cell["device"] = device
            with open(path, "w") as fh:
                json.dump(cell, fh)
    rep = mbnn_uci.run(args)
    yacht = rep.results["summary"]["yacht"]
    assert yacht["mbnn-0.1"]["seconds_per_split_by_device"] == {"cpu": 1500.0, "NVIDIA H100": 100.0}
    assert yacht["mbnn-0.1"]["splits_by_device"] == {"cpu": 2, "NVIDIA H100": 1}
    md = rep.markdown
    assert "| 1500 (CPU, 2 splits); 100 (NVIDIA H100, 1 split) |" in md and "| 200 (NVIDIA H100) |" in md
    assert ("yacht / mbnn-0.1: 3 of 4 splits finished; the remaining 1 take about 25 min of CPU at this cell's "
            "measured 1500 s per split, or about 2 min on one NVIDIA H100 at its measured 100 s per split") in md
    assert "yacht / mbnn-0.125: 1 of 4 splits finished; the remaining 3 take about 10 min on one NVIDIA H100" in md
    assert "`DATASETS=yacht MODELS=mbnn-0.125 SPLITS=4 bash scripts/run_bnn_gpu.sh SECONDS`" in md


def test_mbnn_uci_per_dataset_sampler_settings():
    """Energy's sampler runs with pooled post-burn-in steps; NS-VI cells and the other data sets keep the global
    settings (so their finished cells still count), and an explicit --pool-step applies everywhere."""
    from experiments import mbnn_uci
    from experiments.__main__ import build_parser

    s = mbnn_uci.settings(build_parser().parse_args(["mbnn-uci", "--out", "x"]))
    assert mbnn_uci.dataset_settings(s, "energy", "mbnn-0.1")["pool_step"] == "min"
    assert "pool_step" in mbnn_uci._cfg(s, "energy", "bnn")
    for ds, model in (("energy", "nsvi"), ("yacht", "mbnn-0.1"), ("boston", "bnn")):
        assert "pool_step" not in mbnn_uci._cfg(s, ds, model), (ds, model)
    s = mbnn_uci.settings(build_parser().parse_args(["mbnn-uci", "--out", "x", "--pool-step", "chain"]))
    assert "pool_step" not in mbnn_uci._cfg(s, "energy", "mbnn-0.1")
    s = mbnn_uci.settings(build_parser().parse_args(["mbnn-uci", "--out", "x", "--pool-step", "min"]))
    assert mbnn_uci._cfg(s, "yacht", "mbnn-0.1")["pool_step"] == "min"


def test_readme_lowrank_example_runs():
    res = _run_readme_example("## Low-rank (singular) Bayesian networks")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "7202"
    assert lines[1] == "(100, 9, 1) True"
    assert lines[2] == "1.0 True"


def test_readme_ard_example_runs():
    res = _run_readme_example("## Sparse Bayesian (ARD) networks")
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "[0 0 0 1 0 0 1]"  # Algorithm 1 keeps exactly the two regressors of the true system
    assert lines[1] == "True"
    assert lines[2] == "(100, 100)"
