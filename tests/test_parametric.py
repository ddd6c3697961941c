"""Kernels whose hyperparameters are a pytree: stax layers with traced scales, `stax.parametric_kernel`,
`hyper.fit_kernel` on architectures other than the MLP, and the model names of `smnngp.models`.

Gradients are checked against central finite differences in float64 (the references share no code with
autodiff); fitting is checked by the marginal likelihood it reaches, computed by `smnngp.posterior`.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import hyper, models, posterior, priors, stax

# ------------------------------------------------------------------------------------------------
# Architectures over a pytree of scales


def mlp_arch(p):
    return stax.serial(stax.Dense(3, W_std=p["W1"], b_std=p["b1"]), stax.ABRelu(p["slope_neg"], p["slope_pos"]),
                       stax.Dense(3, W_std=p["W2"], b_std=p["b2"]), stax.Erf(b=p["erf_b"]),
                       stax.Dense(1, W_std=p["W_out"]))


MLP_INIT = {"W1": 1.3, "b1": 0.2, "slope_neg": 0.3, "slope_pos": 1.1, "W2": 1.6, "b2": 0.15, "erf_b": 0.8,
            "W_out": 1.2}


def cnn_arch(p):
    """Convolutions with 'SAME' and 'VALID' padding, average pooling and a global average: all position pairs."""
    return stax.serial(stax.Conv(2, (2, 2), padding="SAME", W_std=p["conv"][0], b_std=p["bias"]),
                       stax.LeakyRelu(p["leak"]),
                       stax.AvgPool((2, 2), strides=(1, 1), padding="SAME"),
                       stax.Conv(2, (2, 2), padding="VALID", W_std=p["conv"][1], b_std=p["bias"]),
                       stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1, W_std=p["out"]))


CNN_INIT = {"conv": [1.4, 1.2], "bias": 0.1, "leak": 0.2, "out": 0.9}


def residual_arch(p):
    """Dense -> [ReLU -> Dense | identity] summed -> Sin -> Dense: the FanOut / parallel / FanInSum residual block."""
    block = stax.serial(stax.FanOut(2),
                        stax.parallel(stax.serial(stax.Relu(), stax.Dense(4, W_std=p["W_res"], b_std=p["b_res"])),
                                      stax.Identity()),
                        stax.FanInSum())
    return stax.serial(stax.Dense(4, W_std=p["W_in"], b_std=p["b_in"]), block,
                       stax.Sin(a=p["sin_a"], b=1.0, c=p["sin_c"]), stax.Dense(1, W_std=p["W_out"]))


RES_INIT = {"W_in": 1.1, "b_in": 0.3, "W_res": 0.7, "b_res": 0.05, "sin_a": 1.3, "sin_c": 0.4, "W_out": 1.0}

CASES = {
    "mlp": (mlp_arch, MLP_INIT, (5, 3)),
    "cnn": (cnn_arch, CNN_INIT, (4, 4, 3, 2)),
    "residual": (residual_arch, RES_INIT, (5, 3)),
}


def _inputs(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_gradient_matches_finite_differences(case):
    arch, init, shape = CASES[case]
    kernel = stax.parametric_kernel(arch, init)
    x1, x2 = _inputs(shape, 0), _inputs((3,) + shape[1:], 1)
    w = jnp.asarray(np.random.default_rng(2).normal(size=(shape[0], shape[0])))
    w12 = jnp.asarray(np.random.default_rng(3).normal(size=(shape[0], 3)))

    def scalar(theta):  # a random functional of k(x1, x1) and k(x1, x2): every entry counts
        return jnp.sum(w * kernel.apply(theta, x1)) + jnp.sum(w12 * kernel.apply(theta, x1, x2))

    grad = jax.jit(jax.grad(scalar))(kernel.theta)
    flat, unravel = jax.flatten_util.ravel_pytree(kernel.theta)
    g_flat = jax.flatten_util.ravel_pytree(grad)[0]
    value = jax.jit(scalar)
    eps = 1e-6
    for i in range(flat.shape[0]):
        e = jnp.zeros_like(flat).at[i].set(eps)
        fd = (float(value(unravel(flat + e))) - float(value(unravel(flat - e)))) / (2 * eps)
        assert float(g_flat[i]) == pytest.approx(fd, rel=1e-6, abs=1e-8), (case, i)
    assert np.all(np.abs(np.asarray(g_flat)) > 1e-8), "every scale must move the kernel"


@pytest.mark.parametrize("case", sorted(CASES))
def test_traced_scales_give_the_concrete_kernel(case):
    arch, init, shape = CASES[case]
    kernel = stax.parametric_kernel(arch, init)
    x = _inputs(shape)
    traced = jax.jit(kernel.apply)(kernel.theta, x)
    concrete = jax.jit(lambda a: arch(init)[2](a, None, "nngp"))(x)
    np.testing.assert_allclose(np.asarray(traced), np.asarray(concrete), rtol=1e-12, atol=1e-14)
    values = kernel.constrain(kernel.theta)
    np.testing.assert_allclose(np.asarray(jax.flatten_util.ravel_pytree(values)[0]),
                               np.asarray(jax.flatten_util.ravel_pytree(init)[0]), rtol=1e-12)


def test_ntk_is_differentiable_in_the_scales_too():
    x = _inputs((4, 3))

    def ntk_sum(p):
        return jnp.sum(mlp_arch(p)[2](x, None, "ntk"))

    p0 = {k: jnp.asarray(v) for k, v in MLP_INIT.items()}
    grad = jax.jit(jax.grad(ntk_sum))(p0)
    for name in ("W1", "slope_neg", "erf_b"):
        e = 1e-6
        fd = (float(ntk_sum({**p0, name: p0[name] + e})) - float(ntk_sum({**p0, name: p0[name] - e}))) / (2 * e)
        assert float(grad[name]) == pytest.approx(fd, rel=1e-6), name


def test_scales_vmap_over_a_batch_of_hyperparameters():
    kernel = stax.parametric_kernel(residual_arch, RES_INIT)
    x = _inputs((4, 3))
    thetas = jax.tree_util.tree_map(lambda t: t + jnp.linspace(-0.2, 0.2, 3), kernel.theta)
    batched = jax.vmap(kernel.apply, in_axes=(0, None))(thetas, x)
    for i in range(3):
        one = kernel.apply(jax.tree_util.tree_map(lambda t, i=i: t[i], thetas), x)
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(one), rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# Argument checks: concrete bad values are named, traced values are deferred to the caller


def test_concrete_bad_scales_name_the_layer_and_argument():
    with pytest.raises(TypeError, match="ABRelu: a must be a number"):
        stax.ABRelu("steep", 1.0)
    with pytest.raises(ValueError, match="Erf: b must be finite"):
        stax.Erf(b=math.nan)
    with pytest.raises(ValueError, match="LeakyRelu: alpha must be finite"):
        stax.LeakyRelu(math.inf)
    with pytest.raises(ValueError, match="Sin: c must be finite"):
        stax.Sin(c=-math.inf)
    with pytest.raises(TypeError, match="Gaussian: a must be a number"):
        stax.Gaussian(a=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"Conv\(1, \(2, 2\)\): W_std must be positive"):
        stax.Conv(1, (2, 2), W_std=0.0)
    with pytest.raises(ValueError, match=r"Dense\(2\): b_std must be non-negative"):
        stax.Dense(2, b_std=-0.1)
    # traced: built without checks, and named 'traced'
    names = []
    jax.jit(lambda a: names.append(stax.ABRelu(a, 1.0).name) or a)(0.5)
    assert names == ["ABRelu(traced, 1.0)"]
    with pytest.raises(ValueError, match="Erf: b must be a scalar"):
        jax.jit(lambda b: stax.Erf(b=b)[2](jnp.ones((2, 3)), None, "nngp"))(jnp.ones(2))


def test_parametric_kernel_errors():
    with pytest.raises(TypeError, match="arch must be callable"):
        stax.parametric_kernel({"W": 1.0}, {"W": 1.0})
    with pytest.raises(ValueError, match=r"init\['b1'\] = -0.1 must be finite and above its floor 0.0"):
        stax.parametric_kernel(mlp_arch, {**MLP_INIT, "b1": -0.1})
    with pytest.raises(ValueError, match=r"init\['W1'\] = 0.001 must be finite and above its floor 0.01"):
        stax.parametric_kernel(mlp_arch, {**MLP_INIT, "W1": 1e-3}, floor=1e-2)
    with pytest.raises(ValueError, match=r"init\['conv'\] must be a scalar"):
        stax.parametric_kernel(cnn_arch, {**CNN_INIT, "conv": np.ones(2)})
    with pytest.raises(ValueError, match="floor must be a number or a pytree like init"):
        stax.parametric_kernel(mlp_arch, MLP_INIT, floor={"W1": 0.0})
    with pytest.raises(KeyError):
        stax.parametric_kernel(mlp_arch, {"W1": 1.0})  # the architecture's own error, at once
    # floors: value = floor + exp(theta)
    k = stax.parametric_kernel(mlp_arch, MLP_INIT, floor=dict.fromkeys(MLP_INIT, 0.05))
    assert float(k.constrain(jax.tree_util.tree_map(lambda t: t - 50.0, k.theta))["W1"]) == pytest.approx(0.05)
    # one apply per architecture and structure: compilations are shared
    assert stax.parametric_kernel(mlp_arch, {**MLP_INIT, "W1": 2.0}).apply is stax.parametric_kernel(
        mlp_arch, MLP_INIT).apply


# ------------------------------------------------------------------------------------------------
# Fitting architectures other than the MLP


def _digits(n_train, n_val):
    """scikit-learn's digits averaged over 2 x 2 blocks (4 x 4 images) with one-hot targets, standardised.

    4 x 4 rather than 8 x 8: pooling needs every pair of positions, (N, N, H, H, W, W) entries per kernel
    array, which at 8 x 8 and N = 200 is 1.3 GB per array, times the hyperparameters' tangents.
    """
    from sklearn.datasets import load_digits

    x, labels = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(labels))[: n_train + n_val]
    img = x[idx].reshape(-1, 4, 2, 4, 2).mean(axis=(2, 4))[..., None] / 16.0
    img = (img - img.mean()) / img.std()
    y = np.eye(10)[labels[idx]]
    y = (y - y[:n_train].mean(0)) / y[:n_train].std(0)
    return img[:n_train], y[:n_train], img[n_train:], y[n_train:]


def digits_cnn(p):
    return stax.serial(stax.Conv(1, (2, 2), padding="SAME", W_std=p["W_conv"], b_std=p["b_std"]), stax.Relu(),
                       stax.AvgPool((2, 2), strides=(2, 2)), stax.Flatten(),
                       stax.Dense(1, W_std=1.0, b_std=p["b_std"]))


def test_fitting_a_cnn_kernel_on_digits_raises_its_marginal_likelihood():
    x, y, xv, yv = _digits(120, 60)
    kernel = stax.parametric_kernel(digits_cnn, {"W_conv": 1.0, "b_std": 0.5})
    fit = hyper.fit_kernel(kernel, x, y, xv, yv, "student_t", max_steps=12, eval_every=4, learning_rate=0.1)
    assert fit.depth is None and set(fit.params) == {"W_conv", "b_std", "noise", "a", "b"}

    def lml(k, p):
        kt = k.apply(k.theta, jnp.asarray(x))
        return posterior.fit_from_kernels(kt, y, models.prior("student_t", p), noise=p["noise"]).log_marginal_likelihood

    start = {"noise": 0.1, **models.PRIOR_DEFAULTS}
    assert lml(fit.kernel, fit.params) > lml(kernel, start) + 1.0
    # the result predicts through its own kernel, and its validation NLL is the posterior's
    kst, kss = fit.test_kernels(xv, x)
    nll = -float(np.mean(fit.posterior(x, y).log_predictive_density(yv, k_test_train=kst, k_test_test=kss))) / 10
    assert nll == pytest.approx(fit.val_nll, rel=1e-6)
    assert fit.kernel_fn is fit.kernel


def test_fit_kernel_on_a_hand_written_kernel_and_its_errors():
    from smnngp.kernels import rbf

    rng = np.random.default_rng(5)
    x, xv = rng.normal(size=(40, 2)), rng.normal(size=(15, 2))
    f = lambda a: np.sin(2 * a[:, 0]) + 0.5 * a[:, 1]  # noqa: E731
    y, yv = f(x) + 0.1 * rng.normal(size=40), f(xv) + 0.1 * rng.normal(size=15)
    fit = hyper.fit_kernel(rbf([3.0, 3.0], 1.0), x, y, xv, yv, "gaussian", max_steps=40, eval_every=10)
    ls = fit.params["lengthscale"]  # ARD: one per feature, the wiggly sin(2 x_0) gets the short one
    assert len(ls) == 2 and ls[0] < 2.0 and ls[0] < ls[1]
    assert fit.val_nll <= fit.history[0]["val_nll"]
    with pytest.raises(TypeError, match="ParametricKernel"):
        hyper.fit_kernel(lambda a, b=None: a @ a.T, x, y, xv, yv)
    clash = stax.parametric_kernel(lambda p: stax.serial(stax.Dense(1, W_std=p["a"])), {"a": 1.0})
    with pytest.raises(ValueError, match=r"hyperparameters \['a'\] clash"):
        hyper.fit_kernel(clash, x, y, xv, yv, "student_t")
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        hyper.fit_kernel(rbf(), x, y, xv, yv, "student_t", init={"W_std": 1.0})
    with pytest.raises(ValueError, match="same per-point shape"):
        hyper.fit_kernel(rbf(), x, y, xv[:, :1], yv)


# ------------------------------------------------------------------------------------------------
# The model names


def test_model_names_map_to_their_priors_and_defaults():
    assert models.MODELS == ("gaussian", "student_t", "burr12")
    assert priors.is_delta(models.prior("gaussian")) and float(models.prior("gaussian").v) == 1.0
    ig = models.prior("student_t")
    assert priors.is_inverse_gamma(ig) and [float(v) for v in priors.inverse_gamma_params(ig)] == [2.0, 2.0]
    burr = models.prior("burr12", {"c": 3.0})
    assert isinstance(burr, priors.BurrXII) and (float(burr.c), float(burr.k)) == (3.0, 1.0)
    scaled = models.prior("burr12", {"scale": 2.0})
    assert float(scaled.log_prob(2.0)) == pytest.approx(float(priors.BurrXII(2.0, 1.0).log_prob(1.0)) - math.log(2.0))
    with pytest.raises(ValueError, match="model must be one of"):
        models.prior("cauchy")
    assert hyper.default_init("student_t", "erf") == {"W_std": 1.5, "b_std": 0.1, "noise": 0.1, "a": 2.0, "b": 2.0}
    assert hyper.default_init("burr12") == {"W_std": 1.4, "b_std": 0.1, "noise": 0.1, "c": 2.0, "k": 1.0,
                                            "last_W_std": 1.0}


@pytest.mark.parametrize("readout_bias", [True, False])
def test_one_mlp_builder_matches_the_layers_written_out(readout_bias):
    x = _inputs((6, 3))
    b_last = 0.2 if readout_bias else None
    by_hand = stax.serial(stax.Dense(1, W_std=1.3, b_std=0.2), stax.Erf(), stax.Dense(1, W_std=1.3, b_std=0.2),
                          stax.Erf(), stax.Dense(1, W_std=0.7, b_std=b_last))[2]
    ours = models.mlp(2, "erf", 1.3, 0.2, 0.7, readout_bias=readout_bias)[2]
    np.testing.assert_array_equal(np.asarray(ours(x, None, "nngp")), np.asarray(by_hand(x, None, "nngp")))
    with pytest.raises(ValueError, match="activation must be one of"):
        models.mlp(2, "tanh")
    import pickle

    arch = models.mlp_arch(2, "erf", readout_bias=readout_bias)
    assert pickle.loads(pickle.dumps(arch)) is arch
