"""Scale priors (smnngp.priors) and the kernel linear algebra (smnngp.linalg) against scipy/numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import linalg as sla
from scipy import stats

from smnngp import linalg, priors

BURR_PARAMS = [(2.0, 1.0), (0.5, 3.0), (3.0, 0.4), (1.3, 2.2)]


def _points(c, k):
    """Evaluation points spread over the bulk and both tails of burr12(c, k)."""
    return stats.burr12(c, k).ppf(np.array([1e-6, 1e-3, 0.05, 0.3, 0.5, 0.8, 0.99, 0.999999]))


# ------------------------------------------------------------------------------------------------
# Burr XII


@pytest.mark.parametrize("c,k", BURR_PARAMS)
def test_burr_log_prob_cdf_icdf_match_scipy(c, k):
    d = priors.BurrXII(c, k)
    x = _points(c, k)
    np.testing.assert_allclose(np.asarray(d.log_prob(jnp.asarray(x))), stats.burr12.logpdf(x, c, k), rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(np.asarray(d.cdf(jnp.asarray(x))), stats.burr12.cdf(x, c, k), rtol=1e-9, atol=1e-14)
    q = np.array([1e-9, 1e-4, 0.1, 0.5, 0.9, 0.9999])
    np.testing.assert_allclose(np.asarray(d.icdf(jnp.asarray(q))), stats.burr12.ppf(q, c, k), rtol=1e-9)


@pytest.mark.parametrize("c,k", BURR_PARAMS)
def test_burr_mean_variance_match_scipy(c, k):
    d = priors.BurrXII(c, k)
    if c * k > 1:
        np.testing.assert_allclose(float(d.mean), stats.burr12.mean(c, k), rtol=1e-9)
    else:
        assert float(d.mean) == np.inf
    if c * k > 2:
        np.testing.assert_allclose(float(d.variance), stats.burr12.var(c, k), rtol=1e-8)
    else:
        assert float(d.variance) == np.inf


@pytest.mark.parametrize("c,k", BURR_PARAMS)
def test_burr_samples_ks(c, k):
    x = np.asarray(priors.BurrXII(c, k).sample(jax.random.PRNGKey(3), (4000,)))
    assert x.shape == (4000,)
    assert np.all(np.isfinite(x)) and np.all(x > 0)
    assert stats.kstest(x, stats.burr12(c, k).cdf).pvalue > 1e-3


def test_burr_sample_gradients_are_reparameterised():
    key = jax.random.PRNGKey(7)

    def total(c, k):
        return jnp.sum(jnp.log(priors.BurrXII(c, k).sample(key, (64,))))

    gc, gk = jax.grad(total, argnums=(0, 1))(1.7, 2.5)
    assert np.isfinite(float(gc)) and np.isfinite(float(gk))
    assert float(gc) != 0.0 and float(gk) != 0.0
    # The draw is a deterministic function of (c, k) for a fixed key: central differences are the reference.
    h = 1e-6
    fd_c = (float(total(1.7 + h, 2.5)) - float(total(1.7 - h, 2.5))) / (2 * h)
    fd_k = (float(total(1.7, 2.5 + h)) - float(total(1.7, 2.5 - h))) / (2 * h)
    np.testing.assert_allclose(float(gc), fd_c, rtol=1e-5)
    np.testing.assert_allclose(float(gk), fd_k, rtol=1e-5)


def test_burr_batched_and_bad_parameters():
    d = priors.BurrXII(jnp.array([1.0, 2.0, 3.0]), 2.0)
    assert d.batch_shape == (3,)
    assert d.sample(jax.random.PRNGKey(0), (5,)).shape == (5, 3)
    for c, k in [(0.0, 1.0), (1.0, -2.0), (np.nan, 1.0), (1.0, np.inf)]:
        with pytest.raises(ValueError, match="BurrXII"):
            priors.BurrXII(c, k)


# ------------------------------------------------------------------------------------------------
# Inverse gamma and Delta


@pytest.mark.parametrize("a,b", [(2.0, 3.0), (0.6, 0.2), (7.5, 11.0)])
def test_inverse_gamma_matches_scipy(a, b):
    d = priors.InverseGamma(a, b)
    ref = stats.invgamma(a, scale=b)
    x = ref.ppf(np.array([1e-5, 0.01, 0.3, 0.5, 0.7, 0.99, 1 - 1e-5]))
    np.testing.assert_allclose(np.asarray(d.log_prob(jnp.asarray(x))), ref.logpdf(x), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(d.cdf(jnp.asarray(x))), ref.cdf(x), rtol=1e-8, atol=1e-12)
    if a > 1:
        np.testing.assert_allclose(float(d.mean), ref.mean(), rtol=1e-12)
    if a > 2:
        np.testing.assert_allclose(float(d.variance), ref.var(), rtol=1e-12)
    s = np.asarray(d.sample(jax.random.PRNGKey(1), (200_000,)))  # same shape as test_posterior: one compile
    assert stats.kstest(s, ref.cdf).pvalue > 1e-3
    assert priors.is_inverse_gamma(d)
    a2, b2 = priors.inverse_gamma_params(d)
    assert float(a2) == a and float(b2) == b


@pytest.mark.parametrize("a,b", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (np.nan, 1.0)])
def test_inverse_gamma_bad_parameters(a, b):
    with pytest.raises(ValueError, match="InverseGamma"):
        priors.InverseGamma(a, b)


def test_delta():
    d = priors.Delta(2.5)
    assert priors.is_delta(d)
    np.testing.assert_array_equal(np.asarray(d.sample(jax.random.PRNGKey(0), (4,))), np.full(4, 2.5))
    assert float(d.mean) == 2.5 and float(d.variance) == 0.0
    for bad in [0.0, -1.0, np.nan, np.inf]:
        with pytest.raises(ValueError, match="Delta"):
            priors.Delta(bad)


# ------------------------------------------------------------------------------------------------
# as_prior


@pytest.mark.parametrize(
    "prior",
    [dist.HalfCauchy(1.0), dist.LogNormal(0.0, 1.0), dist.Gamma(2.0, 1.0), dist.Exponential(2.0), dist.HalfNormal(1.0),
     dist.TransformedDistribution(dist.Gamma(2.0, 3.0), [dist.transforms.PowerTransform(-1.0)]),
     priors.BurrXII(2.0, 1.0), priors.InverseGamma(2.0, 2.0),
     dist.TransformedDistribution(priors.BurrXII(2.0, 1.0), [dist.transforms.AffineTransform(0.0, 3.0)]),
     dist.TransformedDistribution(dist.Gamma(2.0, 1.0), [dist.transforms.PowerTransform(0.5)])],
    ids=lambda p: type(p).__name__,
)
def test_as_prior_accepts_positive_distributions(prior):
    assert priors.as_prior(prior) is prior


def test_as_prior_numbers_and_none():
    d = priors.as_prior(None)
    assert priors.is_delta(d) and float(d.v) == 1.0
    d = priors.as_prior(3)
    assert priors.is_delta(d) and float(d.v) == 3.0
    d = priors.as_prior(0.25)
    assert priors.is_delta(d) and float(d.v) == 0.25
    for bad in [0, -1.0, float("nan")]:
        with pytest.raises(ValueError, match="positive"):
            priors.as_prior(bad)


@pytest.mark.parametrize(
    "prior,exc,match",
    [
        (dist.Normal(0.0, 1.0), ValueError, "support"),
        (dist.Uniform(-1.0, 1.0), ValueError, "support"),
        (dist.StudentT(3.0), ValueError, "support"),
        ("inverse_gamma", TypeError, "numpyro distribution"),
        (stats.invgamma(2.0), TypeError, "numpyro distribution"),
        (True, TypeError, "numpyro distribution"),
        (dist.Gamma(jnp.ones(3), 1.0), ValueError, "scalar distribution"),
        (dist.Delta(jnp.array(0.0)), ValueError, "positive"),
        (dist.Delta(jnp.array(-2.0)), ValueError, "positive"),
        (dist.TransformedDistribution(dist.Gamma(2.0, 1.0), [dist.transforms.AffineTransform(-1.0, 1.0)]), ValueError,
         "support"),
        (dist.TransformedDistribution(dist.Gamma(2.0, 1.0), [dist.transforms.AffineTransform(0.0, -2.0)]), ValueError,
         "support"),
        (dist.TransformedDistribution(dist.Normal(0.0, 1.0), [dist.transforms.AffineTransform(1.0, 2.0)]), ValueError,
         "support"),
    ],
    ids=["normal", "uniform-1-1", "studentt", "string", "scipy", "bool", "batched", "delta0", "delta-neg", "shift-neg",
         "scale-neg", "normal-affine"],
)
def test_as_prior_rejects(prior, exc, match):
    with pytest.raises(exc, match=match):
        priors.as_prior(prior)


# ------------------------------------------------------------------------------------------------
# linalg


def _random_pd(n, seed, cond=1e3):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    lam = np.geomspace(1.0, 1.0 / cond, n)
    A = (Q * lam) @ Q.T
    return 0.5 * (A + A.T), Q


def test_cholesky_exact_for_pd():
    A, _ = _random_pd(12, 0)
    chol = linalg.cholesky(jnp.asarray(A))
    assert chol.jitter == 0.0
    np.testing.assert_allclose(np.asarray(chol.L), np.linalg.cholesky(A), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ones", "duplicates", "low_rank"])
def test_cholesky_jitter_escalation_on_singular_psd(kind):
    rng = np.random.default_rng(1)
    if kind == "ones":
        A = np.ones((6, 6))
    elif kind == "duplicates":
        x = rng.normal(size=(10, 2))
        x = np.concatenate([x, x[:4]])
        A = np.exp(-0.5 * ((x[:, None] - x[None]) ** 2).sum(-1))
    else:
        B = rng.normal(size=(15, 3))
        A = B @ B.T
    chol = linalg.cholesky(jnp.asarray(A), name="singular thing")
    md = np.mean(np.diag(A))
    L = np.asarray(chol.L)
    assert np.all(np.isfinite(L))
    assert 0.0 <= chol.jitter <= 1e-8 * md
    if kind == "ones":  # the exact factorisation hits a zero pivot, so jitter must have been added
        assert chol.jitter > 0
    assert np.all(np.diag(L) > 0)
    np.testing.assert_allclose(L @ L.T, A + chol.jitter * np.eye(len(A)), atol=1e-12 * md)


def test_cholesky_indefinite_raises_naming_matrix():
    _, Q = _random_pd(8, 2)
    A = (Q * np.array([-1.0, 1, 2, 3, 4, 5, 6, 7])) @ Q.T
    A = 0.5 * (A + A.T)
    with pytest.raises(linalg.NotPositiveDefiniteError, match=r"my special matrix.*smallest eigenvalue -1"):
        linalg.cholesky(jnp.asarray(A), name="my special matrix")
    # also a LinAlgError, so generic handlers catch it
    with pytest.raises(np.linalg.LinAlgError):
        linalg.cholesky(jnp.asarray(A))
    with pytest.raises(linalg.NotPositiveDefiniteError, match="mean diagonal"):
        linalg.cholesky(-jnp.eye(3), name="neg")


def test_cholesky_rejects_bad_input():
    A, _ = _random_pd(5, 3)
    B = A.copy()
    B[0, 1] += 0.1
    with pytest.raises(ValueError, match="symm matrix is not symmetric"):
        linalg.cholesky(jnp.asarray(B), name="symm matrix")
    # the check can be switched off (then the lower triangle is used)
    L = linalg.cholesky(jnp.asarray(B), check_symmetric=False).L
    assert np.all(np.isfinite(np.asarray(L)))
    for bad in [np.nan, np.inf]:
        C = A.copy()
        C[2, 2] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            linalg.cholesky(jnp.asarray(C), name="nonfinite")
    with pytest.raises(ValueError, match="square"):
        linalg.cholesky(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="square"):
        linalg.cholesky(jnp.ones(3))
    with pytest.raises(ValueError, match="empty"):
        linalg.cholesky(jnp.ones((0, 0)))


def test_eigh_psd_clips_tiny_negatives_and_rejects_indefinite():
    _, Q = _random_pd(7, 4)
    lam = np.array([-1e-15, 0.0, 1e-3, 0.5, 1.0, 2.0, 3.0])
    A = (Q * lam) @ Q.T
    A = 0.5 * (A + A.T)
    lam_c, U = linalg.eigh_psd(jnp.asarray(A))
    lam_c, U = np.asarray(lam_c), np.asarray(U)
    assert np.all(lam_c >= 0)
    np.testing.assert_allclose(np.sort(lam_c), np.clip(np.sort(np.linalg.eigvalsh(A)), 0, None), atol=1e-13)
    np.testing.assert_allclose((U * lam_c) @ U.T, A, atol=1e-12)
    np.testing.assert_allclose(U.T @ U, np.eye(7), atol=1e-12)
    A_bad = (Q * np.array([-1.0, 0, 1, 1, 1, 1, 1])) @ Q.T
    with pytest.raises(linalg.NotPositiveDefiniteError, match="the kernel.*not positive semi-definite"):
        linalg.eigh_psd(jnp.asarray(0.5 * (A_bad + A_bad.T)), name="the kernel")
    with pytest.raises(ValueError, match="NaN"):
        linalg.eigh_psd(jnp.full((3, 3), jnp.nan))


def test_solves_and_logdet_match_numpy():
    A, _ = _random_pd(9, 5, cond=1e4)
    rng = np.random.default_rng(6)
    B = rng.normal(size=(9, 3))
    L = linalg.cholesky(jnp.asarray(A)).L
    np.testing.assert_allclose(np.asarray(linalg.cho_solve(L, jnp.asarray(B))), np.linalg.solve(A, B), rtol=1e-8,
                               atol=1e-10)
    np.testing.assert_allclose(float(linalg.logdet(L)), np.linalg.slogdet(A)[1], rtol=1e-12)
    Ln = np.asarray(L)
    np.testing.assert_allclose(np.asarray(linalg.solve_triangular(L, jnp.asarray(B))),
                               sla.solve_triangular(Ln, B, lower=True), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(linalg.solve_triangular(L, jnp.asarray(B), trans=True)),
                               np.linalg.solve(Ln.T, B), rtol=1e-8, atol=1e-10)


def test_cholesky_jittered_is_traceable():
    A, _ = _random_pd(6, 8)

    def f(s):
        return jnp.sum(jnp.log(jnp.diag(linalg.cholesky_jittered(s * jnp.asarray(A), 1e-10))))

    L = np.asarray(jax.jit(lambda s: linalg.cholesky_jittered(s * jnp.asarray(A), 1e-10))(2.0))
    j = 1e-10 * 2.0 * np.mean(np.diag(A))
    np.testing.assert_allclose(L @ L.T, 2.0 * A + j * np.eye(6), atol=1e-12)
    # d/ds of (1/2) log det(s A + j s I) = n / (2 s)
    np.testing.assert_allclose(float(jax.grad(f)(2.0)), 6 / (2 * 2.0), rtol=1e-8)


def test_blas_threads_limits_and_restores():
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas_threads()
    with linalg.blas_threads(1):
        assert all(n == 1 for n in blas_threads())
        L = linalg.cholesky_jittered(jnp.eye(3) * 4.0)
    assert blas_threads() == before
    assert float(L[0, 0]) == pytest.approx(2.0)
    with linalg.blas_threads(None):  # None leaves them alone
        assert blas_threads() == before


def test_whiten_value_and_gradients_match_autodiff_of_cholesky():
    """`linalg.whiten`'s hand-written reverse rule equals JAX's own rules chained through Cholesky and the solve,
    for a loss that uses A nonlinearly, and passes a finite-difference check (float64)."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(3)
    M, B = 7, 5
    R = rng.standard_normal((M, M))
    K = jnp.asarray(R @ R.T / M + 0.5 * np.eye(M))
    Bx = jnp.asarray(rng.standard_normal((M, B)))
    W = jnp.asarray(rng.standard_normal((M, B)))

    def loss(w, K, Bx):
        A = w(K, Bx)
        return jnp.sum(jnp.sin(A) * W) + jnp.sum(A**2) ** 0.5

    reference = lambda K, Bx: jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(K), Bx, lower=True)  # noqa: E731
    np.testing.assert_allclose(linalg.whiten(K, Bx), reference(K, Bx), rtol=1e-12, atol=1e-12)
    g_ours = jax.grad(lambda K, Bx: loss(linalg.whiten, K, Bx), argnums=(0, 1))(K, Bx)
    g_ref = jax.grad(lambda K, Bx: loss(reference, K, Bx), argnums=(0, 1))(K, Bx)
    # JAX's Cholesky rule symmetrises its input tangent, so the K-cotangents are both symmetric
    np.testing.assert_allclose(g_ours[0], g_ref[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(g_ours[1], g_ref[1], rtol=1e-9, atol=1e-11)
    # along symmetric directions of K (a kernel matrix only moves symmetrically)
    sym = lambda K: 0.5 * (K + K.T)  # noqa: E731
    check_grads(lambda K, Bx: loss(linalg.whiten, sym(K), Bx), (K, Bx), order=1, modes=["rev"], eps=1e-6)
