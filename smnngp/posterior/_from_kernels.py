"""The posterior from a factorisation: `fit_from_kernels`, `log_marginal_likelihood`, and the steps every fit path
ends with.

From the Cholesky factor of ``C = Kbar + eps I`` (scaled noise) or the eigendecomposition of ``Kbar`` (unscaled
noise), whether a user's kernel matrix was factorised (`fit_from_kernels`) or `smnngp.posterior.fit` built and
factorised it (`smnngp.posterior._fit`): the Gaussian posterior for a ``Delta`` prior, the Student-t process for an
inverse gamma with scaled noise, else self-normalised importance sampling over prior (or likelihood-shaped)
draws of sigma^2, pruned of negligible weights and checked for its effective sample size (`SmallESSWarning`).
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from smnngp import linalg, priors
from smnngp.posterior._evaluators import _as_targets, _check_noise
from smnngp.posterior._marginal import gaussian_log_ml, scaled_log_weights, student_t_log_ml, unscaled_log_weights
from smnngp.posterior._posteriors import GaussianPosterior, ImportancePosterior, Posterior, StudentTPosterior

__all__ = ["fit_from_kernels", "log_marginal_likelihood", "SmallESSWarning"]

_PRUNE_LOG_WEIGHT = -60.0


class SmallESSWarning(UserWarning):
    """The importance sampler's effective sample size is small: its estimates are unreliable."""


def fit_from_kernels(k_train, y_train, prior=None, *, noise: float = 0.0, noise_model: str = "scaled",
                     num_samples: int = 10_000, key=None, min_ess: float = 30.0, proposal: str = "prior") -> Posterior:
    """As :func:`fit`, from a precomputed (N, N) training kernel; predict with ``k_test_train``/``k_test_test``.

    Args:
        k_train: training kernel matrix Kbar, (N, N), symmetric positive semi-definite.
        y_train: training targets, (N,) or (N, C).
        prior: scale prior on sigma^2 (``None``: ``Delta(1)``; a positive number ``s``: ``Delta(s)``).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise), non-negative and finite.
        noise_model: ``'scaled'`` (default) or ``'unscaled'`` (needs ``noise > 0``).
        num_samples: importance samples drawn (non-conjugate cases only), a positive int.
        key: JAX PRNG key for the importance samples (``None``: ``PRNGKey(0)``).
        min_ess: warn (:class:`SmallESSWarning`) below this effective sample size.
        proposal: ``'prior'`` or ``'likelihood'`` (scaled noise only), as in :func:`fit`.

    Returns:
        A :class:`Posterior` (Gaussian, Student-t or importance-sampled, as in :func:`fit`) without kernel or
        training inputs: pass ``k_test_train`` and ``k_test_test`` to its prediction methods.

    Raises:
        ValueError: if ``k_train`` is not a non-empty square matrix, is not symmetric or not finite, the targets
            do not match it, ``noise``, ``noise_model``, ``proposal`` or ``num_samples`` is invalid, the prior is
            invalid, or no prior sample of sigma^2 is positive and finite.
        TypeError: if ``prior`` is not a numpyro distribution, a number or ``None``.
        NotPositiveDefiniteError: if the training kernel (plus noise) is not positive (semi-)definite.
        FloatingPointError: if all importance weights are zero or not finite.

    Warns:
        SmallESSWarning: when the effective sample size is below ``min_ess``.
        UserWarning: when the Cholesky factorisation needed jitter, or some prior samples were dropped.
    """
    k_train = linalg.check_square(k_train, "k_train")
    if not jnp.issubdtype(k_train.dtype, jnp.floating):
        k_train = k_train.astype(jnp.result_type(float))
    Y, common = _prepare(y_train, k_train.shape[0], prior, noise, noise_model, proposal)
    prior, noise = common["prior"], common["noise"]
    is_delta = priors.is_delta(prior)

    if noise_model == "scaled" or is_delta and noise == 0.0:
        # the Cholesky of C = k_train + noise I, without forming C
        chol = linalg._shifted_cholesky(k_train, noise, name="training kernel + noise")
        return _cholesky_posterior(chol, Y, common, k_train.dtype, num_samples=num_samples, key=key,
                                   min_ess=min_ess, proposal=proposal)

    # unscaled noise: one eigendecomposition, O(N) per sigma^2
    if noise == 0.0:
        raise ValueError("noise_model='unscaled' needs noise > 0 (with noise 0 both noise models coincide)")
    lam, U = linalg.eigh_psd(k_train, name="training kernel")
    return _eigh_posterior(lam, U, Y, common, k_train.dtype, num_samples=num_samples, key=key, min_ess=min_ess)


