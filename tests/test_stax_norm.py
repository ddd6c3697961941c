"""LayerNorm, Dropout, FanInProd, FanInConcat (any axis) and repeat: finite networks, kernels, errors.

The kernels' numbers against neural-tangents are in tests/golden/cases_norm.py (tests/test_golden.py -k norm_);
here: Monte-Carlo convergence of the finite networks to their kernels, invariances, identities between
layers, and the errors for bad input.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import monte_carlo_nngp

RNG = np.random.RandomState(0)
X = jnp.asarray(RNG.normal(size=(4, 3)))
X2 = jnp.asarray(RNG.normal(size=(3, 3)))
IMG = jnp.asarray(RNG.normal(size=(2, 4, 3, 2)))


def mc_excess(kernel, mc, se, rel=0.05, n_se=5.0):
    """Largest excess of |kernel - mc| over n_se standard errors plus a finite-width allowance rel * max|kernel|."""
    err = np.abs(np.asarray(kernel) - mc)
    return float(np.max(err - (n_se * se + rel * np.max(np.abs(np.asarray(kernel))))))


def close_to_mc(kernel, mc, se):
    assert mc_excess(kernel, mc, se) <= 0, f"kernel\n{kernel}\nmc\n{mc}"


def with_dropout_key(init_fn, apply_fn):
    """A network whose 'parameters' carry their own dropout key, so that monte_carlo_nngp draws fresh masks."""

    def init(key, shape):
        k_init, k_drop = jax.random.split(key)
        out, params = init_fn(k_init, shape)
        return out, (params, k_drop)

    def apply(params, x):
        return apply_fn(params[0], x, rng=params[1])

    return init, apply


# ---------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, (1, 2, 3), (-3, -1), (0, 3)])
def test_layernorm_apply_normalises_over_axes(axis):
    init_fn, apply_fn, _ = stax.LayerNorm(axis=axis, eps=0.0)
    shape, params = init_fn(jax.random.PRNGKey(0), IMG.shape)
    y = apply_fn(params, 3.0 * IMG + 1.0)
    axes = (axis,) if isinstance(axis, int) else axis
    assert shape == IMG.shape
    np.testing.assert_allclose(np.mean(y, axis=axes), 0.0, atol=1e-12)
    np.testing.assert_allclose(np.mean(np.square(y), axis=axes), 1.0, rtol=1e-12)


def test_layernorm_reads_its_layout():
    # Channels on axis 1 (N, C, W): normalising over axis 1 is over the channels of each position.
    x = jnp.asarray(RNG.normal(size=(3, 5, 4)))
    _, apply_fn, _ = stax.LayerNorm(axis=1, eps=0.0, batch_axis=0, channel_axis=1)
    y = apply_fn((), x)
    np.testing.assert_allclose(np.mean(np.square(y), axis=1), 1.0, rtol=1e-12)


def test_layernorm_mlp_converges_to_kernel():
    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(512, 1.5, 0.3), stax.LayerNorm(), stax.Relu(),
                                               stax.Dense(32, 1.2, 0.1))
    mc, se = monte_carlo_nngp(init_fn, apply_fn, X, jax.random.PRNGKey(1), n_draws=100)
    close_to_mc(kernel_fn(X, None, "nngp"), mc, se)


def test_layernorm_kernel_is_scale_invariant():
    # Without bias before it and eps = 0, LayerNorm removes the scale of the inputs.
    net = stax.serial(stax.Dense(8, 1.3), stax.LayerNorm(eps=0.0), stax.Erf(), stax.Dense(1, 1.1, 0.2))
    a, b = net[2](X, X2), net[2](4.0 * X, 0.5 * X2)
    np.testing.assert_allclose(a.nngp, b.nngp, rtol=1e-12)
    np.testing.assert_allclose(a.ntk, b.ntk, rtol=1e-12)


def test_layernorm_over_batch_uses_the_batch_mean():
    # After Dense(W_std=1, no bias) the variances are |x|^2 / d; normalising over (batch, channels) divides
    # the kernel by the square roots of the two batches' mean variances.
    net = stax.serial(stax.Dense(8, 1.0), stax.LayerNorm(axis=(0, 1), eps=0.0))
    k = net[2](X, X2, "nngp")
    lin = X @ X2.T / 3
    q1, q2 = np.mean(np.sum(X**2, 1) / 3), np.mean(np.sum(X2**2, 1) / 3)
    np.testing.assert_allclose(k, lin / np.sqrt(q1 * q2), rtol=1e-12)
    assert net.symmetric is False


def test_layernorm_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"LayerNorm.*channel axis"):
        stax.serial(stax.Conv(4, (2, 2)), stax.LayerNorm(axis=(1, 2)))[2](IMG)
    # after a ReLU the means centre it (tests/test_stax_fanin_moments.py); over the batch they cannot
    with pytest.raises(NotImplementedError, match="LayerNorm.*non-zero means.*over the batch"):
        stax.serial(stax.Dense(4), stax.Relu(), stax.LayerNorm(axis=(0, 1)))[2](X)
    with pytest.raises(ValueError, match="LayerNorm.*out of range"):
        stax.LayerNorm(axis=4)[0](jax.random.PRNGKey(0), IMG.shape)
    with pytest.raises(ValueError, match="LayerNorm.*eps"):
        stax.LayerNorm(eps=-1.0)
    with pytest.raises(TypeError, match="LayerNorm: axis"):
        stax.LayerNorm(axis="channels")


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


def test_dropout_mlp_converges_to_kernel():
    def net(mode):
        return stax.serial(stax.Dense(512, 1.5, 0.3), stax.Relu(), stax.Dropout(0.4, mode), stax.Dense(32, 1.2, 0.1))

    init_fn, apply_fn, kernel_fn = net("train")
    init, apply = with_dropout_key(init_fn, apply_fn)
    mc, se = monte_carlo_nngp(init, apply, X, jax.random.PRNGKey(2), n_draws=100)
    close_to_mc(kernel_fn(X, None, "nngp"), mc, se)
    # Power: the kernel without the dropout noise (test mode) is rejected by the same criterion.
    assert mc_excess(net("test")[2](X, None, "nngp"), mc, se) > 0.1


def test_dropout_kernel_scales_self_entries_only():
    net = stax.serial(stax.Conv(4, (2, 2), padding="SAME", W_std=1.3, b_std=0.2), stax.Dropout(0.5))
    base = stax.Conv(4, (2, 2), padding="SAME", W_std=1.3, b_std=0.2)[2](IMG, None)
    k = net[2](IMG, None)  # (N, N, H, H', W, W'): all position pairs
    n, h, w = IMG.shape[:3]
    same = (np.eye(n)[:, :, None, None, None, None] * np.eye(h)[None, None, :, :, None, None]
            * np.eye(w)[None, None, None, None, :, :])
    np.testing.assert_allclose(k.nngp, base.nngp * (1 + same), rtol=1e-12)
    np.testing.assert_allclose(k.ntk, base.ntk * (1 + same), rtol=1e-12)
    # A separate x2 is another draw of the masks: no entry is an activation with itself.
    sep = net[2](IMG, IMG)
    np.testing.assert_allclose(sep.nngp, base.nngp, rtol=1e-12)
    assert not k.is_gaussian


def test_dropout_apply_and_errors():
    _, apply_fn, _ = stax.Dropout(0.25)
    with pytest.raises(ValueError, match=r"Dropout\(0.25, mode='train'\).*rng"):
        apply_fn((), X)
    y = apply_fn((), X, rng=jax.random.PRNGKey(3))
    kept = np.asarray(y) != 0
    np.testing.assert_allclose(np.asarray(y)[kept], 4.0 * np.asarray(X)[kept])
    assert stax.Dropout(0.25, "test")[1]((), X) is X
    with pytest.raises(ValueError, match="Dropout.*mode"):
        stax.Dropout(0.5, mode="eval")
    with pytest.raises(ValueError, match=r"Dropout.*\(0, 1\]"):
        stax.Dropout(0.0)
    with pytest.raises(TypeError, match="Dropout.*number"):
        stax.Dropout("half")


def test_serial_and_parallel_split_rng():
    d = stax.Dropout(0.5)
    key = jax.random.PRNGKey(4)
    k1, k2 = jax.random.split(key)
    expect = d[1]((), d[1]((), X, rng=k1), rng=k2)
    np.testing.assert_array_equal(stax.serial(d, d)[1](((), ()), X, rng=key), expect)
    branches = stax.parallel(d, d)[1](((), ()), [X, X], rng=key)
    np.testing.assert_array_equal(branches[0], d[1]((), X, rng=k1))
    np.testing.assert_array_equal(branches[1], d[1]((), X, rng=k2))


# ---------------------------------------------------------------------------
# FanInProd, FanInConcat
# ---------------------------------------------------------------------------


def test_faninprod_is_the_product_of_branch_kernels():
    a, b = stax.Dense(8, 1.3, 0.2), stax.serial(stax.Dense(8, 1.1), stax.Erf())
    net = stax.serial(stax.FanOut(2), stax.parallel(a, b), stax.FanInProd())
    k, ka, kb = net[2](X, X2), a[2](X, X2), b[2](X, X2)
    np.testing.assert_allclose(k.nngp, ka.nngp * kb.nngp, rtol=1e-12)
    np.testing.assert_allclose(k.ntk, ka.ntk * kb.nngp + ka.nngp * kb.ntk, rtol=1e-12)
    assert not k.is_gaussian
    out = net[1](net[0](jax.random.PRNGKey(0), X.shape)[1], X)
    assert out.shape == (4, 8)


def test_faninprod_converges_to_kernel():
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, 1.2, 0.2), stax.FanOut(2), stax.parallel(stax.Dense(512, 1.1, 0.3), stax.Dense(512, 1.3)),
        stax.FanInProd(), stax.Dense(32, 1.0))
    mc, se = monte_carlo_nngp(init_fn, apply_fn, X, jax.random.PRNGKey(5), n_draws=100)
    close_to_mc(kernel_fn(X, None, "nngp"), mc, se)


def test_fanin_shape_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"FanInProd: branch shapes differ"):
        stax.serial(stax.FanOut(2), stax.parallel(stax.Dense(4), stax.Dense(5)), stax.FanInProd())[2](X)
    with pytest.raises(ValueError, match=r"FanInConcat\(axis=1\).*differ outside axis"):
        stax.serial(stax.FanOut(2), stax.parallel(stax.Conv(4, (2, 2)), stax.Conv(5, (2, 2))),
                    stax.FanInConcat(1))[2](IMG)
    with pytest.raises(ValueError, match=r"FanInConcat\(axis=3\).*out of range"):
        stax.serial(stax.FanOut(2), stax.FanInConcat(3))[2](X)


def _concat_net(axis, second=None):
    second = second or stax.Conv(3, (2, 2), padding="SAME", W_std=1.1, b_std=0.3)
    return stax.serial(stax.FanOut(2), stax.parallel(stax.Conv(3, (3, 3), padding="SAME", W_std=1.2), second),
                       stax.FanInConcat(axis))


@pytest.mark.parametrize("axis", [1, 2, -3])
def test_fanin_concat_spatial_is_block_diagonal(axis):
    a = stax.Conv(3, (3, 3), padding="SAME", W_std=1.2)[2](IMG, None)
    b = stax.Conv(3, (2, 2), padding="SAME", W_std=1.1, b_std=0.3)[2](IMG, None)
    k = _concat_net(axis)[2](IMG, None)
    ax = axis % 4  # activation axis; its position pair in nngp is (2 ax, 2 ax + 1)
    size = IMG.shape[ax]
    first = [slice(None)] * 6
    first[2 * ax], first[2 * ax + 1] = slice(0, size), slice(0, size)
    second = list(first)
    second[2 * ax], second[2 * ax + 1] = slice(size, None), slice(size, None)
    cross = list(first)
    cross[2 * ax + 1] = slice(size, None)
    np.testing.assert_allclose(k.nngp[tuple(first)], a.nngp, rtol=1e-12)
    np.testing.assert_allclose(k.nngp[tuple(second)], b.nngp, rtol=1e-12)
    np.testing.assert_array_equal(k.nngp[tuple(cross)], 0.0)
    assert k.is_gaussian
    init_fn, apply_fn, _ = _concat_net(axis)
    shape, params = init_fn(jax.random.PRNGKey(0), IMG.shape)
    assert apply_fn(params, IMG).shape == shape and shape[ax] == 2 * size


def test_fanin_concat_spatial_needs_gaussian_branches():
    net = _concat_net(1, stax.serial(stax.Conv(3, (2, 2), padding="SAME"), stax.Relu()))
    with pytest.raises(NotImplementedError, match=r"FanInConcat\(axis=1\).*Gaussian"):
        net[2](IMG)
    # The channel axis accepts any branches (width-weighted average).
    k = _concat_net(-1, stax.serial(stax.Conv(3, (2, 2), padding="SAME"), stax.Relu()))[2](IMG, None, "nngp")
    assert k.shape == (2, 2, 4, 4, 3, 3)


def test_fanin_concat_batch_axis_warns():
    net = stax.serial(stax.FanOut(2), stax.parallel(stax.Dense(4, 1.2), stax.Dense(4, 0.8)), stax.FanInConcat(0))
    with pytest.warns(UserWarning, match="batch axis"):
        k = net[2](X, X2)
    lin = np.asarray(X @ X2.T / 3)
    np.testing.assert_allclose(k.nngp, np.block([[1.44 * lin, 0 * lin], [0 * lin, 0.64 * lin]]), rtol=1e-12)


# ---------------------------------------------------------------------------
# repeat
# ---------------------------------------------------------------------------


def test_repeat_equals_serial():
    block = stax.serial(stax.Dense(6, 1.4, 0.1), stax.Relu())
    head = stax.Dense(6, 1.2, 0.2)
    rep = stax.serial(head, stax.repeat(block, 3))
    unrolled = stax.serial(head, block, block, block)
    a, b = rep[2](X, X2), unrolled[2](X, X2)
    np.testing.assert_allclose(a.nngp, b.nngp, rtol=1e-12)
    np.testing.assert_allclose(a.ntk, b.ntk, rtol=1e-12)
    # Finite network: parameters stacked on a leading axis of length n, applied in order.
    shape, params = rep[0](jax.random.PRNGKey(0), X.shape)
    stacked = params[1]
    assert shape == (4, 6) and stacked[0][0].shape == (3, 6, 6)
    y = head[1](params[0], X)
    for i in range(3):
        y = block[1](jax.tree_util.tree_map(lambda p, i=i: p[i], stacked), y)
    np.testing.assert_allclose(rep[1](params, X), y, rtol=1e-12)


def test_repeat_zero_and_errors():
    ident = stax.repeat(stax.Dense(3), 0)
    assert ident[1](ident[0](jax.random.PRNGKey(0), X.shape)[1], X) is X
    with pytest.raises(ValueError, match=r"repeat\(Dense\(5\), 2\).*output shape"):
        stax.repeat(stax.Dense(5), 2)[0](jax.random.PRNGKey(0), X.shape)
    with pytest.raises(ValueError, match=r"repeat\(Dense\(5\), 2\).*output shape"):
        stax.repeat(stax.Dense(5), 2)[2](X)
    with pytest.raises(ValueError, match="repeat: n"):
        stax.repeat(stax.Dense(3), -1)
    with pytest.raises(TypeError, match="repeat"):
        stax.repeat((1, 2, 3), 2)
