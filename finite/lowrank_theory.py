"""Theory of low-rank Bayesian networks, computed from trained models (Toure & Stephens, *Singular Bayesian
Neural Networks*, Sec. 3 and App. B-E; notes ``001_singular_bnn.md`` sections 1.6 and 5; issue 15, section 2).

Orientation: a weight matrix ``W`` has shape ``(m, n)`` and ``W = A B^T`` with ``A (m, r)``, ``B (n, r)``
(``W_ij = sum_k A_ik B_jk``, Lemma 3.5); for ``finite.lowrank`` layers ``m = n_in``, ``n = n_out``. Singular-value
results do not depend on the orientation.

* Rank truncation (Sec. 3.3, App. C): :func:`tail_energy` ``sum_{i>r} sigma_i^2`` (``= ||W - W_r||_F^2`` by
  Eckart-Young-Mirsky, Thm C.3), :func:`energy_retention`, :func:`eym_loss_bound` (Thm 3.6),
  :func:`approximation_error_bound` (Thm 3.7 / C.6, with the square root of the appendix; the main text's Eq. 4
  drops it), :func:`stochastic_loss_gap_bound` (Thm C.8), :data:`LIPSCHITZ` (Table 5).
* PAC-Bayes (Sec. 3.4, App. D): :func:`mcallester_bound` (Thm D.2), :func:`kl_cap_full` /
  :func:`kl_cap_lowrank` (Lemma D.3, Remark D.6), :func:`complexity_ratio` (Thm 3.8, Eq. 5),
  :func:`pac_bayes_rank_curve`, :func:`coordinate_kl` (the per-coordinate ``KL(q_i || p_i)`` whose maximum is
  ``C_max``; Gauss-Hermite quadrature against any prior).
* Gaussian complexity (Sec. 3.5, App. E): :func:`gaussian_complexity_bound` (Thm E.17), its full-rank
  comparison :func:`full_rank_complexity_bound` (Remark E.19), :func:`gaussian_complexity_generalization_bound`
  (Thm 3.9 / E.15).
* Induced weight covariance (Lemma 3.5, App. B.7; Figure 1): :func:`lowrank_weight_covariance`,
  :func:`lowrank_weight_variance`, :func:`meanfield_weight_covariance`, :func:`covariance_to_correlation`.

All functions are plain NumPy (float64) unless stated; they take trained parameters as arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "LIPSCHITZ",
    "mse_lipschitz",
    "singular_values",
    "truncate",
    "tail_energy",
    "energy_retention",
    "eym_loss_bound",
    "approximation_error_bound",
    "stochastic_loss_gap_bound",
    "mcallester_bound",
    "kl_cap_full",
    "kl_cap_lowrank",
    "complexity_ratio",
    "pac_bayes_rank_curve",
    "critical_rank",
    "coordinate_kl",
    "bounded_regression_loss",
    "spectral_norm",
    "gaussian_complexity_bound",
    "full_rank_complexity_bound",
    "gaussian_complexity_generalization_bound",
    "factor_variance",
    "lowrank_weight_covariance",
    "lowrank_weight_variance",
    "meanfield_weight_covariance",
    "covariance_to_correlation",
    "rank_manifold_dimension",
]

#: Lipschitz constants ``L`` of common losses in their first argument (paper Table 5, App. C.5); MSE's is
#: ``2B`` for ``||z||, ||y|| <= B`` (:func:`mse_lipschitz`).
LIPSCHITZ = {"mae": 1.0, "cross_entropy": math.sqrt(2.0), "binary_cross_entropy": 1.0, "hinge": 1.0}


def mse_lipschitz(bound: float) -> float:
    """``L = 2B`` for the squared error when predictions and targets satisfy ``||z||, ||y|| <= B`` (Table 5).

    Args:
        bound: the norm bound ``B`` on predictions and targets (positive, finite).

    Returns:
        The Lipschitz constant ``2 B`` as a float.

    Raises:
        ValueError: if ``bound`` is not positive and finite.
    """
    return 2.0 * _pos(bound, "bound", "mse_lipschitz")


def _pos(value, name, where, allow_zero=False):
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{where}: {name} must be {'non-negative' if allow_zero else 'positive'} and finite, "
                         f"got {value!r}")
    return v


def _matrix(W, where, name="W"):
    W = np.asarray(W, dtype=float)
    if W.ndim != 2:
        raise ValueError(f"{where}: {name} must be a matrix, got shape {W.shape}")
    return W


def _ranks(ranks, rmax, where):
    arr = np.atleast_1d(np.asarray(ranks))
    if not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 0):
        raise ValueError(f"{where}: ranks must be non-negative integers, got {ranks!r}")
    if np.any(arr > rmax):
        raise ValueError(f"{where}: ranks must not exceed {rmax}, got max {int(arr.max())}")
    return arr


def singular_values(W) -> np.ndarray:
    """Singular values of a matrix ``W``, descending (or ``W`` itself when it is already a 1-D array of them).

    Args:
        W: a 2-D matrix ``(m, n)``, or a 1-D array of non-negative singular values (in any order).

    Returns:
        1-D float array of the singular values in descending order (``min(m, n)`` of them for a matrix; a 1-D
        input is returned sorted).

    Raises:
        ValueError: if a 1-D input has negative entries or ``W`` has neither one nor two axes.
    """
    W = np.asarray(W, dtype=float)
    if W.ndim == 1:
        if np.any(W < 0):
            raise ValueError("singular_values: a 1-D input must hold non-negative singular values")
        return np.sort(W)[::-1]
    return np.linalg.svd(_matrix(W, "singular_values"), compute_uv=False)


def truncate(W, rank: int) -> np.ndarray:
    """Best rank-``r`` approximation ``W_r = U_r Sigma_r V_r^T`` (truncated SVD; Thm C.3).

    Args:
        W: the matrix ``(m, n)`` to truncate.
        rank: the rank ``r``, an integer in ``0 .. min(m, n)`` (0 gives the zero matrix).

    Returns:
        Float array ``(m, n)``, the truncated-SVD approximation ``W_r``.

    Raises:
        ValueError: if ``W`` is not a matrix or ``rank`` is not an integer in ``0 .. min(m, n)``.
    """
    W = _matrix(W, "truncate")
    r = int(_ranks(rank, min(W.shape), "truncate")[0])
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    return (U[:, :r] * s[:r]) @ Vt[:r]


def tail_energy(W, ranks) -> np.ndarray:
    """``sigma_{>r}^2 = sum_{i=r+1}^rho sigma_i^2(W)`` for each ``r`` in ``ranks``.

    By Eckart-Young-Mirsky (Thm C.3) this equals ``||W - W_r||_F^2``. ``W`` a matrix or its singular values.
    Returns an array shaped like ``ranks`` (a float for a scalar rank).
    """
    s = singular_values(W)
    r = _ranks(ranks, s.size, "tail_energy")
    tail = np.concatenate([np.cumsum((s ** 2)[::-1])[::-1], [0.0]])  # tail[r] = sum_{i >= r} s_i^2 (0-based)
    out = tail[r]
    return float(out[0]) if np.ndim(ranks) == 0 else out


def energy_retention(W, ranks) -> np.ndarray:
    """``E(r) = sum_{i<=r} sigma_i^2 / sum_i sigma_i^2`` (the cumulative energy of Figs. 9 and 15).

    Args:
        W: a matrix, or its singular values as a 1-D array.
        ranks: one rank or an array of ranks, integers in ``0 .. rho`` (``rho`` the number of singular values).

    Returns:
        The fraction of ``||W||_F^2`` kept by the first ``r`` singular values: a float for a scalar rank, else an
        array with one entry per rank.

    Raises:
        ValueError: if ``W`` is zero or a rank is negative, not an integer or larger than ``rho``.
    """
    s = singular_values(W)
    total = float(np.sum(s ** 2))
    if total == 0:
        raise ValueError("energy_retention: W is zero")
    out = 1.0 - np.atleast_1d(tail_energy(s, np.atleast_1d(ranks))) / total
    return float(out[0]) if np.ndim(ranks) == 0 else out


def eym_loss_bound(W, ranks, lipschitz: float, radius: float) -> np.ndarray:
    """Theorem 3.6: ``|E l(W* x, y) - E l(W*_r x, y)| <= L R sqrt(sum_{i>r} sigma_i^2(W*))``.

    Args: ``W`` the trained full-rank matrix ``W*`` (or its singular values); ``ranks``; ``lipschitz`` ``L`` of
    the loss (:data:`LIPSCHITZ`); ``radius`` ``R`` with ``||x||_2 <= R`` almost surely (for a hidden layer, a bound
    on its input's norm). Returns the bound for each rank.
    """
    L = _pos(lipschitz, "lipschitz", "eym_loss_bound")
    R = _pos(radius, "radius", "eym_loss_bound")
    return L * R * np.sqrt(tail_energy(W, ranks))


def approximation_error_bound(W_learned, W_star, rank: int, lipschitz: float, radius: float) -> dict:
    """Theorem 3.7 (App. C.6): ``|l(W x, y) - l(W* x, y)| <= L R (||W - W*_r||_F + sqrt(sigma_{>r}^2(W*)))``.

    ``W_learned`` is the learned rank-``r`` matrix (e.g. the posterior mean ``mu_A mu_B^T``), ``W_star`` the
    full-rank optimum. The appendix's square root is used (the main text's Eq. 4 omits it; notes 8.2 I).
    Returns ``{"learning_error", "rank_bias", "bound"}`` with ``learning_error = ||W - W*_r||_F`` and
    ``rank_bias = sqrt(sigma_{>r}^2)``.

    Args:
        W_learned: the learned rank-``r`` matrix ``W``, shape ``(m, n)``.
        W_star: the full-rank optimum ``W*``, same shape.
        rank: the rank ``r`` at which ``W*`` is truncated (an integer in ``0 .. min(m, n)``).
        lipschitz: the Lipschitz constant ``L`` of the loss in its first argument (:data:`LIPSCHITZ`).
        radius: ``R`` with ``||x||_2 <= R`` almost surely.

    Returns:
        A dict of floats: ``learning_error``, ``rank_bias`` and ``bound = L R (learning_error + rank_bias)``.

    Raises:
        ValueError: if the matrices are not 2-D or differ in shape, ``rank`` is out of range, or ``lipschitz`` or
            ``radius`` is not positive and finite.
    """
    where = "approximation_error_bound"
    W = _matrix(W_learned, where, "W_learned")
    Ws = _matrix(W_star, where, "W_star")
    if W.shape != Ws.shape:
        raise ValueError(f"{where}: W_learned {W.shape} and W_star {Ws.shape} differ in shape")
    L = _pos(lipschitz, "lipschitz", where)
    R = _pos(radius, "radius", where)
    learn = float(np.linalg.norm(W - truncate(Ws, rank)))
    bias = math.sqrt(tail_energy(Ws, int(rank)))
    return {"learning_error": learn, "rank_bias": bias, "bound": L * R * (learn + bias)}


def stochastic_loss_gap_bound(x, mu_full, mu_lowrank, var_full_out: float, var_lowrank_out: float,
                              lipschitz: float, smoothness: float) -> float:
    """Theorem C.8: ``Delta <= L ||x||_2 ||mu_f - mu_r||_F + (beta / 2) (Var(W_full x) + Var(A B^T x))``.

    ``mu_full``, ``mu_lowrank``: the mean matrices (orientation ``z = W x``: ``(d_out, d_in)``; or transpose both
    for ``x @ W``, the Frobenius norm is unchanged); ``var_*_out = E ||z - E z||^2`` of the two output
    distributions (Monte Carlo or closed form, e.g. the trace of :func:`lowrank_weight_covariance` contracted
    with ``x``); ``lipschitz`` ``L``; ``smoothness`` ``beta`` (MSE 2; cross-entropy: the softmax Hessian's
    eigenvalues lie in ``[0, 1/2]``, Table 5 writes O(1)).

    Args:
        x: the input vector (any shape: its Euclidean norm ``||x||_2`` enters).
        mu_full: mean matrix ``mu_f`` of the full-rank posterior.
        mu_lowrank: mean matrix ``mu_r = mu_A mu_B^T`` of the low-rank posterior, same shape as ``mu_full``.
        var_full_out: ``Var(W_full x) = E ||z - E z||^2`` under the full-rank posterior (non-negative).
        var_lowrank_out: ``Var(A B^T x)`` under the low-rank posterior (non-negative).
        lipschitz: the Lipschitz constant ``L`` of the loss (positive).
        smoothness: the smoothness constant ``beta`` of the loss (non-negative).

    Returns:
        The bound on the expected-loss gap ``Delta``, a float.

    Raises:
        ValueError: if the mean matrices are not 2-D or differ in shape, ``lipschitz`` is not positive and finite,
            or ``smoothness`` or a variance is negative or not finite.
    """
    where = "stochastic_loss_gap_bound"
    mf = _matrix(mu_full, where, "mu_full")
    mr = _matrix(mu_lowrank, where, "mu_lowrank")
    if mf.shape != mr.shape:
        raise ValueError(f"{where}: mu_full {mf.shape} and mu_lowrank {mr.shape} differ in shape")
    L = _pos(lipschitz, "lipschitz", where)
    beta = _pos(smoothness, "smoothness", where, allow_zero=True)
    v1 = _pos(var_full_out, "var_full_out", where, allow_zero=True)
    v2 = _pos(var_lowrank_out, "var_lowrank_out", where, allow_zero=True)
    return L * float(np.linalg.norm(np.asarray(x, float))) * float(np.linalg.norm(mf - mr)) + 0.5 * beta * (v1 + v2)


# ---------------------------------------------------------------------------
# PAC-Bayes
# ---------------------------------------------------------------------------


def mcallester_bound(empirical_risk, kl, num_data: int, delta: float = 0.05):
    """McAllester's PAC-Bayes bound (Thm D.2): with probability ``>= 1 - delta`` over the sample,

        L(Q) <= L_hat(Q) + sqrt((KL(Q || P) + ln(2 sqrt(N) / delta)) / (2N)).

    Valid for a loss bounded in ``[0, 1]`` (e.g. the 0-1 loss, or :func:`bounded_regression_loss`) with ``P``
    fixed before seeing the data. ``empirical_risk`` ``L_hat(Q)`` (the posterior-averaged training loss) and
    ``kl`` may be arrays (broadcast). ``delta`` defaults to 0.05 (the paper does not state its value). A value
    above 1 is vacuous (Fig. 3's dashed line).

    Args:
        empirical_risk: ``L_hat(Q)``, a float or array with entries in ``[0, 1]``.
        kl: ``KL(Q || P)`` in nats, a float or array (non-negative), broadcast against ``empirical_risk``.
        num_data: number of training points ``N`` (positive).
        delta: confidence parameter in ``(0, 1)``.

    Returns:
        The bound on the expected risk ``L(Q)``: an array of the broadcast shape (a NumPy float for scalar
        inputs).

    Raises:
        ValueError: if ``num_data`` is not positive, ``delta`` is outside ``(0, 1)``, ``kl`` is negative or
            ``empirical_risk`` is outside ``[0, 1]``.
    """
    where = "mcallester_bound"
    n = _pos(num_data, "num_data", where)
    d = float(delta)
    if not 0 < d < 1:
        raise ValueError(f"{where}: delta must lie in (0, 1), got {delta!r}")
    risk = np.asarray(empirical_risk, float)
    kl = np.asarray(kl, float)
    if np.any(kl < 0):
        raise ValueError(f"{where}: kl must be non-negative")
    if np.any((risk < 0) | (risk > 1)):
        raise ValueError(f"{where}: empirical_risk must lie in [0, 1] (a bounded loss)")
    return risk + np.sqrt((kl + math.log(2.0 * math.sqrt(n) / d)) / (2.0 * n))


def kl_cap_full(c_max: float, m: int, n: int) -> float:
    """``KL(Q_full || P_full) <= C_max m n`` (Lemma D.3 with ``D_full = m n``; Thm D.4).

    Args:
        c_max: the per-coordinate KL cap ``C_max`` (non-negative, finite).
        m: number of rows of the weight matrix.
        n: number of columns of the weight matrix.

    Returns:
        The KL cap ``C_max m n`` as a float.

    Raises:
        ValueError: if ``c_max`` is negative or not finite.
    """
    return _pos(c_max, "c_max", "kl_cap_full", True) * int(m) * int(n)


def kl_cap_lowrank(rank, m: int, n: int, c_max_a: float, c_max_b: float | None = None):
    """``KL(Q_LR || P_LR) <= C_max^A m r + C_max^B n r`` (Remark D.6, Eq. 13); ``c_max_b`` defaults to
    ``c_max_a`` (Eq. 14: ``C_max r (m + n)``). ``rank`` may be an array.

    Args:
        rank: the rank ``r``, a number or an array of ranks.
        m: number of rows of ``W`` (and of the factor ``A``).
        n: number of columns of ``W`` (rows of the factor ``B``).
        c_max_a: per-coordinate KL cap ``C_max^A`` of the entries of ``A`` (non-negative, finite).
        c_max_b: per-coordinate KL cap ``C_max^B`` of the entries of ``B``; ``None`` means ``c_max_a``.

    Returns:
        The KL cap, a NumPy float or array shaped like ``rank``.

    Raises:
        ValueError: if a cap is negative or not finite.
    """
    ca = _pos(c_max_a, "c_max_a", "kl_cap_lowrank", True)
    cb = ca if c_max_b is None else _pos(c_max_b, "c_max_b", "kl_cap_lowrank", True)
    r = np.asarray(rank, float)
    return ca * int(m) * r + cb * int(n) * r


def complexity_ratio(rank, m: int, n: int):
    """Theorem 3.8, Eq. 5: ``Complexity(Q_LR) / Complexity(Q_full) = sqrt(r (m + n) / (m n)) = sqrt(r (1/m +
    1/n))`` when the per-coordinate KL caps are equal; ``< 1`` iff ``r < m n / (m + n)``.

    Args:
        rank: the rank ``r`` (non-negative), a number or an array.
        m: number of rows of the weight matrix (positive).
        n: number of columns of the weight matrix (positive).

    Returns:
        The complexity ratio: a float for a scalar ``rank``, else an array shaped like ``rank``.

    Raises:
        ValueError: if a rank is negative or ``m`` or ``n`` is not positive.
    """
    r = np.asarray(rank, float)
    if np.any(r < 0):
        raise ValueError("complexity_ratio: rank must be non-negative")
    m, n = int(m), int(n)
    if m < 1 or n < 1:
        raise ValueError(f"complexity_ratio: m and n must be positive, got {m}, {n}")
    out = np.sqrt(r * (m + n) / (m * n))
    return float(out) if np.ndim(rank) == 0 else out


def pac_bayes_rank_curve(ranks, m: int, n: int, empirical_risk, c_max: float, num_data: int,
                         delta: float = 0.05, c_max_full: float | None = None) -> dict:
    """PAC-Bayes bound against rank (Thm D.4, the paper's Fig. 3 left) for one ``m x n`` layer.

    Low-rank: ``L_hat(r) + sqrt((C_max r (m + n) + ln(2 sqrt(N)/delta)) / (2N))``; full-rank: ``L_hat_full +
    sqrt((C_max_full m n + ln(...)) / (2N))``. ``empirical_risk``: one value or one per rank (the bounded training
    loss of the model trained at each rank), in ``[0, 1]``; the full-rank reference uses its last entry unless a
    dict ``{"lowrank": ..., "full": ...}`` is given. ``c_max``: the per-coordinate KL cap (e.g. the max of
    :func:`coordinate_kl` over the trained factors); ``delta`` 0.05 by default.

    Returns ``{"ranks", "lowrank", "full", "ratio"}`` (``ratio`` = :func:`complexity_ratio`).

    Args:
        ranks: the ranks ``r`` to evaluate (a number or a 1-D array).
        m: number of rows of the layer's weight matrix.
        n: number of columns of the layer's weight matrix.
        empirical_risk: bounded training loss in ``[0, 1]``: one value, one per rank, or a dict with keys
            ``"lowrank"`` (one value or one per rank) and ``"full"`` (one value).
        c_max: per-coordinate KL cap ``C_max`` of the low-rank factors (non-negative).
        num_data: number of training points ``N``.
        delta: confidence parameter in ``(0, 1)``.
        c_max_full: per-coordinate KL cap of the full-rank posterior; ``None`` uses ``c_max``.

    Returns:
        A dict with ``"ranks"`` (1-D array of the ranks), ``"lowrank"`` (array, the bound at each rank),
        ``"full"`` (float, the full-rank bound) and ``"ratio"`` (the :func:`complexity_ratio` at each rank).

    Raises:
        ValueError: as :func:`mcallester_bound`, :func:`kl_cap_lowrank` and :func:`complexity_ratio`.
    """
    r = np.atleast_1d(np.asarray(ranks))
    if isinstance(empirical_risk, dict):
        risk_lr = np.broadcast_to(np.asarray(empirical_risk["lowrank"], float), r.shape)
        risk_full = float(empirical_risk["full"])
    else:
        risk_lr = np.broadcast_to(np.asarray(empirical_risk, float), r.shape)
        risk_full = float(np.atleast_1d(empirical_risk)[-1])
    cf = c_max if c_max_full is None else c_max_full
    lowrank = mcallester_bound(risk_lr, kl_cap_lowrank(r, m, n, c_max), num_data, delta)
    full = float(mcallester_bound(risk_full, kl_cap_full(cf, m, n), num_data, delta))
    return {"ranks": r, "lowrank": lowrank, "full": full, "ratio": complexity_ratio(r, m, n)}


def critical_rank(ranks, bounds, threshold: float = 1.0):
    """The largest rank whose bound is ``<= threshold`` (the non-vacuous/vacuous transition ``r*`` of Fig. 3;
    ``None`` if none is).

    Args:
        ranks: array of integer ranks.
        bounds: array of bound values, one per rank (e.g. ``pac_bayes_rank_curve(...)["lowrank"]``).
        threshold: the largest non-vacuous bound value (1 for a loss in ``[0, 1]``).

    Returns:
        The largest rank with ``bound <= threshold`` as an int, or ``None`` if no rank qualifies.
    """
    r = np.asarray(ranks)
    b = np.asarray(bounds, float)
    ok = r[b <= threshold]
    return None if ok.size == 0 else int(ok.max())


def _legendre(f, a, b, order):
    """``int_a^b f`` per coordinate by Gauss-Legendre (``a``, ``b`` arrays; empty intervals give 0)."""
    t, w = np.polynomial.legendre.leggauss(int(order))
    half = np.clip(b - a, 0.0, None)[..., None] / 2.0
    mid = (a + b)[..., None] / 2.0
    return np.sum(w * half * f(mid + half * t), axis=-1)


def _q_logpdf(w, mu, sigma, family):
    if family == "gaussian":
        return -0.5 * np.log(2.0 * math.pi * sigma ** 2) - 0.5 * ((w - mu) / sigma) ** 2
    return -np.log(2.0 * sigma) - np.abs(w - mu) / sigma


def coordinate_kl(mu, sigma, prior, family: str = "gaussian", order: int = 256):
    """Per-coordinate ``KL(q_i || p)`` for ``q_i = N(mu_i, sigma_i^2)`` (or ``Laplace(mu_i, b_i = sigma_i)``) and a
    scalar prior; its maximum over the coordinates is ``C_max`` of Lemma D.3. Returns an array shaped like ``mu``.

    ``KL = -H(q) - E_q[log p]`` with the entropy in closed form and:

    * a two-component scale mixture (attributes ``pi, sigma1, sigma2``, e.g. ``finite.lowrank.ScaleMixturePrior``):
      ``log p = log(pi_w N(w; 0, s_w^2)) + log1p(exp(l(w)))`` with ``w`` the wide component and ``l`` the log ratio
      of the narrow to the wide one; the first term's expectation is closed form and the second, a bump of width
      ``~ s_narrow`` around 0 that is below ``e^-40`` outside ``|w| <= w0``, is integrated by ``order``-point
      Gauss-Legendre over ``[-w0, w0]`` intersected with ``q``'s effective support (split at ``mu`` for Laplace).
      Plain Gauss-Hermite would miss the narrow spike (an error of ~3e-3 nats at ``mu = -1.2, sigma = 0.5``);
    * a Gaussian prior (attribute ``sigma``): closed form;
    * any other prior with an elementwise ``log_prob``: ``order``-point Gauss-Hermite (Gaussian ``q``) or
      Gauss-Laguerre on each side (Laplace ``q``), accurate when ``log p`` is smooth on the scale of ``sigma``.

    Args:
        mu: posterior means ``mu_i`` (array).
        sigma: posterior scales (the standard deviation for ``"gaussian"``, the Laplace scale ``b`` for
            ``"laplace"``), positive, broadcast against ``mu``.
        prior: the scalar prior ``p``: a scale mixture, a zero-mean Gaussian or any object with ``log_prob``
            (see above).
        family: the posterior family, ``"gaussian"`` or ``"laplace"``.
        order: number of quadrature points.

    Returns:
        Array of the KL divergences in nats, one per coordinate (the broadcast shape of ``mu`` and ``sigma``).

    Raises:
        ValueError: if ``family`` is unknown, a ``sigma`` is not positive, or a mixture prior has ``pi`` outside
            ``(0, 1)`` or a non-positive component scale.
    """
    where = "coordinate_kl"
    if family not in ("gaussian", "laplace"):
        raise ValueError(f"{where}: family must be 'gaussian' or 'laplace', got {family!r}")
    mu = np.asarray(mu, float)
    sigma = np.asarray(sigma, float)
    if np.any(sigma <= 0):
        raise ValueError(f"{where}: sigma must be positive")
    mu, sigma = np.broadcast_arrays(mu, sigma)
    gaussian = family == "gaussian"
    ent = 0.5 * np.log(2.0 * math.pi * math.e * sigma ** 2) if gaussian else 1.0 + np.log(2.0 * sigma)
    second = mu ** 2 + (sigma ** 2 if gaussian else 2.0 * sigma ** 2)  # E_q[w^2]
    if all(hasattr(prior, a) for a in ("pi", "sigma1", "sigma2")):
        pi, s1, s2 = float(prior.pi), float(prior.sigma1), float(prior.sigma2)
        if not (0 < pi < 1 and s1 > 0 and s2 > 0):
            raise ValueError(f"{where}: mixture prior needs 0 < pi < 1 and positive sigmas")
        (pw, sw), (pn, sn) = sorted([(pi, s1), (1.0 - pi, s2)], key=lambda c: -c[1])
        e_logp = math.log(pw) - 0.5 * math.log(2.0 * math.pi * sw ** 2) - second / (2.0 * sw ** 2)
        c0 = math.log(pn / pw) + math.log(sw / sn)
        curv = 0.5 * (1.0 / sn ** 2 - 1.0 / sw ** 2)
        if curv == 0.0:  # equal widths: p is one Gaussian
            e_logp = e_logp + math.log1p(math.exp(c0))
        elif c0 + 40.0 > 0:
            w0 = math.sqrt((c0 + 40.0) / curv)
            reach = (12.0 if gaussian else 40.0) * sigma

            def bump(w):
                return np.logaddexp(0.0, c0 - curv * w ** 2) * np.exp(_q_logpdf(w, mu[..., None], sigma[..., None],
                                                                               family))

            a = np.maximum(-w0, mu - reach)
            b = np.minimum(w0, mu + reach)
            if gaussian:
                e_logp = e_logp + _legendre(bump, a, b, order)
            else:  # split at the Laplace kink
                e_logp = e_logp + _legendre(bump, a, np.minimum(b, mu), order) + _legendre(bump, np.maximum(a, mu),
                                                                                           b, order)
        return -ent - e_logp
    if hasattr(prior, "sigma") and not hasattr(prior, "loc"):  # finite.lowrank.GaussianPrior (zero mean)
        sp = float(prior.sigma)
        return -ent + 0.5 * math.log(2.0 * math.pi * sp ** 2) + second / (2.0 * sp ** 2)
    if gaussian:
        t, w = np.polynomial.hermite_e.hermegauss(int(order))  # weight exp(-t^2/2)
        pts = mu[..., None] + sigma[..., None] * t
        e_logp = np.sum(w / math.sqrt(2.0 * math.pi) * np.asarray(prior.log_prob(pts), float), axis=-1)
    else:
        t, w = np.polynomial.laguerre.laggauss(int(order))  # weight exp(-t) on [0, inf)
        e_logp = 0.5 * np.sum(w * (np.asarray(prior.log_prob(mu[..., None] + sigma[..., None] * t), float)
                                   + np.asarray(prior.log_prob(mu[..., None] - sigma[..., None] * t), float)), axis=-1)
    return -ent - e_logp


def bounded_regression_loss(y, y_pred, scale: float):
    """A loss in ``[0, 1]`` for regression PAC-Bayes bounds: ``min(1, |y - y_pred| / scale)`` (the paper does not
    say which bounded loss its LSTM plot used; this clipped, normalised absolute error is 1-Lipschitz in
    ``y_pred / scale``).

    Args:
        y: targets (array).
        y_pred: predictions, broadcast against ``y``.
        scale: the normalising scale (positive): an absolute error of ``scale`` or more costs 1.

    Returns:
        Array of the per-point losses in ``[0, 1]``, of the broadcast shape of ``y`` and ``y_pred``.

    Raises:
        ValueError: if ``scale`` is not positive and finite.
    """
    s = _pos(scale, "scale", "bounded_regression_loss")
    return np.minimum(1.0, np.abs(np.asarray(y, float) - np.asarray(y_pred, float)) / s)


# ---------------------------------------------------------------------------
# Gaussian complexity
# ---------------------------------------------------------------------------


def spectral_norm(W) -> float:
    """``||W||_2`` (largest singular value); ``C_i = ||A_i||_2 ||B_i||_2`` bounds ``||A_i B_i^T||_2``.

    Args:
        W: a matrix, or its singular values as a 1-D array.

    Returns:
        The spectral norm as a float.
    """
    return float(singular_values(W)[0])


def gaussian_complexity_bound(x_fro: float, num_data: int, w1_fro: float, widths: Sequence[int],
                              ranks: Sequence[int], spectral: Sequence[float], c0: float = 1.0) -> float:
    """Theorem E.17 (Pinto et al. 2025, Thm 7), the explicit bound on the empirical vector-valued Gaussian
    complexity of depth-``D`` networks with ``||W_i||_2 <= C_i`` and ``rank(W_i) <= r_i``:

        G_S <= (||X||_F / m) { ||W_1||_F sqrt(h_1) prod_{i=1}^D C_0 C_i
                               + sum_{j=2}^D C_j sqrt(r_j h_j) prod_{i=j+1}^D C_0 C_i }.

    Args: ``x_fro`` ``||X||_F = sqrt(sum_j ||x_j||^2)``; ``num_data`` ``m``; ``w1_fro`` ``||W_1||_F``;
    ``widths`` ``(h_1, ..., h_D)`` (output widths of the layers); ``ranks`` ``(r_1, ..., r_D)`` (``r_1`` unused);
    ``spectral`` ``(C_1, ..., C_D)`` with ``C_i = C_i^A C_i^B`` (Thm 3.9); ``c0`` Maurer's chaining constant, whose
    value neither paper states: **1 by default** (so the curves are relative; notes section 5.6).

    Returns:
        The bound on ``G_S`` as a float.

    Raises:
        ValueError: if ``widths``, ``ranks`` and ``spectral`` differ in length or are empty, or ``num_data`` or
            ``c0`` is not positive and finite.
    """
    where = "gaussian_complexity_bound"
    h = [int(v) for v in widths]
    r = [int(v) for v in ranks]
    C = [float(v) for v in spectral]
    D = len(h)
    if D < 1 or len(r) != D or len(C) != D:
        raise ValueError(f"{where}: widths, ranks and spectral must have the same length D >= 1, got "
                         f"{len(h)}, {len(r)}, {len(C)}")
    m = _pos(num_data, "num_data", where)
    c0 = _pos(c0, "c0", where)

    def prod(start):  # prod_{i=start}^{D} C0 C_i  (1-based; empty product = 1)
        return float(np.prod([c0 * C[i - 1] for i in range(start, D + 1)])) if start <= D else 1.0

    total = float(w1_fro) * math.sqrt(h[0]) * prod(1)
    for j in range(2, D + 1):
        total += C[j - 1] * math.sqrt(r[j - 1] * h[j - 1]) * prod(j + 1)
    return float(x_fro) / m * total


def full_rank_complexity_bound(x_fro: float, num_data: int, widths: Sequence[int], spectral: Sequence[float],
                               input_dim: int) -> float:
    """Remark E.19's full-rank comparison ``(||X||_F / m) prod_i C_i sqrt(h_i h_{i-1})`` (``h_0 = input_dim``),
    with the unstated big-O constant set to 1.

    Args:
        x_fro: ``||X||_F``, the Frobenius norm of the data matrix.
        num_data: number of data points ``m`` (positive).
        widths: output widths ``(h_1, ..., h_D)`` of the layers.
        spectral: spectral-norm bounds ``(C_1, ..., C_D)`` of the layers' weight matrices.
        input_dim: the input dimension ``h_0``.

    Returns:
        The full-rank complexity bound as a float.

    Raises:
        ValueError: if ``widths`` and ``spectral`` differ in length or ``num_data`` is not positive and finite.
    """
    h = [int(input_dim)] + [int(v) for v in widths]
    C = [float(v) for v in spectral]
    if len(C) != len(h) - 1:
        raise ValueError("full_rank_complexity_bound: widths and spectral must have the same length")
    val = float(np.prod([C[i] * math.sqrt(h[i + 1] * h[i]) for i in range(len(C))]))
    return float(x_fro) / _pos(num_data, "num_data", "full_rank_complexity_bound") * val


def gaussian_complexity_generalization_bound(empirical_risk, complexity: float, lipschitz: float, num_data: int,
                                             delta: float = 0.05):
    """Theorem 3.9 / E.15: with probability ``>= 1 - delta``,
    ``E l(f_BNN(x), y) <= L_hat + sqrt(pi L) G_S + 3 sqrt(log(2/delta) / (2N))`` for a loss in ``[0, 1]`` that is
    ``L``-Lipschitz in its first argument, ``f_BNN`` the posterior-mean predictor and ``G_S`` a bound such as
    :func:`gaussian_complexity_bound`. ``delta`` 0.05 by default.

    Args:
        empirical_risk: the empirical risk ``L_hat`` of the posterior-mean predictor, a float or array.
        complexity: the Gaussian complexity bound ``G_S``.
        lipschitz: the Lipschitz constant ``L`` of the loss (positive).
        num_data: number of training points ``N`` (positive).
        delta: confidence parameter in ``(0, 1)``.

    Returns:
        The bound on the expected loss: an array shaped like ``empirical_risk`` (a NumPy float for a scalar).

    Raises:
        ValueError: if ``delta`` is outside ``(0, 1)`` or ``num_data`` or ``lipschitz`` is not positive and finite.
    """
    where = "gaussian_complexity_generalization_bound"
    d = float(delta)
    if not 0 < d < 1:
        raise ValueError(f"{where}: delta must lie in (0, 1), got {delta!r}")
    n = _pos(num_data, "num_data", where)
    L = _pos(lipschitz, "lipschitz", where)
    return (np.asarray(empirical_risk, float) + math.sqrt(math.pi * L) * float(complexity)
            + 3.0 * math.sqrt(math.log(2.0 / d) / (2.0 * n)))


# ---------------------------------------------------------------------------
# Induced weight covariance (Lemma 3.5)
# ---------------------------------------------------------------------------


def factor_variance(scale, family: str = "gaussian"):
    """Variance of a factor entry with scale ``softplus(rho)``: ``sigma^2`` (Gaussian) or ``2 b^2`` (Laplace).

    Args:
        scale: the scales ``softplus(rho)`` (array): standard deviations ``sigma`` or Laplace scales ``b``.
        family: ``"gaussian"`` or ``"laplace"``.

    Returns:
        Array of the variances, shaped like ``scale``.

    Raises:
        ValueError: if ``family`` is neither ``"gaussian"`` nor ``"laplace"``.
    """
    s = np.asarray(scale, float)
    if family == "gaussian":
        return s ** 2
    if family == "laplace":
        return 2.0 * s ** 2
    raise ValueError(f"factor_variance: family must be 'gaussian' or 'laplace', got {family!r}")


def _factors(mu_a, var_a, mu_b, var_b, where):
    mu_a, var_a, mu_b, var_b = (np.asarray(v, float) for v in (mu_a, var_a, mu_b, var_b))
    if mu_a.ndim != 2 or mu_b.ndim != 2 or mu_a.shape[1] != mu_b.shape[1]:
        raise ValueError(f"{where}: mu_a (m, r) and mu_b (n, r) must share r, got {mu_a.shape}, {mu_b.shape}")
    if var_a.shape != mu_a.shape or var_b.shape != mu_b.shape:
        raise ValueError(f"{where}: var_a / var_b must match mu_a / mu_b in shape")
    if np.any(var_a < 0) or np.any(var_b < 0):
        raise ValueError(f"{where}: variances must be non-negative")
    return mu_a, var_a, mu_b, var_b


def lowrank_weight_covariance(mu_a, var_a, mu_b, var_b) -> np.ndarray:
    """Closed-form ``Cov[W_ij, W_kl]`` of ``W = A B^T`` under independent factor entries (Lemma 3.5, App. B.7):

        Cov[W_ij, W_kl] = sum_t ( d_ik var_A[i,t] muB[j,t] muB[l,t] + d_jl var_B[j,t] muA[i,t] muA[k,t]
                                  + d_ik d_jl var_A[i,t] var_B[j,t] ),

    i.e. ``E[A_it A_kt] E[B_jt B_lt] - muA muA muB muB`` summed over ``t`` (terms with different latent index
    vanish). Entries in different rows *and* columns are uncorrelated; same-row and same-column pairs share
    factors. Only means and variances enter, so it holds for Gaussian and Laplace factors alike
    (:func:`factor_variance`). Args: ``mu_a, var_a`` ``(m, r)``; ``mu_b, var_b`` ``(n, r)``. Returns ``(m, n, m,
    n)``; reshape to ``(m n, m n)`` for the row-major ``vec(W)``.
    """
    mu_a, var_a, mu_b, var_b = _factors(mu_a, var_a, mu_b, var_b, "lowrank_weight_covariance")
    m, n = mu_a.shape[0], mu_b.shape[0]
    eye_m, eye_n = np.eye(m), np.eye(n)
    same_row = np.einsum("it,jt,lt->ijl", var_a, mu_b, mu_b)  # (m, n, n): i = k
    same_col = np.einsum("jt,it,kt->jik", var_b, mu_a, mu_a)  # (n, m, m): j = l
    both = var_a @ var_b.T  # (m, n): i = k, j = l
    cov = np.einsum("ik,ijl->ijkl", eye_m, same_row)
    cov += np.einsum("jl,jik->ijkl", eye_n, same_col)
    cov += np.einsum("ik,jl,ij->ijkl", eye_m, eye_n, both)
    return cov


def lowrank_weight_variance(mu_a, var_a, mu_b, var_b) -> np.ndarray:
    """``Var[W_ij] = sum_t (muA_it^2 varB_jt + varA_it muB_jt^2 + varA_it varB_jt)`` (notes 1.6), shape ``(m, n)``.

    Args:
        mu_a: means of the factor ``A``, shape ``(m, r)``.
        var_a: variances of the entries of ``A`` (:func:`factor_variance`), shape ``(m, r)``.
        mu_b: means of the factor ``B``, shape ``(n, r)``.
        var_b: variances of the entries of ``B``, shape ``(n, r)``.

    Returns:
        Array ``(m, n)`` of the variances of the entries of ``W = A B^T`` (the diagonal of
        :func:`lowrank_weight_covariance`).

    Raises:
        ValueError: if the shapes do not match or a variance is negative.
    """
    mu_a, var_a, mu_b, var_b = _factors(mu_a, var_a, mu_b, var_b, "lowrank_weight_variance")
    return (mu_a ** 2) @ var_b.T + var_a @ (mu_b ** 2).T + var_a @ var_b.T


def meanfield_weight_covariance(var_w) -> np.ndarray:
    """Full-rank mean-field ``Cov[W_ij, W_kl] = d_ik d_jl var_W[i, j]`` (diagonal; Fig. 1 left), ``(m, n, m, n)``.

    Args:
        var_w: the variances of the weight entries, shape ``(m, n)``.

    Returns:
        Array ``(m, n, m, n)``, zero except ``cov[i, j, i, j] = var_w[i, j]``.

    Raises:
        ValueError: if ``var_w`` is not 2-D.
    """
    v = np.asarray(var_w, float)
    if v.ndim != 2:
        raise ValueError(f"meanfield_weight_covariance: var_w must be (m, n), got shape {v.shape}")
    m, n = v.shape
    return np.einsum("ik,jl,ij->ijkl", np.eye(m), np.eye(n), v)


def covariance_to_correlation(cov) -> np.ndarray:
    """Correlation matrix ``(m n, m n)`` of ``vec(W)`` from a covariance ``(m, n, m, n)`` or ``(mn, mn)`` (the
    heat-map of Fig. 1); entries with zero variance get correlation 0 (and 1 on the diagonal).

    Args:
        cov: covariance of ``vec(W)``, either ``(m, n, m, n)`` (as from :func:`lowrank_weight_covariance`) or a
            square ``(m n, m n)`` matrix.

    Returns:
        The square correlation matrix ``(m n, m n)``.

    Raises:
        ValueError: if ``cov`` is neither four-dimensional nor a square matrix.
    """
    c = np.asarray(cov, float)
    if c.ndim == 4:
        m, n = c.shape[:2]
        c = c.reshape(m * n, m * n)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"covariance_to_correlation: cov must be (m, n, m, n) or square, got shape {c.shape}")
    sd = np.sqrt(np.clip(np.diag(c), 0.0, None))
    denom = np.outer(sd, sd)
    corr = np.divide(c, denom, out=np.zeros_like(c), where=denom > 0)
    np.fill_diagonal(corr, 1.0)
    return corr


def rank_manifold_dimension(m: int, n: int, r: int) -> int:
    """Dimension ``r (m + n - r)`` of the manifold of ``m x n`` matrices of rank exactly ``r`` (Fig. 2).

    Args:
        m: number of rows.
        n: number of columns.
        r: the rank, in ``0 .. min(m, n)``.

    Returns:
        The manifold dimension ``r (m + n - r)`` as an int.

    Raises:
        ValueError: if ``r`` is outside ``0 .. min(m, n)``.
    """
    m, n, r = int(m), int(n), int(r)
    if not 0 <= r <= min(m, n):
        raise ValueError(f"rank_manifold_dimension: r must lie in [0, min(m, n)] = [0, {min(m, n)}], got {r}")
    return r * (m + n - r)
