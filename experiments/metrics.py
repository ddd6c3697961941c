"""One home for the metrics and summaries that experiments report.

Regression: `rmse`, and for equally weighted Gaussian mixtures (posterior-sample predictives) `mixture_nll`,
`mixture_crps`, `mixture_interval`, `coverage`. Summaries: `mean_se`, `format_mean_se`, `compare_marker`.

Classification, on predicted class probabilities ``probs`` (n, C) and integer labels (n,): `accuracy`,
`categorical_nll`, `brier_score`, `expected_calibration_error` (equal-width or equal-mass bins) with
`calibration_bins` for reliability diagrams, `predictive_entropy`, `max_probability`, and `ood_auroc` for
out-of-distribution detection from such a score, `ood_aupr`; for Monte-Carlo predictives (member or sample
probabilities (S, n, C)) `mutual_information` (epistemic part of the entropy); `selective_risk` (the
risk-coverage curve of selective prediction and its area).

Predictive intervals and samples (low-rank and ARD experiments): `picp` (= `coverage`), `mpiw`,
`interval_score`, `coverage_calibration` (coverage-based calibration error of central intervals) and
`sample_crps` (CRPS of an empirical predictive from its samples).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rmse", "mean_se", "compare_marker", "format_mean_se", "mixture_nll", "mixture_crps", "mixture_interval",
           "coverage", "accuracy", "categorical_nll", "brier_score", "calibration_bins", "expected_calibration_error",
           "predictive_entropy", "max_probability", "ood_auroc", "BINNINGS", "ood_aupr",
           "mutual_information", "selective_risk", "picp", "mpiw", "interval_score", "coverage_calibration",
           "sample_crps"]


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


def _interval_args(y, lo, hi, who):
    y = np.asarray(y, float).reshape(-1)
    lo, hi = np.asarray(lo, float).reshape(-1), np.asarray(hi, float).reshape(-1)
    if not (lo.shape == hi.shape == y.shape):
        raise ValueError(f"{who}: y, lo and hi must have the same number of points, got {y.size}, {lo.size}, "
                         f"{hi.size}")
    if not (np.isfinite(y).all() and np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError(f"{who}: y, lo and hi must be finite")
    if np.any(lo > hi):
        raise ValueError(f"{who}: lo > hi at {int(np.sum(lo > hi))} points")
    return y, lo, hi


def coverage(y, lo, hi) -> float:
    """Fraction of ``y`` inside ``[lo, hi]`` (the prediction-interval coverage probability, PICP)."""
    y, lo, hi = _interval_args(y, lo, hi, "coverage")
    return float(np.mean((y >= lo) & (y <= hi)))


picp = coverage


def mpiw(lo, hi) -> float:
    """Mean prediction-interval width ``mean(hi - lo)``."""
    lo, hi = np.asarray(lo, float).reshape(-1), np.asarray(hi, float).reshape(-1)
    _interval_args(lo, lo, hi, "mpiw")
    return float(np.mean(hi - lo))


def interval_score(y, lo, hi, alpha: float = 0.05) -> float:
    """Mean interval score of central ``(1 - alpha)`` intervals (Gneiting and Raftery 2007, eq. 43):
    ``(hi - lo) + (2 / alpha) (lo - y) 1[y < lo] + (2 / alpha) (y - hi) 1[y > hi]``; lower is better, and it is
    proper: minimised in expectation by the true ``alpha/2`` and ``1 - alpha/2`` quantiles."""
    if not 0 < alpha < 1:
        raise ValueError(f"interval_score: alpha must be in (0, 1), got {alpha}")
    y, lo, hi = _interval_args(y, lo, hi, "interval_score")
    return float(np.mean((hi - lo) + (2 / alpha) * np.clip(lo - y, 0, None) + (2 / alpha) * np.clip(y - hi, 0, None)))


def _samples_args(y, samples, who):
    samples = np.asarray(samples, float)
    if samples.ndim == 1:
        samples = samples[:, None]
    if samples.ndim != 2:
        raise ValueError(f"{who}: samples must be (S, n), got shape {samples.shape}")
    y = np.asarray(y, float).reshape(-1)
    if y.shape[0] != samples.shape[1]:
        raise ValueError(f"{who}: {y.shape[0]} targets for {samples.shape[1]} points")
    if not (np.isfinite(samples).all() and np.isfinite(y).all()):
        raise ValueError(f"{who}: samples and y must be finite")
    return y, samples


def sample_crps(y, samples) -> float:
    """Mean CRPS of the empirical predictive of ``samples`` (S, n) at targets ``y`` (n,):
    ``E|X - y| - (1/2) E|X - X'|`` over the S samples (the energy form, Gneiting and Raftery 2007, eq. 21),
    computed exactly from the sorted samples: ``E|X - X'| = (2 / S^2) sum_i (2i - S - 1) x_(i)``."""
    y, x = _samples_args(y, samples, "sample_crps")
    S = x.shape[0]
    first = np.mean(np.abs(x - y), axis=0)
    xs = np.sort(x, axis=0)
    w = (2 * np.arange(1, S + 1) - S - 1)[:, None]
    pair = 2.0 * np.sum(w * xs, axis=0) / S**2
    return float(np.mean(first - 0.5 * pair))


