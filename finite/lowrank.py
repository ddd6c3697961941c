"""Low-rank ("singular") Bayesian neural networks: W = A B^T with mean-field factors (Toure & Stephens,
*Singular Bayesian Neural Networks*; notes ``001_singular_bnn.md``; issue 15, section 1).

**Layers.** A dense layer maps ``x`` of shape ``(..., n_in)`` to ``x @ W + b`` of shape ``(..., n_out)``
(Keras orientation, paper Sec. 2.4; the ``smnngp.stax.Dense`` layout). Four kinds share one interface:

* ``"deterministic"`` (:class:`DeterministicDense`): a point estimate ``W`` (Glorot / He / orthogonal init);
* ``"bbb"`` (:class:`BBBDense`): full-rank mean-field Bayes-by-Backprop (Blundell et al. 2015), ``W_ij ~
  q(mu_ij, softplus(rho_ij))`` independently;
* ``"lowrank"`` (:class:`LowRankDense`): ``W = A B^T`` with ``A`` of shape ``(n_in, r)`` and ``B`` of shape
  ``(n_out, r)``, every entry of ``A`` and ``B`` independent Gaussian or Laplace with scale
  ``softplus(rho)`` (paper Sec. 2.1, App. F.1; the Laplace variant of App. I.1). ``x @ A @ B^T`` is computed as
  ``(x @ A) @ B^T`` and ``W`` is never materialised unless that is cheaper (``path``);
* ``"rank1"`` (:class:`Rank1Dense`): the rank-1 multiplicative baseline of Dusenberry et al. (2020) in the form
  of the paper's App. I.1, ``W = W_bar o (s r^T)`` with deterministic ``W_bar`` and mean-field ``s`` (``n_in``),
  ``r`` (``n_out``); ``x @ W = ((x o s) @ W_bar) o r``.

Every layer spec is a frozen (hashable) dataclass with

* ``init(key, dtype=float32) -> params`` (a NamedTuple pytree);
* ``sample(params, key) -> weights`` (one reparameterised draw, a pytree of concrete arrays) and
  ``forward(weights, x)``; ``apply(params, x, key) = forward(sample(params, key), x)``: **one** weight sample per
  forward pass, shared by every row of the batch (paper Sec. 2.2; no local reparameterisation);
* ``kl(params, prior, key, method="auto") -> scalar``: ``KL(q || p)`` of the layer's stochastic parameters,
  by Monte Carlo ``log q(w) - log p(w)`` at the draw ``sample(params, key)`` (the *same* draw ``apply`` uses with
  that key; paper Eq. 1, "all three terms ... estimated via Monte Carlo"), or in closed form when the prior is a
  :class:`GaussianPrior` and the factors Gaussian (``method="exact"``; ``"auto"`` picks it then);
* ``num_params()`` (closed form, equal to the number of scalars in ``init``'s pytree) and
  ``from_deterministic(det_params, key)`` (warm start from a trained deterministic layer: the SVD initialisation
  of App. F.9 for the low-rank kind).

Embeddings (:class:`DeterministicEmbedding`, :class:`BBBEmbedding`, :class:`LowRankEmbedding`,
:class:`Rank1Embedding`) sample **only the rows of the tokens looked up**: the noise of row ``v`` is drawn from
``fold_in(key, v)``, so a lookup equals sampling the whole table with the same key and gathering (a tested
identity), repeated tokens get the same row, and a lookup costs ``O(tokens * r)`` instead of ``O(V r)``
(paper Sec. 2.4). Their ``kl`` covers the whole table (the paper leaves this open; a batch-only KL would be a
biased estimate of the ELBO's KL).

**Priors.** :class:`ScaleMixturePrior` ``pi N(0, s1^2) + (1 - pi) N(0, s2^2)`` on every stochastic scalar
(Blundell et al.; defaults ``pi = 0.5, s1 = 1, s2 = e^-6`` as standard deviations, paper App. I.1, G.3.2, G.4.2;
:func:`toy_prior` is the toy regression's ``s1 = 2``), log density by ``logsumexp``; :class:`GaussianPrior`.

**Networks.** :func:`mlp` (any activation), :func:`lstm` (low-rank input-to-gates and hidden-to-gates matrices,
weights sampled once per sequence and reused across time in a ``lax.scan``, or resampled at every step for the
benchmark), :func:`transformer` (pre-norm encoder, multi-head attention, FFN, CLS pooling; Q, K, V, O, FFN,
embedding and head of the chosen kind). Each accepts the four kinds. Networks have the layer interface plus
``apply_and_kl`` (one draw for both) and ``predict``.

**Training.** :func:`fit` minimises the per-datum negative ELBO ``mean_batch NLL + beta_e KL / N`` with optax
(paper Eq. 1, App. I.1), ``beta_e = kl_weight * schedule(epoch)`` (linear warm-up with an optional delay, or any
callable); Gaussian (fixed or learned noise) and softmax likelihoods. :func:`fit_ensemble` trains ``K`` members
of a (deterministic) network in parallel with ``vmap``. :func:`predict` returns ``S`` stacked Monte-Carlo
outputs.

**Parameter counts** (paper Tables 1, 8, 14, 20; notes section 4.7): ``num_params`` of the builders reproduce
20,802 / 7,202 (toy), 4,788,010 / 245,810 / 2,406,398 (MNIST), 22.4k / 112k / 44.8k / 13.6k / 23.3k (MIMIC) and
9.92M / 49.61M / 19.84M / 1.47M / 10.01M (SST-2); see :func:`paper_model` for the configurations.

Randomness is explicit. One weight sample of a network is **one** ``uniform`` draw with its key, split over
the layers' factors in order and turned into Gaussian (``sqrt(2) erfinv(u)``) or Laplace noise by the inverse
CDF; the Monte-Carlo KL of the network is then one vectorised ``log q - log p`` over that flat draw. (XLA:CPU
spends ~0.3 s compiling each random-bits call and each separate elementwise chain; one draw per network halves
the compile time of a training step.) Embedding rows use ``fold_in(key, row)`` as above; LSTM per-step
resampling ``fold_in(fold_in(key, l + 1), t)``; initialisation ``fold_in(key, i)`` for component ``i``. The
public ``init``/``apply``/``kl``/``apply_and_kl`` run as one cached ``jit`` per spec. Nothing flips
``jax_enable_x64``; arrays take their dtype from the parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
from jax import lax

from finite.checks import check_positive
from smnngp.kernels import softplus_inverse

__all__ = [
    "KINDS",
    "FAMILIES",
    "MeanField",
    "ScaleMixturePrior",
    "GaussianPrior",
    "DEFAULT_PRIOR",
    "toy_prior",
    "DenseParams",
    "BBBParams",
    "LowRankParams",
    "Rank1Params",
    "DenseWeights",
    "FactorWeights",
    "Rank1Weights",
    "DeterministicDense",
    "BBBDense",
    "LowRankDense",
    "Rank1Dense",
    "dense",
    "DeterministicEmbedding",
    "BBBEmbedding",
    "LowRankEmbedding",
    "Rank1Embedding",
    "embedding",
    "variance_matched_scale",
    "svd_factors",
    "materialize",
    "MLP",
    "mlp",
    "LSTM",
    "lstm",
    "lstm_cell",
    "EncoderBlock",
    "Transformer",
    "transformer",
    "paper_model",
    "FitResult",
    "linear_warmup",
    "fit",
    "fit_ensemble",
    "init_ensemble",
    "ensemble_apply",
    "predict",
]

KINDS = ("deterministic", "bbb", "lowrank", "rank1")
FAMILIES = ("gaussian", "laplace")
_BIASES = ("bayes", "deterministic", "none")
_KL_METHODS = ("auto", "mc", "exact")


# ---------------------------------------------------------------------------
# Small validation helpers (errors name the layer and the argument)
# ---------------------------------------------------------------------------


def _check_choice(value, choices, name: str, where: str):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{where}: {name} must be one of {choices}, got {value!r}")
    return value


def _check_int(value, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


_check_pos = check_positive


def _check_range(value, name: str, where: str):
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a pair (low, high), got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{where}: {name} must be a finite pair with low <= high, got {value!r}")
    return (lo, hi)


def _check_last_dim(x, n: int, where: str):
    if not hasattr(x, "shape") or x.ndim < 1:
        raise ValueError(f"{where}: x must be an array with a feature axis, got {type(x).__name__}")
    if x.shape[-1] != n:
        raise ValueError(f"{where}: x must have last dimension {n}, got shape {tuple(x.shape)}")


def _float_dtype(dtype):
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    return dtype


# ---------------------------------------------------------------------------
# Mean-field factors and priors
# ---------------------------------------------------------------------------


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


def _bias_log_ratio(b, wb, prior, family: str):
    if isinstance(b, MeanField):
        return _log_q(b, wb, family) - _prior_sum(prior, wb)
    return 0.0


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

    ``W`` has shape ``(n_in, n_out)`` (this module's orientation); ``mu_A mu_B^T = W_r``, the best rank-``r``
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
    return U[:, :rank] * root, Vt[:rank].T * root


# ---------------------------------------------------------------------------
# Parameter and weight pytrees
# ---------------------------------------------------------------------------


class DenseParams(NamedTuple):
    """Deterministic dense layer: ``W (n_in, n_out)``, ``b (n_out,)`` or ``None``."""

    W: jnp.ndarray
    b: Any


class BBBParams(NamedTuple):
    """Full-rank mean-field layer: ``W`` a :class:`MeanField` of shape ``(n_in, n_out)``; ``b`` a
    :class:`MeanField`, an array (deterministic bias) or ``None``."""

    W: MeanField
    b: Any


class LowRankParams(NamedTuple):
    """Low-rank layer ``W = A B^T``: ``A`` a :class:`MeanField` ``(n_in, r)``, ``B`` a :class:`MeanField`
    ``(n_out, r)``; ``b`` a :class:`MeanField`, an array or ``None``."""

    A: MeanField
    B: MeanField
    b: Any


class Rank1Params(NamedTuple):
    """Rank-1 multiplicative layer ``W = W_bar o (s r^T)``: deterministic ``W`` (``W_bar``, ``(n_in, n_out)``),
    :class:`MeanField` ``s (n_in,)`` and ``r (n_out,)``; ``b`` a :class:`MeanField`, an array or ``None``."""

    W: jnp.ndarray
    s: MeanField
    r: MeanField
    b: Any


class DenseWeights(NamedTuple):
    """One concrete draw of a dense or full-rank layer: ``W (n_in, n_out)``, ``b`` or ``None``."""

    W: jnp.ndarray
    b: Any


class FactorWeights(NamedTuple):
    """One concrete draw of a low-rank layer: ``A (n_in, r)``, ``B (n_out, r)``, ``b`` or ``None``."""

    A: jnp.ndarray
    B: jnp.ndarray
    b: Any


class Rank1Weights(NamedTuple):
    """One concrete draw of a rank-1 layer: ``W_bar``, ``s (n_in,)``, ``r (n_out,)``, ``b`` or ``None``.

    Attributes:
        W: the deterministic base matrix ``W_bar``, shape ``(n_in, n_out)`` (``(V, d)`` for an embedding).
        s: the drawn input-side multipliers, shape ``(n_in,)`` (``(V,)`` for an embedding).
        r: the drawn output-side multipliers, shape ``(n_out,)`` (``(d,)`` for an embedding).
        b: the bias ``(n_out,)`` (drawn when Bayesian), or ``None`` for a layer without bias.
    """

    W: jnp.ndarray
    s: jnp.ndarray
    r: jnp.ndarray
    b: Any


def materialize(weights) -> jnp.ndarray:
    """The dense matrix ``W`` (``(n_in, n_out)``, or ``(V, d)`` for an embedding) of one drawn ``weights``.

    Args:
        weights: one draw, a :class:`DenseWeights` (``W`` itself), :class:`FactorWeights` (``A B^T``) or
            :class:`Rank1Weights` (``W_bar o (s r^T)``), e.g. from a layer's ``sample``.

    Returns:
        The weight matrix as a JAX array (the bias is not included).

    Raises:
        ValueError: if ``weights`` is none of the three weight types.
    """
    if isinstance(weights, DenseWeights):
        return weights.W
    if isinstance(weights, FactorWeights):
        return weights.A @ weights.B.T
    if isinstance(weights, Rank1Weights):
        return weights.W * weights.s[:, None] * weights.r[None, :]
    raise ValueError(f"materialize: weights must be DenseWeights, FactorWeights or Rank1Weights, "
                     f"got {type(weights).__name__}")


# ---------------------------------------------------------------------------
# Dense layers
# ---------------------------------------------------------------------------


def _glorot_uniform(key, shape, dtype):
    lim = math.sqrt(6.0 / (shape[0] + shape[1]))
    return jax.random.uniform(key, shape, dtype, -lim, lim)


def _det_init(key, shape, dtype, init: str):
    if init == "glorot":
        return _glorot_uniform(key, shape, dtype)
    if init == "he":
        return jax.random.normal(key, shape, dtype) * math.sqrt(2.0 / shape[0])
    if init == "orthogonal":
        return jax.nn.initializers.orthogonal()(key, shape, dtype)
    return jax.random.uniform(key, shape, dtype, -0.05, 0.05)  # "uniform": Keras Embedding default


def _hashable(*objs) -> bool:
    try:
        for o in objs:
            hash(o)
    except TypeError:
        return False
    return True


# Public apply / kl calls go through one cached jit per (spec, prior, method, shapes): run op by op, every
# primitive would compile its own small XLA program. Inside an outer trace (fit, vmap) the jit is inlined.
@functools.partial(jax.jit, static_argnums=(0, 2))
def _jit_init(spec, key, dtype):
    return spec._init_impl(key, dtype)


@functools.partial(jax.jit, static_argnums=(0,))
def _jit_apply(spec, params, x, key):
    return spec._apply_impl(params, x, key)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _jit_kl(spec, params, key, prior, method):
    return spec._kl_impl(params, prior, key, method)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _jit_run(model, params, x, key, prior, method, extra):
    return model._run(params, x, key, prior, method, *extra)


@functools.partial(jax.jit, static_argnums=(0,))
def _jit_encode(model, params, tokens, key):
    return model._encode(params, tokens, key, None, "mc")[0]


def _as_array(x):
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else jnp.asarray(x)


def _dispatch_kl(spec, params, prior, key, method, where):
    prior = _check_prior(prior, where)
    _check_choice(method, _KL_METHODS, "method", where)
    if _hashable(prior):
        return _jit_kl(spec, params, key, prior, method)
    return spec._kl_impl(params, prior, key, method)


class _Stochastic:
    """What dense layers and embeddings share: ``init`` and the KL of their stochastic parameters (subclasses
    give ``_where``, ``sample``, ``_log_ratio``, ``_exact_kl`` and ``kind``)."""

    def init(self, key, dtype=jnp.float32):
        """Initial parameters (a NamedTuple / dict pytree) with floating ``dtype`` (default float32), drawn with
        ``key``; one jitted program per spec and dtype."""
        return _jit_init(self, key, _float_dtype(dtype))

    def kl(self, params, prior=DEFAULT_PRIOR, key=None, method: str = "auto"):
        """``KL(q || p)`` of the stochastic parameters (paper Eq. 1; for an embedding, of the whole table).

        ``method="mc"``: ``log q(w) - log p(w)`` at ``w = sample(params, key)`` (the draw ``apply`` uses with
        ``key``), unbiased; ``"exact"``: closed form for Gaussian factors and a :class:`GaussianPrior`;
        ``"auto"``: exact when available. Returns a scalar (0 for deterministic kinds).
        """
        where = self._where()
        _kl_method(method, _check_prior(prior, where), getattr(self, "family", "gaussian"), where)
        if key is None and _kl_method(method, prior, getattr(self, "family", "gaussian"), where) == "mc":
            raise ValueError(f"{where}: kl with method='mc' needs a PRNG key")
        return _dispatch_kl(self, params, prior, key, method, where)

    def _kl_impl(self, params, prior, key, method):
        where = self._where()
        method = _kl_method(method, prior, getattr(self, "family", "gaussian"), where)
        if method == "exact" or self.kind == "deterministic":
            return self._exact_kl(params, prior)
        if key is None:
            raise ValueError(f"{where}: kl with method='mc' needs a PRNG key")
        return self.kl_at(params, self.sample(params, key), prior)

    def kl_at(self, params, weights, prior=DEFAULT_PRIOR):
        """Single-sample Monte-Carlo KL ``log q(weights) - log p(weights)`` at given drawn ``weights`` (for an
        embedding, a full-table draw)."""
        return self._log_ratio(params, weights, prior)


class _Layer(_Stochastic):
    """Shared plumbing of the dense layers (kind-specific: ``_init_impl``, ``_noise_shapes``, ``_mf_list``,
    ``_assemble``, ``forward``, ``_log_ratio``, ``_exact_kl``)."""

    def _where(self):
        return f"{type(self).__name__}({self.n_in}->{self.n_out})"

    def apply(self, params, x, key=None):
        """``x @ W + b`` at one draw ``W ~ q`` (``sample(params, key)``), shared across the batch.

        Args: ``params`` from :meth:`init`; ``x`` of shape ``(..., n_in)``; ``key`` a PRNG key (ignored by the
        deterministic kind). Returns ``(..., n_out)``.
        """
        x = _as_array(x)
        _check_last_dim(x, self.n_in, self._where())
        if key is None and self.kind != "deterministic":
            raise ValueError(f"{self._where()}: key must be a PRNG key for a Bayesian layer, got None")
        return _jit_apply(self, params, x, key)

    def _apply_impl(self, params, x, key):
        return self.forward(self.sample(params, key), x)

    @property
    def noise_size(self) -> int:
        """Number of standard-noise scalars one draw needs (0 for the deterministic kind)."""
        return int(sum(np.prod(sh) for sh in self._noise_shapes()))

    def sample(self, params, key):
        """One reparameterised draw of the layer's weights (a pytree of concrete arrays), ``mu + softplus(rho)
        eps`` for every stochastic tensor, the noise coming from one uniform draw with ``key``."""
        if self.noise_size and key is None:
            raise ValueError(f"{self._where()}: sample needs a PRNG key")
        return _draw_specs((self,), (params,), key)[0]

    def sample_from_noise(self, params, u):
        """The draw for given flat uniform noise ``u`` of size ``noise_size`` (``None`` for deterministic)."""
        return _draw_flat((self,), (params,), u)[0][0]


@dataclasses.dataclass(frozen=True)
class DeterministicDense(_Layer):
    """Deterministic dense layer ``x @ W + b`` (kind ``"deterministic"``).

    ``init``: ``"glorot"`` (uniform, Keras' default), ``"he"`` (normal, ``2 / n_in``) or ``"orthogonal"``;
    ``bias``: ``"deterministic"`` or ``"none"``; ``bias_init`` the bias' initial value.

    Attributes:
        n_in: number of input features (a positive integer).
        n_out: number of output features (a positive integer).
        bias: ``"deterministic"`` (a trained bias vector) or ``"none"``.
        init_method: initialiser of ``W`` (the ``init`` above, and the ``init`` argument of :func:`dense`):
            ``"glorot"``, ``"he"`` or ``"orthogonal"``.
        bias_init: initial value of every bias entry.

    Raises:
        ValueError: on construction, if a size is not a positive integer or ``bias`` or ``init_method`` is not
            one of the allowed names.
    """

    n_in: int
    n_out: int
    bias: str = "deterministic"
    init_method: str = "glorot"
    bias_init: float = 0.0
    kind = "deterministic"

    def __post_init__(self):
        where = f"DeterministicDense({self.n_in}->{self.n_out})"
        _check_int(self.n_in, "n_in", where)
        _check_int(self.n_out, "n_out", where)
        _check_choice(self.bias, ("deterministic", "none"), "bias", where)
        _check_choice(self.init_method, ("glorot", "he", "orthogonal"), "init", where)

    def _init_impl(self, key, dtype=jnp.float32) -> DenseParams:
        """Draw ``DenseParams(W, b)``; ``dtype`` the parameters' floating dtype."""
        dtype = _float_dtype(dtype)
        W = _det_init(key, (self.n_in, self.n_out), dtype, self.init_method)
        b = None if self.bias == "none" else jnp.full((self.n_out,), self.bias_init, dtype)
        return DenseParams(W, b)

    def _noise_shapes(self):
        return ()

    def _mf_list(self, params):
        return []

    def _assemble(self, params, vals) -> DenseWeights:
        return DenseWeights(params.W, params.b)

    def forward(self, weights, x):
        """``x @ W + b``."""
        out = x @ weights.W
        return out if weights.b is None else out + weights.b

    def _log_ratio(self, params, weights, prior):
        return jnp.zeros((), params.W.dtype)

    def _exact_kl(self, params, prior):
        return jnp.zeros((), params.W.dtype)

    def num_params(self) -> int:
        """``n_in n_out + n_out`` (or ``n_in n_out`` without bias)."""
        return self.n_in * self.n_out + _bias_count(self.bias, self.n_out)

    def from_deterministic(self, det_params: DenseParams, key=None) -> DenseParams:
        """A copy of ``det_params`` (bias dropped or zero-filled to match ``bias``)."""
        b = None if self.bias == "none" else (jnp.zeros((self.n_out,), det_params.W.dtype)
                                              if det_params.b is None else det_params.b)
        return DenseParams(det_params.W, b)

    def mean_weight(self, params):
        """``E[W] = W``."""
        return params.W


@dataclasses.dataclass(frozen=True)
class BBBDense(_Layer):
    """Full-rank mean-field (Bayes-by-Backprop) layer: ``W_ij ~ q(mu_ij, softplus(rho_ij))`` independent.

    ``family``: ``"gaussian"`` or ``"laplace"``. ``init``: ``"uniform"`` (the paper's baselines, ``mu ~
    U(-mean_scale, mean_scale)``, Tables 6-8), ``"he"`` / ``"glorot"`` (``mu ~ N(0, sigma_W^2)``). ``rho ~
    U(rho_range)`` (default ``(-5, -4)``, MIMIC and SST-2; Beijing used ``(-3, -2)``). ``bias``: ``"bayes"``
    (``mu = bias_init``, ``rho = bias_rho``; Table 8's ``b: mu = 0, rho = -5``), ``"deterministic"`` or
    ``"none"``.

    Attributes:
        n_in: number of input features (a positive integer).
        n_out: number of output features (a positive integer).
        family: variational family of the weights and Bayesian bias, ``"gaussian"`` or ``"laplace"``.
        bias: ``"bayes"``, ``"deterministic"`` or ``"none"``.
        init_method: initialiser of the weight means (the ``init`` above): ``"uniform"``, ``"he"`` or
            ``"glorot"``.
        mean_scale: half-width of the uniform mean initialisation (positive; used by ``"uniform"``).
        rho_range: ``(low, high)`` of the uniform initialisation of the weights' ``rho`` (required).
        bias_rho: initial ``rho`` of a Bayesian bias.
        bias_init: initial mean (or value, for a deterministic bias) of every bias entry.

    Raises:
        ValueError: on construction, if a size is not a positive integer, a name is not one of the allowed
            values, ``mean_scale`` is not positive or ``rho_range`` is not a finite pair ``low <= high``.
    """

    n_in: int
    n_out: int
    family: str = "gaussian"
    bias: str = "bayes"
    init_method: str = "uniform"
    mean_scale: float = 0.2
    rho_range: tuple = (-5.0, -4.0)
    bias_rho: float = -5.0
    bias_init: float = 0.0
    kind = "bbb"

    def __post_init__(self):
        where = self._where()
        _check_int(self.n_in, "n_in", where)
        _check_int(self.n_out, "n_out", where)
        _check_choice(self.family, FAMILIES, "family", where)
        _check_choice(self.bias, _BIASES, "bias", where)
        _check_choice(self.init_method, ("uniform", "he", "glorot"), "init", where)
        _check_pos(self.mean_scale, "mean_scale", where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))
        if self.rho_range is None:
            raise ValueError(f"{where}: rho_range must be a pair (low, high)")

    def _init_impl(self, key, dtype=jnp.float32) -> BBBParams:
        """Draw ``BBBParams(W=MeanField(mu, rho), b)``."""
        dtype = _float_dtype(dtype)
        k_mu, k_rho = jax.random.split(key)
        shape = (self.n_in, self.n_out)
        if self.init_method == "uniform":
            mu = jax.random.uniform(k_mu, shape, dtype, -self.mean_scale, self.mean_scale)
        else:
            var_w = 2.0 / self.n_in if self.init_method == "he" else 2.0 / (self.n_in + self.n_out)
            mu = jax.random.normal(k_mu, shape, dtype) * math.sqrt(var_w)
        rho = _init_rho(k_rho, shape, dtype, None, self.rho_range)
        return BBBParams(MeanField(mu, rho), _bias_params(self.bias, self.n_out, dtype, self.bias_rho,
                                                          self.bias_init))

    def _noise_shapes(self):
        return ((self.n_in, self.n_out),) + (((self.n_out,),) if self.bias == "bayes" else ())

    def _mf_list(self, params):
        return [params.W] + ([params.b] if self.bias == "bayes" else [])

    def _assemble(self, params, vals) -> DenseWeights:
        """Weights from the drawn ``W`` (and bias) in ``_mf_list`` order."""
        return DenseWeights(vals[0], vals[1] if self.bias == "bayes" else params.b)

    def forward(self, weights, x):
        """``x @ W + b``."""
        out = x @ weights.W
        return out if weights.b is None else out + weights.b

    def _log_ratio(self, params, weights, prior):
        lr = _log_q(params.W, weights.W, self.family) - _prior_sum(prior, weights.W)
        return lr + _bias_log_ratio(params.b, weights.b, prior, self.family)

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.W, prior) + _bias_exact_kl(params.b, prior)

    def num_params(self) -> int:
        """``2 n_in n_out`` plus the bias (``2 n_out`` Bayesian, ``n_out`` deterministic; Table 4)."""
        return 2 * self.n_in * self.n_out + _bias_count(self.bias, self.n_out)

    def from_deterministic(self, det_params: DenseParams, key) -> BBBParams:
        """``mu = W``, ``mu_b = b``; ``rho`` drawn as in :meth:`init`."""
        W = jnp.asarray(det_params.W)
        rho = _init_rho(key, W.shape, W.dtype, None, self.rho_range)
        return BBBParams(MeanField(W, rho), _bias_from(self.bias, det_params.b, self.n_out, W.dtype, self.bias_rho))

    def mean_weight(self, params):
        """``E[W] = mu``."""
        return params.W.mu


