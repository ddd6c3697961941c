"""Sparse Bayesian (ARD) networks for system identification: NARX regressors, group-ARD priors, Algorithm 1
(re-weighted group lasso with Laplace-evidence hyperparameter updates and dynamic pruning), Laplace posteriors,
free-run simulation and the ARD log density for HMC.

Paper: Zhou, Ibrahim & Pan, "A Sparse Bayesian Deep Learning Approach for Identification of Cascaded Tanks
Benchmark" (``../shared/papers/003_5058be57155de644.txt``; notes ``notes/003_sparse_bayes_sysid.md``). Section and
equation numbers below are the paper's.

Model (section 2, Eq. 4). ``z(t) = [u(t-n_a), ..., u(t), y(t-n_b), ..., y(t-1)]`` (oldest first, dimension
``n_a + 1 + n_b``) and ``y(t) = Net(z(t)) + xi``, ``xi ~ N(0, sigma^2)``; ``Net`` an MLP with a linear scalar output.
Weight matrices are stored ``W^l`` of shape ``(n_{l-1}, n_l)`` as in the paper, so a *row* holds the outgoing
weights of one input node (row groups prune inputs / regressors) and a *column* the incoming weights of one node
(column groups prune hidden nodes). Biases carry no prior and are never pruned.

Prior (Eqs. 5-6, Table 1). Every weight ``w`` has ``N(0, upsilon_w)``. A *grouping* of a layer assigns each weight
to one group ``g`` with a shared variance ``Upsilon_g``: ``"element"`` (plain ARD, one per weight), ``"row"``,
``"column"``, ``"shape"`` (rectangular blocks) and ``"row+column"`` (two groupings at once; the weight's prior
precision is the sum ``1/upsilon_w = 1/Upsilon^row_i + 1/Upsilon^col_j``, as the authors' code combines them).

Algorithm 1 (one outer round ``t``; the order read off Eqs. 11-13, notes section 2.4):

1. train ``min_W  MSE(W) + lam * sum_groups omega_g(t) ||W_g||_2`` with optax (Eq. 15; the element grouping gives
   the weighted L1 penalty of Eq. 14, the others the group lasso of Table 1);
2. the Hessian ``H`` of the data term ``E = SSE / (2 sigma^2)`` per layer at the trained weights (Eq. 19/21);
3. ``Upsilon_g(t+1) = ||W_g(t+1)||_2 / omega_g(t)`` (Eq. 13 / Table 1);
4. ``C = diag((Upsilon^{-1} + H)^{-1})`` (Eq. 11) and
   ``alpha_g = sum_{w in g} (upsilon_w - C_ww) / Upsilon_g^2`` -- the gradient of the concave part
   ``log|Upsilon| + log|Upsilon^{-1} + H|`` with respect to ``Upsilon_g`` (Eq. 34). For the element grouping it is
   exactly Eq. 12, ``alpha = 1/upsilon - C/upsilon^2``; for a group it is the paper's sum over the group (Table 1);
   ``omega_g(t+1) = sqrt(|alpha_g|)`` (``omega_reduce="mean"`` averages over the group as the authors' code);
5. prune every weight with ``upsilon_w < kappa_upsilon`` or ``|W_w| < kappa_w`` (masks: a pruned weight stays 0);
   our addition, also the weights of every ReLU node inactive on all training samples (exactly zero data
   curvature, ``ArdConfig.prune_dead``).

``upsilon_w - C_ww`` is evaluated in the scaled form ``upsilon_w [I - (I + S H S)^{-1}]_ww`` with
``S = diag(sqrt(upsilon))``, which stays accurate when the variances span the clamp range ``[1e-10, 1e10]``
(``(I + S H S)`` has eigenvalues >= 1); negative curvature of an indefinite ``H`` (tanh/sigmoid networks) is
clamped (diagonal entries at zero; a dense block that can be indefinite is shifted by its Gershgorin bound), the
|alpha| of Table 1 guards the rest.

Hessian options (``hessian=``): ``"exact"`` -- the layer block ``sum_t a_t a_t^T (x) Hpre_t`` from the per-sample
pre-activation Hessians of the recursion of Eq. 21 (exact for an MLP; checked against ``jax.hessian``,
:func:`autodiff_layer_hessians`); ``"gauss-newton"`` -- the same without the ``D^l`` term; ``"kfac"`` -- its Kronecker
factorisation ``N E[a a^T] (x) E[G_t]`` (Botev et al. 2017, with ``D^l``); ``"diagonal"`` -- the exact diagonal of
the block, ``sum_t a_{t,i}^2 Hpre_t[j, j]`` from the per-sample pre-activation Hessians of Eq. 21. The dense
options are refused for layers with more than ``dense_limit`` weights (the 100 x 100 layer of the one-step network
would need a 10^4 x 10^4 block; use ``"diagonal"`` there).

Everything of one Algorithm 1 run -- all epochs of all rounds, the Hessians, the updates, the pruning and the
per-round evaluation -- is one compiled program (:func:`fit`); :func:`fit_repeats` vectorises repeats (initial
weights, data weights and ``lam``) with ``vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from finite.checks import check_positive

__all__ = ["ACTIVATIONS", "GROUPS", "HESSIANS", "PENALTIES", "Layer", "ArdMLP", "mlp", "narx_regressors", "Grouping",
           "groupings", "group_sum", "ArdConfig", "DEFAULT_CONFIG", "ArdState", "init_state", "penalty",
           "layer_hessians", "autodiff_layer_hessians", "preactivation_hessians", "hyper_update", "dead_weights",
           "prune", "ArdFit",
           "fit", "fit_repeats", "select_round", "fraction_remaining", "LaplacePosterior", "laplace",
           "laplace_simulation", "linearised_predictive",
           "sample_laplace", "simulate", "simulation_rmse", "finetune_simulation", "log_density",
           "position_to_params", "init_position"]


# ---------------------------------------------------------------------------
# activations, network
# ---------------------------------------------------------------------------

def _relu_d1(h):
    return (h > 0).astype(h.dtype)


def _tanh_d1(h):
    return 1.0 - jnp.tanh(h) ** 2


def _tanh_d2(h):
    t = jnp.tanh(h)
    return -2.0 * t * (1.0 - t * t)


def _sigmoid_d1(h):
    s = jax.nn.sigmoid(h)
    return s * (1.0 - s)


def _sigmoid_d2(h):
    s = jax.nn.sigmoid(h)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


ACTIVATIONS: dict[str, tuple[Callable, Callable, Callable]] = {
    "relu": (jax.nn.relu, _relu_d1, jnp.zeros_like),
    "tanh": (jnp.tanh, _tanh_d1, _tanh_d2),
    "sigmoid": (jax.nn.sigmoid, _sigmoid_d1, _sigmoid_d2),
}


class Layer(NamedTuple):
    """One dense layer: ``W`` of shape ``(n_in, n_out)`` (rows = inputs), ``b`` of shape ``(n_out,)``."""

    W: jax.Array
    b: jax.Array


class ArdMLP(NamedTuple):
    """An MLP ``sizes[0] -> ... -> 1`` with a hidden ``activation`` and a linear scalar output (hashable: usable
    as a static argument). Build it with :func:`mlp`."""

    sizes: tuple
    activation: str

    @property
    def shapes(self) -> tuple:
        """``(n_in, n_out)`` of every weight matrix."""
        return tuple(zip(self.sizes[:-1], self.sizes[1:]))

    def num_weights(self) -> int:
        """Number of weights (biases excluded: they carry no prior and are never pruned)."""
        return sum(a * b for a, b in self.shapes)

    def init(self, key, dtype=jnp.float32) -> tuple:
        """Weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (the common default of deep-learning
        libraries, which the paper's authors used). Returns a tuple of :class:`Layer`."""
        params = []
        for k, (n_in, n_out) in zip(jax.random.split(key, len(self.shapes)), self.shapes):
            kw, kb = jax.random.split(k)
            s = 1.0 / math.sqrt(n_in)
            params.append(Layer(jax.random.uniform(kw, (n_in, n_out), dtype, -s, s),
                                jax.random.uniform(kb, (n_out,), dtype, -s, s)))
        return tuple(params)

    def forward(self, params, x):
        """``(output (N,), pre-activations [h^1 .. h^L], inputs of each layer [a^0 .. a^{L-1}])``."""
        f = ACTIVATIONS[self.activation][0]
        a, hs, ins = x, [], []
        for i, layer in enumerate(params):
            ins.append(a)
            h = a @ layer.W + layer.b
            hs.append(h)
            a = f(h) if i < len(params) - 1 else h
        return a[..., 0], hs, ins

    def apply(self, params, x):
        """Network output for inputs ``x`` of shape ``(..., sizes[0])``: shape ``(...)``."""
        return self.forward(params, x)[0]


def mlp(sizes, activation: str = "relu") -> ArdMLP:
    """An :class:`ArdMLP` with layer widths ``sizes`` (input dimension first, output 1 last), e.g. the paper's
    one-step network ``mlp((11, 100, 100, 1))`` and simulation network ``mlp((39, 10, 10, 10, 1))``.

    Args: ``sizes`` a sequence of positive ints ending in 1; ``activation`` one of ``"relu"``, ``"tanh"``,
    ``"sigmoid"``. Returns: the spec. Raises ``ValueError`` naming a bad argument."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"mlp: sizes must be >= 2 positive widths, got {sizes}")
    if sizes[-1] != 1:
        raise ValueError(f"mlp: the output width must be 1 (scalar y(t)), got {sizes[-1]}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"mlp: unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    return ArdMLP(sizes, activation)


def narx_regressors(u, y, n_a: int, n_b: int | None = None):
    """NARX regressors ``z(t) = [u(t-n_a), ..., u(t), y(t-n_b), ..., y(t-1)]`` and targets ``y(t)`` for
    ``t = m, ..., T-1``, ``m = max(n_a, n_b)`` (the first ``m`` samples only serve as lags).

    Args: ``u``, ``y`` 1-D records of equal length ``T > m``; ``n_a`` the input lag (>= 0); ``n_b`` the output lag
    (>= 1, default ``n_a``). Returns: ``(Z (T-m, n_a+1+n_b), targets (T-m,))``.
    """
    n_b = n_a if n_b is None else n_b
    if int(n_a) != n_a or n_a < 0 or int(n_b) != n_b or n_b < 1:
        raise ValueError(f"narx_regressors: lags must be integers n_a >= 0 and n_b >= 1, got {n_a}, {n_b}")
    u, y = jnp.asarray(u), jnp.asarray(y)
    if u.ndim != 1 or y.shape != u.shape:
        raise ValueError(f"narx_regressors: u and y must be 1-D of equal length, got {u.shape} and {y.shape}")
    m = max(n_a, n_b)
    T = u.shape[0]
    if T <= m:
        raise ValueError(f"narx_regressors: a record of {T} samples is too short for lags {n_a}, {n_b}")
    t = np.arange(m, T)
    Z = jnp.concatenate([u[t[:, None] + np.arange(-n_a, 1)], y[t[:, None] + np.arange(-n_b, 0)]], axis=1)
    return Z, y[m:]


# ---------------------------------------------------------------------------
# groupings and the weighted (group) lasso
# ---------------------------------------------------------------------------

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


def _weighted_mse(model, params, Z, y, w):
    r = model.apply(params, Z) - y
    return jnp.sum(w * r * r) / jnp.sum(w)


# ---------------------------------------------------------------------------
# Hessians of the data term E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2), per layer (Eqs. 19-21)
# ---------------------------------------------------------------------------

def preactivation_hessians(model: ArdMLP, params, Z, y, w, sigma2, *, gauss_newton: bool = False):
    """Per-sample pre-activation Hessians ``Hpre^l_t = d^2 E_t / dh^l dh^l`` by the backward recursion of Eq. 21,
    ``Hpre^l = B^l W^{l+1} Hpre^{l+1} W^{l+1 T} B^l + D^l`` (``B = diag f'(h)``, ``D = diag(f''(h) dE/da)``; without
    ``D`` with ``gauss_newton``), from ``Hpre^L = w_t / sigma^2`` at the linear output. Exact for one sample of an
    MLP.

    Args:
        model: the :class:`ArdMLP` (its activation gives ``f'`` and ``f''``).
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term ``E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2)``.
        sigma2: the noise variance ``sigma^2`` of the data term (a positive scalar).
        gauss_newton: drop the ``D^l`` term (the Gauss-Newton approximation); default ``False`` (exact).

    Returns:
        ``(list of (N, n_l, n_l) per layer, list of layer inputs a^{l-1} (N, n_{l-1}))``.
    """
    _, d1, d2 = ACTIVATIONS[model.activation]
    f, hs, ins = model.forward(params, Z)
    L = len(params)
    g_h = (w * (f - y) / sigma2)[:, None]  # dE_t/dh^L
    H = (w / sigma2)[:, None, None] * jnp.ones((1, 1, 1), Z.dtype)
    out = [None] * L
    out[L - 1] = H
    for l in range(L - 2, -1, -1):
        Wn = params[l + 1].W
        g_a = g_h @ Wn.T
        Ha = jnp.einsum("ij,tjk,lk->til", Wn, H, Wn)
        b = d1(hs[l])
        H = b[:, :, None] * Ha * b[:, None, :]
        if not gauss_newton:
            H = H + jax.vmap(jnp.diag)(d2(hs[l]) * g_a)
        g_h = b * g_a
        out[l] = H
    return out, ins


def layer_hessians(model: ArdMLP, params, Z, y, w, sigma2, kind: str = "diagonal") -> tuple:
    """The Hessian of ``E`` with respect to each layer's weights (vectorised row-major: weight ``(i, j)`` is index
    ``i * n_out + j``), holding the other layers fixed (Eq. 19). ``kind`` one of :data:`HESSIANS` (module
    docstring).

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term.
        sigma2: the noise variance ``sigma^2`` of the data term (a positive scalar).
        kind: one of :data:`HESSIANS`; default ``"diagonal"``.

    Returns:
        A tuple with, per layer, a dense ``(n, n)`` block (``n = n_in * n_out``), or for ``"diagonal"`` the
        ``(n_in, n_out)`` diagonal.

    Raises:
        ValueError: ``kind`` is not one of :data:`HESSIANS`.
    """
    if kind not in HESSIANS:
        raise ValueError(f"layer_hessians: unknown kind {kind!r}; choose from {HESSIANS}")
    Hpre, ins = preactivation_hessians(model, params, Z, y, w, sigma2, gauss_newton=(kind == "gauss-newton"))
    out = []
    for a, Hp, (n_in, n_out) in zip(ins, Hpre, model.shapes):
        if kind == "diagonal":
            out.append(jnp.einsum("ti,tj->ij", a * a, jnp.diagonal(Hp, axis1=1, axis2=2)))
        elif kind in ("exact", "gauss-newton"):
            out.append(jnp.einsum("ti,tk,tjl->ijkl", a, a, Hp).reshape(n_in * n_out, n_in * n_out))
        else:  # kfac: N E[a a^T] (x) E[Hpre]  (weights w_t are already inside Hpre)
            n = a.shape[0]
            out.append(jnp.kron(a.T @ a / n, jnp.sum(Hp, axis=0)))
    return tuple(out)


def autodiff_layer_hessians(model: ArdMLP, params, Z, y, w, sigma2) -> tuple:
    """The exact layer blocks of :func:`layer_hessians` by ``jax.hessian`` (the independent check of the
    recursion; quadratic memory in the layer size). Algorithm 1 uses the recursion instead: ``jax.hessian``
    inside the repeat-vectorised compiled program stalled the XLA CPU runtime (JAX 0.10.2) in our runs, while the
    recursion gives the same block (``tests/test_ard.py``) at a fraction of the cost.

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        w: sample weights ``(N,)`` of the data term ``E = sum_t w_t (f_t - y_t)^2 / (2 sigma^2)``.
        sigma2: the noise variance ``sigma^2`` (a positive scalar).

    Returns:
        A tuple with, per layer, the dense ``(n_in * n_out, n_in * n_out)`` Hessian of ``E`` with respect to the
        row-major vectorised weights of that layer (the other layers and all biases held fixed).
    """
    blocks = []
    for l, (n_in, n_out) in enumerate(model.shapes):
        def E(vecW, l=l, n_in=n_in, n_out=n_out):
            ps = list(params)
            ps[l] = Layer(vecW.reshape(n_in, n_out), params[l].b)
            r = model.apply(tuple(ps), Z) - y
            return 0.5 * jnp.sum(w * r * r) / sigma2
        blocks.append(jax.hessian(E)(params[l].W.ravel()))
    return tuple(blocks)


def _clamp_psd(H):
    """``H`` with its negative eigenvalues set to zero (host-side use: the Laplace posterior)."""
    lam, U = jnp.linalg.eigh(0.5 * (H + H.T))
    return (U * jnp.clip(lam, 0.0, None)) @ U.T


def _gershgorin_psd(H):
    """``H + delta I`` with the smallest Gershgorin shift ``delta >= 0`` that makes it PSD. Used inside the
    compiled Algorithm 1 for blocks that can be indefinite (tanh / sigmoid with the ``D^l`` term): a vmapped
    ``eigh`` of a few hundred rows next to the free-run ``lax.scan`` stalled XLA's CPU runtime (JAX 0.10.2)."""
    radius = jnp.sum(jnp.abs(H), axis=1) - jnp.abs(jnp.diag(H))
    delta = jnp.maximum(0.0, -jnp.min(jnp.diag(H) - radius))
    return H + delta * jnp.eye(H.shape[0], dtype=H.dtype)


