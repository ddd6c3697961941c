"""`smnngp.models.myrtle`: the Myrtle CNNs of Shankar et al. (2020) whose data-set kernels
``python -m experiments dataset-kernel`` computes."""

import os

import jax
import numpy as np
import pytest

from smnngp import models

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "pool_myrtle5_32.npz")


def test_myrtle5_kernel_equals_neural_tangents_myrtle5():
    """neural-tangents 0.6.5's Myrtle-5 (built as its Myrtle notebook does; tests/golden/cases_pooling.py) on
    32 x 32 x 3 images."""
    gold = np.load(GOLDEN)
    _, _, kernel_fn = models.myrtle(5)
    # float64: tests/conftest.py enables x64
    k = jax.jit(kernel_fn, static_argnames="get")(gold["x1"], gold["x2"], get=("nngp", "ntk"))
    np.testing.assert_allclose(np.asarray(k.nngp), gold["nngp"], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(k.ntk), gold["ntk"], rtol=1e-10)


@pytest.mark.parametrize("depth, convs", [(5, 4), (7, 6), (10, 9)])
def test_myrtle_depth_counts_convolutions_and_readout(depth, convs):
    init_fn, apply_fn, _ = models.myrtle(depth, width=4)
    _, params = init_fn(jax.random.PRNGKey(0), (1, 32, 32, 3))
    leaves = [p for p in jax.tree_util.tree_leaves(params) if p.ndim == 4 and p.shape[:2] == (3, 3)]   # the filters
    assert len(leaves) == convs
    assert apply_fn(params, np.zeros((2, 32, 32, 3), np.float32)).shape == (2, 10)


@pytest.mark.parametrize("kw, match", [({"depth": 6}, "depth must be one of"), ({"width": 0}, "width"),
                                       ({"n_out": 2.5}, "n_out"), ({"pools_at_end": -1}, "pools_at_end")])
def test_myrtle_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        models.myrtle(**kw)
