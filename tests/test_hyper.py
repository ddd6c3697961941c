"""Hyperparameter fitting: the hand-written gradient, that fitting improves the marginal likelihood, errors."""

import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import distributions as dist

from smnngp import hyper, posterior

N = 30


def _data(seed=0, n=N):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = np.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.standard_t(2, size=n)
    return x, y


def _mlp_raw(model, activation, depth=2):
    """The MLP's loss function and its starting raw parameters, as `fit_hyperparameters` builds them."""
    start = hyper.default_init(model, activation)
    kernel = hyper.mlp_parametric_kernel(depth, activation, {k: v for k, v in start.items() if k in hyper._MLP_SCALES})
    raw = {"kernel": kernel.theta, **hyper._unconstrain({k: v for k, v in start.items() if k not in hyper._MLP_SCALES})}
    return kernel, raw


@pytest.mark.parametrize("model,activation", [("gaussian", "relu"), ("student_t", "erf"), ("burr12", "relu")])
def test_custom_gradient_matches_finite_differences(model, activation):
    x, y = _data()
    kernel, raw = _mlp_raw(model, activation)
    u = jax.random.uniform(jax.random.PRNGKey(0), (64,), dtype=jnp.float64, minval=1e-6, maxval=1 - 1e-6)
    loss = hyper._loss_fn(model, kernel.apply, 64)
    args = (jnp.asarray(x), jnp.asarray(y)[:, None], u)
    grads = jax.grad(loss)(raw, *args)
    flat, unravel = jax.flatten_util.ravel_pytree(raw)
    g_flat = jax.flatten_util.ravel_pytree(grads)[0]
    assert flat.shape[0] == len(hyper.default_init(model, activation))
    for i in range(flat.shape[0]):
        eps = 1e-5
        step = jnp.zeros_like(flat).at[i].set(eps)
        fd = (float(loss(unravel(flat + step), *args)) - float(loss(unravel(flat - step), *args))) / (2 * eps)
        assert float(g_flat[i]) == pytest.approx(fd, rel=1e-5, abs=1e-8), i


def test_loss_is_the_posterior_modules_marginal_likelihood():
    x, y = _data(1)
    kernel, raw = _mlp_raw("student_t", "relu")
    loss = float(hyper._loss_fn("student_t", kernel.apply, 1)(raw, jnp.asarray(x), jnp.asarray(y)[:, None], None))
    p = {**kernel.constrain(kernel.theta), **hyper._constrain({k: v for k, v in raw.items() if k != "kernel"})}
    p = {k: float(v) for k, v in p.items()}
    kfn = hyper.mlp_kernel(2, "relu", p["W_std"], p["b_std"])
    post = posterior.fit(kfn, x, y, hyper.prior_of("student_t", p), noise=p["noise"])
    assert loss == pytest.approx(-post.log_marginal_likelihood / N, rel=1e-7)


@pytest.mark.parametrize("model", ["gaussian", "student_t"])
def test_fitting_raises_the_marginal_likelihood_and_keeps_the_best_state(model):
    x, y = _data(2, 60)
    xv, yv = _data(3, 20)
    start = hyper.default_init(model)
    fit = hyper.fit_hyperparameters(x, y, xv, yv, model, depth=1, max_steps=120, eval_every=20)
    assert fit.history and fit.steps in [h["step"] for h in fit.history]
    best = min(h["val_nll"] for h in fit.history)
    assert fit.val_nll == pytest.approx(best)

    def lml(params):
        kfn = hyper.mlp_kernel(1, "relu", params["W_std"], params["b_std"], params.get("last_W_std", 1.0))
        return posterior.fit(kfn, x, y, hyper.prior_of(model, params), noise=params["noise"]).log_marginal_likelihood

    assert lml(fit.params) > lml(start)
    # the fitted result predicts through the same posterior object
    post = fit.posterior(x, y)
    kst, kss = fit.test_kernels(xv, x)
    nll = -float(np.mean(post.predict(k_test_train=kst, k_test_test=kss).log_prob(yv)))
    assert nll == pytest.approx(fit.val_nll, rel=1e-6)


def test_burr_given_kernel_fits_a_scaled_burr_prior():
    x, y = _data(4, 60)
    xv, yv = _data(5, 20)
    base = hyper.fit_hyperparameters(x, y, xv, yv, "student_t", depth=1, max_steps=40, eval_every=20)
    burr = hyper.fit_burr_given_kernel(base, x, y, xv, yv, steps=200, eval_every=50, num_val_samples=4000)
    assert burr.model == "burr12" and {"c", "k", "scale"} <= set(burr.params)
    assert all(burr.params[k] == base.params[k] for k in ("W_std", "b_std", "noise"))
    assert isinstance(burr.prior, dist.TransformedDistribution)
    assert math.isfinite(burr.val_nll) and burr.history[-1]["loss"] <= burr.history[0]["loss"] + 1e-9


def test_select_architecture_returns_the_best_candidate():
    x, y = _data(6, 40)
    xv, yv = _data(7, 15)
    best, fits = hyper.select_architecture(x, y, xv, yv, "gaussian", depths=(1, 2), activations=("relu", "erf"),
                                           max_steps=20, eval_every=10)
    assert len(fits) == 4 and best.val_nll == min(f.val_nll for f in fits)


def test_errors_name_the_problem():
    x, y = _data()
    with pytest.raises(ValueError, match="model must be one of"):
        hyper.fit_hyperparameters(x, y, x, y, "cauchy")
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        hyper.fit_hyperparameters(x, y, x, y, "gaussian", init={"a": 1.0})
    with pytest.raises(ValueError, match="row counts differ"):
        hyper.fit_hyperparameters(x, y[:-1], x, y, "gaussian")
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="y_train has 1 non-finite"):
        hyper.fit_hyperparameters(x, bad, x, y, "gaussian")
    with pytest.raises(ValueError, match="activation must be one of"):
        hyper.mlp_kernel(2, "tanh", 1.0, 0.1)
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        hyper.mlp_kernel(0, "relu", 1.0, 0.1)