@dataclasses.dataclass(frozen=True)
class LowRankDense(_Layer):
    """Low-rank variational layer ``W = A B^T``, ``A (n_in, r)``, ``B (n_out, r)`` (paper Sec. 2.1, App. F).

    Every entry of ``A`` and ``B`` is independent ``N(mu, softplus(rho)^2)`` (``family="gaussian"``) or
    ``Laplace(mu, softplus(rho))`` (``family="laplace"``, App. I.1). One draw per forward pass:
    ``A = mu_A + softplus(rho_A) o eps_A``, ``B = mu_B + softplus(rho_B) o eps_B``; every sampled ``W`` has rank
    ``<= r`` (Lemma 3.2).

    Initialisation (App. F.2-F.8): ``init`` ``"he"`` or ``"glorot"`` fixes ``sigma_W^2``; factor means i.i.d.
    ``N(0, s^2)`` (``mean_dist="normal"``) or ``U(-sqrt(3) s, sqrt(3) s)`` (``"uniform"``) with ``s =
    (sigma_W^2 / r)^(1/4)``; scales ``softplus(rho) = eta s`` (App. F.7, ``eta`` in (0, 1), default 0.1), or
    ``rho ~ U(rho_range)`` when ``rho_range`` is given. :meth:`from_deterministic` is the SVD initialisation
    (App. F.9).

    ``path``: ``"factored"`` computes ``(x @ A) @ B^T`` (``O(b r (n_in + n_out))``, App. I.1.2);
    ``"materialized"`` forms ``W = A B^T`` first (``O(n_in n_out r + b n_in n_out)``); ``"auto"`` picks the
    cheaper from the static batch size. ``rank`` must not exceed ``min(n_in, n_out)`` unless
    ``overcomplete=True`` (a rank-``r`` factorisation of a thinner matrix is valid but wasteful; the paper's
    SST-2 head evidently used it, see :func:`paper_model`).

    Attributes:
        n_in: number of input features (a positive integer).
        n_out: number of output features (a positive integer).
        rank: the rank ``r`` of the factorisation (a positive integer).
        family: variational family of the factor entries and Bayesian bias, ``"gaussian"`` or ``"laplace"``.
        bias: ``"bayes"`` (mean-field bias), ``"deterministic"`` or ``"none"``.
        init_method: ``"he"`` or ``"glorot"`` (the ``init`` above, and the ``init`` argument of :func:`dense`),
            which fixes the matched weight variance ``sigma_W^2``.
        mean_dist: distribution of the initial factor means, ``"normal"`` or ``"uniform"``.
        eta: initial scale of the factor entries relative to ``s`` (positive; ignored when ``rho_range`` is set).
        rho_range: ``(low, high)`` for ``rho ~ U(low, high)`` at initialisation, or ``None`` for ``eta s``.
        bias_rho: initial ``rho`` of a Bayesian bias.
        bias_init: initial mean (or value, for a deterministic bias) of every bias entry.
        path: ``"auto"``, ``"factored"`` or ``"materialized"`` (see above).
        overcomplete: allow ``rank > min(n_in, n_out)``.

    Raises:
        ValueError: on construction, if a size is not a positive integer, ``rank`` exceeds ``min(n_in, n_out)``
            without ``overcomplete``, a name is not one of the allowed values, ``eta`` is not positive or
            ``rho_range`` is not a finite pair ``low <= high``.
    """

    n_in: int
    n_out: int
    rank: int
    family: str = "gaussian"
    bias: str = "bayes"
    init_method: str = "he"
    mean_dist: str = "normal"
    eta: float = 0.1
    rho_range: Any = None
    bias_rho: float = -5.0
    bias_init: float = 0.0
    path: str = "auto"
    overcomplete: bool = False
    kind = "lowrank"

    def __post_init__(self):
        where = self._where()
        _check_int(self.n_in, "n_in", where)
        _check_int(self.n_out, "n_out", where)
        _check_int(self.rank, "rank", where)
        if self.rank > min(self.n_in, self.n_out) and not self.overcomplete:
            raise ValueError(f"{where}: rank {self.rank} exceeds min(n_in, n_out) = {min(self.n_in, self.n_out)} "
                             f"(pass overcomplete=True to allow it)")
        _check_choice(self.family, FAMILIES, "family", where)
        _check_choice(self.bias, _BIASES, "bias", where)
        _check_choice(self.init_method, ("he", "glorot"), "init", where)
        _check_choice(self.mean_dist, ("normal", "uniform"), "mean_dist", where)
        _check_choice(self.path, ("auto", "factored", "materialized"), "path", where)
        _check_pos(self.eta, "eta", where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))

    @property
    def factor_scale(self) -> float:
        """``s = (sigma_W^2 / r)^(1/4)`` (App. F.6)."""
        var_w = 2.0 / self.n_in if self.init_method == "he" else 2.0 / (self.n_in + self.n_out)
        return (var_w / self.rank) ** 0.25

    def _init_impl(self, key, dtype=jnp.float32) -> LowRankParams:
        """Variance-matched random initialisation (App. F.6-F.7); returns ``LowRankParams(A, B, b)``."""
        dtype = _float_dtype(dtype)
        ka, kb, kra, krb = jax.random.split(key, 4)
        s = self.factor_scale

        def means(k, shape):
            if self.mean_dist == "normal":
                return jax.random.normal(k, shape, dtype) * s
            a = math.sqrt(3.0) * s
            return jax.random.uniform(k, shape, dtype, -a, a)

        sa, sb = (self.n_in, self.rank), (self.n_out, self.rank)
        A = MeanField(means(ka, sa), _init_rho(kra, sa, dtype, self.eta * s, self.rho_range))
        B = MeanField(means(kb, sb), _init_rho(krb, sb, dtype, self.eta * s, self.rho_range))
        return LowRankParams(A, B, _bias_params(self.bias, self.n_out, dtype, self.bias_rho, self.bias_init))

    def _noise_shapes(self):
        return ((self.n_in, self.rank), (self.n_out, self.rank)) + (((self.n_out,),) if self.bias == "bayes" else ())

    def _mf_list(self, params):
        return [params.A, params.B] + ([params.b] if self.bias == "bayes" else [])

    def _assemble(self, params, vals) -> FactorWeights:
        """Weights from the drawn ``A = mu_A + softplus(rho_A) eps_A``, ``B`` (and bias), ``_mf_list`` order."""
        return FactorWeights(vals[0], vals[1], vals[2] if self.bias == "bayes" else params.b)

    def _use_factored(self, x) -> bool:
        if self.path != "auto":
            return self.path == "factored"
        rows = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
        factored = rows * self.rank * (self.n_in + self.n_out)
        materialized = self.n_in * self.n_out * (self.rank + rows)
        return factored <= materialized

    def forward(self, weights, x):
        """``(x @ A) @ B^T + b`` (or ``x @ (A B^T) + b`` on the materialised path)."""
        if self._use_factored(x):
            out = (x @ weights.A) @ weights.B.T
        else:
            out = x @ (weights.A @ weights.B.T)
        return out if weights.b is None else out + weights.b

    def _log_ratio(self, params, weights, prior):
        lr = (_log_q(params.A, weights.A, self.family) - _prior_sum(prior, weights.A)
              + _log_q(params.B, weights.B, self.family) - _prior_sum(prior, weights.B))
        return lr + _bias_log_ratio(params.b, weights.b, prior, self.family)

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.A, prior) + _exact_kl_mf(params.B, prior) + _bias_exact_kl(params.b, prior)

    def num_params(self) -> int:
        """``2 r (n_in + n_out)`` plus the bias (paper Sec. 2.1, Table 4)."""
        return 2 * self.rank * (self.n_in + self.n_out) + _bias_count(self.bias, self.n_out)

    def from_deterministic(self, det_params: DenseParams, key) -> LowRankParams:
        """SVD initialisation (App. F.9): ``mu_A = U_r Sigma_r^(1/2)``, ``mu_B = V_r Sigma_r^(1/2)`` of the trained
        ``W = U Sigma V^T``, so ``mu_A mu_B^T = W_r``; scales as in :meth:`init` (``eta s`` or ``U(rho_range)``,
        the paper leaves them unspecified); ``mu_b = b``."""
        W = jnp.asarray(det_params.W)
        if W.shape != (self.n_in, self.n_out):
            raise ValueError(f"{self._where()}: det_params.W must have shape {(self.n_in, self.n_out)}, "
                             f"got {tuple(W.shape)}")
        r = min(self.rank, min(W.shape))
        mu_a, mu_b = svd_factors(W, r)
        if r < self.rank:  # overcomplete: pad with zero columns (W_r unchanged)
            mu_a = jnp.pad(mu_a, ((0, 0), (0, self.rank - r)))
            mu_b = jnp.pad(mu_b, ((0, 0), (0, self.rank - r)))
        kra, krb = jax.random.split(key)
        s = self.factor_scale
        A = MeanField(mu_a, _init_rho(kra, mu_a.shape, W.dtype, self.eta * s, self.rho_range))
        B = MeanField(mu_b, _init_rho(krb, mu_b.shape, W.dtype, self.eta * s, self.rho_range))
        return LowRankParams(A, B, _bias_from(self.bias, det_params.b, self.n_out, W.dtype, self.bias_rho))

    def mean_weight(self, params):
        """``E[W] = mu_A mu_B^T`` (independent factors)."""
        return params.A.mu @ params.B.mu.T


