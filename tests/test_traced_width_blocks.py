"""smnngp.traced through the width (issue 51): slices of a weight's output, concatenation along the width, RMSNorm,
batch normalisation in inference mode.

* A fused projection ``h @ W`` split along the width (``jnp.split``, ``qkv[..., :n]``) is the network with one
  weight per slice: different columns of a weight are independent, so each slice is a weight of its own with the
  whole weight's variance. Slices pair up unit by unit (two slices of one weight share the units they hold at the
  same coordinates: all for the same slice, none for disjoint or shifted ones).
* Concatenation along the width followed by a dense layer (DenseNet) is stax's ``FanInConcat`` followed by
  ``Dense``: the width-weighted average of the parts' kernels, the parts' widths going to infinity at the traced
  ratios.
* RMSNorm divides by the root of a second moment over the width: exact (a per-example constant in the limit).
* Batch normalisation in inference mode is an affine map with constants per channel: constants equal across the
  channels are a scalar affine map; constants that take a few values split the units into groups (one part of a
  concatenation each, exact with each value's share of the width fixed) for a Gaussian pre-activation, and are
  refused on an activation (splitting a nonlinearity's output into parts of its units is not supported).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax, traced

nn = pytest.importorskip("flax.linen", reason="the Flax spellings need flax (pip install -e '.[traced]')")
from test_traced import X1, X2, _assert_same, _line_of, _monte_carlo_errors  # noqa: E402

SEQ_A = jax.random.normal(jax.random.PRNGKey(8), (3, 5, 4))  # (batch, positions, channels)
SEQ_B = jax.random.normal(jax.random.PRNGKey(9), (2, 5, 4))
IM_A = jax.random.normal(jax.random.PRNGKey(10), (3, 5, 5, 2))
IM_B = jax.random.normal(jax.random.PRNGKey(11), (2, 5, 5, 2))
DN = ("NHWC", "HWIO", "NHWC")
WEIGHTS = {"W*": traced.Weight(1.0)}


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)


def _zeros(**shapes):
    return {k: jnp.zeros(s) for k, s in shapes.items()}


# -- slices of a weight's output ------------------------------------------------------------------------------

N = 16


def _heads(q, k, v):
    return jax.nn.relu(q) + jax.scipy.special.erf(k) + v


def _fused(p, x, spelling):
    h = jax.nn.relu(x @ p["W0"])
    qkv = h @ p["Wqkv"] + p["bqkv"]
    if spelling == "split":
        q, k, v = jnp.split(qkv, 3, axis=-1)
    else:
        q, k, v = qkv[:, :N], qkv[:, N:2 * N], qkv[..., 2 * N:]
    return _heads(q, k, v) @ p["W2"]


def _separate(p, x):
    h = jax.nn.relu(x @ p["W0"])
    q, k, v = (h @ p[f"W{c}"] + p[f"b{c}"] for c in "qkv")
    return _heads(q, k, v) @ p["W2"]


@pytest.mark.parametrize("spelling", ["split", "slices"])
def test_a_fused_projection_split_in_three_equals_three_weights(spelling):
    """``q, k, v`` from one weight of width 3n (and one bias) equal three weights of width n (and three biases)."""
    priors = {"W*": traced.Weight(1.3), "b*": traced.Bias(0.4)}
    fused = _zeros(W0=(4, 8), Wqkv=(8, 3 * N), bqkv=(1, 3 * N), W2=(N, 1))
    separate = _zeros(W0=(4, 8), Wq=(8, N), Wk=(8, N), Wv=(8, N), bq=(1, N), bk=(1, N), bv=(1, N), W2=(N, 1))
    _, _, kernel_fn = traced.infinite_width(lambda p, x: _fused(p, x, spelling), fused, priors=priors)
    _, _, separate_fn = traced.infinite_width(_separate, separate, priors=priors)
    _assert_same(kernel_fn, separate_fn)
    _, _, stax_fn = stax.serial(stax.Dense(8, W_std=1.3), stax.Relu(), stax.Dense(N, W_std=1.3, b_std=0.4),
                                stax.Relu(), stax.Dense(1, W_std=1.3))
    q_only = _zeros(W0=(4, 8), Wqkv=(8, 3 * N), bqkv=(1, 3 * N), W2=(N, 1))
    _, _, q_fn = traced.infinite_width(lambda p, x: jax.nn.relu(jnp.split(jax.nn.relu(x @ p["W0"]) @ p["Wqkv"]
                                                                          + p["bqkv"], 3, -1)[0]) @ p["W2"],
                                       q_only, priors=priors)
    _assert_same(q_fn, stax_fn)  # one slice alone: a dense layer of width n


@pytest.mark.parametrize("tied", [False, True])
def test_attention_with_a_fused_projection_equals_separate_weights(tied):
    """Self-attention over a sequence with the projections fused: ``q, k, v = split(h @ Wqkv)`` (independent
    queries and keys: the scores vanish, uniform weights), or ``k, v = split(h @ Wkv)`` with ``q = 0.5 k`` (tied:
    softmax weights of the keys' covariance), equal to the same block with separate weights."""

    def attend(q, k, v):
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / N, axis=-1)
        return jnp.einsum("bts,bsd->btd", a, v)

    def fused(p, x):
        h = x @ p["W0"]
        if tied:
            k, v = jnp.split(h @ p["Wf"], 2, axis=-1)
            q = 0.5 * k
        else:
            q, k, v = jnp.split(h @ p["Wf"], 3, axis=-1)
        return jnp.mean(jax.nn.relu(attend(q, k, v) @ p["Wo"]), axis=1) @ p["W1"]

    def separate(p, x):
        h = x @ p["W0"]
        k, v = h @ p["Wk"], h @ p["Wv"]
        q = 0.5 * k if tied else h @ p["Wq"]
        return jnp.mean(jax.nn.relu(attend(q, k, v) @ p["Wo"]), axis=1) @ p["W1"]

    heads = 2 if tied else 3
    _, _, kernel_fn = traced.infinite_width(
        fused, _zeros(W0=(4, N), Wf=(N, heads * N), Wo=(N, N), W1=(N, 1)), priors=WEIGHTS)
    _, _, separate_fn = traced.infinite_width(
        separate, _zeros(W0=(4, N), Wq=(N, N), Wk=(N, N), Wv=(N, N), Wo=(N, N), W1=(N, 1)), priors=WEIGHTS)
    _assert_same(kernel_fn, separate_fn, x1=SEQ_A, x2=SEQ_B)


