"""smnngp.predict: gradient-flow ensembles (NNGP / NTK) and their scale mixtures, against independent computations."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
import scipy.integrate
import scipy.linalg
import scipy.stats
from numpyro.distributions.transforms import PowerTransform

from smnngp import predict, priors, stax

LR = 0.7


@pytest.fixture(scope="module")
def problem():
    _, _, kernel_fn = stax.serial(
        stax.Dense(64, W_std=1.5, b_std=0.1), stax.Erf(), stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu(),
        stax.Dense(1, W_std=1.0),
    )
    kernel_fn = jax.jit(kernel_fn, static_argnames="get")  # one compilation per shape instead of op-by-op dispatch
    rs = np.random.RandomState(0)
    x, xt = rs.normal(size=(6, 3)), rs.normal(size=(4, 3))
    y = rs.normal(size=(6, 2))
    k = kernel_fn(x, None, ("nngp", "ntk"))._asdict()
    kt = kernel_fn(xt, x, ("nngp", "ntk"))._asdict()
    k, kt = ({n: np.asarray(v) for n, v in d.items()} for d in (k, kt))
    ktt = np.asarray(kernel_fn(xt, None, "nngp"))
    return dict(kernel_fn=kernel_fn, x=x, xt=xt, y=y, k=k, kt=kt, ktt=ktt)


def _gaussian_from_map(A, K, Kt, Ktt, y):
    """Mean and covariance of f(x*) = f0(x*) + A (y - f0(X)) with f0 ~ GP(0, K)."""
    return A @ y, Ktt + A @ K @ A.T - A @ Kt.T - Kt @ A.T


def test_nngp_at_infinity_is_gp_conditioning(problem):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], learning_rate=LR)
    out = pf(None, p["xt"], "nngp")
    K, Kt = p["k"]["nngp"], p["kt"]["nngp"]
    np.testing.assert_allclose(out.mean, Kt @ np.linalg.solve(K, p["y"]), atol=1e-10)
    np.testing.assert_allclose(out.covariance, p["ktt"] - Kt @ np.linalg.solve(K, Kt.T), atol=1e-10)
    # t = inf is the same path as t = None
    np.testing.assert_allclose(pf(np.inf, p["xt"], "nngp").mean, out.mean, atol=0)


def test_ntk_at_infinity_is_theta_prime(problem):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"])
    out = pf(None, p["xt"], "ntk")
    K, Kt, T, Tt, Ktt = p["k"]["nngp"], p["kt"]["nngp"], p["k"]["ntk"], p["kt"]["ntk"], p["ktt"]
    Ti = np.linalg.inv(T)
    theta_prime = Ktt + Tt @ Ti @ K @ Ti @ Tt.T - (Tt @ Ti @ Kt.T + Kt @ Ti @ Tt.T)
    np.testing.assert_allclose(out.mean, Tt @ Ti @ p["y"], atol=1e-9)
    np.testing.assert_allclose(out.covariance, theta_prime, atol=1e-9)


@pytest.mark.parametrize("get", ["nngp", "ntk"])
def test_finite_time_matches_matrix_exponential(problem, get):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], learning_rate=LR)
    times = np.array([[0.0, 0.3], [2.0, 40.0]])
    out = pf(times, p["xt"], get)
    assert out.mean.shape == (2, 2, 4, 2) and out.covariance.shape == (2, 2, 4, 4)
    T, Tt = p["k"][get], p["kt"][get]
    n = p["y"].size  # neural-tangents' normalisation: loss = 0.5 * mean over all N * C entries
    for idx in np.ndindex(times.shape):
        A = Tt @ np.linalg.solve(T, np.eye(6) - scipy.linalg.expm(-LR * times[idx] * T / n))
        mean, cov = _gaussian_from_map(A, p["k"]["nngp"], p["kt"]["nngp"], p["ktt"], p["y"])
        np.testing.assert_allclose(out.mean[idx], mean, atol=1e-10)
        np.testing.assert_allclose(out.covariance[idx], cov, atol=1e-10)
    # t = 0 is the prior
    np.testing.assert_allclose(out.mean[0, 0], 0.0, atol=1e-14)
    np.testing.assert_allclose(out.covariance[0, 0], p["ktt"], atol=1e-12)


def test_finite_time_matches_ode_integration(problem):
    """Integrate the linearised network's gradient flow, df/dt = -(eta/n) Theta(., X) (f(X) - y), independently."""
    p = problem
    x_all = np.concatenate([p["x"], p["xt"]])
    theta = np.asarray(p["kernel_fn"](x_all, p["x"], "ntk"))  # (N + M, N)
    k_all = np.asarray(p["kernel_fn"](x_all, None, "nngp"))
    n_tr, n_all, y = 6, 10, p["y"]
    rate = LR / y.size

    # f_t = m_t + G_t f_0 on all points; dG/dt = -rate Theta(., X) G[X], dm/dt = -rate Theta(., X) (m[X] - y)
    def rhs(_, state):
        G = state[: n_all * n_all].reshape(n_all, n_all)
        m = state[n_all * n_all:].reshape(n_all, 2)
        dG = -rate * theta @ G[:n_tr]
        dm = -rate * theta @ (m[:n_tr] - y)
        return np.concatenate([dG.ravel(), dm.ravel()])

    t_end = 25.0
    state0 = np.concatenate([np.eye(n_all).ravel(), np.zeros(n_all * 2)])
    sol = scipy.integrate.solve_ivp(rhs, (0, t_end), state0, method="DOP853", rtol=1e-11, atol=1e-12)
    G = sol.y[: n_all * n_all, -1].reshape(n_all, n_all)
    m = sol.y[n_all * n_all:, -1].reshape(n_all, 2)
    cov = G @ k_all @ G.T
    out = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], y, learning_rate=LR)(t_end, p["xt"], "ntk")
    np.testing.assert_allclose(out.mean, m[n_tr:], atol=1e-8)
    np.testing.assert_allclose(out.covariance, cov[n_tr:, n_tr:], atol=1e-8)
    train = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], y, learning_rate=LR)(t_end, None, "ntk")
    np.testing.assert_allclose(train.mean, m[:n_tr], atol=1e-8)
    np.testing.assert_allclose(train.covariance, cov[:n_tr, :n_tr], atol=1e-8)


