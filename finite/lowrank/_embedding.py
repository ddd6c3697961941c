"""Embeddings of the four kinds (`DeterministicEmbedding`, `BBBEmbedding`, `LowRankEmbedding`,
`Rank1Embedding`) and the builder `embedding`. Only the looked-up rows are sampled: row ``v`` draws its noise from
``fold_in(key, v)``, so a lookup equals sampling the whole table and gathering (paper Sec. 2.4); ``kl`` covers the
whole table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from finite.lowrank import _pytrees
from finite.lowrank._dense import Rank1Dense
from finite.lowrank._meanfield import (
    MeanField,
    _draw,
    _init_rho,
    _sample_mf,
    _std_noise,
    _svd_mean_fields,
    _unit_mean_fields,
)
from finite.lowrank._stochastic import _as_array, _det_init, _Stochastic
from finite.lowrank._validation import KINDS, _check_choice, _check_pos, _float_dtype
from smnngp._axes import lead

__all__ = ["DeterministicEmbedding", "BBBEmbedding", "LowRankEmbedding", "Rank1Embedding", "embedding"]


def _row_noise(key, rows, shape, family: str, dtype):
    """Noise for each row id in ``rows``: row ``v`` uses ``fold_in(key, v)`` (so gathering = sampling rows)."""
    flat = jnp.reshape(rows, (-1,))
    eps = jax.vmap(lambda v: _std_noise(jax.random.fold_in(key, v), shape, family, dtype))(flat)
    return jnp.reshape(eps, tuple(rows.shape) + tuple(shape))


def _check_tokens(tokens, vocab: int, where: str):
    if not hasattr(tokens, "dtype") or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{where}: tokens must be an integer array, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)}")


@dataclasses.dataclass(frozen=True)
class _Embedding(_Stochastic):
    """Shared plumbing of the embeddings: the leading fields ``vocab``, ``dim``, the checks on construction,
    ``apply`` (kind-specific: ``_check_scales``, ``lookup``, ``sample``)."""

    vocab: int
    dim: int
    _SIZES = ("vocab", "dim")

    def _where(self):
        return f"{type(self).__name__}({self.vocab}x{self.dim})"

    def apply(self, params, tokens, key=None):
        """Embeddings of ``tokens`` (integer array of any shape) at one draw; shape ``tokens.shape + (dim,)``."""
        tokens = _as_array(tokens)
        _check_tokens(tokens, self.vocab, self._where())
        return self._keyed_apply(params, tokens, key, "embedding")

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

    kind = "deterministic"

    def _check_options(self, where: str):
        pass

    def _init_impl(self, key, dtype=jnp.float32):
        """``DenseParams(E, None)``."""
        return _pytrees.DenseParams(_det_init(key, (self.vocab, self.dim), _float_dtype(dtype), "uniform"), None)

    def sample(self, params, key=None):
        """The table."""
        return _pytrees.DenseWeights(params.W, None)

    def lookup(self, params, tokens, key=None):
        """``E[tokens]``."""
        return jnp.take(params.W, tokens, axis=0)

    def num_params(self) -> int:
        """``V d``."""
        return self.vocab * self.dim

    def from_deterministic(self, det_params, key=None):
        """A copy of the table."""
        return _pytrees.DenseParams(det_params.W, None)


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

    family: str = "gaussian"
    mean_scale: float = 0.2
    rho_range: tuple = (-5.0, -4.0)
    kind = "bbb"

    def _check_scales(self, where: str):
        _check_pos(self.mean_scale, "mean_scale", where)

    def _init_impl(self, key, dtype=jnp.float32):
        """``BBBParams(MeanField(mu, rho), None)``."""
        dtype = _float_dtype(dtype)
        k1, k2 = jax.random.split(key)
        shape = (self.vocab, self.dim)
        mu = jax.random.uniform(k1, shape, dtype, -self.mean_scale, self.mean_scale)
        return _pytrees.BBBParams(MeanField(mu, _init_rho(k2, shape, dtype, None, self.rho_range)), None)

    def sample(self, params, key):
        """The full table at one draw (row ``v``'s noise from ``fold_in(key, v)``)."""
        eps = _row_noise(key, jnp.arange(self.vocab), (self.dim,), self.family, params.W.mu.dtype)
        return _pytrees.DenseWeights(_draw(params.W, eps), None)

    def lookup(self, params, tokens, key):
        """Rows of the table for ``tokens`` only, equal to ``sample(params, key).W[tokens]``."""
        eps = _row_noise(key, tokens, (self.dim,), self.family, params.W.mu.dtype)
        mf = MeanField(jnp.take(params.W.mu, tokens, axis=0), jnp.take(params.W.rho, tokens, axis=0))
        return _draw(mf, eps)

    def num_params(self) -> int:
        """``2 V d``."""
        return 2 * self.vocab * self.dim

    def from_deterministic(self, det_params, key):
        """``mu = E``, ``rho ~ U(rho_range)``."""
        E = jnp.asarray(det_params.W)
        return _pytrees.BBBParams(MeanField(E, _init_rho(key, E.shape, E.dtype, None, self.rho_range)), None)


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

    rank: int
    family: str = "gaussian"
    eta: float = 0.1
    rho_range: Any = None
    target_var: float = 0.05 ** 2 / 3.0
    overcomplete: bool = False
    kind = "lowrank"

    def _check_scales(self, where: str):
        _check_pos(self.eta, "eta", where)
        _check_pos(self.target_var, "target_var", where)

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
        return _pytrees.LowRankParams(A, B, None)

    def sample(self, params, key):
        """Full ``(A, B)`` at one draw (row ``v`` of ``A`` from ``fold_in(key_A, v)``)."""
        ka, kb = jax.random.split(key)
        eps = _row_noise(ka, jnp.arange(self.vocab), (self.rank,), self.family, params.A.mu.dtype)
        return _pytrees.FactorWeights(_draw(params.A, eps), _sample_mf(params.B, kb, self.family), None)

    def lookup(self, params, tokens, key):
        """``A[tokens] @ B^T`` sampling only the rows of ``A`` that are looked up."""
        ka, kb = jax.random.split(key)
        eps = _row_noise(ka, tokens, (self.rank,), self.family, params.A.mu.dtype)
        rows = _draw(MeanField(jnp.take(params.A.mu, tokens, axis=0), jnp.take(params.A.rho, tokens, axis=0)), eps)
        return rows @ _sample_mf(params.B, kb, self.family).T

    def num_params(self) -> int:
        """``2 r (V + d)``."""
        return 2 * self.rank * (self.vocab + self.dim)

    def from_deterministic(self, det_params, key):
        """SVD initialisation of the table (App. F.9)."""
        A, B = _svd_mean_fields(jnp.asarray(det_params.W), self.rank, key, self.eta * self.factor_scale,
                                self.rho_range)
        return _pytrees.LowRankParams(A, B, None)


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

    family: str = "gaussian"
    perturbation: float = 0.1
    rho_range: tuple = (-5.0, -4.0)
    kind = "rank1"

    def _init_impl(self, key, dtype=jnp.float32):
        """``Rank1Params(E_bar, s, r, None)``."""
        dtype = _float_dtype(dtype)
        kw, kv = jax.random.split(key)
        spec = Rank1Dense(self.vocab, self.dim, family=self.family, perturbation=self.perturbation,
                          rho_range=self.rho_range, bias="none")
        s, r = spec._vectors(kv, dtype)
        return _pytrees.Rank1Params(_det_init(kw, (self.vocab, self.dim), dtype, "uniform"), s, r, None)

    def sample(self, params, key):
        """``(E_bar, s, r)`` at one draw (``s_v`` from ``fold_in(key_s, v)``)."""
        ks, kr = jax.random.split(key)
        eps = _row_noise(ks, jnp.arange(self.vocab), (), self.family, params.W.dtype)
        return _pytrees.Rank1Weights(params.W, _draw(params.s, eps), _sample_mf(params.r, kr, self.family), None)

    def lookup(self, params, tokens, key):
        """``E_bar[tokens] * s[tokens] * r`` sampling only the looked-up ``s_v``."""
        ks, kr = jax.random.split(key)
        eps = _row_noise(ks, tokens, (), self.family, params.W.dtype)
        s = _draw(MeanField(jnp.take(params.s.mu, tokens), jnp.take(params.s.rho, tokens)), eps)
        r = _sample_mf(params.r, kr, self.family)
        rows = jnp.take(params.W, tokens, axis=0)
        return rows * s[..., None] * lead(r, rows.ndim)

    def num_params(self) -> int:
        """``V d + 2 (V + d)``."""
        return self.vocab * self.dim + 2 * (self.vocab + self.dim)

    def from_deterministic(self, det_params, key):
        """``E_bar = E``, means of ``s, r`` equal to 1."""
        E = jnp.asarray(det_params.W)
        s, r = _unit_mean_fields(key, (self.vocab, self.dim), E.dtype, self.rho_range)
        return _pytrees.Rank1Params(E, s, r, None)


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