def test_slices_of_one_weight_pair_up_unit_by_unit():
    """A slice of a slice is the slice of the whole; two shifted slices of one weight (``[:n]`` and ``[1:n+1]``)
    hold different columns at every coordinate, so their sum has twice the kernel of one (and the same slice
    twice four times); the reversed slice of a weight's last n columns is independent of the first n."""

    def out(p, x, pick):
        a = x @ p["W0"]
        return jax.nn.relu(pick(a)) @ p["W1"]

    params = _zeros(W0=(4, 3 * N), W1=(N, 1))

    def kernel(pick):
        _, _, fn = traced.infinite_width(lambda p, x: out(p, x, pick), params, priors=WEIGHTS)
        return fn(X1, X2, ("nngp", "ntk"))

    one = kernel(lambda a: a[:, :N])
    nested = kernel(lambda a: a[:, N:3 * N][:, :N])
    shifted = kernel(lambda a: (a[:, :N] + a[:, 1:N + 1]) / np.sqrt(2.0))
    same = kernel(lambda a: (a[:, :N] + a[:, :N]) / 2.0)
    reversed_last = kernel(lambda a: (a[:, :N] + a[:, ::-1][:, :N]) / np.sqrt(2.0))
    for got in (nested, shifted, same, reversed_last):
        np.testing.assert_allclose(got.nngp, one.nngp, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got.ntk, one.ntk, rtol=1e-12, atol=1e-12)


# -- concatenation along the width (DenseNet) -----------------------------------------------------------------

N0, N1, N2 = 8, 12, 20


def _dense_block(width, act, b_std=None, parameterization="ntk"):
    """stax: the block's input beside ``act(Dense(input))``, concatenated over the channels."""
    return stax.serial(stax.FanOut(2), stax.parallel(
        stax.Identity(), stax.serial(stax.Dense(width, b_std=b_std, parameterization=parameterization), act())),
        stax.FanInConcat())


