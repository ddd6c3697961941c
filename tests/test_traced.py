"""smnngp.traced: the infinite-width kernel of a model written in Flax or plain JAX, read from its program.

Same network, two spellings: written with `smnngp.stax` and written in Flax linen or plain JAX, the traced kernel
equals the stax kernel to 1e-12 (float64), NNGP and NTK, for x2 = None and for two input sets. Finite networks
drawn by the returned ``init_fn`` converge to it (Monte Carlo). Every refused construction names the primitive
and the user's line.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax, traced
from smnngp.traced._activations import quadrature_layer

nn = pytest.importorskip("flax.linen", reason="the Flax spellings need flax (pip install -e '.[traced]')")

X1 = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
X2 = jax.random.normal(jax.random.PRNGKey(2), (3, 4))
TOL = 1e-12


def _assert_same(kernel_fn, stax_kernel_fn, tol=TOL, x1=X1, x2=X2):
    for first, second in ((x1, None), (x1, x2)):
        got, want = kernel_fn(first, second), stax_kernel_fn(first, second)
        for name in ("nngp", "ntk", "cov1"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)
        if second is not None:
            np.testing.assert_allclose(got.cov2, want.cov2, rtol=tol, atol=tol)
        assert got.shape1 == want.shape1 and got.is_gaussian == want.is_gaussian


class _MLP(nn.Module):
    act: object
    width: int = 64
    depth: int = 3

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = self.act(nn.Dense(self.width)(x))
        return nn.Dense(1)(x)


@pytest.mark.parametrize("act, layer", [
    (nn.relu, stax.Relu()),
    (jax.scipy.special.erf, stax.Erf()),
    (lambda x: nn.gelu(x, approximate=False), stax.Gelu()),
    (lambda x: jnp.where(x > 0, x, 0.2 * x), stax.LeakyRelu(0.2)),
], ids=["relu", "erf", "gelu", "leaky-where"])
def test_flax_mlp_equals_the_stax_mlp(act, layer):
    model = _MLP(act)
    params = model.init(jax.random.PRNGKey(0), X1)
    _, _, kernel_fn = traced.infinite_width(model.apply, params)
    _, _, stax_kernel_fn = stax.serial(*([stax.Dense(64), layer] * 3), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn)
    # the chain was read as the closed form, not integrated
    names = {how for _, how in kernel_fn.activations(X1.shape)}
    assert names == {layer.name}, names


def test_equinox_mlp_with_its_own_initialiser_scales_equals_stax():
    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")
    model = eqx.nn.MLP(4, 1, 16, 2, activation=jax.nn.relu, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)

    def apply(p, x):
        return jax.vmap(eqx.combine(p, static))(x)

    _, _, kernel_fn = traced.infinite_width(apply, params)
    # Equinox draws weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)): variance 1 / (3 fan_in)
    w, b_in, b_hid = 1 / np.sqrt(3), 1 / np.sqrt(12), 1 / np.sqrt(48)
    _, _, stax_kernel_fn = stax.serial(stax.Dense(16, w, b_in), stax.Relu(), stax.Dense(16, w, b_hid), stax.Relu(),
                                       stax.Dense(1, w, b_hid))
    _assert_same(kernel_fn, stax_kernel_fn)


def test_flax_nnx_mlp_equals_stax():
    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(4, 32, rngs=rngs)
            self.l2 = nnx.Linear(32, 32, rngs=rngs)
            self.out = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.gelu(self.l2(jax.nn.relu(self.l1(x))), approximate=False))

    graphdef, state = nnx.split(MLP(nnx.Rngs(0)))

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    _, _, kernel_fn = traced.infinite_width(apply, state)
    _, _, stax_kernel_fn = stax.serial(stax.Dense(32), stax.Relu(), stax.Dense(32), stax.Gelu(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn)


@pytest.mark.parametrize("name", ["relu", "erf", "gelu"])
def test_mlps_in_nnx_equinox_and_plain_jax_equal_stax(name):
    """The MLP of each activation (ReLU, erf, exact GELU) in plain JAX, Flax NNX and Equinox."""
    act = {"relu": jax.nn.relu, "erf": jax.scipy.special.erf,
           "gelu": lambda x: jax.nn.gelu(x, approximate=False)}[name]
    layer = {"relu": stax.Relu(), "erf": stax.Erf(), "gelu": stax.Gelu()}[name]

    def plain(p, x):
        h = act(x @ p["W0"] + p["b0"][None, :])
        h = act(h @ p["W1"] + p["b1"][None, :])
        return h @ p["W2"] + p["b2"][None, :]

    params = {"W0": jnp.zeros((4, 16)), "b0": jnp.zeros((16,)), "W1": jnp.zeros((16, 16)), "b1": jnp.zeros((16,)),
              "W2": jnp.zeros((16, 1)), "b2": jnp.zeros((1,))}
    _, _, kernel_fn = traced.infinite_width(plain, params, priors={"W*": traced.Weight(1.0), "b*": traced.Bias(0.1)})
    _, _, stax_kernel_fn = stax.serial(stax.Dense(16, b_std=0.1), layer, stax.Dense(16, b_std=0.1), layer,
                                       stax.Dense(1, b_std=0.1))
    _assert_same(kernel_fn, stax_kernel_fn)
    assert {how for _, how in kernel_fn.activations(X1.shape)} == {layer.name}

    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")

    class NnxMLP(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.l2, self.out = nnx.Linear(4, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs), \
                nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x):
            return self.out(act(self.l2(act(self.l1(x)))))

    graphdef, state = nnx.split(NnxMLP(nnx.Rngs(0)))
    _, _, kernel_fn = traced.infinite_width(lambda st, x: nnx.merge(graphdef, st)(x), state,
                                            priors={"*bias": traced.Bias(0.1)})
    _assert_same(kernel_fn, stax_kernel_fn)

    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")
    model = eqx.nn.MLP(4, 1, 16, 2, activation=act, key=jax.random.PRNGKey(0))
    eparams, static = eqx.partition(model, eqx.is_array)
    _, _, kernel_fn = traced.infinite_width(lambda p, x: jax.vmap(eqx.combine(p, static))(x), eparams,
                                            priors={"*weight": traced.Weight(1.0), "*bias": traced.Bias(0.1)})
    _assert_same(kernel_fn, stax_kernel_fn)


def test_plain_jax_ntk_style_with_biases_and_tanh_takes_quadrature():
    def apply(params, x):
        for W, b in params[:-1]:
            x = jnp.tanh(x @ W * (1.5 / jnp.sqrt(W.shape[0])) + 0.1 * b)
        W, b = params[-1]
        return x @ W * (1.5 / jnp.sqrt(W.shape[0])) + 0.1 * b

    params = [(jnp.ones((4, 16)), jnp.ones((1, 16))), (jnp.ones((16, 16)), jnp.ones((1, 16))),
              (jnp.ones((16, 1)), jnp.ones((1, 1)))]
    priors = {"*/0": traced.Weight(1.0, init="unit"), "*/1": traced.Bias(1.0)}
    _, _, kernel_fn = traced.infinite_width(apply, params, priors=priors, quadrature_degree=24)
    tanh = quadrature_layer(jnp.tanh, 24)
    _, _, stax_kernel_fn = stax.serial(stax.Dense(16, 1.5, 0.1), tanh, stax.Dense(16, 1.5, 0.1), tanh,
                                       stax.Dense(1, 1.5, 0.1))
    _assert_same(kernel_fn, stax_kernel_fn)
    lines = kernel_fn.activations(X1.shape)
    assert all(how.startswith("Quadrature") for _, how in lines) and len(lines) == 2
    assert all("test_traced.py" in where for where, _ in lines), lines


def test_hand_written_residual_block_equals_the_stax_residual():
    class Res(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(32)(x)
            h = h + nn.Dense(32)(nn.relu(h))
            return nn.Dense(1)(nn.relu(h))

    model = Res()
    _, _, kernel_fn = traced.infinite_width(model.apply, model.init(jax.random.PRNGKey(0), X1))
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(32), stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(stax.Relu(), stax.Dense(32))),
        stax.FanInSum(), stax.Relu(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn)


def test_flax_layer_norm_equals_the_stax_layer_norm():
    class LN(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(epsilon=1e-12)(nn.Dense(32)(x))
            return nn.Dense(1)(nn.relu(h))

    model = LN()
    _, _, kernel_fn = traced.infinite_width(model.apply, model.init(jax.random.PRNGKey(0), X1))
    _, _, stax_kernel_fn = stax.serial(stax.Dense(32), stax.LayerNorm(eps=1e-12), stax.Relu(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn)


def test_layer_norm_in_nnx_equinox_and_plain_jax_equals_the_stax_layer_norm():
    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")
    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")
    _, _, stax_kernel_fn = stax.serial(stax.Dense(32), stax.LayerNorm(eps=1e-12), stax.Relu(), stax.Dense(1))

    class NnxLN(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.norm = nnx.Linear(4, 32, rngs=rngs), nnx.LayerNorm(32, epsilon=1e-12, rngs=rngs)
            self.out = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.norm(self.l1(x))))

    graphdef, state = nnx.split(NnxLN(nnx.Rngs(0)))
    _, _, kernel_fn = traced.infinite_width(lambda st, x: nnx.merge(graphdef, st)(x), state)
    _assert_same(kernel_fn, stax_kernel_fn)

    class EqxLN(eqx.Module):  # one example at a time; the LayerNorm's weight and bias vectors are fixed
        l1: eqx.nn.Linear
        norm: eqx.nn.LayerNorm
        out: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.l1, self.out = eqx.nn.Linear(4, 32, key=k1), eqx.nn.Linear(32, 1, key=k2)
            self.norm = eqx.nn.LayerNorm(32, eps=1e-12)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.norm(self.l1(x))))

    params, static = eqx.partition(EqxLN(jax.random.PRNGKey(0)), eqx.is_array)
    _, _, kernel_fn = traced.infinite_width(lambda p, x: jax.vmap(eqx.combine(p, static))(x), params)
    assert isinstance(kernel_fn.priors["norm/weight"], traced.Fixed)
    s = 1.0 / np.sqrt(3.0)
    _, _, eqx_stax = stax.serial(stax.Dense(32, W_std=s, b_std=s / 2.0), stax.LayerNorm(eps=1e-12), stax.Relu(),
                                 stax.Dense(1, W_std=s, b_std=s / np.sqrt(32.0)))
    _assert_same(kernel_fn, eqx_stax)

    def plain(p, x):
        h = x @ p["W1"]
        h = (h - h.mean(axis=-1, keepdims=True)) / jnp.sqrt(h.var(axis=-1, keepdims=True) + 1e-12)
        return jax.nn.relu(h) @ p["W2"]

    _, _, kernel_fn = traced.infinite_width(plain, {"W1": jnp.zeros((4, 32)), "W2": jnp.zeros((32, 1))},
                                            priors={"W*": traced.Weight(1.0)})
    _, _, plain_stax = stax.serial(stax.Dense(32), stax.LayerNorm(eps=1e-12), stax.Relu(), stax.Dense(1))
    _assert_same(kernel_fn, plain_stax)


def test_standard_parameterisation_and_explicit_scales():
    model = _MLP(nn.relu, width=16, depth=2)
    params = model.init(jax.random.PRNGKey(0), X1)
    priors = {"*/kernel": traced.Weight(1.3, parameterization="standard"),
              "*/bias": traced.Bias(0.4, parameterization="standard")}
    _, _, kernel_fn = traced.infinite_width(model.apply, params, priors=priors)
    std = dict(W_std=1.3, b_std=0.4, parameterization="standard")
    _, _, stax_kernel_fn = stax.serial(stax.Dense(16, **std), stax.Relu(), stax.Dense(16, **std), stax.Relu(),
                                       stax.Dense(1, **std))
    _assert_same(kernel_fn, stax_kernel_fn)


def test_kernel_fn_jits_and_feeds_the_posterior():
    from smnngp import posterior, priors

    model = _MLP(nn.relu, width=8, depth=1)
    _, _, kernel_fn = traced.infinite_width(model.apply, model.init(jax.random.PRNGKey(0), X1))
    eager = kernel_fn(X1, X2, get="nngp")
    jitted = jax.jit(kernel_fn, static_argnames="get")(X1, X2, get="nngp")
    np.testing.assert_allclose(jitted, eager, rtol=1e-14)
    y = jnp.sin(X1[:, 0])
    stp = posterior.fit(kernel_fn, X1, y, priors.InverseGamma(2.0, 2.0), noise=0.01)  # a Student-t process on it
    pred = stp.predict(X2)
    assert pred.mean.shape == (3,) and np.all(np.isfinite(np.asarray(pred.variance)))
    assert stp.df == 4.0 + 5


def _monte_carlo_errors(init_fn, apply_fn, x, counts, exact, samples_per_call=4):
    """Largest relative error of the Monte Carlo NNGP and NTK after each number of networks in ``counts``."""
    from smnngp.empirical import monte_carlo_kernel_fn

    mc = monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(3), counts, samples_per_call=samples_per_call)
    return [[float(jnp.max(jnp.abs(e - ref)) / jnp.max(jnp.abs(ref))) for e, ref in zip(est, exact)]
            for est in mc(x, None, get=("nngp", "ntk"))]


def test_finite_flax_networks_converge_to_the_traced_kernel():
    """Monte Carlo of the network that init_fn draws: NNGP and NTK close, the error falling with the samples."""
    class Wide(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(2):
                x = nn.relu(nn.Dense(256)(x))
            return nn.Dense(16)(x)  # 16 outputs (traced over) average the per-sample noise

    model = Wide()
    params = model.init(jax.random.PRNGKey(0), X1)
    init_fn, apply_fn, kernel_fn = traced.infinite_width(model.apply, params, priors={"*/bias": traced.Bias(0.2)})
    exact = kernel_fn(X1, None, get=("nngp", "ntk"))
    errors = _monte_carlo_errors(init_fn, apply_fn, X1, [4, 128], exact)
    (nngp4, ntk4), (nngp128, ntk128) = errors
    # 128 samples x 16 outputs: relative standard errors near 3 %, the finite-width bias ~1/256
    assert nngp128 < 0.1 and ntk128 < 0.1, errors
    assert nngp128 < nngp4 and ntk128 < ntk4, errors


def test_a_skip_around_a_nonlinearity_is_one_activation_or_steins_lemma():
    """``relu(h) + h`` is ABRelu(1, 2) of h: read as one activation; written ``W relu(h) + W h`` the sum is over two
    uses of one weight, whose moments pair relu(h) with h by Stein's lemma (E[relu'(h)] Cov(h, h)); both must give
    stax's ABRelu kernel."""

    def apply(p, x):
        h = x @ p["W1"]
        return (jax.nn.relu(h) + h) @ p["W2"]  # skip around the nonlinearity

    def apply_stein(p, x):
        h = x @ p["W1"]
        return jax.nn.relu(h) @ p["W2"] + h @ p["W2"]

    _, _, stax_kernel_fn = stax.serial(stax.Dense(8), stax.ABRelu(1.0, 2.0), stax.Dense(1))
    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS)
    _assert_same(kernel_fn, stax_kernel_fn)
    assert [how for _, how in kernel_fn.activations(X1.shape)] == ["ABRelu(1.0, 2.0)"]
    _, _, kernel_fn = traced.infinite_width(apply_stein, W, priors=PRIORS)
    _assert_same(kernel_fn, stax_kernel_fn)
    assert [how for _, how in kernel_fn.activations(X1.shape)] == ["Relu"]