def _shrink(upsilon, H, psd: bool = True):
    """``upsilon_w - C_ww`` with ``C = (diag(1/upsilon) + H)^{-1}`` in the scaled form (module docstring), and
    ``C_ww`` itself; ``H`` dense ``(n, n)`` or the ``(n_in, n_out)`` diagonal. Negative curvature is clamped
    (diagonal entries at zero; a dense block not known to be PSD by a Gershgorin shift)."""
    if H.ndim == upsilon.ndim and H.shape == upsilon.shape:  # diagonal
        h = jnp.clip(H, 0.0, None)
        C = upsilon / (1.0 + upsilon * h)
        return upsilon - C, C
    u = upsilon.ravel()
    s = jnp.sqrt(u)
    H = 0.5 * (H + H.T)
    if not psd:
        H = _gershgorin_psd(H)
    M = jnp.eye(u.size, dtype=H.dtype) + s[:, None] * H * s[None, :]
    Lc = jnp.linalg.cholesky(M)
    Linv = jax.scipy.linalg.solve_triangular(Lc, jnp.eye(u.size, dtype=H.dtype), lower=True)
    r = jnp.sum(Linv * Linv, axis=0)  # diag(M^{-1})
    return (u * (1.0 - r)).reshape(upsilon.shape), (u * r).reshape(upsilon.shape)