@pytest.mark.parametrize("get", ["nngp", "ntk"])
def test_long_training_approaches_the_limit(problem, get):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], learning_rate=LR)
    lam_min = np.linalg.eigvalsh(p["k"][get])[0]
    t_big = 60.0 * p["y"].size / (LR * lam_min)  # exp(-60) of the slowest mode left
    inf, big = pf(None, p["xt"], get), pf(t_big, p["xt"], get)
    np.testing.assert_allclose(big.mean, inf.mean, atol=1e-8)
    np.testing.assert_allclose(big.covariance, inf.covariance, atol=1e-8)
    mid = pf(t_big / 30, p["xt"], get)
    assert np.abs(mid.mean - inf.mean).max() > 1e-6  # not yet converged: the check above can fail


def test_training_points_and_x_test_none(problem):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], learning_rate=LR)
    for get in ("nngp", "ntk"):
        for t in (0.5, 7.0):
            a, b = pf(t, None, get), pf(t, p["x"], get)
            np.testing.assert_allclose(a.mean, b.mean, atol=1e-9)
            np.testing.assert_allclose(a.covariance, b.covariance, atol=1e-9)
        conv = pf(None, None, get)
        np.testing.assert_allclose(conv.mean, p["y"], atol=0)
        np.testing.assert_allclose(conv.covariance, 0.0, atol=0)
    both = pf(None, p["xt"])  # get=None: both, as in neural-tangents
    assert both._fields == ("nngp", "ntk")
    mean_only = pf(None, p["xt"], "ntk", compute_cov=False)
    np.testing.assert_allclose(mean_only, both.ntk.mean, atol=1e-12)