@dataclasses.dataclass(frozen=True)
class Rank1Dense(_Layer):
    """Rank-1 multiplicative layer (Dusenberry et al. 2020; paper App. I.1): ``W = W_bar o (s r^T)``.

    ``W_bar`` is deterministic (``init`` ``"glorot"`` or ``"he"``); ``s`` (``n_in``) and ``r`` (``n_out``) are
    mean-field with means ``1 + U(-perturbation, perturbation)`` ("Glorot + small perturbations", Tables 6-7)
    and ``rho ~ U(rho_range)``. ``x @ W = ((x o s) @ W_bar) o r``. The bias is deterministic by default (this
    reproduces Table 14's 2,406,398 and Table 8's 10.01M).

    Attributes:
        n_in: number of input features (a positive integer).
        n_out: number of output features (a positive integer).
        family: variational family of ``s``, ``r`` and a Bayesian bias, ``"gaussian"`` or ``"laplace"``.
        bias: ``"deterministic"`` (default), ``"bayes"`` or ``"none"``.
        init_method: initialiser of ``W_bar`` (the ``init`` above), ``"glorot"`` or ``"he"``.
        perturbation: half-width of the uniform perturbation of the means of ``s`` and ``r`` around 1
            (non-negative).
        rho_range: ``(low, high)`` of the uniform initialisation of the ``rho`` of ``s`` and ``r`` (required).
        bias_rho: initial ``rho`` of a Bayesian bias.
        bias_init: initial mean (or value, for a deterministic bias) of every bias entry.

    Raises:
        ValueError: on construction, if a size is not a positive integer, a name is not one of the allowed
            values, ``perturbation`` is negative or ``rho_range`` is not a finite pair ``low <= high``.
    """

    n_in: int
    n_out: int
    family: str = "gaussian"
    bias: str = "deterministic"
    init_method: str = "glorot"
    perturbation: float = 0.1
    rho_range: tuple = (-5.0, -4.0)
    bias_rho: float = -5.0
    bias_init: float = 0.0
    kind = "rank1"

    def __post_init__(self):
        where = self._where()
        _check_int(self.n_in, "n_in", where)
        _check_int(self.n_out, "n_out", where)
        _check_choice(self.family, FAMILIES, "family", where)
        _check_choice(self.bias, _BIASES, "bias", where)
        _check_choice(self.init_method, ("glorot", "he"), "init", where)
        if not (math.isfinite(float(self.perturbation)) and float(self.perturbation) >= 0):
            raise ValueError(f"{where}: perturbation must be >= 0, got {self.perturbation!r}")
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))
        if self.rho_range is None:
            raise ValueError(f"{where}: rho_range must be a pair (low, high)")

    def _vectors(self, key, dtype):
        ks, kr, kps, kpr = jax.random.split(key, 4)
        p = float(self.perturbation)
        s = MeanField(1.0 + jax.random.uniform(ks, (self.n_in,), dtype, -p, p),
                      _init_rho(kps, (self.n_in,), dtype, None, self.rho_range))
        r = MeanField(1.0 + jax.random.uniform(kr, (self.n_out,), dtype, -p, p),
                      _init_rho(kpr, (self.n_out,), dtype, None, self.rho_range))
        return s, r

    def _init_impl(self, key, dtype=jnp.float32) -> Rank1Params:
        """Draw ``Rank1Params(W_bar, s, r, b)``."""
        dtype = _float_dtype(dtype)
        kw, kv = jax.random.split(key)
        W = _det_init(kw, (self.n_in, self.n_out), dtype, self.init_method)
        s, r = self._vectors(kv, dtype)
        return Rank1Params(W, s, r, _bias_params(self.bias, self.n_out, dtype, self.bias_rho, self.bias_init))

    def _noise_shapes(self):
        return ((self.n_in,), (self.n_out,)) + (((self.n_out,),) if self.bias == "bayes" else ())

    def _mf_list(self, params):
        return [params.s, params.r] + ([params.b] if self.bias == "bayes" else [])

    def _assemble(self, params, vals) -> Rank1Weights:
        """Weights from the drawn ``s, r`` (and bias), ``W_bar`` fixed."""
        return Rank1Weights(params.W, vals[0], vals[1], vals[2] if self.bias == "bayes" else params.b)

    def forward(self, weights, x):
        """``((x o s) @ W_bar) o r + b``."""
        out = ((x * weights.s) @ weights.W) * weights.r
        return out if weights.b is None else out + weights.b

    def _log_ratio(self, params, weights, prior):
        lr = (_log_q(params.s, weights.s, self.family) - _prior_sum(prior, weights.s)
              + _log_q(params.r, weights.r, self.family) - _prior_sum(prior, weights.r))
        return lr + _bias_log_ratio(params.b, weights.b, prior, self.family)

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.s, prior) + _exact_kl_mf(params.r, prior) + _bias_exact_kl(params.b, prior)

    def num_params(self) -> int:
        """``n_in n_out + 2 (n_in + n_out)`` plus the bias (Table 4: ``mn + 2(m + n)``)."""
        return self.n_in * self.n_out + 2 * (self.n_in + self.n_out) + _bias_count(self.bias, self.n_out)

    def from_deterministic(self, det_params: DenseParams, key) -> Rank1Params:
        """``W_bar = W``; ``s, r`` means 1 (so ``E[W] = W`` at the start), ``rho ~ U(rho_range)``."""
        W = jnp.asarray(det_params.W)
        ks, kr = jax.random.split(key)
        s = MeanField(jnp.ones((self.n_in,), W.dtype), _init_rho(ks, (self.n_in,), W.dtype, None, self.rho_range))
        r = MeanField(jnp.ones((self.n_out,), W.dtype), _init_rho(kr, (self.n_out,), W.dtype, None, self.rho_range))
        return Rank1Params(W, s, r, _bias_from(self.bias, det_params.b, self.n_out, W.dtype, self.bias_rho))

    def mean_weight(self, params):
        """``E[W] = W_bar o (mu_s mu_r^T)``."""
        return params.W * params.s.mu[:, None] * params.r.mu[None, :]


_DENSE = {"deterministic": DeterministicDense, "bbb": BBBDense, "lowrank": LowRankDense, "rank1": Rank1Dense}


def dense(kind: str, n_in: int, n_out: int, *, rank: int | None = None, bias: str | None = None,
          init: str | None = None, **options):
    """A dense layer spec of ``kind`` (one of :data:`KINDS`).

    Args:
        kind: ``"deterministic"``, ``"bbb"``, ``"lowrank"`` or ``"rank1"``.
        n_in: number of input features.
        n_out: number of output features.
        rank: the rank (required for ``"lowrank"``, rejected otherwise).
        bias: the bias kind; ``None`` keeps the class default (``"deterministic"`` for the deterministic and
            rank-1 kinds, ``"bayes"`` for ``"bbb"`` and ``"lowrank"``).
        init: the kind's initialiser name, stored as the class' ``init_method``; ``None`` keeps the class default.
        **options: further fields of the class (``family``, ``eta``, ``rho_range``, ...); ``overcomplete`` is
            dropped for the kinds other than ``"lowrank"`` and ``family`` for ``"deterministic"``.

    Returns:
        The layer spec: a :class:`DeterministicDense`, :class:`BBBDense`, :class:`LowRankDense` or
        :class:`Rank1Dense`.

    Raises:
        ValueError: if ``kind`` is unknown, ``rank`` is missing for ``"lowrank"`` or given for another kind, or
            the class rejects a field value (for the kinds other than ``"lowrank"`` also an unknown option).
        TypeError: if an option is not a field of :class:`LowRankDense` (kind ``"lowrank"``).
    """
    where = f"dense({n_in}->{n_out})"
    _check_choice(kind, KINDS, "kind", where)
    cls = _DENSE[kind]
    kw = dict(options)
    if bias is not None:
        kw["bias"] = bias
    if init is not None:
        kw["init_method"] = init
    if kind == "lowrank":
        if rank is None:
            raise ValueError(f"{where}: rank is required for kind='lowrank'")
        return cls(n_in, n_out, rank, **kw)
    if rank is not None:
        raise ValueError(f"{where}: rank is only used by kind='lowrank', got rank={rank!r} for kind={kind!r}")
    kw.pop("overcomplete", None)
    if kind == "deterministic":
        kw.pop("family", None)
    try:
        return cls(n_in, n_out, **kw)
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None


# ---------------------------------------------------------------------------
# Embeddings: only the looked-up rows are sampled
# ---------------------------------------------------------------------------


def _row_noise(key, rows, shape, family: str, dtype):
    """Noise for each row id in ``rows``: row ``v`` uses ``fold_in(key, v)`` (so gathering = sampling rows)."""
    flat = jnp.reshape(rows, (-1,))
    eps = jax.vmap(lambda v: _std_noise(jax.random.fold_in(key, v), shape, family, dtype))(flat)
    return jnp.reshape(eps, tuple(rows.shape) + tuple(shape))


def _check_tokens(tokens, vocab: int, where: str):
    if not hasattr(tokens, "dtype") or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{where}: tokens must be an integer array, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)}")


class _Embedding(_Stochastic):
    """Shared plumbing of the embeddings (kind-specific: ``lookup``, ``sample``, ``_log_ratio``, ``_exact_kl``)."""

    def _where(self):
        return f"{type(self).__name__}({self.vocab}x{self.dim})"

    def apply(self, params, tokens, key=None):
        """Embeddings of ``tokens`` (integer array of any shape) at one draw; shape ``tokens.shape + (dim,)``."""
        tokens = _as_array(tokens)
        _check_tokens(tokens, self.vocab, self._where())
        if key is None and self.kind != "deterministic":
            raise ValueError(f"{self._where()}: key must be a PRNG key for a Bayesian embedding, got None")
        return _jit_apply(self, params, tokens, key)

    def _apply_impl(self, params, tokens, key):
        return self.lookup(params, tokens, key)


@dataclasses.dataclass(frozen=True)
class DeterministicEmbedding(_Embedding):
    """Deterministic table ``E (V, d)``, ``U(-0.05, 0.05)`` initialised (Keras' Embedding default, Table 8).

    Attributes:
        vocab: vocabulary size ``V`` (a positive integer).
        dim: embedding dimension ``d`` (a positive integer).

    Raises:
        ValueError: on construction, if ``vocab`` or ``dim`` is not a positive integer.
    """

    vocab: int
    dim: int
    kind = "deterministic"

    def __post_init__(self):
        _check_int(self.vocab, "vocab", self._where())
        _check_int(self.dim, "dim", self._where())

    def _init_impl(self, key, dtype=jnp.float32):
        """``DenseParams(E, None)``."""
        return DenseParams(_det_init(key, (self.vocab, self.dim), _float_dtype(dtype), "uniform"), None)

    def sample(self, params, key=None):
        """The table."""
        return DenseWeights(params.W, None)

    def lookup(self, params, tokens, key=None):
        """``E[tokens]``."""
        return jnp.take(params.W, tokens, axis=0)

    def _log_ratio(self, params, weights, prior):
        return jnp.zeros((), params.W.dtype)

    def _exact_kl(self, params, prior):
        return jnp.zeros((), params.W.dtype)

    def num_params(self) -> int:
        """``V d``."""
        return self.vocab * self.dim

    def from_deterministic(self, det_params, key=None):
        """A copy of the table."""
        return DenseParams(det_params.W, None)


