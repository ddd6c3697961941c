"""The kernel of a whole data set on disk (`smnngp.kernels.batched_kernel_fn` with ``path``, issue 50): equal to the
unbatched kernel, resumed tile by tile after a SIGKILL without recomputing finished tiles, refusing a store of
other inputs, settings or another network, float32 tiles into float64 files, the progress bar, bad paths."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import kernels, stax
from smnngp.kernels import batched_kernel_fn, tile_store_info

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
BOTH = ("nngp", "ntk")


def _net(W_std=1.4):
    """A small convolutional network on 8 x 8 images (all position pairs tracked: AvgPool mixes them)."""
    return stax.serial(stax.Conv(2, (3, 3), padding="SAME", W_std=W_std, b_std=0.1), stax.Relu(),
                       stax.AvgPool((2, 2), strides=(2, 2)), stax.Flatten(), stax.Dense(1, W_std=1.2))


NET = _net()
X = np.random.RandomState(0).normal(size=(22, 8, 8, 1))  # 6 tiles of 4 a side, the last one short: 21 tiles
X2 = np.random.RandomState(1).normal(size=(9, 8, 8, 1))
REF = NET[2](jnp.asarray(X), None, BOTH)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def _counting_finish(monkeypatch):
    """Record the tiles of every group marked done (what was computed in this process)."""
    seen = []
    finish = kernels._TileStore.finish

    def counted(self, chunk, *args, **kwargs):
        seen.extend(chunk)
        return finish(self, chunk, *args, **kwargs)

    monkeypatch.setattr(kernels._TileStore, "finish", counted)
    return seen


def test_store_equals_the_unbatched_kernel_and_a_rerun_computes_nothing(tmp_path, monkeypatch):
    out = batched_kernel_fn(NET[2], 4, path=tmp_path / "sym")(X, None, BOTH)
    assert isinstance(out.nngp, np.memmap) and not out.nngp.flags.writeable
    assert _rel(out.nngp, REF.nngp) < 1e-12 and _rel(out.ntk, REF.ntk) < 1e-12
    info = tile_store_info(tmp_path / "sym")
    assert info["complete"] and info["tiles_total"] == info["tiles_computed"] == 21
    assert info["pairs_computed"] == info["pairs_total"] == 22 * 23 // 2 and info["pairs_per_second"] > 0
    assert sorted(os.listdir(tmp_path / "sym")) == ["done.npy", "lock", "manifest.json", "nngp.npy", "ntk.npy"]

    seen = _counting_finish(monkeypatch)
    again = batched_kernel_fn(NET[2], None, path=tmp_path / "sym")(X, None, BOTH)  # the stored batch size
    assert seen == [] and tile_store_info(tmp_path / "sym")["tiles_computed"] == 21
    np.testing.assert_array_equal(again.ntk, out.ntk)

    ref12 = NET[2](jnp.asarray(X), jnp.asarray(X2), "ntk")
    k12 = batched_kernel_fn(NET[2], 4, path=tmp_path / "x1x2")(X, X2, "ntk")
    assert k12.shape == (22, 9) and _rel(k12, ref12) < 1e-12
    assert tile_store_info(tmp_path / "x1x2")["pairs_total"] == 22 * 9


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from smnngp import kernels
    from test_dataset_kernel import NET, X

    finish, groups = kernels._TileStore.finish, []

    def dying(self, chunk, *args, **kwargs):
        # the fourth group is computed and written into the files, and the process killed before it is marked done
        if len(groups) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        groups.append(chunk)
        finish(self, chunk, *args, **kwargs)

    kernels._TileStore.finish = dying
    kernels.batched_kernel_fn(NET[2], 4, path=sys.argv[1])(X, None, ("nngp", "ntk"))
    """
)