def test_diag_reg_is_relative_to_mean_diagonal(problem):
    p = problem
    K, Kt = p["k"]["nngp"], p["kt"]["nngp"]
    reg = 0.1
    out = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], diag_reg=reg)(None, p["xt"], "nngp")
    K_reg = K + reg * np.mean(np.diag(K)) * np.eye(6)
    np.testing.assert_allclose(out.mean, Kt @ np.linalg.solve(K_reg, p["y"]), atol=1e-10)
    np.testing.assert_allclose(out.covariance, p["ktt"] - Kt @ np.linalg.solve(K_reg, Kt.T), atol=1e-10)
    absolute = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], diag_reg=reg,
                                                     diag_reg_absolute_scale=True)(None, p["xt"], "nngp")
    np.testing.assert_allclose(absolute.mean, Kt @ np.linalg.solve(K + reg * np.eye(6), p["y"]), atol=1e-10)
    # finite t with diag_reg: the regularised kernel is exponentiated
    fin = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"], diag_reg=reg)(3.0, p["xt"], "nngp")
    A = Kt @ np.linalg.solve(K_reg, np.eye(6) - scipy.linalg.expm(-3.0 * K_reg / p["y"].size))
    np.testing.assert_allclose(fin.mean, A @ p["y"], atol=1e-10)


def test_one_dimensional_targets(problem):
    p = problem
    pf = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"][:, 0])
    pf2 = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"][:, :1])
    a, b = pf(None, p["xt"], "ntk"), pf2(None, p["xt"], "ntk")
    assert a.mean.shape == (4,) and b.mean.shape == (4, 1)
    np.testing.assert_allclose(a.mean, b.mean[:, 0], atol=1e-12)
    # the normalisation n = y.size: one output trains twice as fast per unit time as two outputs
    c = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"])(2.0, p["xt"], "ntk")
    d = pf(1.0, p["xt"], "ntk")
    e = predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"][:, 0])(2.0, p["xt"], "ntk")
    np.testing.assert_allclose(c.mean[:, 0], d.mean, atol=1e-12)
    assert np.abs(e.mean - d.mean).max() > 1e-4


# ---------------------------------------------------------------------------
# Scale mixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gaussian(problem):
    p = problem
    return predict.gradient_descent_mse_ensemble(p["kernel_fn"], p["x"], p["y"])(None, p["xt"], "ntk")


def _generic_inverse_gamma(a, b):
    """InvGamma(a, b) as a plain transformed distribution, which the library does not special-case."""
    return dist.TransformedDistribution(dist.Gamma(a, b), PowerTransform(-1.0))


def test_inverse_gamma_is_student_t(gaussian):
    a, b = 2.0, 3.0
    mean, cov = gaussian.mean[:, 0], gaussian.covariance
    law = predict.scale_mixture_predictive(mean, cov, priors.InverseGamma(a, b))
    assert isinstance(law, dist.MultivariateStudentT) and float(law.df) == 2 * a
    np.testing.assert_allclose(law.scale_tril @ law.scale_tril.T, (b / a) * cov, atol=1e-12)
    marg = predict.predictive_marginals(mean, cov, priors.InverseGamma(a, b))
    u = np.asarray(mean) + np.linspace(-3, 3, 7)[:, None] * np.sqrt(np.diag(cov))
    ref = scipy.stats.t(df=2 * a, loc=np.asarray(mean), scale=np.sqrt(b / a * np.diag(cov)))
    # numpyro's laws broadcast a value's sample axes implicitly: one row of u at a time (rank promotion raises)
    np.testing.assert_allclose(np.exp(jax.vmap(marg.log_prob)(u)), ref.pdf(u), rtol=1e-10)
    # the quadrature path, with the same prior given as a generic distribution
    generic = predict.predictive_marginals(mean, cov, _generic_inverse_gamma(a, b))
    assert isinstance(generic, predict.ScaleMixtureNormal1D)
    np.testing.assert_allclose(np.exp(generic.log_prob(u)), ref.pdf(u), rtol=1e-9)
    np.testing.assert_allclose(generic.cdf(u), ref.cdf(u), rtol=1e-9, atol=1e-12)
    closed_cdf = predict.ScaleMixtureNormal1D(mean, np.sqrt(np.diag(cov)), priors.InverseGamma(a, b)).cdf(u)
    np.testing.assert_allclose(closed_cdf, ref.cdf(u), rtol=1e-9)