@dataclasses.dataclass(frozen=True)
class BBBEmbedding(_Embedding):
    """Full-rank mean-field table ``E_vj ~ q(mu_vj, softplus(rho_vj))``; ``mu ~ U(-mean_scale, mean_scale)``,
    ``rho ~ U(rho_range)`` (Table 8's FR-BBB).

    Attributes:
        vocab: vocabulary size ``V`` (a positive integer).
        dim: embedding dimension ``d`` (a positive integer).
        family: variational family of the entries, ``"gaussian"`` or ``"laplace"``.
        mean_scale: half-width of the uniform initialisation of the means (positive).
        rho_range: ``(low, high)`` of the uniform initialisation of ``rho``.

    Raises:
        ValueError: on construction, if a size is not a positive integer, ``family`` is unknown,
            ``mean_scale`` is not positive or ``rho_range`` is not a finite pair ``low <= high``.
    """

    vocab: int
    dim: int
    family: str = "gaussian"
    mean_scale: float = 0.2
    rho_range: tuple = (-5.0, -4.0)
    kind = "bbb"

    def __post_init__(self):
        where = self._where()
        _check_int(self.vocab, "vocab", where)
        _check_int(self.dim, "dim", where)
        _check_choice(self.family, FAMILIES, "family", where)
        _check_pos(self.mean_scale, "mean_scale", where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))

    def _init_impl(self, key, dtype=jnp.float32):
        """``BBBParams(MeanField(mu, rho), None)``."""
        dtype = _float_dtype(dtype)
        k1, k2 = jax.random.split(key)
        shape = (self.vocab, self.dim)
        mu = jax.random.uniform(k1, shape, dtype, -self.mean_scale, self.mean_scale)
        return BBBParams(MeanField(mu, _init_rho(k2, shape, dtype, None, self.rho_range)), None)

    def sample(self, params, key):
        """The full table at one draw (row ``v``'s noise from ``fold_in(key, v)``)."""
        eps = _row_noise(key, jnp.arange(self.vocab), (self.dim,), self.family, params.W.mu.dtype)
        return DenseWeights(_draw(params.W, eps), None)

    def lookup(self, params, tokens, key):
        """Rows of the table for ``tokens`` only, equal to ``sample(params, key).W[tokens]``."""
        eps = _row_noise(key, tokens, (self.dim,), self.family, params.W.mu.dtype)
        mf = MeanField(jnp.take(params.W.mu, tokens, axis=0), jnp.take(params.W.rho, tokens, axis=0))
        return _draw(mf, eps)

    def _log_ratio(self, params, weights, prior):
        return _log_q(params.W, weights.W, self.family) - _prior_sum(prior, weights.W)

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.W, prior)

    def num_params(self) -> int:
        """``2 V d``."""
        return 2 * self.vocab * self.dim

    def from_deterministic(self, det_params, key):
        """``mu = E``, ``rho ~ U(rho_range)``."""
        E = jnp.asarray(det_params.W)
        return BBBParams(MeanField(E, _init_rho(key, E.shape, E.dtype, None, self.rho_range)), None)


@dataclasses.dataclass(frozen=True)
class LowRankEmbedding(_Embedding):
    """Low-rank table ``E = A B^T`` with ``A (V, r)``, ``B (d, r)`` mean-field (paper Sec. 2.4, Transformers).

    A lookup samples ``B`` and only the rows of ``A`` for the tokens in the batch: ``O(tokens r + d r)`` instead
    of ``O(V d)``. Means are variance-matched to a target entry variance ``target_var`` (default that of Keras'
    ``U(-0.05, 0.05)``, ``0.05^2 / 3``): ``s = (target_var / r)^(1/4)``, scales ``eta s`` or ``U(rho_range)``.

    Attributes:
        vocab: vocabulary size ``V`` (a positive integer).
        dim: embedding dimension ``d`` (a positive integer).
        rank: the rank ``r`` (a positive integer).
        family: variational family of the factor entries, ``"gaussian"`` or ``"laplace"``.
        eta: initial scale of the factor entries relative to ``s`` (positive; ignored when ``rho_range`` is set).
        rho_range: ``(low, high)`` for ``rho ~ U(low, high)`` at initialisation, or ``None`` for ``eta s``.
        target_var: the entry variance of ``E`` the initial means match (positive).
        overcomplete: allow ``rank > min(vocab, dim)``.

    Raises:
        ValueError: on construction, if a size is not a positive integer, ``rank`` exceeds ``min(vocab, dim)``
            without ``overcomplete``, ``family`` is unknown, ``eta`` or ``target_var`` is not positive or
            ``rho_range`` is not a finite pair ``low <= high``.
    """

    vocab: int
    dim: int
    rank: int
    family: str = "gaussian"
    eta: float = 0.1
    rho_range: Any = None
    target_var: float = 0.05 ** 2 / 3.0
    overcomplete: bool = False
    kind = "lowrank"

    def __post_init__(self):
        where = self._where()
        _check_int(self.vocab, "vocab", where)
        _check_int(self.dim, "dim", where)
        _check_int(self.rank, "rank", where)
        if self.rank > min(self.vocab, self.dim) and not self.overcomplete:
            raise ValueError(f"{where}: rank {self.rank} exceeds min(vocab, dim) = {min(self.vocab, self.dim)}")
        _check_choice(self.family, FAMILIES, "family", where)
        _check_pos(self.eta, "eta", where)
        _check_pos(self.target_var, "target_var", where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))

    @property
    def factor_scale(self) -> float:
        """``(target_var / r)^(1/4)``."""
        return (self.target_var / self.rank) ** 0.25

    def _init_impl(self, key, dtype=jnp.float32):
        """``LowRankParams(A, B, None)``."""
        dtype = _float_dtype(dtype)
        ka, kb, kra, krb = jax.random.split(key, 4)
        s = self.factor_scale
        sa, sb = (self.vocab, self.rank), (self.dim, self.rank)
        A = MeanField(jax.random.normal(ka, sa, dtype) * s, _init_rho(kra, sa, dtype, self.eta * s, self.rho_range))
        B = MeanField(jax.random.normal(kb, sb, dtype) * s, _init_rho(krb, sb, dtype, self.eta * s, self.rho_range))
        return LowRankParams(A, B, None)

    def sample(self, params, key):
        """Full ``(A, B)`` at one draw (row ``v`` of ``A`` from ``fold_in(key_A, v)``)."""
        ka, kb = jax.random.split(key)
        eps = _row_noise(ka, jnp.arange(self.vocab), (self.rank,), self.family, params.A.mu.dtype)
        return FactorWeights(_draw(params.A, eps), _sample_mf(params.B, kb, self.family), None)

    def lookup(self, params, tokens, key):
        """``A[tokens] @ B^T`` sampling only the rows of ``A`` that are looked up."""
        ka, kb = jax.random.split(key)
        eps = _row_noise(ka, tokens, (self.rank,), self.family, params.A.mu.dtype)
        rows = _draw(MeanField(jnp.take(params.A.mu, tokens, axis=0), jnp.take(params.A.rho, tokens, axis=0)), eps)
        return rows @ _sample_mf(params.B, kb, self.family).T

    def _log_ratio(self, params, weights, prior):
        return (_log_q(params.A, weights.A, self.family) - _prior_sum(prior, weights.A)
                + _log_q(params.B, weights.B, self.family) - _prior_sum(prior, weights.B))

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.A, prior) + _exact_kl_mf(params.B, prior)

    def num_params(self) -> int:
        """``2 r (V + d)``."""
        return 2 * self.rank * (self.vocab + self.dim)

    def from_deterministic(self, det_params, key):
        """SVD initialisation of the table (App. F.9)."""
        E = jnp.asarray(det_params.W)
        r = min(self.rank, min(E.shape))
        mu_a, mu_b = svd_factors(E, r)
        if r < self.rank:
            mu_a = jnp.pad(mu_a, ((0, 0), (0, self.rank - r)))
            mu_b = jnp.pad(mu_b, ((0, 0), (0, self.rank - r)))
        kra, krb = jax.random.split(key)
        s = self.factor_scale
        return LowRankParams(MeanField(mu_a, _init_rho(kra, mu_a.shape, E.dtype, self.eta * s, self.rho_range)),
                             MeanField(mu_b, _init_rho(krb, mu_b.shape, E.dtype, self.eta * s, self.rho_range)),
                             None)


@dataclasses.dataclass(frozen=True)
class Rank1Embedding(_Embedding):
    """Rank-1 multiplicative table ``E = E_bar o (s r^T)``, ``s (V,)``, ``r (d,)`` mean-field (``s`` sampled per
    looked-up row).

    ``E_bar`` is deterministic and starts ``U(-0.05, 0.05)``; ``s`` and ``r`` are initialised as in
    :class:`Rank1Dense`.

    Attributes:
        vocab: vocabulary size ``V`` (a positive integer).
        dim: embedding dimension ``d`` (a positive integer).
        family: variational family of ``s`` and ``r``, ``"gaussian"`` or ``"laplace"``.
        perturbation: half-width of the uniform perturbation of the means of ``s`` and ``r`` around 1
            (non-negative; checked by :meth:`init`).
        rho_range: ``(low, high)`` of the uniform initialisation of the ``rho`` of ``s`` and ``r``.

    Raises:
        ValueError: on construction, if a size is not a positive integer, ``family`` is unknown or
            ``rho_range`` is not a finite pair ``low <= high``.
    """

    vocab: int
    dim: int
    family: str = "gaussian"
    perturbation: float = 0.1
    rho_range: tuple = (-5.0, -4.0)
    kind = "rank1"

    def __post_init__(self):
        where = self._where()
        _check_int(self.vocab, "vocab", where)
        _check_int(self.dim, "dim", where)
        _check_choice(self.family, FAMILIES, "family", where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))

    def _init_impl(self, key, dtype=jnp.float32):
        """``Rank1Params(E_bar, s, r, None)``."""
        dtype = _float_dtype(dtype)
        kw, kv = jax.random.split(key)
        spec = Rank1Dense(self.vocab, self.dim, family=self.family, perturbation=self.perturbation,
                          rho_range=self.rho_range, bias="none")
        s, r = spec._vectors(kv, dtype)
        return Rank1Params(_det_init(kw, (self.vocab, self.dim), dtype, "uniform"), s, r, None)

    def sample(self, params, key):
        """``(E_bar, s, r)`` at one draw (``s_v`` from ``fold_in(key_s, v)``)."""
        ks, kr = jax.random.split(key)
        eps = _row_noise(ks, jnp.arange(self.vocab), (), self.family, params.W.dtype)
        return Rank1Weights(params.W, _draw(params.s, eps), _sample_mf(params.r, kr, self.family), None)

    def lookup(self, params, tokens, key):
        """``E_bar[tokens] * s[tokens] * r`` sampling only the looked-up ``s_v``."""
        ks, kr = jax.random.split(key)
        eps = _row_noise(ks, tokens, (), self.family, params.W.dtype)
        s = _draw(MeanField(jnp.take(params.s.mu, tokens), jnp.take(params.s.rho, tokens)), eps)
        r = _sample_mf(params.r, kr, self.family)
        return jnp.take(params.W, tokens, axis=0) * s[..., None] * r

    def _log_ratio(self, params, weights, prior):
        return (_log_q(params.s, weights.s, self.family) - _prior_sum(prior, weights.s)
                + _log_q(params.r, weights.r, self.family) - _prior_sum(prior, weights.r))

    def _exact_kl(self, params, prior):
        return _exact_kl_mf(params.s, prior) + _exact_kl_mf(params.r, prior)

    def num_params(self) -> int:
        """``V d + 2 (V + d)``."""
        return self.vocab * self.dim + 2 * (self.vocab + self.dim)

    def from_deterministic(self, det_params, key):
        """``E_bar = E``, means of ``s, r`` equal to 1."""
        E = jnp.asarray(det_params.W)
        ks, kr = jax.random.split(key)
        s = MeanField(jnp.ones((self.vocab,), E.dtype), _init_rho(ks, (self.vocab,), E.dtype, None, self.rho_range))
        r = MeanField(jnp.ones((self.dim,), E.dtype), _init_rho(kr, (self.dim,), E.dtype, None, self.rho_range))
        return Rank1Params(E, s, r, None)


_EMBED = {"deterministic": DeterministicEmbedding, "bbb": BBBEmbedding, "lowrank": LowRankEmbedding,
          "rank1": Rank1Embedding}


def embedding(kind: str, vocab: int, dim: int, *, rank: int | None = None, **options):
    """An embedding spec of ``kind``; ``rank`` required for ``"lowrank"``; ``options`` the class' fields.

    Args:
        kind: ``"deterministic"``, ``"bbb"``, ``"lowrank"`` or ``"rank1"``.
        vocab: vocabulary size ``V``.
        dim: embedding dimension ``d``.
        rank: the rank of a ``"lowrank"`` table (ignored by the other kinds).
        **options: further fields of the class; ``overcomplete`` and ``eta`` are dropped for the kinds other
            than ``"lowrank"``, ``target_var`` for ``"bbb"`` and ``"rank1"``, and all of them for
            ``"deterministic"``.

    Returns:
        The embedding spec: a :class:`DeterministicEmbedding`, :class:`BBBEmbedding`, :class:`LowRankEmbedding`
        or :class:`Rank1Embedding`.

    Raises:
        ValueError: if ``kind`` is unknown, ``rank`` is missing for ``"lowrank"``, or the class rejects a field
            value.
        TypeError: if an option is not a field of the class.
    """
    where = f"embedding({vocab}x{dim})"
    _check_choice(kind, KINDS, "kind", where)
    kw = dict(options)
    if kind == "lowrank":
        if rank is None:
            raise ValueError(f"{where}: rank is required for kind='lowrank'")
        return LowRankEmbedding(vocab, dim, rank, **kw)
    kw.pop("overcomplete", None)
    kw.pop("eta", None)
    if kind == "deterministic":
        return DeterministicEmbedding(vocab, dim)
    kw.pop("target_var", None)
    return _EMBED[kind](vocab, dim, **kw)


# ---------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------

_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid,
    "elu": jax.nn.elu,
    "softplus": jax.nn.softplus,
    "identity": lambda x: x,
}


def _activation(activation, where: str):
    if callable(activation):
        return activation
    if isinstance(activation, str) and activation in _ACTIVATIONS:
        return _ACTIVATIONS[activation]
    raise ValueError(f"{where}: activation must be a callable or one of {tuple(_ACTIVATIONS)}, got {activation!r}")