@pytest.mark.parametrize("act, layer, name", [
    # before the fusion: two activations (ABRelu(1, 0) and Relu), their cross term by 32-node quadrature, 2.7e-3
    # off on the NNGP and 1.3e-2 on the NTK
    (lambda h: 0.3 * jnp.minimum(h, 0) + 1.7 * jnp.maximum(h, 0), stax.ABRelu(0.3, 1.7), "ABRelu(0.3, 1.7)"),
    # before: TypeError: mul does not accept dtype bool
    (lambda h: h * (h > 0), stax.Relu(), "Relu"),
    (lambda h: (h > 0).astype(h.dtype) * h, stax.Relu(), "Relu"),
    (lambda h: jnp.where(h > 0, h, 0.0), stax.Relu(), "Relu"),
    (lambda h: jnp.where(h >= 0, 1.0, 0.0) * h - 0.1 * (h < 0) * h, stax.LeakyRelu(-0.1), "LeakyRelu(-0.1)"),
    (lambda h: 0.5 * (h + jnp.abs(h)), stax.Relu(), "ABRelu(0.0, 2.0)"),  # 1/2 (u + |u|), then the factor 1/2
    (lambda h: jnp.where(h > 0, h, 0.1 * h), stax.LeakyRelu(0.1), "LeakyRelu(0.1)"),
    (lambda h: jnp.maximum(h, 0) - 0.2 * jnp.maximum(-h, 0), stax.LeakyRelu(0.2), "LeakyRelu(0.2)"),
    (lambda h: 2 * jnp.sin(h) - jnp.sin(h) * 0.5, stax.Sin(1.5), "Sin(1.5, 1.0, 0.0)"),
], ids=["abrelu-min-max", "h-times-mask", "mask-astype", "where-zero", "masks-sum", "half-h-plus-abs", "leaky-where",
        "relu-minus-relu", "sin-sum"])
def test_a_combination_of_functions_of_one_preactivation_is_one_activation(act, layer, name):
    """Sums, scalings and products of functions of one Gaussian h (comparisons of h among them) are one function
    of h: one activation, named by value, in closed form."""

    def apply(p, x):
        return act(x @ p["W1"]) @ p["W2"]

    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS)
    _, _, stax_kernel_fn = stax.serial(stax.Dense(8), layer, stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, tol=1e-10)
    assert [how for _, how in kernel_fn.activations(X1.shape)] == [name]


def test_a_combination_without_a_closed_form_is_one_function_by_quadrature():
    """``tanh(h) + relu(h)`` has no closed form: the one function gets one bivariate quadrature, equal to the polar
    quadrature of it as a stax layer (as two activations, the ReLU in closed form and the cross term by 24-node
    Gauss-Hermite, the kernel was 3.5e-3 off it on the NNGP and 1.5e-2 on the NTK: numbers that depended on how the
    sum was spelled)."""

    def apply(p, x):
        h = x @ p["W1"]
        return (jnp.tanh(h) + jnp.maximum(h, 0)) @ p["W2"]

    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS, quadrature_degree=24)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(8), quadrature_layer(lambda u: jnp.tanh(u) + jax.nn.relu(u), 24), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, tol=1e-10)
    assert [how.split("(")[0] for _, how in kernel_fn.activations(X1.shape)] == ["Quadrature"]


