"""SVGP / SVTP (smnngp.variational) against closed forms and independent references.

References are built here from scratch: the exact GP posterior of `smnngp.posterior` (a different code path: an
eigendecomposition of the full kernel), numpy/scipy densities and quadrature over sigma^2, and a Monte Carlo of the
SVTP's generative model written with numpy.  Float64 (the conftest enables it) unless a test says otherwise.
"""

import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from smnngp import kernels, posterior, priors
from smnngp import variational as V
from smnngp.kernels import softplus_inverse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def np_rbf(x1, x2, ell, var):
    d2 = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1)
    return var * np.exp(-0.5 * d2 / ell**2)


def regression_data(n=15, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(-3, 3, n)[:, None] + 0.05 * rng.normal(size=(n, 1))
    y = np.sin(1.3 * x[:, 0]) + 0.3 * rng.normal(size=n)
    return x, y


def blobs(n_per, num_classes, seed=0, spread=0.6, radius=3.0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(num_classes), n_per)
    ang = 2 * np.pi * y / num_classes
    x = radius * np.stack([np.cos(ang), np.sin(ang)], 1) + spread * rng.normal(size=(y.size, 2))
    perm = rng.permutation(y.size)
    return x[perm], y[perm]


def random_q(model, params, seed, mean_scale=0.7):
    """Params with a random mean and a random (well-conditioned) lower-triangular factor."""
    rng = np.random.default_rng(seed)
    C, M = params.q_mean.shape
    m = mean_scale * rng.normal(size=(C, M))
    if model.q_diag:
        S = 0.3 + rng.uniform(size=(C, M))
    else:
        S = np.tril(0.3 * rng.normal(size=(C, M, M)), -1) + np.stack([np.diag(0.5 + rng.uniform(size=M))] * C)
    return params._replace(q_mean=jnp.asarray(m), q_scale=jnp.asarray(S))


def with_scale(params, a, b, a_min=0.0):
    return params._replace(scale={"a": softplus_inverse(jnp.asarray(a - a_min)), "b": softplus_inverse(jnp.asarray(b))})


# --------------------------------------------------------------------------------------------
# 1. Gaussian SVGP with Z = X at the optimal q(u) is the exact GP


def test_gaussian_svgp_at_optimum_is_the_exact_gp():
    x, y = regression_data()
    xt = np.linspace(-3.5, 3.5, 7)[:, None]
    noise, ell, var = 0.09, 0.8, 1.3
    kern = kernels.rbf(ell, var)
    exact = posterior.fit(kern, x, y, priors.Delta(1.0), noise=noise, noise_model="unscaled")

    model = V.svgp(kern, V.Gaussian(noise), x, jitter=1e-12)  # the default 1e-8 moves extrapolations by ~1e-6
    params = V.init(model)
    # the exact posterior of u = f(X), whitened with L = chol(K): v = L^{-1} u ~ N(L^{-1} mu, L^{-1} Sigma L^{-T})
    K = np_rbf(x, x, ell, var)
    Sigma = K - K @ np.linalg.solve(K + noise * np.eye(len(x)), K)
    mu = K @ np.linalg.solve(K + noise * np.eye(len(x)), y)
    L = np.linalg.cholesky(K + model.jitter * np.mean(np.diag(K)) * np.eye(len(x)))
    m = np.linalg.solve(L, mu)
    Sw = np.linalg.solve(L, np.linalg.solve(L, Sigma).T)
    params = params._replace(q_mean=jnp.asarray(m[None]), q_scale=jnp.asarray(np.linalg.cholesky(Sw)[None]))

    value_and_grad = jax.jit(jax.value_and_grad(lambda p: V.elbo(model, p, (x, y))))
    value = value_and_grad(params)[0]
    lml = exact.log_marginal_likelihood
    assert abs(float(value) - lml) <= 1e-6 * abs(lml), (float(value), lml)
    post = V.as_posterior(model, params, x, y)
    assert abs(float(post.log_marginal_likelihood) - lml) <= 1e-6 * abs(lml)

    # Titsias' optimum of the whitened bound (numpy, A = L^{-1} K_ZX): S = (I + A A^T / s2)^{-1}, m = S A y / s2 is
    # a stationary point of our ELBO in (m, S): the gradient there is tiny relative to a perturbed point's
    A = np.linalg.solve(L, K)
    S_opt = np.linalg.inv(np.eye(len(x)) + A @ A.T / noise)
    opt = params._replace(q_mean=jnp.asarray((S_opt @ A @ y / noise)[None]),
                          q_scale=jnp.asarray(np.linalg.cholesky(S_opt)[None]))
    value, g = value_and_grad(opt)
    assert abs(float(value) - lml) <= 1e-6 * abs(lml)
    g_off = value_and_grad(opt._replace(q_mean=opt.q_mean + 0.1, q_scale=1.1 * opt.q_scale))[1]
    for name in ("q_mean", "q_scale"):
        at, off = (float(jnp.max(jnp.abs(jnp.tril(getattr(t, name))))) for t in (g, g_off))
        assert at < 1e-6 * off, (name, at, off)

    ref_f = exact.predict(xt, noisy=False)
    ref_y = exact.predict(xt, noisy=True)
    q_f = post.predict_f(xt)
    q_y = post.predict(xt)
    for ours, ref in ((q_f, ref_f), (q_y, ref_y)):
        assert isinstance(ours, type(ref))
        np.testing.assert_allclose(ours.mean[:, 0], ref.mean, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(ours.variance[:, 0], ref.variance, rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------------------------
# 2. SVTP KL against quadrature over sigma^2


def _gauss_kl(m0, S0, m1, S1):
    k = len(m0)
    S1i = np.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (np.trace(S1i @ S0) + d @ S1i @ d - k + np.linalg.slogdet(S1)[1] - np.linalg.slogdet(S0)[1])


@pytest.mark.parametrize("q_diag", [False, True])
def test_svtp_kl_against_quadrature(q_diag):
    Z = np.linspace(-1, 1, 3)[:, None]
    alpha, beta, a, b = 2.0, 2.5, 3.1, 1.7
    model = V.svtp(kernels.rbf(), V.Softmax(2), Z, prior=priors.InverseGamma(alpha, beta), q_diag=q_diag)
    params = with_scale(random_q(model, V.init(model), seed=1), a, b)
    m = np.asarray(params.q_mean)
    S = np.asarray(params.q_scale)
    covs = [np.diag(S[c] ** 2) if q_diag else S[c] @ S[c].T for c in range(2)]
    q, p = stats.invgamma(a, scale=b), stats.invgamma(alpha, scale=beta)

    def integrand(t):  # in t = log sigma^2
        s2 = math.exp(t)
        kl_u = sum(_gauss_kl(m[c], s2 * covs[c], np.zeros(3), s2 * np.eye(3)) for c in range(2))
        return q.pdf(s2) * s2 * (q.logpdf(s2) - p.logpdf(s2) + kl_u)

    ref, err = integrate.quad(integrand, -12, 12, epsabs=1e-12, epsrel=1e-11, limit=200)
    assert err < 1e-9
    ours = float(V.kl_divergence(model, params))
    assert abs(ours - ref) <= 1e-8 * abs(ref), (ours, ref)
    # the SVGP's KL: the Gaussian one at sigma^2 = 1
    gmodel = V.svgp(kernels.rbf(), V.Softmax(2), Z, q_diag=q_diag)
    ref_g = sum(_gauss_kl(m[c], covs[c], np.zeros(3), np.eye(3)) for c in range(2))
    assert abs(float(V.kl_divergence(gmodel, params._replace(scale=None))) - ref_g) <= 1e-10 * abs(ref_g)


# --------------------------------------------------------------------------------------------
# 3. SVTP predictive against a Monte Carlo of the generative model


def test_svtp_predictive_matches_generative_monte_carlo():
    ell, var = 0.9, 1.0
    Z = np.linspace(-2, 2, 4)[:, None]
    xt = np.array([[-1.3], [0.4], [2.6]])
    a, b = 5.5, 3.0
    model = V.svtp(kernels.rbf(ell, var), V.Softmax(2), Z, jitter=0.0)
    params = with_scale(random_q(model, V.init(model), seed=2), a, b)
    m, S = np.asarray(params.q_mean), np.tril(np.asarray(params.q_scale))

    # generative model, numpy: sigma^2 ~ q, v | sigma^2 ~ N(m, sigma^2 S S^T), u = L v, f* | u, sigma^2 ~ prior cond.
    rng = np.random.default_rng(0)
    n = 200_000
    Kzz, Ksz, Kss = np_rbf(Z, Z, ell, var), np_rbf(xt, Z, ell, var), np_rbf(xt, xt, ell, var)
    L = np.linalg.cholesky(Kzz)
    P = Ksz @ np.linalg.inv(Kzz)
    Lc = np.linalg.cholesky(Kss - P @ Ksz.T + 1e-12 * np.eye(3))
    s2 = stats.invgamma(a, scale=b).rvs(size=n, random_state=rng)
    f = np.empty((n, 3, 2))
    for c in range(2):
        v = m[c] + np.sqrt(s2)[:, None] * (rng.normal(size=(n, 4)) @ S[c].T)
        f[:, :, c] = (v @ L.T) @ P.T + np.sqrt(s2)[:, None] * (rng.normal(size=(n, 3)) @ Lc.T)

    pf = V.predict_f(model, params, xt)
    assert pf.batch_shape == (3, 2)
    np.testing.assert_allclose(np.broadcast_to(pf.df, (3, 2)), 2 * a)
    se_mean = np.sqrt(np.asarray(pf.variance) / n)
    assert np.all(np.abs(f.mean(0) - np.asarray(pf.mean)) < 5 * se_mean)
    np.testing.assert_allclose(f.var(0), pf.variance, rtol=0.03)  # df = 11: the variance estimate's sd is ~1%
    for i in range(3):
        for c in range(2):
            d = stats.t(2 * a, float(pf.loc[i, c]), float(pf.scale[i, c]))
            assert stats.kstest(f[:, i, c], d.cdf).pvalue > 1e-3

    # joint draws share sigma^2: across two classes (independent given sigma^2) the squared deviations correlate,
    # E[d0^2 d1^2] / (E[d0^2] E[d1^2]) = E[sigma^4] / E[sigma^2]^2 = (a - 1) / (a - 2); it would be 1 per-coordinate
    draws = np.asarray(V.sample_f(model, params, jax.random.PRNGKey(3), xt, num_samples=100_000))
    dv = (draws - np.asarray(pf.mean)) ** 2
    ratio = np.mean(dv[:, 1, 0] * dv[:, 1, 1]) / (np.mean(dv[:, 1, 0]) * np.mean(dv[:, 1, 1]))
    dg = (f - f.mean(0)) ** 2
    ratio_gen = np.mean(dg[:, 1, 0] * dg[:, 1, 1]) / (np.mean(dg[:, 1, 0]) * np.mean(dg[:, 1, 1]))
    assert abs(ratio - (a - 1) / (a - 2)) < 0.08 and abs(ratio_gen - (a - 1) / (a - 2)) < 0.08, (ratio, ratio_gen)
    # and the joint covariance of the draws is (b / (a - 1)) times the covariance at sigma^2 = 1
    cov_gen = np.cov(f[:, :, 0].T)
    np.testing.assert_allclose(np.cov(draws[:, :, 0].T), cov_gen, rtol=0.06, atol=0.02 * np.max(np.diag(cov_gen)))


# --------------------------------------------------------------------------------------------
# 4. Gradients and the minibatch scaling


@pytest.mark.parametrize("kind", ["svgp", "svtp"])
def test_elbo_gradient_matches_finite_differences(kind):
    x, y = regression_data(n=12, seed=3)
    Z = x[::3] + 0.1
    build = V.svgp if kind == "svgp" else V.svtp
    model = build(kernels.rbf(0.9, 1.1), V.Gaussian(0.2), Z, prior=(2.0, 2.0)) if kind == "svtp" else \
        build(kernels.rbf(0.9, 1.1), V.Gaussian(0.2), Z)
    params = random_q(model, V.init(model), seed=4)
    if kind == "svtp":
        params = with_scale(params, 3.0, 1.5, a_min=1.0)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    vg = jax.jit(jax.value_and_grad(lambda v: V.elbo(model, unravel(v), (x, y), num_data=40)))
    g = vg(flat)[1]
    rng = np.random.default_rng(5)
    h = 1e-6
    for _ in range(3):
        d = rng.normal(size=flat.shape)
        fd = (float(vg(flat + h * d)[0]) - float(vg(flat - h * d)[0])) / (2 * h)
        assert abs(float(g @ d) - fd) <= 1e-6 * max(1.0, abs(fd)), (float(g @ d), fd)
    # every group of parameters gets a gradient (kernel, noise, inducing inputs, q, and a, b for the SVTP)
    gp = unravel(g)
    for leaf in jax.tree_util.tree_leaves(gp):
        assert float(jnp.max(jnp.abs(leaf))) > 0


def test_minibatch_elbos_average_to_the_full_elbo():
    x, y = regression_data(n=24, seed=6)
    model = V.svgp(kernels.rbf(0.9, 1.1), V.Gaussian(0.2), x[::4])
    params = random_q(model, V.init(model), seed=7)
    N = len(x)
    elbo = jax.jit(lambda xb, yb: V.elbo(model, params, (xb, yb), num_data=N))
    full = float(elbo(x, y))
    perm = np.random.default_rng(8).permutation(N)
    parts = [float(elbo(x[i], y[i])) for i in perm.reshape(4, 6)]
    assert abs(np.mean(parts) - full) <= 1e-10 * abs(full)
    assert np.std(parts) > 1e-3  # the batches do differ: the equality is the N/B scaling, not a constant


def test_gamma_reparameterised_gradient_is_unbiased():
    """d/da and d/db of the Monte-Carlo mean of sigma^2 = b / Gamma(a, 1) against those of E[sigma^2] = b / (a - 1)."""
    model = V.svtp(kernels.rbf(), V.Softmax(2), np.zeros((2, 1)))
    a, b = 3.5, 1.5
    params = with_scale(V.init(model), a, b)

    def mc_mean(scale):
        return jnp.mean(V._draw_scale(model, params._replace(scale=scale), jax.random.PRNGKey(0), (100_000,)))

    g = jax.grad(mc_mean)(params.scale)
    da, db = jax.nn.sigmoid(params.scale["a"]), jax.nn.sigmoid(params.scale["b"])  # d softplus
    assert abs(float(g["a"]) - (-b / (a - 1) ** 2) * float(da)) < 0.02 * b / (a - 1) ** 2
    assert abs(float(g["b"]) - float(db) / (a - 1)) < 0.02 / (a - 1)


# --------------------------------------------------------------------------------------------
# 5. Training on separable toys


def test_training_softmax_svtp_three_classes():
    x, y = blobs(40, 3, seed=0)
    xv, yv = blobs(20, 3, seed=1)
    Z = V.stratified_inducing(x, y, 6, jax.random.PRNGKey(0))
    model = V.svtp(kernels.rbf(1.0, 1.0), V.Softmax(3), Z, num_mc=8)
    params = V.init(model)
    res = V.fit(model, params, x, y, key=jax.random.PRNGKey(2), batch_size=40, num_steps=300, x_val=xv, y_val=yv,
                eval_every=50, num_val_samples=64, progress=False)
    acc = float(np.mean(np.asarray(res.posterior.predict(xv, num_samples=64).probs).argmax(-1) == yv))
    assert acc >= 0.95
    assert res.best_val_nll < 0.3
    assert res.history[-1]["loss"] < 0.5 * res.history[0]["loss"]
    assert -float(res.posterior.log_marginal_likelihood) / len(x) < res.history[0]["loss"]
    assert [h["step"] for h in res.history] == [50, 100, 150, 200, 250, 300]
    assert res.best_step in [h["step"] for h in res.history]
    assert res.best_val_nll == min(h["val_nll"] for h in res.history)  # the best parameters are the ones kept


def test_training_bernoulli_svgp_two_classes(capsys):
    x, y = blobs(30, 2, seed=2)
    xv, yv = blobs(20, 2, seed=3)
    Z = V.stratified_inducing(x, y, 4, jax.random.PRNGKey(0))
    model = V.svgp(kernels.rbf(1.0, 1.0), V.Bernoulli(), Z, q_diag=True)
    res = V.fit(model, V.init(model), x, y, key=jax.random.PRNGKey(4), batch_size=20, num_steps=300, x_val=xv,
                y_val=yv, eval_every=60, progress=True)
    assert "svgp Bernoulli" in capsys.readouterr().err  # the tqdm bar
    probs = np.asarray(res.posterior.predict(xv).probs)
    assert np.mean(probs.argmax(-1) == yv) >= 0.95
    assert res.best_val_nll < 0.3


# --------------------------------------------------------------------------------------------
# 6. Data-parallel training equals single-device training


def test_sharded_training_equals_unsharded():
    code = textwrap.dedent(
        """
        import os
        # before jax is imported (appended: the suite sets its own XLA flags)
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        os.environ["JAX_PLATFORMS"] = "cpu"  # forced host devices: the CPU backend, also on a GPU machine
        import jax
        import jax.flatten_util
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from smnngp import kernels, variational as V
        assert len(jax.devices()) == 4
        rng = np.random.default_rng(0)
        y = np.repeat(np.arange(3), 16)
        x = np.stack([np.cos(2 * np.pi * y / 3), np.sin(2 * np.pi * y / 3)], 1) * 2 + 0.5 * rng.normal(size=(48, 2))
        # a softmax: the Monte-Carlo normals must not depend on the sharding either
        model = V.svgp(kernels.rbf(1.0, 1.0), V.Softmax(3), V.stratified_inducing(x, y, 5, jax.random.PRNGKey(0)),
                       num_mc=4)
        out = []
        for devices in (None, jax.devices()[:1]):
            res = V.fit(model, V.init(model), x, y, key=jax.random.PRNGKey(1), batch_size=16, num_steps=12,
                        eval_every=6, x_val=x[:12], y_val=y[:12], num_val_samples=8, devices=devices,
                        progress=False)
            out.append(res)
        a, b = (jax.flatten_util.ravel_pytree(r.params)[0] for r in out)
        print("NDEV", len(out[0].params.q_mean.sharding.device_set), len(out[1].params.q_mean.sharding.device_set))
        print("MAXDIFF", float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
        print("VAL", out[0].history[-1]["val_nll"], out[1].history[-1]["val_nll"])
        start = jax.flatten_util.ravel_pytree(V.init(model))[0]
        print("MOVED", float(np.max(np.abs(np.asarray(a) - np.asarray(start)))))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["NDEV"] == "4 1"  # the default used the 4-device mesh
    assert float(lines["MAXDIFF"]) < 1e-9
    v1, v2 = (float(v) for v in lines["VAL"].split())
    assert abs(v1 - v2) < 1e-9
    assert float(lines["MOVED"]) > 1e-3


# --------------------------------------------------------------------------------------------
# Float32 end to end


def test_float32_follows_the_inputs():
    x, y = regression_data(n=20, seed=9)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    model = V.svgp(kernels.rbf(0.9, 1.0), V.Gaussian(0.1), x32[::4])
    params = V.init(model)
    assert params.q_mean.dtype == jnp.float32 and params.q_scale.dtype == jnp.float32
    res = V.fit(model, params, x32, y32, key=jax.random.PRNGKey(0), batch_size=10, num_steps=60, progress=False)
    assert res.params.q_mean.dtype == jnp.float32
    p = res.posterior.predict(x32)
    assert p.mean.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(p.variance)))
    assert float(res.posterior.log_marginal_likelihood) > float(V.as_posterior(model, params, x32, y32)
                                                                .log_marginal_likelihood) + 5


# --------------------------------------------------------------------------------------------
# 7. Bad input


def test_errors_name_the_argument():
    x, y = blobs(5, 3)
    Z = x[:4]
    k = kernels.rbf()
    with pytest.raises(ValueError, match="noise"):
        V.Gaussian(0.0)
    with pytest.raises(ValueError, match="noise"):
        V.Gaussian(-1.0)
    with pytest.raises(ValueError, match="num_classes"):
        V.Softmax(1)
    with pytest.raises(ValueError, match="inducing_inputs"):
        V.svgp(k, V.Softmax(3), np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="kernel"):
        V.svgp(lambda a, b: jnp.ones((a.shape[0],)), V.Softmax(3), Z)
    with pytest.raises(ValueError, match="kernel must be traceable"):
        V.svgp(lambda a, b: jnp.asarray(np_rbf(np.asarray(a), np.asarray(b), 1.0, 1.0)), V.Softmax(3), Z)
    with pytest.raises(ValueError, match="num_latent"):
        V.svgp(k, V.Softmax(3), Z, num_latent=2)
    with pytest.raises(ValueError, match="prior"):
        V.svtp(k, V.Softmax(3), Z, prior=(2.0, -1.0))
    model = V.svgp(k, V.Softmax(3), Z)
    params = V.init(model)
    with pytest.raises(ValueError, match=r"y .*outside 0\.\.2"):
        V.elbo(model, params, (x, y + 1), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="batch y .*outside 0\\.\\.2"):
        V.elbo(model, params, (x, y - 1), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="batch x .*NaN"):
        V.elbo(model, params, (np.where(np.arange(15)[:, None] == 3, np.nan, x), y), jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="x must have shape"):
        V.predict(model, params, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="key is required"):
        V.elbo(model, params, (x, y))
    with pytest.raises(ValueError, match="y .*outside"):
        V.fit(model, params, x, y + 3, key=jax.random.PRNGKey(0), batch_size=5, progress=False)
    with pytest.raises(ValueError, match="x_val .*NaN"):
        V.fit(model, params, x, y, key=jax.random.PRNGKey(0), batch_size=5, x_val=np.full((2, 2), np.nan),
              y_val=[0, 1], progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        V.fit(model, params, x, y, key=jax.random.PRNGKey(0), batch_size=100, progress=False)
    big = V.svgp(k, V.Softmax(3), np.concatenate([x, x[:2]]))
    with pytest.raises(ValueError, match="M=17 .*N=15"):
        V.fit(big, V.init(big), x, y, key=jax.random.PRNGKey(0), batch_size=5, progress=False)
    with pytest.raises(ValueError, match="num_inducing=16 exceeds"):
        V.stratified_inducing(x, y, 16, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="y must have shape"):
        V.stratified_inducing(x, y[:3], 4, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="y .*integer"):
        V.elbo(model, params, (x, y + 0.5), jax.random.PRNGKey(0))
    g = V.svgp(k, V.Gaussian(0.1, num_outputs=2), Z)
    with pytest.raises(ValueError, match=r"y must have shape \(N,\) or \(N, 2\)"):
        V.elbo(g, V.init(g), (x, np.zeros(15)))


def test_stratified_inducing_keeps_class_proportions():
    y = np.array([0] * 30 + [1] * 60 + [2] * 10)
    x = np.arange(100.0)[:, None]
    Z = np.asarray(V.stratified_inducing(x, y, 10, jax.random.PRNGKey(0)))[:, 0].astype(int)
    assert len(set(Z)) == 10
    assert np.bincount(y[Z], minlength=3).tolist() == [3, 6, 1]
    Z2 = np.asarray(V.stratified_inducing(x, y, 10, jax.random.PRNGKey(1)))[:, 0]
    assert not np.array_equal(np.sort(Z), np.sort(Z2))


def test_fixed_kernels_are_accepted():
    """A stax triple and its kernel_fn are fixed kernels; a plain k(x1, x2) RBF gives the ELBO of kernels.rbf()."""
    from smnngp import stax

    x, y = regression_data(n=10)
    triple = stax.serial(stax.Dense(1, W_std=1.5, b_std=0.1), stax.Erf(), stax.Dense(1))
    for k in (triple, triple[2]):
        model = V.svgp(k, V.Gaussian(0.1), x[::3])
        assert model.train_kernel is False and V.init(model).kernel is None
    values = []
    for k in (lambda a, b: jnp.exp(-0.5 * ((a[:, None] - b[None]) ** 2).sum(-1)), kernels.rbf(1.0, 1.0)):
        model = V.svgp(k, V.Gaussian(0.1), x[::3])
        values.append(float(V.elbo(model, random_q(model, V.init(model), seed=0), (x, y))))
    assert abs(values[0] - values[1]) < 1e-9 * abs(values[1])


def test_posterior_is_a_pytree_usable_under_jit():
    x, y = regression_data(n=10)
    model = V.svgp(kernels.rbf(), V.Gaussian(0.1), x[::2])
    post = V.as_posterior(model, random_q(model, V.init(model), seed=0), x, y)
    leaves, tree = jax.tree_util.tree_flatten(post)
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)
    mean = jax.jit(lambda p, xs: p.predict(xs).mean)(post, jnp.asarray(x))
    np.testing.assert_allclose(mean, post.predict(x).mean, rtol=1e-12)
    with pytest.raises(AttributeError):
        post.params = None


def test_optimal_gaussian_q_at_z_equal_x_is_the_exact_gp_and_refuses_other_models():
    """Titsias' optimum at Z = X reproduces the exact GP (mean, latent variance, ELBO = log ML, up to the jitter on
    K_ZZ); an SVTP, a classifier or diagonal factors are refused (their optimum is not this closed form)."""
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.normal(size=(40, 2)))
    y = jnp.sin(x[:, 0]) + 0.1 * jnp.asarray(rng.normal(size=40))
    xt = jnp.asarray(rng.normal(size=(7, 2)))
    kernel = kernels.rbf(1.5, 1.0)
    model = V.svgp(kernel, V.Gaussian(0.05, trainable=False), x, train_inducing=False, train_kernel=False,
                   jitter=1e-12)
    params = V.optimal_gaussian_q(model, V.init(model), x, y)
    c = np.asarray(kernel(x, x)) + 0.05 * np.eye(40)
    ks = np.asarray(kernel(xt, x))
    mean = ks @ np.linalg.solve(c, np.asarray(y))
    var = 1.0 - np.sum(ks * np.linalg.solve(c, ks.T).T, axis=1)
    lml = (-0.5 * np.asarray(y) @ np.linalg.solve(c, np.asarray(y)) - 0.5 * np.linalg.slogdet(c)[1]
           - 20 * np.log(2 * np.pi))
    pf = V.predict_f(model, params, xt)
    assert np.max(np.abs(np.asarray(pf.mean[:, 0]) - mean)) < 1e-6
    assert np.max(np.abs(np.asarray(pf.variance[:, 0]) - var)) < 1e-6
    assert abs(float(V.elbo(model, params, (x, y))) - lml) < 1e-5 * abs(lml)
    # not the optimum any more after one more step away from it: the ELBO drops
    worse = params._replace(q_mean=params.q_mean * 1.01)
    assert float(V.elbo(model, worse, (x, y))) < float(V.elbo(model, params, (x, y)))
    for other in (V.svtp(kernel, V.Gaussian(0.05), x), V.svgp(kernel, V.Bernoulli(), x),
                  V.svgp(kernel, V.Gaussian(0.05), x, q_diag=True)):
        with pytest.raises(ValueError, match="closed-form optimum"):
            V.optimal_gaussian_q(other, V.init(other), x, y)