class _Network:
    """Shared methods of the networks: ``apply``, ``kl``, ``apply_and_kl``, ``predict``, ``num_params``.

    A network draws the noise of all its layers (but an embedding's rows) from one uniform draw with its key
    (``sample``); ``apply`` and the Monte-Carlo ``kl`` with the same key use the same draw.
    """

    def init(self, key, dtype=jnp.float32):
        """Initial parameters (a NamedTuple / dict pytree) with floating ``dtype`` (default float32), drawn with
        ``key``; one jitted program per spec and dtype."""
        return _jit_init(self, key, _float_dtype(dtype))

    def apply(self, params, x, key=None):
        """Network output at one weight draw (``key``), shared across the batch."""
        return _jit_run(self, params, _as_array(x), key, None, "mc", ())[0]

    def kl(self, params, prior=DEFAULT_PRIOR, key=None, method: str = "auto"):
        """``sum`` of the layers' ``KL(q || p)`` (same draw as ``apply`` with ``key`` when Monte Carlo)."""
        where = type(self).__name__
        prior = _check_prior(prior, where)
        _check_choice(method, _KL_METHODS, "method", where)
        for spec in self._specs():  # validate the method against every layer before tracing
            _kl_method(method, prior, getattr(spec, "family", "gaussian"), f"{where}.kl")
        if key is None and any(s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"),
                                                                         where) == "mc" for s in self._specs()):
            raise ValueError(f"{where}.kl: key must be a PRNG key for a Monte-Carlo KL, got None")
        return _dispatch_kl(self, params, prior, key, method, where)

    def _kl_impl(self, params, prior, key, method):
        return self._run_kl(params, key, prior, method)

    @staticmethod
    def _kl_from(specs, plist, flat, prior, method):
        """KL of dense specs drawn together (``flat``): the Monte-Carlo ones in one vectorised sum, the rest in
        closed form."""
        if prior is None:
            return 0.0
        mc = [s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"), "kl") == "mc"
              for s in specs]
        total = 0.0
        for s, p, m in zip(specs, plist, mc):
            if s.kind != "deterministic" and not m:
                total = total + s._exact_kl(p, prior)
        if any(mc) and flat is not None:
            noisy = [m for s, m in zip(specs, mc) if s.noise_size]
            include = None if all(noisy) else [m for m, c in zip(mc, flat.counts) for _ in range(c)]
            total = total + _flat_log_ratio(flat, prior, include)
        return total

    def apply_and_kl(self, params, x, key, prior=DEFAULT_PRIOR, method: str = "auto"):
        """``(apply(params, x, key), kl(params, prior, key, method))`` with one shared draw."""
        prior = _check_prior(prior, type(self).__name__)
        _check_choice(method, _KL_METHODS, "method", type(self).__name__)
        x = _as_array(x)
        if _hashable(prior):
            return _jit_run(self, params, x, key, prior, method, ())
        return self._run(params, x, key, prior, method)

    def predict(self, params, x, key, num_samples: int = 50, batch_size: int | None = None):
        """``S`` Monte-Carlo outputs stacked along a new leading axis (:func:`predict`)."""
        return predict(self, params, x, key, num_samples, batch_size=batch_size)

    def num_params(self) -> int:
        """Closed-form number of scalars in ``init``'s pytree (sum over the layers)."""
        return sum(s.num_params() for s in self._specs()) + self._extra_params()

    def _extra_params(self) -> int:
        return 0

    def _need_key(self, key, where: str):
        if key is None and any(s.kind != "deterministic" for s in self._specs()):
            raise ValueError(f"{where}: key must be a PRNG key for a network with Bayesian layers, got None")

    def _run_kl(self, params, key, prior, method):
        specs, plist = self._dense_specs(), self._dense_params(params)
        need = any(s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"),
                                                            "kl") == "mc" for s in specs)
        flat = _draw_specs(specs, plist, self._dense_key(key), with_flat=True)[1] if need else None
        return jnp.asarray(self._kl_from(specs, plist, flat, prior, method)) + self._extra_kl(params, key, prior,
                                                                                               method)

    def _dense_specs(self):
        return self._specs()

    def _dense_params(self, params):
        return self._param_list(params)

    def _dense_key(self, key):
        return key

    def _extra_kl(self, params, key, prior, method):
        return 0.0


@dataclasses.dataclass(frozen=True)
class MLP(_Network):
    """A multilayer perceptron of dense layer specs (any of the four kinds, mixed freely), ``activation`` after
    every layer but the last (paper Sec. 2.4). Build with :func:`mlp`. ``params`` is a tuple of layer params
    (layer ``i`` initialised with ``fold_in(key, i)``); one draw of all layers comes from one uniform draw."""

    layers: tuple
    activation: Callable = jax.nn.relu

    def __post_init__(self):
        if len(self.layers) < 1:
            raise ValueError("MLP: layers must hold at least one dense layer")
        for i, (a, b) in enumerate(zip(self.layers[:-1], self.layers[1:])):
            if a.n_out != b.n_in:
                raise ValueError(f"MLP: layer {i} outputs {a.n_out} features but layer {i + 1} takes {b.n_in}")

    @property
    def in_dim(self) -> int:
        return self.layers[0].n_in

    @property
    def out_dim(self) -> int:
        return self.layers[-1].n_out

    @property
    def kinds(self) -> tuple:
        return tuple(s.kind for s in self.layers)

    def _specs(self):
        return self.layers

    def _param_list(self, params):
        return params

    def _init_impl(self, key, dtype=jnp.float32):
        """A tuple of layer params (``fold_in(key, i)`` for layer ``i``)."""
        return tuple(s.init(jax.random.fold_in(key, i), dtype) for i, s in enumerate(self.layers))

    def sample(self, params, key):
        """A tuple of drawn layer weights (one weight sample of the whole network, one uniform draw)."""
        return tuple(_draw_specs(self.layers, params, key))

    def _weight_list(self, weights):
        return list(weights)

    def forward(self, weights, x):
        """The network at drawn ``weights``."""
        h = x
        for i, (s, w) in enumerate(zip(self.layers, weights)):
            h = s.forward(w, h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h

    def _run(self, params, x, key, prior, method):
        _check_last_dim(x, self.in_dim, "MLP.apply")
        self._need_key(key, "MLP.apply")
        if len(params) != len(self.layers):
            raise ValueError(f"MLP: params hold {len(params)} layers, the network has {len(self.layers)}")
        weights, flat = _draw_specs(self.layers, params, key, with_flat=True)
        out = self.forward(weights, x)
        return out, jnp.asarray(self._kl_from(self.layers, params, flat, prior, method), out.dtype)

    def from_deterministic(self, det_params, key):
        """Warm-start every layer from the params of the deterministic twin (same sizes): SVD for low-rank
        layers (App. F.9), ``mu = W`` for BBB, ``W_bar = W`` for rank-1."""
        if len(det_params) != len(self.layers):
            raise ValueError(f"MLP.from_deterministic: det_params hold {len(det_params)} layers, "
                             f"the network has {len(self.layers)}")
        return tuple(s.from_deterministic(p, jax.random.fold_in(key, i))
                     for i, (s, p) in enumerate(zip(self.layers, det_params)))

    def mean_weights(self, params):
        """``E[W]`` of every layer (posterior-mean matrices, e.g. for the bounds of ``lowrank_theory``)."""
        return tuple(s.mean_weight(p) for s, p in zip(self.layers, params))

    def deterministic_twin(self) -> MLP:
        """The same architecture with deterministic layers (the source of :meth:`from_deterministic`)."""
        return MLP(tuple(DeterministicDense(s.n_in, s.n_out, bias="none" if s.bias == "none" else "deterministic")
                         for s in self.layers), self.activation)


def _per_layer(value, n: int, name: str, where: str):
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{where}: {name} must be one value or one per layer ({n}), got {len(value)}")
        return tuple(value)
    return (value,) * n


def mlp(sizes: Sequence[int], kind="lowrank", *, rank=None, activation="relu", bias=None, init=None,
        family: str = "gaussian", **options) -> MLP:
    """An :class:`MLP` with layer sizes ``sizes = (d_in, h_1, ..., d_out)``.

    Args:
      sizes: the layer widths ``(d_in, h_1, ..., d_out)``, positive integers (at least two).
      kind: one of :data:`KINDS`, or one per layer (e.g. the toy model ``("bbb", "lowrank", "bbb")``).
      rank: for low-rank layers, one int or one per layer (``None`` for other kinds).
      activation: a callable or a name (``"relu"``, ``"tanh"``, ``"gelu"``, ...).
      bias: ``"bayes"``, ``"deterministic"``, ``"none"`` (one or per layer); default per kind (:func:`dense`).
      init: initialiser name (one or per layer); default per kind (low-rank: ``"he"`` after ReLU, else
        ``"glorot"``).
      family: ``"gaussian"`` or ``"laplace"`` factors.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`MLP` spec (call its ``init`` for parameters).

    Raises:
      ValueError: if ``sizes`` has fewer than two entries or a non-positive one, a per-layer sequence has the
        wrong length, a kind or the activation name is unknown, a low-rank layer has no rank, or a layer
        rejects its settings.
    """
    where = "mlp"
    sizes = tuple(sizes)
    if len(sizes) < 2:
        raise ValueError(f"{where}: sizes must hold at least input and output sizes, got {sizes!r}")
    for s in sizes:
        _check_int(s, "sizes", where)
    n = len(sizes) - 1
    kinds = _per_layer(kind, n, "kind", where)
    ranks = _per_layer(rank, n, "rank", where)
    biases = _per_layer(bias, n, "bias", where)
    inits = _per_layer(init, n, "init", where)
    act = _activation(activation, where)
    layers = []
    for i in range(n):
        k = _check_choice(kinds[i], KINDS, "kind", f"{where} layer {i}")
        r = ranks[i] if k == "lowrank" else None
        if k == "lowrank" and r is None:
            raise ValueError(f"{where}: layer {i} is low-rank but rank is None")
        ini = inits[i]
        if ini is None and k == "lowrank":
            ini = "he" if act is jax.nn.relu else "glorot"
        opts = _layer_options(_DENSE[k], dict(options, family=family))
        layers.append(dense(k, sizes[i], sizes[i + 1], rank=r, bias=biases[i], init=ini, **opts))
    return MLP(tuple(layers), act)


def _layer_options(cls, options: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in options.items() if k in names}


# ---------------------------------------------------------------------------
# LSTM
# ---------------------------------------------------------------------------


def lstm_cell(ih, hh, w_ih, w_hh, x_t, carry):
    """One LSTM step ``(h, c) -> (h', c')`` with drawn weights (gates packed ``i, f, g, o``; paper G.4.2).

    ``z = x_t W_ih + b_ih + h W_hh``; ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``; ``h' = sigmoid(o) tanh(c')``.
    ``ih``/``hh`` are the dense specs of ``x_to_gates`` / ``h_to_gates``.

    Args:
        ih: dense layer spec of ``x_to_gates`` (``d_in -> 4H``).
        hh: dense layer spec of ``h_to_gates`` (``H -> 4H``).
        w_ih: drawn weights of ``ih`` (from its ``sample``).
        w_hh: drawn weights of ``hh``.
        x_t: inputs at this time step, shape ``(batch, d_in)``.
        carry: the pair ``(h, c)`` of hidden and cell states, each ``(batch, H)``.

    Returns:
        The new pair ``(h', c')``, each of shape ``(batch, H)``.
    """
    h, c = carry
    z = ih.forward(w_ih, x_t) + hh.forward(w_hh, h)
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return h, c


@dataclasses.dataclass(frozen=True)
class LSTM(_Network):
    """Stacked LSTM with ``x_to_gates`` (``d_in -> 4H``, with bias) and ``h_to_gates`` (``H -> 4H``, no bias) of
    any kind, and a dense head on the top layer's last hidden state (paper Sec. 2.4, G.4.2). Build with
    :func:`lstm`.

    ``resample_per_step=False``: every layer's weights are drawn **once per sequence** (per forward pass, shared
    by the batch; :meth:`sample` with ``key``) outside the ``lax.scan`` and reused at every time step
    (Fortunato et al. 2017, Alg. 2; the input projection of all steps is then one matmul). ``True``: layer
    ``l`` draws fresh gate weights at step ``t`` from ``fold_in(fold_in(key, l + 1), t)`` (for the benchmark);
    the head keeps the once-per-sequence draw. The KL is that of the once-per-sequence draw in both cases (a
    single-sample estimate; with per-step resampling an independent draw). :meth:`step_weights` returns the
    weights used at a step.

    ``params = {"ih": (...), "hh": (...), "head": p}`` (component ``i`` of ``ih + hh + (head,)`` initialised
    with ``fold_in(key, i)``).
    """

    ih: tuple
    hh: tuple
    head: Any
    resample_per_step: bool = False

    def __post_init__(self):
        if len(self.ih) != len(self.hh) or len(self.ih) < 1:
            raise ValueError("LSTM: ih and hh must hold one spec per layer (at least one)")
        hidden = self.hh[0].n_in
        for l, (a, b) in enumerate(zip(self.ih, self.hh)):
            if b.n_in != hidden or b.n_out != 4 * hidden or a.n_out != 4 * hidden:
                raise ValueError(f"LSTM: layer {l} gate projections must map to 4 * hidden = {4 * hidden}")
            if l > 0 and a.n_in != hidden:
                raise ValueError(f"LSTM: layer {l} x_to_gates must take hidden = {hidden} inputs, got {a.n_in}")
        if self.head.n_in != hidden:
            raise ValueError(f"LSTM: head must take hidden = {hidden} inputs, got {self.head.n_in}")

    @property
    def hidden(self) -> int:
        return self.hh[0].n_in

    @property
    def in_dim(self) -> int:
        return self.ih[0].n_in

    @property
    def num_layers(self) -> int:
        return len(self.ih)

    def _specs(self):
        return tuple(self.ih) + tuple(self.hh) + (self.head,)

    def _init_keys(self, key):
        L = self.num_layers
        return ([jax.random.fold_in(key, l) for l in range(L)], [jax.random.fold_in(key, L + l) for l in range(L)],
                jax.random.fold_in(key, 2 * L))

    def _param_list(self, params):
        return tuple(params["ih"]) + tuple(params["hh"]) + (params["head"],)

    def _weight_list(self, weights):
        return list(weights["ih"]) + list(weights["hh"]) + [weights["head"]]

    def _init_impl(self, key, dtype=jnp.float32):
        """``{"ih", "hh", "head"}``; the forget-gate slice of every ``x_to_gates`` bias starts at 1.0."""
        kih, khh, khead = self._init_keys(key)
        H = self.hidden
        ih = []
        for l, s in enumerate(self.ih):
            p = s.init(kih[l], dtype)
            if p.b is not None:
                b = p.b
                if isinstance(b, MeanField):
                    b = MeanField(b.mu.at[H:2 * H].set(1.0), b.rho)
                else:
                    b = b.at[H:2 * H].set(1.0)
                p = p._replace(b=b)
            ih.append(p)
        hh = tuple(s.init(khh[l], dtype) for l, s in enumerate(self.hh))
        return {"ih": tuple(ih), "hh": hh, "head": self.head.init(khead, dtype)}

    def sample(self, params, key):
        """The once-per-sequence draw ``{"ih": (...), "hh": (...), "head": w}`` (one uniform draw)."""
        L = self.num_layers
        w = _draw_specs(self._specs(), self._param_list(params), key)
        return {"ih": tuple(w[:L]), "hh": tuple(w[L:2 * L]), "head": w[2 * L]}

    def _step_draw(self, l, params, key, t):
        k = jax.random.fold_in(jax.random.fold_in(key, l + 1), t)
        return _draw_specs((self.ih[l], self.hh[l]), (params["ih"][l], params["hh"][l]), k)

    def step_weights(self, params, key, t):
        """The gate weights ``{"ih": (...), "hh": (...)}`` used at time step ``t``: the once-per-sequence draw, or
        with ``resample_per_step`` layer ``l``'s draw from ``fold_in(fold_in(key, l + 1), t)``."""
        if not self.resample_per_step:
            w = self.sample(params, key)
            return {"ih": w["ih"], "hh": w["hh"]}
        draws = [self._step_draw(l, params, key, t) for l in range(self.num_layers)]
        return {"ih": tuple(d[0] for d in draws), "hh": tuple(d[1] for d in draws)}

    def _layer_scan(self, l, params, key, seq, w_ih, w_hh):
        ih, hh = self.ih[l], self.hh[l]
        T, B = seq.shape[0], seq.shape[1]
        zeros = jnp.zeros((B, self.hidden), seq.dtype)
        if not self.resample_per_step:
            xg = ih.forward(w_ih, seq)  # (T, B, 4H): one matmul for all steps, the weights being shared

            def body(carry, xg_t):
                h, c = carry
                z = xg_t + hh.forward(w_hh, h)
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            _, hs = lax.scan(body, (zeros, zeros), xg)
            return hs

        def body_rs(carry, inp):
            t, x_t = inp
            wi, wh = self._step_draw(l, params, key, t)
            carry = lstm_cell(ih, hh, wi, wh, x_t, carry)
            return carry, carry[0]

        _, hs = lax.scan(body_rs, (zeros, zeros), (jnp.arange(T), seq))
        return hs

    def _run(self, params, x, key, prior, method, return_sequence=False):
        if not hasattr(x, "ndim") or x.ndim != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"LSTM.apply: x must have shape (batch, time, {self.in_dim}), got "
                             f"{tuple(getattr(x, 'shape', ()))}")
        self._need_key(key, "LSTM.apply")
        L = self.num_layers
        specs, plist = self._specs(), self._param_list(params)
        wl, flat = _draw_specs(specs, plist, key, with_flat=True)
        w = {"ih": tuple(wl[:L]), "hh": tuple(wl[L:2 * L]), "head": wl[2 * L]}
        seq = jnp.swapaxes(x, 0, 1)  # (T, B, d)
        for l in range(L):
            seq = self._layer_scan(l, params, key, seq, w["ih"][l], w["hh"][l])
        out = self.head.forward(w["head"], seq[-1])
        kl = jnp.asarray(self._kl_from(specs, plist, flat, prior, method), out.dtype)
        if return_sequence:
            return (out, jnp.swapaxes(seq, 0, 1)), kl
        return out, kl

    def apply(self, params, x, key=None, return_sequence: bool = False):
        """Head output ``(batch, d_out)`` for ``x`` of shape ``(batch, time, d_in)``; with ``return_sequence``
        also the top layer's hidden states ``(batch, time, H)``."""
        return _jit_run(self, params, _as_array(x), key, None, "mc", (bool(return_sequence),))[0]

    def from_deterministic(self, det_params, key):
        """Warm-start from the deterministic twin's params (SVD for low-rank gate matrices, App. F.9)."""
        kih, khh, khead = self._init_keys(key)
        return {"ih": tuple(s.from_deterministic(p, k) for s, p, k in zip(self.ih, det_params["ih"], kih)),
                "hh": tuple(s.from_deterministic(p, k) for s, p, k in zip(self.hh, det_params["hh"], khh)),
                "head": self.head.from_deterministic(det_params["head"], khead)}

    def deterministic_twin(self) -> LSTM:
        """Same sizes, deterministic layers (Glorot input, orthogonal recurrent; Table 7)."""
        return LSTM(tuple(DeterministicDense(s.n_in, s.n_out) for s in self.ih),
                    tuple(DeterministicDense(s.n_in, s.n_out, bias="none", init_method="orthogonal")
                          for s in self.hh),
                    DeterministicDense(self.head.n_in, self.head.n_out,
                                       bias="none" if self.head.bias == "none" else "deterministic"))