def coverage_calibration(y, samples, levels=None) -> dict:
    """Coverage-based calibration of a sampled predictive: for each central level p (default 0.1, 0.2, ..., 0.9,
    0.95, 0.99) the observed coverage of the equal-tailed interval of the samples (S, n); returns ``levels``,
    ``observed`` and ``ece = mean_p |observed(p) - p|`` (the regression ECE of Kuleshov et al. 2018, with central
    intervals)."""
    y, x = _samples_args(y, samples, "coverage_calibration")
    levels = np.asarray([*np.arange(1, 10) / 10, 0.95, 0.99] if levels is None else levels, float)
    if not np.all((levels > 0) & (levels < 1)):
        raise ValueError("coverage_calibration: levels must lie in (0, 1)")
    lo = np.quantile(x, (1 - levels) / 2, axis=0)  # (L, n)
    hi = np.quantile(x, (1 + levels) / 2, axis=0)
    observed = np.mean((y >= lo) & (y <= hi), axis=1)
    return {"levels": levels.tolist(), "observed": observed.tolist(), "ece": float(np.mean(np.abs(observed - levels)))}


# ---------------------------------------------------------------------------
# classification
# ---------------------------------------------------------------------------

BINNINGS = ("equal-width", "equal-mass")
PROB_SUM_TOL = 1e-3  # rows of probs must sum to 1 within this (catches logits passed by mistake)


def _probs(probs, who: str) -> np.ndarray:
    p = np.asarray(probs, float)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"{who}: probs must be (n, classes) with n, classes >= 1, got shape {p.shape}")
    if not np.isfinite(p).all() or p.min() < 0:
        raise ValueError(f"{who}: probs must be finite and non-negative")
    sums = p.sum(1)
    if np.max(np.abs(sums - 1.0)) > PROB_SUM_TOL:
        raise ValueError(f"{who}: each row of probs must sum to 1, got sums in [{sums.min():.6g}, {sums.max():.6g}]")
    return p


def _probs_labels(probs, labels, who: str) -> tuple[np.ndarray, np.ndarray]:
    p = _probs(probs, who)
    y = np.asarray(labels).reshape(-1)
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"{who}: {y.shape[0]} labels for probs of shape {p.shape}")
    if y.dtype.kind not in "iu":
        if y.dtype.kind != "f" or not np.all(y == np.round(y)):
            raise ValueError(f"{who}: labels must be integers, got dtype {y.dtype}")
        y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= p.shape[1]:
        raise ValueError(f"{who}: labels must be in 0..{p.shape[1] - 1}, got {y.min()}..{y.max()}")
    return p, y


def accuracy(probs, labels) -> float:
    """Fraction of points whose most probable class (the first, on ties) is the label."""
    p, y = _probs_labels(probs, labels, "accuracy")
    return float(np.mean(p.argmax(1) == y))