@pytest.mark.parametrize("parameterization", ["ntk", "standard"])
def test_a_densenet_equals_stax_fan_in_concat(parameterization):
    """Two DenseNet blocks (``concatenate([h, act(h @ W)], -1)``, the second on the first's concatenation, a bias
    in the first block and the readout), then a dense layer: stax's FanOut / parallel / FanInConcat / Dense."""

    def net(p, x):
        h = jax.nn.relu(x @ p["W0"])
        c = jnp.concatenate([h, jax.nn.relu(h @ p["W1"] + p["b1"])], axis=-1)
        c = jnp.concatenate([c, jax.scipy.special.erf(c @ p["W2"])], axis=-1)
        return c @ p["W3"] + p["b3"]

    params = _zeros(W0=(4, N0), W1=(N0, N1), b1=(1, N1), W2=(N0 + N1, N2), W3=(N0 + N1 + N2, 1), b3=(1, 1))
    priors = {"W*": traced.Weight(1.0, parameterization=parameterization),
              "b*": traced.Bias(0.3, parameterization=parameterization)}
    _, _, kernel_fn = traced.infinite_width(net, params, priors=priors)
    _, _, stax_fn = stax.serial(
        stax.Dense(N0, parameterization=parameterization), stax.Relu(),
        _dense_block(N1, stax.Relu, 0.3, parameterization), _dense_block(N2, stax.Erf, None, parameterization),
        stax.Dense(1, b_std=0.3, parameterization=parameterization))
    _assert_same(kernel_fn, stax_fn, tol=1e-10)


def test_a_flax_densenet_block_equals_stax():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Dense(N0)(x))
            h = jnp.concatenate([h, nn.gelu(nn.Dense(N1)(h), approximate=False)], axis=-1)
            return nn.Dense(1)(h)

    model = Block()
    _, _, kernel_fn = traced.infinite_width(model.apply, model.init(jax.random.PRNGKey(0), X1))
    _, _, stax_fn = stax.serial(stax.Dense(N0, b_std=0.0), stax.Relu(), stax.FanOut(2), stax.parallel(
        stax.Identity(), stax.serial(stax.Dense(N1, b_std=0.0), stax.Gelu())), stax.FanInConcat(),
        stax.Dense(1, b_std=0.0))
    _assert_same(kernel_fn, stax_fn, tol=1e-10)


def test_a_learned_vector_concatenated_along_the_width():
    """A random vector of 24 entries (one draw per unit, Bias(0.7)) beside 8 ReLU units: the readout's kernel is
    ``(8 K_relu + 24 * 0.7**2) / 32``, its NTK ``(8 Theta_relu + 24 * 2 * 0.7**2) / 32`` (the vector's own gradient
    and the readout's)."""

    def net(p, x):
        e = jnp.broadcast_to(p["e"], (x.shape[0], 24))
        return jnp.concatenate([jax.nn.relu(x @ p["W0"]), e], axis=-1) @ p["W1"]

    params = _zeros(W0=(4, 8), e=(1, 24), W1=(32, 1))
    _, _, kernel_fn = traced.infinite_width(net, params, priors={"W*": traced.Weight(1.0), "e": traced.Bias(0.7)})
    _, _, mlp_fn = stax.serial(stax.Dense(8), stax.Relu(), stax.Dense(1))
    for x2 in (None, X2):
        got, mlp = kernel_fn(X1, x2, ("nngp", "ntk")), mlp_fn(X1, x2, ("nngp", "ntk"))
        np.testing.assert_allclose(got.nngp, (8 * mlp.nngp + 24 * 0.49) / 32, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got.ntk, (8 * mlp.ntk + 24 * 2 * 0.49) / 32, rtol=1e-12, atol=1e-12)


def test_a_convolutional_densenet_block_equals_stax():
    """Convolutions concatenated over the channels, pooled part by part, then a convolution of the concatenation
    and a global mean."""

    def net(p, x):
        h = jax.nn.relu(_conv(x, p["W0"]))
        c = jnp.concatenate([h, jax.nn.relu(_conv(h, p["W1"]))], axis=-1)
        c = jax.lax.reduce_window(c, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID") / 4.0
        c = jax.nn.relu(_conv(c, p["W2"]))
        return jnp.mean(c, axis=(1, 2)) @ p["W3"]

    params = _zeros(W0=(3, 3, 2, 6), W1=(3, 3, 6, 10), W2=(3, 3, 16, 8), W3=(8, 1))
    _, _, kernel_fn = traced.infinite_width(net, params, priors=WEIGHTS)
    _, _, stax_fn = stax.serial(
        stax.Conv(6, (3, 3), padding="SAME"), stax.Relu(),
        stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(stax.Conv(10, (3, 3), padding="SAME"),
                                                                    stax.Relu())), stax.FanInConcat(),
        stax.AvgPool((2, 2), (1, 1), "VALID"), stax.Conv(8, (3, 3), padding="SAME"), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_fn, tol=1e-10, x1=IM_A, x2=IM_B)


