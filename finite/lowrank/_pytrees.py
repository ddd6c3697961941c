"""Parameter and weight pytrees of the dense layers and embeddings: what ``init`` returns (`DenseParams`,
`BBBParams`, `LowRankParams`, `Rank1Params`), what ``sample`` draws (`DenseWeights`, `FactorWeights`,
`Rank1Weights`), `materialize`, the dense ``W`` of a drawn weight, and `_FACTOR_FIELDS`, the mean-field factors
of each kind by field name.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from finite.lowrank._meanfield import MeanField

__all__ = [
    "DenseParams", "BBBParams", "LowRankParams", "Rank1Params", "DenseWeights", "FactorWeights", "Rank1Weights",
    "materialize",
]


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


#: The mean-field factors of each kind, by field name: the same names in its params (``MeanField``) and in its
#: drawn weights (arrays). A Bayesian bias ``b`` is not included.
_FACTOR_FIELDS = {"deterministic": (), "bbb": ("W",), "lowrank": ("A", "B"), "rank1": ("s", "r")}