def test_functions_of_two_independent_preactivations_stay_two_activations():
    """``phi(a) + phi(b)`` for independent Gaussians a, b is a function of two variables: each branch's terms are
    fused into its own activation (phi(u) = max(u, 0) + min(u, 0) + sin(u) = u + sin(u), odd, so that stax's
    FanInSum, which drops the product of the branches' means, is exact), the branches stay two."""

    def phi(h):
        return jnp.maximum(h, 0) + jnp.minimum(h, 0) + jnp.sin(h)

    def apply(p, x):
        return (phi(x @ p["W1"]) + phi(x @ p["W3"])) @ p["W2"]

    params = dict(W, W3=jnp.ones((4, 8)))
    _, _, kernel_fn = traced.infinite_width(apply, params, priors=PRIORS, quadrature_degree=24)
    branch = stax.serial(stax.Dense(8), quadrature_layer(lambda u: u + jnp.sin(u), 24))
    _, _, stax_kernel_fn = stax.serial(stax.FanOut(2), stax.parallel(branch, branch), stax.FanInSum(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, tol=1e-10)
    assert [how.split("(")[0] for _, how in kernel_fn.activations(X1.shape)] == ["Quadrature"] * 2


def test_two_different_activations_of_one_preactivation_are_one_function():
    """``sin(h) + erf(h)``: two chains of one pre-activation make one function of it, which is not a closed form:
    the quadrature of the one function (smooth, so exact to rounding)."""

    def apply(p, x):
        h = x @ p["W1"]
        return (jnp.sin(h) + jax.lax.erf(h)) @ p["W2"]

    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS, quadrature_degree=64)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(8), quadrature_layer(lambda u: jnp.sin(u) + jax.lax.erf(u), 64), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, tol=1e-10)
    assert [how.split("(")[0] for _, how in kernel_fn.activations(X1.shape)] == ["Quadrature"]


# -- convolutional networks: any layout, pooling, flattening, residual blocks --------------------------------

IM1 = jax.random.normal(jax.random.PRNGKey(4), (3, 6, 6, 2))  # NHWC
IM2 = jax.random.normal(jax.random.PRNGKey(5), (2, 6, 6, 2))


def _nchw(x):
    return jnp.transpose(x, (0, 3, 1, 2))


def _channels_last(stax_kernel_fn):
    """A stax kernel_fn (NHWC) taking NCHW inputs, to compare with a traced channels-first model."""
    def kernel_fn(x1, x2=None):
        return stax_kernel_fn(jnp.transpose(x1, (0, 2, 3, 1)), None if x2 is None else jnp.transpose(x2, (0, 2, 3, 1)))

    return kernel_fn


def test_flax_cnn_with_pooling_strides_and_global_mean_equals_the_stax_cnn():
    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(8, (3, 3))(x))  # 'SAME'
            x = nn.avg_pool(x, (2, 2), strides=(1, 1), padding="SAME")
            x = jax.lax.erf(nn.Conv(8, (2, 2), strides=(2, 2), padding="VALID")(x))
            return nn.Dense(2)(jnp.mean(x, axis=(1, 2)))

    model = CNN()
    params = model.init(jax.random.PRNGKey(0), IM1)
    _, _, kernel_fn = traced.infinite_width(model.apply, params, priors={"*/bias": traced.Bias(0.3)})
    _, _, stax_kernel_fn = stax.serial(
        stax.Conv(8, (3, 3), padding="SAME", b_std=0.3), stax.Relu(),
        stax.AvgPool((2, 2), (1, 1), padding="SAME"),
        stax.Conv(8, (2, 2), (2, 2), padding="VALID", b_std=0.3), stax.Erf(),
        stax.GlobalAvgPool(), stax.Dense(2, b_std=0.3))
    _assert_same(kernel_fn, stax_kernel_fn, x1=IM1, x2=IM2)


def test_a_combination_of_a_convolution_and_functions_of_it_is_one_activation():
    """``relu(h) + h / 2 - min(h, 0) / 5`` of a convolution is ABRelu(0.3, 1.5) of it, with its spatial kernel (as
    three terms, the pairing of relu(h) with h was refused for spatial activations)."""

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Conv(8, (3, 3))(x)
            return nn.Dense(1)(jnp.mean(nn.relu(h) + 0.5 * h - 0.2 * jnp.minimum(h, 0), axis=(1, 2)))

    x1, x2 = IM1[:2, :3, :3], IM2[:, :3, :3]
    model = CNN()
    _, _, kernel_fn = traced.infinite_width(model.apply, model.init(jax.random.PRNGKey(0), x1))
    _, _, stax_kernel_fn = stax.serial(stax.Conv(8, (3, 3), padding="SAME"), stax.ABRelu(0.3, 1.5),
                                       stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, tol=1e-10, x1=x1, x2=x2)
    assert [how for _, how in kernel_fn.activations(x1.shape)] == ["ABRelu(0.3, 1.5)"]


def test_flax_wide_resnet_blocks_equal_the_stax_wide_resnet():
    """Two WideResNet blocks (identity shortcut, then a strided convolution in the shortcut), as in
    neural-tangents' WideResnet, written by hand in Flax."""

    class WRN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(4, (3, 3))(x)
            h = nn.Conv(4, (3, 3))(nn.relu(nn.Conv(4, (3, 3))(nn.relu(x))))
            x = x + h
            h = nn.Conv(6, (3, 3))(nn.relu(nn.Conv(6, (3, 3), strides=(2, 2))(nn.relu(x))))
            x = h + nn.Conv(6, (3, 3), strides=(2, 2))(x)
            x = nn.avg_pool(nn.relu(x), (2, 2), strides=(2, 2), padding="SAME")
            return nn.Dense(1)(x.reshape((x.shape[0], -1)))

    def block(channels, strides, mismatch):
        main = stax.serial(stax.Relu(), stax.Conv(channels, (3, 3), strides, padding="SAME", b_std=0.0),
                           stax.Relu(), stax.Conv(channels, (3, 3), padding="SAME", b_std=0.0))
        shortcut = stax.Conv(channels, (3, 3), strides, padding="SAME", b_std=0.0) if mismatch else stax.Identity()
        return stax.serial(stax.FanOut(2), stax.parallel(main, shortcut), stax.FanInSum())

    model = WRN()
    params = model.init(jax.random.PRNGKey(0), IM1)
    _, _, kernel_fn = traced.infinite_width(model.apply, params)
    _, _, stax_kernel_fn = stax.serial(
        stax.Conv(4, (3, 3), padding="SAME", b_std=0.0), block(4, (1, 1), False), block(6, (2, 2), True),
        stax.Relu(), stax.AvgPool((2, 2), (2, 2), padding="SAME"), stax.Flatten(), stax.Dense(1, b_std=0.0))
    _assert_same(kernel_fn, stax_kernel_fn, x1=IM1, x2=IM2)

    # the same network in Flax NNX
    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")

    class NnxWRN(nnx.Module):
        def __init__(self, rngs):
            conv = functools.partial(nnx.Conv, kernel_size=(3, 3), rngs=rngs)
            self.stem, self.a1, self.a2 = conv(2, 4), conv(4, 4), conv(4, 4)
            self.b1, self.b2, self.short = conv(4, 6, strides=(2, 2)), conv(6, 6), conv(4, 6, strides=(2, 2))
            self.out = nnx.Linear(6 * 2 * 2, 1, rngs=rngs)

        def __call__(self, x):
            x = self.stem(x)
            x = x + self.a2(nnx.relu(self.a1(nnx.relu(x))))
            x = self.b2(nnx.relu(self.b1(nnx.relu(x)))) + self.short(x)
            x = nnx.avg_pool(nnx.relu(x), (2, 2), strides=(2, 2), padding="SAME")
            return self.out(x.reshape((x.shape[0], -1)))

    graphdef, state = nnx.split(NnxWRN(nnx.Rngs(0)))
    _, _, kernel_fn = traced.infinite_width(lambda st, x: nnx.merge(graphdef, st)(x), state)
    _assert_same(kernel_fn, stax_kernel_fn, x1=IM1, x2=IM2)


