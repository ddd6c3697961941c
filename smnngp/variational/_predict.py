"""Prediction: the marginal q(f(x)) (`predict_f`), the predictive of y (`predict`) and joint draws (`sample_f`).

For the SVTP, sigma^2 is drawn once per joint sample (a true multivariate t: every test point and class shares it);
the class probabilities are Monte-Carlo averages in blocks of vectorised draws.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import ndtr

from smnngp import linalg
from smnngp.variational._elbo import _check_x, _draw_scale, _kmat, _marginals, _projection, _scale_ab, _st_a
from smnngp.variational._likelihoods import Bernoulli, Gaussian
from smnngp.variational._model import Model, Params, _positive_int

__all__ = ["predict_f", "predict", "sample_f"]


def predict_f(model: Model, params: Params, x):
    """Marginal q(f(x)) per point and latent function, batch shape (N, C): ``Normal`` (SVGP) or
    ``StudentT(2a, mean, sqrt((b/a) v))`` (SVTP).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (N, ...) with the per-point shape of the inducing inputs.

    Returns:
        numpyro ``Normal`` (SVGP) or ``StudentT`` (SVTP) with batch shape (N, C).

    Raises:
        ValueError: if ``x`` has the wrong shape, is empty or is not finite.
    """
    x = _check_x(model, x)
    mean, var = _marginals_jit(model, params, x)
    if model.kind == "svgp":
        return dist.Normal(mean, jnp.sqrt(var))
    a, b = _scale_ab(model, params)
    return dist.StudentT(2.0 * a, mean, jnp.sqrt((b / a) * var))


_marginals_jit = jax.jit(_marginals, static_argnums=0)


def _mc_average(one, key, num_samples, out_shape, dtype):
    """``(1/S) sum_s one(key_s)`` in blocks of vectorised draws (O(block * out) memory)."""
    size = int(np.prod(out_shape)) or 1
    block = max(1, min(num_samples, (1 << 22) // size))
    nb = -(-num_samples // block)
    keys = jax.random.split(key, nb * block)
    keys = keys.reshape((nb, block) + keys.shape[1:])
    w = (jnp.arange(nb * block) < num_samples).astype(dtype).reshape(nb, block) / num_samples

    def body(acc, inp):
        k, wk = inp
        return acc + jnp.tensordot(wk, jax.vmap(one)(k), axes=1), None

    acc, _ = jax.lax.scan(body, jnp.zeros(out_shape, dtype), (keys, w))
    return acc


def _class_probs(model, params, x, key, num_samples):
    """Predictive class probabilities (N, K), MC-averaged over joint draws (sigma^2 once per draw)."""
    mean, var = _marginals(model, params, x)
    lik = model.likelihood
    if isinstance(lik, Bernoulli):
        if model.kind == "svgp":
            p1 = ndtr(mean[:, 0] / jnp.sqrt(1.0 + var[:, 0]))
        else:
            def one(k):
                s = _draw_scale(model, params, k, ())
                return ndtr(mean[:, 0] / jnp.sqrt(1.0 + s * var[:, 0]))

            p1 = _mc_average(one, key, num_samples, mean.shape[:1], mean.dtype)
        return jnp.stack([1.0 - p1, p1], axis=-1)

    def one(k):
        k_s, k_e = jax.random.split(k)
        s = 1.0 if model.kind == "svgp" else _draw_scale(model, params, k_s, ())
        f = mean + jnp.sqrt(s * var) * jax.random.normal(k_e, mean.shape, mean.dtype)
        return jax.nn.softmax(f, axis=-1)

    return _mc_average(one, key, num_samples, mean.shape, mean.dtype)


def _gaussian_predictive(model, params, x, key, num_samples, noisy):
    mean, var = _marginals(model, params, x)
    noise = model.likelihood.variance(params.likelihood) if noisy else 0.0
    if model.kind == "svgp":
        return dist.Normal(mean, jnp.sqrt(var + noise))
    a, b = _scale_ab(model, params)
    if not noisy:
        return dist.StudentT(2.0 * a, mean, jnp.sqrt((b / a) * var))
    # y = f + e with f a t and e Gaussian is not a t: a mixture over draws of sigma^2 (equal weights)
    s = _draw_scale(model, params, key, (num_samples,))
    comp = dist.Normal(mean[..., None], jnp.sqrt(s * var[..., None] + noise))
    mix = dist.Categorical(logits=jnp.zeros((num_samples,), mean.dtype))
    return dist.MixtureSameFamily(mix, comp)


_class_probs_jit = jax.jit(_class_probs, static_argnums=(0, 4))
_gaussian_predictive_jit = jax.jit(_gaussian_predictive, static_argnums=(0, 4, 5))


def _predict(model, params, x, key, num_samples, noisy):
    # predict and the validation NLL of fit share these two compiled functions
    if isinstance(model.likelihood, Gaussian):
        return _gaussian_predictive_jit(model, params, x, key, num_samples, noisy)
    return dist.Categorical(probs=_class_probs_jit(model, params, x, key, num_samples))


def predict(model: Model, params: Params, x, key=None, num_samples: int = 1000, *, noisy: bool = True):
    """Predictive distribution of y at each point of ``x``.

    * Softmax / Bernoulli: ``Categorical(probs)``, batch shape (N,), with ``probs`` (N, C) the average over
      ``num_samples`` joint draws of f (sigma^2 drawn once per draw) of the class probabilities (the Bernoulli
      SVGP is exact: ``Phi(mean / sqrt(1 + var))``; the Bernoulli SVTP averages that closed form over sigma^2).
    * Gaussian: batch shape (N, C); SVGP ``Normal``; SVTP ``StudentT`` for ``noisy=False`` (the latent f), else
      the equal-weight ``MixtureSameFamily`` of ``N(mean, sigma_s^2 v + noise)`` over ``num_samples`` draws of
      sigma^2 (a t plus Gaussian noise is not a t).
    ``noisy=False`` gives the latent f (Gaussian likelihood only).  ``key`` defaults to ``PRNGKey(0)``.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (N, ...).
        key: JAX PRNG key for the Monte-Carlo draws (``None``: ``PRNGKey(0)``).
        num_samples: number of draws of f or sigma^2 (a positive int).
        noisy: include the observation noise (Gaussian likelihood; ignored otherwise).

    Returns:
        numpyro distribution of y: ``Categorical``, ``Normal``, ``StudentT`` or ``MixtureSameFamily``, as above.

    Raises:
        ValueError: if ``x`` is invalid or ``num_samples`` is not a positive integer.
    """
    x = _check_x(model, x)
    num_samples = _positive_int(num_samples, "num_samples")
    if key is None:
        key = jax.random.PRNGKey(0)
    return _predict(model, params, x, key, num_samples, bool(noisy))


def _full_latent(model, params, x):
    """Mean (N, C) and covariance at sigma^2 = 1 (C, N, N) of q(f(x))."""
    A, _ = _projection(model, params, x)
    kxx = _kmat(model, params.kernel, x, x)
    SA = _st_a(model, params, A)
    mean = (params.q_mean @ A).T
    cov = kxx[None] - (A.T @ A)[None] + jnp.einsum("ckb,ckd->cbd", SA, SA)
    return mean, 0.5 * (cov + jnp.swapaxes(cov, -1, -2))


_full_latent_jit = jax.jit(_full_latent, static_argnums=0)


def sample_f(model: Model, params: Params, key, x, num_samples: int = 1):
    """Joint draws of the latent functions at ``x`` from q, shape (num_samples, N, C).

    For the SVTP each draw takes one sigma^2 ~ q(sigma^2), shared by all points and classes (multivariate t).
    The (N, N) covariance per class is factorised with `smnngp.linalg.cholesky` (jitter escalation, eager).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        key: JAX PRNG key.
        x: inputs, (N, ...).
        num_samples: number of joint draws (a positive int).

    Returns:
        Array of shape (num_samples, N, C) of latent function values.

    Raises:
        ValueError: if ``x`` is invalid or ``num_samples`` is not a positive integer.
        NotPositiveDefiniteError: if a class covariance cannot be factorised even with jitter.
    """
    x = _check_x(model, x)
    num_samples = _positive_int(num_samples, "num_samples")
    mean, cov = _full_latent_jit(model, params, x)
    chols = jnp.stack([linalg.cholesky(c, name=f"variational covariance of class {i}").L for i, c in enumerate(cov)])
    k_s, k_z = jax.random.split(key)
    z = jax.random.normal(k_z, (num_samples,) + mean.shape, mean.dtype)
    draws = mean[None] + jnp.einsum("cij,sjc->sic", chols, z)
    if model.kind == "svtp":
        s = _draw_scale(model, params, k_s, (num_samples,))
        draws = mean[None] + jnp.sqrt(s)[:, None, None] * (draws - mean[None])
    return draws