def test_killed_midway_and_resumed_loses_nothing_and_recomputes_no_finished_tile(tmp_path, monkeypatch):
    store = tmp_path / "store"
    res = subprocess.run([sys.executable, "-c", KILLED.format(tests=TESTS), str(store)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert res.returncode == -9, res.stderr[-3000:]
    info = tile_store_info(store)
    assert info["tiles_done"] == info["tiles_computed"] == 3 and not info["complete"]
    done = np.load(store / "done.npy")
    assert done.sum() == 3 and all(done[i, i] for i in range(3))  # the diagonal tiles go first

    seen = _counting_finish(monkeypatch)
    out = batched_kernel_fn(NET[2], 4, path=store)(X, None, BOTH)
    assert _rel(out.nngp, REF.nngp) < 1e-12 and _rel(out.ntk, REF.ntk) < 1e-12
    assert len(seen) == 18 and not {(0, 0), (1, 1), (2, 2)} & set(seen)
    info = tile_store_info(store)
    assert info["complete"] and info["tiles_computed"] == 21
    assert [s["tiles"] for s in info["sessions"]] == [3, 18]
    assert sum(s["pairs"] for s in info["sessions"]) == info["pairs_computed"] == 22 * 23 // 2
    assert info["sessions"][1]["verify_seconds"] > 0  # the first finished tile was computed again and compared


def test_refuses_other_inputs_settings_and_another_network(tmp_path):
    path = tmp_path / "k"
    batched_kernel_fn(NET[2], 4, path=path)(X, None, BOTH)
    before = (path / "manifest.json").read_text()
    other = X.copy()
    other[5, 3, 3, 0] += 1e-9
    cases = [
        (dict(), (other, None, BOTH), r"x1: other values \(SHA-256"),
        (dict(), (X[:20], None, BOTH), r"x1 shape: stored \[22, 8, 8, 1\], given \[20, 8, 8, 1\]"),
        (dict(), (X.astype(np.float32), None, BOTH), "x1 dtype: stored float64, given float32"),
        (dict(), (X, X2, BOTH), r"x2: stored K\(x, x\)"),
        (dict(), (X, None, "nngp"), "get"),
        (dict(batch_size=5), (X, None, BOTH), "batch_size: stored 4, given 5"),
        (dict(out_dtype=np.float32), (X, None, BOTH), "kernels' shapes or dtypes"),
    ]
    for options, call, match in cases:
        fn = batched_kernel_fn(NET[2], options.pop("batch_size", 4), path=path, **options)
        with pytest.raises(ValueError, match=match):
            fn(*call)
    # the same inputs and settings, another network: only the tile computed again tells
    for net in (_net(W_std=1.5), stax.serial(*[NET] * 1, stax.Relu(), stax.Dense(1))):
        with pytest.raises(ValueError, match=r"another kernel_fn .* tile \(0, 0\)"):
            batched_kernel_fn(net[2], 4, path=path)(X, None, BOTH)
    assert (path / "manifest.json").read_text() == before  # refused stores are left as they were


def test_float32_tiles_into_float64_files(tmp_path):
    """float32 inputs: the engine computes in float32, the tiles are written into float64 files; the error against
    the float64 kernel stays at the float32 level (measured 3e-7 on this network), and a resumed float32 store
    passes its own check (the float32 tolerance)."""
    x32 = X.astype(np.float32)
    fn = batched_kernel_fn(NET[2], 4, path=tmp_path / "f32", out_dtype=np.float64)
    out = fn(x32, None, BOTH)
    assert out.nngp.dtype == np.float64
    assert _rel(out.nngp, REF.nngp) < 3e-6 and _rel(out.ntk, REF.ntk) < 3e-6
    assert _rel(out.nngp, REF.nngp) > 1e-9  # float32 tiles indeed, not float64 ones
    kinds = tile_store_info(tmp_path / "f32")["fingerprint"]["kernels"]
    assert kinds["nngp"]["dtype"] == "float64" and kinds["nngp"]["tile_dtype"] == "float32"
    np.testing.assert_array_equal(fn(x32, None, BOTH).ntk, out.ntk)
    in_memory = batched_kernel_fn(NET[2], 4, out_dtype=np.float64)(x32, None, BOTH)  # the same programs
    assert type(in_memory.nngp) is np.ndarray and in_memory.nngp.dtype == np.float64
    np.testing.assert_array_equal(in_memory.nngp, out.nngp)


def test_progress_counts_resumed_tiles_as_done(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    finish, groups = kernels._TileStore.finish, []

    def failing(self, chunk, *args, **kwargs):  # an error after 5 groups: the store stays resumable
        if len(groups) == 5:
            raise KeyboardInterrupt
        groups.append(chunk)
        finish(self, chunk, *args, **kwargs)

    monkeypatch.setattr(kernels._TileStore, "finish", failing)
    with pytest.raises(KeyboardInterrupt):
        batched_kernel_fn(NET[2], 4, path=tmp_path / "p")(X, None, "nngp")
    monkeypatch.undo()
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    capsys.readouterr()
    out = batched_kernel_fn(NET[2], 4, path=tmp_path / "p", progress=True)(X, None, "nngp")
    err = capsys.readouterr().err
    assert _rel(out, REF.nngp) < 1e-12
    assert "kernel tiles" in err and " 5/21 " in err and "21/21" in err
    assert "tile/s" in err and "pairs/s" in err


def test_bad_paths_are_refused_clearly(tmp_path, monkeypatch):
    fn = lambda p: batched_kernel_fn(NET[2], 4, path=p)  # noqa: E731
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        fn(afile)(X, None, "nngp")
    with pytest.raises(ValueError, match="cannot create the tile store directory"):
        fn(afile / "sub")(X, None, "nngp")
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "nngp.npy").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds files but no manifest.json \(nngp.npy\)"):
        fn(stray)(X, None, "nngp")
    with pytest.raises(TypeError, match="path"):
        batched_kernel_fn(NET[2], 4, path=3)
    with pytest.raises(ValueError, match="out_dtype"):
        batched_kernel_fn(NET[2], 4, out_dtype=np.int32)
    with monkeypatch.context() as m:
        m.setattr(kernels.os, "access", lambda *a, **k: False)
        with pytest.raises(PermissionError, match="not writable"):
            fn(tmp_path / "ro")(X, None, "nngp")

    good = tmp_path / "good"
    fn(good)(X, None, "nngp")
    with open(good / "lock") as held:  # another writer
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError, match="being written by another process"):
            fn(good)(X, None, "nngp")
    for name, damage, match in [
        ("manifest.json", b"{not json", "manifest.json cannot be read"),
        ("manifest.json", json.dumps({"format": "other"}).encode(), "not a manifest of this version"),
        ("done.npy", b"garbage", "done.npy cannot be read"),
        ("nngp.npy", None, "nngp.npy cannot be opened"),
    ]:
        broken = tmp_path / f"broken-{name}-{len(damage or b'')}"
        fn(broken)(X, None, "nngp")
        if damage is None:
            os.remove(broken / name)
        else:
            (broken / name).write_bytes(damage)
        with pytest.raises(ValueError, match=f"corrupt .*{match}"):
            fn(broken)(X, None, "nngp")
    np.save(good / "done.npy", np.ones((3, 3), bool))
    with pytest.raises(ValueError, match=r"done.npy is bool \(3, 3\), not bool \(6, 6\)"):
        fn(good)(X, None, "nngp")
    with pytest.raises(ValueError, match="holds no manifest.json"):
        tile_store_info(stray)