def _combine(variances):
    """Per-weight variance from the groupings' variances: ``1 / sum_k 1/upsilon^k``."""
    if len(variances) == 1:
        return variances[0]
    return 1.0 / sum(1.0 / v for v in variances)


def hyper_update(params, state: ArdState, hessians, model: ArdMLP, config: ArdConfig) -> ArdState:
    """Steps 3-4 of a round (Eqs. 11-13, Table 1; module docstring): the new variances ``Upsilon(t+1) =
    ||W_g|| / omega(t)`` and weights ``omega(t+1) = sqrt(|alpha|)``, clamped to ``config.clamp``. Masks and
    ``sigma2`` are kept (see :func:`prune`).

    Args:
        params: the trained network parameters of this round, a tuple of :class:`Layer` (the weights are
            multiplied by ``state.masks`` before the group norms are taken).
        state: the current :class:`ArdState` (``omega(t)`` and the masks are read).
        hessians: per layer, the data-term Hessian from :func:`layer_hessians`: a dense ``(n, n)`` block or the
            ``(n_in, n_out)`` diagonal.
        model: the :class:`ArdMLP` (with ReLU, or with ``config.hessian="gauss-newton"``, a dense block is taken
            as positive semi-definite; otherwise it is shifted by its Gershgorin bound first).
        config: the :class:`ArdConfig` (``group``, ``block``, ``clamp``, ``omega_reduce``, ``hessian``).

    Returns:
        The :class:`ArdState` with the new ``omega`` (per layer and grouping, ``(num_groups,)``) and ``upsilon``
        (per layer, the combined per-weight variance ``(n_in, n_out)``).
    """
    lo, hi = config.clamp
    new_omega, new_upsilon = [], []
    for p, lg, om, m, H in zip(params, _layer_groupings(model, config), state.omega, state.masks, hessians):
        W = p.W * m
        per_group = [jnp.clip(_group_norms(W, g) / om_k, lo, hi) for g, om_k in zip(lg, om)]
        ups = _combine([v[jnp.asarray(g.ids)] for v, g in zip(per_group, lg)])
        shrink, _ = _shrink(ups, H, psd=config.hessian == "gauss-newton" or model.activation == "relu")
        omegas = []
        for g, v in zip(lg, per_group):
            alpha = group_sum(shrink, g) / v ** 2
            if config.omega_reduce == "mean":
                alpha = alpha / np.bincount(g.ids.ravel(), minlength=g.num)
            omegas.append(jnp.clip(jnp.sqrt(jnp.abs(alpha)), lo, hi))
        new_omega.append(tuple(omegas))
        new_upsilon.append(ups)
    return state._replace(omega=tuple(new_omega), upsilon=tuple(new_upsilon))


def dead_weights(model: ArdMLP, params, Z, w=None) -> tuple:
    """Per layer, a boolean ``(n_in, n_out)`` array marking the weights into and out of every *dead* ReLU node:
    a hidden node whose pre-activation is <= 0 on every training sample with positive weight ``w``. Its weights
    have exactly zero data-term curvature (``f'(h) = 0`` in, ``a = 0`` out), so the data carry no evidence about
    them, and removing both its incoming and outgoing weights leaves the trained network's output unchanged
    everywhere (its outgoing weights are gone). :func:`prune` removes them (``ArdConfig.prune_dead``). Smooth
    activations never have dead nodes (all ``False``).

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        Z: training regressors ``(N, sizes[0])``.
        w: optional sample weights ``(N,)``; samples of weight 0 do not count (``None``: every sample counts).

    Returns:
        A tuple with, per layer, a boolean ``(n_in, n_out)`` array, ``True`` for the weights of dead nodes.
    """
    out = [jnp.zeros(s, bool) for s in model.shapes]
    if model.activation != "relu":
        return tuple(out)
    Z = jnp.asarray(Z)
    w = jnp.ones(Z.shape[0], Z.dtype) if w is None else jnp.asarray(w)
    _, hs, _ = model.forward(params, Z)
    for l, h in enumerate(hs[:-1]):
        dead = ~jnp.any((h > 0) & (w[:, None] > 0), axis=0)
        out[l] = out[l] | dead[None, :]
        out[l + 1] = out[l + 1] | dead[:, None]
    return tuple(out)


