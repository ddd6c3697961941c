"""Bad input gets a ValueError/TypeError that names the layer, argument or shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smnngp import stax
from smnngp.kernels import batched_kernel_fn, diagonal

MLP = stax.serial(stax.Dense(16, 1.5, 0.1), stax.Relu(), stax.Dense(1))
CNN = stax.serial(stax.Conv(8, (3, 3), padding="SAME"), stax.Relu(), stax.Flatten(), stax.Dense(1))


@settings(max_examples=25, deadline=None)
@given(w=st.one_of(st.floats(max_value=0.0, allow_nan=False), st.just(float("nan")), st.just(float("inf"))))
def test_non_positive_or_non_finite_w_std(w):
    with pytest.raises(ValueError, match="W_std"):
        stax.Dense(4, W_std=w)
    with pytest.raises(ValueError, match="W_std"):
        stax.Conv(4, (3,), W_std=w)


@settings(max_examples=15, deadline=None)
@given(b=st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False))
def test_negative_b_std(b):
    with pytest.raises(ValueError, match="b_std"):
        stax.Dense(4, b_std=b)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_widths(bad):
    with pytest.raises(ValueError, match="out_dim"):
        stax.Dense(bad)
    with pytest.raises(ValueError, match="out_chan"):
        stax.Conv(bad, (3,))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="padding"):
        stax.Conv(4, (3,), padding="REFLECT")
    with pytest.raises(ValueError, match="parameterization"):
        stax.Dense(4, parameterization="mup")
    with pytest.raises(ValueError, match="strides"):
        stax.Conv(4, (3, 3), strides=(1,))
    with pytest.raises(ValueError, match="deg"):
        stax.ElementwiseNumerical(jnp.tanh, deg=0)
    with pytest.raises(TypeError, match="smnngp.stax"):
        stax.serial(stax.Dense(3), (lambda *a: None, lambda *a: None, lambda *a: None))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), d=st.integers(1, 4), pos=st.integers(0, 19), val=st.sampled_from([np.nan, np.inf, -np.inf]))
def test_non_finite_inputs(n, d, pos, val):
    x = np.random.RandomState(0).normal(size=(n, d))
    x.flat[pos % x.size] = val
    with pytest.raises(ValueError, match="x1 has 1 non-finite"):
        MLP[2](x, None, "nngp")
    with pytest.raises(ValueError, match="x2 has 1 non-finite"):
        MLP[2](np.ones((2, d)), x, "nngp")


def test_wrong_rank_for_conv_names_layer_and_shape():
    with pytest.raises(ValueError, match=r"Conv\(8, \(3, 3\)\).*rank 4.*\(5, 7\)"):
        CNN[2](np.ones((5, 7)), None, "nngp")
    with pytest.raises(ValueError, match=r"Conv\(8, \(3, 3\)\).*\(5, 7, 3\)"):
        CNN[0](jax.random.PRNGKey(0), (5, 7, 3))


def test_input_rank_and_dtype():
    with pytest.raises(ValueError, match="batch axis and a feature axis"):
        MLP[2](np.ones(5), None, "nngp")
    with pytest.raises(TypeError, match="floating point"):
        MLP[2](np.ones((3, 2), dtype=np.int32), None, "nngp")
    with pytest.raises(ValueError, match=r"x1 \(3, 2\) and x2 \(4, 3\)"):
        MLP[2](np.ones((3, 2)), np.ones((4, 3)), "nngp")


@pytest.mark.parametrize("get", ["nngp ", "cov3", ("nngp", "ntkk"), (), ("nngp", "NNGP")])
def test_unknown_get(get):
    with pytest.raises(ValueError, match="get"):
        MLP[2](np.ones((3, 2)), None, get)


def test_get_reads_any_kernel_field_by_name_as_neural_tangents():
    x1, x2 = np.ones((3, 2)), np.linspace(0.1, 1.0, 8).reshape(4, 2)
    k = MLP[2](x1, x2)
    cov1, shape2, ntk = MLP[2](x1, x2, ("cov1", "shape2", "NTK"))
    np.testing.assert_array_equal(cov1, k.cov1)
    assert shape2 == k.shape2 == (4, 1)
    np.testing.assert_array_equal(ntk, k.ntk)
    np.testing.assert_array_equal(MLP[2](x1, x2, "cov2"), k.cov2)


def test_mismatched_branch_shapes_name_fan_in():
    net = stax.serial(stax.Dense(8), stax.FanOut(2), stax.parallel(stax.Dense(4), stax.Dense(5)), stax.FanInSum())
    with pytest.raises(ValueError, match=r"FanInSum: branch shapes differ: \[\(3, 4\), \(3, 5\)\]"):
        net[2](np.ones((3, 2)), None, "nngp")
    with pytest.raises(ValueError, match="FanInSum"):
        net[0](jax.random.PRNGKey(0), (3, 2))
    with pytest.raises(ValueError, match="parallel"):
        stax.serial(stax.Dense(3), stax.parallel(stax.Dense(2), stax.Dense(2)))[2](np.ones((2, 2)), None, "nngp")


def test_params_from_another_network_rejected_by_apply():
    _, params = MLP[0](jax.random.PRNGKey(0), (3, 5))
    with pytest.raises(ValueError, match=r"Dense\(16\): input has 4 features but W expects 5"):
        MLP[1](params, jnp.ones((3, 4)))


def test_activation_needs_gaussian_input():
    with pytest.raises(ValueError, match="Relu.*must be Gaussian"):
        stax.serial(stax.Relu(), stax.Dense(1))[2](np.ones((3, 2)), None, "nngp")
    # after two independent ReLU branches summed: neither Gaussian nor a function of one Gaussian (Erf after a
    # Relu alone is a chain, which smnngp integrates)
    two = stax.serial(stax.Dense(3), stax.FanOut(2), stax.parallel(stax.serial(stax.Dense(3), stax.Relu()),
                                                                   stax.serial(stax.Dense(3), stax.Relu())),
                      stax.FanInSum(), stax.Erf(), stax.Dense(1))
    with pytest.raises(ValueError, match="Erf.*must be Gaussian.*chain of activations of one Gaussian"):
        two[2](np.ones((3, 2)), None, "nngp")


def test_valid_padding_too_small():
    with pytest.raises(ValueError, match="VALID"):
        stax.serial(stax.Conv(4, (5,), padding="VALID"), stax.Flatten())[2](np.ones((2, 3, 1)), None, "nngp")


def test_helpers_reject_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        batched_kernel_fn(MLP[2], batch_size=0)
    with pytest.raises(ValueError, match=r"x1 \(3, 2\) and x2 \(3, 4\)"):
        batched_kernel_fn(MLP[2], batch_size=2)(np.ones((3, 2)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="diagonal"):
        diagonal(MLP[2], np.ones(3))


def test_jit_still_works_with_validation():
    fn = jax.jit(MLP[2], static_argnames="get")
    x = jnp.asarray(np.random.RandomState(0).normal(size=(4, 3)))
    np.testing.assert_allclose(fn(x, None, get="nngp"), MLP[2](x, None, "nngp"), rtol=1e-12)
