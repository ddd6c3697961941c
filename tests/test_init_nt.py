"""`smnngp.stax` draws neural-tangents 0.6.5's finite networks for the same key (tests/golden/init/params.npz).

``tests/golden/generate_init.py`` ran the networks of ``tests/golden/init_nets.py`` in the oracle environment
(jax 0.4.23 + neural-tangents 0.6.5) and stored their initial parameters and outputs. Here, with
``jax_threefry_partitionable`` set to False (jax 0.4.23's random bits; jax >= 0.5 defaults to True) and the dtype
neural-tangents drew in (float32 without x64, float64 with it):

* ``init_fn(PRNGKey(seed), input_shape)`` gives the same output shape, the same nesting of parameters (lists from
  `serial`, tuples from layers and `parallel`, ``None`` where a bias or query is absent) and every leaf equal to
  neural-tangents' bit for bit, with its shape and dtype; also under ``jit``;
* ``apply_fn`` on neural-tangents' parameters gives neural-tangents' outputs (float64 to 1e-12, float32 to 2e-5,
  relative to the largest entry), `Dropout` in train mode with the same ``rng`` (split by `serial` as
  neural-tangents splits it) included;
* on jax 0.12 (Python 3.13) float64 draws differ from jax 0.4.23's in the last bits (the same random bits, turned
  into normals with other rounding; float32 stays exact), so there float64 leaves are compared to 1e-13 of
  their largest entry (the largest difference seen is 3.4e-15 relative);
* the flag is restored after each test; a bias of a shape ``apply_fn`` cannot place raises an error naming the
  layer, and the 1-D bias of older smnngp versions still gives the same outputs.
"""

import contextlib
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
sys.path.insert(0, HERE)
from init_nets import DTYPES, apply_kwargs, describe, inputs, nets  # noqa: E402

GOLDEN = np.load(os.path.join(HERE, "init", "params.npz"))
META = json.loads(str(GOLDEN["meta"]))
NETS = nets(stax)
CASES = [(name, dtype) for name in NETS for dtype in DTYPES]
RTOL = {"float32": 2e-5, "float64": 1e-12}


@contextlib.contextmanager
def _nt_bits():
    """neural-tangents' random bits (``jax_threefry_partitionable=False``), the previous setting restored after."""
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        yield
    finally:
        jax.config.update("jax_threefry_partitionable", old)


@pytest.fixture
def nt_bits():
    with _nt_bits():
        yield


def _golden_leaves(name, dtype):
    key = f"{name}__{dtype}"
    return [GOLDEN[f"{key}__leaf{i}"] for i in range(META[key]["n_leaves"])]


# jax <= 0.11 turns the random bits into float64 normals exactly as jax 0.4.23 did; jax 0.12 rounds differently.
EXACT_FLOAT64 = tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12)


def _check_params(name, dtype, out_shape, params):
    meta = META[f"{name}__{dtype}"]
    assert describe(params) == meta["tree"], name
    assert [int(n) for n in out_shape] == meta["out_shape"], name
    ours = jax.tree_util.tree_leaves(params)
    gold = _golden_leaves(name, dtype)
    assert len(ours) == len(gold), name
    for i, (a, g) in enumerate(zip(ours, gold)):
        a = np.asarray(a)
        assert (a.shape, a.dtype) == (g.shape, g.dtype), f"{name} leaf {i}: ours {a.shape} {a.dtype}, nt {g.shape}"
        if a.dtype == np.float64 and not EXACT_FLOAT64:
            # same bits, newer rounding (see the docstring): within 1e-13 of the leaf's largest entry (other
            # bits would differ by O(1))
            np.testing.assert_allclose(a, g, rtol=0, atol=1e-13 * float(np.max(np.abs(g))),
                                       err_msg=f"{name} leaf {i}")
        else:
            np.testing.assert_array_equal(a, g, err_msg=f"{name} leaf {i}")


@pytest.mark.parametrize("name,dtype", CASES)
def test_init_fn_draws_neural_tangents_parameters(nt_bits, name, dtype):
    layer, shape, seed = NETS[name]
    with jax.enable_x64(dtype == "float64"):
        out_shape, params = layer[0](jax.random.PRNGKey(seed), shape)
        _check_params(name, dtype, out_shape, params)