def test_layer_norm_of_a_concatenation_converges_monte_carlo():
    """A bias added to a concatenation, a ReLU of it, its layer norm (means over the concatenation: the
    width-weighted means of the parts), then a dense layer: finite networks of width 128 + 384 converge."""

    def net(p, x):
        h = x @ p["W0"]
        c = jax.nn.relu(jnp.concatenate([h, h @ p["W1"]], axis=-1) + p["b"])
        mu = jnp.mean(c, axis=-1, keepdims=True)
        c = (c - mu) / jnp.sqrt(jnp.mean((c - mu) ** 2, axis=-1, keepdims=True) + 1e-6)
        return c @ p["W2"]

    params = _zeros(W0=(4, 128), W1=(128, 384), b=(1, 512), W2=(512, 16))
    priors = {"W0": traced.Weight(1.0), "W1": traced.Weight(3.0), "W2": traced.Weight(1.0), "b": traced.Bias(0.5)}
    init_fn, apply_fn, kernel_fn = traced.infinite_width(net, params, priors=priors)
    exact = kernel_fn(X1, None, get=("nngp", "ntk"))
    (nngp4, ntk4), (nngp128, ntk128) = errors = _monte_carlo_errors(init_fn, apply_fn, X1, [4, 128], exact)
    assert nngp128 < 0.1 and ntk128 < 0.1, errors
    assert nngp128 < nngp4 and ntk128 < ntk4, errors


# -- RMSNorm --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["initial", "per channel"])
def test_flax_rms_norm_of_a_preactivation_equals_the_stax_layer_norm(scale):
    """On a centred Gaussian pre-activation RMSNorm is layer normalisation (the mean it would remove vanishes):
    stax's LayerNorm with the same eps. With a scale per channel (0.5 and 2 on alternate channels; Flax multiplies
    it into the statistic first) the ReLU of the scaled units gives the readout the average squared scale."""

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.RMSNorm(epsilon=1e-3)(nn.Dense(32, use_bias=False)(x))
            return nn.Dense(1)(nn.relu(h))

    model = Net()
    params = model.init(jax.random.PRNGKey(0), X1)
    readout = 1.0
    if scale == "per channel":
        gains = jnp.tile(jnp.asarray([0.5, 2.0]), 16)
        params = {"params": {**params["params"], "RMSNorm_0": {"scale": gains}}}
        readout = float(np.sqrt(np.mean(np.asarray(gains) ** 2)))
    _, _, kernel_fn = traced.infinite_width(model.apply, params)
    _, _, stax_fn = stax.serial(stax.Dense(32), stax.LayerNorm(eps=1e-3), stax.Relu(),
                                stax.Dense(1, W_std=readout, b_std=0.0))
    _assert_same(kernel_fn, stax_fn)


def test_rms_norm_of_an_activation_is_a_per_example_scale():
    """``r = h / sqrt(mean(h**2) + eps) * g`` for ``h = relu(x W0)`` (not centred) and a gain g equal across the
    channels: in the limit ``mean(h**2) = q / 2`` with q the pre-activation's variance, so the kernels (NNGP and
    NTK) are the plain MLP's times ``g**2 / sqrt((q1 / 2 + eps) (q2 / 2 + eps))``."""
    eps, gain = 1e-2, 1.5

    def net(p, x):
        h = jax.nn.relu(x @ p["W0"])
        r = h / jnp.sqrt(jnp.mean(h ** 2, axis=-1, keepdims=True) + eps) * p["g"]
        return r @ p["W1"]

    params = {"W0": jnp.zeros((4, 32)), "g": jnp.full((1, 32), gain), "W1": jnp.zeros((32, 1))}
    _, _, kernel_fn = traced.infinite_width(net, params, priors={"W*": traced.Weight(1.0), "g": traced.Fixed()})
    _, _, mlp_fn = stax.serial(stax.Dense(32), stax.Relu(), stax.Dense(1))
    for x2 in (None, X2):
        got, mlp = kernel_fn(X1, x2, ("nngp", "ntk")), mlp_fn(X1, x2, ("nngp", "ntk"))
        second = X1 if x2 is None else x2
        q1, q2 = jnp.sum(X1 ** 2, -1) / 4, jnp.sum(second ** 2, -1) / 4
        factor = gain ** 2 / jnp.sqrt((q1[:, None] / 2 + eps) * (q2[None, :] / 2 + eps))
        np.testing.assert_allclose(got.nngp, mlp.nngp * factor, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got.ntk, mlp.ntk * factor, rtol=1e-12, atol=1e-12)