def test_wide_resnet_block_in_equinox_and_plain_jax_equals_stax():
    """A convolution, then a WideResNet block with a strided convolution in the shortcut, in Equinox (channels
    first, vmapped) and in plain JAX (lax.conv_general_dilated, NHWC, 'ntk' scaling written out)."""
    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")

    class Block(eqx.Module):
        stem: eqx.nn.Conv2d
        c1: eqx.nn.Conv2d
        c2: eqx.nn.Conv2d
        short: eqx.nn.Conv2d
        out: eqx.nn.Linear

        def __init__(self, key):
            k = jax.random.split(key, 5)
            conv = dict(kernel_size=3, padding="SAME", use_bias=False)
            self.stem = eqx.nn.Conv2d(2, 4, key=k[0], **conv)
            self.c1 = eqx.nn.Conv2d(4, 4, stride=2, key=k[1], **conv)
            self.c2 = eqx.nn.Conv2d(4, 4, key=k[2], **conv)
            self.short = eqx.nn.Conv2d(4, 4, stride=2, key=k[3], **conv)
            self.out = eqx.nn.Linear(4, 1, use_bias=False, key=k[4])

        def __call__(self, x):
            x = self.stem(x)
            h = self.c2(jax.nn.relu(self.c1(jax.nn.relu(x)))) + self.short(x)
            return self.out(jnp.mean(jax.nn.relu(h), axis=(1, 2)))

    def stax_block(W_std):
        conv = dict(padding="SAME", W_std=W_std)
        main = stax.serial(stax.Relu(), stax.Conv(4, (3, 3), (2, 2), **conv), stax.Relu(), stax.Conv(4, (3, 3), **conv))
        return stax.serial(stax.Conv(4, (3, 3), **conv), stax.FanOut(2),
                           stax.parallel(main, stax.Conv(4, (3, 3), (2, 2), **conv)), stax.FanInSum(), stax.Relu(),
                           stax.GlobalAvgPool(), stax.Dense(1, W_std=W_std))[2]

    params, static = eqx.partition(Block(jax.random.PRNGKey(0)), eqx.is_array)
    _, _, kernel_fn = traced.infinite_width(lambda p, x: jax.vmap(eqx.combine(p, static))(x), params)
    stax_kernel_fn = stax_block(1.0 / np.sqrt(3.0))

    _assert_same(kernel_fn, _channels_last(stax_kernel_fn), x1=_nchw(IM1), x2=_nchw(IM2))

    def plain(p, x):
        conv = jax.lax.conv_general_dilated
        dn = ("NHWC", "HWIO", "NHWC")
        x = conv(x, p["stem"], (1, 1), "SAME", dimension_numbers=dn) / np.sqrt(18.0)
        h = conv(jax.nn.relu(x), p["c1"], (2, 2), "SAME", dimension_numbers=dn) / 6.0
        h = conv(jax.nn.relu(h), p["c2"], (1, 1), "SAME", dimension_numbers=dn) / 6.0
        h = h + conv(x, p["short"], (2, 2), "SAME", dimension_numbers=dn) / 6.0
        return jnp.mean(jax.nn.relu(h), axis=(1, 2)) @ p["out"] / 2.0

    params = {"stem": jnp.zeros((3, 3, 2, 4)), "c1": jnp.zeros((3, 3, 4, 4)), "c2": jnp.zeros((3, 3, 4, 4)),
              "short": jnp.zeros((3, 3, 4, 4)), "out": jnp.zeros((4, 1))}
    _, _, kernel_fn = traced.infinite_width(plain, params, priors={"*": traced.Weight(1.0, init="unit")})
    _assert_same(kernel_fn, stax_block(1.0), x1=IM1, x2=IM2)


IM5A = jax.random.normal(jax.random.PRNGKey(14), (3, 5, 5, 2))  # odd sizes: 'SAME' with stride 2 is centred
IM5B = jax.random.normal(jax.random.PRNGKey(15), (2, 5, 5, 2))
_DN = ("NHWC", "HWIO", "NHWC")


def _scaled_conv(x, w, strides=(1, 1), padding="SAME"):
    return jax.lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=_DN) / np.sqrt(
        w.shape[0] * w.shape[1] * w.shape[2])


def test_padding_slicing_and_reversing_positions_are_the_stax_convolutions():
    """``jnp.pad`` by one then a 'VALID' convolution is the 'SAME' convolution; a stride-1 'SAME' convolution
    sliced ``[:, ::2, ::2]`` is the stride-2 one (odd sizes); flipping an activation's rows before a random
    convolution and a global mean changes nothing in the limit. Each equals the stax network, NNGP and NTK."""
    params = {"c0": jnp.zeros((3, 3, 2, 8)), "c1": jnp.zeros((3, 3, 8, 8)), "out": jnp.zeros((8, 1))}
    priors = {"*": traced.Weight(1.0, init="unit")}

    def padded(p, x):
        h = jax.nn.relu(_scaled_conv(x, p["c0"]))
        h = jnp.pad(h, ((0, 0), (1, 1), (1, 1), (0, 0)))  # explicit padding
        h = jnp.flip(jax.nn.relu(_scaled_conv(h, p["c1"], padding="VALID")), axis=1)
        return jnp.mean(h, axis=(1, 2)) @ p["out"] / np.sqrt(8.0)

    def sliced(p, x):
        h = jax.nn.relu(_scaled_conv(x, p["c0"]))
        h = jax.nn.relu(_scaled_conv(h, p["c1"])[:, ::2, ::2])  # subsampled
        return jnp.mean(h, axis=(1, 2)) @ p["out"] / np.sqrt(8.0)

    for net, strides in ((padded, (1, 1)), (sliced, (2, 2))):
        _, _, kernel_fn = traced.infinite_width(net, params, priors=priors)
        _, _, stax_kernel_fn = stax.serial(stax.Conv(8, (3, 3), padding="SAME"), stax.Relu(),
                                           stax.Conv(8, (3, 3), strides, padding="SAME"), stax.Relu(),
                                           stax.GlobalAvgPool(), stax.Dense(1))
        _assert_same(kernel_fn, stax_kernel_fn, x1=IM5A, x2=IM5B)


def test_a_class_token_concatenated_in_front_of_a_sequence():
    """A random token (one draw per unit) put before a sequence's positions, then a mean over the positions:
    the pooled kernel is (token variance + the sum of the sequence's kernel over position pairs) / (L + 1)^2,
    the latter from stax's GlobalSumPool. A slice along the width is refused with its line."""

    def with_token(p, x):
        h = jax.nn.relu(x @ p["W0"] / 2.0)
        token = jnp.broadcast_to(p["cls"], (x.shape[0], 1, 16))
        h = jnp.concatenate([token, h], axis=1)  # class token in front
        return jnp.mean(h, axis=1) @ p["W1"] / 4.0

    params = {"W0": jnp.zeros((4, 16)), "cls": jnp.zeros((1, 1, 16)), "W1": jnp.zeros((16, 1))}
    _, _, kernel_fn = traced.infinite_width(with_token, params, priors={"W*": traced.Weight(1.0, init="unit"),
                                                                         "cls": traced.Bias(0.7)})
    _, _, summed = stax.serial(stax.Dense(16), stax.Relu(), stax.GlobalSumPool(), stax.Dense(1))
    positions = SEQ_A.shape[1] + 1
    for second in (None, SEQ_B):
        got = kernel_fn(SEQ_A, second, "nngp")
        want = (0.7**2 + summed(SEQ_A, second, "nngp")) / positions**2
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def width_slice(p, x):
        h = jax.nn.relu(x @ p["W0"])
        return h[:, :8] @ p["W1"]  # half the units

    _refused(width_slice, {"W0": jnp.ones((4, 16)), "W1": jnp.ones((8, 1))}, "along the width", "# half the units",
             PRIORS)


def test_an_image_entering_through_two_values_is_stacked():
    """``conv_a(x) + conv_b(2 x)``: the input enters twice (2 x is computed from it alone); the kernel of the
    stacked values gives a Gaussian of covariance (1 + 4) times the convolution's, stax's Conv with W_std^2 = 5."""

    def apply(p, x):
        conv = jax.lax.conv_general_dilated
        dn = ("NCHW", "OIHW", "NCHW")
        h = conv(x, p["a"], (1, 1), "SAME", dimension_numbers=dn) + conv(2.0 * x, p["b"], (1, 1), "SAME",
                                                                        dimension_numbers=dn)
        return jnp.mean(jax.nn.relu(h), axis=(2, 3)) @ p["out"]

    params = {"a": jnp.zeros((4, 2, 3, 3)), "b": jnp.zeros((4, 2, 3, 3)), "out": jnp.zeros((4, 1))}
    _, _, kernel_fn = traced.infinite_width(apply, params, priors={"*": traced.Weight(1.0)})
    _, _, stax_kernel_fn = stax.serial(stax.Conv(4, (3, 3), padding="SAME", W_std=np.sqrt(5.0)), stax.Relu(),
                                       stax.GlobalAvgPool(), stax.Dense(1))

    _assert_same(kernel_fn, _channels_last(stax_kernel_fn), x1=_nchw(IM1), x2=_nchw(IM2))


def test_equinox_cnn_in_channels_first_layout_equals_stax():
    """Equinox convolves one (C, H, W) example at a time; vmapped over the batch, with its uniform initialisers and
    a tanh that takes quadrature."""
    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")

    class CNN(eqx.Module):
        c1: eqx.nn.Conv2d
        c2: eqx.nn.Conv2d
        out: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.c1 = eqx.nn.Conv2d(2, 4, 3, padding=1, key=k1)
            self.c2 = eqx.nn.Conv2d(4, 4, 3, padding=1, key=k2)
            self.out = eqx.nn.Linear(4 * 3 * 3, 1, key=k3)

        def __call__(self, x):
            x = eqx.nn.AvgPool2d(2, 2)(jax.nn.relu(self.c1(x)))
            return self.out(jnp.tanh(self.c2(x)).reshape(-1))

    params, static = eqx.partition(CNN(jax.random.PRNGKey(0)), eqx.is_array)

    def apply(p, x):
        return jax.vmap(eqx.combine(p, static))(x)

    _, _, kernel_fn = traced.infinite_width(apply, params)
    s = 1.0 / np.sqrt(3.0)  # U(-1/sqrt(fan_in), 1/sqrt(fan_in)): W_std = 1/sqrt(3), b_std = 1/sqrt(3 fan_in)
    _, _, stax_kernel_fn = stax.serial(
        stax.Conv(4, (3, 3), padding="SAME", W_std=s, b_std=s / np.sqrt(18)), stax.Relu(),
        stax.AvgPool((2, 2), (2, 2)),
        stax.Conv(4, (3, 3), padding="SAME", W_std=s, b_std=s / np.sqrt(36)), quadrature_layer(jnp.tanh, 32),
        stax.Flatten(), stax.Dense(1, W_std=s, b_std=s / np.sqrt(36)))

    _assert_same(kernel_fn, _channels_last(stax_kernel_fn), x1=_nchw(IM1), x2=_nchw(IM2))
    assert [how for _, how in kernel_fn.activations(_nchw(IM1).shape)] == ["Quadrature(fn, n_theta=16, n_r=48)", "Relu"]


