"""smnngp.empirical against neural-tangents 0.6.5's empirical kernels (fixtures in tests/golden/empirical/).

* every NTK implementation (1, 2, 3 and AUTO) equals nt's NTK (float64, 1e-10 relative) on a dense MLP, a
  CNN, a ResNet block and a self-attention block, for traced / full / diagonal output axes and vmap_axes;
  the NNGP equals nt's; the implementations agree with each other;
* linearize / taylor_expand equal nt's; monte_carlo_kernel_fn equals nt's with the same key (the PRNG run in
  nt's non-partitionable threefry mode) and converges to `smnngp.stax`'s infinite-width NNGP;
* bad arguments raise errors naming the function.
"""

import glob
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import empirical as E

HERE = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, HERE)
import empirical_cases as C  # noqa: E402

FIX = os.path.join(HERE, "empirical")
NETS = C.networks()
CASES = [(net, s) for net in NETS for s in C.SETTINGS]


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("net,setting", CASES, ids=[f"{n}_{s[0]}" for n, s in CASES])
def test_kernels_match_neural_tangents(net, setting):
    f, params, _, _ = NETS[net]
    suffix, ta, da, va, _ = setting
    g = np.load(os.path.join(FIX, f"{net}_{suffix}.npz"))
    x1, x2 = g["x1"], (g["x2"] if "x2" in g else None)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    assert _rel(E.empirical_nngp_fn(f, ta, da)(x1, x2, params), g["nngp"]) < 1e-10
    ours = {}
    for impl in (1, 2, 3):
        ours[impl] = np.asarray(E.empirical_ntk_fn(f, ta, da, va, impl)(x1, x2, params))
        assert ours[impl].shape == g["ntk_1"].shape
        for theirs in (1, 2, 3):
            assert _rel(ours[impl], g[f"ntk_{theirs}"]) < 1e-10, (impl, theirs)
    assert _rel(ours[2], ours[1]) < 1e-12 and _rel(ours[3], ours[1]) < 1e-12
    both = E.empirical_kernel_fn(f, ta, da, va, 3)(x1, x2, None, params)
    assert type(both).__name__ == "EmpiricalKernel" and _rel(both.ntk, g["ntk_1"]) < 1e-10


@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_auto_picks_a_method_and_matches(net):
    f, params, _, _ = NETS[net]
    g = np.load(os.path.join(FIX, f"{net}_logits.npz"))
    params = jax.tree_util.tree_map(jnp.asarray, params)
    fn = E.empirical_ntk_fn(f, implementation=E.NtkImplementation.AUTO)
    assert _rel(fn(g["x1"], g["x2"], params), g["ntk_1"]) < 1e-10


def test_structured_rules_are_used():
    # The CNN's two conv kernels and its dense readout go through rules; only the bias falls back.
    from smnngp.empirical._structured import _Program

    f, params, s1, _ = NETS["cnn"]
    leaves, tree = jax.tree_util.tree_flatten(jax.tree_util.tree_map(jnp.asarray, params))
    x = jnp.zeros(s1)
    prog = _Program(lambda *lv: f(tree.unflatten(list(lv[:-1])), lv[-1]), len(leaves), leaves + [x])
    names = sorted(params)  # dict leaves are flattened in key order
    assert sorted(names[i] for i in prog.structured) == ["W", "k1", "k2"]


@pytest.mark.parametrize("net", list(NETS))
def test_linearize_and_taylor_match_neural_tangents(net):
    f, params, _, _ = NETS[net]
    g = np.load(os.path.join(FIX, f"{net}_taylor.npz"))
    params = jax.tree_util.tree_map(jnp.asarray, params)
    p2 = jax.tree_util.tree_map(lambda a: a + 0.1 * jnp.cos(jnp.arange(a.size).reshape(a.shape)), params)
    assert _rel(E.linearize(f, params)(p2, g["x1"]), g["lin"]) < 1e-10
    for d in (0, 2, 3):
        assert _rel(E.taylor_expand(f, params, d)(p2, g["x1"]), g[f"taylor_{d}"]) < 1e-10


def test_ntk_vp_is_the_ntk_times_a_vector():
    f, params, _, _ = NETS["mlp"]
    g = np.load(os.path.join(FIX, "mlp_full.npz"))
    full = g["ntk_1"]  # (N1, N2, C, C) zipped
    v = np.random.default_rng(1).standard_normal((g["x2"].shape[0], full.shape[-1]))
    got = E.empirical_ntk_vp_fn(f, g["x1"], g["x2"], jax.tree_util.tree_map(jnp.asarray, params))(v)
    assert _rel(got, np.einsum("ijab,jb->ia", full, v)) < 1e-10


@pytest.fixture
def _nt_prng():
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    yield
    jax.config.update("jax_threefry_partitionable", old)


def test_monte_carlo_matches_neural_tangents_with_the_same_key(_nt_prng):
    g = np.load(os.path.join(FIX, "mc.npz"))
    for impl in (1, 2):
        kfn = E.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(7), 5, implementation=impl,
                                      samples_per_call=2)
        k = kfn(g["x1"], g["x2"], ("nngp", "ntk"))
        assert type(k).__name__ == "MonteCarloKernel"
        assert _rel(k.nngp, g[f"nngp_{impl}"]) < 1e-10 and _rel(k.ntk, g[f"ntk_{impl}"]) < 1e-10
    gen = E.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(7), [1, 3], vmap_axes=0,
                                  batch_size=2, store_on_device=False)
    for n, k in zip([1, 3], gen(g["x1"], None, "ntk")):
        assert isinstance(k, np.ndarray) and _rel(k, g[f"gen_ntk_{n}"]) < 1e-10