# -- batch normalisation in inference mode ------------------------------------------------------------------

class _BatchNormNet(nn.Module):
    width: int = 32
    act: str = "relu"

    @nn.compact
    def __call__(self, x):
        h = nn.BatchNorm(use_running_average=True)(nn.Dense(self.width)(x))
        return nn.Dense(16)(jnp.sin(h) if self.act == "sin" else nn.relu(h))


def _batch_norm_params(model, **stats):
    """The model's variables with batch normalisation's statistics and affine parameters set, in float64 (Flax's
    initial values where not given: mean 0, variance 1, scale 1, bias 0)."""
    variables = model.init(jax.random.PRNGKey(0), X1)
    bn_stats, bn_params = {}, {}
    for name, default in (("mean", 0.0), ("var", 1.0), ("scale", 1.0), ("bias", 0.0)):
        target = bn_stats if name in ("mean", "var") else bn_params
        target[name] = jnp.broadcast_to(jnp.asarray(stats.get(name, default), jnp.float64), (model.width,))
    return {"params": {**variables["params"], "BatchNorm_0": bn_params},
            "batch_stats": {**variables["batch_stats"], "BatchNorm_0": bn_stats}}


def test_inference_batch_norm_with_statistics_equal_across_channels_is_a_scale():
    """Running statistics and scale equal across the channels (Flax's initial ones, or any): the pre-activation
    times ``scale / sqrt(var + eps)``, stax's Dense with that W_std."""
    model = _BatchNormNet()
    for stats in ({}, {"var": 2.5, "scale": 0.7}):
        params = _batch_norm_params(model, **stats)
        c = stats.get("scale", 1.0) / np.sqrt(stats.get("var", 1.0) + 1e-5)
        _, _, kernel_fn = traced.infinite_width(model.apply, params)
        _, _, stax_fn = stax.serial(stax.Dense(32, W_std=c, b_std=0.0), stax.Relu(), stax.Dense(16, b_std=0.0))
        _assert_same(kernel_fn, stax_fn)


def test_inference_batch_norm_with_a_scale_per_channel_averages_the_squares():
    """A scale per channel that takes two values c_j (half the channels each) before a ReLU: relu(c_j g) =
    c_j relu(g), so the next layer's kernel is the MLP's times the average of c_j ** 2 (the units split into two
    groups, each a part of a concatenation)."""
    model = _BatchNormNet()
    scale = jnp.tile(jnp.asarray([0.5, 2.0]), 16)
    _, _, kernel_fn = traced.infinite_width(model.apply, _batch_norm_params(model, scale=scale))
    mean_square = float(np.mean(np.asarray(scale) ** 2)) / (1 + 1e-5)
    _, _, stax_fn = stax.serial(stax.Dense(32, b_std=0.0), stax.Relu(),
                                stax.Dense(16, W_std=np.sqrt(mean_square), b_std=0.0))
    _assert_same(kernel_fn, stax_fn)