def test_joint_quadrature_matches_multivariate_t(gaussian):
    a, b = 1.5, 0.7
    mean, cov = gaussian.mean, gaussian.covariance  # two outputs
    L = np.linalg.cholesky(cov)
    # independent reference: vec(F) ~ MVT(2a, vec(mean), (b/a) I_C kron cov), outputs sharing one sigma_v^2
    ref = dist.MultivariateStudentT(2 * a, jnp.asarray(mean.T.ravel()),
                                    jnp.asarray(np.sqrt(b / a) * np.kron(np.eye(2), L)))
    values = np.asarray(mean) + np.random.RandomState(1).standard_t(3, size=(5,) + mean.shape)
    ref_lp = jax.vmap(ref.log_prob)(jnp.asarray(np.swapaxes(values, -1, -2).reshape(5, -1)))
    joint = predict.scale_mixture_predictive(mean, cov, priors.InverseGamma(a, b))
    assert joint.event_shape == (4, 2)
    quad = predict.ScaleMixtureNormal(mean, L, _generic_inverse_gamma(a, b), event_ndim=2)
    np.testing.assert_allclose(joint.log_prob(values), ref_lp, rtol=1e-10)
    np.testing.assert_allclose(quad.log_prob(values), ref_lp, rtol=1e-9)
    # per-column laws: the built-in MVT batch, each the exact marginal of the joint law
    cols = predict.scale_mixture_predictive(mean, cov, priors.InverseGamma(a, b), joint_outputs=False)
    assert isinstance(cols, dist.MultivariateStudentT) and cols.batch_shape == (2,)
    one = dist.MultivariateStudentT(2 * a, jnp.asarray(mean[:, 1]), jnp.asarray(np.sqrt(b / a) * L))
    np.testing.assert_allclose(cols.log_prob(values[0].T)[1], one.log_prob(values[0][:, 1]), rtol=1e-12)


def test_samples_pass_ks_against_student_t(gaussian):
    a, b = 2.0, 2.0
    mean, cov = np.asarray(gaussian.mean[:, 0]), np.asarray(gaussian.covariance)
    L = np.linalg.cholesky(cov)
    n = 4000
    smn = predict.ScaleMixtureNormal(mean, L, priors.InverseGamma(a, b))
    draws = np.asarray(smn.sample(jax.random.PRNGKey(0), (n,)))
    assert draws.shape == (n, 4)
    for i in range(4):
        ref = scipy.stats.t(df=2 * a, loc=mean[i], scale=np.sqrt(b / a * cov[i, i]))
        assert scipy.stats.kstest(draws[:, i], ref.cdf).pvalue > 1e-3
    # power: the same draws are rejected against the Gaussian with the same variance (t_4 vs normal)
    sd = np.sqrt(b / (a - 1) * cov[0, 0])
    assert scipy.stats.kstest(draws[:, 0], scipy.stats.norm(mean[0], sd).cdf).pvalue < 1e-3
    # one scale draw per joint sample: the squared standardised coordinates are correlated across points
    z = np.linalg.solve(L, (draws - mean).T).T
    r = np.corrcoef(z[:, 0] ** 2, z[:, 3] ** 2)[0, 1]
    assert r > 0.1


def test_generic_prior_density_is_normalised_and_consistent():
    prior = priors.BurrXII(2.0, 1.5)
    law = predict.ScaleMixtureNormal1D(jnp.asarray(0.3), jnp.asarray(0.8), prior)
    pdf = lambda u: float(jnp.exp(law.log_prob(jnp.asarray(u))))
    total, _ = scipy.integrate.quad(pdf, -np.inf, np.inf, limit=200)
    assert abs(total - 1.0) < 1e-7
    for u in (-2.0, 0.1, 1.7):
        left, _ = scipy.integrate.quad(pdf, -np.inf, u, limit=200)
        np.testing.assert_allclose(float(law.cdf(jnp.asarray(u))), left, atol=1e-8)
    draws = np.asarray(law.sample(jax.random.PRNGKey(2), (3000,)))
    cdf = lambda v: np.asarray(law.cdf(jnp.asarray(v)))
    assert scipy.stats.kstest(draws, cdf).pvalue > 1e-3
    # a point mass prior gives the Gaussian exactly
    g = predict.ScaleMixtureNormal1D(jnp.asarray(0.3), jnp.asarray(0.8), priors.Delta(2.0))
    np.testing.assert_allclose(g.log_prob(1.0), scipy.stats.norm(0.3, 0.8 * np.sqrt(2)).logpdf(1.0), rtol=1e-12)


