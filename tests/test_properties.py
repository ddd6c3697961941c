"""Invariants over random architectures (hypothesis): symmetry, PSD, tiling, sharding, diagonals."""

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smnngp import stax
from smnngp.kernels import batched_kernel_fn, diagonal

ACTIVATIONS = [
    lambda: stax.Relu(),
    lambda: stax.Erf(),
    lambda: stax.Gelu(),
    lambda: stax.Sin(),
    lambda: stax.Gaussian(),
    lambda: stax.ABRelu(-0.4, 0.9),
    lambda: stax.LeakyRelu(0.2),
    lambda: stax.Erf(a=1.3, b=0.7, c=0.1),
]

stds = st.floats(0.5, 2.0)
biases = st.one_of(st.none(), st.floats(0.0, 1.0))
params = st.sampled_from(["ntk", "standard"])


@st.composite
def dense_archs(draw):
    depth = draw(st.integers(1, 4))
    param = draw(params)
    layers = []
    for _ in range(depth):
        layers += [stax.Dense(draw(st.integers(1, 64)), draw(stds), draw(biases), parameterization=param),
                   ACTIVATIONS[draw(st.integers(0, len(ACTIVATIONS) - 1))]()]
    if draw(st.booleans()):  # a residual block
        layers += [stax.Dense(32, draw(stds), draw(biases), parameterization=param), stax.FanOut(2),
                   stax.parallel(stax.serial(stax.Relu(), stax.Dense(32, draw(stds), None, parameterization=param)),
                                 stax.Identity()),
                   stax.FanInSum(), stax.Erf()]
    layers.append(stax.Dense(1, draw(stds), draw(biases), parameterization=param))
    n, d = draw(st.integers(2, 9)), draw(st.integers(1, 6))
    return stax.serial(*layers), (n, d)


@st.composite
def conv_archs(draw):
    nd = draw(st.integers(1, 2))
    param = draw(params)
    pad = draw(st.sampled_from(["SAME", "CIRCULAR"]))
    layers = []
    for _ in range(draw(st.integers(1, 2))):
        layers += [stax.Conv(8, (draw(st.integers(1, 3)),) * nd, padding=pad, W_std=draw(stds), b_std=draw(biases),
                             parameterization=param),
                   ACTIVATIONS[draw(st.integers(0, len(ACTIVATIONS) - 1))]()]
    if draw(st.booleans()):
        layers.append(stax.AvgPool((2,) * nd, strides=(draw(st.integers(1, 2)),) * nd, padding=pad))
    layers.append(draw(st.sampled_from([stax.Flatten(), stax.GlobalAvgPool()])))
    layers.append(stax.Dense(1, draw(stds), draw(biases), parameterization=param))
    n = draw(st.integers(2, 5))
    return stax.serial(*layers), (n,) + (draw(st.integers(3, 5)),) * nd + (draw(st.integers(1, 3)),)


def _check_psd(mat, what):
    mat = np.asarray(mat)
    assert np.allclose(mat, mat.T, rtol=1e-12, atol=1e-12 * np.abs(mat).max()), f"{what} not symmetric"
    eig = np.linalg.eigvalsh((mat + mat.T) / 2)
    assert eig.min() >= -1e-10 * max(np.trace(mat), 1e-300), f"{what}: min eigenvalue {eig.min()}"


def _psd_kernels(arch, seed):
    """Kernels of random inputs for a drawn architecture, checked symmetric and PSD."""
    layer, shape = arch
    x = np.random.RandomState(seed).normal(size=shape)
    k = layer[2](jnp.asarray(x), None, ("nngp", "ntk"))
    _check_psd(k.nngp, "nngp")
    _check_psd(k.ntk, "ntk")
    return layer, x, k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=dense_archs(), seed=st.integers(0, 2**16))