def log_marginal_likelihood(k_train, y_train, prior=None, *, noise=0.0, noise_model="scaled", num_samples=10_000,
                            key=None):
    """``log p(Y)`` under the scale mixture (exact for Delta / conjugate inverse gamma, IS otherwise).

    A shortcut for ``fit_from_kernels(...).log_marginal_likelihood``; see :func:`fit_from_kernels` for the errors
    and warnings.

    Args:
        k_train: training kernel matrix Kbar, (N, N), computed with last-layer variance 1.
        y_train: training targets, (N,) or (N, C).
        prior: scale prior on sigma^2 (see :func:`smnngp.priors.as_prior`; ``None`` means ``Delta(1)``).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise), a non-negative variance.
        noise_model: ``'scaled'`` (default) or ``'unscaled'``.
        num_samples: importance samples drawn from the prior (non-conjugate cases only).
        key: JAX PRNG key for the importance samples (``None``: ``PRNGKey(0)``).

    Returns:
        ``log p(Y)``: exact for a ``Delta`` prior and for the inverse gamma prior with scaled noise, otherwise
        the importance-sampling estimate (a Python float outside transformations).
    """
    return fit_from_kernels(k_train, y_train, prior, noise=noise, noise_model=noise_model,
                            num_samples=num_samples, key=key).log_marginal_likelihood


def _cholesky_posterior(chol, Y, common, dtype, *, num_samples, key, min_ess, proposal):
    """Scaled noise (or noise-free ``Delta``): the posterior from the factor of ``C = Kbar + eps I``."""
    if chol.jitter > 0:
        warnings.warn(f"the training kernel needed jitter {chol.jitter:.3g} to factorise (singular, e.g. repeated "
                      "inputs); consider noise > 0", stacklevel=3)
    alpha, q, ld = _scaled_fit_stats(chol.L, Y.astype(chol.L.dtype))
    state = dict(L=chol.L, alpha=alpha, q=q, logdet=ld)
    return _scaled_posterior(common, state, chol.jitter, dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal)


def _eigh_posterior(lam, U, Y, common, dtype, *, num_samples, key, min_ess):
    """Unscaled noise: the posterior from ``Kbar = U diag(lam) U^T`` (O(N) per sample of sigma^2)."""
    prior, noise = common["prior"], common["noise"]
    ytilde = U.T @ Y.astype(U.dtype)
    state = dict(lam=lam, U=U, ytilde=ytilde)
    if priors.is_delta(prior):
        beta = jnp.reshape(prior.v, (1,)).astype(dtype)
        log_w = unscaled_log_weights(lam, ytilde**2, noise, beta)
        return GaussianPosterior(log_marginal_likelihood=float(log_w[0]), state=state, s=prior.v, **common)
    beta = _prior_samples(prior, key, num_samples, dtype)
    log_w = unscaled_log_weights(lam, ytilde**2, noise, beta)
    return _importance_posterior(common, state, beta, log_w, 0.0, num_samples, min_ess)


def _prepare(y_train, n, prior, noise, noise_model, proposal):
    """Checked targets as (N, C) and the fields every posterior shares."""
    y = _as_targets(y_train, n)
    squeeze = y.ndim == 1
    Y = y[:, None] if squeeze else y
    noise = _check_noise(noise, noise_model)
    prior = priors.as_prior(prior)
    if proposal not in ("prior", "likelihood"):
        raise ValueError(f"proposal must be 'prior' or 'likelihood', got {proposal!r}")
    if proposal == "likelihood" and noise_model != "scaled":
        raise ValueError("proposal='likelihood' is implemented for noise_model='scaled' only; use proposal='prior'")
    return Y, dict(prior=prior, noise=noise, noise_model=noise_model, n_train=n, n_out=Y.shape[1], squeeze=squeeze)


# Compiled groups of the scalar / O(N^2) steps of fit_from_kernels (eagerly, each op would be compiled on first use).


