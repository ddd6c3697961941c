"""GlobalSelfAttention: finite-width convergence of the kernels, invariances and errors.

The exact values against neural-tangents 0.6.5 are the golden cases ``attn_*`` (tests/golden/cases_attention.py,
run by tests/test_golden.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import empirical_ntk, monte_carlo_nngp


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _inputs(shape, seed=0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape))


def _same_position_mean(mat):
    """(N1, N2, P, P') -> (N1, N2): the average of the same-position covariances (what the samplers average)."""
    return jnp.diagonal(mat, axis1=-2, axis2=-1).mean(-1)


@pytest.mark.parametrize("kw, rtol", [
    # Logits converge to QK * S as n_chan_key grows; the softmax's curvature leaves an O(1/n_chan_key) bias.
    (dict(attention_mechanism="SOFTMAX", pos_emb_type="CONCAT", n_chan_pos_emb=128, val_pos_emb=True,
          W_key_std=1.5, b_std=0.2), 0.02),
    # With 1/sqrt(n_chan_key) logits and identity weights the NNGP is exact at every width: no bias.
    (dict(linear_scaling=False, attention_mechanism="IDENTITY", b_std=0.1), 0.0),
])
def test_monte_carlo_nngp_converges_to_kernel(kw, rtol):
    layer = stax.GlobalSelfAttention(8, 128, 8, 4, W_out_std=1.2, **kw)
    x = _inputs((3, 5, 4))
    mc, se = monte_carlo_nngp(layer[0], layer[1], x, jax.random.PRNGKey(0), n_draws=500, chunk=500)
    k = _same_position_mean(layer[2](x, None, "nngp"))
    tol = 5 * se + rtol * np.abs(np.asarray(k)).max()
    assert np.all(np.abs(mc - np.asarray(k)) < tol), (mc, np.asarray(k), se)


@pytest.mark.parametrize("parameterization", ["ntk", "standard"])
def test_empirical_ntk_of_wide_heads_approaches_kernel(parameterization):
    """Both parameterisations: the mean empirical NTK of 8 draws with wide heads (16 x 32 value channels, 256 key
    channels) is the kernel within 4 standard errors plus 3% (the tied key weights' term, which the limit drops, is
    O(1/n_chan_key)); a wrong width factor of the standard parameterisation is off by orders of magnitude."""
    layer = stax.GlobalSelfAttention(2, 256, 32, 16, W_key_std=1.3, W_value_std=1.1, W_out_std=0.9, b_std=0.3,
                                     attention_mechanism="RELU", parameterization=parameterization)
    x = _inputs((2, 4, 3), seed=1)
    draw = jax.jit(lambda key: empirical_ntk(layer[1], layer[0](key, x.shape)[1], x))
    emps = np.stack([np.asarray(draw(jax.random.PRNGKey(i))) for i in range(8)])
    k = np.asarray(_same_position_mean(layer[2](x, None, "ntk")))
    se = emps.std(0, ddof=1) / np.sqrt(len(emps))
    assert np.all(np.abs(emps.mean(0) - k) < 4 * se + 0.03 * np.abs(k)), (emps.mean(0), k, se)


def test_standard_and_ntk_share_the_nngp_and_differ_in_the_ntk():
    x = _inputs((3, 5, 4))
    make = lambda p: stax.GlobalSelfAttention(16, 8, 8, 2, b_std=0.2, parameterization=p)  # noqa: E731
    a, b = make("ntk")[2](x, None, ("nngp", "ntk")), make("standard")[2](x, None, ("nngp", "ntk"))
    np.testing.assert_allclose(a.nngp, b.nngp, rtol=1e-12)
    assert not np.allclose(a.ntk, b.ntk)


def test_kernel_is_symmetric_and_equivariant_under_position_permutations():
    layer = stax.serial(stax.Dense(16, W_std=1.3, b_std=0.1), stax.GlobalSelfAttention(16, 8, 8, 2, b_std=0.1),
                        stax.Relu(), stax.GlobalSelfAttention(16, 8, 8, 2, attention_mechanism="ABS"))
    x1, x2 = _inputs((3, 6, 4)), _inputs((2, 6, 4), seed=5)
    k12 = layer[2](x1, x2, ("nngp", "ntk"))
    k21 = layer[2](x2, x1, ("nngp", "ntk"))
    np.testing.assert_allclose(k12.nngp, jnp.transpose(k21.nngp, (1, 0, 3, 2)), rtol=1e-12)
    np.testing.assert_allclose(k12.ntk, jnp.transpose(k21.ntk, (1, 0, 3, 2)), rtol=1e-12)
    perm = np.array([3, 0, 5, 1, 4, 2])  # without positional embeddings attention is permutation-equivariant
    kp = layer[2](x1[:, perm], x2[:, perm], "nngp")
    np.testing.assert_allclose(kp, k12.nngp[:, :, perm][:, :, :, perm], rtol=1e-10)


def test_positional_embeddings_break_permutation_equivariance():
    layer = stax.GlobalSelfAttention(16, 8, 8, 2, pos_emb_type="SUM", pos_emb_decay_fn=lambda d: jnp.exp(-d))
    x = _inputs((2, 6, 4))
    perm = np.array([3, 0, 5, 1, 4, 2])
    k, kp = layer[2](x, None, "nngp"), layer[2](x[:, perm], None, "nngp")
    assert not np.allclose(kp, k[:, :, perm][:, :, :, perm], rtol=1e-6)


def test_needs_all_position_pairs_and_keeps_dtype():
    layer = stax.GlobalSelfAttention(16, 8, 8, 2)
    assert layer.needs_full(False) is True
    x = jnp.asarray(np.random.RandomState(0).normal(size=(2, 3, 4, 3)), jnp.float32)
    k = layer[2](x, None)
    assert k.nngp.dtype == jnp.float32 and k.nngp.shape == (2, 2, 3, 3, 4, 4) and k.full
    assert layer[0](jax.random.PRNGKey(0), x.shape)[0] == (2, 3, 4, 16)


def test_traced_scales_give_gradients():
    x = _inputs((2, 4, 3))

    def f(w):
        layer = stax.GlobalSelfAttention(8, 8, 8, 2, W_out_std=w, W_key_std=w, b_std=0.1)
        return layer[2](x, None, "nngp").sum()

    g = jax.jit(jax.grad(f))(1.2)
    fd = (f(1.2 + 1e-6) - f(1.2 - 1e-6)) / 2e-6
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_mask_drops_masked_positions_as_keys():
    layer = stax.GlobalSelfAttention(8, 8, 8, 2, attention_mechanism="SOFTMAX")
    x = _inputs((2, 5, 3))
    _, params = layer[0](jax.random.PRNGKey(0), x.shape)
    mask = np.zeros((2, 5, 1), bool)
    mask[:, 3:] = True
    out = layer[1](params, x, mask=jnp.asarray(mask))
    # Changing the masked positions' inputs leaves the unmasked positions' outputs unchanged.
    x_changed = x.at[:, 3:].set(5.0)
    out_changed = layer[1](params, x_changed, mask=jnp.asarray(mask))
    np.testing.assert_allclose(out[:, :3], out_changed[:, :3], rtol=1e-12)


def test_errors_name_the_layer():
    with pytest.raises(ValueError, match="GlobalSelfAttention.*spatial"):
        stax.GlobalSelfAttention(8, 8, 8, 2)[2](_inputs((3, 4)))
    with pytest.raises(ValueError, match="GlobalSelfAttention.*spatial"):
        stax.GlobalSelfAttention(8, 8, 8, 2)[0](jax.random.PRNGKey(0), (3, 4))
    with pytest.raises(NotImplementedError, match="GlobalSelfAttention.*SOFTMAX"):
        stax.GlobalSelfAttention(8, 8, 8, 2, linear_scaling=False)[2](_inputs((2, 3, 4)))
    with pytest.raises(ValueError, match="GlobalSelfAttention.*attention_mechanism"):
        stax.GlobalSelfAttention(8, 8, 8, 2, attention_mechanism="tanh")
    with pytest.raises(ValueError, match="GlobalSelfAttention.*pos_emb_type"):
        stax.GlobalSelfAttention(8, 8, 8, 2, pos_emb_type="ROTARY")
    with pytest.raises(ValueError, match="GlobalSelfAttention.*n_heads"):
        stax.GlobalSelfAttention(8, 8, 8, 0)
    with pytest.raises(ValueError, match="GlobalSelfAttention.*b_std"):
        stax.GlobalSelfAttention(8, 8, 8, 2, b_std=-1.0)
    with pytest.raises(ValueError, match="GlobalSelfAttention.*parameterization"):
        stax.GlobalSelfAttention(8, 8, 8, 2, parameterization="mup")
    with pytest.raises(ValueError, match="GlobalSelfAttention.*n_chan_pos_emb"):
        stax.GlobalSelfAttention(8, 8, 8, 2, pos_emb_type="SUM", n_chan_pos_emb=3)[2](_inputs((2, 3, 4)))
    layer = stax.GlobalSelfAttention(8, 8, 8, 2)
    _, params = layer[0](jax.random.PRNGKey(0), (2, 3, 4))
    with pytest.raises(ValueError, match="GlobalSelfAttention.*mask"):
        layer[1](params, _inputs((2, 3, 4)), mask=jnp.zeros((3, 4), bool))
