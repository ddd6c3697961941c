"""Algorithm 1 (re-weighted group lasso with Laplace-evidence hyperparameter updates and dynamic pruning) as one
compiled program: the hyperparameter update of Eqs. 11-13 (`hyper_update`), the pruning (`dead_weights`, `prune`,
`fraction_remaining`), the round, `fit`, `fit_repeats` (repeats under ``vmap``), `ArdFit` and `select_round`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from finite.ard._hessians import _gershgorin_psd, layer_hessians
from finite.ard._network import ArdMLP, Layer, _check_data
from finite.ard._prior import (
    DEFAULT_CONFIG,
    ArdConfig,
    ArdState,
    _combine,
    _group_norms,
    _layer_groupings,
    group_sum,
    init_state,
    penalty,
)

__all__ = [
    "hyper_update", "dead_weights", "prune", "ArdFit", "fit", "fit_repeats", "select_round", "fraction_remaining",
]


def _weighted_mse(model, params, Z, y, w):
    r = model.apply(params, Z) - y
    return jnp.sum(w * r * r) / jnp.sum(w)


def _shrink(upsilon, H, psd: bool = True):
    """``upsilon_w - C_ww`` with ``C = (diag(1/upsilon) + H)^{-1}`` in the scaled form (the `finite.ard` docstring), and
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


def hyper_update(params, state: ArdState, hessians, model: ArdMLP, config: ArdConfig) -> ArdState:
    """Steps 3-4 of a round (Eqs. 11-13, Table 1; the `finite.ard` docstring): the new variances ``Upsilon(t+1) =
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