def test_flax_nnx_cnn_and_a_plain_jax_1d_convolution_equal_stax():
    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(2, 4, (3, 3), rngs=rngs)
            self.out = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.gelu(self.conv(x), approximate=False).mean(axis=(1, 2)))

    graphdef, state = nnx.split(CNN(nnx.Rngs(0)))
    _, _, kernel_fn = traced.infinite_width(lambda st, x: nnx.merge(graphdef, st)(x), state)
    _, _, stax_kernel_fn = stax.serial(stax.Conv(4, (3, 3), padding="SAME", b_std=0.0), stax.Gelu(),
                                       stax.GlobalAvgPool(), stax.Dense(2, b_std=0.0))
    _assert_same(kernel_fn, stax_kernel_fn, x1=IM1, x2=IM2)

    # a 1-D convolution over sequences in plain JAX, 'ntk' scaling written out, a strided 'SAME' window
    def seq_net(p, x):
        h = jax.lax.conv_general_dilated(x, p["w1"], (2,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
        h = jnp.maximum(h / np.sqrt(2 * 3) + 0.5 * p["b1"][None, None, :], 0.0)
        return h.reshape((h.shape[0], -1)) @ p["w2"] / np.sqrt(5 * 4)

    params = {"w1": jnp.zeros((3, 2, 5)), "b1": jnp.zeros((5,)), "w2": jnp.zeros((20, 1))}
    priors = {"w*": traced.Weight(1.0, init="unit"), "b1": traced.Bias(1.0)}
    _, _, kernel_fn = traced.infinite_width(seq_net, params, priors=priors)
    _, _, stax_kernel_fn = stax.serial(stax.Conv(5, (3,), (2,), padding="SAME", b_std=0.5), stax.Relu(),
                                       stax.Flatten(), stax.Dense(1))
    seq1, seq2 = IM1[:, :, 0, :] * 1.0, IM2[:, :, 0, :]
    seq1 = jnp.concatenate([seq1, seq1[:, :2]], axis=1)  # length 8
    seq2 = jnp.concatenate([seq2, seq2[:, :2]], axis=1)
    _assert_same(kernel_fn, stax_kernel_fn, x1=seq1, x2=seq2)


def test_finite_flax_cnns_converge_to_the_traced_kernel():
    """Monte Carlo of a two-layer Flax CNN that init_fn draws (128 channels, global mean, 8 outputs)."""
    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(128, (3, 3))(x))
            x = jax.nn.relu(nn.Conv(128, (3, 3), padding="VALID")(x))
            return nn.Dense(8)(jnp.mean(x, axis=(1, 2)))

    images = IM1[:, :4, :4, :]
    model = CNN()
    params = model.init(jax.random.PRNGKey(0), images)
    init_fn, apply_fn, kernel_fn = traced.infinite_width(model.apply, params, priors={"*/bias": traced.Bias(0.2)})
    exact = kernel_fn(images, None, get=("nngp", "ntk"))
    errors = _monte_carlo_errors(init_fn, apply_fn, images, [2, 32], exact, samples_per_call=2)
    (nngp2, ntk2), (nngp32, ntk32) = errors
    # 32 samples x 8 outputs: the NNGP's relative standard error near 9 % (observed 7.7 %, NTK 2.1 %)
    assert nngp32 < 0.15 and ntk32 < 0.1, errors
    assert nngp32 < nngp2 and ntk32 < ntk2, errors


# -- attention: the GlobalSelfAttention limits (1 / n_key scaling, tied queries and keys) ---------------------

SEQ_A = jax.random.normal(jax.random.PRNGKey(8), (3, 5, 4))  # (batch, positions, channels)
SEQ_B = jax.random.normal(jax.random.PRNGKey(9), (2, 5, 4))
QK, SV, SO = 0.7, 1.3, 0.9


def _stax_attention(mechanism="SOFTMAX", **kw):
    return stax.GlobalSelfAttention(16, 16, 16, 1, linear_scaling=True, attention_mechanism=mechanism, **kw)


def test_plain_jax_softmax_attention_equals_stax_global_self_attention():
    """Queries tied to keys (scaled by QK), scores divided by the key width, softmax over keys, value and output
    projections with their scales and a bias, in the 'ntk' style written out."""

    def net(p, x):
        h = x @ p["W0"] / 2.0
        k = h @ p["Wk"] / jnp.sqrt(16.0)
        v = SV * (h @ p["Wv"]) / jnp.sqrt(16.0)
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", QK * k, k) / k.shape[-1], axis=-1)
        o = SO * jnp.einsum("bts,bsd->btd", a, v) @ p["Wo"] / 4.0 + 0.2 * p["bo"][None, None, :]
        return jnp.mean(jax.nn.relu(o), axis=1) @ p["W1"] / 4.0

    params = {"W0": jnp.zeros((4, 16)), "Wk": jnp.zeros((16, 16)), "Wv": jnp.zeros((16, 16)),
              "Wo": jnp.zeros((16, 16)), "bo": jnp.zeros((16,)), "W1": jnp.zeros((16, 1))}
    priors = {"W*": traced.Weight(1.0, init="unit"), "bo": traced.Bias(1.0)}
    _, _, kernel_fn = traced.infinite_width(net, params, priors=priors)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16), _stax_attention(W_query_std=QK, W_value_std=SV, W_out_std=SO, b_std=0.2), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


@pytest.mark.parametrize("mechanism, attend", [("SOFTMAX", lambda s: jax.nn.softmax(s, axis=-1)),
                                               ("IDENTITY", lambda s: s), ("RELU", jax.nn.relu),
                                               ("ABS", jnp.abs)])
def test_flax_attention_block_with_a_residual_equals_stax(mechanism, attend):
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(16)(x)
            k = nn.Dense(16, use_bias=False)(x)
            v = nn.Dense(16, use_bias=False)(x)
            a = attend(jnp.einsum("btd,bsd->bts", 0.5 * k, k) / 16)
            x = nn.relu(x + nn.Dense(16)(jnp.einsum("bts,bsd->btd", a, v)))
            return nn.Dense(1)(x.reshape((x.shape[0], -1)))

    model = Block()
    params = model.init(jax.random.PRNGKey(0), SEQ_A)
    _, _, kernel_fn = traced.infinite_width(model.apply, params)
    attention = _stax_attention(mechanism, W_query_std=0.5, b_std=0.0)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16, b_std=0.0), stax.FanOut(2), stax.parallel(stax.Identity(), attention), stax.FanInSum(),
        stax.Relu(), stax.Flatten(), stax.Dense(1, b_std=0.0))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


def test_equinox_and_nnx_attention_equal_stax():
    eqx = pytest.importorskip("equinox", reason="the Equinox spelling needs equinox (pip install -e '.[traced]')")
    nnx = pytest.importorskip("flax.nnx", reason="the NNX spelling needs flax >= 0.10")
    _, _, stax_kernel_fn = stax.serial(_stax_attention(b_std=0.0), stax.GlobalAvgPool(), stax.Dense(1, b_std=0.0))

    class EqxAttention(eqx.Module):  # one example at a time: (positions, channels)
        k: eqx.nn.Linear
        v: eqx.nn.Linear
        o: eqx.nn.Linear
        out: eqx.nn.Linear

        def __init__(self, key):
            keys = jax.random.split(key, 4)
            self.k, self.v, self.o = (eqx.nn.Linear(n, 16, use_bias=False, key=kk)
                                      for n, kk in zip((4, 4, 16), keys[:3]))
            self.out = eqx.nn.Linear(16, 1, use_bias=False, key=keys[3])

        def __call__(self, x):
            k, v = jax.vmap(self.k)(x), jax.vmap(self.v)(x)
            a = jax.nn.softmax(k @ k.T / 16, axis=-1)
            return self.out(jnp.mean(jax.vmap(self.o)(a @ v), axis=0))

    params, static = eqx.partition(EqxAttention(jax.random.PRNGKey(0)), eqx.is_array)
    _, _, kernel_fn = traced.infinite_width(lambda p, x: jax.vmap(eqx.combine(p, static))(x), params,
                                            priors={"*": traced.Weight(1.0)})
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)

    class NnxAttention(nnx.Module):
        def __init__(self, rngs):
            self.k = nnx.Linear(4, 16, use_bias=False, rngs=rngs)
            self.v = nnx.Linear(4, 16, use_bias=False, rngs=rngs)
            self.o = nnx.Linear(16, 16, use_bias=False, rngs=rngs)
            self.out = nnx.Linear(16, 1, use_bias=False, rngs=rngs)

        def __call__(self, x):
            k = self.k(x)
            a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", k, k) / 16, axis=-1)
            return self.out(self.o(jnp.einsum("bts,bsd->btd", a, self.v(x))).mean(axis=1))

    graphdef, state = nnx.split(NnxAttention(nnx.Rngs(0)))
    _, _, kernel_fn = traced.infinite_width(lambda st, x: nnx.merge(graphdef, st)(x), state)
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