def prune(params, state: ArdState, config: ArdConfig, *, use_upsilon: bool = True, dead=None):
    """Step 5 (dynamic pruning): drop weights with ``upsilon < kappa_upsilon`` (when ``use_upsilon``),
    ``|W| < kappa_w``, or flagged in ``dead`` (per layer booleans, :func:`dead_weights`; ``None`` for none).
    Masks only ever lose entries.

    Args:
        params: the network parameters, a tuple of :class:`Layer`.
        state: the current :class:`ArdState` (its ``masks`` and ``upsilon`` are read).
        config: the :class:`ArdConfig` holding the thresholds ``kappa_upsilon`` and ``kappa_w``.
        use_upsilon: also apply the variance threshold ``kappa_upsilon`` (Algorithm 1); ``False`` prunes by
            magnitude (and ``dead``) only.
        dead: per layer, boolean ``(n_in, n_out)`` arrays of weights to drop (:func:`dead_weights`), or ``None``.

    Returns:
        ``(masked params, state with the new masks)``: the weights multiplied by the new masks (biases
        unchanged), and the :class:`ArdState` holding those masks.
    """
    masks = []
    dead = (None,) * len(params) if dead is None else dead
    for p, m, u, d in zip(params, state.masks, state.upsilon, dead):
        keep = jnp.abs(p.W) >= config.kappa_w
        if use_upsilon:
            keep = keep & (u >= config.kappa_upsilon)
        if d is not None:
            keep = keep & ~d
        masks.append(m * keep.astype(m.dtype))
    params = tuple(Layer(p.W * m, p.b) for p, m in zip(params, masks))
    return params, state._replace(masks=tuple(masks))


def fraction_remaining(masks) -> jax.Array:
    """Fraction of weights kept (the paper's Table 2 "sparsity"), over all layers.

    Args:
        masks: per-layer 0/1 arrays (e.g. ``ArdState.masks``); every entry of every array counts.

    Returns:
        A scalar array in ``[0, 1]``: the kept entries divided by all entries.
    """
    return sum(jnp.sum(m) for m in masks) / sum(m.size for m in masks)


# ---------------------------------------------------------------------------
# Algorithm 1 as one compiled program
# ---------------------------------------------------------------------------

class ArdFit(NamedTuple):
    """One Algorithm 1 run (leading axis ``rounds``; with :func:`fit_repeats` a repeat axis before it).

    ``params`` and ``state`` after every round's pruning, ``train_mse`` after every round, ``loss`` (the
    training objective at every epoch, shape ``(rounds, epochs)``) and ``metrics`` (the user's ``evaluate``
    after every round)."""

    params: Any
    state: ArdState
    train_mse: jax.Array
    loss: jax.Array
    metrics: dict


def _schedule(config: ArdConfig):
    if config.schedule == "cosine":
        return optax.cosine_decay_schedule(config.learning_rate, config.rounds * config.epochs)
    return config.learning_rate


def _round_program(model: ArdMLP, config: ArdConfig, evaluate, Z, y, w, lam):
    """``(optimizer, one_round)``: ``one_round(carry) -> (carry, outputs)`` is one outer round of Algorithm 1
    (all its epochs as a ``lax.scan``, then the Hessian, the hyperparameter update, pruning and ``evaluate``);
    ``carry = (params, optimizer state, ArdState)``."""
    opt = optax.adam(_schedule(config))
    use_penalty = config.penalty != "none"

    def objective(p, st):
        data = _weighted_mse(model, p, Z, y, w)
        return data + lam * penalty(p, st, model, config) if use_penalty else data

    grad = jax.value_and_grad(objective)

    def epoch(carry, _):
        p, o, st = carry
        loss, g = grad(p, st)
        g = tuple(Layer(gl.W * m, gl.b) for gl, m in zip(g, st.masks))
        upd, o = opt.update(g, o, p)
        p = optax.apply_updates(p, upd)
        p = tuple(Layer(pl.W * m, pl.b) for pl, m in zip(p, st.masks))
        return (p, o, st), loss

    def one_round(carry):
        p, o, st = carry
        (p, o, st), losses = jax.lax.scan(epoch, (p, o, st), None, length=config.epochs)
        mse = _weighted_mse(model, p, Z, y, w)
        if config.noise_var is None:
            st = st._replace(sigma2=jnp.maximum(mse, 1e-12).astype(Z.dtype))
        else:
            st = st._replace(sigma2=jnp.asarray(config.noise_var, Z.dtype))
        bayes = config.reweight and config.penalty == "lasso"
        dead = None
        if bayes:
            H = layer_hessians(model, p, Z, y, w, st.sigma2, config.hessian)
            st = hyper_update(p, st, H, model, config)
            if config.prune_dead:
                dead = dead_weights(model, p, Z, w)
        if use_penalty:
            p, st = prune(p, st, config, use_upsilon=bayes, dead=dead)
        metrics = evaluate(p) if evaluate is not None else {}
        return (p, o, st), (p, st, mse, losses, metrics)

    return opt, one_round


def _run(model: ArdMLP, config: ArdConfig, evaluate, params, Z, y, w, lam):
    opt, one_round = _round_program(model, config, evaluate, Z, y, w, lam)
    carry = (params, opt.init(params), init_state(model, config, Z.dtype))
    _, (ps, sts, mses, losses, metrics) = jax.lax.scan(lambda c, _: one_round(c), carry, None, length=config.rounds)
    return ArdFit(ps, sts, mses, losses, metrics)


def _init_carry(model: ArdMLP, config: ArdConfig, params, Z):
    opt = optax.adam(_schedule(config))
    return params, opt.init(params), init_state(model, config, Z.dtype)


def _round(model: ArdMLP, config: ArdConfig, evaluate, carry, Z, y, w, lam):
    return _round_program(model, config, evaluate, Z, y, w, lam)[1](carry)


_init_repeats = jax.jit(jax.vmap(_init_carry, in_axes=(None, None, 0, None)), static_argnums=(0, 1))
_round_repeats = jax.jit(jax.vmap(_round, in_axes=(None, None, None, 0, None, None, 0, 0)), static_argnums=(0, 1, 2))


def _stack_rounds(outs) -> ArdFit:
    ps, sts, mses, losses, metrics = (jax.tree_util.tree_map(lambda *a: jnp.stack(a, axis=1), *parts)
                                      for parts in zip(*outs))
    return ArdFit(ps, sts, mses, losses, metrics)


def _check_data(Z, y, w, model, who):
    Z, y = jnp.asarray(Z), jnp.asarray(y)
    if Z.ndim != 2 or Z.shape[1] != model.sizes[0]:
        raise ValueError(f"{who}: Z must have shape (N, {model.sizes[0]}), got {Z.shape}")
    if y.shape != (Z.shape[0],):
        raise ValueError(f"{who}: y must have shape ({Z.shape[0]},), got {y.shape}")
    if not (bool(jnp.all(jnp.isfinite(Z))) and bool(jnp.all(jnp.isfinite(y)))):
        raise ValueError(f"{who}: Z and y must be finite (NaN or inf found)")
    if w is None:
        w = jnp.ones(y.shape, Z.dtype)
    w = jnp.asarray(w, Z.dtype)
    if w.shape[-1] != y.shape[0] or bool(jnp.any(w < 0)) or bool(jnp.any(jnp.sum(w, axis=-1) <= 0)):
        raise ValueError(f"{who}: sample weights must be >= 0 with a positive sum and last axis {y.shape[0]}, "
                         f"got shape {w.shape}")
    return Z, y.astype(Z.dtype), w


_run_jit = jax.jit(_run, static_argnums=(0, 1, 2))
_run_repeats = jax.jit(jax.vmap(_run, in_axes=(None, None, None, 0, None, None, 0, 0)), static_argnums=(0, 1, 2))


