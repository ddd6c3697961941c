"""Dense layers ``x @ W + b`` of the four kinds (paper Sec. 2.1-2.4, App. I.1): `DeterministicDense`, `BBBDense`
(full-rank mean field), `LowRankDense` (``W = A B^T``, computed as ``(x A) B^T``), `Rank1Dense` (Dusenberry et
al.'s ``W_bar o (s r^T)``), their shared plumbing `_Layer`, and the builder `dense`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from finite.lowrank._meanfield import (
    MeanField,
    _bias_count,
    _bias_exact_kl,
    _bias_from,
    _bias_log_ratio,
    _bias_params,
    _draw_flat,
    _draw_specs,
    _init_rho,
    _svd_mean_fields,
    _unit_mean_fields,
)
from finite.lowrank._pytrees import (
    BBBParams,
    DenseParams,
    DenseWeights,
    FactorWeights,
    LowRankParams,
    Rank1Params,
    Rank1Weights,
)
from finite.lowrank._stochastic import _as_array, _det_init, _Stochastic
from finite.lowrank._validation import _BIASES, KINDS, _check_choice, _check_last_dim, _check_pos, _float_dtype
from smnngp._axes import lead

__all__ = ["DeterministicDense", "BBBDense", "LowRankDense", "Rank1Dense", "dense"]


#: the initialisers (``init_method``) each kind accepts
_INITS = {
    "deterministic": ("glorot", "he", "orthogonal"),
    "bbb": ("uniform", "he", "glorot"),
    "lowrank": ("he", "glorot"),
    "rank1": ("glorot", "he"),
}


@dataclasses.dataclass(frozen=True)
class _Layer(_Stochastic):
    """Shared plumbing of the dense layers: the leading fields ``n_in``, ``n_out``, the checks on construction,
    ``apply``, the draw, the KL with the bias (kind-specific: ``_check_scales``, ``_init_impl``, ``_noise_shapes``,
    ``_assemble``, ``forward``)."""

    n_in: int
    n_out: int
    _SIZES = ("n_in", "n_out")
    _RANK_HINT = " (pass overcomplete=True to allow it)"
    _BIAS_CHOICES = _BIASES

    def _where(self):
        return f"{type(self).__name__}({self.n_in}->{self.n_out})"

    def _check_names(self, where: str):
        _check_choice(self.bias, self._BIAS_CHOICES, "bias", where)
        _check_choice(self.init_method, _INITS[self.kind], "init", where)

    def _mf_list(self, params):
        """The mean-field tensors one draw samples, in ``_noise_shapes`` order: the factors, then a Bayesian bias."""
        return self._factors(params) + ([params.b] if self.bias == "bayes" else [])

    def _log_ratio(self, params, weights, prior):
        lr = super()._log_ratio(params, weights, prior)
        return lr if self.kind == "deterministic" else lr + _bias_log_ratio(params.b, weights.b, prior, self.family)

    def _exact_kl(self, params, prior):
        kl = super()._exact_kl(params, prior)
        return kl if self.kind == "deterministic" else kl + _bias_exact_kl(params.b, prior)

    def apply(self, params, x, key=None):
        """``x @ W + b`` at one draw ``W ~ q`` (``sample(params, key)``), shared across the batch.

        Args: ``params`` from :meth:`init`; ``x`` of shape ``(..., n_in)``; ``key`` a PRNG key (ignored by the
        deterministic kind). Returns ``(..., n_out)``.
        """
        x = _as_array(x)
        _check_last_dim(x, self.n_in, self._where())
        return self._keyed_apply(params, x, key, "layer")

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

    bias: str = "deterministic"
    init_method: str = "glorot"
    bias_init: float = 0.0
    kind = "deterministic"
    _BIAS_CHOICES = ("deterministic", "none")

    def _check_options(self, where: str):
        self._check_names(where)

    def _init_impl(self, key, dtype=jnp.float32) -> DenseParams:
        """Draw ``DenseParams(W, b)``; ``dtype`` the parameters' floating dtype."""
        dtype = _float_dtype(dtype)
        W = _det_init(key, (self.n_in, self.n_out), dtype, self.init_method)
        b = None if self.bias == "none" else jnp.full((self.n_out,), self.bias_init, dtype)
        return DenseParams(W, b)

    def _noise_shapes(self):
        return ()

    def _assemble(self, params, vals) -> DenseWeights:
        return DenseWeights(params.W, params.b)

    def forward(self, weights, x):
        """``x @ W + b``."""
        out = x @ weights.W
        return out if weights.b is None else out + lead(weights.b, out.ndim)

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
class _UniformRhoLayer(_Layer):
    """Fields and checks shared by the full-rank and rank-1 kinds: ``family``, ``bias`` and ``init_method`` after
    the sizes (defaults those of :class:`BBBDense`; :class:`Rank1Dense` sets its own), and a required
    ``rho_range``: every ``rho`` of theirs starts ``U(rho_range)``."""

    family: str = "gaussian"
    bias: str = "bayes"
    init_method: str = "uniform"

    def _check_options(self, where: str):
        super()._check_options(where)
        if self.rho_range is None:
            raise ValueError(f"{where}: rho_range must be a pair (low, high)")


