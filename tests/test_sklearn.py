"""The scikit-learn estimator `smnngp.sklearn.ScaleMixtureRegressor`: API conformance and agreement with the core."""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from smnngp import posterior, priors, stax
from smnngp.sklearn import ScaleMixtureRegressor, _jax_key

# jitted so that each data shape compiles once (the tests share N=24 training and 5 test points)
STAX_KERNEL_FN = jax.jit(stax.serial(stax.Dense(1, W_std=1.5, b_std=0.05), stax.Erf(), stax.Dense(1, W_std=1.0))[2],
                         static_argnames="get")
KERNEL = jax.jit(lambda x1, x2=None: STAX_KERNEL_FN(x1, x2, "nngp"))  # a plain k(x1, x2)


@pytest.fixture(autouse=True)
def _quiet_ess():
    # check data sets are tiny or odd; a small ESS there is expected and reported by the core, not a failure here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", posterior.SmallESSWarning)
        yield


@parametrize_with_checks([
    ScaleMixtureRegressor(),
    ScaleMixtureRegressor(prior="gaussian"),
    ScaleMixtureRegressor(prior="burr12", num_samples=500),
])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def _data(n=24, d=3, seed=0, targets=None):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = np.sin(X @ np.linspace(1.0, -0.5, d))
    y = 3.0 + 2.0 * f + 0.1 * rng.normal(size=n)
    if targets:
        y = np.stack([y * (1 + 0.5 * t) - t for t in range(targets)], axis=1)
    return X, y


@pytest.mark.parametrize("prior", ["gaussian", "student_t", "burr12"])
@pytest.mark.parametrize("noise_model", ["scaled", "unscaled"])
def test_matches_posterior_fit(prior, noise_model):
    X, y = _data()
    Xt = X[:5] + 0.3
    est = ScaleMixtureRegressor(KERNEL, prior, noise=0.05, noise_model=noise_model, normalize_y=False,
                                num_samples=2000, random_state=3).fit(X, y)
    prior_obj = {"gaussian": priors.Delta(1.0), "student_t": priors.InverseGamma(2.0, 2.0),
                 "burr12": priors.BurrXII(2.0, 1.0)}[prior]
    post = posterior.fit(KERNEL, X, y, prior_obj, noise=0.05, noise_model=noise_model, num_samples=2000,
                         key=_jax_key(3))
    mean, std = post.predict_mean_std(Xt)
    m, s = est.predict(Xt, return_std=True)
    np.testing.assert_allclose(m, mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s, std, rtol=1e-10)
    assert est.log_marginal_likelihood_ == pytest.approx(post.log_marginal_likelihood, rel=1e-10)
    assert est.posterior_.kind == post.kind
    # the joint covariance (computed in the estimator) has the marginal variances on its diagonal
    _, cov = est.predict(Xt, return_cov=True)
    np.testing.assert_allclose(np.diag(cov), s**2, rtol=1e-8)
    np.testing.assert_allclose(cov, cov.T, atol=1e-12)
    assert np.linalg.eigvalsh(cov).min() > 0


