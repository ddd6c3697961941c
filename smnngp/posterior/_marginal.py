"""The marginal likelihood of the scale mixture as pure, traceable pieces (shared with `smnngp.hyper`).

``log p(Y)`` of the Student-t process and of the NNGP from ``q = tr(Y^T C^-1 Y)`` and ``ln|C|``, and the importance
weights ``log N(Y; 0, beta C)`` (scaled noise, O(1) per ``beta``) and ``log N(Y; 0, beta K + noise I)`` (unscaled
noise, O(N) per ``beta`` from an eigendecomposition). `smnngp.posterior.log_marginal_likelihood`, the shortcut through
a fit, lives with the fit from kernel matrices (`smnngp.posterior._from_kernels`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.scipy.special import gammaln

_LOG_2PI = math.log(2.0 * math.pi)


def student_t_log_ml(q, logdet_c, n_obs, n_out, a, b):
    """``log p(Y)`` for ``Y ~ MVT(2a, 0, (b/a) I_C (x) C)`` given ``q = tr(Y^T C^-1 Y)`` and ``ln|C|``."""
    nc = n_obs * n_out
    return (
        gammaln(a + nc / 2) - gammaln(a) - nc / 2 * jnp.log(2 * jnp.pi * b) - n_out / 2 * logdet_c
        - (a + nc / 2) * jnp.log1p(q / (2 * b))
    )


def gaussian_log_ml(q, logdet_c, n_obs, n_out, s):
    """``log p(Y)`` for ``Y ~ N(0, s I_C (x) C)``."""
    nc = n_obs * n_out
    return -0.5 * q / s - 0.5 * n_out * logdet_c - 0.5 * nc * (jnp.log(s) + _LOG_2PI)


def scaled_log_weights(q, logdet_c, n_obs, n_out, beta):
    """``log N(Y; 0, beta C)`` for many ``beta`` at O(1) each (cached ``q`` and ``ln|C|``)."""
    return gaussian_log_ml(q, logdet_c, n_obs, n_out, beta)


def unscaled_log_weights(lam, ytilde_sq, noise, beta):
    """``log N(Y; 0, beta K + noise I)`` from ``K = U diag(lam) U^T`` and ``ytilde_sq = sum_c (U^T Y)^2``.

    O(N) per ``beta`` (vectorised over a 1-D ``beta``).
    """
    n_out = ytilde_sq.shape[-1] if ytilde_sq.ndim == 2 else 1
    ysq = ytilde_sq.sum(-1) if ytilde_sq.ndim == 2 else ytilde_sq
    d = beta[:, None] * lam[None, :] + noise
    n = lam.shape[0]
    quad = jnp.sum(ysq[None, :] / d, axis=1)
    return -0.5 * quad - 0.5 * n_out * jnp.sum(jnp.log(d), axis=1) - 0.5 * n * n_out * _LOG_2PI