@dataclasses.dataclass(frozen=True)
class BBBDense(_UniformRhoLayer):
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

    mean_scale: float = 0.2
    rho_range: tuple = (-5.0, -4.0)
    bias_rho: float = -5.0
    bias_init: float = 0.0
    kind = "bbb"

    def _check_scales(self, where: str):
        _check_pos(self.mean_scale, "mean_scale", where)

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

    def _assemble(self, params, vals) -> DenseWeights:
        """Weights from the drawn ``W`` (and bias) in ``_mf_list`` order."""
        return DenseWeights(vals[0], vals[1] if self.bias == "bayes" else params.b)

    def forward(self, weights, x):
        """``x @ W + b``."""
        out = x @ weights.W
        return out if weights.b is None else out + lead(weights.b, out.ndim)

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

    def _check_scales(self, where: str):
        _check_choice(self.mean_dist, ("normal", "uniform"), "mean_dist", where)
        _check_choice(self.path, ("auto", "factored", "materialized"), "path", where)
        _check_pos(self.eta, "eta", where)

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
        return out if weights.b is None else out + lead(weights.b, out.ndim)

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
        A, B = _svd_mean_fields(W, self.rank, key, self.eta * self.factor_scale, self.rho_range)
        return LowRankParams(A, B, _bias_from(self.bias, det_params.b, self.n_out, W.dtype, self.bias_rho))

    def mean_weight(self, params):
        """``E[W] = mu_A mu_B^T`` (independent factors)."""
        return params.A.mu @ params.B.mu.T


@dataclasses.dataclass(frozen=True)
class Rank1Dense(_UniformRhoLayer):
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

    bias: str = "deterministic"
    init_method: str = "glorot"
    perturbation: float = 0.1
    rho_range: tuple = (-5.0, -4.0)
    bias_rho: float = -5.0
    bias_init: float = 0.0
    kind = "rank1"

    def _vectors(self, key, dtype):
        ks, kr, kps, kpr = jax.random.split(key, 4)
        p = float(self.perturbation)
        s = MeanField(1.0 + jax.random.uniform(ks, (self.n_in,), dtype, -p, p),
                      _init_rho(kps, (self.n_in,), dtype, None, self.rho_range))
        r = MeanField(1.0 + jax.random.uniform(kr, (self.n_out,), dtype, -p, p),
                      _init_rho(kpr, (self.n_out,), dtype, None, self.rho_range))
        return s, r

    def _check_scales(self, where: str):
        if not (math.isfinite(float(self.perturbation)) and float(self.perturbation) >= 0):
            raise ValueError(f"{where}: perturbation must be >= 0, got {self.perturbation!r}")

    def _init_impl(self, key, dtype=jnp.float32) -> Rank1Params:
        """Draw ``Rank1Params(W_bar, s, r, b)``."""
        dtype = _float_dtype(dtype)
        kw, kv = jax.random.split(key)
        W = _det_init(kw, (self.n_in, self.n_out), dtype, self.init_method)
        s, r = self._vectors(kv, dtype)
        return Rank1Params(W, s, r, _bias_params(self.bias, self.n_out, dtype, self.bias_rho, self.bias_init))

    def _noise_shapes(self):
        return ((self.n_in,), (self.n_out,)) + (((self.n_out,),) if self.bias == "bayes" else ())

    def _assemble(self, params, vals) -> Rank1Weights:
        """Weights from the drawn ``s, r`` (and bias), ``W_bar`` fixed."""
        return Rank1Weights(params.W, vals[0], vals[1], vals[2] if self.bias == "bayes" else params.b)

    def forward(self, weights, x):
        """``((x o s) @ W_bar) o r + b``."""
        out = (x * lead(weights.s, x.ndim)) @ weights.W
        out = out * lead(weights.r, out.ndim)
        return out if weights.b is None else out + lead(weights.b, out.ndim)

    def num_params(self) -> int:
        """``n_in n_out + 2 (n_in + n_out)`` plus the bias (Table 4: ``mn + 2(m + n)``)."""
        return self.n_in * self.n_out + 2 * (self.n_in + self.n_out) + _bias_count(self.bias, self.n_out)

    def from_deterministic(self, det_params: DenseParams, key) -> Rank1Params:
        """``W_bar = W``; ``s, r`` means 1 (so ``E[W] = W`` at the start), ``rho ~ U(rho_range)``."""
        W = jnp.asarray(det_params.W)
        s, r = _unit_mean_fields(key, (self.n_in, self.n_out), W.dtype, self.rho_range)
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