def test_inference_batch_norm_with_statistics_per_channel_converges_monte_carlo():
    """Running means and variances that take two values over the channels (period 2), scales four (period 4): the
    subtraction of the means splits the units in two groups, the scaling each group in two more, and an offset
    shifts them all; a sine after it (``sin(c u + s)``, a closed form for every group): finite networks of width
    512 converge to the traced kernel."""
    model = _BatchNormNet(width=512, act="sin")
    two, four = np.arange(512) % 2, np.arange(512) % 4
    params = _batch_norm_params(model, mean=np.array([0.0, 1.0])[two], var=np.array([1.0, 4.0])[two],
                                scale=np.array([1.0, 2.5, 0.4, 1.5])[four], bias=0.3)
    init_fn, apply_fn, kernel_fn = traced.infinite_width(model.apply, params)
    read = kernel_fn.activations(X1.shape)
    assert len(read) == 4 and all(name.startswith("Sin(") for _, name in read), read  # one per group of units
    exact = kernel_fn(X1, None, get=("nngp", "ntk"))

    # the traced NTK is the tangent kernel of the random leaves: the fixed ones (batch normalisation's statistics,
    # scale and offset) are held out of the finite network's gradient
    def init_random(key, shape):
        out_shape, drawn = init_fn(key, shape)
        return out_shape, {k: v for k, v in drawn["params"].items() if k != "BatchNorm_0"}

    def apply_random(random, x, **kw):
        return apply_fn({"params": {**random, "BatchNorm_0": params["params"]["BatchNorm_0"]},
                         "batch_stats": params["batch_stats"]}, x, **kw)

    (nngp4, ntk4), (nngp128, ntk128) = errors = _monte_carlo_errors(init_random, apply_random, X1, [4, 128], exact)
    assert nngp128 < 0.1 and ntk128 < 0.1, errors
    assert nngp128 < nngp4 and ntk128 < ntk4, errors


# -- refusals: each names the primitive, the user's line and why ----------------------------------------------

def _refused(apply, params, match, line_text, x=X1, priors=WEIGHTS):
    with pytest.raises(traced.TracedError, match=match) as err:
        traced.infinite_width(apply, params, priors=priors, example_input=x)
    if line_text is not None:
        assert f"test_traced_width_blocks.py:{_line_of(apply, line_text)}" in str(err.value), str(err.value)
    return str(err.value)


def test_slices_and_splits_that_are_refused():
    def activation_slice(p, x):
        h = jax.nn.relu(x @ p["W0"])
        return h[:, :8] @ p["W1"]  # half the units of an activation

    msg = _refused(activation_slice, _zeros(W0=(4, 16), W1=(8, 1)), "slice along the width", "# half the units")
    assert "not Gaussian" in msg

    def batch_split(p, x):
        a, b = jnp.split(x @ p["W0"], [2], axis=0)  # examples split
        return jnp.concatenate([a, b], axis=0) @ p["W1"]

    _refused(batch_split, _zeros(W0=(4, 16), W1=(16, 1)), "split along the batch axis", "# examples split")

    def channel_pad(p, x):
        h = jnp.pad(x @ p["W0"], ((0, 0), (0, 4)))  # zero channels
        return h @ p["W1"]

    _refused(channel_pad, _zeros(W0=(4, 16), W1=(20, 1)), "pad along the width", "# zero channels")

    def weight_split(p, x):
        wa, wb = jnp.split(p["W0"], 2, axis=1)  # the weight split
        return (jax.nn.relu(x @ wa) + jnp.tanh(x @ wb)) @ p["W1"]

    _refused(weight_split, _zeros(W0=(4, 32), W1=(16, 1)), "split of a random parameter", "# the weight split")

    def weight_slice(p, x):
        return jax.nn.relu(x @ p["W0"][:, :16]) @ p["W1"]  # the weight sliced

    _refused(weight_slice, _zeros(W0=(4, 32), W1=(16, 1)), "slice of a random parameter", "# the weight sliced")