def test_delta_prior_is_the_gaussian_ensemble(problem, gaussian):
    p = problem
    pf = predict.gradient_descent_mse_scale_mixture(p["kernel_fn"], p["x"], p["y"][:, 0], priors.Delta(1.7))
    law = pf(None, p["xt"], "ntk")
    assert isinstance(law, dist.MultivariateNormal)
    np.testing.assert_allclose(law.mean, gaussian.mean[:, 0], atol=1e-10)
    np.testing.assert_allclose(law.covariance_matrix, 1.7 * gaussian.covariance, atol=1e-10)
    both = pf(None, p["xt"], ("nngp", "ntk"))
    assert isinstance(both.ntk, dist.MultivariateNormal)
    t_law = predict.gradient_descent_mse_scale_mixture(p["kernel_fn"], p["x"], p["y"][:, 0],
                                                       priors.InverseGamma(2.0, 2.0))(3.0, p["xt"], "nngp")
    assert isinstance(t_law, dist.MultivariateStudentT) and float(t_law.df) == 4.0
    burr = predict.gradient_descent_mse_scale_mixture(p["kernel_fn"], p["x"], p["y"][:, 0],
                                                      priors.BurrXII(2.0, 1.0))(None, p["xt"], "nngp")
    assert isinstance(burr, predict.ScaleMixtureNormal) and np.isfinite(burr.log_prob(burr.mean + 0.1))


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(problem):
    p = problem
    kf, x, y, xt = p["kernel_fn"], p["x"], p["y"], p["xt"]
    with pytest.raises(ValueError, match="6 points but y_train has 5"):
        predict.gradient_descent_mse_ensemble(kf, x, y[:5])
    with pytest.raises(ValueError, match="y_train has 1 non-finite"):
        predict.gradient_descent_mse_ensemble(kf, x, np.where(np.arange(12).reshape(6, 2) == 3, np.nan, y))
    with pytest.raises(ValueError, match="y_train"):
        predict.gradient_descent_mse_ensemble(kf, x, np.float64(1.0))
    with pytest.raises(ValueError, match="learning_rate must be positive"):
        predict.gradient_descent_mse_ensemble(kf, x, y, learning_rate=0.0)
    with pytest.raises(ValueError, match="diag_reg must be non-negative"):
        predict.gradient_descent_mse_ensemble(kf, x, y, diag_reg=-1e-3)
    with pytest.raises(TypeError, match="kernel_fn must be callable"):
        predict.gradient_descent_mse_ensemble("nngp", x, y)
    pf = predict.gradient_descent_mse_ensemble(kf, x, y)
    with pytest.raises(ValueError, match="non-negative"):
        pf(-1.0, xt, "ntk")
    with pytest.raises(ValueError, match="t contains NaN"):
        pf(np.array([1.0, np.nan]), xt, "ntk")
    with pytest.raises(ValueError, match="unknown kernel 'ntkgp'"):
        pf(None, xt, "ntkgp")
    with pytest.raises(ValueError, match="x_test .* must match x_train"):
        pf(None, xt[:, :2], "nngp")
    with pytest.raises(ValueError, match=r"cov must be \(4, 4\)"):
        predict.scale_mixture_predictive(np.zeros(4), np.eye(3), priors.InverseGamma(2.0, 2.0))
    with pytest.raises(ValueError, match="support"):
        predict.scale_mixture_predictive(np.zeros(3), np.eye(3), dist.Normal(0.0, 1.0))
    with pytest.raises(ValueError, match="zero covariance"):
        predict.gradient_descent_mse_scale_mixture(kf, x, y, priors.InverseGamma(2.0, 2.0))(None, None)