def test_monte_carlo_ntk_of_a_conv_net_agrees_across_implementations_and_devices():
    """A conv net's Monte-Carlo NTK, samples vmapped (the weights batched inside a conv's Jacobian): the three
    implementations agree to rounding, and spreading the samples over 2 forced host devices changes nothing."""
    code = textwrap.dedent(
        """
        import os
        # before jax is imported (appended: the suite sets its own XLA flags)
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"  # the forced devices are host devices, also on a GPU machine
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from smnngp import empirical as E, stax
        assert len(jax.devices()) == 2
        init_fn, apply_fn, _ = stax.serial(stax.Conv(4, (3, 3), padding="SAME"), stax.Relu(), stax.Flatten(),
                                           stax.Dense(1))
        x = np.random.default_rng(0).standard_normal((3, 5, 5, 2))
        out = {}
        for impl in (1, 2, 3):
            for dev in (1, -1):
                kfn = E.monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(1), 3, implementation=impl,
                                              vmap_axes=0, samples_per_call=2, device_count=dev)
                out[impl, dev] = np.asarray(kfn(x, None, "ntk"))
        ref = out[1, 1]
        print("MAXREL", max(float(np.max(np.abs(v - ref)) / np.max(np.abs(ref))) for v in out.values()))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]
    rel = float(run.stdout.split("MAXREL")[1].split()[0])
    assert rel < 1e-10, run.stdout


def test_monte_carlo_nngp_converges_to_the_infinite_width_kernel():
    from smnngp import stax

    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(256), stax.Erf(), stax.Dense(8))
    x = np.random.default_rng(2).standard_normal((3, 4))
    n, c = 200, 8
    est = E.monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(0), n, samples_per_call=50)(x, None, "nngp")
    exact = np.asarray(kernel_fn(x, None, "nngp"))
    # Gaussian-limit standard error of the mean of f_i f_j over n draws and c i.i.d. channels:
    # sqrt((K_ii K_jj + K_ij^2) / (n c)); every entry must lie within 4 standard errors.
    d = np.diag(exact)
    se = np.sqrt((np.outer(d, d) + exact**2) / (n * c))
    assert np.all(np.abs(np.asarray(est) - exact) < 4 * se)


def test_monte_carlo_kernel_of_x_against_itself_is_symmetric_when_tiled():
    """With dropout every tile is a different draw; a tile below the diagonal is the transpose of the one above,
    so the tiled estimate of K(x, x) is symmetric (predict's factorisations need it)."""
    from smnngp import stax

    init_fn, apply_fn, _ = stax.serial(stax.Dense(16), stax.Relu(), stax.Dropout(0.7, mode="train"), stax.Dense(2))
    x = np.random.default_rng(3).standard_normal((5, 3))
    kfn = E.monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(0), 2, batch_size=2)
    for k in kfn(x, None, ("nngp", "ntk")):
        k = np.asarray(k)
        np.testing.assert_array_equal(k, k.T)


def test_vmap_axes_and_same_inputs_in_neural_tangents_spellings():
    """vmap_axes written as a tuple for a network whose outputs come as a list, and x2 written as a pytree of None
    (NT's spelling of x2 = x1), give the plain kernel in every implementation."""
    from smnngp import stax

    init_fn, apply_fn, _ = stax.parallel(stax.Dense(3), stax.Dense(2))
    rs = np.random.default_rng(4)
    xs = (rs.standard_normal((3, 4)), rs.standard_normal((3, 5)))
    _, params = init_fn(jax.random.PRNGKey(1), ((3, 4), (3, 5)))
    for impl in (1, 2, 3):
        ref = E.empirical_ntk_fn(apply_fn, implementation=impl)(xs, None, params)
        got = E.empirical_ntk_fn(apply_fn, implementation=impl, vmap_axes=(0, 0))(xs, (None, None), params)
        assert isinstance(got, list) and len(got) == 2
        for g, r in zip(got, ref):
            assert _rel(g, r) < 1e-12


def test_errors_name_the_function():
    f = C.mlp
    with pytest.raises(ValueError, match="empirical_ntk_fn: implementation"):
        E.empirical_ntk_fn(f, implementation=7)
    with pytest.raises(ValueError, match="taylor_expand: degree"):
        E.taylor_expand(f, {}, -1)
    with pytest.raises(ValueError, match="monte_carlo_kernel_fn: n_samples must be positive"):
        E.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(0), [0, 2])
    with pytest.raises(TypeError, match="monte_carlo_kernel_fn: n_samples"):
        E.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(0), 2.5)
    with pytest.raises(ValueError, match="EmpiricalKernel: get"):
        E.empirical_kernel_fn(f)(np.ones((2, 4)), None, "cov", NETS["mlp"][1])
    with pytest.raises(ValueError, match="trace axis 5 is out of range"):
        E.empirical_nngp_fn(f, trace_axes=(5,))(np.ones((2, 4)), None, NETS["mlp"][1])


def test_fixtures_present():
    assert len(glob.glob(os.path.join(FIX, "*.npz"))) == len(CASES) + len(NETS) + 1