def test_dense_kernels_symmetric_psd_and_consistent(arch, seed):
    layer, x, k = _psd_kernels(arch, seed)
    # k(x, x) with x2 given equals the x2=None path. The ReLU-family kernels have a
    # square-root singularity at correlation 1, so a last-bit difference in the input
    # moments (two einsums) may move coincident-point entries by ~sqrt(eps) ~ 1e-8.
    k2 = layer[2](jnp.asarray(x), jnp.asarray(x), ("nngp", "ntk"))
    np.testing.assert_allclose(k2.nngp, k.nngp, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(k2.ntk, k.ntk, rtol=1e-6, atol=1e-12)
    d = diagonal(layer[2], x, ("nngp", "ntk"))
    np.testing.assert_allclose(d.nngp, np.diag(k.nngp), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d.ntk, np.diag(k.ntk), rtol=1e-12, atol=1e-14)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=conv_archs(), seed=st.integers(0, 2**16))
def test_conv_kernels_symmetric_psd(arch, seed):
    _psd_kernels(arch, seed)


@settings(max_examples=10, deadline=None)
@given(arch=dense_archs(), b=st.integers(1, 4), seed=st.integers(0, 2**16), sym=st.booleans())
def test_tiled_equals_untiled(arch, b, seed, sym):
    layer, shape = arch
    rng = np.random.RandomState(seed)
    x1 = rng.normal(size=shape)
    x2 = None if sym else rng.normal(size=(shape[0] + 2, shape[1]))
    ref = layer[2](jnp.asarray(x1), None if x2 is None else jnp.asarray(x2), ("nngp", "ntk"))
    tiled = batched_kernel_fn(layer[2], batch_size=b)(x1, x2)
    np.testing.assert_allclose(tiled.nngp, ref.nngp, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tiled.ntk, ref.ntk, rtol=1e-12, atol=1e-14)


def test_tiled_cnn_full_spatial_output_symmetric_fill():
    # A network ending in a Conv keeps all position pairs; mirrored tiles must swap them.
    layer = stax.serial(stax.Conv(4, (3,), padding="SAME", W_std=1.3, b_std=0.1), stax.Relu(),
                        stax.AvgPool((2,)), stax.Conv(2, (2,), padding="VALID"))
    x = np.random.RandomState(0).normal(size=(7, 6, 2))
    ref = layer[2](jnp.asarray(x), None, "nngp")
    tiled = batched_kernel_fn(layer[2], batch_size=3)(x, None, "nngp")
    assert ref.shape == (7, 7, 4, 4)
    np.testing.assert_allclose(tiled, ref, rtol=1e-12, atol=1e-14)


def test_large_cross_kernels_use_tiles_correctly(monkeypatch):
    """An (x1, x2) kernel of >= 2^20 entries runs tile pair by tile pair (`_cross_kernel_map`): equal to the untiled
    path, the variances of both inputs included; 203 x 150 points pad the last tile of each."""
    from smnngp.stax import _core

    calls = []
    tiled = _core._cross_kernel_map
    monkeypatch.setattr(_core, "_cross_kernel_map", lambda *a: calls.append(a[-2:]) or tiled(*a))
    monkeypatch.setattr(_core, "_CROSS_TILE_ENTRIES", 2**16)  # small tiles, so that these sizes take several
    cases = [
        (stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                     stax.Conv(8, (3, 3), padding="SAME"), stax.Erf(), stax.Flatten(), stax.Dense(1)),
         (203, 8, 8, 1), (150, 8, 8, 1)),
        (stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                     stax.AvgPool((2, 2)), stax.GlobalAvgPool(), stax.Dense(1)), (37, 8, 8, 2), (29, 8, 8, 2)),
    ]
    rng = np.random.RandomState(0)
    for layer, s1, s2 in cases:
        x1, x2 = jnp.asarray(rng.normal(size=s1)), jnp.asarray(rng.normal(size=s2))
        got = layer[2](x1, x2)
        monkeypatch.setattr(_core, "_CROSS_TILES", False)
        ref = layer[2](x1, x2)
        monkeypatch.setattr(_core, "_CROSS_TILES", True)
        for name in ("nngp", "ntk", "cov1", "cov2"):
            np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-12, atol=1e-14, err_msg=name)
        assert got.nngp.shape == (s1[0], s2[0]) and not got.x1_is_x2
    assert len(calls) == len(cases) and all(ta * tb > 1 for ta, tb in calls)