def fit(model: ArdMLP, key, Z, y, config: ArdConfig = DEFAULT_CONFIG, *, lam: float = 1e-3, weights=None,
        params=None, evaluate: Callable | None = None) -> ArdFit:
    """Algorithm 1 (or a conventional baseline, per ``config``) from ``model.init(key)``, as one compiled
    program.

    Args:
      model: an :class:`ArdMLP`.
      key: PRNG key of the initial weights (ignored when ``params`` is given).
      Z: regressors ``(N, d)`` (e.g. from :func:`narx_regressors`).
      y: targets ``(N,)`` (e.g. from :func:`narx_regressors`).
      config: :class:`ArdConfig`.
      lam: the penalty weight ``lambda`` (Eq. 15).
      weights: optional sample weights ``(N,)`` (0/1 selects a training subset without changing shapes).
      params: optional initial weights (default ``model.init(key)``).
      evaluate: optional ``params -> dict of scalars`` run after every round inside the program (validation
        RMSE, free-run RMSE, ...); pass the same function object to reuse the compiled program.
    Returns: :class:`ArdFit` with a leading ``rounds`` axis.
    """
    config.check(model)
    Z, y, w = _check_data(Z, y, weights, model, "fit")
    if w.ndim != 1:
        raise ValueError(f"fit: weights must have shape ({y.shape[0]},), got {w.shape}")
    params = model.init(key, Z.dtype) if params is None else params
    return _run_jit(model, config, evaluate, params, Z, y, w, jnp.asarray(lam, Z.dtype))


def fit_repeats(model: ArdMLP, keys, Z, y, config: ArdConfig = DEFAULT_CONFIG, *, lam=1e-3, weights=None,
                evaluate: Callable | None = None, fused: bool = True, progress: Callable | None = None,
                vectorize: bool = True) -> ArdFit:
    """:func:`fit` for many repeats at once (one ``vmap``-ed program): ``keys`` ``(R, 2)`` initial-weight keys,
    ``lam`` a scalar or ``(R,)`` (a lambda grid is a repeat axis), ``weights`` ``None``, ``(N,)`` or ``(R, N)``
    (random training subsets). Returns :class:`ArdFit` with leading axes ``(R, rounds)``.

    ``fused=True`` runs all rounds in one compiled program; ``fused=False`` compiles one round (all repeats) and
    calls it ``rounds`` times from Python, reporting each to ``progress(round, ArdFit-so-far)`` -- the same
    numbers (``tests/test_ard.py``). On XLA's CPU runtime (JAX 0.10.2) the vmapped program of the larger networks
    stalls at random, fused or round by round: the batched LAPACK Cholesky (``ParallelBatchMap``) waits on sub-tasks
    queued on the pool its own threads occupy (gdb); ``--xla_cpu_multi_thread_eigen=false`` does not prevent it.
    ``vectorize=False`` runs the repeats one after another through the single-repeat program of :func:`fit`
    (same numbers; ``progress(repeat, None)`` after each), the fallback when the vmapped program stalls.

    Args:
        model: an :class:`ArdMLP`.
        keys: PRNG keys ``(R, 2)``, one per repeat (its initial weights ``model.init(key)``).
        Z: regressors ``(N, d)``, shared by all repeats.
        y: targets ``(N,)``, shared by all repeats.
        config: the :class:`ArdConfig` of every repeat.
        lam: the penalty weight ``lambda`` (Eq. 15), a scalar or ``(R,)``.
        weights: sample weights ``None`` (all ones), ``(N,)`` (every repeat) or ``(R, N)`` (one row per repeat).
        evaluate: optional ``params -> dict of scalars`` run after every round (as in :func:`fit`).
        fused: all rounds in one compiled program (``True``) or one compiled round called from Python.
        progress: optional callback, called as described above (``fused=False`` or ``vectorize=False`` only).
        vectorize: ``vmap`` the repeats (``True``) or run them one after another.

    Returns:
        :class:`ArdFit` with leading axes ``(R, rounds)``.

    Raises:
        ValueError: an invalid ``config`` or data (shapes, NaN/inf, negative weights), named.
    """
    config.check(model)
    keys = jnp.asarray(keys)
    R = keys.shape[0]
    Z, y, w = _check_data(Z, y, weights, model, "fit_repeats")
    w = jnp.broadcast_to(w, (R, y.shape[0]))
    lam = jnp.broadcast_to(jnp.asarray(lam, Z.dtype), (R,))
    params = jax.vmap(lambda k: model.init(k, Z.dtype))(keys)
    if not vectorize:
        outs = []
        for r in range(R):
            p = jax.tree_util.tree_map(lambda a: a[r], params)
            outs.append(jax.block_until_ready(_run_jit(model, config, evaluate, p, Z, y, w[r], lam[r])))
            if progress is not None:
                progress(r, None)
        return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *outs)
    if fused:
        return _run_repeats(model, config, evaluate, params, Z, y, w, lam)
    carry, outs = _init_repeats(model, config, params, Z), []
    for t in range(config.rounds):
        carry, out = _round_repeats(model, config, evaluate, carry, Z, y, w, lam)
        jax.block_until_ready(out)
        outs.append(out)
        if progress is not None:
            progress(t, _stack_rounds(outs))
    return _stack_rounds(outs)


def select_round(result: ArdFit, score, r: int | None = None):
    """The parameters, state and index of the round with the lowest ``score`` (``(rounds,)``; or ``(R, rounds)``
    with ``r`` the repeat). Model selection belongs on validation scores, never on the test record.

    Args:
        result: an :class:`ArdFit` from :func:`fit` (leading axis ``rounds``) or :func:`fit_repeats` (leading
            axes ``(R, rounds)``).
        score: the per-round scores, lower is better; NaN entries are skipped.
        r: the repeat to pick from a :func:`fit_repeats` result; ``None`` for a :func:`fit` result.

    Returns:
        ``(params, state, best)``: the network parameters and :class:`ArdState` after round ``best``, and
        ``best`` (an int).
    """
    s = np.asarray(score if r is None else score[r])
    best = int(np.nanargmin(s))
    pick = (lambda a: a[best]) if r is None else (lambda a: a[r, best])
    return jax.tree_util.tree_map(pick, result.params), jax.tree_util.tree_map(pick, result.state), best


# ---------------------------------------------------------------------------
# Laplace posterior (Eq. 22) and predictive sampling
# ---------------------------------------------------------------------------

class LaplacePosterior(NamedTuple):
    """A Gaussian ``N(W*, Sigma)`` over the kept weights, mean at the trained weights (the Newton step of Eq. 22a
    is zero at an optimum); pruned weights have zero variance and biases are held at their trained values.

    ``structure="layer"`` (Eq. 22b): one independent Gaussian per layer, ``Sigma_l = (H_l + Upsilon_l^{-1})^{-1}``
    with ``H_l`` that layer's Hessian block; ``factors`` per layer a matrix ``F`` with ``F F^T`` the covariance of
    the row-major vectorised weights (dense Hessians), or the ``(n_in, n_out)`` standard deviations (diagonal).
    ``structure="network"``: one Gaussian over all layers' weights at once (concatenated in layer order, each
    row-major), ``Sigma = (G + Upsilon^{-1})^{-1}`` with ``G = J^T diag(w) J / sigma^2`` the Gauss-Newton matrix of
    the whole network; ``factors`` is a 1-tuple holding its ``F``. ``structure`` is read off the factors (one
    factor for several layers), so that the posterior is a pytree of arrays only (``jit``/``vmap`` take it); for a
    one-layer network the two structures coincide.

    Attributes:
        mean: the trained network parameters ``W*`` (with its biases), a tuple of :class:`Layer`.
        factors: the covariance factors described above (one per layer, or a 1-tuple for ``"network"``).
        masks: per layer, the 0/1 ``(n_in, n_out)`` weight masks; sampled weights are multiplied by them.
    """

    mean: tuple
    factors: tuple
    masks: tuple

    @property
    def structure(self) -> str:
        return "network" if len(self.factors) == 1 and len(self.mean) > 1 else "layer"


def _scaled_factor(v, H):
    """``F`` with ``F F^T = (H + diag(1/v))^{-1}`` for variances ``v >= 0`` (zero: the weight is fixed), via
    ``S (I + S H S)^{-1} S``, ``S = diag(sqrt(v))`` -- finite however small ``v`` gets; ``H`` is clamped to PSD."""
    s = jnp.sqrt(v)
    lam, U = jnp.linalg.eigh(jnp.eye(s.size, dtype=H.dtype) + s[:, None] * _clamp_psd(H) * s[None, :])
    return s[:, None] * U / jnp.sqrt(lam)[None, :]


