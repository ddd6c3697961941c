"""The group-ARD prior (Eqs. 5-6, Table 1): groupings of a layer's weights (`Grouping`, `groupings`, `GROUPS`),
`group_sum`, how two groupings' variances combine per weight, the prior state `ArdState` and `init_state`, the
weighted (group) lasso `penalty` (Eqs. 14-15), and `ArdConfig`, the settings of Algorithm 1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from finite.ard._network import ArdMLP
from finite.checks import check_positive

__all__ = [
    "GROUPS", "HESSIANS", "PENALTIES", "Grouping", "groupings", "group_sum", "ArdConfig", "DEFAULT_CONFIG",
    "ArdState", "init_state", "penalty",
]


GROUPS = ("element", "row", "column", "row+column", "shape")
HESSIANS = ("exact", "gauss-newton", "kfac", "diagonal")
PENALTIES = ("lasso", "l2", "none")


class Grouping(NamedTuple):
    """Group index of every weight of one layer (``ids`` of the layer's shape, values ``0 .. num - 1``); ``kind``
    and ``block`` let :func:`group_sum` use plain reductions instead of a scatter."""

    ids: np.ndarray
    num: int
    kind: str = "element"
    block: tuple = (1, 1)


def groupings(shape, group: str, block=(2, 2)) -> tuple:
    """The groupings of a layer of ``shape = (n_in, n_out)`` for ``group`` (one of :data:`GROUPS`; ``"shape"``
    uses rectangular blocks of ``block = (rows, cols)``, the last ones smaller). Returns a tuple of
    :class:`Grouping` (two for ``"row+column"``, else one)."""
    n_in, n_out = shape
    i, j = np.meshgrid(np.arange(n_in), np.arange(n_out), indexing="ij")
    if group == "element":
        return (Grouping(i * n_out + j, n_in * n_out, "element"),)
    if group == "row":
        return (Grouping(i, n_in, "row"),)
    if group == "column":
        return (Grouping(j, n_out, "column"),)
    if group == "row+column":
        return (Grouping(i, n_in, "row"), Grouping(j, n_out, "column"))
    if group == "shape":
        p, q = (int(v) for v in block)
        if p < 1 or q < 1:
            raise ValueError(f"groupings: block sizes must be positive, got {block}")
        per_row = -(-n_out // q)
        return (Grouping((i // p) * per_row + j // q, (-(-n_in // p)) * per_row, "shape", (p, q)),)
    raise ValueError(f"groupings: unknown group {group!r}; choose from {GROUPS}")


def group_sum(X, g: Grouping):
    """Sum of ``X`` (a layer-shaped array) over each group of ``g``: ``(g.num,)``, in group-index order.

    Args:
        X: an array of the layer's shape ``(n_in, n_out)`` (e.g. ``W * W`` for squared group norms, or per-weight
            terms of the hyperparameter update).
        g: the layer's :class:`Grouping` (from :func:`groupings`).

    Returns:
        An array ``(g.num,)`` whose entry ``k`` is the sum of ``X`` over the weights of group ``k`` (for
        ``"element"`` groups simply ``X`` flattened row-major).
    """
    if g.kind == "element":
        return jnp.ravel(X)
    if g.kind == "row":
        return jnp.sum(X, axis=1)
    if g.kind == "column":
        return jnp.sum(X, axis=0)
    if g.kind == "shape":
        p, q = g.block
        n_in, n_out = X.shape
        X = jnp.pad(X, ((0, -n_in % p), (0, -n_out % q)))
        return jnp.sum(X.reshape(X.shape[0] // p, p, X.shape[1] // q, q), axis=(1, 3)).ravel()
    return jax.ops.segment_sum(jnp.ravel(X), jnp.asarray(g.ids.ravel()), num_segments=g.num)


def _group_norms(W, g: Grouping):
    sq = group_sum(W * W, g)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)  # subgradient 0 at W_g = 0


class ArdConfig(NamedTuple):
    """Settings of one Algorithm 1 run (hashable, a static argument of the compiled program).

    * ``group``: one of :data:`GROUPS`; ``block`` the ``"shape"`` block.
    * ``penalty``: ``"lasso"`` (the weighted (group) lasso), ``"l2"`` (weight decay ``lam * sum W^2``),
      ``"none"``; ``reweight``: Algorithm 1's Bayesian re-weighting and variance pruning (``False``: the
      conventional penalty with ``omega = 1`` and magnitude pruning only).
    * ``rounds`` (T_max), ``epochs`` per round (full batch), ``learning_rate`` of Adam; ``schedule``
      ``"cosine"`` (annealed to 0 over all rounds, as the authors' code) or ``"constant"``.
    * ``hessian``: one of :data:`HESSIANS`; ``dense_limit`` the largest layer for the dense options.
    * ``kappa_upsilon``, ``kappa_w``: pruning thresholds (``kappa_w`` also applies without re-weighting;
      ``penalty="none"`` never prunes).
    * ``prune_dead``: with re-weighting, also prune the weights into and out of every ReLU node that is inactive
      on every training sample (:func:`dead_weights`). Our addition: their data-term curvature is exactly zero,
      so without it they get ``alpha = 0``, ``omega`` falls to the clamp floor and ``Upsilon = ||W_g|| / omega``
      jumps to ~1e8; the penalty no longer reaches them, and the Laplace posterior gives them that variance (its
      sampled free runs diverge). Pruning them does not change the trained network's output.
    * ``noise_var``: ``sigma^2`` of the data term; ``None`` re-estimates it each round as the training MSE.
    * ``omega_reduce``: ``"sum"`` (the derivation, Table 1) or ``"mean"`` (the authors' code).
    * ``clamp``: the range of variances and omegas.
    """

    group: str = "row+column"
    block: tuple = (2, 2)
    penalty: str = "lasso"
    reweight: bool = True
    rounds: int = 10
    epochs: int = 1000
    learning_rate: float = 1e-2
    schedule: str = "cosine"
    hessian: str = "diagonal"
    dense_limit: int = 4096
    kappa_upsilon: float = 1e-4
    kappa_w: float = 1e-4
    prune_dead: bool = True
    noise_var: float | None = None
    omega_reduce: str = "sum"
    clamp: tuple = (1e-10, 1e10)

    def check(self, model: ArdMLP | None = None) -> ArdConfig:
        """Validate every field (``ValueError`` naming it); with ``model``, also that the dense Hessian fits."""
        if self.group not in GROUPS:
            raise ValueError(f"ArdConfig: unknown group {self.group!r}; choose from {GROUPS}")
        if self.penalty not in PENALTIES:
            raise ValueError(f"ArdConfig: unknown penalty {self.penalty!r}; choose from {PENALTIES}")
        if self.hessian not in HESSIANS:
            raise ValueError(f"ArdConfig: unknown hessian {self.hessian!r}; choose from {HESSIANS}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"ArdConfig: schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.omega_reduce not in ("sum", "mean"):
            raise ValueError(f"ArdConfig: omega_reduce must be 'sum' or 'mean', got {self.omega_reduce!r}")
        for name in ("rounds", "epochs"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"ArdConfig: {name} must be a positive integer, got {v!r}")
        check_positive(self.learning_rate, "learning_rate", "ArdConfig")
        for name in ("kappa_upsilon", "kappa_w"):
            if not (getattr(self, name) >= 0):
                raise ValueError(f"ArdConfig: {name} must be >= 0, got {getattr(self, name)!r}")
        if self.noise_var is not None:
            check_positive(self.noise_var, "noise_var", "ArdConfig")
        lo, hi = self.clamp
        if not (0 < lo < hi):
            raise ValueError(f"ArdConfig: clamp must be 0 < low < high, got {self.clamp}")
        if model is not None and self.reweight and self.penalty == "lasso" and self.hessian != "diagonal":
            for idx, (a, b) in enumerate(model.shapes):
                if a * b > self.dense_limit:
                    raise ValueError(
                        f"ArdConfig: hessian={self.hessian!r} needs a dense {a * b} x {a * b} block for layer {idx} "
                        f"({a} x {b}), above dense_limit={self.dense_limit}; use hessian='diagonal'")
        return self


DEFAULT_CONFIG = ArdConfig()


def _layer_groupings(model: ArdMLP, config: ArdConfig) -> tuple:
    return tuple(groupings(s, config.group, config.block) for s in model.shapes)


class ArdState(NamedTuple):
    """Hyperparameters of Algorithm 1: ``omega`` (per layer, per grouping, ``(num_groups,)``), ``upsilon``
    (per layer, the per-weight prior variance, ``(n_in, n_out)``), ``masks`` (per layer, 1 = kept) and
    ``sigma2`` (the noise variance of the data term)."""

    omega: tuple
    upsilon: tuple
    masks: tuple
    sigma2: jax.Array


def init_state(model: ArdMLP, config: ArdConfig, dtype=jnp.float32) -> ArdState:
    """``omega(0) = 1``, ``Upsilon(0) = 1`` (Algorithm 1's initialisation), every weight kept, ``sigma2 = 1``.

    Args:
        model: the :class:`ArdMLP` whose layers the state covers.
        config: the :class:`ArdConfig`; its ``group`` and ``block`` fix how many ``omega`` each layer gets.
        dtype: floating dtype of every array of the state (default float32).

    Returns:
        An :class:`ArdState` of ones: per layer and grouping ``omega`` of shape ``(num_groups,)``, per layer
        ``upsilon`` and ``masks`` of shape ``(n_in, n_out)``, and the scalar ``sigma2``.
    """
    gs = _layer_groupings(model, config)
    return ArdState(tuple(tuple(jnp.ones(g.num, dtype) for g in lg) for lg in gs),
                    tuple(jnp.ones(s, dtype) for s in model.shapes),
                    tuple(jnp.ones(s, dtype) for s in model.shapes), jnp.asarray(1.0, dtype))


def penalty(params, state: ArdState, model: ArdMLP, config: ArdConfig):
    """``sum_l sum_groupings sum_g omega_g ||W_g||_2`` (``"lasso"``; element groups give the weighted L1 norm),
    ``sum W^2`` (``"l2"``) or 0 (``"none"``), without the factor ``lam``.

    Args:
        params: the network parameters, a tuple of :class:`Layer` (only the weights are penalised, never the
            biases).
        state: the current :class:`ArdState`; its ``omega`` weights the group norms (``"lasso"`` only).
        model: the :class:`ArdMLP` (its layer shapes define the groupings).
        config: the :class:`ArdConfig`; ``config.penalty`` selects the penalty, ``group`` and ``block`` the
            groupings.

    Returns:
        The penalty as a scalar array.
    """
    if config.penalty == "none":
        return jnp.zeros((), params[0].W.dtype)
    if config.penalty == "l2":
        return sum(jnp.sum(p.W ** 2) for p in params)
    total = 0.0
    for p, lg, om in zip(params, _layer_groupings(model, config), state.omega):
        for g, o in zip(lg, om):
            total = total + jnp.sum(o * _group_norms(p.W, g))
    return total


def _combine(variances):
    """Per-weight variance from the groupings' variances: ``1 / sum_k 1/upsilon^k``."""
    if len(variances) == 1:
        return variances[0]
    return 1.0 / sum(1.0 / v for v in variances)