def test_sqrt_scaled_attention_is_refused():
    params = {"Wk": jnp.ones((4, 8)), "Wq": jnp.ones((4, 8)), "Wv": jnp.ones((4, 8)), "Wo": jnp.ones((8, 1))}
    priors = {"W*": traced.Weight(1.0)}

    def sqrt_scaled(p, x):
        k, v = x @ p["Wk"], x @ p["Wv"]
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", x @ p["Wq"], k) / jnp.sqrt(8.0), axis=-1)  # 1/sqrt(d)
        return jnp.mean(jnp.einsum("bts,bsd->btd", a, v), axis=1) @ p["Wo"]

    with pytest.raises(traced.TracedError, match="grow without bound") as err:
        traced.infinite_width(sqrt_scaled, params, priors=priors, example_input=SEQ_A)
    assert f"test_traced.py:{_line_of(sqrt_scaled, '# 1/sqrt(d)')}" in str(err.value)


@pytest.mark.parametrize("scale", [lambda s, d: QK * s / d, lambda s, d: s / jnp.sqrt(d) * QK / jnp.sqrt(d),
                                   lambda s, d: 0.25 * s / d * (4 * QK)])  # 0.25 = 1/sqrt(16), a constant here
def test_constant_factors_on_scores_before_or_around_the_division_by_the_width(scale):
    """``QK * (q . k) / d``, ``(q . k) / sqrt(d) * QK / sqrt(d)``, ``0.25 * (q . k) / d * 4 QK``: constants may
    come before the division by the width (they are held until it comes), two 1/sqrt(d) factors make the
    division, and a constant that equals 1/sqrt(d) by chance is read either way."""

    def net(p, x):
        h = x @ p["W0"] / 2.0
        k = h @ p["Wk"] / 4.0
        v = SV * (h @ p["Wv"]) / 4.0
        a = jax.nn.softmax(scale(jnp.einsum("btd,bsd->bts", k, k), 16.0), axis=-1)
        o = SO * jnp.einsum("bts,bsd->btd", a, v) @ p["Wo"] / 4.0
        return jnp.mean(jax.nn.relu(o), axis=1) @ p["W1"] / 4.0

    params = {"W0": jnp.zeros((4, 16)), "Wk": jnp.zeros((16, 16)), "Wv": jnp.zeros((16, 16)),
              "Wo": jnp.zeros((16, 16)), "W1": jnp.zeros((16, 1))}
    _, _, kernel_fn = traced.infinite_width(net, params, priors={"W*": traced.Weight(1.0, init="unit")})
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16), _stax_attention(W_query_std=QK, W_value_std=SV, W_out_std=SO), stax.Relu(),
        stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


def _multi_head(p, x, heads=2, order="bthd"):
    """Softmax attention with ``heads`` heads (the width split by a reshape, scores per head divided by the width
    per head), the heads merged back before the output projection; ``order`` the layout of the per-head arrays."""
    width = p["Wk"].shape[1]
    split = x.shape[:2] + (heads, width // heads)
    h = x @ p["W0"] / 2.0
    k = (h @ p["Wk"] / jnp.sqrt(16.0)).reshape(split)
    v = SV * (h @ p["Wv"] / jnp.sqrt(16.0)).reshape(split)
    if order == "mean":  # the heads' weights averaged, then applied to the whole width
        scores = jnp.einsum("bthd,bshd->bhts", QK * k, k) / k.shape[-1]
        a = jnp.mean(jax.nn.softmax(scores, axis=-1), axis=1)
        o = jnp.einsum("bts,bsd->btd", a, v.reshape(x.shape[:2] + (width,)))
    elif order == "bhtd":  # heads before positions
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        scores = jnp.einsum("bhtd,bhsd->bhts", QK * k, k) / k.shape[-1]
        o = jnp.swapaxes(jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(scores, axis=-1), v), 1, 2)
    else:
        scores = jnp.einsum("bthd,bshd->bhts", QK * k, k) / k.shape[-1]
        o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
    o = SO * o.reshape(x.shape[:2] + (width,)) @ p["Wo"] / 4.0
    return jnp.mean(jax.nn.relu(o), axis=1) @ p["W1"] / 4.0


@pytest.mark.parametrize("heads, order", [(2, "bthd"), (4, "bhtd"), (4, "mean")])
def test_multi_head_attention_in_plain_jax_equals_stax(heads, order):
    """Heads split off the width by a reshape: with the width per head taken to infinity and the number of heads
    fixed, every head's scores converge to the same values, so the kernel is stax's GlobalSelfAttention (whose
    limit does not depend on the number of heads), NNGP and NTK."""
    params = {"W0": jnp.zeros((4, 16)), "Wk": jnp.zeros((16, 16)), "Wv": jnp.zeros((16, 16)),
              "Wo": jnp.zeros((16, 16)), "W1": jnp.zeros((16, 1))}
    _, _, kernel_fn = traced.infinite_width(functools.partial(_multi_head, heads=heads, order=order), params,
                                            priors={"W*": traced.Weight(1.0, init="unit")})
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16), stax.GlobalSelfAttention(16, 16 // heads, 16 // heads, heads, linear_scaling=True,
                                                 W_query_std=QK, W_value_std=SV, W_out_std=SO),
        stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


@pytest.mark.parametrize("val_pos_emb", [True, False])
def test_learned_positional_embeddings_equal_stax_sum_embeddings(val_pos_emb):
    """A random (positions, width) leaf added before the key projection (and the value projection when
    ``val_pos_emb``): independent draws per position, stax's 'SUM' embeddings with no decay, NNGP and NTK."""

    def net(p, x):
        h = x @ p["W0"] / 2.0
        e = h + p["pos"][None]  # positional embedding
        k = e @ p["Wk"] / jnp.sqrt(16.0)
        v = SV * ((e if val_pos_emb else h) @ p["Wv"]) / jnp.sqrt(16.0)
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", QK * k, k) / k.shape[-1], axis=-1)
        o = SO * jnp.einsum("bts,bsd->btd", a, v) @ p["Wo"] / 4.0
        return jnp.mean(jax.nn.relu(o), axis=1) @ p["W1"] / 4.0

    params = {"W0": jnp.zeros((4, 16)), "pos": jnp.zeros((5, 16)), "Wk": jnp.zeros((16, 16)),
              "Wv": jnp.zeros((16, 16)), "Wo": jnp.zeros((16, 16)), "W1": jnp.zeros((16, 1))}
    priors = {"W*": traced.Weight(1.0, init="unit"), "pos": traced.Bias(0.8)}
    _, _, kernel_fn = traced.infinite_width(net, params, priors=priors)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16), _stax_attention(W_query_std=QK, W_value_std=SV, W_out_std=SO, pos_emb_type="SUM",
                                        W_pos_emb_std=0.8, val_pos_emb=val_pos_emb),
        stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)


def test_attention_over_an_image_flattened_to_a_sequence_and_folded_back():
    """A convolution, the image's positions reshaped into one sequence, softmax attention over all of them, the
    sequence folded back into the image and convolved again: stax's GlobalSelfAttention over every position of the
    image (the reshapes relabel the kernel's position pairs), NNGP and NTK."""
    dn = ("NHWC", "HWIO", "NHWC")

    def net(p, x):
        h = jax.lax.conv_general_dilated(x, p["c0"], (1, 1), "SAME", dimension_numbers=dn) / np.sqrt(18.0)
        b, rows, cols, c = h.shape
        s = h.reshape(b, rows * cols, c)  # positions as one sequence
        k = s @ p["Wk"] / 4.0
        v = SV * (s @ p["Wv"]) / 4.0
        a = jax.nn.softmax(jnp.einsum("btd,bsd->bts", QK * k, k) / 16, axis=-1)
        o = (SO * jnp.einsum("bts,bsd->btd", a, v) @ p["Wo"] / 4.0).reshape(b, rows, cols, c)
        o = jax.lax.conv_general_dilated(jax.nn.relu(o), p["c1"], (1, 1), "SAME", dimension_numbers=dn) / 12.0
        return jnp.mean(jax.nn.relu(o), axis=(1, 2)) @ p["out"] / 4.0

    params = {"c0": jnp.zeros((3, 3, 2, 16)), "Wk": jnp.zeros((16, 16)), "Wv": jnp.zeros((16, 16)),
              "Wo": jnp.zeros((16, 16)), "c1": jnp.zeros((3, 3, 16, 16)), "out": jnp.zeros((16, 1))}
    _, _, kernel_fn = traced.infinite_width(net, params, priors={"*": traced.Weight(1.0, init="unit")})
    _, _, stax_kernel_fn = stax.serial(
        stax.Conv(16, (3, 3), padding="SAME"), _stax_attention(W_query_std=QK, W_value_std=SV, W_out_std=SO),
        stax.Relu(), stax.Conv(16, (3, 3), padding="SAME"), stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=IM1, x2=IM2)


def test_attention_scores_over_two_position_axes_are_refused():
    def two_axes(p, x):
        h = x @ p["W0"]
        scores = jnp.einsum("bijd,bkld->bijkl", h, h) / 16  # rows and columns
        a = jax.nn.softmax(scores.reshape(scores.shape[:3] + (-1,)), axis=-1)
        return jnp.mean(jnp.einsum("bijs,bsd->bijd", a, h.reshape(h.shape[0], -1, 16)), axis=(1, 2)) @ p["W1"]

    params = {"W0": jnp.ones((2, 16)), "W1": jnp.ones((16, 1))}
    with pytest.raises(traced.TracedError, match="flatten the positions") as e:
        traced.infinite_width(two_axes, params, priors={"*": traced.Weight(1.0)}, example_input=IM1)
    assert f"test_traced.py:{_line_of(two_axes, '# rows and columns')}" in str(e.value)


