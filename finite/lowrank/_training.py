"""Training: `fit` (the per-datum negative ELBO with optax, KL weight and warm-up schedule, paper Eq. 1, App.
I.1), `linear_warmup`, deep ensembles trained in parallel under ``vmap`` (`init_ensemble`, `fit_ensemble`,
`ensemble_apply`) and `FitResult`. The epoch is one compiled ``lax.scan``, cached per configuration.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from finite.lowrank._meanfield import DEFAULT_PRIOR
from finite.lowrank._networks import _Network
from finite.lowrank._validation import _check_choice, _check_int, _check_pos

__all__ = ["FitResult", "linear_warmup", "fit", "fit_ensemble", "init_ensemble", "ensemble_apply"]


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
