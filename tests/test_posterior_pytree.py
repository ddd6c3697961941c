"""Posteriors as immutable pytrees: one interface for the three kinds, through `jax.jit` and `jax.vmap`.

References are the same posteriors used eagerly (the eager paths are checked against independent
implementations in test_posterior.py); here the point is that transformations give the same numbers.
"""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest

from smnngp import posterior, priors, stax
from smnngp.posterior import GaussianPosterior, ImportancePosterior, Posterior, StudentTPosterior

KFN = stax.serial(stax.Dense(1, W_std=1.5, b_std=0.1), stax.Erf(), stax.Dense(1))[2]
N, L, NOISE = 15, 4, 0.05

CASES = {  # name: (prior, noise_model, class)
    "gaussian": (priors.Delta(0.7), "scaled", GaussianPosterior),
    "student_t": (priors.InverseGamma(2.0, 1.5), "scaled", StudentTPosterior),
    "importance": (priors.BurrXII(2.0, 1.0), "scaled", ImportancePosterior),
    "gaussian_unscaled": (priors.Delta(0.7), "unscaled", GaussianPosterior),
    "importance_unscaled": (priors.InverseGamma(2.0, 1.5), "unscaled", ImportancePosterior),
}


def _data(seed=0, n_out=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N + L, 3))
    f = np.sin(x @ np.array([1.0, -0.5, 0.3]))
    y = f + 0.1 * rng.normal(size=N + L)
    if n_out:
        y = np.stack([y, -y + 0.1 * rng.normal(size=N + L)], -1)
    return jnp.asarray(x[:N]), jnp.asarray(x[N:]), jnp.asarray(y[:N]), jnp.asarray(y[N:])