def _linear_scaled_attention(query, key, value, **_):
    """Flax's ``attention_fn`` hook with scores divided by the width per head (1 / n_key scaling)."""
    scores = jnp.einsum("...qhd,...khd->...hqk", query, key) / query.shape[-1]
    return jnp.einsum("...hqk,...khd->...qhd", jax.nn.softmax(scores, axis=-1), value)


def test_flax_multi_head_attention_module():
    """``nn.MultiHeadDotProductAttention`` (DenseGeneral kernels (features, heads, width) into the heads and
    (heads, width, features) out of them). With the linear-scaled ``attention_fn`` its queries and keys are
    independent, so their scores vanish in the limit and every position is weighted alike: stax's attention with a
    vanishing query scale. Flax's default 1 / sqrt(width) scores are refused."""

    def net(attention_fn=None):
        class Net(nn.Module):
            @nn.compact
            def __call__(self, x):
                h = nn.Dense(16, use_bias=False)(x)
                kw = {} if attention_fn is None else {"attention_fn": attention_fn}
                h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=16, out_features=16, use_bias=False,
                                                    **kw)(h)
                return nn.Dense(1, use_bias=False)(jnp.mean(jax.nn.relu(h), axis=1))
        return Net()

    model = net(_linear_scaled_attention)
    params = model.init(jax.random.PRNGKey(0), SEQ_A)
    _, _, kernel_fn = traced.infinite_width(model.apply, params)
    _, _, stax_kernel_fn = stax.serial(
        stax.Dense(16), stax.GlobalSelfAttention(16, 8, 8, 2, linear_scaling=True, W_query_std=1e-30),
        stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn, x1=SEQ_A, x2=SEQ_B)
    with pytest.raises(traced.TracedError, match="grow without bound"):
        traced.infinite_width(net().apply, params, example_input=SEQ_A)


def test_a_projection_applied_per_head_is_refused():
    params = {"Wk": jnp.ones((4, 8)), "Wv": jnp.ones((4, 8)), "Wh": jnp.ones((4, 4)), "Wo": jnp.ones((8, 1))}

    def per_head_projection(p, x):
        k = (x @ p["Wk"]).reshape(x.shape[:2] + (2, 4))
        a = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", k, k) / 4, axis=-1)
        v = (x @ p["Wv"]).reshape(x.shape[:2] + (2, 4)) @ p["Wh"]  # per head
        return jnp.mean(jnp.einsum("bhts,bshd->bthd", a, v).reshape(x.shape[:2] + (8,)), axis=1) @ p["Wo"]

    with pytest.raises(traced.TracedError, match="each attention head") as err:
        traced.infinite_width(per_head_projection, params, priors={"W*": traced.Weight(1.0)}, example_input=SEQ_A)
    assert f"test_traced.py:{_line_of(per_head_projection, '# per head')}" in str(err.value)


# -- weight reuse: tied weights and recurrent networks (Tensor Programs) ---------------------------------------

def test_tied_weights_give_the_untied_kernels():
    """One square weight applied three times in a row: the NNGP and NTK are those of the untied MLP (the moments
    of two uses of a weight pair up through its map; the gradient's cross terms between uses vanish)."""

    def tied(p, x):
        h = jax.nn.relu(x @ p["W_in"])
        for _ in range(3):
            h = jax.nn.relu(h @ p["W"])  # the same W every time
        return h @ p["W_out"]

    params = {"W_in": jnp.zeros((4, 16)), "W": jnp.zeros((16, 16)), "W_out": jnp.zeros((16, 1))}
    _, _, kernel_fn = traced.infinite_width(tied, params, priors={"W*": traced.Weight(1.0)})
    _, _, stax_kernel_fn = stax.serial(stax.Dense(16), stax.Relu(), *[stax.Dense(16), stax.Relu()] * 3,
                                       stax.Dense(1))
    _assert_same(kernel_fn, stax_kernel_fn)


def test_a_weight_used_with_its_transpose_is_refused():
    """Tied input/output embeddings and a tied autoencoder use a weight and its transpose: the two uses are
    correlated in the limit by a term the interpreter does not compute, so both are refused at the second use."""
    onehot = jax.nn.one_hot(jnp.array([[0, 2, 1], [3, 3, 0]]), 5)  # (batch, tokens, vocabulary)

    def tied_embeddings(p, x):
        h = jax.nn.relu(x @ p["E"] @ p["W"])
        return jnp.mean(h, axis=1) @ p["E"].T  # readout tied to the embedding

    params = {"E": jnp.zeros((5, 16)), "W": jnp.zeros((16, 16))}
    with pytest.raises(traced.TracedError, match="transpose") as err:
        traced.infinite_width(tied_embeddings, params, priors={"*": traced.Weight(1.0)}, example_input=onehot)
    assert f"test_traced.py:{_line_of(tied_embeddings, '# readout tied')}" in str(err.value)

    def tied_autoencoder(p, x):
        h = jax.nn.relu(x @ p["W0"])
        z = jnp.tanh(h @ p["W"])
        return jax.nn.relu(z @ p["W"].T) @ p["W1"]  # decoder tied

    params = {"W0": jnp.zeros((4, 16)), "W": jnp.zeros((16, 16)), "W1": jnp.zeros((16, 1))}
    with pytest.raises(traced.TracedError, match="transpose") as err:
        traced.infinite_width(tied_autoencoder, params, priors={"*": traced.Weight(1.0)}, example_input=X1)
    assert f"test_traced.py:{_line_of(tied_autoencoder, '# decoder tied')}" in str(err.value)


def _rnn(p, x):
    """An Elman network with tanh over (batch, time, features), in lax.scan; the last state is read out."""

    def step(h, x_t):
        return jnp.tanh(h @ p["W"] + x_t @ p["U"] + p["b"][None, :]), None

    h0 = jnp.zeros((x.shape[0], p["W"].shape[0]), x.dtype)
    h, _ = jax.lax.scan(step, h0, jnp.swapaxes(x, 0, 1))
    return h @ p["V"]


def _rnn_params(width, outputs=8):
    return {"W": jnp.zeros((width, width)), "U": jnp.zeros((3, width)), "b": jnp.zeros((width,)),
            "V": jnp.zeros((width, outputs))}


RNN_PRIORS = {"W": traced.Weight(1.0), "U": traced.Weight(1.0), "V": traced.Weight(1.0), "b": traced.Bias(0.1)}
SEQ1 = jax.random.normal(jax.random.PRNGKey(6), (4, 3, 3))  # (batch, time, features)
SEQ2 = jax.random.normal(jax.random.PRNGKey(7), (2, 3, 3))


def test_a_recurrent_network_in_lax_scan_converges_monte_carlo():
    """The tanh RNN (quadrature path: tanh has no closed form) at width 512: the finite networks that init_fn
    draws converge to the traced kernel; x2 blocks agree with the kernel of the stacked inputs."""
    init_fn, apply_fn, kernel_fn = traced.infinite_width(_rnn, _rnn_params(512), priors=RNN_PRIORS)
    assert {how for _, how in kernel_fn.activations(SEQ1.shape)} == {"Quadrature(fn, n_theta=16, n_r=48)"}
    exact = kernel_fn(SEQ1, None, get=("nngp", "ntk"))
    both = kernel_fn(jnp.concatenate([SEQ1, SEQ2]), None, get="nngp")
    np.testing.assert_allclose(kernel_fn(SEQ1, SEQ2, get="nngp"), both[:4, 4:], rtol=1e-10, atol=1e-12)
    errors = _monte_carlo_errors(init_fn, apply_fn, SEQ1, [4, 32], exact)
    (nngp4, ntk4), (nngp32, ntk32) = errors
    # 32 samples x 8 outputs: the NNGP's relative standard error near 9 %; the NTK concentrates, its finite-width
    # bias at 512 near 2 % (1.3 % at width 1,024 over 5 steps)
    assert nngp32 < 0.15 and ntk32 < 0.05, errors
    assert nngp32 < nngp4, errors


# -- refused constructions: each names the primitive and the user's line -------------------------------------

def _line_of(fn, text):
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if text in line)


def _refused(apply, params, match, line_text, priors=None):
    with pytest.raises(traced.TracedError, match=match) as err:
        traced.infinite_width(apply, params, priors=priors, example_input=X1)
    assert f"test_traced.py:{_line_of(apply, line_text)}" in str(err.value), str(err.value)
    return str(err.value)


W = {"W1": jnp.ones((4, 8)), "W2": jnp.ones((8, 1))}
PRIORS = {"W*": traced.Weight(1.0)}


def test_batch_statistics_are_refused():
    def apply(p, x):
        h = x @ p["W1"]
        h = h - jnp.mean(h, axis=0, keepdims=True)  # batch statistics
        return jax.nn.relu(h) @ p["W2"]

    msg = _refused(apply, W, "reduce_sum", "batch statistics", PRIORS)
    assert "batch" in msg


def test_a_nonlinearity_of_two_independent_activations_is_refused():
    def apply(p, x):
        a = jax.nn.relu(x @ p["W1"])
        b = x @ p["W3"]
        return jnp.tanh(a + b) @ p["W2"]  # two Gaussians inside one nonlinearity

    params = dict(W, W3=jnp.ones((4, 8)))
    _refused(apply, params, "tanh", "two Gaussians", PRIORS)


