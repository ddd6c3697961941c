"""The matrix-free marginal likelihood's gradient (BBMM) and ``smnngp.hyper``'s ``method='cg'`` (issue 30).

Properties: the tiled ``bilinear_grad`` equals autodiff of the dense ``tr(A^T K(theta) B)`` to rounding (RBF and a
stax MLP NNGP, N not a multiple of the tile); the gradient of ``q = y^T C^-1 y`` is exact to CG's tolerance; the
probe estimate of ``d ln|C| / dtheta = tr(C^-1 K')`` is unbiased (its mean over independent probe sets lies within 4
standard errors of the exact value); the matrix-free loss and its gradient equal the dense ones within the same
statistical tolerance; a 40-step matrix-free ``fit_kernel`` lands at the dense fit's validation NLL; bad requests
are named.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from smnngp import hyper, kernels, matfree, stax

RBF = kernels.rbf(1.3, 0.7)
MLP = stax.parametric_kernel(
    lambda p: stax.serial(stax.Dense(32, W_std=p["w"], b_std=p["b"]), stax.Relu(), stax.Dense(1, W_std=p["out"])),
    {"w": 1.5, "b": 0.1, "out": 1.0})


def _data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(n, 3)))
    return x, jnp.asarray(np.sin(2 * x[:, :1]) + 0.1 * rng.normal(size=(n, 1)))


def _flat(tree):
    return np.asarray(ravel_pytree(tree)[0])


@pytest.mark.parametrize("kernel", [RBF, MLP], ids=["rbf", "mlp"])
def test_bilinear_grad_equals_autodiff_of_the_dense_form(kernel):
    x, _ = _data(103)
    rng = np.random.default_rng(1)
    A, B = jnp.asarray(rng.normal(size=(103, 3))), jnp.asarray(rng.normal(size=(103, 3)))
    op = matfree.KernelOperator(kernel, x, 0.1, tile_size=16)
    ref = jax.grad(lambda th: jnp.sum(A * (kernel.apply(th, x, x) @ B)))(kernel.theta)
    np.testing.assert_allclose(_flat(op.bilinear_grad(A, B)), _flat(ref), rtol=1e-10, atol=1e-10)


def _dense_grads(kernel, x, y, noise):
    def terms(theta, s):
        C = kernel.apply(theta, x, x) + s * jnp.eye(x.shape[0])
        return jnp.sum(y * jnp.linalg.solve(C, y)), jnp.linalg.slogdet(C)[1]

    gq = jax.grad(lambda t, s: terms(t, s)[0], argnums=(0, 1))(kernel.theta, noise)
    gl = jax.grad(lambda t, s: terms(t, s)[1], argnums=(0, 1))(kernel.theta, noise)
    return (np.append(_flat(gq[0]), gq[1]), np.append(_flat(gl[0]), gl[1]))


@pytest.mark.parametrize("kernel", [RBF, MLP], ids=["rbf", "mlp"])
def test_quadratic_part_is_exact_and_trace_part_is_unbiased(kernel):
    x, y = _data()
    noise = 0.05
    exact_q, exact_ld = _dense_grads(kernel, x, y, noise)
    op = matfree.KernelOperator(kernel, x, noise, tile_size=32)
    estimates = []
    for seed in range(8):
        t = matfree.marginal_terms(op, y, matfree.CG(tol=1e-12, precond_rank=20, num_probes=16, seed=seed))
        if seed == 0:
            d_theta, d_s = matfree.marginal_terms_grad(op, t, 1.0, 0.0)
            np.testing.assert_allclose(np.append(_flat(d_theta), d_s), exact_q, rtol=1e-8, atol=1e-10)
        d_theta, d_s = matfree.marginal_terms_grad(op, t, 0.0, 1.0)
        estimates.append(np.append(_flat(d_theta), d_s))
    est = np.array(estimates)
    mean, se = est.mean(0), est.std(0, ddof=1) / np.sqrt(len(est))
    assert np.all(np.abs(mean - exact_ld) <= 4 * se + 1e-9), (mean, exact_ld, se)
    assert np.all(se <= 0.1 * np.abs(exact_ld) + 1e-9), se  # informative: the estimate is not noise


def test_matrix_free_loss_and_gradient_match_the_dense_ones():
    x, y = _data()
    raw = {"kernel": RBF.theta, **hyper._unconstrain({"noise": 0.05, "a": 2.0, "b": 1.5})}
    u = jnp.zeros(1)
    dense_value, dense_grads = jax.value_and_grad(hyper._loss_fn("student_t", RBF.apply, 1))(raw, x, y, u)
    values, grads = [], []
    for seed in range(6):
        fn = hyper._matfree_loss_and_grad("student_t", RBF, 1, matfree.CG(tol=1e-12, precond_rank=30, seed=seed))
        v, g = fn(raw, x, y, u)
        values.append(float(v))
        grads.append(_flat(g))
    for est, exact in ((np.array(values)[:, None], np.array([float(dense_value)])),
                       (np.array(grads), _flat(dense_grads))):
        mean, se = est.mean(0), est.std(0, ddof=1) / np.sqrt(len(est))
        assert np.all(np.abs(mean - exact) <= 4 * se + 1e-9), (mean, exact, se)


def test_matrix_free_fit_kernel_lands_at_the_dense_fit():
    x, y = _data(120)
    xv, yv = _data(60, seed=3)
    kw = dict(max_steps=40, eval_every=20, learning_rate=5e-2)
    dense = hyper.fit_kernel(RBF, x, y, xv, yv, "student_t", **kw)
    cg = hyper.fit_kernel(RBF, x, y, xv, yv, "student_t", method="cg", cg=matfree.CG(precond_rank=50), **kw)
    assert abs(cg.val_nll - dense.val_nll) < 0.05, (cg.val_nll, dense.val_nll)
    assert abs(np.log(cg.params["lengthscale"] / dense.params["lengthscale"])) < 0.2


def test_bad_requests_are_named():
    x, y = _data(40)
    with pytest.raises(ValueError, match="method must be 'dense' or 'cg'"):
        hyper.fit_kernel(RBF, x, y, x, y, method="lanczos")
    with pytest.raises(TypeError, match="cg must be a smnngp.matfree.CG"):
        hyper.fit_kernel(RBF, x, y, x, y, method="cg", cg={"tol": 1e-6})
    with pytest.raises(TypeError, match="needs a ParametricKernel"):
        matfree.KernelOperator(lambda a, b=None: RBF(a, b), x, 0.1).bilinear_grad(y, y)
    with pytest.raises(ValueError, match="must both have shape"):
        matfree.KernelOperator(RBF, x, 0.1).bilinear_grad(y, y[:-1])
