"""``posterior.fit(method='mixed')``: a float32 factor refined to float64 by conjugate gradients (issue 30).

Properties: for every scaled-noise posterior (Gaussian, Student-t, importance-sampled), an RBF kernel and a stax MLP
NNGP, the mixed fit's solves, predictive means and variances equal the float64 dense fit's to 1e-8 relative (the CG
tolerance 1e-10, with float64 products), and its log marginal likelihood is within 4 of its reported standard errors
of the dense one, that standard error at most 1e-5 per training point; the standard error falls with the probes as
Hutchinson's 1/sqrt(probes); a kernel that needs jitter in float32 still gives the float64 answer (the jitter only
preconditions); ``'auto'`` takes 'mixed' exactly when the float64 matrix does not fit and the float32 one does; bad
requests are named. (XLA's plan of the float32 build + factorisation, under 0.9 float64 matrices, is asserted in
test_dense_lean.py.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import kernels, matfree, posterior, priors, stax

RBF = kernels.rbf(1.1, 0.9)
MLP = stax.serial(stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(64, W_std=1.5), stax.Relu(),
                  stax.Dense(1))[2]
PRIORS = {"gaussian": None, "student-t": priors.InverseGamma(2.0, 2.0), "importance": priors.BurrXII(2.0, 3.0)}


def _data(n=240, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(n, d)))
    y = jnp.asarray(np.sin(2 * x[:, :1]) + 0.1 * rng.normal(size=(n, 1)))
    return x, y, jnp.asarray(rng.normal(size=(13, d)))


@pytest.mark.parametrize("kernel", [RBF, MLP], ids=["rbf", "mlp"])
@pytest.mark.parametrize("kind", list(PRIORS))
def test_mixed_equals_dense_float64(kernel, kind):
    x, y, xt = _data()
    key = jax.random.PRNGKey(1)
    kw = dict(noise=1e-3, num_samples=2000, key=key, proposal="likelihood" if kind == "importance" else "prior")
    dense = posterior.fit(kernel, x, y, PRIORS[kind], method="dense", **kw)
    mixed = posterior.fit(kernel, x, y, PRIORS[kind], method="mixed", **kw)
    d = mixed.diagnostics
    assert mixed.method == "mixed" and d["precond"] == "float32 Cholesky" and d["cg_residual"] <= 1e-10
    assert d["cg_iterations"] <= 20
    np.testing.assert_allclose(mixed._state["alpha"], dense._state["alpha"], rtol=1e-8,
                               atol=1e-8 * float(jnp.max(jnp.abs(dense._state["alpha"]))))
    se = d["logdet_stderr"] / 2  # log ML = -log|C| / 2 + ...
    gap = abs(mixed.log_marginal_likelihood - dense.log_marginal_likelihood)
    assert gap <= 4 * se + 1e-9 and se <= 1e-5 * x.shape[0], (gap, se)  # error per training point <= 1e-5
    p, q = mixed.predict(xt), dense.predict(xt)
    np.testing.assert_allclose(p.mean, q.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(p.variance, q.variance, rtol=1e-7)


def test_logdet_error_falls_with_the_probes():
    x, y, _ = _data(n=300)
    exact = posterior.fit(RBF, x, y, noise=1e-3, method="dense")._state["logdet"]
    se, err = [], []
    for probes in (4, 64):
        post = posterior.fit(RBF, x, y, noise=1e-3, method="mixed", cg=matfree.CG(tol=1e-10, num_probes=probes))
        se.append(post.diagnostics["logdet_stderr"])
        err.append(abs(float(post._state["logdet"] - exact)))
    # Hutchinson: 16x the probes, a quarter of the standard error (spread of the estimate itself: within 2x)
    assert 0.125 < se[1] / se[0] < 0.5, se
    assert err[1] <= 4 * se[1], (err, se)


def test_jitter_in_float32_only_preconditions():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(150, 2))
    x = jnp.asarray(np.concatenate([x, x[:30] + 1e-5]))  # near-duplicates: float32 cannot factorise K + 1e-9 I
    y = jnp.sin(x[:, 0])
    dense = posterior.fit(RBF, x, y, noise=1e-9, method="dense")
    mixed = posterior.fit(RBF, x, y, noise=1e-9, method="mixed", cg=matfree.CG(tol=1e-10, max_iter=400))
    assert mixed.diagnostics["precond_jitter"] > 0 and dense.jitter == 0.0
    xt = jnp.asarray(rng.normal(size=(5, 2)))
    np.testing.assert_allclose(mixed.predict(xt, noisy=False).mean, dense.predict(xt, noisy=False).mean,
                               rtol=1e-6, atol=1e-8)


def test_auto_takes_mixed_when_only_float32_fits(monkeypatch):
    x, y, _ = _data(n=100)
    copies = posterior.dense_copies()
    f64 = copies * 100 * 100 * 8
    monkeypatch.setattr(matfree, "available_memory_bytes", lambda device=None: int(0.75 * f64))
    assert posterior.fit(RBF, x, y, noise=1e-2).method == "mixed"
    monkeypatch.setattr(matfree, "available_memory_bytes", lambda device=None: int(0.4 * f64))
    assert posterior.fit(RBF, x, y, noise=1e-2).method == "cg"
    with pytest.raises(MemoryError, match="method='mixed' needs about"):
        posterior.fit(RBF, x, y, noise=1e-2, method="mixed")


def test_bad_requests_are_named():
    x, y, _ = _data(n=50)
    with pytest.raises(ValueError, match="inputs are float32"):
        posterior.fit(RBF, x.astype(jnp.float32), y.astype(jnp.float32), noise=0.1, method="mixed")
    with pytest.raises(ValueError, match="noise_model='scaled'"):
        posterior.fit(RBF, x, y, priors.InverseGamma(2.0, 2.0), noise=0.1, noise_model="unscaled", method="mixed")
    with pytest.raises(ValueError, match="needs noise > 0"):
        posterior.fit(RBF, x, y, noise=0.0, method="mixed")

    def eager(x1, x2=None):
        a = np.asarray(x1)
        b = a if x2 is None else np.asarray(x2)
        return jnp.asarray(np.exp(-0.5 * ((a[:, None] - b[None]) ** 2).sum(-1)))

    with pytest.raises(TypeError, match="must be traceable"):
        posterior.fit(eager, x, y, noise=0.1, method="mixed")
    with pytest.raises(ValueError, match="'auto', 'dense', 'mixed' or 'cg'"):
        posterior.fit(RBF, x, y, noise=0.1, method="float32")