def lstm(d_in: int, hidden: int, d_out: int = 1, num_layers: int = 2, kind: str = "lowrank", *,
         rank_ih=None, rank_hh=None, head_kind: str | None = None, head_rank: int | None = 1,
         resample_per_step: bool = False, bias: str | None = None, family: str = "gaussian",
         **options) -> LSTM:
    """An :class:`LSTM` of ``num_layers`` layers of width ``hidden`` and a dense head ``hidden -> d_out``.

    Args:
      d_in: number of input features per time step.
      hidden: hidden width ``H`` of every layer.
      d_out: number of outputs of the head.
      num_layers: number of stacked LSTM layers.
      kind: kind of every gate projection.
      rank_ih: rank of the input-to-gates projections when ``kind="lowrank"``, an int or one per layer (the
        paper's Beijing model: 14).
      rank_hh: rank of the hidden-to-gates projections when ``kind="lowrank"``, an int or one per layer (the
        paper's Beijing model: 20).
      head_kind: the head's kind (default ``kind``).
      head_rank: the head's rank when ``head_kind`` is ``"lowrank"`` (default 1, "low-rank output head uses
        rank = 1", Table 7).
      bias: bias kind of ``x_to_gates`` and the head (``h_to_gates`` has none); default per kind.
      resample_per_step: see :class:`LSTM`.
      family: ``"gaussian"`` or ``"laplace"`` for the stochastic layers.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`LSTM` spec. Gate projections are Glorot-initialised (orthogonal recurrent matrices for the
      deterministic kind); ``"bbb"`` layers keep their class default.

    Raises:
      ValueError: if a size is not a positive integer, a kind is unknown, ``kind="lowrank"`` lacks
        ``rank_ih`` or ``rank_hh``, a per-layer rank sequence has the wrong length, or a layer rejects its
        settings.
    """
    where = "lstm"
    d_in = _check_int(d_in, "d_in", where)
    hidden = _check_int(hidden, "hidden", where)
    d_out = _check_int(d_out, "d_out", where)
    num_layers = _check_int(num_layers, "num_layers", where)
    _check_choice(kind, KINDS, "kind", where)
    head_kind = kind if head_kind is None else head_kind
    _check_choice(head_kind, KINDS, "head_kind", where)
    r_ih = _per_layer(rank_ih, num_layers, "rank_ih", where)
    r_hh = _per_layer(rank_hh, num_layers, "rank_hh", where)
    ih, hh = [], []
    for l in range(num_layers):
        n_in = d_in if l == 0 else hidden
        if kind == "lowrank" and (r_ih[l] is None or r_hh[l] is None):
            raise ValueError(f"{where}: rank_ih and rank_hh are required for kind='lowrank'")
        r1, r2 = (r_ih[l], r_hh[l]) if kind == "lowrank" else (None, None)
        opts = _layer_options(_DENSE[kind], dict(options, family=family))
        init_ih = "glorot" if kind in ("deterministic", "lowrank", "rank1") else None
        init_hh = "orthogonal" if kind == "deterministic" else init_ih
        ih.append(dense(kind, n_in, 4 * hidden, rank=r1, bias=bias, init=init_ih, **opts))
        hh.append(dense(kind, hidden, 4 * hidden, rank=r2, bias="none", init=init_hh, **opts))
    hopts = _layer_options(_DENSE[head_kind], dict(options, family=family))
    head = dense(head_kind, hidden, d_out, rank=head_rank if head_kind == "lowrank" else None, bias=bias,
                 init="glorot" if head_kind in ("deterministic", "lowrank", "rank1") else None, **hopts)
    return LSTM(tuple(ih), tuple(hh), head, bool(resample_per_step))


# ---------------------------------------------------------------------------
# Transformer encoder
# ---------------------------------------------------------------------------


def _layer_norm(x, scale, bias, eps: float):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def sinusoidal_positions(length: int, dim: int, dtype=jnp.float32):
    """Fixed sinusoidal positional encodings ``(length, dim)`` (Vaswani et al. 2017); no parameters."""
    pos = np.arange(length)[:, None]
    i = np.arange(dim)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / dim)
    return jnp.asarray(np.where(i % 2 == 0, np.sin(angle), np.cos(angle)), dtype)


@dataclasses.dataclass(frozen=True)
class EncoderBlock:
    """One pre-norm encoder block: ``h = x + O(MHA(LN1(x)))``, ``h = h + FF2(act(FF1(LN2(h))))``.

    ``q, k, v, o`` (``d -> d``) and ``ff1`` (``d -> d_ff``), ``ff2`` (``d_ff -> d``) are dense specs of any kind;
    the LayerNorms are deterministic (``2 d`` parameters each).

    Attributes:
        q: dense spec of the query projection (``d -> d``).
        k: dense spec of the key projection (``d -> d``).
        v: dense spec of the value projection (``d -> d``).
        o: dense spec of the attention output projection (``d -> d``).
        ff1: dense spec of the first feed-forward layer (``d -> d_ff``).
        ff2: dense spec of the second feed-forward layer (``d_ff -> d``).
        num_heads: number of attention heads (must divide ``d``; checked by :class:`Transformer`).
        activation: the feed-forward activation, a callable (GELU by default).
    """

    q: Any
    k: Any
    v: Any
    o: Any
    ff1: Any
    ff2: Any
    num_heads: int
    activation: Callable = jax.nn.gelu

    NAMES = ("q", "k", "v", "o", "ff1", "ff2")

    @property
    def d_model(self) -> int:
        return self.q.n_in

    def specs(self):
        return tuple(getattr(self, n) for n in self.NAMES)


