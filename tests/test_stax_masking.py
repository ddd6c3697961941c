"""Masked inputs (``mask_constant``): finite networks against neural-tangents 0.6.5 on the same parameters,
kernel composition, Monte-Carlo convergence, invariances, errors, and the two layout / padding fixes.

The kernel side's golden values are the ``masking_*`` cases of ``tests/golden/cases_masking.py``
(``tests/test_golden.py -k masking``)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import monte_carlo_nngp

jax.config.update("jax_enable_x64", True)

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, GOLDEN)
from masking_apply_nets import PAD, nets  # noqa: E402

NETS = nets(stax)


@pytest.mark.parametrize("name", sorted(NETS))
def test_apply_matches_neural_tangents(name):
    layer, shape = NETS[name]
    init_fn, apply_fn, _ = layer
    gold = np.load(os.path.join(GOLDEN, "masking_apply", f"{name}.npz"))
    _, params = init_fn(jax.random.PRNGKey(0), shape)
    leaves, tree = jax.tree_util.tree_flatten(params)
    theirs = [gold[f"leaf{i}"] for i in range(len(leaves))]
    assert f"leaf{len(leaves)}" not in gold.files
    assert [a.size for a in leaves] == [b.size for b in theirs]
    params = jax.tree_util.tree_unflatten(tree, [jnp.asarray(b).reshape(a.shape) for a, b in zip(leaves, theirs)])
    x = gold["x"]
    out = apply_fn(params, x, mask_constant=PAD)
    assert isinstance(out, stax.MaskedArray)
    np.testing.assert_allclose(out.masked_value, gold["value"], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(np.broadcast_to(out.mask, gold["value"].shape),
                                  np.broadcast_to(gold["mask"], gold["value"].shape))
    plain = stax.unmask_fn(apply_fn)(params, x, mask_constant=PAD)
    np.testing.assert_allclose(plain, gold["plain"], rtol=1e-9, atol=1e-12)
    # A MaskedArray input is the same as the mask constant.
    again = apply_fn(params, stax.MaskedArray(np.where(x == PAD, 0.0, x), x == PAD))
    np.testing.assert_allclose(again.masked_value, out.masked_value, rtol=1e-12)


def padded(n_points, lengths, t=5, c=3, seed=0):
    x = np.random.RandomState(seed).normal(size=(n_points, t, c))
    for i, n in enumerate(lengths):
        x[i, n:] = PAD
    return x


def test_masked_positions_do_not_matter_and_unmasked_equals_truncated():
    """Changing padded entries changes nothing; a fully unpadded sequence gives the unmasked kernel."""
    net = stax.serial(stax.Dense(4, 1.2, 0.1), stax.Relu(), stax.Dense(3), stax.GlobalAvgPool(), stax.Dense(1))
    kfn = net[2]
    x = padded(3, (5, 3, 2))
    k = kfn(x, None, "nngp", mask_constant=PAD)
    # The unmasked point's kernel with itself is that of the network without masking.
    np.testing.assert_allclose(k[0, 0], kfn(x[:1], None, "nngp")[0, 0], rtol=1e-12)
    # A point with 3 valid steps: the kernel equals that of the truncated sequence.
    np.testing.assert_allclose(k[1, 1], kfn(x[1:2, :3], None, "nngp")[0, 0], rtol=1e-12)


def test_kernel_keeps_masks_through_composition():
    first = stax.serial(stax.Dense(4, 1.2, 0.1), stax.Relu(), stax.Dense(3, 1.0, 0.2))
    second = stax.serial(stax.GlobalSelfAttention(3, 2, 2, 1, linear_scaling=True), stax.GlobalAvgPool())
    whole = stax.serial(first, second)
    x1, x2 = padded(3, (5, 3, 2)), padded(2, (4, 1), seed=1)
    k = first[2](x1, x2, mask_constant=PAD)
    assert k.mask1 is not None and k.mask1.shape == (3, 5, 1)
    composed = second[2](k, get=("nngp", "ntk"))
    direct = whole[2](x1, x2, ("nngp", "ntk"), mask_constant=PAD)
    np.testing.assert_allclose(composed.nngp, direct.nngp, rtol=1e-12)
    np.testing.assert_allclose(composed.ntk, direct.ntk, rtol=1e-12)
    # Entries that involve a masked position are zero in the remasked kernel.
    assert np.all(np.asarray(k.nngp)[1, :, 3:] == 0) and np.all(np.asarray(k.nngp)[:, 1, :, 1:] == 0)


def test_monte_carlo_converges_to_masked_kernel():
    net = stax.serial(stax.Dense(128, 1.3, 0.2), stax.Relu(), stax.Dense(128, 1.1, 0.1), stax.GlobalAvgPool(),
                      stax.Dense(1))
    x = padded(3, (5, 3, 2), seed=2)
    exact = net[2](x, None, "nngp", mask_constant=PAD)
    init_fn, apply_fn, _ = net
    unmasked = stax.unmask_fn(apply_fn)
    est, se = monte_carlo_nngp(init_fn, lambda p, z: unmasked(p, z, mask_constant=PAD), x,
                               jax.random.PRNGKey(1), n_draws=128, chunk=128)
    # Within 5 standard errors plus the O(1 / width) finite-width bias.
    assert np.all(np.abs(np.asarray(est) - np.asarray(exact)) <= 5 * np.asarray(se) + 0.03 * float(np.max(exact)))


def test_channelwise_masks_raise_with_the_layer_name():
    x = padded(2, (5, 3))
    x[0, 0, 0] = PAD  # one channel of one position masked
    with pytest.raises(NotImplementedError, match="GlobalAvgPool: masks that differ between channels"):
        stax.GlobalAvgPool()[2](x, None, "nngp", mask_constant=PAD)
    with pytest.raises(NotImplementedError, match="AvgPool"):
        stax.AvgPool((2,))[2](x, None, "nngp", mask_constant=PAD)


def test_unsupported_layers_raise_with_their_name():
    x = padded(2, (5, 3))
    layer = stax.serial(stax.Dense(2), stax.ConvTranspose(2, (2,)))
    with pytest.raises(ValueError, match="ConvTranspose.*masked"):
        layer[2](x, None, "nngp", mask_constant=PAD)
    _, params = layer[0](jax.random.PRNGKey(0), x.shape)
    with pytest.raises(ValueError, match="ConvTranspose.*masked"):
        layer[1](params, x, mask_constant=PAD)
    with pytest.raises(TypeError, match="unmask_fn"):
        stax.unmask_fn(3)


def test_unmasked_calls_return_plain_arrays():
    net = stax.serial(stax.Dense(3), stax.Relu())
    _, params = net[0](jax.random.PRNGKey(0), (2, 4))
    out = net[1](params, np.ones((2, 4)))
    assert not isinstance(out, stax.MaskedArray)
    k = net[2](np.ones((2, 4)), None)
    assert k.mask1 is None and k.mask2 is None


def test_batch_axis_1_inputs_of_different_batch_sizes():
    """The x1 / x2 agreement check looks at canonical shapes (batch moved first)."""
    layer = stax.serial(stax.Dense(3, batch_axis=1, channel_axis=0), stax.Relu())
    rng = np.random.RandomState(0)
    x1, x2 = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    k = layer[2](x1, x2, "nngp")
    assert k.shape == (3, 2)
    ref = stax.serial(stax.Dense(3), stax.Relu())[2](x1.T, x2.T, "nngp")
    np.testing.assert_allclose(k, ref, rtol=1e-12)
    with pytest.raises(ValueError, match="must agree"):
        layer[2](x1, rng.normal(size=(5, 2)), "nngp")


@pytest.mark.parametrize("make", [
    lambda p: stax.Conv(2, (2,), padding=p),
    lambda p: stax.ConvLocal(2, (2,), padding=p),
    lambda p: stax.ConvTranspose(2, (2,), padding=p),
    lambda p: stax.AvgPool((2,), padding=p),
    lambda p: stax.SumPool((2,), padding=p),
])
def test_padding_enum_members_are_accepted(make):
    x = np.random.RandomState(0).normal(size=(2, 5, 3))
    by_enum = make(stax.Padding.SAME)[2](x, None, "nngp")
    by_name = make("SAME")[2](x, None, "nngp")
    np.testing.assert_array_equal(by_enum, by_name)
