"""Unscaled noise on the matrix-free path (issue 30): ``beta K + noise I = beta (K + s I)`` solved at a grid of shifts
``s`` and interpolated in ``log s`` (`smnngp.shifts`).

Properties: the spline basis reproduces cubics exactly (not-a-knot); with a full-rank preconditioner (exact log-
determinants) the log ML of the Gaussian (one shift, no interpolation) equals the dense eigendecomposition's to 1e-8
relative, and that of importance-sampled priors (inverse gamma, Burr XII) lies within the reported interpolation
error, with ESS, predictive means, variances and joint covariances within 1e-5 relative; with a rank-40
preconditioner (tol 1e-6) the log ML is within 4 reported standard errors (plus the interpolation error); posterior
draws average to the predictive mean within 4 standard errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import kernels, matfree, posterior, priors, shifts

RBF = kernels.rbf(1.0, 1.0)
KW = dict(noise=0.05, noise_model="unscaled", num_samples=3000, key=jax.random.PRNGKey(1))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(160, 3)))
    y = jnp.asarray(np.sin(2 * x[:, :2]) + 0.1 * rng.normal(size=(160, 2)))
    return x, y, jnp.asarray(rng.normal(size=(6, 3)))


def test_spline_basis_reproduces_cubics():
    nodes = np.sort(np.random.default_rng(1).uniform(-3, 2, size=9))
    t = np.linspace(-3.5, 2.5, 40)  # inside and (a little) outside the nodes

    def cubic(u):
        return 0.3 * u**3 - u**2 + 2 * u - 1

    np.testing.assert_allclose(shifts.spline_basis(nodes, t) @ cubic(nodes), cubic(t), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(shifts.spline_basis(nodes[:1], t), np.ones((40, 1)))


@pytest.mark.parametrize("prior", [None, priors.InverseGamma(2.0, 2.0), priors.BurrXII(2.0, 3.0)],
                         ids=["gaussian", "inverse-gamma", "burr"])
def test_matches_the_dense_eigendecomposition(data, prior):
    x, y, xt = data
    dense = posterior.fit(RBF, x, y, prior, method="dense", **KW)
    free = posterior.fit(RBF, x, y, prior, method="cg", cg=matfree.CG(tol=1e-11, precond_rank=160), **KW)
    d = free.diagnostics
    assert free.method == "cg" and type(free) is type(dense)
    gap = abs(free.log_marginal_likelihood - dense.log_marginal_likelihood)
    if prior is None:
        assert d["shift_nodes"] == 1 and gap <= 1e-8 * abs(dense.log_marginal_likelihood)
    else:
        assert d["shift_nodes"] > 12 and gap <= d["interpolation_error"] + 1e-6, (gap, d)
        assert abs(free.ess - dense.ess) <= 1e-3 * dense.ess
    p, q = free.predict(xt), dense.predict(xt)
    np.testing.assert_allclose(p.mean, q.mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(p.variance, q.variance, rtol=1e-5)
    np.testing.assert_allclose(free.predict_covariance(xt), dense.predict_covariance(xt), rtol=1e-5, atol=1e-7)


def test_a_weak_preconditioner_stays_within_its_reported_error(data):
    x, y, _ = data
    prior = priors.InverseGamma(2.0, 2.0)
    dense = posterior.fit(RBF, x, y, prior, method="dense", **KW)
    free = posterior.fit(RBF, x, y, prior, method="cg", cg=matfree.CG(tol=1e-6, precond_rank=40), **KW)
    d = free.diagnostics
    # log ML = ... - (C / 2) log|K + s I| per sample: C = 2 outputs
    bound = 4 * d["logdet_stderr"] + d["interpolation_error"]
    assert abs(free.log_marginal_likelihood - dense.log_marginal_likelihood) <= bound, (d, bound)


def test_draws_average_to_the_predictive_mean(data):
    x, y, xt = data
    free = posterior.fit(RBF, x, y, priors.InverseGamma(2.0, 2.0), method="cg",
                         cg=matfree.CG(tol=1e-10, precond_rank=160), **KW)
    draws = np.asarray(free.sample_f(jax.random.PRNGKey(3), xt[:3], num_samples=300))
    assert draws.shape == (300, 3, 2)
    se = draws.std(0, ddof=1) / np.sqrt(300)
    assert np.all(np.abs(draws.mean(0) - np.asarray(free.predict(xt[:3], noisy=False).mean)) <= 4 * se)