def laplace(model: ArdMLP, params, state: ArdState, Z, y, *, weights=None, hessian: str = "exact",
            structure: str = "layer") -> LaplacePosterior:
    """The Laplace posterior at ``params`` with the prior variances ``state.upsilon`` (zero for pruned weights)
    and noise ``state.sigma2``. ``structure="layer"`` is the paper's per-layer posterior (Eq. 22) with ``hessian``
    one of :data:`HESSIANS`; ``structure="network"`` the joint posterior of all layers with the network's
    Gauss-Newton matrix (``hessian`` must be ``"gauss-newton"``; see :class:`LaplacePosterior`). Drawing the
    per-layer posteriors independently ignores how the layers' weights co-vary, which widens sampled free runs;
    the network posterior keeps those correlations (RESULTS.md section 4).

    Args:
        model: the :class:`ArdMLP`.
        params: the trained network parameters (the posterior mean), a tuple of :class:`Layer`.
        state: the :class:`ArdState` of the trained network (``upsilon``, ``masks`` and ``sigma2`` are used).
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        weights: optional sample weights ``(N,)`` of the data term (default all ones).
        hessian: one of :data:`HESSIANS` (``structure="layer"``); ``"gauss-newton"`` for ``"network"``.
        structure: ``"layer"`` or ``"network"``.

    Returns:
        The :class:`LaplacePosterior`.

    Raises:
        ValueError: invalid data, an unknown ``structure`` or ``hessian``, or ``structure="network"`` with a
            ``hessian`` other than ``"gauss-newton"``.
    """
    Z, y, w = _check_data(Z, y, weights, model, "laplace")
    if structure not in ("layer", "network"):
        raise ValueError(f"laplace: structure must be 'layer' or 'network', got {structure!r}")
    if structure == "network":
        if hessian != "gauss-newton":
            raise ValueError(f"laplace: structure='network' uses the network's Gauss-Newton matrix; pass "
                             f"hessian='gauss-newton' (got {hessian!r})")
        return _joint_laplace(params, state, lambda p: model.apply(p, Z), w, state.sigma2)
    if hessian not in HESSIANS:
        raise ValueError(f"laplace: unknown hessian {hessian!r}; choose from {HESSIANS}")
    H = layer_hessians(model, params, Z, y, w, state.sigma2, hessian)
    factors = []
    for Hl, u, m in zip(H, state.upsilon, state.masks):
        v = u * m
        if hessian == "diagonal":
            factors.append(jnp.sqrt(v / (1.0 + v * jnp.clip(Hl, 0.0, None))))
        else:
            factors.append(_scaled_factor(v.ravel(), Hl))
    return LaplacePosterior(tuple(params), tuple(factors), tuple(state.masks))


def _flat_weights(params):
    """All layers' weights concatenated, each row-major (the coordinates of the joint Laplace posterior)."""
    return jnp.concatenate([p.W.ravel() for p in params])


def _with_flat_weights(params, vec, scale=None):
    """``params`` with the weights replaced by the flat vector ``vec`` (:func:`_flat_weights`' layout), each
    layer's weights multiplied by ``scale[l]`` when given (masks); biases kept."""
    parts = jnp.split(vec, np.cumsum([p.W.size for p in params])[:-1])
    scale = (1.0,) * len(params) if scale is None else scale
    return tuple(Layer(v.reshape(p.W.shape) * sc, p.b) for v, p, sc in zip(parts, params, scale))


def _joint_laplace(params, state: ArdState, outputs: Callable, w, sigma2) -> LaplacePosterior:
    """``N(W*, (J^T diag(w) J / sigma2 + Upsilon^{-1})^{-1})`` over all layers' weights, ``J`` the Jacobian of
    ``outputs(params) -> (T,)`` with respect to the concatenated row-major weights (biases held fixed)."""
    J = jax.jacfwd(lambda vec: outputs(_with_flat_weights(params, vec)))(_flat_weights(params))
    G = (J * w[:, None]).T @ J / sigma2
    v = jnp.concatenate([(u * m).ravel() for u, m in zip(state.upsilon, state.masks)])
    return LaplacePosterior(tuple(params), (_scaled_factor(v, G),), tuple(state.masks))


def laplace_simulation(model: ArdMLP, params, state: ArdState, u, y, n_a: int, n_b: int | None = None, *,
                       sigma2=None) -> LaplacePosterior:
    """Our addition: the joint Laplace posterior of the *output-error* (free-run) model ``y(t) = sim_t(u; W) + e``,
    ``e ~ N(0, sigma2)``, for a network fine-tuned on its simulation error (:func:`finetune_simulation`):
    ``N(W*, (J^T J / sigma2 + Upsilon^{-1})^{-1})`` with ``J`` the Jacobian of the free run over the record
    ``(u, y)`` (after its ``max(n_a, n_b)`` measured start) through the ``lax.scan`` of :func:`simulate`, and
    ``sigma2`` by default the free run's MSE there. The one-step posterior (:func:`laplace`) constrains only the
    directions the one-step predictions see; the free run also depends on directions they leave at their prior
    variance, so its sampled free runs spread far wider than the errors of the free run itself.

    Args:
        model: the :class:`ArdMLP`.
        params: the fine-tuned network parameters (the posterior mean), a tuple of :class:`Layer`.
        state: an :class:`ArdState` whose ``upsilon`` and ``masks`` give the prior variances (zero for pruned
            weights); its ``sigma2`` is not used.
        u: the input record ``(T,)``.
        y: the measured output record ``(T,)``.
        n_a: the input lag (>= 0).
        n_b: the output lag (>= 1, default ``n_a``).
        sigma2: the noise variance of the free run; ``None`` takes the free run's MSE after the first
            ``max(n_a, n_b)`` samples.

    Returns:
        The :class:`LaplacePosterior` with a single factor over all layers' weights (the ``"network"``
        structure when the network has several layers).

    Raises:
        ValueError: ``sigma2`` is not positive and finite.
    """
    n_b = n_a if n_b is None else n_b
    m = max(n_a, n_b)
    u, y = jnp.asarray(u), jnp.asarray(y)
    if sigma2 is None:
        sigma2 = jnp.mean((simulate(model, params, u, y, n_a, n_b)[m:] - y[m:]) ** 2)
    sigma2 = check_positive(sigma2, "sigma2", "laplace_simulation")
    return _joint_laplace(params, state, lambda p: simulate(model, p, u, y, n_a, n_b)[m:],
                          jnp.ones(y.shape[0] - m, y.dtype), sigma2)


def sample_laplace(key, post: LaplacePosterior, num_samples: int):
    """``num_samples`` parameter draws from :class:`LaplacePosterior` (stacked on a leading axis).

    Args:
        key: PRNG key.
        post: the :class:`LaplacePosterior` to draw from (either structure).
        num_samples: the number of draws.

    Returns:
        A tuple of :class:`Layer` whose arrays have a leading axis ``num_samples``: the drawn weights (pruned
        weights are zero) and the posterior mean's biases.
    """
    if post.structure == "network":
        (F,) = post.factors
        flat = _flat_weights(post.mean)

        def joint(k):
            return _with_flat_weights(post.mean, flat + F @ jax.random.normal(k, (F.shape[1],), F.dtype), post.masks)
        return jax.vmap(joint)(jax.random.split(key, num_samples))

    def one(k):
        out = []
        for kk, p, F, m in zip(jax.random.split(k, len(post.mean)), post.mean, post.factors, post.masks):
            if F.shape == p.W.shape:
                W = p.W + F * jax.random.normal(kk, p.W.shape, p.W.dtype)
            else:
                W = p.W + (F @ jax.random.normal(kk, (F.shape[1],), p.W.dtype)).reshape(p.W.shape)
            out.append(Layer(W * m, p.b))
        return tuple(out)
    return jax.vmap(one)(jax.random.split(key, num_samples))