def test_a_maximum_over_the_width_is_refused():
    def apply(p, x):
        h = jax.nn.relu(x @ p["W1"])
        return jnp.max(h, axis=1, keepdims=True) * (h @ p["W2"])  # max over width

    _refused(apply, W, "reduce_max", "max over width", PRIORS)


def test_data_dependent_loops_are_refused():
    def apply(p, x):
        h = x @ p["W1"]
        h = jax.lax.while_loop(lambda c: jnp.sum(c) > 0.0, jnp.tanh, h)  # a data-dependent loop
        return h @ p["W2"]

    _refused(apply, W, "control flow", "a data-dependent loop", PRIORS)


def test_a_sum_over_the_width_not_divided_by_it_is_refused():
    def apply(p, x):
        h = jax.nn.relu(x @ p["W1"])
        s = jnp.sum(h * h, axis=1, keepdims=True)
        return (h / s) @ p["W2"]  # divides by a sum that grows with the width

    _refused(apply, W, "grows without bound", "grows with the width", PRIORS)


def test_parameters_without_a_prior_are_named():
    def apply(p, x):
        return x @ p["A"]

    with pytest.raises(ValueError, match=r"no prior for the parameters \['A'\]"):
        traced.infinite_width(apply, {"A": jnp.ones((4, 1))})
    with pytest.raises(ValueError, match="matches no parameter"):
        traced.infinite_width(apply, {"A": jnp.ones((4, 1))}, priors={"B": traced.Weight()})
    with pytest.raises(ValueError, match="W_std must be positive"):
        traced.Weight(-1.0)
    with pytest.raises(ValueError, match="parameterization"):
        traced.Bias(0.1, parameterization="mup")


def _refused_cnn(apply, params, match, line_text):
    with pytest.raises(traced.TracedError, match=match) as err:
        traced.infinite_width(apply, params, priors={"w*": traced.Weight(1.0)}, example_input=IM1)
    assert f"test_traced.py:{_line_of(apply, line_text)}" in str(err.value), str(err.value)


CONV = {"w1": jnp.ones((3, 3, 2, 4)), "w2": jnp.ones((4, 1))}


DN = ("NHWC", "HWIO", "NHWC")
_conv = jax.lax.conv_general_dilated


def test_max_pooling_is_refused():
    def apply(p, x):
        h = jax.nn.relu(_conv(x, p["w1"], (1, 1), "SAME", dimension_numbers=DN))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")  # max pool
        return jnp.mean(h, axis=(1, 2)) @ p["w2"]

    _refused_cnn(apply, CONV, "max or min pooling", "# max pool")


def test_dilated_grouped_and_uneven_convolutions_are_refused():
    def dilated(p, x):
        h = jax.nn.relu(_conv(x, p["w1"], (1, 1), "SAME", rhs_dilation=(2, 2), dimension_numbers=DN))  # atrous
        return jnp.mean(h, axis=(1, 2)) @ p["w2"]

    _refused_cnn(dilated, CONV, "dilated", "# atrous")

    def grouped(p, x):
        h = jax.nn.relu(_conv(x, p["w1"], (1, 1), "SAME", feature_group_count=2, dimension_numbers=DN))  # grouped
        return jnp.mean(h, axis=(1, 2)) @ p["w2"]

    _refused_cnn(grouped, {"w1": jnp.ones((3, 3, 1, 4)), "w2": jnp.ones((4, 1))}, "grouped", "# grouped")

    def uneven(p, x):
        h = jax.nn.relu(_conv(x, p["w1"], (1, 1), ((2, 0), (0, 2)), dimension_numbers=DN))  # uneven
        return jnp.mean(h, axis=(1, 2)) @ p["w2"]

    _refused_cnn(uneven, CONV, "neither 'VALID' nor 'SAME'", "# uneven")

    def partial_sum(p, x):
        h = jax.nn.relu(_conv(x, p["w1"], (1, 1), "SAME", dimension_numbers=DN))
        return jnp.mean(jnp.mean(h, axis=1), axis=1) @ p["w2"]  # one axis at a time

    _refused_cnn(partial_sum, CONV, "only a sum over every spatial axis", "# one axis at a time")


# -- functions without a closed form: the polar and split quadrature rules -------------------------------------


def _gauss2(f, c, v1, v2):
    """E[f(u) f(v)] for a centred Gaussian (u, v), by nested adaptive quadrature split where u = 0 and v = 0."""
    from scipy import integrate

    s1 = np.sqrt(v1)
    a, b = c / s1, np.sqrt(v2 - c * c / v1)
    pdf = lambda z: np.exp(-z * z / 2) / np.sqrt(2 * np.pi)  # noqa: E731

    def inner(z1):
        return integrate.quad(lambda z2: f(a * z1 + b * z2) * pdf(z2), -12, 12, points=[-a * z1 / b],
                              epsabs=1e-13, epsrel=1e-12, limit=200)[0]

    return integrate.quad(lambda z1: f(s1 * z1) * inner(z1) * pdf(z1), -12, 12, points=[0.0], epsabs=1e-13,
                          epsrel=1e-12, limit=200)[0]


def _gauss1(f, v):
    from scipy import integrate

    return integrate.quad(lambda z: f(np.sqrt(v) * z) * np.exp(-z * z / 2) / np.sqrt(2 * np.pi), -12, 12,
                          points=[0.0], epsabs=1e-14, epsrel=1e-13, limit=200)[0]


XQ = jnp.asarray([[1.6, -0.9, 2.1, 0.7], [-0.4, 1.8, 1.2, -2.3]])  # pre-activation variances 2.3 and 2.5


def test_a_kinked_function_without_a_closed_form_against_adaptive_quadrature():
    """``tanh(h) + 0.5 |h|`` (a kink at 0, its derivative a jump): NNGP, NTK and, after a layer normalisation, the
    centred kernel (which needs E[phi]) against nested adaptive quadrature. 32-node Gauss-Hermite was 1.9e-3 off on
    the NNGP; the polar rule split at 0 is within 1e-10 (the NNGP, the NTK) and 4e-8 (after the layer norm) at the
    default ``quadrature_degree``."""

    def phi(u):
        return np.tanh(u) + 0.5 * np.abs(u)

    def dphi(u):
        return 1 / np.cosh(u) ** 2 + 0.5 * np.sign(u)

    def apply(p, x, ln=False):
        h = x @ p["W1"]
        h = jnp.tanh(h) + 0.5 * jnp.abs(h)
        if ln:
            h = h - jnp.mean(h, -1, keepdims=True)
            h = h / jnp.sqrt(jnp.mean(h ** 2, -1, keepdims=True))
        return h @ p["W2"]

    x = np.asarray(XQ)
    cov = x @ x.T / 4
    pair = (cov[0, 1], cov[0, 0], cov[1, 1])
    nngp = {(0, 1): _gauss2(phi, *pair)}
    nngp.update({(i, i): _gauss1(lambda u: phi(u) ** 2, cov[i, i]) for i in range(2)})
    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS)
    k = kernel_fn(XQ, None, ("nngp", "ntk"))
    assert [how.split("(")[0] for _, how in kernel_fn.activations(XQ.shape)] == ["Quadrature"]
    np.testing.assert_allclose(k.nngp[0, 1], nngp[0, 1], rtol=1e-10)
    np.testing.assert_allclose(k.ntk[0, 1], nngp[0, 1] + _gauss2(dphi, *pair) * cov[0, 1], rtol=1e-10)
    m = [_gauss1(phi, cov[i, i]) for i in range(2)]
    var = [nngp[i, i] - m[i] ** 2 for i in range(2)]
    _, _, ln_fn = traced.infinite_width(functools.partial(apply, ln=True), W, priors=PRIORS)
    want = (nngp[0, 1] - m[0] * m[1]) / np.sqrt(var[0] * var[1])
    np.testing.assert_allclose(ln_fn(XQ, None, "nngp")[0, 1], want, rtol=1e-7)


def test_erf_plus_identity_by_quadrature_equals_its_closed_form():
    """``erf(h) + h`` is fused into one function without a family: its quadrature against the closed form of the
    sum's moments (arcsine kernel, Stein's lemma for the cross terms) at pre-activation variances near 3.5, where
    32-node Gauss-Hermite left 7e-4 on the NNGP and 6e-3 on the NTK."""

    def apply(p, x):
        h = x @ p["W1"]
        return (jax.lax.erf(h) + h) @ p["W2"]

    x = 1.25 * np.asarray(XQ)
    cov = x @ x.T / 4
    v = np.diag(cov)
    prod = (1 + 2 * v[:, None]) * (1 + 2 * v[None, :])
    d = 2 / np.sqrt(np.pi * (1 + 2 * v))  # E[erf'(u)]
    nngp = 2 / np.pi * np.arcsin(2 * cov / np.sqrt(prod)) + (d[:, None] + d[None, :]) * cov + cov
    dot = 4 / np.pi / np.sqrt(prod - 4 * cov ** 2) + d[:, None] + d[None, :] + 1
    _, _, kernel_fn = traced.infinite_width(apply, W, priors=PRIORS)
    k = kernel_fn(jnp.asarray(x), None, ("nngp", "ntk"))
    # the angular rule's error grows with the variance (erf(u)^2 along a ray turns within 1 / sd of u = 0): 5e-8
    np.testing.assert_allclose(k.nngp, nngp, rtol=1e-6)
    np.testing.assert_allclose(k.ntk, nngp + dot * cov, rtol=1e-6)
