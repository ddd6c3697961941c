"""Exact and importance-sampled scale-mixture posteriors (smnngp.posterior) against independent references.

Every reference is computed here from scratch: numpyro/scipy multivariate densities of the *joint*
(train + test) vector, brute-force conditioning, numpy solves, and scipy.integrate.quad over the scale
sigma^2 (integrated in t = log sigma^2).  None of them reuse the library's formulas.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import integrate, optimize, stats
from scipy.special import logsumexp as np_logsumexp

from smnngp import linalg, posterior, priors, stax
from smnngp.posterior import GaussianMixture, SmallESSWarning, fit, fit_from_kernels, interval

N_TRAIN, N_TEST, EPS = 20, 5, 0.05
# One importance-sampling size for the whole file: prior samplers (numpyro's gamma sampler in particular) are
# compiled once per sample shape, and compilation, not the O(S) weights, is what costs time here.
S_IS = 200_000
KFN = stax.serial(stax.Dense(1, W_std=1.5, b_std=0.1), stax.Erf(), stax.Dense(1))[2]


def rbf(x1, x2, ell=1.0):
    d2 = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d2 / ell**2)


def make_data(n=N_TRAIN, l=N_TEST, n_out=1, seed=0, dim=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n + l, dim))
    f = np.stack([np.sin(x @ rng.normal(size=dim)) for _ in range(n_out)], -1)
    y = f + 0.2 * rng.normal(size=f.shape)
    return x[:n], x[n:], y[:n], y[n:]


def erf_joint(x_tr, x_te):
    """Joint NNGP matrix of [train; test], assembled from the kernel's blocks (the brute-force side).

    The blocks use the same argument shapes as the library's own kernel calls, so the stax kernel is
    compiled once per shape (that compilation dominates this file's runtime).
    """
    x_tr, x_te = jnp.asarray(x_tr), jnp.asarray(x_te)
    ktt = np.asarray(KFN(x_tr, None, "nngp"))
    kst = np.asarray(KFN(x_te, x_tr, "nngp"))
    kss = np.asarray(KFN(x_te, None, "nngp"))
    K = np.block([[ktt, kst.T], [kst, kss]])
    return 0.5 * (K + K.T)


def split(Kj, n):
    return Kj[:n, :n], Kj[n:, :n], Kj[n:, n:]


@pytest.fixture(scope="module")
def erf_data():
    x_tr, x_te, y_tr, y_te = make_data(n_out=2)
    return dict(x_tr=x_tr, x_te=x_te, y_tr=y_tr, y_te=y_te, Kj=erf_joint(x_tr, x_te))


@pytest.fixture(scope="module")
def rbf_data():
    x_tr, x_te, y_tr, y_te = make_data(n=N_TRAIN, l=N_TEST, n_out=1, seed=1, dim=2)
    Kj = rbf(np.concatenate([x_tr, x_te]), np.concatenate([x_tr, x_te]), ell=0.8)
    return dict(x_tr=x_tr, x_te=x_te, y_tr=y_tr[:, 0], y_te=y_te[:, 0], Kj=Kj)


def mvt_logpdf_numpyro(v, df, scale):
    return float(dist.MultivariateStudentT(df, jnp.zeros(len(v)), jnp.linalg.cholesky(jnp.asarray(scale))).log_prob(
        jnp.asarray(v)))


def vec(Y):
    """Column-stacking vec(Y) for an (N, C) array: [y_1; ...; y_C]."""
    Y = np.asarray(Y)
    return Y.reshape(-1) if Y.ndim == 1 else Y.T.reshape(-1)


# ------------------------------------------------------------------------------------------------
# 1. marginal likelihood


@pytest.mark.parametrize("a,b", [(2.0, 1.5), (0.7, 3.0), (12.0, 0.5)])
@pytest.mark.parametrize("n_out", [1, 2])
def test_student_t_log_ml_is_mvt(erf_data, a, b, n_out):
    K, _, _ = split(erf_data["Kj"], N_TRAIN)
    Y = erf_data["y_tr"][:, :n_out]
    y_arg = Y[:, 0] if n_out == 1 else Y
    C = K + EPS * np.eye(N_TRAIN)
    ref = mvt_logpdf_numpyro(vec(Y), 2 * a, (b / a) * np.kron(np.eye(n_out), C))
    post = fit(KFN, erf_data["x_tr"], y_arg, priors.InverseGamma(a, b), noise=EPS)
    assert post.kind == "student_t"
    np.testing.assert_allclose(post.log_marginal_likelihood, ref, rtol=1e-9)
    post2 = fit_from_kernels(K, y_arg, priors.InverseGamma(a, b), noise=EPS)
    np.testing.assert_allclose(post2.log_marginal_likelihood, ref, rtol=1e-9)
    lml = posterior.log_marginal_likelihood(K, y_arg, priors.InverseGamma(a, b), noise=EPS)
    np.testing.assert_allclose(float(lml), ref, rtol=1e-9)


@pytest.mark.parametrize("s", [1.0, 0.3])
@pytest.mark.parametrize("n_out", [1, 2])
def test_gaussian_log_ml_is_mvn(rbf_data, erf_data, s, n_out):
    K, _, _ = split(erf_data["Kj"], N_TRAIN)
    Y = erf_data["y_tr"][:, :n_out]
    C = K + EPS * np.eye(N_TRAIN)
    cov = s * np.kron(np.eye(n_out), C)
    ref = float(dist.MultivariateNormal(jnp.zeros(len(cov)), jnp.asarray(cov)).log_prob(jnp.asarray(vec(Y))))
    # the two references agree
    np.testing.assert_allclose(ref, stats.multivariate_normal(np.zeros(len(cov)), cov).logpdf(vec(Y)), rtol=1e-10)
    post = fit_from_kernels(K, Y[:, 0] if n_out == 1 else Y, priors.Delta(s), noise=EPS)
    assert post.kind == "gaussian" and post.df == math.inf
    np.testing.assert_allclose(post.log_marginal_likelihood, ref, rtol=1e-10)
    # plain RBF matrix, no noise, prior given as a number
    Kr, _, _ = split(rbf_data["Kj"], N_TRAIN)
    Kr = Kr + 1e-3 * np.eye(N_TRAIN)
    ref = stats.multivariate_normal(np.zeros(N_TRAIN), s * Kr).logpdf(rbf_data["y_tr"])
    np.testing.assert_allclose(fit_from_kernels(Kr, rbf_data["y_tr"], s).log_marginal_likelihood, ref, rtol=1e-10)


# ------------------------------------------------------------------------------------------------
# 2. predictive by brute-force conditioning


def _joint_scale(K, kst, kss, eps, j, noisy):
    """[[K + eps I, k_j], [k_j^T, k_jj (+ eps)]] for test point j."""
    n = K.shape[0]
    J = np.empty((n + 1, n + 1))
    J[:n, :n] = K + eps * np.eye(n)
    J[:n, n] = J[n, :n] = kst[j]
    J[n, n] = kss[j, j] + (eps if noisy else 0.0)
    return J


@pytest.mark.parametrize("noisy", [True, False])
@pytest.mark.parametrize("source", ["erf", "rbf"])
def test_student_t_predictive_density_by_conditioning(erf_data, rbf_data, noisy, source):
    a, b = 1.5, 2.0
    if source == "erf":
        d, n = erf_data, N_TRAIN
        y, ys = d["y_tr"][:, 0], d["y_te"][:, 0]
        post = fit(KFN, d["x_tr"], y, priors.InverseGamma(a, b), noise=EPS)
        got = np.asarray(post.log_predictive_density(ys, d["x_te"], noisy=noisy))
    else:
        d, n = rbf_data, N_TRAIN
        y, ys = d["y_tr"], d["y_te"]
        K, kst, kss = split(d["Kj"], n)
        post = fit_from_kernels(K, y, priors.InverseGamma(a, b), noise=EPS)
        got = np.asarray(post.log_predictive_density(ys, k_test_train=kst, k_test_test=kss, noisy=noisy))
    K, kst, kss = split(d["Kj"], n)
    base = stats.multivariate_t(np.zeros(n), (b / a) * (K + EPS * np.eye(n)), df=2 * a).logpdf(y)
    ref = [stats.multivariate_t(np.zeros(n + 1), (b / a) * _joint_scale(K, kst, kss, EPS, j, noisy), df=2 * a).logpdf(
        np.append(y, ys[j])) - base for j in range(len(ys))]
    assert got.shape == (len(ys),)
    np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("noisy", [True, False])
def test_gaussian_predictive_density_by_conditioning(erf_data, noisy):
    s, d, n = 0.6, erf_data, N_TRAIN
    y, ys = d["y_tr"][:, 0], d["y_te"][:, 0]
    K, kst, kss = split(d["Kj"], n)
    post = fit(KFN, d["x_tr"], y, priors.Delta(s), noise=EPS)
    got = np.asarray(post.log_predictive_density(ys, d["x_te"], noisy=noisy))
    base = stats.multivariate_normal(np.zeros(n), s * (K + EPS * np.eye(n))).logpdf(y)
    ref = [stats.multivariate_normal(np.zeros(n + 1), s * _joint_scale(K, kst, kss, EPS, j, noisy)).logpdf(
        np.append(y, ys[j])) - base for j in range(N_TEST)]
    np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-9)


def test_student_t_multi_output_marginals_by_conditioning(erf_data):
    """Output c at test point j: marginal of [vec(Y); y*_jc] under MVT(2a, 0, (b/a) [[I (x) C, e_c (x) k_j], ...])."""
    a, b, n, n_out = 2.5, 1.0, N_TRAIN, 2
    d = erf_data
    Y, Ys = d["y_tr"], d["y_te"]
    K, kst, kss = split(d["Kj"], n)
    post = fit(KFN, d["x_tr"], Y, priors.InverseGamma(a, b), noise=EPS)
    pred = post.predict(d["x_te"])
    assert pred.batch_shape == (N_TEST, n_out)
    got = np.asarray(pred.log_prob(jnp.asarray(Ys)))
    big = np.kron(np.eye(n_out), K + EPS * np.eye(n))
    base = stats.multivariate_t(np.zeros(n * n_out), (b / a) * big, df=2 * a).logpdf(vec(Y))
    for j in range(N_TEST):
        for c in range(n_out):
            J = np.zeros((n * n_out + 1,) * 2)
            J[:-1, :-1] = big
            J[c * n:(c + 1) * n, -1] = J[-1, c * n:(c + 1) * n] = kst[j]
            J[-1, -1] = kss[j, j] + EPS
            ref = stats.multivariate_t(np.zeros(n * n_out + 1), (b / a) * J, df=2 * a).logpdf(
                np.append(vec(Y), Ys[j, c])) - base
            np.testing.assert_allclose(got[j, c], ref, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(post.log_predictive_density(Ys, d["x_te"])), got.sum(-1), rtol=1e-12)


@pytest.mark.parametrize("n_out", [1, 2])
def test_predictive_mean_variance_closed_forms(erf_data, n_out):
    a, b, n = 2.0, 1.5, N_TRAIN
    d = erf_data
    Y = d["y_tr"][:, :n_out]
    K, kst, kss = split(d["Kj"], n)
    C = K + EPS * np.eye(n)
    m = kst @ np.linalg.solve(C, Y)
    S = np.diag(kss) - np.einsum("ij,ji->i", kst, np.linalg.solve(C, kst.T))
    q = float(np.sum(Y * np.linalg.solve(C, Y)))
    y_arg = Y[:, 0] if n_out == 1 else Y
    sq = (lambda v: v[:, 0]) if n_out == 1 else (lambda v: v)
    post = fit(KFN, d["x_tr"], y_arg, priors.InverseGamma(a, b), noise=EPS)
    assert post.df == 2 * a + n * n_out
    for noisy, var in [(True, S + EPS), (False, S)]:
        mean, std = post.predict_mean_std(d["x_te"], noisy=noisy)
        np.testing.assert_allclose(np.asarray(mean), sq(m), rtol=1e-9, atol=1e-12)
        ref_var = (2 * b + q) / (2 * a + n * n_out - 2) * var
        np.testing.assert_allclose(np.asarray(std) ** 2, sq(np.repeat(ref_var[:, None], n_out, 1)), rtol=1e-8)
    gp = fit(KFN, d["x_tr"], y_arg, 0.4, noise=EPS)
    mean, std = gp.predict_mean_std(d["x_te"])
    np.testing.assert_allclose(np.asarray(mean), sq(m), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(std) ** 2, sq(np.repeat(0.4 * (S + EPS)[:, None], n_out, 1)), rtol=1e-8)
    # precomputed kernels (full test matrix or its diagonal) give the same answer as inputs
    p1 = post.predict(k_test_train=kst, k_test_test=kss)
    p2 = post.predict(k_test_train=kst, k_test_test=np.diag(kss))
    np.testing.assert_allclose(np.asarray(p1.variance), np.asarray(p2.variance), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(p1.mean), sq(m), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# numerical integration over sigma^2 (the reference for everything non-conjugate)


class ScaleQuad:
    """p(sigma^2 | Y) proportional to prior_pdf(sigma^2) * exp(loglik(sigma^2)), integrated in t = log sigma^2."""

    def __init__(self, log_prior, loglik):
        self.log_prior, self.loglik = log_prior, loglik
        f = lambda t: -(self.log_prior(math.exp(t)) + t + self.loglik(math.exp(t)))
        res = optimize.minimize_scalar(f, bounds=(-25, 25), method="bounded", options=dict(xatol=1e-10))
        self.t0, self.log_max = res.x, -res.fun
        # curvature-based width for the integration window
        h = 1e-3
        curv = (f(self.t0 + h) - 2 * f(self.t0) + f(self.t0 - h)) / h**2
        self.w = 1 / math.sqrt(max(curv, 1e-6))
        self.norm = self._int(lambda s: 1.0)
        self.log_z = self.log_max + math.log(self.norm)

    def _unnorm(self, t):
        return math.exp(self.log_prior(math.exp(t)) + t + self.loglik(math.exp(t)) - self.log_max)

    def _int(self, h, hi=None):
        lo, up = self.t0 - 40 * self.w, self.t0 + 40 * self.w if hi is None else hi
        pts = [p for p in (self.t0 - 3 * self.w, self.t0, self.t0 + 3 * self.w) if lo < p < up]
        val, _ = integrate.quad(lambda t: self._unnorm(t) * h(math.exp(t)), lo, up, points=pts, limit=400,
                                epsabs=0, epsrel=1e-10)
        return val

    def expect(self, h):
        """E[h(sigma^2) | Y]."""
        return self._int(h) / self.norm

    def cdf(self, x):
        return self._int(lambda s: 1.0, hi=math.log(x)) / self.norm

    def log_pdf(self, x):
        return self.log_prior(x) + self.loglik(x) - self.log_z


def mvn_logpdf(y, cov):
    """log N(y; 0, cov) by a numpy Cholesky (fast enough to sit inside quad)."""
    L = np.linalg.cholesky(cov)
    z = np.linalg.solve(L, y)
    return -0.5 * z @ z - np.sum(np.log(np.diag(L))) - 0.5 * len(y) * math.log(2 * math.pi)


def gaussian_scaled_loglik(K, Y, eps):
    """sigma^2 -> log N(vec Y; 0, sigma^2 I (x) (K + eps I)), via numpy."""
    Y = np.atleast_2d(np.asarray(Y).T).T
    n, c = Y.shape
    C = K + eps * np.eye(n)
    q = float(np.sum(Y * np.linalg.solve(C, Y)))
    ld = np.linalg.slogdet(C)[1]
    return lambda s: -0.5 * q / s - 0.5 * n * c * math.log(2 * math.pi * s) - 0.5 * c * ld


# ------------------------------------------------------------------------------------------------
# 3. scale posterior


@pytest.mark.parametrize("n_out", [1, 2])
def test_scale_posterior_matches_numerical_posterior(erf_data, n_out):
    a, b = 1.2, 0.8
    K, _, _ = split(erf_data["Kj"], N_TRAIN)
    Y = erf_data["y_tr"][:, :n_out]
    post = fit_from_kernels(K, Y[:, 0] if n_out == 1 else Y, priors.InverseGamma(a, b), noise=EPS)
    sp = post.scale_posterior
    quad = ScaleQuad(lambda s: stats.invgamma.logpdf(s, a, scale=b), gaussian_scaled_loglik(K, Y, EPS))
    np.testing.assert_allclose(float(sp.mean), quad.expect(lambda s: s), rtol=1e-7)
    np.testing.assert_allclose(float(sp.variance), quad.expect(lambda s: s * s) - quad.expect(lambda s: s) ** 2,
                               rtol=1e-6)
    for p in [0.05, 0.5, 0.95]:
        x = optimize.brentq(lambda v, p=p: quad.cdf(v) - p, 1e-6, 1e3, xtol=1e-13)
        np.testing.assert_allclose(float(sp.cdf(x)), p, atol=1e-7)
        np.testing.assert_allclose(float(sp.log_prob(x)), quad.log_pdf(x), atol=1e-7)
    gp = fit_from_kernels(K, Y, priors.Delta(0.3), noise=EPS)
    assert priors.is_delta(gp.scale_posterior) and float(gp.scale_posterior.v) == 0.3


# ------------------------------------------------------------------------------------------------
# 4. importance sampling


def _generic_inverse_gamma(a, b):
    # 1/Gamma(a, rate=b) ~ InvGamma(a, scale=b), hidden behind a transform so the code cannot special-case it
    return dist.TransformedDistribution(dist.Gamma(a, b), [dist.transforms.PowerTransform(-1.0)])


def _check_is_density(got, quad, g_of_s, ess, what):
    """|log p_hat - log p| <= 5 CV / sqrt(ESS) + 1e-6, CV = sd(g)/E[g] under the exact scale posterior.

    The self-normalised estimate of E[g] has relative standard error ~ CV / sqrt(ESS).
    """
    for j, (gj, g) in enumerate(zip(got, g_of_s)):
        m1, m2 = quad.expect(g), quad.expect(lambda s, g=g: g(s) ** 2)
        cv = math.sqrt(max(m2 / m1**2 - 1, 0.0))
        tol = 5 * cv / math.sqrt(ess) + 1e-6
        assert abs(gj - math.log(m1)) <= tol, f"{what}[{j}]: got {gj}, expected {math.log(m1)} (tol {tol:.2e})"


def test_is_generic_inverse_gamma_converges_to_closed_form(erf_data):
    a, b, n, S = 2.0, 1.5, N_TRAIN, S_IS
    d = erf_data
    y, ys = d["y_tr"][:, 0], d["y_te"][:, 0]
    K, kst, kss = split(d["Kj"], n)
    prior = _generic_inverse_gamma(a, b)
    post = fit(KFN, d["x_tr"], y, prior, noise=EPS, num_samples=S, key=jax.random.PRNGKey(11))
    exact = fit(KFN, d["x_tr"], y, priors.InverseGamma(a, b), noise=EPS)
    assert post.kind == "importance" and exact.kind == "student_t"
    assert post.num_samples == S and 0 < post.ess <= S
    ess = post.ess
    # log ML: Var(Z_hat)/Z^2 ~ 1/ESS - 1/S, so |log Z_hat - log Z| <= 5/sqrt(ESS)
    ref_lml = mvt_logpdf_numpyro(y, 2 * a, (b / a) * (K + EPS * np.eye(n)))
    assert abs(post.log_marginal_likelihood - ref_lml) <= 5 / math.sqrt(ess)
    # predictive log density: reference = brute-force MVT conditioning; tolerance from the ESS and the CV of
    # the Gaussian component density under the exact InvGamma posterior (sampled with scipy)
    got = np.asarray(post.log_predictive_density(ys, d["x_te"]))
    base = stats.multivariate_t(np.zeros(n), (b / a) * (K + EPS * np.eye(n)), df=2 * a).logpdf(y)
    ref = np.array([stats.multivariate_t(np.zeros(n + 1), (b / a) * _joint_scale(K, kst, kss, EPS, j, True),
                                         df=2 * a).logpdf(np.append(y, ys[j])) - base for j in range(N_TEST)])
    C = K + EPS * np.eye(n)
    q = float(y @ np.linalg.solve(C, y))
    m = kst @ np.linalg.solve(C, y)
    v = np.diag(kss) - np.einsum("ij,ji->i", kst, np.linalg.solve(C, kst.T)) + EPS
    sig2 = stats.invgamma(a + n / 2, scale=b + q / 2).rvs(size=100_000, random_state=np.random.default_rng(0))
    g = stats.norm.pdf(ys[None], m[None], np.sqrt(sig2[:, None] * v[None]))
    cv = g.std(0) / g.mean(0)
    assert np.all(np.abs(got - ref) <= 5 * cv / math.sqrt(ess) + 1e-6), (got, ref, ess)
    # mean: every mixture component has mean m* (scaled noise), so it is exact
    mean, std = post.predict_mean_std(d["x_te"])
    np.testing.assert_allclose(np.asarray(mean), m, rtol=1e-9, atol=1e-12)
    # variance = E[sigma^2 | Y] v; relative error ~ CV(sigma^2) / sqrt(ESS), CV = 1/sqrt(a' - 2)
    ref_var = (2 * b + q) / (2 * a + n - 2) * v
    cv_s = 1 / math.sqrt(a + n / 2 - 2)
    np.testing.assert_allclose(np.asarray(std) ** 2, ref_var, rtol=5 * cv_s / math.sqrt(ess))
    # and the weighted samples reproduce the scale posterior's mean
    beta, log_w = post.scale_posterior_samples()
    w = np.exp(np.asarray(log_w))
    np.testing.assert_allclose(np.sum(w * np.asarray(beta)), (b + q / 2) / (a + n / 2 - 1),
                               rtol=5 * cv_s / math.sqrt(ess))
    assert post.scale_posterior is None and post.df is None


@pytest.mark.parametrize(
    "prior,log_pdf",
    [(priors.BurrXII(2.0, 1.0), lambda s: stats.burr12.logpdf(s, 2.0, 1.0)),
     (priors.BurrXII(0.7, 3.0), lambda s: stats.burr12.logpdf(s, 0.7, 3.0)),
     (dist.HalfCauchy(1.0), lambda s: stats.halfcauchy.logpdf(s))],
    ids=["burr-2-1", "burr-0.7-3", "halfcauchy"],
)
def test_is_non_conjugate_priors_match_quadrature(rbf_data, prior, log_pdf):
    n, S = N_TRAIN, S_IS
    d = rbf_data
    y, ys = d["y_tr"], d["y_te"]
    K, kst, kss = split(d["Kj"], n)
    post = fit_from_kernels(K, y, prior, noise=EPS, num_samples=S, key=jax.random.PRNGKey(5))
    assert post.kind == "importance"
    quad = ScaleQuad(log_pdf, gaussian_scaled_loglik(K, y, EPS))
    assert abs(post.log_marginal_likelihood - quad.log_z) <= 5 / math.sqrt(post.ess), (post.log_marginal_likelihood,
                                                                                      quad.log_z, post.ess)
    C = K + EPS * np.eye(n)
    m = kst @ np.linalg.solve(C, y)
    v = np.diag(kss) - np.einsum("ij,ji->i", kst, np.linalg.solve(C, kst.T)) + EPS
    got = np.asarray(post.log_predictive_density(ys, k_test_train=kst, k_test_test=kss))
    gs = [lambda s, j=j: stats.norm.pdf(ys[j], m[j], math.sqrt(s * v[j])) for j in range(len(ys))]
    _check_is_density(got, quad, gs, post.ess, "log predictive density")


def test_scaled_prior_equals_scaled_kernel(rbf_data):
    """sigma^2 = s X with scaled noise: sigma^2 (K + eps I) = X (s K + s eps I), so both fits are the same model.

    With the same key the prior draws are the same up to the factor s, so the estimates agree to rounding.
    """
    s, n = 2.5, N_TRAIN
    K, kst, kss = split(rbf_data["Kj"], n)
    y, ys = rbf_data["y_tr"], rbf_data["y_te"]
    base = priors.BurrXII(2.0, 1.0)
    scaled = dist.TransformedDistribution(base, [dist.transforms.AffineTransform(0.0, s)])
    p1 = fit_from_kernels(K, y, scaled, noise=EPS, num_samples=S_IS, key=jax.random.PRNGKey(4))
    p2 = fit_from_kernels(s * K, y, base, noise=s * EPS, num_samples=S_IS, key=jax.random.PRNGKey(4))
    np.testing.assert_allclose(p1.log_marginal_likelihood, p2.log_marginal_likelihood, rtol=1e-9)
    np.testing.assert_allclose(p1.ess, p2.ess, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(p1.log_predictive_density(ys, k_test_train=kst, k_test_test=kss)),
                               np.asarray(p2.log_predictive_density(ys, k_test_train=s * kst, k_test_test=s * kss)),
                               rtol=1e-9)


def test_unscaled_noise_delta_is_direct_gp(erf_data):
    s, sn2, n = 0.7, 0.09, N_TRAIN
    d = erf_data
    Y = d["y_tr"]
    K, kst, kss = split(d["Kj"], n)
    Sig = s * K + sn2 * np.eye(n)
    for y in (Y[:, 0], Y):
        post = fit(KFN, d["x_tr"], y, priors.Delta(s), noise=sn2, noise_model="unscaled")
        Ym = np.atleast_2d(y.T).T
        ref = sum(stats.multivariate_normal(np.zeros(n), Sig).logpdf(Ym[:, c]) for c in range(Ym.shape[1]))
        np.testing.assert_allclose(post.log_marginal_likelihood, ref, rtol=1e-10)
        m = s * kst @ np.linalg.solve(Sig, Ym)
        v = s * np.diag(kss) - s**2 * np.einsum("ij,ji->i", kst, np.linalg.solve(Sig, kst.T))
        for noisy, var in [(True, v + sn2), (False, v)]:
            pred = post.predict(d["x_te"], noisy=noisy)
            sq = (lambda a: a[:, 0]) if y.ndim == 1 else (lambda a: a)
            np.testing.assert_allclose(np.asarray(pred.mean), sq(m), rtol=1e-8, atol=1e-12)
            np.testing.assert_allclose(np.asarray(pred.variance), sq(np.repeat(var[:, None], Ym.shape[1], 1)),
                                       rtol=1e-8)
            ys = d["y_te"][:, 0] if y.ndim == 1 else d["y_te"]
            ref_lp = stats.norm.logpdf(np.atleast_2d(ys.T).T, m, np.sqrt(var)[:, None]).sum(-1)
            np.testing.assert_allclose(np.asarray(post.log_predictive_density(ys, d["x_te"], noisy=noisy)), ref_lp,
                                       rtol=1e-9)


def test_unscaled_noise_inverse_gamma_matches_quadrature(rbf_data):
    a, b, sn2, n, S = 3.0, 2.0, 0.04, N_TRAIN, S_IS
    d = rbf_data
    y, ys = d["y_tr"], d["y_te"]
    K, kst, kss = split(d["Kj"], n)
    post = fit_from_kernels(K, y, priors.InverseGamma(a, b), noise=sn2, noise_model="unscaled", num_samples=S,
                            key=jax.random.PRNGKey(2))
    assert post.kind == "importance"
    loglik = lambda s: mvn_logpdf(y, s * K + sn2 * np.eye(n))
    quad = ScaleQuad(lambda s: stats.invgamma.logpdf(s, a, scale=b), loglik)
    assert abs(post.log_marginal_likelihood - quad.log_z) <= 5 / math.sqrt(post.ess)
    # predictive density at test point j = E[ N(y*_j | Y, s) ] with N(y*_j | Y, s) from the (n+1)-joint Gaussian
    Kj = d["Kj"]

    def cond_density(s, j):
        idx = list(range(n)) + [n + j]
        J = s * Kj[np.ix_(idx, idx)] + sn2 * np.eye(n + 1)
        return math.exp(mvn_logpdf(np.append(y, ys[j]), J) - loglik(s))

    got = np.asarray(post.log_predictive_density(ys, k_test_train=kst, k_test_test=kss))
    _check_is_density(got, quad, [lambda s, j=j: cond_density(s, j) for j in range(len(ys))], post.ess,
                      "unscaled log density")
    # mean: E[m(s)], m(s) = s k*^T (s K + sn2 I)^{-1} y; error ~ sd_post(m) / sqrt(ESS)
    mean = np.asarray(post.predict(k_test_train=kst, k_test_test=kss).mean)
    for j in range(len(ys)):
        mj = lambda s, j=j: s * kst[j] @ np.linalg.solve(s * K + sn2 * np.eye(n), y)
        e1, e2 = quad.expect(mj), quad.expect(lambda s, mj=mj: mj(s) ** 2)
        assert abs(mean[j] - e1) <= 5 * math.sqrt(max(e2 - e1**2, 0)) / math.sqrt(post.ess) + 1e-9


def test_small_ess_warning_and_ess_range(rbf_data):
    n = N_TRAIN
    K, _, _ = split(rbf_data["Kj"], n)
    y = rbf_data["y_tr"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallESSWarning)
        good = fit_from_kernels(K, y, priors.InverseGamma(3.0, 2.0), noise=0.1, noise_model="unscaled",
                                num_samples=S_IS)
    assert 30 < good.ess <= S_IS
    # a prior concentrated far below the posterior's scale: a handful of samples carry all the weight
    bad_prior = _generic_inverse_gamma(200.0, 200.0 * 1e-3)
    with pytest.warns(SmallESSWarning, match="effective sample size"):
        bad = fit_from_kernels(K, y, bad_prior, noise=EPS, num_samples=S_IS)
    assert 0 < bad.ess < 30


def test_scale_posterior_samples_are_normalised(rbf_data):
    K, _, _ = split(rbf_data["Kj"], N_TRAIN)
    post = fit_from_kernels(K, rbf_data["y_tr"], priors.BurrXII(2.0, 1.0), noise=EPS, num_samples=S_IS)
    beta, log_w = post.scale_posterior_samples()
    beta, log_w = np.asarray(beta), np.asarray(log_w)
    assert beta.shape == log_w.shape and 0 < len(beta) <= S_IS
    assert np.all(beta > 0) and np.all(np.isfinite(log_w)) and np.all(log_w <= 0)
    np.testing.assert_allclose(np_logsumexp(log_w), 0.0, atol=1e-12)
    np.testing.assert_allclose(np.exp(log_w).sum(), 1.0, atol=1e-12)
    # the ESS from these weights cannot exceed the one reported (pruning only removes negligible weight)
    np.testing.assert_allclose(1 / np.sum(np.exp(2 * log_w)), post.ess, rtol=1e-6)
    exact = fit_from_kernels(K, rbf_data["y_tr"], priors.InverseGamma(2.0, 1.0), noise=EPS)
    with pytest.raises(ValueError, match="importance sampling"):
        exact.scale_posterior_samples()


# ------------------------------------------------------------------------------------------------
# 5. joint draws


def _sample_setup(n_out=1):
    # same sizes as the other fixtures (every new matrix size recompiles the library's eager JAX ops)
    x_tr, x_te, y_tr, _ = make_data(n=N_TRAIN, l=N_TEST, n_out=n_out, seed=4, dim=2)
    Kj = rbf(np.concatenate([x_tr, x_te]), np.concatenate([x_tr, x_te]), ell=1.0)
    K, kst, kss = split(Kj, N_TRAIN)
    return K, kst, kss, (y_tr[:, 0] if n_out == 1 else y_tr)


def _scaled_predictive(K, kst, kss, Y, eps, noisy):
    C = K + eps * np.eye(len(K))
    m = kst @ np.linalg.solve(C, np.atleast_2d(Y.T).T)
    S = kss - kst @ np.linalg.solve(C, kst.T) + (eps * np.eye(len(kss)) if noisy else 0)
    q = float(np.sum(np.atleast_2d(Y.T).T * np.linalg.solve(C, np.atleast_2d(Y.T).T)))
    return m, 0.5 * (S + S.T), q


def _mahalanobis_over_d(x, m, Sig):
    """Rows of x (S, L, C): (x - m)^T (I (x) Sig)^{-1} (x - m) / (L C)."""
    r = x - m[None]
    z = np.linalg.solve(np.linalg.cholesky(Sig), r.transpose(1, 0, 2).reshape(len(Sig), -1))
    return (z**2).reshape(len(Sig), x.shape[0], -1).sum(axis=(0, 2)) / (r.shape[1] * r.shape[2])


@pytest.mark.parametrize("noisy", [False, True])
def test_sample_f_student_t_is_joint_mvt(noisy):
    a, b, eps, S = 1.0, 1.0, 0.01, S_IS
    K, kst, kss, y = _sample_setup()
    post = fit_from_kernels(K, y, priors.InverseGamma(a, b), noise=eps)
    x = np.asarray(post.sample_f(jax.random.PRNGKey(0), k_test_train=kst, k_test_test=kss, num_samples=S,
                                 noisy=noisy))
    assert x.shape == (S, 5)
    m, Sstar, q = _scaled_predictive(K, kst, kss, y, eps, noisy)
    n, L = N_TRAIN, N_TEST
    nu = 2 * a + n
    Sig = (2 * b + q) / nu * Sstar
    T = _mahalanobis_over_d(x[..., None], m, Sig)
    assert stats.kstest(T, stats.f(L, nu).cdf).pvalue > 1e-3
    # Demonstration: per-coordinate independent scales (right t marginals, wrong joint) fail the same test.
    rng = np.random.default_rng(0)
    z = rng.standard_normal((S, L)) @ np.linalg.cholesky(Sig).T
    w = nu / rng.chisquare(nu, size=(S, L))
    x_bad = m[:, 0][None] + np.sqrt(w) * z
    for i in range(L):  # the marginals are right ...
        assert stats.kstest((x_bad[:, i] - m[i, 0]) / math.sqrt(Sig[i, i]), stats.t(nu).cdf).pvalue > 1e-4
    T_bad = _mahalanobis_over_d(x_bad[..., None], m, Sig)  # ... the joint is not
    assert stats.kstest(T_bad, stats.f(L, nu).cdf).pvalue < 1e-3


def test_sample_f_gaussian_is_chi_square():
    s, eps, S = 0.5, 0.01, 10_000
    K, kst, kss, y = _sample_setup()
    post = fit_from_kernels(K, y, priors.Delta(s), noise=eps)
    x = np.asarray(post.sample_f(jax.random.PRNGKey(1), k_test_train=kst, k_test_test=kss, num_samples=S))
    m, Sstar, _ = _scaled_predictive(K, kst, kss, y, eps, False)
    T = _mahalanobis_over_d(x[..., None], m, s * Sstar) * 5
    assert stats.kstest(T, stats.chi2(5).cdf).pvalue > 1e-3


def test_sample_f_multi_output_shares_one_scale():
    a, b, eps, S = 1.5, 0.5, 0.01, S_IS
    K, kst, kss, Y = _sample_setup(n_out=3)
    post = fit_from_kernels(K, Y, priors.InverseGamma(a, b), noise=eps)
    x = np.asarray(post.sample_f(jax.random.PRNGKey(2), k_test_train=kst, k_test_test=kss, num_samples=S))
    assert x.shape == (S, 5, 3)
    m, Sstar, q = _scaled_predictive(K, kst, kss, Y, eps, False)
    nu = 2 * a + N_TRAIN * 3
    T = _mahalanobis_over_d(x, m, (2 * b + q) / nu * Sstar)
    assert stats.kstest(T, stats.f(N_TEST * 3, nu).cdf).pvalue > 1e-3


def test_sample_f_importance_and_unscaled(erf_data):
    d = erf_data
    # importance sampling with a generic inverse gamma: draws follow the Student-t process posterior.
    # IG(1, b) is 1 / Exponential(rate b): a generic transformed distribution with a cheap sampler.
    a, b, eps = 1.0, 1.0, 0.01
    K, kst, kss, y = _sample_setup()
    prior = dist.TransformedDistribution(dist.Exponential(b), [dist.transforms.PowerTransform(-1.0)])
    post = fit_from_kernels(K, y, prior, noise=eps, num_samples=5000)
    assert post.kind == "importance" and post.ess > 500
    x = np.asarray(post.sample_f(jax.random.PRNGKey(3), k_test_train=kst, k_test_test=kss, num_samples=1000))
    assert x.shape == (1000, 5)
    m, Sstar, q = _scaled_predictive(K, kst, kss, y, eps, False)
    T = _mahalanobis_over_d(x[..., None], m, (2 * b + q) / (2 * a + N_TRAIN) * Sstar)
    assert stats.kstest(T, stats.f(N_TEST, 2 * a + N_TRAIN).cdf).pvalue > 1e-3
    # unscaled noise, Delta: Gaussian with covariance s K** - s^2 k*^T (s K + sn2 I)^{-1} k* (+ sn2 I)
    s, sn2 = 0.8, 0.05
    gp = fit_from_kernels(K, y, priors.Delta(s), noise=sn2, noise_model="unscaled")
    Sig_n = s * K + sn2 * np.eye(N_TRAIN)
    mu = s * kst @ np.linalg.solve(Sig_n, y)
    cov = s * kss - s**2 * kst @ np.linalg.solve(Sig_n, kst.T) + sn2 * np.eye(5)
    # (sample_f loops over draws in Python for unscaled noise, ~0.1 s each: keep this small)
    x = np.asarray(gp.sample_f(jax.random.PRNGKey(4), k_test_train=kst, k_test_test=kss, num_samples=20,
                               noisy=True))
    assert x.shape == (20, 5)
    T = _mahalanobis_over_d(x[..., None], mu[:, None], 0.5 * (cov + cov.T)) * 5
    assert stats.kstest(T, stats.chi2(5).cdf).pvalue > 1e-3
    # shapes through fit(): squeezed single output, (S, L, C) for multi-output, unscaled importance sampling
    p1 = fit(KFN, d["x_tr"], d["y_tr"][:, 0], priors.InverseGamma(2.0, 2.0), noise=EPS)
    assert p1.sample_f(jax.random.PRNGKey(0), d["x_te"], num_samples=S_IS).shape == (S_IS, N_TEST)
    p2 = fit(KFN, d["x_tr"], d["y_tr"], priors.BurrXII(2.0, 1.0), noise=EPS, noise_model="unscaled",
             num_samples=S_IS)
    draws = p2.sample_f(jax.random.PRNGKey(0), d["x_te"], num_samples=3)
    assert draws.shape == (3, N_TEST, 2) and bool(jnp.all(jnp.isfinite(draws)))


# ------------------------------------------------------------------------------------------------
# 6. GaussianMixture and intervals


def _mixture():
    rng = np.random.default_rng(9)
    S, L = 6, 4
    log_w = rng.normal(size=S)
    loc = rng.normal(size=(S, L)) * 2
    scale = np.exp(rng.normal(size=(S, L)) * 0.5)
    return log_w, loc, scale, GaussianMixture(jnp.asarray(log_w), jnp.asarray(loc), jnp.asarray(scale))


def test_gaussian_mixture_density_cdf_quantiles():
    log_w, loc, scale, gm = _mixture()
    w = np.exp(log_w - np_logsumexp(log_w))
    pdf = lambda v, j: float(np.sum(w * stats.norm.pdf(v, loc[:, j], scale[:, j])))
    xs = np.array([-1.0, 0.3, 2.0, -4.0])
    np.testing.assert_allclose(np.asarray(gm.log_prob(jnp.asarray(xs))), [math.log(pdf(xs[j], j)) for j in range(4)],
                               rtol=1e-12)
    for j in range(4):
        mean = integrate.quad(lambda v, j=j: v * pdf(v, j), -np.inf, np.inf, epsabs=1e-12)[0]
        var = integrate.quad(lambda v, j=j: (v - mean) ** 2 * pdf(v, j), -np.inf, np.inf, epsabs=1e-12)[0]
        np.testing.assert_allclose(float(gm.mean[j]), mean, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(float(gm.variance[j]), var, rtol=1e-8)
        np.testing.assert_allclose(float(gm.cdf(jnp.full(4, xs[j]))[j]),
                                   integrate.quad(lambda v, j=j: pdf(v, j), -np.inf, xs[j], epsabs=1e-13)[0],
                                   atol=1e-9)
    qq = jnp.array([1e-4, 0.3, 0.5, 0.999])  # one quantile level per point (icdf is costly to trace)
    np.testing.assert_allclose(np.asarray(gm.cdf(gm.icdf(qq))), np.asarray(qq), rtol=1e-9, atol=1e-12)
    lo, hi = interval(gm, 0.9)
    np.testing.assert_allclose(np.asarray(gm.cdf(lo)), 0.05, atol=1e-10)
    np.testing.assert_allclose(np.asarray(gm.cdf(hi)), 0.95, atol=1e-10)
    draws = np.asarray(gm.sample(jax.random.PRNGKey(0), (5000,)))
    assert draws.shape == (5000, 4)
    ref_cdf = lambda v: np.sum(w[:, None] * stats.norm.cdf(v[None], loc[:, :1], scale[:, :1]), axis=0)
    assert stats.kstest(draws[:, 0], ref_cdf).pvalue > 1e-3
    with pytest.raises(ValueError, match="leading component axis"):
        GaussianMixture(jnp.zeros(3), jnp.zeros((4, 2)), jnp.ones((4, 2)))


def test_interval_student_t_and_normal():
    df, loc, sc = jnp.array([3.0, 7.5]), jnp.array([0.5, -1.0]), jnp.array([2.0, 0.3])
    lo, hi = interval(dist.StudentT(df, loc, sc), 0.95)
    np.testing.assert_allclose(np.asarray(lo), stats.t.ppf(0.025, np.asarray(df), np.asarray(loc), np.asarray(sc)),
                               rtol=1e-10)
    np.testing.assert_allclose(np.asarray(hi), stats.t.ppf(0.975, np.asarray(df), np.asarray(loc), np.asarray(sc)),
                               rtol=1e-10)
    lo, hi = interval(dist.Normal(loc, sc), 0.8)
    np.testing.assert_allclose(np.asarray(lo), stats.norm.ppf(0.1, np.asarray(loc), np.asarray(sc)), rtol=1e-8)
    np.testing.assert_allclose(np.asarray(hi), stats.norm.ppf(0.9, np.asarray(loc), np.asarray(sc)), rtol=1e-8)
    for bad in [0.0, 1.0, 1.5]:
        with pytest.raises(ValueError, match="level"):
            interval(dist.Normal(loc, sc), bad)


# ------------------------------------------------------------------------------------------------
# 7. errors


@pytest.fixture(scope="module")
def small():
    x_tr, x_te, y_tr, _ = make_data(n=N_TRAIN, l=3, seed=5, dim=2)
    K = rbf(x_tr, x_tr) + 1e-2 * np.eye(N_TRAIN)
    return x_tr, x_te, y_tr[:, 0], K


def test_errors_on_targets_and_noise(small):
    x, _, y, K = small
    y_nan = y.copy()
    y_nan[3] = np.nan
    with pytest.raises(ValueError, match="y_train has 1 non-finite"):
        fit_from_kernels(K, y_nan)
    with pytest.raises(ValueError, match="y_train has 1 non-finite"):
        fit(KFN, x, y_nan)
    with pytest.raises(ValueError, match="9 rows but the training kernel/inputs have 20"):
        fit_from_kernels(K, y[:9])
    with pytest.raises(ValueError, match="9 rows"):
        fit(KFN, x, y[:9])
    with pytest.raises(ValueError, match="shape \\(N,\\) or \\(N, C\\)"):
        fit_from_kernels(K, y[:, None, None])
    with pytest.raises(ValueError, match="noise must be a non-negative"):
        fit_from_kernels(K, y, noise=-0.1)
    with pytest.raises(ValueError, match="noise must be a non-negative"):
        fit_from_kernels(K, y, noise=float("nan"))
    with pytest.raises(ValueError, match="noise_model must be 'scaled' or 'unscaled'"):
        fit_from_kernels(K, y, noise=0.1, noise_model="heteroscedastic")
    with pytest.raises(ValueError, match="needs noise > 0"):
        fit_from_kernels(K, y, priors.InverseGamma(2.0, 2.0), noise=0.0, noise_model="unscaled")


def test_errors_on_kernels(small):
    _, _, y, K = small
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(N_TRAIN, N_TRAIN)))
    K_ind = (Q * np.r_[-1.0, np.ones(N_TRAIN - 1)]) @ Q.T
    K_ind = 0.5 * (K_ind + K_ind.T)
    with pytest.raises(linalg.NotPositiveDefiniteError, match="training kernel.*not positive definite"):
        fit_from_kernels(K_ind, y)
    with pytest.raises(linalg.NotPositiveDefiniteError, match="training kernel.*not positive semi-definite"):
        fit_from_kernels(K_ind, y, priors.InverseGamma(2.0, 2.0), noise=0.1, noise_model="unscaled")
    K_nan = K.copy()
    K_nan[1, 2] = K_nan[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fit_from_kernels(K_nan, y)
    with pytest.raises(ValueError, match="NaN"):
        fit_from_kernels(K_nan, y, priors.InverseGamma(2.0, 2.0), noise=0.1, noise_model="unscaled")
    with pytest.raises(ValueError, match="k_train must be a square"):
        fit_from_kernels(K[:, :9], y)


def test_errors_on_priors_and_samples(small):
    _, _, y, K = small
    with pytest.raises(ValueError, match="support"):
        fit_from_kernels(K, y, dist.Normal(0.0, 1.0))
    with pytest.raises(TypeError, match="numpyro distribution"):
        fit_from_kernels(K, y, "inverse-gamma")
    with pytest.raises(TypeError, match="numpyro distribution"):
        fit_from_kernels(K, y, stats.invgamma(2.0))
    for bad in [0, -5, 2.5]:
        with pytest.raises(ValueError, match="num_samples must be a positive integer"):
            fit_from_kernels(K, y, priors.BurrXII(2.0, 1.0), noise=0.1, num_samples=bad)


def test_errors_on_prediction_inputs(small, erf_data):
    x, x_te, y, K = small
    post = fit(KFN, erf_data["x_tr"], erf_data["y_tr"][:, 0], priors.InverseGamma(2.0, 2.0), noise=0.1)
    with pytest.raises(ValueError, match="per-point shape \\(2,\\) but x_train has \\(3,\\)"):
        post.predict(np.ones((4, 2)))
    x_bad = erf_data["x_te"].copy()
    x_bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="x_test has 1 non-finite"):
        post.predict(x_bad)
    pk = fit_from_kernels(K, y, priors.InverseGamma(2.0, 2.0), noise=0.1)
    with pytest.raises(ValueError, match="pass k_test_train"):
        pk.predict(x_te)
    kst = rbf(x_te, x)
    with pytest.raises(ValueError, match="k_test_train must have shape \\(L, 20\\)"):
        pk.predict(k_test_train=kst[:, :7], k_test_test=np.ones(3))
    with pytest.raises(ValueError, match="k_test_test is required"):
        pk.predict(k_test_train=kst)
    with pytest.raises(ValueError, match="k_test_test must have shape"):
        pk.predict(k_test_train=kst, k_test_test=np.ones(4))
    with pytest.raises(ValueError, match="full_cov=True needs k_test_test"):
        pk.sample_f(jax.random.PRNGKey(0), k_test_train=kst, k_test_test=np.ones(3))
    with pytest.raises(ValueError, match="y_test must have shape"):
        pk.log_predictive_density(np.ones(4), k_test_train=kst, k_test_test=np.ones(3))
    kst_nan = kst.copy()
    kst_nan[0, 0] = np.inf
    with pytest.raises(ValueError, match="k_test_train has 1 non-finite"):
        pk.predict(k_test_train=kst_nan, k_test_test=np.ones(3))


# ------------------------------------------------------------------------------------------------
# 8. jitter


def _duplicated():
    # 17 distinct inputs plus 3 repeats: the same (20, 3) shape as erf_data, so the stax kernel is not recompiled
    x, _, y, _ = make_data(n=17, l=1, seed=6, dim=3)
    x = np.concatenate([x, x[:3]])
    y = np.concatenate([y[:, 0], y[:3, 0]])  # consistent targets at duplicated inputs
    return x, y


def test_duplicated_inputs_without_noise_still_fit():
    x, y = _duplicated()
    for prior in [None, priors.InverseGamma(2.0, 2.0)]:
        post = fit(KFN, x, y, prior, noise=0.0)
        assert post.jitter > 0
        assert math.isfinite(post.log_marginal_likelihood)
        mean, std = post.predict_mean_std(x[:5])
        assert np.all(np.isfinite(np.asarray(mean))) and np.all(np.isfinite(np.asarray(std)))
        # noise-free: the posterior interpolates the (consistent) training targets
        np.testing.assert_allclose(np.asarray(mean), y[:5], atol=1e-5)
    K = rbf(x, x)
    post = fit_from_kernels(K, y, noise=0.0)
    assert post.jitter > 0 and math.isfinite(post.log_marginal_likelihood)


def test_duplicated_inputs_without_noise_warn():
    x, y = _duplicated()
    with pytest.warns(UserWarning, match="jitter"):
        fit(KFN, x, y, noise=0.0)


def test_large_jitter_warns():
    # a kernel whose smallest eigenvalue is about -1e-6 of the diagonal: needs jitter well above the threshold
    rng = np.random.default_rng(8)
    Q, _ = np.linalg.qr(rng.normal(size=(N_TRAIN, N_TRAIN)))
    K = (Q * np.r_[-1e-6, np.linspace(0.5, 2.0, N_TRAIN - 1)]) @ Q.T
    K = 0.5 * (K + K.T)
    y = rng.normal(size=N_TRAIN)
    with pytest.warns(UserWarning, match="jitter"):
        post = fit_from_kernels(K, y)
    assert post.jitter > 1e-6


def test_likelihood_proposal_keeps_most_samples_and_agrees_with_the_closed_form(erf_data):
    a, b, n = 2.0, 1.5, N_TRAIN
    d = erf_data
    y, ys = d["y_tr"][:, 0], d["y_te"][:, 0]
    K, kst, kss = split(d["Kj"], n)
    S = 20_000
    post = fit(KFN, d["x_tr"], y, _generic_inverse_gamma(a, b), noise=EPS, num_samples=S,
               key=jax.random.PRNGKey(5), proposal="likelihood")
    by_prior = fit(KFN, d["x_tr"], y, _generic_inverse_gamma(a, b), noise=EPS, num_samples=S,
                   key=jax.random.PRNGKey(5))
    exact = fit(KFN, d["x_tr"], y, priors.InverseGamma(a, b), noise=EPS)
    assert post.ess > by_prior.ess and post.ess > 0.3 * S
    assert abs(post.log_marginal_likelihood - exact.log_marginal_likelihood) <= 5 / math.sqrt(post.ess)
    got = np.asarray(post.log_predictive_density(ys, d["x_te"]))
    ref = np.asarray(exact.log_predictive_density(ys, d["x_te"]))
    np.testing.assert_allclose(got, ref, atol=5 / math.sqrt(post.ess))
    with pytest.raises(ValueError, match="proposal must be"):
        fit(KFN, d["x_tr"], y, _generic_inverse_gamma(a, b), noise=EPS, proposal="posterior")
    with pytest.raises(ValueError, match="noise_model='scaled' only"):
        fit(KFN, d["x_tr"], y, _generic_inverse_gamma(a, b), noise=EPS, noise_model="unscaled", proposal="likelihood")
