"""The matrix-free path (`smnngp.matfree`, ``posterior.fit(..., method='cg')``) against the dense one.

Properties: tiled products equal the dense matrix product to rounding (any tile size, N not a multiple of it);
CG solves reach their tolerance; the stochastic log-determinant lies within a few of its reported standard
errors of the exact one and its error shrinks as 1/sqrt(probes); every scaled-noise posterior fitted matrix-free
equals the dense fit (log ML within 1e-6 relative, predictions within 1e-6) for an RBF kernel and a CNN NNGP;
rows spread over 4 forced host devices give the unsharded numbers; bad input gets a clear error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import kernels, matfree, posterior, priors, stax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(203, 3))
    y = np.sin(2 * x[:, :1]) + 0.1 * rng.normal(size=(203, 1))
    return x, y


def _dense(kernel, x, shift):
    return np.asarray(kernel(jnp.asarray(x), None)) + shift * np.eye(x.shape[0])


MLP = posterior.as_kernel_callable(stax.serial(stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(1))[2])


@pytest.mark.parametrize("tile", [32, 64, 203, None])
def test_tiled_product_and_diagonal_equal_the_dense_matrix(data, tile):
    x, _ = data
    v = np.random.default_rng(1).normal(size=(x.shape[0], 3))
    for kernel in (kernels.rbf(0.7, 1.3), MLP):
        op = matfree.KernelOperator(kernel, x, 0.05, tile_size=tile)
        K = _dense(kernel, x, 0.05)
        np.testing.assert_allclose(np.asarray(op.matmul(v)), K @ v, rtol=1e-12, atol=1e-12 * np.abs(K).max())
        np.testing.assert_allclose(np.asarray(op.matmul(v[:, 0])), K @ v[:, 0], rtol=1e-12, atol=1e-11)
        np.testing.assert_allclose(np.asarray(op.diag()), np.diag(K), rtol=1e-13)


def test_pivoted_cholesky_at_full_rank_is_the_matrix(data):
    x, _ = data
    x = x[:40]
    op = matfree.KernelOperator(MLP, x, 0.1)
    pc = matfree.pivoted_cholesky(op, 40)
    K = _dense(MLP, x, 0.0)
    np.testing.assert_allclose(np.asarray(pc.Ft.T @ pc.Ft), K, atol=1e-10 * np.abs(K).max())
    assert pc.trace_error < 1e-8 * np.trace(K)
    P = K + 0.1 * np.eye(40)
    np.testing.assert_allclose(pc.logdet(), np.linalg.slogdet(P)[1], rtol=1e-10)
    v = np.random.default_rng(2).normal(size=(40, 2))
    np.testing.assert_allclose(np.asarray(pc.solve(jnp.asarray(v))), np.linalg.solve(P, v), rtol=1e-8, atol=1e-10)
    # the pivots are distinct and the trace error falls with the rank
    assert len(set(np.asarray(pc.pivots).tolist())) == 40
    errs = [matfree.pivoted_cholesky(op, r).trace_error for r in (2, 8, 20)]
    assert errs[0] > errs[1] > errs[2]


def test_cg_reaches_its_tolerance_with_and_without_preconditioner(data):
    x, y = data
    kernel = kernels.rbf(0.7, 1.3)
    op = matfree.KernelOperator(kernel, x, 0.01, tile_size=64)
    A = _dense(kernel, x, 0.01)
    exact = np.linalg.solve(A, y)
    pc = matfree.pivoted_cholesky(op, 30)
    its = {}
    for name, p in (("plain", None), ("precond", pc)):
        sol, info = matfree.cg(op, y, precond=p, tol=1e-9, max_iter=2000)
        assert info.converged and info.residual <= 1e-9
        resid = np.linalg.norm(A @ np.asarray(sol) - y) / np.linalg.norm(y)
        assert resid <= 1.01e-9, resid
        np.testing.assert_allclose(np.asarray(sol), exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())
        its[name] = info.iterations
    assert its["precond"] < its["plain"]
    with pytest.warns(matfree.ConvergenceWarning, match="stopped after 3 iterations"):
        _, info = matfree.cg(op, y, tol=1e-12, max_iter=3)
    assert not info.converged and info.iterations == 3


def test_slq_log_determinant_is_within_its_standard_error_and_shrinks_with_probes(data):
    x, y = data
    kernel = kernels.rbf(0.5, 1.0)
    op = matfree.KernelOperator(kernel, x, 0.01)
    exact = np.linalg.slogdet(_dense(kernel, x, 0.01))[1]
    errors = {4: [], 64: []}
    for probes in errors:
        for seed in range(6):
            _, _, est, _ = matfree.solve(op, y, matfree.CG(precond_rank=10, num_probes=probes, tol=1e-10, seed=seed))
            if probes == 64:  # with 4 probes the standard error is itself too noisy to test against
                assert abs(est.value - exact) < 5 * est.stderr, (probes, seed, est, exact)
            errors[probes].append(abs(est.value - exact))
    # Hutchinson's error is O(1/sqrt(probes)): 16x the probes gives a quarter; allow a factor 2 for 6 seeds
    assert np.mean(errors[64]) < 0.5 * np.mean(errors[4]), errors


def _cnn():
    return posterior.as_kernel_callable(stax.serial(stax.Conv(8, (2, 2), W_std=1.4, b_std=0.1), stax.Relu(),
                                                    stax.Flatten(), stax.Dense(1))[2])


@pytest.mark.parametrize("prior", [None, priors.InverseGamma(2.0, 1.5), priors.BurrXII(2.0, 3.0)],
                         ids=["gaussian", "student_t", "importance"])
@pytest.mark.parametrize("model", ["rbf", "cnn"])
def test_matrix_free_posterior_equals_the_dense_one(data, prior, model):
    if model == "rbf":
        x, y = data
        kernel, x_test = kernels.rbf(0.7, 1.3), np.random.default_rng(3).normal(size=(7, 3))
    else:
        rng = np.random.default_rng(4)
        x, x_test = rng.normal(size=(60, 4, 4, 1)), rng.normal(size=(5, 4, 4, 1))
        y = x[:, 0, 0, :] * x[:, 1, 1, :] + 0.1 * rng.normal(size=(60, 1))
        kernel = _cnn()
    n = x.shape[0]
    # tight settings: the preconditioner of rank N makes P^-1 A = I to rounding, so the probes see no variance
    opts = matfree.CG(tol=1e-11, precond_rank=n, num_probes=4, tile_size=32)
    kw = dict(noise=0.05, num_samples=2000)
    dense = posterior.fit(kernel, x, y, prior, method="dense", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", posterior.SmallESSWarning)
        mf = posterior.fit(kernel, x, y, prior, method="cg", cg=opts, **kw)
    assert mf.method == "cg" and dense.method == "dense" and mf.kind == dense.kind
    assert mf.diagnostics["cg_residual"] <= 1e-11 and mf.diagnostics["logdet_stderr"] < 1e-6
    np.testing.assert_allclose(mf.log_marginal_likelihood, dense.log_marginal_likelihood, rtol=1e-6)
    pd, pm = dense.predict(x_test), mf.predict(x_test)
    np.testing.assert_allclose(np.asarray(pm.mean), np.asarray(pd.mean), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(pm.variance), np.asarray(pd.variance), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(mf.predict_covariance(x_test)), np.asarray(dense.predict_covariance(x_test)),
                               rtol=1e-6, atol=1e-9)


def test_matrix_free_fit_at_a_modest_preconditioner_reports_its_error(data):
    """With a rank-20 preconditioner the log-determinant is estimated: within 5 reported standard errors of
    the dense value, which the diagnostics state."""
    x, y = data
    kernel = kernels.rbf(0.7, 1.3)
    dense = posterior.fit(kernel, x, y, priors.InverseGamma(2.0, 1.5), noise=0.02, method="dense")
    mf = posterior.fit(kernel, x, y, priors.InverseGamma(2.0, 1.5), noise=0.02, method="cg",
                       cg=matfree.CG(precond_rank=20, num_probes=32))
    d = mf.diagnostics
    assert d["precond_rank"] == 20 and d["num_probes"] == 32 and d["cg_iterations"] > 0
    # log ML = ... - (C/2) log|C| - ...: its error is half the log-determinant's
    assert abs(mf.log_marginal_likelihood - dense.log_marginal_likelihood) < 5 * 0.5 * d["logdet_stderr"] + 1e-6


def _exact_reduction(kernel, x, x_test, noise):
    """``k*x (K + noise I)^{-1} kx*`` per test point, dense."""
    kx = np.asarray(kernel(jnp.asarray(x_test), jnp.asarray(x)))
    return np.sum(kx.T * np.linalg.solve(_dense(kernel, x, noise), kx.T), axis=0)


def test_love_bounds_contain_the_exact_reduction_and_close_on_an_invariant_space(data):
    """``l <= k*x A^-1 kx* <= l + |r|^2`` at every rank and preconditioner, and the upper end
    (`love_variance_reduction`) is exact once the Krylov space is invariant: with a rank-100 preconditioner of
    N = 203 points, M = I + (rank <= 103) has few distinct eigenvalues, the space stops growing near 104 steps
    and the residual lies where M = I."""
    x, _ = data
    x_test = np.random.default_rng(5).normal(size=(7, 3))
    kernel = kernels.rbf(0.7, 1.3)
    exact = _exact_reduction(kernel, x, x_test, 0.05)
    op = matfree.KernelOperator(kernel, x, 0.05)
    for precond_rank in (0, 50, 100):
        pc = matfree.pivoted_cholesky(op, precond_rank)
        for rank in (10, 60):
            b = matfree.love_reduction_bounds(op, x_test, rank, pc)
            assert b.rank == rank
            lo, up = np.asarray(b.lower), np.asarray(b.upper)
            assert np.all(lo <= exact * (1 + 1e-12)) and np.all(exact <= up * (1 + 1e-12)), (precond_rank, rank)
            assert np.all(up - lo > 1e-6), (precond_rank, rank)  # not exact yet: the bounds have room to fail
    full = matfree.love_reduction_bounds(op, x_test, x.shape[0], pc)
    assert full.rank < 110
    var = 1.3 - exact
    mid = np.asarray(matfree.love_variance_reduction(op, x_test, x.shape[0], pc))
    assert np.max(np.abs(mid - exact) / var) < 1e-8


def test_love_certifies_its_variances_with_a_good_preconditioner(data):
    """Where the Krylov space captures the test covariances (rank-50 preconditioner of 203 points), LOVE keeps
    every variance, grown from 60 to 120 steps, within its certified bound, itself within love_tol, with no
    solve and no warning."""
    x, y = data
    x_test = np.random.default_rng(5).normal(size=(7, 3))
    kernel = kernels.rbf(0.7, 1.3)
    ref = 1.3 - _exact_reduction(kernel, x, x_test, 0.05)
    op = matfree.KernelOperator(kernel, x, 0.05)
    opts = matfree.CG(tol=1e-10, precond_rank=50, variance="love", love_rank=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", matfree.ConvergenceWarning)
        var, info = matfree.love_variances(op, x_test, np.full(7, 1.3), opts, matfree.pivoted_cholesky(op, 50))
        post = posterior.fit(kernel, x, y, priors.InverseGamma(2.0, 1.5), noise=0.05, method="cg", cg=opts)
        p = post.predict(x_test, noisy=False)
    err = np.abs(np.asarray(var) - ref) / ref
    assert info.num_solved == 0 and info.rank > 60 and info.bound <= opts.love_tol, info
    assert np.max(err) <= info.bound and np.max(err) > 1e-6, (err, info)  # LOVE's own answer, not a solve
    dense = posterior.fit(kernel, x, y, priors.InverseGamma(2.0, 1.5), noise=0.05, method="dense")
    pd = dense.predict(x_test, noisy=False)
    np.testing.assert_allclose(np.asarray(p.variance), np.asarray(pd.variance), rtol=opts.love_tol)
    np.testing.assert_allclose(np.asarray(p.mean), np.asarray(pd.mean), rtol=1e-8, atol=1e-9)


def test_love_in_the_benchmark_setting_meets_love_tol_or_solves(recwarn):
    """Issue 49: the RBF benchmark problem (d = 8, lengthscale 2, noise 0.01, preconditioner and LOVE rank 100),
    here at N = 300. The old estimate (``M = I`` off the Krylov space) put every variance reduction above the prior
    variance: all variances clipped to 0, the predictive variance the same at every test point, 100x too small.
    Now no interval certifies, LOVE says so with its bound and the variances come from solves."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=8) / np.sqrt(8)
    x, x_test = rng.normal(size=(300, 8)), rng.normal(size=(20, 8))
    y = np.sin(x @ w) + 0.1 * rng.normal(size=300)
    kernel, prior = kernels.rbf(2.0, 1.0), priors.InverseGamma(2.0, 2.0)
    dense = posterior.fit(kernel, x, y, prior, noise=0.01, method="dense")
    mf = posterior.fit(kernel, x, y, prior, noise=0.01, method="cg",
                       cg=matfree.CG(variance="love", love_rank=100, precond_rank=100))
    with pytest.warns(matfree.ConvergenceWarning, match=r"LOVE: at Lanczos rank \d+ .*love_max_rank \d+.*\(bounds "):
        pm = mf.predict(x_test)
    pd = dense.predict(x_test)
    vd, vm = np.asarray(pd.variance), np.asarray(pm.variance)
    assert np.max(np.abs(vm - vd) / vd) < 1e-2
    # the latent variances too (the predictive one adds the noise), which the old estimate clipped to zero
    ld = np.asarray(dense.predict(x_test, noisy=False).variance)
    lm = np.asarray(mf.predict(x_test, noisy=False).variance)
    assert np.max(np.abs(lm - ld) / ld) < 1e-2 and np.ptp(lm) > 0.1 * np.max(lm)