def categorical_nll(probs, labels, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``-(1/n) sum_i log p_i[y_i]`` (nats), with ``p_i[y_i]`` clipped to
    ``[eps, 1]`` so that a zero probability costs ``-log(eps)`` (27.6 nats by default) instead of infinity.

    For the Monte-Carlo predictive of the notes (Sec. 3.4), pass ``probs = mean_s softmax(f_s)``."""
    p, y = _probs_labels(probs, labels, "categorical_nll")
    if not 0 < eps < 1:
        raise ValueError(f"categorical_nll: eps must be in (0, 1), got {eps}")
    return float(-np.mean(np.log(np.clip(p[np.arange(y.size), y], eps, 1.0))))


def brier_score(probs, labels) -> float:
    """Multi-class Brier score (Brier 1950): ``(1/n) sum_i sum_c (p_ic - [c = y_i])^2``, in [0, 2]. (For two
    classes it is twice scikit-learn's ``brier_score_loss``, which scores one class's probability only.)"""
    p, y = _probs_labels(probs, labels, "brier_score")
    target = np.zeros_like(p)
    target[np.arange(y.size), y] = 1.0
    return float(np.mean(np.sum((p - target) ** 2, axis=1)))


def calibration_bins(probs, labels, bins: int = 15, binning: str = "equal-width"):
    """Top-label reliability bins: ``(confidence, accuracy, count)``, arrays over the non-empty bins in order
    of confidence, where confidence is ``max_c p_ic`` and accuracy whether its argmax is the label.

    * ``"equal-width"``: bin ``b`` holds confidences in ``(b / B, (b + 1) / B]`` (a confidence of exactly 0
      joins the first bin), as in Guo et al. (2017).
    * ``"equal-mass"``: points sorted by confidence (stable sort) are cut into ``B`` consecutive groups whose
      sizes differ by at most one, the larger first (``np.array_split``); Nixon et al. (2019), Roelofs et
      al. (2022). Equal confidences may fall on both sides of a cut.
    """
    p, y = _probs_labels(probs, labels, "calibration_bins")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"calibration_bins: bins must be a positive integer, got {bins!r}")
    conf = p.max(1)
    correct = (p.argmax(1) == y).astype(float)
    if binning == "equal-width":
        edges = np.linspace(0.0, 1.0, bins + 1)
        which = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
        groups = [np.flatnonzero(which == b) for b in range(bins)]
    elif binning == "equal-mass":
        groups = np.array_split(np.argsort(conf, kind="stable"), bins)
    else:
        raise ValueError(f"calibration_bins: unknown binning {binning!r}; choose one of {', '.join(BINNINGS)}")
    groups = [g for g in groups if g.size]
    return (np.array([conf[g].mean() for g in groups]), np.array([correct[g].mean() for g in groups]),
            np.array([g.size for g in groups]))


def expected_calibration_error(probs, labels, bins: int = 15, binning: str = "equal-width") -> float:
    """Top-label ECE ``sum_b (n_b / n) |acc_b - conf_b|`` over `calibration_bins` (equal-width by default,
    ``binning="equal-mass"`` for equal-mass bins).

    (The masked-BNN paper's numbers come from the ``uncertainty-calibration`` package's debiased marginal
    l2 estimator, a different quantity; this is the common definition.)
    """
    conf, acc, count = calibration_bins(probs, labels, bins, binning)
    return float(np.sum(count * np.abs(acc - conf)) / np.sum(count))


def predictive_entropy(probs) -> np.ndarray:
    """Entropy ``-sum_c p_c log p_c`` (nats; ``0 log 0 = 0``) of each row: (n,)."""
    from scipy.special import entr

    return entr(_probs(probs, "predictive_entropy")).sum(1)


def max_probability(probs) -> np.ndarray:
    """Confidence ``max_c p_c`` of each row: (n,)."""
    return _probs(probs, "max_probability").max(1)


def ood_auroc(score, is_ood, higher_is_ood: bool = True) -> float:
    """Area under the ROC curve for telling out-of-distribution points (``is_ood`` true) from in-distribution
    ones by ``score`` (scikit-learn's ``roc_auc_score``, OOD the positive class): the probability that an OOD
    point scores above an in-distribution one, ties counting one half. Use ``predictive_entropy`` as is, or
    ``max_probability`` with ``higher_is_ood=False``. 0.5 is chance, 1 perfect."""
    from sklearn.metrics import roc_auc_score

    s = np.asarray(score, float).reshape(-1)
    ood = np.asarray(is_ood).reshape(-1)
    if ood.shape != s.shape:
        raise ValueError(f"ood_auroc: {ood.size} is_ood flags for {s.size} scores")
    if ood.dtype != bool:
        if not np.isin(ood, (0, 1)).all():
            raise ValueError("ood_auroc: is_ood must be boolean (or 0/1)")
        ood = ood.astype(bool)
    if not np.isfinite(s).all():
        raise ValueError("ood_auroc: score has non-finite values")
    if ood.all() or not ood.any():
        n_ood = int(ood.sum())
        raise ValueError(f"ood_auroc: needs both in-distribution and OOD points, got {n_ood} OOD of {ood.size}")
    return float(roc_auc_score(ood, s if higher_is_ood else -s))


def ood_aupr(score, is_ood, higher_is_ood: bool = True) -> float:
    """Area under the precision-recall curve with OOD the positive class (scikit-learn's
    ``average_precision_score``); chance level is the OOD fraction. Arguments as :func:`ood_auroc`."""
    from sklearn.metrics import average_precision_score

    ood_auroc(score, is_ood, higher_is_ood)  # the same validation
    s = np.asarray(score, float).reshape(-1)
    ood = np.asarray(is_ood).reshape(-1).astype(bool)
    return float(average_precision_score(ood, s if higher_is_ood else -s))


def mutual_information(sample_probs) -> np.ndarray:
    """Epistemic uncertainty of a Monte-Carlo predictive: ``H[mean_s p_s] - mean_s H[p_s]`` per point (nats,
    >= 0; the BALD score of Houlsby et al. 2011), from ``sample_probs`` (S, n, C) of S weight samples or members."""
    from scipy.special import entr

    p = np.asarray(sample_probs, float)
    if p.ndim != 3:
        raise ValueError(f"mutual_information: sample_probs must be (samples, n, classes), got shape {p.shape}")
    for s in range(p.shape[0]):
        _probs(p[s], "mutual_information")
    total = entr(p.mean(0)).sum(-1)
    aleatoric = entr(p).sum(-1).mean(0)
    return np.clip(total - aleatoric, 0.0, None)


def selective_risk(loss, uncertainty, coverages=None) -> dict:
    """Selective prediction: keep the fraction ``c`` of points with the lowest ``uncertainty`` and report the mean
    ``loss`` (e.g. 0/1 error or absolute error) on them, for each coverage in ``coverages`` (default 0.05, 0.10,
    ..., 1.0). Returns ``coverages``, ``risk`` and ``aurc``, the area under the risk-coverage curve over all n
    cut-offs (lower is better; Geifman and El-Yaniv 2017). Ties in ``uncertainty`` are broken by a stable sort."""
    loss = np.asarray(loss, float).reshape(-1)
    u = np.asarray(uncertainty, float).reshape(-1)
    if loss.shape != u.shape or loss.size == 0:
        raise ValueError(f"selective_risk: loss and uncertainty must be non-empty and of one length, got {loss.size} "
                         f"and {u.size}")
    if not (np.isfinite(loss).all() and np.isfinite(u).all()):
        raise ValueError("selective_risk: loss and uncertainty must be finite")
    cov = np.arange(1, 21) / 20 if coverages is None else np.asarray(coverages, float)
    if not np.all((cov > 0) & (cov <= 1)):
        raise ValueError("selective_risk: coverages must lie in (0, 1]")
    running = np.cumsum(loss[np.argsort(u, kind="stable")]) / np.arange(1, loss.size + 1)
    keep = np.maximum(1, np.ceil(cov * loss.size - 1e-9).astype(int))
    return {"coverages": cov.tolist(), "risk": running[keep - 1].tolist(), "aurc": float(np.mean(running))}
