"""The classification experiments of the scale-mixture paper (Tables 2-4) in their fast modes."""

import json
import math
import time

from _cli import run_experiment as _run


def test_gaussian_classification_quick_and_resume(tmp_path):
    res = _run("gaussian-classification", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    payload = json.loads((tmp_path / "results.json").read_text())
    summary = payload["results"]["summary"]
    # clean digits are easy for a conv NNGP; with classes 1, 4, 8 never seen the accuracy is capped at 70%
    assert summary["clean"]["nngp"]["accuracy"][0] > 0.85
    assert summary["ood"]["nngp"]["accuracy"][0] <= 0.72
    for test in summary.values():
        # one kernel, one predictive mean up to the scale: every model classifies alike
        accs = {m: v["accuracy"][0] for m, v in test.items()}
        assert max(accs.values()) - min(accs.values()) < 1e-9, accs
    assert "paper: MNIST" in (tmp_path / "results.md").read_text()
    # a second run reuses every finished cell (same settings) and reports the same numbers
    start = time.perf_counter()
    again = _run("gaussian-classification", "--quick", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "results.json").read_text())["results"]["summary"] == summary
    assert "kernels for" not in again.stdout and time.perf_counter() - start < 60


def test_svtp_quick_writes_tables_and_figures(tmp_path):
    res = _run("svtp", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    payload = json.loads((tmp_path / "results.json").read_text())
    summary = payload["results"]["summary"]
    for model in ("svgp", "svtp"):
        clean = summary["clean"][model]
        # 60 steps from the prior already beat the uniform guess (NLL log 10 = 2.303, accuracy 0.1)
        assert clean["nll"][0] < 2.3 and clean["accuracy"][0] > 0.3
        assert 0.0 <= clean["ece"][0] <= 1.0
    cell = payload["results"]["cells"]["seed0_clean_svtp"]
    assert cell["q_sigma2"]["a"] > 0 and cell["q_sigma2"]["b"] > 0
    text = (tmp_path / "results.md").read_text()
    assert "paper: MNIST" in text and "Quick mode" in text
    for fig in payload["figures"]:
        assert (tmp_path / fig).stat().st_size > 1000


def test_ensembles_quick_both_scales(tmp_path):
    res = _run("ensembles", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    payload = json.loads((tmp_path / "results.json").read_text())
    cells = payload["results"]["cells"]
    fixed, random_scale = cells["seed0_clean_fixed"], cells["seed0_clean_inverse_gamma"]
    assert fixed["scales"] == [1.0, 1.0]
    assert len(set(random_scale["scales"])) == 2 and all(s > 0 for s in random_scale["scales"])
    # the OOD variant never saw classes 1, 4, 8, so it cannot be right on those 30% of the test set
    assert payload["results"]["summary"]["ood"]["fixed"]["accuracy"][0] <= 0.72
    for cell in cells.values():
        for per in cell["tests"].values():
            for combine in ("probs", "logits"):
                sc = per[combine]
                assert math.isclose(sc["nll_per_class"] * 10, sc["nll"], rel_tol=1e-9)
    assert "paper: MNIST" in (tmp_path / "results.md").read_text()


def test_svtp_cnn_kernel_pinning():
    """`cnn_kernel`: the SVTP's readout W_std is pinned, `pin_weights` pins every W_std; the pinned kernels equal
    the fully trainable one at the starting scales, and their trainable leaves are exactly the unpinned scales."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from smnngp.models import cnn_kernel

    x = jnp.asarray(np.random.default_rng(0).uniform(size=(3, 8, 8, 1)))
    full = cnn_kernel(2)
    readout = cnn_kernel(2, train_amplitude=False)
    weights = cnn_kernel(2, pin_weights=True)
    assert set(full.theta) == {"W_std", "b_std", "W_out", "b_out"}
    assert set(readout.theta) == {"W_std", "b_std", "b_out"}
    assert set(weights.theta) == {"b_std", "b_out"}
    reference = np.asarray(full(x, x))
    for k in (readout, weights):
        np.testing.assert_allclose(np.asarray(k(x, x)), reference, rtol=1e-12)
    # doubling every W_std of the homogeneous ReLU stack with zero biases scales the kernel by 4^(depth + 1): the
    # amplitude that the pinned kernel cannot reach through its weights
    zero_b = lambda th: jax.tree_util.tree_map(lambda v: v - 40.0, th)  # noqa: E731  (exp(-40) ~ 0)
    grown = {**full.theta, "W_std": [w + np.log(2.0) for w in full.theta["W_std"]],
             "W_out": full.theta["W_out"] + np.log(2.0)}
    ratio = np.asarray(full.apply({**grown, "b_std": zero_b(full.theta["b_std"]), "b_out": full.theta["b_out"] - 40.0},
                                  x, x)) / np.asarray(full.apply({**full.theta, "b_std": zero_b(full.theta["b_std"]),
                                                                  "b_out": full.theta["b_out"] - 40.0}, x, x))
    np.testing.assert_allclose(ratio, 4.0**3, rtol=1e-9)
