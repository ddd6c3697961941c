"""One home for the metrics and summaries that experiments report."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rmse", "mean_se", "compare_marker", "format_mean_se", "mixture_nll", "mixture_crps", "mixture_interval",
           "coverage", "expected_calibration_error"]


def rmse(y, mean) -> float:
    y, mean = np.asarray(y, float), np.asarray(mean, float)
    if y.shape != mean.shape:
        raise ValueError(f"rmse: shapes differ, y {y.shape} vs mean {mean.shape}")
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
    v = np.asarray(values, float)
    if v.size == 0:
        raise ValueError("mean_se of no values")
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0
    return float(v.mean()), se


def format_mean_se(m: float, se: float, digits: int = 2) -> str:
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def compare_marker(ours: tuple[float, float], theirs: tuple[float, float], lower_is_better: bool = True) -> str:
    """'+' when ours is better beyond both error bars, '-' when worse beyond them, '' otherwise."""
    (m1, s1), (m2, s2) = ours, theirs
    gap = s1 + s2
    if lower_is_better:
        m1, m2 = -m1, -m2
    if m1 - m2 > gap:
        return "+"
    if m2 - m1 > gap:
        return "-"
    return ""


# ---------------------------------------------------------------------------
# equally weighted Gaussian mixtures (posterior-sample predictives)
# ---------------------------------------------------------------------------

def _mixture_args(mu, sigma, y=None):
    mu, sigma = np.asarray(mu, float), np.asarray(sigma, float)
    if mu.ndim != 2:
        raise ValueError(f"mixture: mu must be (samples, points), got shape {mu.shape}")
    sigma = np.broadcast_to(sigma.reshape(sigma.shape + (1,) * (2 - sigma.ndim)) if sigma.ndim < 2 else sigma,
                            mu.shape)
    if not np.all(sigma > 0):
        raise ValueError("mixture: every sigma must be > 0")
    if y is not None:
        y = np.asarray(y, float).reshape(-1)
        if y.shape[0] != mu.shape[1]:
            raise ValueError(f"mixture: {y.shape[0]} targets for {mu.shape[1]} points")
    return mu, sigma, y


def mixture_nll(y, mu, sigma) -> float:
    """Mean over points of ``-log (1/S) sum_s N(y_i; mu_si, sigma_si^2)``.

    ``mu`` is (S, n); ``sigma`` is (S,) or (S, n).
    """
    from scipy.special import logsumexp

    mu, sigma, y = _mixture_args(mu, sigma, y)
    logp = -0.5 * ((y - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * math.log(2 * math.pi)
    return float(-np.mean(logsumexp(logp, axis=0) - math.log(mu.shape[0])))


def mixture_crps(y, mu, sigma) -> float:
    """Mean CRPS of the mixture, closed form (Grimit et al. 2006):
    ``sum_m w_m A(y - mu_m, s_m^2) - 1/2 sum_mk w_m w_k A(mu_m - mu_k, s_m^2 + s_k^2)`` with
    ``A(m, v) = 2 sqrt(v) phi(m / sqrt(v)) + m (2 Phi(m / sqrt(v)) - 1)``."""
    from scipy.special import ndtr

    mu, sigma, y = _mixture_args(mu, sigma, y)
    c = np.sqrt(2 / np.pi)

    def A(m, v):  # ndtr and exp directly: the S^2 pair loop dominates for large mixtures
        s = np.sqrt(v)
        z = m / s
        return c * s * np.exp(-0.5 * z * z) + m * (2 * ndtr(z) - 1)

    S = mu.shape[0]
    first = A(y - mu, sigma**2).mean(0)
    second = np.zeros(mu.shape[1])
    for m in range(S):  # A is even in its first argument: pairs k > m count twice, the diagonal once
        second += 2 * A(mu[m] - mu[m + 1:], sigma[m] ** 2 + sigma[m + 1:] ** 2).sum(0)
        second += A(np.zeros_like(mu[m]), 2 * sigma[m] ** 2)
    return float(np.mean(first - 0.5 * second / S**2))


def mixture_interval(mu, sigma, level: float = 0.95, tol: float = 1e-8):
    """Equal-tailed ``level`` interval of the mixture at every point, by bisection on its CDF."""
    from scipy.stats import norm

    mu, sigma, _ = _mixture_args(mu, sigma)
    if not 0 < level < 1:
        raise ValueError(f"mixture_interval: level must be in (0, 1), got {level}")
    out = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        lo = (mu - 10 * sigma).min(0)
        hi = (mu + 10 * sigma).max(0)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            below = norm.cdf((mid - mu) / sigma).mean(0) < q
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
            if np.max(hi - lo) < tol * max(1.0, float(np.max(np.abs(mid)))):
                break
        out.append(0.5 * (lo + hi))
    return out[0], out[1]


def coverage(y, lo, hi) -> float:
    """Fraction of ``y`` inside ``[lo, hi]``."""
    y = np.asarray(y, float).reshape(-1)
    return float(np.mean((y >= np.asarray(lo)) & (y <= np.asarray(hi))))


def expected_calibration_error(probs, labels, bins: int = 15) -> float:
    """Top-label ECE with equal-width confidence bins: ``sum_b (n_b / n) |acc_b - conf_b|``.

    (The masked-BNN paper's numbers come from the ``uncertainty-calibration`` package's debiased marginal
    l2 estimator, a different quantity; this is the common definition.)
    """
    probs = np.asarray(probs, float)
    labels = np.asarray(labels).reshape(-1)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0]:
        raise ValueError(f"ece: probs must be (n, classes) with n = len(labels), got {probs.shape}")
    conf = probs.max(1)
    correct = probs.argmax(1) == labels
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1]), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return float(total)