def test_gaussian_density_and_interval_closed_form():
    X, y = _data()
    Xt, yt = _data(n=5, seed=1)
    est = ScaleMixtureRegressor(STAX_KERNEL_FN, "gaussian", noise=0.1).fit(X, y)  # a stax kernel_fn(x1, x2, get)
    m, s = est.predict(Xt, return_std=True)
    assert est.log_predictive_density(Xt, yt) == pytest.approx(np.mean(stats.norm.logpdf(yt, m, s)), rel=1e-9)
    lo, hi = est.predict_interval(Xt, level=0.9)
    np.testing.assert_allclose(lo, m - stats.norm.ppf(0.95) * s, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(hi, m + stats.norm.ppf(0.95) * s, rtol=1e-6, atol=1e-8)
    # Student-t process: a scaled t with df = 2a + N
    est_t = ScaleMixtureRegressor(KERNEL, "student_t", a=1.5, b=0.7, noise=0.1).fit(X, y)
    m, s = est_t.predict(Xt, return_std=True)
    df = 2 * 1.5 + len(y)
    assert est_t.posterior_.df == df
    scale = s * np.sqrt((df - 2) / df)
    assert est_t.log_predictive_density(Xt, yt) == pytest.approx(np.mean(stats.t.logpdf(yt, df, m, scale)), rel=1e-9)
    lo, hi = est_t.predict_interval(Xt, level=0.8)
    np.testing.assert_allclose(hi, m + stats.t.ppf(0.9, df) * scale, rtol=1e-6)


def test_infinite_variance_student_t():
    # one observation and a = 0.4: df = 2a + N = 1.8, so the predictive has no variance
    X, y = _data()
    est = ScaleMixtureRegressor(KERNEL, a=0.4, noise=0.1).fit(X[:1], y[:1])
    m, s = est.predict(X[:5], return_std=True)
    assert np.all(np.isfinite(m)) and np.all(np.isinf(s))
    assert np.all(np.isinf(est.predict(X[:5], return_cov=True)[1]))
    lo, hi = est.predict_interval(X[:5])
    assert np.all(np.isfinite(lo) & (lo < m) & (m < hi))


@pytest.mark.parametrize("prior", ["student_t", "burr12"])
def test_normalize_y_matches_manual_standardisation(prior):
    X, y = _data()
    Xt, yt = _data(n=5, seed=2)
    mu, sd = y.mean(), y.std()
    kw = dict(kernel=KERNEL, prior=prior, noise=0.05, num_samples=2000, random_state=0)
    auto = ScaleMixtureRegressor(normalize_y=True, **kw).fit(X, y)
    manual = ScaleMixtureRegressor(normalize_y=False, **kw).fit(X, (y - mu) / sd)
    m, s = auto.predict(Xt, return_std=True)
    m0, s0 = manual.predict(Xt, return_std=True)
    np.testing.assert_allclose(m, m0 * sd + mu, rtol=1e-10)
    np.testing.assert_allclose(s, s0 * sd, rtol=1e-10)
    # densities carry the Jacobian of the standardisation
    lpd0 = manual.log_predictive_density(Xt, (yt - mu) / sd)
    assert auto.log_predictive_density(Xt, yt) == pytest.approx(lpd0 - np.log(sd), rel=1e-10)
    assert auto.log_marginal_likelihood_ == pytest.approx(manual.log_marginal_likelihood_ - len(y) * np.log(sd))
    # hence predictions are equivariant under affine maps of y (the prior acts on standardised targets)
    flipped = ScaleMixtureRegressor(normalize_y=True, **kw).fit(X, -4.0 * y + 7.0)
    m2, s2 = flipped.predict(Xt, return_std=True)
    np.testing.assert_allclose(m2, -4.0 * m + 7.0, rtol=1e-9)
    np.testing.assert_allclose(s2, 4.0 * s, rtol=1e-9)
    scaled = ScaleMixtureRegressor(normalize_y=True, **kw).fit(X, 4.0 * y + 7.0)
    draws = scaled.sample_y(Xt, 3, random_state=5)
    np.testing.assert_allclose(draws, 4.0 * auto.sample_y(Xt, 3, random_state=5) + 7.0, rtol=1e-9)


def test_sample_y_shapes():
    X, y = _data()
    Xt = X[:5]
    est = ScaleMixtureRegressor(KERNEL).fit(X, y)
    assert est.sample_y(Xt).shape == (5, 1)
    assert est.sample_y(Xt, n_samples=3).shape == (5, 3)
    np.testing.assert_array_equal(est.sample_y(Xt, 3, random_state=1), est.sample_y(Xt, 3, random_state=1))
    X2, y2 = _data(targets=2)
    est2 = ScaleMixtureRegressor(KERNEL).fit(X2, y2)
    assert est2.predict(Xt).shape == (5, 2)
    assert est2.predict(Xt, return_std=True)[1].shape == (5, 2)
    assert est2.predict(Xt, return_cov=True)[1].shape == (5, 5, 2)
    assert est2.sample_y(Xt, n_samples=3).shape == (5, 2, 3)
    unscaled = ScaleMixtureRegressor(KERNEL, "burr12", noise_model="unscaled", num_samples=500).fit(X2, y2)
    assert unscaled.sample_y(Xt, n_samples=3).shape == (5, 2, 3)
    # a single-column 2-D target keeps its axis
    est1 = ScaleMixtureRegressor(KERNEL).fit(X, y[:, None])
    assert est1.predict(Xt).shape == (5, 1)
    assert est1.sample_y(Xt, n_samples=3).shape == (5, 1, 3)


def test_sample_y_moments_match_predict():
    X, y = _data(targets=2)
    Xt = X[:5] + 0.5
    est = ScaleMixtureRegressor(KERNEL, "student_t", a=3.0, noise=0.05).fit(X, y)
    n = 20_000
    draws = est.sample_y(Xt, n, random_state=1)  # (5, 2, n)
    m, s = est.predict(Xt, return_std=True)
    assert np.all(np.abs(draws.mean(-1) - m) < 5 * s / np.sqrt(n))
    # the sample std of a t converges more slowly than sqrt(2n) (heavier tails); allow 5%
    np.testing.assert_allclose(draws.std(-1), s, rtol=0.05)
    _, cov = est.predict(Xt, return_cov=True)
    for c in range(2):
        np.testing.assert_allclose(np.cov(draws[:, c, :]), cov[:, :, c], atol=0.1 * np.max(np.diag(cov[:, :, c])))


def test_unscaled_mixture_covariance_brute_force():
    """Law of total covariance of the importance-sampling mixture, against one dense solve per sigma^2."""
    X, y = _data(targets=2)
    Xt = X[:5] + 0.5
    noise = 0.05
    est = ScaleMixtureRegressor(KERNEL, "burr12", noise=noise, noise_model="unscaled", normalize_y=False,
                                num_samples=400, random_state=0).fit(X, y)
    m, cov = est.predict(Xt, return_cov=True)
    beta, log_w = (np.asarray(a) for a in est.posterior_.scale_posterior_samples())
    w = np.exp(log_w)
    K, Ks, Kss = (np.asarray(KERNEL(a, b)) for a, b in [(X, None), (Xt, X), (Xt, None)])
    means, covs = [], []
    for bs in beta:
        A = bs * K + noise * np.eye(len(X))
        means.append(bs * Ks @ np.linalg.solve(A, y))
        covs.append(bs * Kss - bs**2 * Ks @ np.linalg.solve(A, Ks.T) + noise * np.eye(len(Xt)))
    means, covs = np.array(means), np.array(covs)
    mean_ref = np.einsum("s,slc->lc", w, means)
    np.testing.assert_allclose(m, mean_ref, rtol=1e-8, atol=1e-10)
    dev = means - mean_ref
    cov_ref = np.einsum("s,slk->lk", w, covs)[..., None] + np.einsum("s,slc,skc->lkc", w, dev, dev)
    np.testing.assert_allclose(cov, cov_ref, rtol=1e-7, atol=1e-10)


def test_pipeline_and_cross_validation():
    X, y = _data(n=29)
    X = X * [1.0, 10.0, 100.0]
    rng = np.random.default_rng(0)
    splits = [(p[:24], p[24:]) for p in (rng.permutation(29) for _ in range(3))]  # the shapes the other tests use
    model = make_pipeline(StandardScaler(), ScaleMixtureRegressor())
    scores = cross_val_score(model, X, y, cv=splits)
    assert scores.shape == (3,) and np.all(np.isfinite(scores))
    assert scores.mean() > 0.5
    assert model.fit(X[:24], y[:24]).score(X[:24], y[:24]) > 0.9


def test_params_clone_and_pickle_round_trip():
    est = ScaleMixtureRegressor(KERNEL, priors.InverseGamma(3.0, 1.0), noise=0.1, num_samples=300, random_state=4)
    params = est.get_params()
    assert params["kernel"] is KERNEL and params["noise"] == 0.1 and params["num_samples"] == 300
    assert est.set_params(noise=0.2, depth=3) is est and est.noise == 0.2 and est.depth == 3
    twin = clone(est)
    assert twin is not est and twin.get_params()["noise"] == 0.2 and callable(twin.get_params()["kernel"])
    assert twin.get_params()["prior"] is not est.prior and priors.is_inverse_gamma(twin.get_params()["prior"])
    X, y = _data()
    fitted = est.fit(X, y)
    assert not hasattr(clone(fitted), "posterior_")
    np.testing.assert_array_equal(twin.fit(X, y).predict(X), fitted.predict(X))
    # a default-kernel estimator survives pickling even when the loading side has x64 off
    default = ScaleMixtureRegressor(prior="gaussian").fit(X, y)
    with jax.enable_x64(False):
        loaded = pickle.loads(pickle.dumps(default))
        np.testing.assert_array_equal(loaded.predict(X, return_std=True)[1], default.predict(X, return_std=True)[1])


def test_float64_without_global_flag():
    X, y = _data()
    ref = ScaleMixtureRegressor(prior="student_t").fit(X, y)
    with jax.enable_x64(False):
        assert jnp.ones(1).dtype == jnp.float32
        est = ScaleMixtureRegressor(prior="student_t").fit(X, y)
        pred = est.predict(X[:5], return_std=True)
        assert jnp.ones(1).dtype == jnp.float32  # the flag is left as the caller set it
    assert est.posterior_._state["L"].dtype == np.float64
    assert pred[0].dtype == np.float64
    np.testing.assert_array_equal(pred[1], ref.predict(X[:5], return_std=True)[1])


def test_helpful_errors():
    X, y = _data()
    with pytest.raises(ValueError, match="'prior'.*student_t"):
        ScaleMixtureRegressor(prior="cauchy").fit(X, y)
    est = ScaleMixtureRegressor(noise=-1.0)  # no validation in __init__
    with pytest.raises(ValueError, match="'noise'.*non-negative"):
        est.fit(X, y)
    with pytest.raises(ValueError, match="'noise'.*unscaled"):
        ScaleMixtureRegressor(noise=0.0, noise_model="unscaled").fit(X, y)
    with pytest.raises(ValueError, match="'noise_model'"):
        ScaleMixtureRegressor(noise_model="white").fit(X, y)
    with pytest.raises(ValueError, match="'num_samples'"):
        ScaleMixtureRegressor(prior="burr12", num_samples=0).fit(X, y)
    with pytest.raises(ValueError, match="'activation'"):
        ScaleMixtureRegressor(activation="tanh").fit(X, y)
    with pytest.raises(ValueError, match="'a'"):
        ScaleMixtureRegressor(a=0.0).fit(X, y)
    with pytest.raises(ValueError, match="'kernel'"):
        ScaleMixtureRegressor(kernel="rbf").fit(X, y)
    with pytest.raises(ValueError, match="'prior'.*support"):
        ScaleMixtureRegressor(prior=posterior.dist.Normal(0.0, 1.0)).fit(X, y)
    with pytest.raises(NotFittedError):
        ScaleMixtureRegressor().predict(X)
    est = ScaleMixtureRegressor(prior="gaussian").fit(X, y)
    with pytest.raises(RuntimeError, match="At most one"):
        est.predict(X, return_std=True, return_cov=True)
    with pytest.raises(ValueError, match="y must have shape"):
        est.log_predictive_density(X, y[:-1])
    with pytest.raises(ValueError, match="level"):
        est.predict_interval(X, level=1.5)
    with pytest.raises(ValueError, match="n_samples"):
        est.sample_y(X, n_samples=0)