@jax.jit
def _scaled_fit_stats(chol_l, Y):
    alpha = linalg.cho_solve(chol_l, Y)
    return alpha, jnp.sum(Y * alpha), linalg.logdet(chol_l)


_gaussian_log_ml_jit = jax.jit(gaussian_log_ml, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _student_t_fit(q, ld, n, n_out, a, b):
    nc = n * n_out
    return student_t_log_ml(q, ld, n, n_out, a, b), a + nc / 2, b + q / 2, 2 * a + nc


def _scaled_posterior(common, state, jitter, dtype, *, num_samples, key, min_ess, proposal, solver=None):
    """The posterior for scaled noise from ``q = tr(Y^T C^-1 Y)`` and ``log|C|`` in ``state`` (dense or
    matrix-free alike): Gaussian for a ``Delta`` prior, Student-t for an inverse gamma, else importance-sampled."""
    prior, n, n_out = common["prior"], common["n_train"], common["n_out"]
    q, ld, nc = state["q"], state["logdet"], n * n_out
    if priors.is_delta(prior):
        s = prior.v
        lml = _gaussian_log_ml_jit(q, ld, n, n_out, s)
        return GaussianPosterior(log_marginal_likelihood=float(lml), jitter=jitter, state=state, s=s, solver=solver,
                                 **common)
    if priors.is_inverse_gamma(prior):
        a, b = priors.inverse_gamma_params(prior)
        lml, a_post, b_post, df = _student_t_fit(q, ld, n, n_out, a, b)
        return StudentTPosterior(log_marginal_likelihood=float(lml), jitter=jitter, state=state, a_post=a_post,
                                 b_post=b_post, _df=df, solver=solver, **common)
    if proposal == "prior":
        beta = _prior_samples(prior, key, num_samples, dtype)
        log_w = scaled_log_weights(q, ld, n, n_out, beta)
    else:
        # The likelihood in beta is an inverse-gamma kernel, beta^{-NC/2} e^{-q/(2 beta)}; a proposal with
        # that shape, widened (half the shape and rate: the same centre, larger spread, heavier tail), puts
        # the samples where the posterior is. Weights: prior / proposal x likelihood.
        prop = priors.InverseGamma(max(0.5, (nc / 2 - 1) / 2), float(q) / 4)
        beta = _prior_samples(prop, key, num_samples, dtype)
        log_w = scaled_log_weights(q, ld, n, n_out, beta) + prior.log_prob(beta) - prop.log_prob(beta)
    return _importance_posterior(common, state, beta, log_w, jitter, num_samples, min_ess, solver=solver)


def _prior_samples(prior, key, num_samples, dtype):
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if key is None:
        key = jax.random.PRNGKey(0)
    beta = jnp.asarray(prior.sample(key, (int(num_samples),)), dtype)
    if not bool(jnp.all(jnp.isfinite(beta) & (beta > 0))):
        bad = int(jnp.sum(~(jnp.isfinite(beta) & (beta > 0))))
        warnings.warn(f"{bad} of {num_samples} prior samples of sigma^2 were not positive and finite; dropped",
                      stacklevel=3)
        beta = beta[jnp.isfinite(beta) & (beta > 0)]
        if beta.shape[0] == 0:
            raise ValueError("no usable prior samples of sigma^2")
    return beta


def _importance_posterior(common, state, beta, log_w, jitter, num_samples, min_ess, solver=None):
    total = logsumexp(log_w)
    lml = float(total - jnp.log(log_w.shape[0]))
    log_wn = log_w - total
    ess = float(1.0 / jnp.sum(jnp.exp(2 * log_wn)))
    if not math.isfinite(lml):
        raise FloatingPointError("importance weights are all zero or non-finite; the prior misses the posterior")
    if ess < min_ess:
        warnings.warn(
            f"importance sampling effective sample size is {ess:.1f} of {log_w.shape[0]} samples: the prior is a poor "
            "proposal here; increase num_samples or check the prior", SmallESSWarning, stacklevel=3,
        )
    keep = np.asarray(log_wn > _PRUNE_LOG_WEIGHT)
    return ImportancePosterior(log_marginal_likelihood=lml, jitter=jitter, state=state, beta=beta[keep],
                               log_w=log_wn[keep] - logsumexp(log_wn[keep]), _ess=ess,
                               _num_samples=int(log_w.shape[0]), solver=solver, **common)