def test_love_falls_back_to_solves_when_capped_and_warns(data):
    """A cap of 2 Lanczos steps certifies nothing: every variance comes from CG, as with variance='solve'."""
    x, y = data
    x_test = np.random.default_rng(5).normal(size=(7, 3))
    kernel, prior = kernels.rbf(0.7, 1.3), priors.InverseGamma(2.0, 1.5)
    fits = {v: posterior.fit(kernel, x, y, prior, noise=0.05, method="cg",
                             cg=matfree.CG(tol=1e-10, precond_rank=50, variance=v, love_rank=2, love_max_rank=2))
            for v in ("love", "solve")}
    with pytest.warns(matfree.ConvergenceWarning, match="love_max_rank 2.*at 7 of 7 test points.*CG solves"):
        love = fits["love"].predict(x_test, noisy=False)
    solve = fits["solve"].predict(x_test, noisy=False)
    np.testing.assert_allclose(np.asarray(love.variance), np.asarray(solve.variance), rtol=1e-8)


def test_sklearn_estimator_takes_the_matrix_free_path(data):
    from smnngp.sklearn import ScaleMixtureRegressor

    x, y = data
    x_test = np.random.default_rng(6).normal(size=(5, 3))
    dense = ScaleMixtureRegressor(kernels.rbf(0.7, 1.3), noise=0.05, method="dense").fit(x, y[:, 0])
    mf = ScaleMixtureRegressor(kernels.rbf(0.7, 1.3), noise=0.05, method="cg",
                               cg=matfree.CG(tol=1e-11, precond_rank=x.shape[0], num_probes=4)).fit(x, y[:, 0])
    assert mf.posterior_.method == "cg"
    np.testing.assert_allclose(mf.log_marginal_likelihood_, dense.log_marginal_likelihood_, rtol=1e-6)
    for a, b in zip(mf.predict(x_test, return_std=True), dense.predict(x_test, return_std=True), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_auto_chooses_by_memory_and_dense_refuses_what_does_not_fit(data, monkeypatch):
    x, y = data
    kernel = kernels.rbf(0.7, 1.3)
    assert posterior.fit(kernel, x, y, noise=0.1).method == "dense"
    monkeypatch.setattr(matfree, "available_memory_bytes", lambda device=None: 1000)
    assert posterior.fit(kernel, x, y, noise=0.1, cg=matfree.CG(precond_rank=50)).method == "cg"
    with pytest.raises(MemoryError, match="method='dense' needs about .* use method='cg'"):
        posterior.fit(kernel, x, y, noise=0.1, method="dense")


def test_bad_input_gets_clear_errors(data):
    x, y = data
    kernel = kernels.rbf(0.7, 1.3)
    with pytest.raises(ValueError, match="method='cg' needs noise > 0"):
        posterior.fit(kernel, x, y, method="cg")
    with pytest.raises(ValueError, match="method='cg' needs noise > 0"):
        posterior.fit(kernel, x, y, priors.BurrXII(2.0, 3.0), noise=0.0, noise_model="unscaled", method="cg")
    with pytest.raises(ValueError, match="method must be 'auto', 'dense', 'mixed' or 'cg'"):
        posterior.fit(kernel, x, y, noise=0.1, method="lanczos")
    with pytest.raises(TypeError, match="cg must be a smnngp.matfree.CG"):
        posterior.fit(kernel, x, y, noise=0.1, method="cg", cg={"tol": 1e-3})
    for bad in (dict(tol=0.0), dict(tol=-1e-3), dict(tol=float("nan")), dict(max_iter=0), dict(num_probes=1),
                dict(precond_rank=-1), dict(tile_size=0), dict(love_tol=0.0), dict(love_tol=1.5),
                dict(love_max_rank=50)):
        with pytest.raises(ValueError, match=f"CG: {next(iter(bad))}"):
            matfree.CG(**bad)
    x_nan = x.copy()
    x_nan[3, 1] = np.nan
    with pytest.raises(ValueError, match="x_train has 1 non-finite"):
        posterior.fit(kernel, x_nan, y, noise=0.1, method="cg")
    op = matfree.KernelOperator(kernel, x, 0.1)
    with pytest.raises(ValueError, match=r"right-hand sides must have shape \(203,\)"):
        matfree.cg(op, y[:10])
    with pytest.raises(ValueError, match="tol must be a positive finite number"):
        matfree.cg(op, y, tol=0.0)
    with pytest.raises(ValueError, match="shift must be non-negative"):
        matfree.KernelOperator(kernel, x, -0.1)
    with pytest.raises(ValueError, match="needs shift > 0"):
        matfree.pivoted_cholesky(matfree.KernelOperator(kernel, x, 0.0), 5)


def test_rows_spread_over_four_host_devices_give_the_unsharded_numbers():
    """The fit, its predictions and the tiled hyperparameter gradient (`bilinear_grad`). Sharded sums round
    differently, which can move a column's stopping iteration by one and its solution by
    about ``tol``: at a tight tolerance the two runs agree to rounding."""
    code = textwrap.dedent(
        """
        import os
        # before jax is imported (appended: the suite sets its own XLA flags)
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        os.environ["JAX_PLATFORMS"] = "cpu"  # the forced devices are host devices, also on a GPU machine
        import jax
        import jax.flatten_util
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from smnngp import kernels, matfree, posterior, priors
        assert len(jax.devices()) == 4
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(150, 3)), rng.normal(size=(150, 2))
        k = kernels.rbf(0.8, 1.0)
        out = {}
        for devs in (jax.devices()[:1], jax.devices()):
            opts = matfree.CG(tol=1e-12, precond_rank=30, num_probes=8, tile_size=16, devices=tuple(devs))
            post = posterior.fit(k, x, y, priors.InverseGamma(2.0, 1.0), noise=0.05, method="cg", cg=opts)
            p = post.predict(x[:9] + 0.1)
            op = matfree.KernelOperator(k, x, 0.05, tile_size=16, devices=tuple(devs))
            grad = np.asarray(jax.flatten_util.ravel_pytree(op.bilinear_grad(x[:, :2], y))[0])
            out[len(devs)] = np.concatenate([[post.log_marginal_likelihood], np.ravel(p.mean), np.ravel(p.variance),
                                             grad])
        a, b = out[1], out[4]
        print("MAXREL", float(np.max(np.abs(a - b) / np.abs(a))))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    rel = float(run.stdout.split("MAXREL")[1].split()[0])
    assert rel < 1e-9, run.stdout