def test_concatenations_that_are_refused():
    def with_input(p, x):
        return jnp.concatenate([x, x @ p["W0"]], axis=-1) @ p["W1"]  # input beside an activation

    _refused(with_input, _zeros(W0=(4, 16), W1=(20, 1)), "share of the width vanishes", "# input beside")

    def with_zeros(p, x):
        h = x @ p["W0"]
        return jnp.concatenate([h, jnp.zeros_like(h)], axis=-1) @ p["W1"]  # zero channels

    _refused(with_zeros, _zeros(W0=(4, 16), W1=(32, 1)), "fixed value concatenated", "# zero channels")

    def as_output(p, x):
        return jnp.concatenate([x @ p["W0"], jax.nn.relu(x @ p["W1"])], axis=-1)  # output

    _refused(as_output, _zeros(W0=(4, 1), W1=(4, 1)), "not identically distributed", None)

    def scores(p, x):
        h = x @ p["W0"]
        c = jnp.concatenate([h, jnp.tanh(h)], axis=-1)
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", c, c) / 32, axis=-1)  # scores of a concatenation
        return jnp.mean(jnp.einsum("bts,bsd->btd", a, h), axis=1) @ p["W1"]

    _refused(scores, _zeros(W0=(4, 16), W1=(16, 1)), "contracted with Concat", "# scores of", x=SEQ_A)

    def flattened(p, x):
        h = jax.nn.relu(_conv(x, p["W0"]))
        c = jnp.concatenate([h, jax.nn.relu(_conv(h, p["W1"]))], axis=-1)
        return c.reshape(c.shape[0], -1) @ p["W2"]  # flatten the concatenation

    _refused(flattened, _zeros(W0=(3, 3, 2, 4), W1=(3, 3, 4, 4), W2=(200, 1)), "reshape of a concatenation",
             "# flatten the", x=IM_A)

    def spatial_of_width(p, x):
        h = x @ p["W0"]
        c = jnp.concatenate([h, jnp.tanh(h)], axis=-1)
        c = jnp.concatenate([c, c], axis=1)  # positions of a concatenation
        return jnp.mean(c, axis=1) @ p["W1"]

    _refused(spatial_of_width, _zeros(W0=(4, 8), W1=(16, 1)), "along a spatial axis of concatenations",
             "# positions of", x=SEQ_A)

    def maximum(p, x):
        h = x @ p["W0"]
        c = jnp.concatenate([h, jnp.tanh(h)], axis=-1)
        return jnp.max(c, axis=-1, keepdims=True) * (h @ p["W1"])  # max over a concatenation

    _refused(maximum, _zeros(W0=(4, 8), W1=(8, 1)), "no rule here", "# max over")


def test_concatenations_that_do_not_line_up_are_refused():
    def misaligned(p, x):
        h = x @ p["W0"]
        c = jnp.concatenate([h, jnp.tanh(h)], axis=-1)
        return (c + jax.nn.relu(x @ p["W1"])) @ p["W2"]  # an activation across the parts

    msg = _refused(misaligned, _zeros(W0=(4, 8), W1=(4, 16), W2=(16, 1)), "not split into the same parts",
                   "# an activation across")
    assert "Gaussian" in msg

    def products(p, x):
        a, b = x @ p["W0"], x @ p["W1"]
        c = jnp.concatenate([a, b], axis=-1) * jnp.concatenate([b, a], axis=-1)
        return c @ p["W2"]  # products enter a weight

    _refused(products, _zeros(W0=(4, 8), W1=(4, 8), W2=(16, 1)), "products of activations", "# products enter")

    def reused(p, x):
        h = jax.nn.relu(x @ p["W0"])
        c = jnp.concatenate([h, jnp.tanh(x @ p["W1"])], axis=-1)
        return c @ p["W2"] + jax.nn.relu(x @ p["W3"]) @ p["W2"]  # one weight, two splits

    _refused(reused, _zeros(W0=(4, 8), W1=(4, 8), W3=(4, 16), W2=(16, 1)), "differently concatenated", None)


def test_constants_per_channel_that_are_refused():
    def after_activation(p, x):
        h = jax.nn.relu(x @ p["W0"])
        return (h * p["s"]) @ p["W1"]  # per-channel scale of an activation

    params = {"W0": jnp.zeros((4, 8)), "s": jnp.tile(jnp.asarray([[1.0, 2.0]]), (1, 4)), "W1": jnp.zeros((8, 1))}
    priors = {"W*": traced.Weight(1.0), "s": traced.Fixed()}
    msg = _refused(after_activation, params, "constant per channel that varies along the width", "# per-channel",
                   priors=priors)
    assert "not Gaussian" in msg

    def many(p, x):
        return jax.nn.relu(x @ p["W0"] * p["s"]) @ p["W1"]  # many values

    params = {"W0": jnp.zeros((4, 64)), "s": jnp.linspace(0.5, 2.0, 64)[None], "W1": jnp.zeros((64, 1))}
    _refused(many, params, "64 different values", "# many values", priors=priors)

    def statistic_added(p, x):
        h = x @ p["W0"]
        return (h + jnp.mean(h ** 2, axis=-1, keepdims=True) * p["s"]) @ p["W1"]  # statistic times scale added

    params = {"W0": jnp.zeros((4, 8)), "s": jnp.tile(jnp.asarray([[1.0, 2.0]]), (1, 4)), "W1": jnp.zeros((8, 1))}
    _refused(statistic_added, params, "only as the factor of an activation", "# statistic times", priors=priors)