@pytest.mark.parametrize("name", ["mlp_serial", "repeat_mlp", "convlocal2d_same", "attn_concat_softmax"])
def test_init_fn_under_jit_draws_the_same(nt_bits, name):
    layer, shape, seed = NETS[name]
    with jax.enable_x64(True):
        params = jax.jit(lambda k: layer[0](k, shape)[1])(jax.random.PRNGKey(seed))
        _check_params(name, "float64", layer[0](jax.random.PRNGKey(seed), shape)[0], params)


@pytest.mark.parametrize("name,dtype", CASES)
def test_apply_fn_on_neural_tangents_parameters(nt_bits, name, dtype):
    layer, shape, seed = NETS[name]
    with jax.enable_x64(dtype == "float64"):
        structure = jax.tree_util.tree_structure(jax.eval_shape(lambda k: layer[0](k, shape)[1],
                                                                jax.random.PRNGKey(seed)))
        params = jax.tree_util.tree_unflatten(structure, [jnp.asarray(g) for g in _golden_leaves(name, dtype)])
        out = np.asarray(layer[1](params, jnp.asarray(inputs(name, shape, dtype)), **apply_kwargs(name, jax)))
    gold = GOLDEN[f"{name}__{dtype}__out"]
    assert out.shape == gold.shape and out.dtype == gold.dtype, (out.shape, out.dtype, gold.shape, gold.dtype)
    err = np.max(np.abs(out - gold)) / np.max(np.abs(gold))
    assert err < RTOL[dtype], f"{name} {dtype}: relative error {err:.2e}"


def test_the_flag_is_restored_even_after_an_error():
    before = jax.config.jax_threefry_partitionable
    for value in (True, False):
        jax.config.update("jax_threefry_partitionable", value)
        with pytest.raises(RuntimeError):
            with _nt_bits():
                assert jax.config.jax_threefry_partitionable is False
                raise RuntimeError
        assert jax.config.jax_threefry_partitionable is value
    jax.config.update("jax_threefry_partitionable", before)


def test_the_default_bits_differ_from_neural_tangents():
    """Without the flag the same key gives other weights: the test above depends on it, not on luck."""
    layer, shape, seed = NETS["dense_ntk"]
    if not jax.config.jax_threefry_partitionable:
        pytest.skip("jax_threefry_partitionable is off in this process")
    with jax.enable_x64(False):
        W = np.asarray(layer[0](jax.random.PRNGKey(seed), shape)[1][0])
    assert not np.array_equal(W, _golden_leaves("dense_ntk", "float32")[0])


def test_a_misshaped_bias_is_an_error_naming_the_layer():
    x = jnp.ones((3, 5))
    dense = stax.Dense(8, b_std=0.1)
    _, (W, b) = dense[0](jax.random.PRNGKey(0), x.shape)
    assert b.shape == (1, 8)
    with pytest.raises(ValueError, match=r"Dense\(8\): bias has shape \(8, 1\), expected \(1, 8\)"):
        dense[1]((W, b.reshape(8, 1)), x)
    with pytest.raises(ValueError, match=r"Dense\(8\): input has 4 features"):
        dense[1]((W, b), jnp.ones((3, 4)))
    conv = stax.Conv(4, (2,), b_std=0.1)
    _, (Wc, bc) = conv[0](jax.random.PRNGKey(0), (2, 5, 3))
    assert bc.shape == (1, 1, 4)
    with pytest.raises(ValueError, match=r"Conv.*bias has shape \(4, 1\), expected \(1, 1, 4\)"):
        conv[1]((Wc, bc.reshape(4, 1)), jnp.ones((2, 5, 3)))


def test_a_bias_without_its_leading_ones_gives_the_same_outputs():
    """What numpy broadcasting adds in neural-tangents (a (width,) bias) is placed explicitly, without rank
    promotion: the outputs equal those of the full-shaped bias."""
    x = jnp.asarray(np.random.RandomState(0).normal(size=(3, 4, 5)))
    for layer in (stax.Dense(6, b_std=0.3), stax.Conv(6, (2,), b_std=0.3, padding="SAME")):
        _, (W, b) = layer[0](jax.random.PRNGKey(1), x.shape)
        with jax.numpy_rank_promotion("raise"):
            full = layer[1]((W, b), x)
            short = layer[1]((W, b.reshape(-1)), x)
        np.testing.assert_array_equal(full, short)