def _fit(case, y=None, seed=0):
    prior, noise_model, _ = CASES[case]
    x, xt, y0, _ = _data(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", posterior.SmallESSWarning)
        return posterior.fit(KFN, x, y0 if y is None else y, prior, noise=NOISE, noise_model=noise_model,
                             num_samples=3000, key=jax.random.PRNGKey(1))


@pytest.fixture(scope="module")
def fitted():
    return {case: _fit(case) for case in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_interface_for_every_kind(fitted, case):
    post = fitted[case]
    cls = CASES[case][2]
    assert type(post) is cls and isinstance(post, Posterior) and post.kind == cls.kind
    _, xt, _, yt = _data()
    pred = post.predict(xt)
    assert isinstance(pred, dist.Distribution) and pred.batch_shape == (L,)
    assert isinstance(post.log_marginal_likelihood, float) and isinstance(post.jitter, float)
    assert post.sample_f(jax.random.PRNGKey(0), xt, 3).shape == (3, L)
    assert post.log_predictive_density(yt, xt).shape == (L,)
    assert (post.ess is None) == (cls is not ImportancePosterior)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_posterior_is_an_argument_and_a_result_of_jit(fitted, case):
    post = fitted[case]
    _, xt, _, yt = _data()
    same = jax.jit(lambda p: p)(post)
    assert type(same) is type(post) and same.kernel is post.kernel and same.noise_model == post.noise_model
    assert same.log_marginal_likelihood == pytest.approx(post.log_marginal_likelihood, rel=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(same), jax.tree_util.tree_leaves(post), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    eager = post.predict(xt)
    mean, var, lpd = jax.jit(lambda p, x, y: (p.predict(x).mean, p.predict(x).variance,
                                               p.log_predictive_density(y, x)))(post, xt, yt)
    np.testing.assert_allclose(mean, eager.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, eager.variance, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lpd, post.log_predictive_density(yt, xt), rtol=1e-10, atol=1e-12)
    # the predictive itself is returned from jit (GaussianMixture is a pytree too)
    pred = jax.jit(lambda p, x: p.predict(x))(post, xt)
    np.testing.assert_allclose(pred.log_prob(yt), eager.log_prob(yt), rtol=1e-10, atol=1e-12)
    # joint draws under jit: the same keys give the same draws, up to the Cholesky's fixed jitter
    key = jax.random.PRNGKey(3)
    draws = jax.jit(lambda p, x: p.sample_f(key, x, 4))(post, xt)
    np.testing.assert_allclose(draws, post.sample_f(key, xt, 4), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_vmap_over_test_inputs(fitted, case):
    post = fitted[case]
    _, xt, _, _ = _data()
    pointwise = jax.vmap(lambda x: post.predict(x[None]).mean[0])(xt)
    np.testing.assert_allclose(pointwise, post.predict(xt).mean, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["gaussian", "student_t", "gaussian_unscaled"])
def test_vmap_over_a_batch_of_posteriors(case):
    x, xt, y, _ = _data()
    ys = [y, 2.0 * y - 0.3, jnp.cos(3 * y)]
    posts = [_fit(case, yi) for yi in ys]
    batch = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *posts)
    assert type(batch) is type(posts[0])
    means = jax.vmap(lambda p: p.predict(xt).mean)(batch)
    draws = jax.vmap(lambda p: p.sample_f(jax.random.PRNGKey(0), xt, 2))(batch)
    np.testing.assert_allclose(np.asarray(batch.log_marginal_likelihood), [p.log_marginal_likelihood for p in posts],
                               rtol=1e-12)
    for i, p in enumerate(posts):
        np.testing.assert_allclose(means[i], p.predict(xt).mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(draws[i], p.sample_f(jax.random.PRNGKey(0), xt, 2), rtol=1e-5, atol=1e-6)


def test_posteriors_are_immutable_and_replace_returns_a_copy(fitted):
    post = fitted["student_t"]
    for name, value in (("noise", 1.0), ("kind", "gaussian"), ("log_marginal_likelihood", 0.0), ("x_train", None)):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(post, name, value)
    with pytest.raises(AttributeError, match="immutable"):
        del post.prior
    noisier = post.replace(noise=0.2)
    assert noisier.noise == 0.2 and post.noise == NOISE and noisier.kernel is post.kernel
    _, xt, _, _ = _data()
    assert float(jnp.sum(noisier.predict(xt).variance)) > float(jnp.sum(post.predict(xt).variance))
    with pytest.raises(TypeError, match="unknown fields"):
        post.replace(kind="gaussian")
    with pytest.raises(TypeError, match="Posterior is the interface"):
        Posterior(prior=None, noise=0.0, noise_model="scaled", n_train=1, n_out=1, squeeze=True,
                  log_marginal_likelihood=0.0, state={})


def test_the_predictive_pieces_are_reused_and_follow_the_inputs(fitted):
    post = fitted["student_t"]
    _, xt, _, yt = _data()
    first = post.predict(xt)
    assert posterior._PIECES[post][1][0] is post._marginal_pieces(xt, None, None)[0]  # the cached pieces
    other = post.predict(xt[:2] + 1.0)  # new inputs replace them
    assert other.batch_shape == (2,) and posterior._PIECES[post][0].shape == (2, 3)
    np.testing.assert_allclose(post.predict(xt).mean, first.mean, rtol=1e-14)


def test_multi_output_posterior_through_jit():
    x, xt, _, _ = _data()
    _, _, y2, _ = _data(n_out=2)
    post = posterior.fit(KFN, x, y2, priors.InverseGamma(3.0, 2.0), noise=NOISE)
    mean = jax.jit(lambda p: p.predict(xt).mean)(post)
    assert mean.shape == (L, 2)
    np.testing.assert_allclose(mean, post.predict(xt).mean, rtol=1e-10)
    cov = post.predict_covariance(xt)
    assert cov.shape == (L, L, 2)
    np.testing.assert_allclose(np.diagonal(cov[..., 0]), post.predict(xt).variance[:, 0], rtol=1e-8)


def test_a_posterior_from_kernel_matrices_pickles():
    x, xt, y, yt = _data()
    k = np.asarray(KFN(x, None, "nngp"))
    kst, kss = np.asarray(KFN(xt, x, "nngp")), np.asarray(KFN(xt, None, "nngp"))
    post = posterior.fit_from_kernels(k, y, priors.InverseGamma(2.0, 1.5), noise=NOISE)
    loaded = pickle.loads(pickle.dumps(post))
    assert type(loaded) is StudentTPosterior and loaded.df == post.df
    np.testing.assert_array_equal(loaded.predict(k_test_train=kst, k_test_test=kss).mean,
                                  post.predict(k_test_train=kst, k_test_test=kss).mean)