def linearised_predictive(post: LaplacePosterior, fn: Callable):
    """The predictive of ``fn(params) -> (T,)`` (one-step outputs, a free run, ...) under the Laplace posterior
    *linearised* at its mean, ``fn(W) ~ fn(W*) + J (W - W*)``: returns ``(fn(W*), std (T,))`` with
    ``std_t^2 = [J Sigma J^T]_tt`` (parameter uncertainty only; add the noise variance for a band of
    observations). Where ``fn`` is strongly non-linear in the weights -- a free run near the edge of stability --
    sampled weights (:func:`sample_laplace`) can leave the region where the Gaussian is meaningful and diverge;
    the linearised predictive (the GLM predictive of the linearised network) stays in it.

    Args:
        post: the :class:`LaplacePosterior` (either structure).
        fn: a function of the network parameters (a tuple of :class:`Layer`) returning a ``(T,)`` array,
            differentiable in the weights.

    Returns:
        ``(fn(W*), std)``: the prediction at the posterior mean and its standard deviation, both ``(T,)``.
    """
    mean = fn(tuple(post.mean))
    if post.structure == "network":
        (F,) = post.factors
        JF = jax.jacfwd(lambda vec: fn(_with_flat_weights(post.mean, vec)))(_flat_weights(post.mean)) @ F
        return mean, jnp.sqrt(jnp.sum(JF * JF, axis=1))
    var = jnp.zeros_like(mean)
    for l, (p, F) in enumerate(zip(post.mean, post.factors)):
        def g(W, l=l):
            ps = list(post.mean)
            ps[l] = Layer(W, ps[l].b)
            return fn(tuple(ps))
        J = jax.jacfwd(g)(p.W).reshape(mean.shape[0], -1)
        JF = J * F.ravel()[None, :] if F.shape == p.W.shape else J @ F
        var = var + jnp.sum(JF * JF, axis=1)
    return mean, jnp.sqrt(var)


# ---------------------------------------------------------------------------
# free-run simulation
# ---------------------------------------------------------------------------

def simulate(model: ArdMLP, params, u, y, n_a: int, n_b: int | None = None, *, feedback: str = "model"):
    """Simulated output over a record: the first ``m = max(n_a, n_b)`` outputs are the measured ones, every later
    ``y(t)`` is ``Net(z(t))`` with the past outputs in ``z(t)`` taken from the simulation (``feedback="model"``,
    free run, a ``lax.scan``) or from ``y`` (``feedback="measured"``: the one-step-ahead predictor). The input
    ``u`` is always the measured one.

    Args:
        model: the :class:`ArdMLP`.
        params: the network parameters, a tuple of :class:`Layer`.
        u: the input record ``(T,)``.
        y: the measured output record ``(T,)`` (its first ``m`` samples start the simulation).
        n_a: the input lag (>= 0).
        n_b: the output lag (>= 1, default ``n_a``).
        feedback: ``"model"`` (free run) or ``"measured"`` (one-step-ahead prediction).

    Returns:
        The simulated output ``(T,)``.

    Raises:
        ValueError: an unknown ``feedback``, or ``u`` and ``y`` not 1-D records of equal length ``> m``.
    """
    n_b = n_a if n_b is None else n_b
    u, y = jnp.asarray(u), jnp.asarray(y)
    m = max(n_a, n_b)
    if feedback == "measured":
        Z, _ = narx_regressors(u, y, n_a, n_b)
        return jnp.concatenate([y[:m], model.apply(params, Z)])
    if feedback != "model":
        raise ValueError(f"simulate: feedback must be 'model' or 'measured', got {feedback!r}")
    if u.ndim != 1 or y.shape != u.shape or u.shape[0] <= m:
        raise ValueError(f"simulate: u and y must be 1-D of equal length > {m}, got {u.shape} and {y.shape}")

    def step(buf, t):
        z = jnp.concatenate([jax.lax.dynamic_slice(u, (t - n_a,), (n_a + 1,)), buf])
        yt = model.apply(params, z[None])[0]
        return jnp.concatenate([buf[1:], yt[None]]), yt

    _, ys = jax.lax.scan(step, y[m - n_b:m], jnp.arange(m, u.shape[0]))
    return jnp.concatenate([y[:m], ys])


def simulation_rmse(y_sim, y, m: int, *, include_initial: bool = True):
    """RMSE of a simulated record over all samples (the paper's Eq. 17 divides by the record length, the first
    ``m`` samples being measured) or only over ``t >= m``.

    Args:
        y_sim: the simulated output ``(..., T)`` (leading axes, e.g. posterior draws, are kept).
        y: the measured output ``(T,)`` (broadcast against ``y_sim``).
        m: the number of measured initial samples, ``max(n_a, n_b)``.
        include_initial: average over the whole record (``True``, Eq. 17) or over ``t >= m`` only.

    Returns:
        The RMSE over the last axis, shape ``(...)``.
    """
    r = jnp.asarray(y_sim) - jnp.asarray(y)
    if not include_initial:
        r = r[..., m:]
    return jnp.sqrt(jnp.mean(r * r, axis=-1))


def finetune_simulation(model: ArdMLP, params, masks, u, y, n_a: int, n_b: int | None = None, *,
                        epochs: int = 500, learning_rate: float = 1e-3, windows: int | None = None,
                        window_length: int | None = None, key=None, clip_norm: float | None = 1.0,
                        keep_best: bool = True):
    """Our addition: fine-tune a one-step-trained network on the free-run (simulation) error of the record
    ``(u, y)``, the gradient taken through the ``lax.scan`` of :func:`simulate`; pruned weights stay pruned.
    With ``windows``/``window_length`` the loss averages free runs over that many random sub-records (started
    from measured outputs) instead of the whole record, which keeps the gradient of a long unstable run in check.

    The gradient of a long free run can explode when the recursion passes near instability: ``clip_norm`` clips
    its global norm before Adam (``None``: no clipping), and ``keep_best`` returns the parameters with the lowest
    loss seen on this record (the loss is evaluated before every update; the record is the training record, so
    this is a choice on training data only).

    Args:
        model: the :class:`ArdMLP`.
        params: the one-step-trained network parameters to start from, a tuple of :class:`Layer`.
        masks: per layer, the 0/1 ``(n_in, n_out)`` weight masks; gradients and updated weights are multiplied by
            them.
        u: the input record ``(T,)``.
        y: the measured output record ``(T,)``.
        n_a: the input lag (>= 0).
        n_b: the output lag (>= 1, default ``n_a``).
        epochs: the number of Adam updates.
        learning_rate: Adam's initial learning rate, cosine-decayed to 0 over ``epochs``.
        windows: the number of random sub-records per epoch; ``None`` uses the whole record.
        window_length: the length of every sub-record, ``max(n_a, n_b) < window_length <= T`` (needed with
            ``windows``).
        key: PRNG key of the sub-record starts (default ``PRNGKey(0)`` when ``windows`` is given).
        clip_norm: the global gradient norm to clip to, or ``None``.
        keep_best: return the parameters of the lowest loss seen (``True``) or those after the last update.

    Returns:
        ``(params, losses (epochs,))``: the fine-tuned parameters and the free-run MSE before every update.

    Raises:
        ValueError: a ``clip_norm`` that is not positive, or ``window_length`` outside its range.
    """
    n_b = n_a if n_b is None else n_b
    m = max(n_a, n_b)
    u, y = jnp.asarray(u), jnp.asarray(y)
    if clip_norm is not None:
        check_positive(clip_norm, "clip_norm", "finetune_simulation")
    adam = optax.adam(optax.cosine_decay_schedule(learning_rate, epochs))
    opt = adam if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adam)
    T = u.shape[0]
    if windows is not None:
        if window_length is None or not (m < window_length <= T):
            raise ValueError(f"finetune_simulation: window_length must be in ({m}, {T}], got {window_length}")
        key = jax.random.PRNGKey(0) if key is None else key

    def loss_fn(p, k):
        if windows is None:
            r = simulate(model, p, u, y, n_a, n_b)[m:] - y[m:]
            return jnp.mean(r * r)
        starts = jax.random.randint(k, (windows,), 0, T - window_length + 1)

        def one(s):
            us = jax.lax.dynamic_slice(u, (s,), (window_length,))
            ysl = jax.lax.dynamic_slice(y, (s,), (window_length,))
            r = simulate(model, p, us, ysl, n_a, n_b)[m:] - ysl[m:]
            return jnp.mean(r * r)
        return jnp.mean(jax.vmap(one)(starts))

    @jax.jit
    def train(p):
        def step(carry, e):
            p, o, best, best_loss = carry
            k = jax.random.fold_in(key, e) if key is not None else None
            loss, g = jax.value_and_grad(loss_fn)(p, k)
            better = jnp.isfinite(loss) & (loss < best_loss)
            best = jax.tree_util.tree_map(lambda a, b: jnp.where(better, a, b), p, best)
            best_loss = jnp.where(better, loss, best_loss)
            g = tuple(Layer(gl.W * mm, gl.b) for gl, mm in zip(g, masks))
            upd, o = opt.update(g, o, p)
            p = optax.apply_updates(p, upd)
            return (tuple(Layer(pl.W * mm, pl.b) for pl, mm in zip(p, masks)), o, best, best_loss), loss
        init = (p, opt.init(p), p, jnp.asarray(jnp.inf, u.dtype))
        (p, _, best, _), losses = jax.lax.scan(step, init, jnp.arange(epochs))
        return (best if keep_best else p), losses
    return train(tuple(params))