def test_memory_cap_chooses_tiles():
    layer = stax.serial(stax.Dense(8, 1.2, 0.1), stax.Relu(), stax.Dense(1))
    x = np.random.RandomState(0).normal(size=(300, 3))
    ref = layer[2](jnp.asarray(x), None, "nngp")
    small = batched_kernel_fn(layer[2], max_memory_bytes=200_000)(x, None, "nngp")
    np.testing.assert_allclose(small, ref, rtol=1e-12, atol=1e-14)


SHARDED = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np, jax.numpy as jnp
    from smnngp import stax
    from smnngp.kernels import batched_kernel_fn
    assert len(jax.local_devices()) == 4, jax.local_devices()
    layer = stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                        stax.AvgPool((2, 2), strides=(2, 2)), stax.Flatten(), stax.Dense(1))
    x1 = np.random.RandomState(0).normal(size=(13, 4, 4, 2))
    x2 = np.random.RandomState(1).normal(size=(9, 4, 4, 2))
    ref = layer[2](jnp.asarray(x1), jnp.asarray(x2), ("nngp", "ntk"))
    fn = batched_kernel_fn(layer[2], batch_size=3)
    out = fn(x1, x2)
    np.testing.assert_allclose(out.nngp, ref.nngp, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out.ntk, ref.ntk, rtol=1e-12, atol=1e-14)
    sym = fn(x1)
    ref_sym = layer[2](jnp.asarray(x1), None, ("nngp", "ntk"))
    np.testing.assert_allclose(sym.ntk, ref_sym.ntk, rtol=1e-12, atol=1e-14)
    print("SHARDED-OK", len(jax.local_devices()))
    """
)


def test_sharded_equals_unsharded_on_four_host_devices():
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True, env=env, cwd=root,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "SHARDED-OK 4" in res.stdout


def test_large_symmetric_spatial_kernels_use_mirrored_tiles_correctly(monkeypatch):
    # x2=None on a large kernel evaluates only the upper tiles (one after another) and mirrors the rest;
    # compare with the x2=x path (no tiling). 203 and 1031 points also exercise the padding of the last tile.
    from smnngp.stax import _core

    calls = []
    tiled = _core._symmetric_kernel_map
    monkeypatch.setattr(_core, "_symmetric_kernel_map", lambda *a: calls.append(a[-1]) or tiled(*a))
    monkeypatch.setattr(_core, "_CROSS_TILES", False)  # the x2=x reference stays untiled
    cases = [
        (stax.serial(stax.Dense(64, W_std=1.5, b_std=0.05), stax.Relu(), stax.Dense(64, W_std=1.3), stax.Erf(),
                     stax.Dense(1)), (1031, 5)),
        (stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                     stax.Conv(8, (3, 3), padding="SAME"), stax.Erf(), stax.Flatten(), stax.Dense(1)), (203, 8, 8, 1)),
        (stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                     stax.AvgPool((2, 2)), stax.GlobalAvgPool(), stax.Dense(1)), (37, 8, 8, 2)),
    ]
    for layer, shape in cases:
        x = jnp.asarray(np.random.RandomState(0).normal(size=shape))
        sym = layer[2](x, None, ("nngp", "ntk"))
        ref = layer[2](x, x, ("nngp", "ntk"))
        np.testing.assert_allclose(sym.nngp, ref.nngp, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(sym.ntk, ref.ntk, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(sym.nngp, np.asarray(sym.nngp).T, rtol=1e-13, atol=1e-15)
    assert len(calls) == len(cases) and min(calls) > 1  # every case took the tiled path, in several tiles
