"""Mean-field factors and the priors on them (paper Sec. 2.1, App. F.1, I.1).

`MeanField` (``mu``, ``rho`` with scale ``softplus(rho)``); the one-uniform-draw noise of a network (`_Flat`,
`_draw_flat`, `_draw_specs`: Gaussian or Laplace noise by the inverse CDF) and its vectorised Monte-Carlo
``log q - log p`` (`_flat_log_ratio`); the priors `ScaleMixturePrior`, `GaussianPrior`, `DEFAULT_PRIOR`,
`toy_prior` and the closed-form Gaussian KL; the bias factors shared by every Bayesian layer; the initial scales
`variance_matched_scale` and the SVD warm start `svd_factors` (App. F.9).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax import lax

from finite.lowrank._validation import _KL_METHODS, _check_choice, _check_int, _check_pos
from smnngp.kernels import softplus_inverse

__all__ = [
    "MeanField", "ScaleMixturePrior", "GaussianPrior", "DEFAULT_PRIOR", "toy_prior", "variance_matched_scale",
    "svd_factors",
]


class MeanField(NamedTuple):
    """A mean-field variational factor: location ``mu`` and ``rho`` with scale ``softplus(rho)`` (paper Sec. 2.1).

    For the Gaussian family the scale is the standard deviation; for the Laplace family it is the Laplace scale
    ``b`` (variance ``2 b^2``).
    """

    mu: jnp.ndarray
    rho: jnp.ndarray

    @property
    def scale(self):
        """``softplus(rho)``."""
        return jax.nn.softplus(self.rho)


def _uniform(key, shape, dtype):
    """``u ~ U(-1, 1)`` (open at -1), the one random draw behind every sample."""
    return jax.random.uniform(key, shape, dtype, minval=jnp.nextafter(jnp.asarray(-1.0, dtype), 0), maxval=1.0)


def _eps(u, family: str):
    """Standard noise from ``u ~ U(-1, 1)`` by the inverse CDF: ``sqrt(2) erfinv(u)`` (Gaussian, as
    ``jax.random.normal`` does) or ``-sign(u) log(1 - |u|)`` (standard Laplace)."""
    if family == "gaussian":
        return jnp.sqrt(jnp.asarray(2.0, u.dtype)) * lax.erf_inv(u)
    return -jnp.sign(u) * jnp.log1p(-jnp.abs(u))


def _std_noise(key, shape, family: str, dtype):
    # One uniform draw transformed per family: XLA:CPU spends ~0.3 s compiling each random-bits call, so a
    # network draws all its noise at once (``_draw_specs``) instead of once per tensor.
    return _eps(_uniform(key, shape, dtype), family)


def _param_dtype(params):
    leaves = jax.tree.leaves(params)
    return leaves[0].dtype if leaves else jnp.float32


class _Flat(NamedTuple):
    """One draw of several layers' stochastic tensors from one flat uniform vector, kept per tensor (in spec
    order): ``w = mu + scale * eps``; ``laplace`` a static flag per tensor; ``counts`` the tensors of each spec.
    (Per tensor rather than concatenated: XLA:CPU copies a concatenation of millions of floats slowly, about
    20 ms for 2.4 million, while slices of the one uniform draw fuse into their consumers.)"""

    w: list
    eps: list
    scale: list
    laplace: tuple
    counts: tuple


def _draw_flat(specs, params_list, u):
    """Draws of ``specs`` from flat uniform noise ``u`` (``None``: nothing stochastic): tensor ``t`` takes the
    next ``size_t`` entries of ``u`` and is ``mu_t + softplus(rho_t) * eps_t``; returns ``(weights list, _Flat
    or None)``."""
    sizes = tuple(s.noise_size for s in specs)
    if u is None or sum(sizes) == 0:  # nothing drawn: stochastic layers get None
        return [s._assemble(p, []) if s.noise_size == 0 else None for s, p in zip(specs, params_list)], None
    out, ws, epss, scales, laps, counts, o = [], [], [], [], [], [], 0
    for s, p, n in zip(specs, params_list, sizes):
        ms = s._mf_list(p) if n else []
        vals = []
        for m in ms:
            k = int(np.prod(m.mu.shape))
            eps = _eps(u[o:o + k], s.family).reshape(m.mu.shape)
            scale = jax.nn.softplus(m.rho)
            w = m.mu + scale * eps
            vals.append(w)
            ws.append(w)
            epss.append(eps)
            scales.append(scale)
            laps.append(s.family == "laplace")
            o += k
        counts.append(len(ms))
        out.append(s._assemble(p, vals))
    return out, _Flat(ws, epss, scales, tuple(laps), tuple(counts))


def _draw_specs(specs, params_list, key, with_flat: bool = False):
    """Draws of several layer specs from **one** uniform draw with ``key`` (split in spec order); deterministic
    specs and ``key=None`` draw nothing. With ``with_flat`` also the :class:`_Flat` draw (for the KL)."""
    total = sum(s.noise_size for s in specs)
    u = None
    if total and key is not None:
        dtype = next(_param_dtype(p) for s, p in zip(specs, params_list) if s.noise_size)
        u = _uniform(key, (total,), dtype)
    weights, flat = _draw_flat(specs, params_list, u)
    return (weights, flat) if with_flat else weights


def _flat_log_ratio(flat: _Flat, prior, include=None):
    """``sum log q(w) - log p(w)`` over a draw, restricted to the tensors flagged in the static ``include`` (one
    flag per tensor; ``None``: all).

    ``log q`` is written through the noise, ``-eps^2/2 - log(scale) - log(2 pi)/2`` (Gaussian) or ``-|eps| -
    log(2 scale)`` (Laplace): equal in value and in gradient to ``log q(mu + scale eps; mu, scale)``, because
    ``(w - mu) / scale = eps`` identically in the parameters."""
    total = 0.0
    for t, (w, eps, scale, laplace) in enumerate(zip(flat.w, flat.eps, flat.scale, flat.laplace)):
        if include is not None and not include[t]:
            continue
        if laplace:
            lq = -jnp.abs(eps) - jnp.log(2.0 * scale)
        else:
            lq = -0.5 * jnp.square(eps) - jnp.log(scale) - 0.5 * math.log(2.0 * math.pi)
        total = total + jnp.sum(lq - prior.log_prob(w))
    return total


def _draw(mf: MeanField, eps):
    """Reparameterised draw ``mu + softplus(rho) * eps``."""
    return mf.mu + jax.nn.softplus(mf.rho) * eps


def _sample_mf(mf: MeanField, key, family: str):
    return _draw(mf, _std_noise(key, mf.mu.shape, family, mf.mu.dtype))


def _log_q(mf: MeanField, w, family: str):
    scale = jax.nn.softplus(mf.rho)
    d = dist.Normal(mf.mu, scale) if family == "gaussian" else dist.Laplace(mf.mu, scale)
    return jnp.sum(d.log_prob(w))


class ScaleMixturePrior(NamedTuple):
    """Scale-mixture prior ``pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2)`` on every scalar (Blundell et al. 2015).

    Defaults from the paper (App. I.1, G.3.2, G.4.2): ``pi = 0.5``, ``sigma1 = 1``, ``sigma2 = exp(-6)`` with
    ``sigma1, sigma2`` **standard deviations** (App. I.1 and Blundell; notes 1.3). ``log_prob`` is elementwise,
    computed as a two-term ``logsumexp`` (``jnp.logaddexp``), finite far in the tails where both densities
    underflow.
    """

    pi: float = 0.5
    sigma1: float = 1.0
    sigma2: float = math.exp(-6.0)

    def log_prob(self, w):
        """Elementwise ``log p(w)``."""
        w = jnp.asarray(w)
        pi = float(self.pi)
        if not 0.0 < pi < 1.0:
            raise ValueError(f"ScaleMixturePrior: pi must lie in (0, 1), got {self.pi!r}")
        s1 = _check_pos(self.sigma1, "sigma1", "ScaleMixturePrior")
        s2 = _check_pos(self.sigma2, "sigma2", "ScaleMixturePrior")
        c = -0.5 * math.log(2.0 * math.pi)
        l1 = math.log(pi) + c - math.log(s1) - 0.5 * jnp.square(w / s1)
        l2 = math.log1p(-pi) + c - math.log(s2) - 0.5 * jnp.square(w / s2)
        return jnp.logaddexp(l1, l2)  # the two-term logsumexp


class GaussianPrior(NamedTuple):
    """Isotropic Gaussian prior ``N(0, sigma^2)`` on every scalar; the KL to Gaussian factors has a closed form."""

    sigma: float = 1.0

    def log_prob(self, w):
        """Elementwise ``log p(w)``."""
        s = _check_pos(self.sigma, "sigma", "GaussianPrior")
        return dist.Normal(0.0, s).log_prob(jnp.asarray(w))


#: The paper's default prior ``0.5 N(0, 1) + 0.5 N(0, (e^-6)^2)`` (App. I.1, G.3.2, G.4.2).
DEFAULT_PRIOR = ScaleMixturePrior()


def toy_prior() -> ScaleMixturePrior:
    """The toy regression's prior ``0.5 N(0, 2^2) + 0.5 N(0, (e^-6)^2)`` (paper App. I.3; notes 3.6).

    Returns:
        A :class:`ScaleMixturePrior` with ``pi = 0.5``, ``sigma1 = 2`` and ``sigma2 = exp(-6)``.
    """
    return ScaleMixturePrior(0.5, 2.0, math.exp(-6.0))


def _check_prior(prior, where: str):
    if not (isinstance(prior, (ScaleMixturePrior, GaussianPrior)) or callable(getattr(prior, "log_prob", None))):
        raise ValueError(f"{where}: prior must have an elementwise log_prob (ScaleMixturePrior, GaussianPrior, "
                         f"a numpyro distribution), got {type(prior).__name__}")
    return prior


def _prior_sum(prior, w):
    return jnp.sum(prior.log_prob(w))


def _exact_kl_mf(mf: MeanField, prior: GaussianPrior):
    """``KL(N(mu, s^2) || N(0, sigma^2))`` summed: ``log(sigma/s) + (s^2 + mu^2) / (2 sigma^2) - 1/2``."""
    s = jax.nn.softplus(mf.rho)
    sp = float(prior.sigma)
    return jnp.sum(jnp.log(sp) - jnp.log(s) + (jnp.square(s) + jnp.square(mf.mu)) / (2.0 * sp * sp) - 0.5)


def _kl_method(method: str, prior, family: str, where: str) -> str:
    _check_choice(method, _KL_METHODS, "method", where)
    exact_ok = isinstance(prior, GaussianPrior) and family == "gaussian"
    if method == "exact" and not exact_ok:
        raise ValueError(f"{where}: method='exact' needs a GaussianPrior and Gaussian factors "
                         f"(got {type(prior).__name__}, family={family!r}); use method='mc'")
    if method == "auto":
        return "exact" if exact_ok else "mc"
    return method


def _init_rho(key, shape, dtype, sigma, rho_range):
    """``rho`` with ``softplus(rho) = sigma`` (App. F.7), or ``rho ~ U(rho_range)`` ("rho rand", Tables 6-8)."""
    if rho_range is not None:
        return jax.random.uniform(key, shape, dtype, rho_range[0], rho_range[1])
    return jnp.full(shape, softplus_inverse(jnp.asarray(sigma, dtype)), dtype)


def _bias_params(bias: str, n: int, dtype, bias_rho: float, value: float = 0.0):
    if bias == "none":
        return None
    mu = jnp.full((n,), value, dtype)
    if bias == "deterministic":
        return mu
    return MeanField(mu, jnp.full((n,), bias_rho, dtype))


def _bias_from(bias: str, b, n: int, dtype, bias_rho: float):
    """Bias parameters of kind ``bias`` warm-started from a deterministic bias ``b`` (or zero)."""
    if bias == "none":
        return None
    b = jnp.zeros((n,), dtype) if b is None else jnp.asarray(b, dtype)
    if bias == "deterministic":
        return b
    return MeanField(b, jnp.full((n,), bias_rho, dtype))


def _mf_log_ratio(factors, draws, prior, family: str):
    """``sum_t log q(w_t) - log p(w_t)`` over mean-field ``factors`` and their drawn values ``draws`` (at least
    one), accumulated left to right (``((lq_0 - lp_0) + lq_1) - lp_1 ...``)."""
    total = None
    for mf, w in zip(factors, draws):
        lq = _log_q(mf, w, family)
        total = lq - _prior_sum(prior, w) if total is None else total + lq - _prior_sum(prior, w)
    return total


def _mf_exact_kl(factors, prior: GaussianPrior):
    """Closed-form KL of mean-field ``factors`` (at least one) to a :class:`GaussianPrior`, summed left to right."""
    total = None
    for mf in factors:
        total = _exact_kl_mf(mf, prior) if total is None else total + _exact_kl_mf(mf, prior)
    return total


def _bias_log_ratio(b, wb, prior, family: str):
    return _mf_log_ratio([b], [wb], prior, family) if isinstance(b, MeanField) else 0.0


def _bias_exact_kl(b, prior):
    return _exact_kl_mf(b, prior) if isinstance(b, MeanField) else 0.0


def _bias_count(bias: str, n: int) -> int:
    return {"none": 0, "deterministic": n, "bayes": 2 * n}[bias]


def variance_matched_scale(n_in: int, n_out: int, rank: int, init: str = "he") -> float:
    """Per-factor standard deviation ``s = (sigma_W^2 / r)^(1/4)`` (paper App. F.4-F.6).

    ``sigma_W^2 = 2 / n_in`` for ``init="he"`` (ReLU) and ``2 / (n_in + n_out)`` for ``init="glorot"``. With
    factor means i.i.d. ``N(0, s^2)`` (or ``U(-sqrt(3) s, sqrt(3) s)``), ``Var(mu_A mu_B^T)_ij = r s^4 = sigma_W^2``:
    the low-rank mean matches a dense He / Glorot layer's second moment with ``v_A = v_B`` (App. F.5).

    Args:
        n_in: fan-in of the layer (a positive integer).
        n_out: fan-out of the layer (a positive integer; only used by ``"glorot"``).
        rank: the rank ``r`` of the factorisation (a positive integer).
        init: ``"he"`` or ``"glorot"``, the dense initialisation whose weight variance ``sigma_W^2`` is matched.

    Returns:
        The factor standard deviation ``s`` as a float.

    Raises:
        ValueError: if a size is not a positive integer or ``init`` is neither ``"he"`` nor ``"glorot"``.
    """
    where = "variance_matched_scale"
    n_in = _check_int(n_in, "n_in", where)
    n_out = _check_int(n_out, "n_out", where)
    rank = _check_int(rank, "rank", where)
    _check_choice(init, ("he", "glorot"), "init", where)
    var_w = 2.0 / n_in if init == "he" else 2.0 / (n_in + n_out)
    return (var_w / rank) ** 0.25


def svd_factors(W, rank: int):
    """``(mu_A, mu_B) = (U_r Sigma_r^(1/2), V_r Sigma_r^(1/2))`` of ``W = U Sigma V^T`` (paper App. F.9, Eq. 34).

    ``W`` has shape ``(n_in, n_out)`` (the layers' orientation); ``mu_A mu_B^T = W_r``, the best rank-``r``
    approximation of ``W`` in Frobenius and spectral norm (Eckart-Young-Mirsky).

    Args:
        W: the matrix to factorise, shape ``(n_in, n_out)``.
        rank: the rank ``r``, a positive integer not above ``min(n_in, n_out)``.

    Returns:
        The pair ``(mu_A, mu_B)`` of JAX arrays with shapes ``(n_in, r)`` and ``(n_out, r)``.

    Raises:
        ValueError: if ``W`` is not a matrix or ``rank`` is not a positive integer or exceeds ``min(W.shape)``.
    """
    W = jnp.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"svd_factors: W must be a matrix, got shape {tuple(W.shape)}")
    rank = _check_int(rank, "rank", "svd_factors")
    if rank > min(W.shape):
        raise ValueError(f"svd_factors: rank {rank} exceeds min(W.shape) = {min(W.shape)}")
    U, s, Vt = jnp.linalg.svd(W, full_matrices=False)
    root = jnp.sqrt(s[:rank])
    return U[:, :rank] * root[None, :], Vt[:rank].T * root[None, :]


def _svd_mean_fields(W, rank: int, key, sigma, rho_range):
    """Factors ``A, B`` (:class:`MeanField`) warm-started from ``W`` by the SVD (App. F.9): means from
    :func:`svd_factors`, padded with zero columns up to ``rank`` when ``W`` is thinner (``W_r`` unchanged); ``rho``
    by ``_init_rho`` with ``sigma`` or ``rho_range``, ``A``'s from the first half of ``split(key)``."""
    r = min(rank, min(W.shape))
    mu_a, mu_b = svd_factors(W, r)
    if r < rank:  # overcomplete: pad with zero columns (W_r unchanged)
        mu_a = jnp.pad(mu_a, ((0, 0), (0, rank - r)))
        mu_b = jnp.pad(mu_b, ((0, 0), (0, rank - r)))
    kra, krb = jax.random.split(key)
    return (MeanField(mu_a, _init_rho(kra, mu_a.shape, W.dtype, sigma, rho_range)),
            MeanField(mu_b, _init_rho(krb, mu_b.shape, W.dtype, sigma, rho_range)))


def _unit_mean_fields(key, sizes, dtype, rho_range):
    """Mean-field vectors of the given ``sizes`` with means 1 and ``rho ~ U(rho_range)``, one key of
    ``split(key, len(sizes))`` each (the rank-1 kinds' warm start: ``E[W] = W_bar`` at the start)."""
    keys = jax.random.split(key, len(sizes))
    return tuple(MeanField(jnp.ones((n,), dtype), _init_rho(k, (n,), dtype, None, rho_range))
                 for k, n in zip(keys, sizes))