# ---------------------------------------------------------------------------
# ARD log density for HMC (samplers.ard drives it)
# ---------------------------------------------------------------------------

def position_to_params(position, model: ArdMLP, group: str, block=(2, 2), fixed_variances=None):
    """Network parameters from an HMC position (non-centred: ``W = sqrt(upsilon) * z``, ``upsilon`` the combined
    per-weight variance of the groupings' ``exp(log_var)``, or ``fixed_variances`` per layer).

    Args:
        position: a dict with ``"layers"`` (per layer ``{"z": (n_in, n_out), "b": (n_out,)}``) and, unless
            ``fixed_variances`` is given, ``"log_var"`` (per layer, per grouping, ``(num_groups,)``).
        model: the :class:`ArdMLP`.
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` variance used instead of ``"log_var"``, or
            ``None``.

    Returns:
        ``(params, per-layer upsilon)``: a tuple of :class:`Layer` and the per-weight variances
        ``(n_in, n_out)`` per layer.
    """
    out, ups = [], []
    for l, shape in enumerate(model.shapes):
        layer = position["layers"][l]
        if fixed_variances is not None:
            v = jnp.broadcast_to(jnp.asarray(fixed_variances[l], layer["z"].dtype), shape)
        else:
            lg = groupings(shape, group, block)
            v = _combine([jnp.exp(lv)[jnp.asarray(g.ids)] for lv, g in zip(position["log_var"][l], lg)])
        out.append(Layer(jnp.sqrt(v) * layer["z"], layer["b"]))
        ups.append(v)
    return tuple(out), tuple(ups)


def init_position(key, model: ArdMLP, group: str, block=(2, 2), fixed_variances=None, params=None):
    """A starting HMC position: ``log_var = 0`` (every group variance 1), zero biases and standard-normal ``z``;
    or, from ``params`` (e.g. Algorithm 1's weights), ``z = W / sqrt(upsilon_0)`` with ``upsilon_0`` the starting
    combined variance (1/2 for ``"row+column"``, or ``fixed_variances``) and the given biases, so that
    :func:`position_to_params` returns ``params`` exactly.

    Args:
        key: PRNG key of the standard-normal ``z`` (not used when ``params`` is given).
        model: the :class:`ArdMLP`.
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` fixed variance (the position then has no
            ``"log_var"``), or ``None``.
        params: optional network parameters (a tuple of :class:`Layer`) to start from.

    Returns:
        The position: a dict with ``"layers"`` (per layer ``{"z", "b"}``) and, unless ``fixed_variances`` is
        given, ``"log_var"`` (per layer, per grouping, zeros of shape ``(num_groups,)``).
    """
    layers = []
    keys = jax.random.split(key, len(model.shapes))
    pos = {}
    if fixed_variances is None:
        pos["log_var"] = tuple(tuple(jnp.zeros(g.num) for g in groupings(s, group, block)) for s in model.shapes)
    for l, (k, shape) in enumerate(zip(keys, model.shapes)):
        if params is None:
            layers.append({"z": jax.random.normal(k, shape), "b": jnp.zeros(shape[1])})
            continue
        W = jnp.asarray(params[l].W)
        if fixed_variances is not None:
            v0 = jnp.broadcast_to(jnp.asarray(fixed_variances[l], W.dtype), shape)
        else:
            v0 = _combine([jnp.ones(shape, W.dtype) for _ in groupings(shape, group, block)])
        layers.append({"z": W / jnp.sqrt(v0), "b": jnp.asarray(params[l].b)})
    pos["layers"] = tuple(layers)
    return pos


def log_density(model: ArdMLP, Z, y, sigma2: float, *, group: str = "row+column", block=(2, 2),
                hyper=(1.0, 1e-2), bias_var: float = 1.0, fixed_variances=None) -> Callable:
    """The log posterior of the ARD / group-ARD network for HMC, in the non-centred parameterisation of
    :func:`position_to_params`:

        log N(y | Net(Z; W, b), sigma^2 I) + sum log N(z | 0, 1) + sum log N(b | 0, bias_var)
        + sum_groups [log InvGamma(Upsilon_g | a, b) + log Upsilon_g]        (the last term: d Upsilon / d log)

    ``hyper = (a, b)`` the inverse-gamma hyper-prior on every group variance (a proper version of the paper's
    flat Gamma(0, 0) hyper-prior, which has no normalisable posterior); ``fixed_variances`` (per layer, scalar or
    ``(n_in, n_out)``) drops the hyper-prior and fixes the variances (the Gaussian linear model of the tests).

    Args:
        model: the :class:`ArdMLP`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        sigma2: the noise variance ``sigma^2`` (positive, held fixed).
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        hyper: ``(a, b)`` of the inverse-gamma hyper-prior, both positive.
        bias_var: the prior variance of every bias (positive).
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` fixed variance, or ``None``.

    Returns:
        The log density, a function ``position -> scalar`` (positions as in :func:`position_to_params`).

    Raises:
        ValueError: a ``sigma2``, ``bias_var`` or ``hyper`` entry that is not positive, or an unknown ``group``.
    """
    Z, y = jnp.asarray(Z), jnp.asarray(y)
    sigma2 = check_positive(sigma2, "sigma2", "log_density")
    bias_var = check_positive(bias_var, "bias_var", "log_density")
    a0 = check_positive(hyper[0], "hyper[0]", "log_density")
    b0 = check_positive(hyper[1], "hyper[1]", "log_density")
    if group not in GROUPS:
        raise ValueError(f"log_density: unknown group {group!r}; choose from {GROUPS}")
    n = y.shape[0]
    const = -0.5 * n * math.log(2 * math.pi * sigma2)

    def logp(position):
        params, _ = position_to_params(position, model, group, block, fixed_variances)
        r = model.apply(params, Z) - y
        lp = const - 0.5 * jnp.sum(r * r) / sigma2
        for layer in position["layers"]:
            lp = lp - 0.5 * jnp.sum(layer["z"] ** 2) - 0.5 * jnp.sum(layer["b"] ** 2) / bias_var
        if fixed_variances is None:
            for lvs in position["log_var"]:
                for lv in lvs:
                    # InvGamma(v | a, b) v = b^a / Gamma(a) v^{-a} exp(-b / v)   (density times the Jacobian)
                    lp = lp + jnp.sum(a0 * math.log(b0) - math.lgamma(a0) - a0 * lv - b0 * jnp.exp(-lv))
        return lp
    return logp