@dataclasses.dataclass(frozen=True)
class Transformer(_Network):
    """Pre-norm Transformer encoder classifier (paper Sec. 2.4, 4.4, G.5.2): embedding (+ fixed sinusoidal
    positions, or none), ``num_layers`` :class:`EncoderBlock`, CLS pooling (position 0), dense head. Build with
    :func:`transformer`.

    ``apply(params, tokens, key)`` takes integer ``tokens (batch, length)``; positions equal to ``pad_id`` are
    masked out as attention keys (``None``: no masking). ``encode`` returns the hidden states before pooling.
    Draws: the embedding's rows with ``fold_in(key, 0)`` (only the looked-up rows, :class:`LowRankEmbedding`),
    every other layer from one uniform draw with ``fold_in(key, 1)``.

    Attributes:
        embed: the embedding spec (any of the four embedding kinds), ``vocab x d_model``.
        blocks: tuple of :class:`EncoderBlock`, each of width ``d_model``.
        head: dense spec of the classifier head (``d_model -> num_classes``).
        max_len: the longest token sequence ``apply`` accepts.
        positional: ``"sinusoidal"`` (fixed encodings added to the embeddings) or ``"none"``.
        pad_id: token id masked out as attention key, or ``None``.
        ln_eps: the epsilon of every LayerNorm.

    Raises:
        ValueError: on construction, if ``positional`` is unknown, a block's width differs from the embedding's,
            ``d_model`` is not divisible by a block's ``num_heads``, or the head does not take ``d_model`` inputs.
    """

    embed: Any
    blocks: tuple
    head: Any
    max_len: int = 64
    positional: str = "sinusoidal"
    pad_id: int | None = None
    ln_eps: float = 1e-6

    def __post_init__(self):
        d = self.embed.dim
        _check_choice(self.positional, ("sinusoidal", "none"), "positional", "Transformer")
        for i, b in enumerate(self.blocks):
            if b.d_model != d:
                raise ValueError(f"Transformer: block {i} has d_model {b.d_model}, the embedding {d}")
            if d % b.num_heads:
                raise ValueError(f"Transformer: d_model {d} is not divisible by num_heads {b.num_heads}")
        if self.head.n_in != d:
            raise ValueError(f"Transformer: head must take d_model = {d} inputs, got {self.head.n_in}")

    @property
    def d_model(self) -> int:
        return self.embed.dim

    def _specs(self):
        out = [self.embed]
        for b in self.blocks:
            out.extend(b.specs())
        out.append(self.head)
        return tuple(out)

    def _keys(self, key):
        n = len(self._specs())
        return [jax.random.fold_in(key, i) for i in range(n)]

    def _draw_keys(self, key):
        return (None, None) if key is None else (jax.random.fold_in(key, 0), jax.random.fold_in(key, 1))

    def sample(self, params, key):
        """One draw ``{"embed": full-table draw, "blocks": ({"q": w, ...}, ...), "head": w}`` (the table's rows equal
        what ``apply`` looks up with the same key)."""
        k_emb, k_rest = self._draw_keys(key)
        rest = self._draw_rest(params, k_rest)
        return {"embed": self.embed.sample(params["embed"], k_emb), "blocks": rest[0], "head": rest[1]}

    def _dense_specs(self):
        return tuple(s for b in self.blocks for s in b.specs()) + (self.head,)

    def _dense_params(self, params):
        return [bp[n] for bp in params["blocks"] for n in EncoderBlock.NAMES] + [params["head"]]

    def _dense_key(self, key):
        return self._draw_keys(key)[1]

    def _extra_kl(self, params, key, prior, method):
        if prior is None or self.embed.kind == "deterministic":
            return 0.0
        return self.embed._kl_impl(params["embed"], prior, self._draw_keys(key)[0], method)

    def _draw_rest(self, params, key, with_flat=False):
        w, flat = _draw_specs(self._dense_specs(), self._dense_params(params), key, with_flat=True)
        blocks = tuple(dict(zip(EncoderBlock.NAMES, w[6 * i:6 * i + 6])) for i in range(len(self.blocks)))
        return (blocks, w[-1], flat) if with_flat else (blocks, w[-1])

    def _weight_list(self, weights):
        out = [weights["embed"]]
        for bw in weights["blocks"]:
            out.extend(bw[n] for n in EncoderBlock.NAMES)
        out.append(weights["head"])
        return out

    def _param_list(self, params):
        out = [params["embed"]]
        for bp in params["blocks"]:
            out.extend(bp[n] for n in EncoderBlock.NAMES)
        out.append(params["head"])
        return tuple(out)

    def _extra_params(self) -> int:
        return 4 * self.d_model * len(self.blocks)  # two LayerNorms (scale, bias) per block

    def _init_impl(self, key, dtype=jnp.float32):
        """``{"embed", "blocks": ({"q", ..., "ff2", "ln1", "ln2"}, ...), "head"}``."""
        dtype = _float_dtype(dtype)
        keys = self._keys(key)
        d = self.d_model
        blocks, j = [], 1
        for b in self.blocks:
            bp = {}
            for n, s in zip(EncoderBlock.NAMES, b.specs()):
                bp[n] = s.init(keys[j], dtype)
                j += 1
            bp["ln1"] = (jnp.ones((d,), dtype), jnp.zeros((d,), dtype))
            bp["ln2"] = (jnp.ones((d,), dtype), jnp.zeros((d,), dtype))
            blocks.append(bp)
        return {"embed": self.embed.init(keys[0], dtype), "blocks": tuple(blocks),
                "head": self.head.init(keys[-1], dtype)}

    def _attention(self, block, w, x, mask):
        B, L, d = x.shape
        H = block.num_heads
        q = block.q.forward(w["q"], x).reshape(B, L, H, d // H)
        k = block.k.forward(w["k"], x).reshape(B, L, H, d // H)
        v = block.v.forward(w["v"], x).reshape(B, L, H, d // H)
        scores = jnp.einsum("blhd,bmhd->bhlm", q, k) / jnp.sqrt(jnp.asarray(d // H, x.dtype))
        if mask is not None:
            scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
        attn = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhlm,bmhd->blhd", attn, v).reshape(B, L, d)
        return block.o.forward(w["o"], out)

    def _encode(self, params, tokens, key, prior, method):
        _check_tokens(tokens, self.embed.vocab, "Transformer.apply")
        if tokens.ndim != 2:
            raise ValueError(f"Transformer.apply: tokens must have shape (batch, length), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"Transformer.apply: tokens have length {tokens.shape[1]} > max_len {self.max_len}")
        self._need_key(key, "Transformer.apply")
        k_emb, k_rest = self._draw_keys(key)
        dtype = jax.tree.leaves(params["head"])[0].dtype
        x = self.embed.lookup(params["embed"], tokens, k_emb).astype(dtype)
        wblocks, whead, flat = self._draw_rest(params, k_rest, with_flat=True)
        kl = jnp.asarray(self._kl_from(self._dense_specs(), self._dense_params(params), flat, prior, method)
                         + self._extra_kl(params, key, prior, method), dtype)
        if self.positional == "sinusoidal":
            x = x + sinusoidal_positions(tokens.shape[1], self.d_model, dtype)[None]
        mask = None if self.pad_id is None else tokens != self.pad_id
        for b, bp, w in zip(self.blocks, params["blocks"], wblocks):
            x = x + self._attention(b, w, _layer_norm(x, *bp["ln1"], self.ln_eps), mask)
            h = _layer_norm(x, *bp["ln2"], self.ln_eps)
            x = x + b.ff2.forward(w["ff2"], b.activation(b.ff1.forward(w["ff1"], h)))
        return x, kl, whead

    def encode(self, params, tokens, key=None):
        """Hidden states ``(batch, length, d_model)`` before pooling (permutation-equivariant in the positions
        when ``positional="none"`` and ``pad_id=None``)."""
        return _jit_encode(self, params, _as_array(tokens), key)

    def _run(self, params, tokens, key, prior, method):
        x, kl, wh = self._encode(params, tokens, key, prior, method)
        return self.head.forward(wh, x[:, 0]), kl  # CLS pooling

    def from_deterministic(self, det_params, key):
        """Warm start from the deterministic twin (SVD init of every low-rank matrix and the embedding, App. F.9;
        LayerNorms copied)."""
        keys = self._keys(key)
        blocks, j = [], 1
        for b, dbp in zip(self.blocks, det_params["blocks"]):
            bp = {}
            for n, s in zip(EncoderBlock.NAMES, b.specs()):
                bp[n] = s.from_deterministic(dbp[n], keys[j])
                j += 1
            bp["ln1"], bp["ln2"] = dbp["ln1"], dbp["ln2"]
            blocks.append(bp)
        return {"embed": self.embed.from_deterministic(det_params["embed"], keys[0]), "blocks": tuple(blocks),
                "head": self.head.from_deterministic(det_params["head"], keys[-1])}

    def deterministic_twin(self) -> Transformer:
        """Same sizes, deterministic layers and embedding."""
        def det(s):
            return DeterministicDense(s.n_in, s.n_out, bias="none" if s.bias == "none" else "deterministic")

        blocks = tuple(EncoderBlock(*(det(s) for s in b.specs()), num_heads=b.num_heads, activation=b.activation)
                       for b in self.blocks)
        return Transformer(DeterministicEmbedding(self.embed.vocab, self.embed.dim), blocks, det(self.head),
                           self.max_len, self.positional, self.pad_id, self.ln_eps)


def transformer(vocab_size: int = 30522, d_model: int = 256, num_layers: int = 4, num_heads: int = 4,
                d_ff: int = 512, max_len: int = 64, num_classes: int = 2, kind: str = "lowrank", *,
                rank: int | None = 16, embed_rank: int | None = None, embed_kind: str | None = None,
                head_kind: str | None = None, head_rank: int | None = None, bias: str | None = None,
                activation="gelu", positional: str = "sinusoidal", pad_id: int | None = None,
                overcomplete: bool = False, family: str = "gaussian", **options) -> Transformer:
    """A :class:`Transformer`; defaults are the paper's SST-2 encoder (Sec. 4.4, G.5.2: ``d_model = 256``, 4
    layers, 4 heads, ``d_ff = 512``, length 64, 2 classes, rank 16, BERT vocabulary 30,522).

    Args:
      vocab_size: vocabulary size of the embedding.
      d_model: model width (embedding dimension).
      num_layers: number of encoder blocks.
      num_heads: attention heads per block (must divide ``d_model``).
      d_ff: hidden width of the feed-forward layers.
      max_len: the longest token sequence accepted.
      num_classes: outputs of the head.
      kind: kind of Q, K, V, O, FF1, FF2 (and by default of the embedding and the head).
      rank: their rank when low-rank.
      embed_rank: the embedding's rank when low-rank (default ``rank``; Table 8 prints ``r_e = 10`` but its
        1.47M count needs 16, notes 4.7).
      embed_kind: override the embedding's kind (default ``kind``).
      head_kind: override the head's kind (default ``kind``).
      head_rank: the head's rank when low-rank (default ``min(rank, d_model, num_classes)``; the 1.47M count
        needs 16, i.e. ``overcomplete=True``).
      bias: bias kind of all dense layers (default per kind; Table 8: Bayesian ``b: mu = 0, rho = -5`` for the
        low-rank model).
      activation: FFN activation (the paper leaves it open; GELU by default).
      positional: ``"sinusoidal"`` (parameter-free) or ``"none"``.
      pad_id: token id masked as attention key (``None``: no masking).
      overcomplete: allow low-rank matrices whose rank exceeds their smaller dimension.
      family: ``"gaussian"`` or ``"laplace"`` for the stochastic layers.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`Transformer` spec.

    Raises:
      ValueError: if a size is not a positive integer, ``d_model`` is not divisible by ``num_heads``, a kind or
        the activation name is unknown, ``rank`` is ``None`` while a layer is low-rank, or a layer rejects its
        settings (e.g. a rank above a matrix's smaller dimension without ``overcomplete``).
    """
    where = "transformer"
    for name, v in (("vocab_size", vocab_size), ("d_model", d_model), ("num_layers", num_layers),
                    ("num_heads", num_heads), ("d_ff", d_ff), ("max_len", max_len), ("num_classes", num_classes)):
        _check_int(v, name, where)
    if d_model % num_heads:
        raise ValueError(f"{where}: d_model {d_model} must be divisible by num_heads {num_heads}")
    _check_choice(kind, KINDS, "kind", where)
    embed_kind = kind if embed_kind is None else _check_choice(embed_kind, KINDS, "embed_kind", where)
    head_kind = kind if head_kind is None else _check_choice(head_kind, KINDS, "head_kind", where)
    act = _activation(activation, where)
    if "lowrank" in (kind, embed_kind, head_kind) and rank is None:
        raise ValueError(f"{where}: rank is required for low-rank layers")
    r = rank if kind == "lowrank" else None
    opts = _layer_options(_DENSE[kind], dict(options, family=family, overcomplete=overcomplete))

    def lin(n_in, n_out):
        return dense(kind, n_in, n_out, rank=r, bias=bias, **opts)

    blocks = tuple(EncoderBlock(lin(d_model, d_model), lin(d_model, d_model), lin(d_model, d_model),
                                lin(d_model, d_model), lin(d_model, d_ff), lin(d_ff, d_model), num_heads, act)
                   for _ in range(num_layers))
    e_rank = (rank if embed_rank is None else embed_rank) if embed_kind == "lowrank" else None
    eopts = {k: v for k, v in dict(options, family=family, overcomplete=overcomplete).items()
             if k in {f.name for f in dataclasses.fields(_EMBED[embed_kind])}}
    emb = embedding(embed_kind, vocab_size, d_model, rank=e_rank, **eopts)
    h_rank = None
    if head_kind == "lowrank":
        h_rank = min(rank, d_model, num_classes) if head_rank is None else head_rank
    hopts = _layer_options(_DENSE[head_kind], dict(options, family=family, overcomplete=overcomplete))
    head = dense(head_kind, d_model, num_classes, rank=h_rank, bias=bias, **hopts)
    return Transformer(emb, blocks, head, int(max_len), positional, pad_id)


# ---------------------------------------------------------------------------
# The paper's models (parameter counts)
# ---------------------------------------------------------------------------


def paper_model(name: str, method: str):
    """The architecture behind a parameter count of the paper (notes section 4.7), as a network spec.

    ``name``/``method`` and the count ``num_params()`` gives (paper's printed value):

    * ``"toy"`` (1-100-100-1 tanh, Bayesian biases; Table 20, Fig. 20): ``"bbb"`` 20,802; ``"lowrank"`` (only
      the hidden 100x100 layer rank 16, input and output layers full-rank BBB) 7,202.
    * ``"mnist"`` (784-1200-1200-10 ReLU, deterministic biases; Table 14): ``"bbb"`` 4,788,010; ``"lowrank"``
      (hidden ranks 25, output rank 10; also the Laplace variant) 245,810; ``"rank1"`` (deterministic
      ``W_bar`` and biases, ``(mu, rho)`` for ``s, r`` of every layer) 2,406,398; ``"deterministic"`` 2,395,210.
    * ``"mimic"`` (44-128-128-1 ReLU; Table 1): ``"deterministic"`` 22,401 (22.4k; the deep ensemble is 5x,
      112k); ``"bbb"`` (Bayesian biases) 44,802 (44.8k); ``"lowrank"`` (r = 15, 15, output rank 1, Bayesian
      biases) 13,612 (13.6k); ``"rank1"`` (rank-1 on the two hidden layers, deterministic output) 23,257 (23.3k).
    * ``"sst2"`` (the encoder of :func:`transformer`; Table 8; no learned positions, no final LayerNorm,
      deterministic LayerNorms): ``"deterministic"`` 9,922,562 (9.92M; DE 5x = 49.61M); ``"bbb"`` (Bayesian
      weights, biases and embedding) 19,841,028 (19.84M); ``"lowrank"`` (rank 16 on Q, K, V, O, FFN, the
      embedding **and** the 256x2 head, Bayesian biases) 1,470,340 (1.47M); ``"rank1"`` (deterministic
      ``W_bar`` and biases, ``s, r`` on every matrix incl. embedding and head) 10,013,306 (10.01M). Table 8's
      ``r_e = 10`` would give 1.10M and Bayesian rank-1 biases 10.02M, so these are the configurations that
      reproduce the printed numbers.

    Args:
        name: ``"toy"``, ``"mnist"``, ``"mimic"`` or ``"sst2"``.
        method: one of :data:`KINDS` (the toy regression has only ``"bbb"`` and ``"lowrank"``).

    Returns:
        The network spec: an :class:`MLP` for ``"toy"``, ``"mnist"`` and ``"mimic"``, a :class:`Transformer`
        for ``"sst2"``.

    Raises:
        ValueError: if ``name`` or ``method`` is unknown, or ``name="toy"`` with a method it does not have.
    """
    where = "paper_model"
    _check_choice(name, ("toy", "mnist", "mimic", "sst2"), "name", where)
    _check_choice(method, KINDS, "method", where)
    if name == "toy":
        if method == "bbb":
            return mlp((1, 100, 100, 1), "bbb", activation="tanh", bias="bayes")
        if method == "lowrank":
            return mlp((1, 100, 100, 1), ("bbb", "lowrank", "bbb"), rank=(None, 16, None), activation="tanh",
                       bias="bayes")
        raise ValueError(f"{where}: the toy regression has methods 'bbb' and 'lowrank', got {method!r}")
    if name == "mnist":
        if method == "lowrank":
            return mlp((784, 1200, 1200, 10), "lowrank", rank=(25, 25, 10), bias="deterministic")
        return mlp((784, 1200, 1200, 10), method, bias="deterministic")
    if name == "mimic":
        sizes = (44, 128, 128, 1)
        if method == "deterministic":
            return mlp(sizes, "deterministic")
        if method == "bbb":
            return mlp(sizes, "bbb", bias="bayes")
        if method == "lowrank":
            return mlp(sizes, "lowrank", rank=(15, 15, 1), bias="bayes")
        return mlp(sizes, ("rank1", "rank1", "deterministic"), bias="deterministic")
    if method == "deterministic":
        return transformer(kind="deterministic")
    if method == "bbb":
        return transformer(kind="bbb", bias="bayes")
    if method == "lowrank":
        return transformer(kind="lowrank", rank=16, embed_rank=16, head_rank=16, overcomplete=True, bias="bayes")
    return transformer(kind="rank1", bias="deterministic")


# ---------------------------------------------------------------------------
# Training and prediction
# ---------------------------------------------------------------------------


class FitResult(NamedTuple):
    """What :func:`fit` / :func:`fit_ensemble` return.

    ``params``: trained network params (a leading member axis for ensembles); ``noise_std``: the Gaussian
    likelihood's noise standard deviation (learned or fixed; ``None`` for classification); ``history``: dict of
    per-epoch arrays ``loss``, ``nll``, ``kl`` (per-datum ELBO pieces averaged over the epoch's minibatches;
    shape ``(epochs,)`` or ``(epochs, K)``) and ``beta`` (the KL weight used); ``opt_state``: to continue.
    """

    params: Any
    noise_std: Any
    history: dict
    opt_state: Any


def linear_warmup(warmup_epochs: int = 0, delay_epochs: int = 0) -> Callable[[int], float]:
    """KL-weight multiplier ``epoch -> clip((epoch - delay) / warmup, 0, 1)`` (0 during the delay).

    The MNIST protocol ramps 0 -> 1/N over 20 epochs (``linear_warmup(20)``, App. I.1); SST-2 has 2 zero-KL
    epochs then reaches full KL by epoch 4 (``linear_warmup(2, 2)``, G.5.2); the toy ramps over 760 of 800 epochs.
    ``warmup_epochs = 0``: a step from 0 to 1 at ``delay``.

    Args:
        warmup_epochs: number of epochs of the linear ramp from 0 to 1 (a non-negative integer).
        delay_epochs: number of initial epochs with multiplier 0 (the ``delay``; a non-negative integer).

    Returns:
        The schedule, a function of the (0-based) epoch index returning a float in ``[0, 1]``.

    Raises:
        ValueError: if either argument is not a non-negative integer.
    """
    w = _check_int(warmup_epochs, "warmup_epochs", "linear_warmup", 0)
    d = _check_int(delay_epochs, "delay_epochs", "linear_warmup", 0)

    def schedule(epoch: int) -> float:
        if w == 0:
            return 0.0 if epoch < d else 1.0
        return float(min(1.0, max(0.0, (epoch - d) / w)))

    return schedule


_LIKELIHOODS = ("gaussian", "categorical")


def _nll(likelihood: str, out, y, log_noise):
    if likelihood == "categorical":
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()
    var = jnp.exp(2.0 * log_noise)
    return jnp.mean(0.5 * jnp.log(2.0 * jnp.pi * var) + 0.5 * jnp.square(y - out) / var)


def _prepare_xy(model, x, y, likelihood: str, where: str):
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    y = np.asarray(y) if not hasattr(y, "shape") else y
    n = x.shape[0]
    if y.shape[0] != n:
        raise ValueError(f"{where}: x and y must have the same number of rows, got {n} and {y.shape[0]}")
    if likelihood == "categorical":
        if not jnp.issubdtype(y.dtype, jnp.integer):
            raise ValueError(f"{where}: y must hold integer class labels for the categorical likelihood")
        y = jnp.asarray(y).reshape(n)
    else:
        y = jnp.asarray(y)
        if y.ndim == 1:
            y = y[:, None]
    return jnp.asarray(x), y, n


def _make_epoch(model, optimizer, likelihood, learn_noise, prior, kl_method, batch_size, steps, num_data):
    def loss_fn(state, xb, yb, key, beta):
        params, log_noise = state
        if prior is None:
            out, kl = model.apply(params, xb, key), 0.0
        else:
            out, kl = model.apply_and_kl(params, xb, key, prior, kl_method)
        ln = log_noise if learn_noise else lax.stop_gradient(log_noise)
        nll = _nll(likelihood, out, yb, ln)
        kl_pd = kl / num_data
        return nll + beta * kl_pd, (nll, kl_pd)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def epoch(state, opt_state, key, beta, x, y):
        kperm, kstep = jax.random.split(key)
        idx = jax.random.permutation(kperm, x.shape[0])[: steps * batch_size].reshape(steps, batch_size)

        def body(carry, inp):
            st, os = carry
            t, ib = inp
            (loss, (nll, kl)), g = grad_fn(st, x[ib], y[ib], jax.random.fold_in(kstep, t), beta)
            updates, os = optimizer.update(g, os, st)
            return (optax.apply_updates(st, updates), os), jnp.stack([loss, nll, kl])

        (state, opt_state), stats = lax.scan(body, (state, opt_state), (jnp.arange(steps), idx))
        return state, opt_state, stats.mean(axis=0)

    return epoch


def _compiled_epoch(model, optimizer, likelihood, learn_noise, prior, kl_method, bs, steps, num_data, members):
    """The jitted epoch, cached on its (hashable) settings, so that training continued call by call (early
    stopping, epoch-wise checkpoints) compiles once; pass the same ``optimizer`` object to every call. Unhashable
    settings (e.g. a prior holding arrays) fall back to a fresh compilation."""
    try:
        return _compiled_epoch_cached(model, optimizer, likelihood, learn_noise, prior, kl_method, bs, steps,
                                      num_data, members)
    except TypeError:  # unhashable
        return _build_epoch(model, optimizer, likelihood, learn_noise, prior, kl_method, bs, steps, num_data,
                            members)


def _build_epoch(model, optimizer, likelihood, learn_noise, prior, kl_method, bs, steps, num_data, members):
    one = _make_epoch(model, optimizer, likelihood, learn_noise, prior, kl_method, bs, steps, num_data)
    return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None, None, None)) if members else one)


_compiled_epoch_cached = functools.lru_cache(maxsize=16)(_build_epoch)


def _fit_setup(model, x, y, likelihood, num_epochs, batch_size, learning_rate, optimizer, kl_weight,
               warmup_epochs, warmup_delay, kl_schedule, num_data, noise_std, where):
    if not isinstance(model, _Network):
        raise ValueError(f"{where}: model must be an MLP, LSTM or Transformer spec, got {type(model).__name__}")
    _check_choice(likelihood, _LIKELIHOODS, "likelihood", where)
    num_epochs = _check_int(num_epochs, "num_epochs", where, 0)
    batch_size = _check_int(batch_size, "batch_size", where)
    x, y, n = _prepare_xy(model, x, y, likelihood, where)
    bs = min(batch_size, n)
    steps = n // bs  # the remainder is dropped each epoch; reshuffling covers every row across epochs
    if optimizer is None:
        optimizer = optax.adam(_check_pos(learning_rate, "learning_rate", where))
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"{where}: optimizer must be an optax.GradientTransformation")
    kl_weight = float(kl_weight)
    if not (math.isfinite(kl_weight) and kl_weight >= 0):
        raise ValueError(f"{where}: kl_weight must be >= 0, got {kl_weight!r}")
    schedule = kl_schedule if kl_schedule is not None else linear_warmup(warmup_epochs, warmup_delay)
    if not callable(schedule):
        raise ValueError(f"{where}: kl_schedule must be callable epoch -> multiplier")
    num_data = n if num_data is None else _check_pos(num_data, "num_data", where)
    if likelihood == "gaussian":
        noise_std = _check_pos(noise_std, "noise_std", where)
    return x, y, n, bs, steps, optimizer, kl_weight, schedule, num_data, noise_std


def fit(model, params, x, y, key, *, likelihood: str = "gaussian", num_epochs: int = 10, batch_size: int = 128,
        learning_rate: float = 1e-3, optimizer: optax.GradientTransformation | None = None,
        prior=DEFAULT_PRIOR, kl_weight: float = 1.0, warmup_epochs: int = 0, warmup_delay: int = 0,
        kl_schedule: Callable[[int], float] | None = None, kl_method: str = "auto", num_data: float | None = None,
        noise_std: float = 1.0, learn_noise: bool = False, opt_state=None, progress: bool = False) -> FitResult:
    """Train ``model`` by minimising the per-datum negative ELBO with optax (paper Eq. 1, App. I.1):

        loss = (1/B) sum_batch -log p(y | f_W(x)) + beta_e * KL(q || p) / N,   W ~ q (one draw per step),

    ``beta_e = kl_weight * schedule(epoch)``, ``N = num_data`` (default ``len(x)``). The paper's MNIST
    ``kl_scale = 1/N_train`` ramped over 20 epochs is ``kl_weight=1, warmup_epochs=20``; the toy's ``beta =
    1e-4 / N`` over 760 epochs is ``kl_weight=1e-4, warmup_epochs=760``.

    Args:
      model: a network spec (:class:`MLP`, :class:`LSTM` or :class:`Transformer`).
      params: its params (e.g. ``model.init(key)``).
      x: training inputs, first axis the ``n`` data points (device arrays are reused).
      y: training targets (device arrays are reused): integer labels ``(n,)`` for ``likelihood="categorical"``,
        real targets of shape ``(n,)`` or ``(n, d_out)`` for ``"gaussian"``.
      key: PRNG key; epoch ``e`` uses ``fold_in(key, e)`` (shuffling and the per-step weight draws).
      likelihood: ``"gaussian"`` (noise ``noise_std``, learned when ``learn_noise``) or ``"categorical"``.
      num_epochs: number of epochs (a non-negative integer).
      batch_size: minibatch size; ``len(x) // batch_size`` minibatches per epoch (remainder dropped,
        reshuffled).
      learning_rate: Adam step size, used when ``optimizer`` is ``None``.
      optimizer: any optax transformation (default ``optax.adam(learning_rate)``).
      prior: prior of the stochastic parameters (``None``: no KL term, e.g. deterministic networks).
      kl_weight: the non-negative KL weight (multiplied by the schedule).
      warmup_epochs: ramp length of the default :func:`linear_warmup` schedule.
      warmup_delay: delay of the default :func:`linear_warmup` schedule.
      kl_schedule: a callable ``epoch -> multiplier`` replacing the warm-up schedule.
      kl_method: ``"auto"``, ``"mc"`` or ``"exact"`` (see the layers' ``kl``).
      num_data: the ``N`` dividing the KL (default ``len(x)``).
      noise_std: Gaussian noise standard deviation (the starting value when ``learn_noise``).
      learn_noise: learn the noise standard deviation.
      opt_state: optimiser state to continue from; ``None`` initialises it.
      progress: show a tqdm bar over epochs.

    Returns: :class:`FitResult` (``params``, ``noise_std``, ``history``, ``opt_state``). The epoch is one jitted
    ``lax.scan`` over its minibatches.
    """
    where = "fit"
    x, y, n, bs, steps, optimizer, kl_weight, schedule, num_data, noise_std = _fit_setup(
        model, x, y, likelihood, num_epochs, batch_size, learning_rate, optimizer, kl_weight, warmup_epochs,
        warmup_delay, kl_schedule, num_data, noise_std, where)
    dtype = jax.tree.leaves(params)[0].dtype
    log_noise = jnp.asarray(math.log(noise_std) if likelihood == "gaussian" else 0.0, dtype)
    state = (params, log_noise)
    if opt_state is None:
        opt_state = optimizer.init(state)
    epoch = _compiled_epoch(model, optimizer, likelihood, bool(learn_noise), prior, kl_method, bs, steps, num_data,
                            False)
    hist = {"loss": [], "nll": [], "kl": [], "beta": []}
    from tqdm.auto import tqdm

    bar = tqdm(range(num_epochs), desc=f"fit {type(model).__name__}", unit="epoch", disable=not progress,
               leave=False)
    for e in bar:
        beta = kl_weight * float(schedule(e))
        state, opt_state, stats = epoch(state, opt_state, jax.random.fold_in(key, e), jnp.asarray(beta, dtype), x, y)
        stats = np.asarray(stats)
        if not np.all(np.isfinite(stats)):
            raise FloatingPointError(f"fit: non-finite loss at epoch {e} (loss, nll, kl/N = {stats.tolist()})")
        for name, v in zip(("loss", "nll", "kl"), stats):
            hist[name].append(float(v))
        hist["beta"].append(beta)
        if progress:
            bar.set_postfix(loss=f"{stats[0]:.4g}")
    history = {k: np.asarray(v) for k, v in hist.items()}
    noise = float(np.exp(np.asarray(state[1]))) if likelihood == "gaussian" else None
    return FitResult(state[0], noise, history, opt_state)


def init_ensemble(model, key, num_members: int = 5, dtype=jnp.float32):
    """``K`` independently initialised members (``init`` under ``vmap`` over ``split(key, K)``); every leaf gets
    a leading member axis.

    Args:
        model: a network spec (:class:`MLP`, :class:`LSTM` or :class:`Transformer`).
        key: PRNG key, split into one key per member.
        num_members: number of members ``K`` (a positive integer).
        dtype: floating dtype of the parameters.

    Returns:
        The members' parameter pytree, each leaf with a leading axis of length ``K``.

    Raises:
        ValueError: if ``num_members`` is not a positive integer.
    """
    k = _check_int(num_members, "num_members", "init_ensemble")
    return jax.vmap(lambda kk: model.init(kk, dtype))(jax.random.split(key, k))


def fit_ensemble(model, x, y, key, *, num_members: int = 5, params=None, likelihood: str = "gaussian",
                 num_epochs: int = 10, batch_size: int = 128, learning_rate: float = 1e-3,
                 optimizer: optax.GradientTransformation | None = None, prior=None, kl_weight: float = 1.0,
                 warmup_epochs: int = 0, warmup_delay: int = 0, kl_schedule=None, kl_method: str = "auto",
                 num_data: float | None = None, noise_std=1.0, learn_noise: bool = False, opt_state=None,
                 progress: bool = False) -> FitResult:
    """Deep ensemble (Lakshminarayanan et al. 2017; paper's M = 5): ``K`` members of ``model`` (normally the
    deterministic network) initialised with different keys and trained **in parallel**: one jitted ``vmap`` of
    :func:`fit`'s epoch over the members, each with its own shuffling and draws (with ``k_init, k_train =
    split(key)``, member ``k`` is initialised by ``init_ensemble(model, k_init, K)`` unless ``params`` is
    given, and trains with ``split(k_train, K)[k]``). Same arguments as :func:`fit` (``prior=None`` by default:
    no KL). Returns :class:`FitResult` with a leading member axis on
    ``params``, ``history`` arrays ``(epochs, K)`` and ``noise_std`` ``(K,)`` (Gaussian likelihood).

    To continue a run (e.g. epoch by epoch with early stopping), pass the previous result's ``params``,
    ``noise_std`` (one per member) and ``opt_state``; Adam's moments then carry over instead of restarting.

    Args:
        model: a network spec (:class:`MLP`, :class:`LSTM` or :class:`Transformer`).
        x: training inputs (first axis the ``n`` data points).
        y: integer labels ``(n,)`` for ``likelihood="categorical"``; real targets ``(n,)`` or ``(n, d_out)`` for
            ``"gaussian"``.
        key: PRNG key, split into the initialisation key and the members' training keys.
        num_members: number of members ``K`` (a positive integer).
        params: members' parameters with a leading axis ``K`` (e.g. a previous result's); ``None`` initialises
            them with :func:`init_ensemble` (float32).
        likelihood: ``"gaussian"`` or ``"categorical"``.
        num_epochs: number of epochs (a non-negative integer).
        batch_size: minibatch size; ``n // batch_size`` minibatches per epoch (remainder dropped, reshuffled).
        learning_rate: Adam step size, used when ``optimizer`` is ``None``.
        optimizer: any optax transformation, applied to every member.
        prior: prior of the stochastic parameters; ``None`` (default) trains without a KL term.
        kl_weight: the non-negative KL weight (multiplied by the schedule).
        warmup_epochs: ramp length of the default :func:`linear_warmup` schedule.
        warmup_delay: delay of the default :func:`linear_warmup` schedule.
        kl_schedule: a callable ``epoch -> multiplier`` replacing the warm-up schedule.
        kl_method: ``"auto"``, ``"mc"`` or ``"exact"`` (see the layers' ``kl``).
        num_data: the ``N`` dividing the KL (default ``n``).
        noise_std: Gaussian noise standard deviation, one positive number or ``K`` (one per member).
        learn_noise: learn the noise standard deviation of each member.
        opt_state: optimiser state (member axis first) to continue from; ``None`` initialises it.
        progress: show a tqdm bar over epochs.

    Returns:
        :class:`FitResult` with ``params`` (leading member axis), ``noise_std`` (a ``(K,)`` array, ``None`` for
        classification), ``history`` (``loss``, ``nll``, ``kl`` of shape ``(epochs, K)``, ``beta`` of shape
        ``(epochs,)``) and ``opt_state``.

    Raises:
        ValueError: if an argument is invalid (e.g. ``noise_std`` neither a positive number nor ``K`` positive
            numbers, ``x`` and ``y`` of different lengths, non-integer labels for a categorical likelihood).
        FloatingPointError: if the loss of a member becomes non-finite.
    """
    where = "fit_ensemble"
    k = _check_int(num_members, "num_members", where)
    member_noise = np.asarray(noise_std, np.float64)
    if member_noise.ndim == 1:
        if member_noise.shape != (k,) or not np.all(member_noise > 0):
            raise ValueError(f"{where}: noise_std must be a positive number or {k} positive numbers (one per "
                             f"member), got {noise_std!r}")
        noise_std = float(member_noise[0])
    elif member_noise.ndim:
        raise ValueError(f"{where}: noise_std must be a number or a (num_members,) array, got shape "
                         f"{member_noise.shape}")
    x, y, n, bs, steps, optimizer, kl_weight, schedule, num_data, noise_std = _fit_setup(
        model, x, y, likelihood, num_epochs, batch_size, learning_rate, optimizer, kl_weight, warmup_epochs,
        warmup_delay, kl_schedule, num_data, noise_std, where)
    k_init, k_train = jax.random.split(key)
    member_keys = jax.random.split(k_train, k)
    if params is None:
        params = init_ensemble(model, k_init, k)
    dtype = jax.tree.leaves(params)[0].dtype
    if likelihood == "gaussian" and member_noise.ndim == 1:
        log_noise = jnp.asarray(np.log(member_noise), dtype)
    else:
        log_noise = jnp.full((k,), math.log(noise_std) if likelihood == "gaussian" else 0.0, dtype)
    state = (params, log_noise)
    if opt_state is None:
        opt_state = jax.vmap(optimizer.init)(state)
    epoch = _compiled_epoch(model, optimizer, likelihood, bool(learn_noise), prior, kl_method, bs, steps, num_data,
                            True)
    hist = {"loss": [], "nll": [], "kl": [], "beta": []}
    from tqdm.auto import tqdm

    for e in tqdm(range(num_epochs), desc=f"ensemble K={k}", unit="epoch", disable=not progress, leave=False):
        beta = kl_weight * float(schedule(e))
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(member_keys, e)
        state, opt_state, stats = epoch(state, opt_state, keys, jnp.asarray(beta, dtype), x, y)
        stats = np.asarray(stats)  # (K, 3)
        if not np.all(np.isfinite(stats)):
            raise FloatingPointError(f"fit_ensemble: non-finite loss at epoch {e}")
        for j, name in enumerate(("loss", "nll", "kl")):
            hist[name].append(stats[:, j])
        hist["beta"].append(beta)
    history = {kk: np.asarray(v) for kk, v in hist.items()}
    noise = np.exp(np.asarray(state[1])) if likelihood == "gaussian" else None
    return FitResult(state[0], noise, history, opt_state)


def ensemble_apply(model, params, x, key=None):
    """Outputs of every member, stacked ``(K, ...)`` (``params`` with a leading member axis).

    Args:
        model: the network spec of the members.
        params: the members' parameters, every leaf with a leading axis of length ``K``.
        x: inputs, shared by all members.
        key: PRNG key split into one key per member (one weight draw each); ``None`` for networks without
            stochastic layers.

    Returns:
        Array of shape ``(K,) + output shape``, the members' outputs.
    """
    k = jax.tree.leaves(params)[0].shape[0]
    keys = None if key is None else jax.random.split(key, k)
    if keys is None:
        return jax.vmap(lambda p: model.apply(p, x, None))(params)
    return jax.vmap(lambda p, kk: model.apply(p, x, kk))(params, keys)


def predict(model, params, x, key, num_samples: int = 50, *, batch_size: int | None = None):
    """Monte-Carlo predictive samples: ``S = num_samples`` outputs of ``model.apply(params, x, k_s)`` with
    ``k_s = split(key, S)[s]``, stacked along a new leading axis (shape ``(S,) + output shape``). Average the
    softmax of the logits (classification) or take mean / std over axis 0 (regression). ``batch_size``: how
    many draws are evaluated at once (``lax.map``'s ``batch_size``; default all at once).

    Args:
        model: the network spec.
        params: its parameters.
        x: inputs, as for ``model.apply``.
        key: PRNG key, split into ``S`` draw keys.
        num_samples: number of draws ``S`` (a positive integer).
        batch_size: draws evaluated together (a positive integer), or ``None`` for all at once under ``vmap``.

    Returns:
        Array of shape ``(S,) + output shape``, one network output per weight draw.

    Raises:
        ValueError: if ``num_samples`` or ``batch_size`` is not a positive integer.
    """
    s = _check_int(num_samples, "num_samples", "predict")
    keys = jax.random.split(key, s)
    f = lambda k: model.apply(params, x, k)  # noqa: E731
    if batch_size is None:
        return jax.vmap(f)(keys)
    return lax.map(f, keys, batch_size=_check_int(batch_size, "batch_size", "predict"))
