"""`python -m experiments dataset-kernel --quick` (issue 50): the Myrtle-5 kernels of digits into resumable stores,
kernel regression on them, the CIFAR-shaped timing row; run again, it computes no tile and reports the same."""

import json
import math

from _cli import run_experiment as _run

from smnngp.kernels import tile_store_info


def test_dataset_kernel_quick_and_rerun_from_the_stores(tmp_path):
    res = _run("dataset-kernel", "--quick", "--quiet", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "%|" not in res.stderr  # --quiet silences the library's bars too
    payload = json.loads((tmp_path / "results.json").read_text())
    results = payload["results"]
    assert results["n_train"] == 200 and results["n_test"] == 100
    cells = results["cells"]
    assert sorted(cells) == ["myrtle5-nngp-8px-float64-n200-100-seed0"]
    for tag, c in cells.items():
        assert c["test_accuracy"] > 0.9, (tag, c)  # 95 % when written
        assert c["diag_reg"] in (1e-4, 1e-3, 1e-2, 1e-1, 1.0) and len(c["val_accuracy"]) == 5
        for part, pairs in (("train_kernel", 200 * 201 // 2), ("test_kernel", 100 * 200)):
            assert c[part]["pairs"] == pairs and c[part]["pairs_per_s"] > 0 and c[part]["sessions"] == 1
    (timing,) = results["timing"]
    assert timing["images"] == 8 and timing["pairs"] == 36
    rate = timing["steady_pairs_per_s"] or timing["pairs_per_s"]
    assert math.isclose(timing["cifar10_full_days"] * 86_400 * rate, 60_000 * 60_001 / 2, rel_tol=1e-9)
    md = (tmp_path / "results.md").read_text()
    assert "digits" in md and "not CIFAR-10" in md and "CIFAR-shaped" in md
    stores = sorted(p.parent for p in (tmp_path / "kernels").glob("*/manifest.json"))
    assert len(stores) == 3  # K(train, train), K(test, train), the timing row's K(x, x)
    before = {str(p): tile_store_info(p) for p in stores}
    assert all(info["complete"] for info in before.values())

    again = _run("dataset-kernel", "--quick", "--quiet", "--out", str(tmp_path), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for p, info in before.items():  # every kernel read back from its store, not one tile computed again
        now = tile_store_info(p)
        assert now["tiles_computed"] == info["tiles_computed"] and now["sessions"] == info["sessions"]
    rerun = json.loads((tmp_path / "results.json").read_text())["results"]
    for tag, c in cells.items():
        assert rerun["cells"][tag]["test_accuracy"] == c["test_accuracy"]
        assert rerun["cells"][tag]["train_kernel"]["pairs_per_s"] == c["train_kernel"]["pairs_per_s"]
