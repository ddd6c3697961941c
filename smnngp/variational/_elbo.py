"""The ELBO's pure, traceable pieces: q(f(x)) by whitening, the KL divergence, the expected log-likelihood, the
ELBO, and q(sigma^2) (`scale_posterior`).

Everything here is a function of ``(model, params, ...)`` that runs under `jax.jit` and `jax.grad` with the model
static (the formulas are in the `smnngp.variational` docstring).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import digamma, gammaln

from smnngp import linalg
from smnngp._checks import check_finite
from smnngp.variational._likelihoods import Bernoulli, Gaussian, _is_tracer
from smnngp.variational._model import Model, Params

__all__ = ["scale_posterior", "kl_divergence", "expected_log_likelihood", "elbo"]


def _scale_ab(model, params):
    a = model.a_min + jax.nn.softplus(params.scale["a"])
    b = jax.nn.softplus(params.scale["b"])
    return a, b


def scale_posterior(model: Model, params: Params):
    """q(sigma^2): ``InverseGamma(a, b)`` for the SVTP, the point mass ``Delta(1)`` for the SVGP.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.

    Returns:
        numpyro distribution of sigma^2 under the variational posterior.
    """
    if model.kind == "svgp":
        return dist.Delta(jnp.asarray(1.0, model.dtype))
    a, b = _scale_ab(model, params)
    return dist.InverseGamma(a, b)


def _kmat(model, theta, x1, x2):
    return jnp.asarray(model.kernel(theta, x1, x2)).astype(model.dtype)


def _kdiag(model, theta, x):
    one = lambda xi: model.kernel(theta, xi[None], xi[None])[0, 0]  # noqa: E731
    return jax.vmap(one)(x).astype(model.dtype)


def _q_factor(model, params):
    """S_c as (C, M, M) lower triangular (``q_diag``: (C, M) diagonal)."""
    return params.q_scale if model.q_diag else jnp.tril(params.q_scale)


def _projection(model, params, x):
    """``A = L^{-1} K_ZX`` (M, B) and ``diag K_XX`` (B,)."""
    Z, theta = params.inducing, params.kernel
    Kzz = _kmat(model, theta, Z, Z)
    Kzz = Kzz + (model.jitter * jnp.mean(jnp.diag(Kzz))) * jnp.eye(Kzz.shape[0], dtype=Kzz.dtype)
    A = linalg.whiten(Kzz, _kmat(model, theta, Z, x))
    return A, _kdiag(model, theta, x)


def _st_a(model, params, A):
    """``S_c^T A`` for every class, (C, M, B)."""
    S = _q_factor(model, params)
    if model.q_diag:
        return S[:, :, None] * A[None]
    return jnp.einsum("cmk,mb->ckb", S, A)


def _marginals(model, params, x):
    """Mean (B, C) and variance at sigma^2 = 1 (B, C) of q(f(x_i)) (module docstring)."""
    A, kxx = _projection(model, params, x)
    mean = (params.q_mean @ A).T
    cond = jnp.clip(kxx - jnp.sum(A * A, axis=0), 0.0, None)
    var = cond[:, None] + jnp.sum(_st_a(model, params, A) ** 2, axis=1).T
    return mean, var


def optimal_gaussian_q(model: Model, params: Params, x, y) -> Params:
    """``params`` with q(v) set to the ELBO's maximiser for a Gaussian likelihood (Titsias 2009, whitened).

    With ``A = L^{-1} K_ZX`` and noise s2 the bound is maximised by ``S S^T = Lambda^{-1}``, ``m_c = Lambda^{-1} A
    y_c / s2``, ``Lambda = I + A A^T / s2``; the ELBO then equals Titsias' collapsed bound, and at ``Z = X`` (up to the
    jitter on K_ZZ) the exact GP's log marginal likelihood and posterior. An SVGP's closed-form fit (the sparse GP
    regression of GPflow's SGPR), and the exact reference its stochastic training can be held against.

    Args:
        model: an SVGP (`svgp`) with a `Gaussian` likelihood and full (not diagonal) factors.
        params: its parameters (Z, the kernel and the noise are kept).
        x: (N, ...) training inputs.
        y: (N,) or (N, C) targets.

    Returns:
        :class:`Params` with ``q_mean`` (C, M) and ``q_scale`` (C, M, M) at the optimum.

    Raises:
        ValueError: for an SVTP, a non-Gaussian likelihood or ``q_diag`` (the optimum is not in those families), or
            bad ``x`` / ``y``.
    """
    if model.kind != "svgp" or not isinstance(model.likelihood, Gaussian) or model.q_diag:
        raise ValueError("optimal_gaussian_q: the closed-form optimum is that of an SVGP with a Gaussian likelihood "
                         f"and full factors (got kind={model.kind!r}, likelihood "
                         f"{type(model.likelihood).__name__}, q_diag={model.q_diag})")
    x = _check_x(model, x)
    y = model.likelihood.check_targets(y, x.shape[0])
    s2 = Gaussian.variance(params.likelihood)
    A, _ = _projection(model, params, x)
    m = A.shape[0]
    lam = jnp.eye(m, dtype=A.dtype) + (A @ A.T) / s2
    chol = jnp.linalg.cholesky(lam)
    cov = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(m, dtype=A.dtype))
    factor = jnp.linalg.cholesky((cov + cov.T) / 2)
    mean = jax.scipy.linalg.cho_solve((chol, True), A @ y / s2)  # (M, C)
    C = y.shape[1]
    return params._replace(q_mean=mean.T.astype(params.q_mean.dtype),
                           q_scale=jnp.broadcast_to(factor, (C, m, m)).astype(params.q_scale.dtype))


def kl_divergence(model: Model, params: Params):
    """KL(q || p) of the whitened inducing variables (and of sigma^2 for the SVTP); module docstring.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.

    Returns:
        Scalar KL divergence, summed over the C latent functions (traceable and differentiable).
    """
    S = _q_factor(model, params)
    diag = S if model.q_diag else jnp.diagonal(S, axis1=-2, axis2=-1)
    C, M = params.q_mean.shape
    gauss = 0.5 * (jnp.sum(S * S) - C * M - 2.0 * jnp.sum(jnp.log(jnp.abs(diag))))
    mm = jnp.sum(params.q_mean**2)
    if model.kind == "svgp":
        return gauss + 0.5 * mm
    a, b = _scale_ab(model, params)
    alpha, beta = model.prior
    kl_ig = ((a - alpha) * digamma(a) - gammaln(a) + gammaln(alpha) + alpha * (jnp.log(b) - math.log(beta))
             + a * (beta - b) / b)
    return gauss + 0.5 * (a / b) * mm + kl_ig


def _draw_scale(model, params, key, shape):
    """sigma^2 ~ InvGamma(a, b) as ``b / g``, ``g ~ Gamma(a, 1)`` (implicitly reparameterised in a)."""
    a, b = _scale_ab(model, params)
    g = jax.random.gamma(key, a, shape, dtype=jnp.dtype(model.dtype))
    return b / jnp.maximum(g, jnp.finfo(model.dtype).tiny)


def _ell(model, params, x, y, key):
    """Per-point expected log-likelihood ``E_q[log p(y_i | f_i)]`` (B,), with validated/converted y."""
    mean, var = _marginals(model, params, x)
    lik = model.likelihood
    if isinstance(lik, Gaussian):
        if model.kind == "svtp":
            a, b = _scale_ab(model, params)
            var = var * (b / (a - 1.0))
        return lik.expected_log_prob(params.likelihood, y, mean, var)
    if isinstance(lik, Bernoulli):
        if model.kind == "svgp":
            s = jnp.ones((1,), mean.dtype)
        else:
            s = _draw_scale(model, params, _need_key(key), (model.num_mc,))
        nodes, weights = np.polynomial.hermite.hermgauss(lik.num_quadrature)
        nodes = jnp.asarray(nodes * math.sqrt(2.0), mean.dtype)
        weights = jnp.asarray(weights / math.sqrt(math.pi), mean.dtype)
        std = jnp.sqrt(s[:, None, None] * var[None])  # (T, B, 1)
        f = mean[None, None] + nodes[:, None, None, None] * std[None]  # (K, T, B, 1)
        return jnp.einsum("k,ktb->b", weights, lik.log_prob(None, y, f)) / s.shape[0]
    key = _need_key(key)
    k_s, k_e = jax.random.split(key)
    T = model.num_mc
    if model.kind == "svgp":
        s = jnp.ones((T,), mean.dtype)
    else:
        s = _draw_scale(model, params, k_s, (T,))
    eps = jax.random.normal(k_e, (T,) + mean.shape, mean.dtype)
    f = mean[None] + jnp.sqrt(s[:, None, None] * var[None]) * eps
    return jnp.mean(lik.log_prob(None, y, f), axis=0)


def _need_key(key):
    if key is None:
        raise ValueError("key is required: this expectation is estimated by Monte Carlo")
    return key


def _check_x(model, x, name="x"):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(model.dtype)
    if x.ndim < 1 or tuple(x.shape[1:]) != model.point_shape:
        raise ValueError(f"{name} must have shape (N, {', '.join(map(str, model.point_shape))}) like the inducing "
                         f"inputs, got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    check_finite(x, name)
    return x.astype(model.dtype)


def expected_log_likelihood(model: Model, params: Params, x, y, key=None):
    """``E_q[log p(y_i | f_i)]`` for each point, shape (B,) (Monte Carlo for Softmax / SVTP: pass ``key``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (B, ...) with the per-point shape of the inducing inputs.
        y: targets: labels (B,) for ``Softmax`` / ``Bernoulli``, (B,) or (B, C) floats for ``Gaussian``.
        key: JAX PRNG key, required for ``Softmax`` and for the SVTP with ``Bernoulli``; unused otherwise.

    Returns:
        Array of shape (B,): the expected log-likelihood of each point, summed over outputs.

    Raises:
        ValueError: if ``x`` or ``y`` has the wrong shape, invalid values, or ``key`` is needed and missing.
    """
    x = _check_x(model, x)
    y = model.likelihood.check_targets(y, x.shape[0])
    return _ell(model, params, x, y, key)


def elbo(model: Model, params: Params, batch, key=None, num_data=None):
    """``(N / B) sum_{i in batch} E_q[log p(y_i | f_i)] - KL`` for ``batch = (x, y)`` (B points), ``N = num_data``
    (default B: the batch is the data set).  Unbiased for the full-data ELBO when the batch is drawn uniformly.
    Deterministic for the Gaussian likelihood and the Bernoulli SVGP; otherwise a Monte-Carlo estimate (``key``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        batch: tuple ``(x, y)`` of B inputs and targets.
        key: JAX PRNG key for the Monte-Carlo cases (see :func:`expected_log_likelihood`).
        num_data: size N of the whole data set (positive); ``None`` means B.

    Returns:
        Scalar ELBO estimate (traceable and differentiable in ``params``).

    Raises:
        ValueError: if the batch is invalid, ``num_data`` is not positive, or ``key`` is needed and missing.
    """
    x, y = batch
    x = _check_x(model, x, "batch x")
    y = model.likelihood.check_targets(y, x.shape[0], "batch y")
    B = x.shape[0]
    n = B if num_data is None else num_data
    if not _is_tracer(n) and not (isinstance(n, (int, float, np.integer, np.floating)) and n > 0):
        raise ValueError(f"num_data must be a positive number of training points, got {num_data!r}")
    return (n / B) * jnp.sum(_ell(model, params, x, y, key)) - kl_divergence(model, params)
