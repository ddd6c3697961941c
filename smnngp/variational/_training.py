"""Training: `fit` maximises the ELBO with optax (one jitted ``lax.scan`` per round of steps, minibatches without
replacement, plateau reduction and early stopping on the validation NLL, optionally data-parallel over devices) and
returns a `FitResult`.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from smnngp import _optim, linalg
from smnngp.variational._elbo import _check_x, _ell, kl_divergence
from smnngp.variational._likelihoods import Gaussian
from smnngp.variational._model import Model, Params, _positive_int, _strong
from smnngp.variational._posterior import VariationalPosterior, as_posterior
from smnngp.variational._predict import _class_probs_jit, _gaussian_predictive

__all__ = ["fit", "FitResult"]


class FitResult(NamedTuple):
    """What :func:`fit` returns: the kept ``params`` (best validation NLL, else the last), the matching
    ``posterior`` (its ``log_marginal_likelihood`` the full-data ELBO), ``history`` (one dict per evaluation:
    ``step``, ``loss`` = mean of ``-ELBO / N`` over the steps since the last evaluation, ``val_nll``, ``lr_scale``,
    ``time``), ``best_step`` and ``best_val_nll`` (NaN without validation data)."""

    params: Params
    posterior: VariationalPosterior
    history: list
    best_step: int
    best_val_nll: float


def _trainable_mask(model, params):
    lik = model.likelihood
    return Params(
        inducing=jax.tree_util.tree_map(lambda _: model.train_inducing, params.inducing),
        q_mean=True,
        q_scale=True,
        kernel=jax.tree_util.tree_map(lambda _: model.train_kernel, params.kernel),
        likelihood=jax.tree_util.tree_map(lambda _: isinstance(lik, Gaussian) and lik.trainable, params.likelihood),
        scale=jax.tree_util.tree_map(lambda _: True, params.scale),
    )


def _mask(mask, tree):
    return jax.tree_util.tree_map(lambda m, t: t if m else jnp.zeros_like(t), mask, tree)


def _gaussian_nll(model, params, x, y, key, num_samples):
    p = _gaussian_predictive(model, params, x, key, num_samples, True)
    return -jnp.mean(jnp.sum(p.log_prob(y), axis=-1))


_gaussian_nll_jit = jax.jit(_gaussian_nll, static_argnums=(0, 5))


def _val_nll(model, params, x, y, key, num_samples) -> float:
    """Mean negative log predictive density of (x, y) under :func:`predict` (the validation NLL)."""
    if isinstance(model.likelihood, Gaussian):
        return float(_gaussian_nll_jit(model, params, x, y, key, num_samples))
    probs = np.asarray(_class_probs_jit(model, params, x, key, num_samples))
    py = probs[np.arange(probs.shape[0]), np.asarray(y)]
    return float(-np.mean(np.log(np.maximum(py, np.finfo(probs.dtype).tiny))))


def _resolve_devices(devices):
    if devices is None:
        devices = jax.local_devices()
    devices = list(devices)
    if not devices:
        raise ValueError("devices is empty")
    return devices


@functools.lru_cache(maxsize=32)
def _adam(learning_rate):
    return optax.adam(learning_rate)


@functools.lru_cache(maxsize=32)
def _make_round(model, optimizer, num_data, mesh, length):
    """One jitted call running ``length`` optimisation steps in a ``lax.scan`` (steps past ``stop`` are no-ops)."""
    batch_sharding = None if mesh is None else NamedSharding(mesh, PartitionSpec("data"))

    def loss_fn(params, key, xb, yb):
        return -(num_data / xb.shape[0] * jnp.sum(_ell(model, params, xb, yb, key))
                 - kl_divergence(model, params)) / num_data

    def run(params, opt_state, lr_scale, key, first_step, stop, idx, x, y):
        mask = _trainable_mask(model, params)

        def body(carry, inp):
            params, opt_state, dead = carry
            t, idx_t = inp
            xb, yb = x[idx_t], y[idx_t]
            if batch_sharding is not None:
                xb = jax.lax.with_sharding_constraint(xb, batch_sharding)
                yb = jax.lax.with_sharding_constraint(yb, batch_sharding)
            loss, g = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(key, t), xb, yb)
            g = _mask(mask, g)
            upd, new_opt = optimizer.update(g, opt_state, params)
            upd = _mask(mask, jax.tree_util.tree_map(lambda u: lr_scale * u, upd))
            new_params = optax.apply_updates(params, upd)
            finite = jnp.isfinite(loss) & jnp.all(jnp.stack(
                [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(g)]))
            live = t < stop
            active = live & ~dead & finite
            params, opt_state = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b),
                                                       (new_params, new_opt), (params, opt_state))
            dead = dead | (live & ~finite)
            return (params, opt_state, dead), (jnp.where(active, loss, 0.0), active)

        steps = first_step + jnp.arange(length)
        (params, opt_state, dead), (losses, active) = jax.lax.scan(
            body, (params, opt_state, jnp.asarray(False)), (steps, idx))
        n_active = jnp.sum(active)
        return params, opt_state, dead, jnp.sum(losses) / jnp.maximum(n_active, 1), n_active

    return jax.jit(run)


def fit(model: Model, params: Params, x, y, *, key, optimizer=None, learning_rate=None, batch_size: int = 100,
        num_steps: int = 1000, x_val=None, y_val=None, eval_every: int | None = None, num_val_samples: int = 100,
        patience: int = 5, factor: float = 0.5, min_lr_scale: float = 1e-2, stop_patience: int | None = None,
        devices: Sequence | None = None, progress: bool = True, blas_threads: int | None = 1) -> FitResult:
    """Maximise the ELBO by minibatch stochastic optimisation (module docstring, "Training").

    Args:
      model: the :class:`Model`, from :func:`svgp`/:func:`svtp`.
      params: its parameters, from :func:`init` (or an earlier fit).
      x: training inputs (N points).
      y: training targets (N points).
      key: PRNG key for minibatches and Monte-Carlo draws.
      optimizer: an optax transformation (default ``optax.adam(learning_rate)``).
      learning_rate: the step size of the default optimizer (default 1e-2); not together with ``optimizer``.
      batch_size: minibatch size B (<= N; divisible by the number of devices).
      num_steps: maximum number of optimisation steps.
      x_val: validation inputs for plateau reduction, early stopping and keeping the best parameters (pass both
        ``x_val`` and ``y_val`` or neither).
      y_val: validation targets matching ``x_val``.
      eval_every: steps between evaluations (default: one epoch, ``N // B``).
      num_val_samples: Monte-Carlo draws of the validation predictive (fixed random numbers across evaluations).
      patience: evaluations without improvement before `optax.contrib.reduce_on_plateau` reduces the
        learning-rate scale.
      factor: the factor, in (0, 1), by which `optax.contrib.reduce_on_plateau` multiplies the learning-rate scale.
      min_lr_scale: stop once the learning-rate scale falls below it.
      stop_patience: stop after this many evaluations without a better validation NLL (``None``: never).
      devices: devices for data-parallel steps (default: all local devices; one device = no sharding).
      progress: show a tqdm bar.
      blas_threads: BLAS/LAPACK threads during training (`smnngp.linalg.blas_threads`; default 1: the M x M
        factorisations are small, and more LAPACK threads only compete with XLA's; ``None`` leaves them alone).

    Returns:
      :class:`FitResult` with the kept parameters (best validation NLL, or the last ones without validation data),
      their :class:`VariationalPosterior`, the history of evaluations, ``best_step`` and ``best_val_nll``.

    Raises:
      TypeError: if ``model`` was not built by :func:`svgp` or :func:`svtp`.
      ValueError: for invalid data, ``M > N``, ``batch_size > N`` or not divisible by the number of devices, both
        ``optimizer`` and ``learning_rate`` given, a non-positive ``learning_rate``, ``factor`` outside (0, 1), only
        one of ``x_val`` and ``y_val``, an empty ``devices``, or non-positive step counts.

    Warns:
      RuntimeWarning: when a loss or gradient is not finite; training stops with the last finite parameters.
    """
    with linalg.blas_threads(blas_threads):
        return _fit(model, params, x, y, key=key, optimizer=optimizer, learning_rate=learning_rate,
                    batch_size=batch_size, num_steps=num_steps, x_val=x_val, y_val=y_val, eval_every=eval_every,
                    num_val_samples=num_val_samples, patience=patience, factor=factor, min_lr_scale=min_lr_scale,
                    stop_patience=stop_patience, devices=devices, progress=progress)


def _fit(model, params, x, y, *, key, optimizer, learning_rate, batch_size, num_steps, x_val, y_val, eval_every,
         num_val_samples, patience, factor, min_lr_scale, stop_patience, devices, progress):
    if not isinstance(model, Model):
        raise TypeError(f"model must be built by svgp() or svtp(), got {type(model).__name__}")
    x = _check_x(model, x)
    N = x.shape[0]
    y = model.likelihood.check_targets(y, N)
    if model.num_inducing > N:
        raise ValueError(f"inducing_inputs has M={model.num_inducing} points, more than the N={N} training points "
                         "in x")
    has_val = x_val is not None or y_val is not None
    if has_val:
        if x_val is None or y_val is None:
            raise ValueError("pass both x_val and y_val (or neither)")
        x_val = _check_x(model, x_val, "x_val")
        y_val = model.likelihood.check_targets(y_val, x_val.shape[0], "y_val")
    B = _positive_int(batch_size, "batch_size")
    if B > N:
        raise ValueError(f"batch_size={B} exceeds the N={N} training points")
    num_steps = _positive_int(num_steps, "num_steps")
    steps_per_epoch = N // B
    eval_every = steps_per_epoch if eval_every is None else _positive_int(eval_every, "eval_every")
    eval_every = min(eval_every, num_steps)
    num_val_samples = _positive_int(num_val_samples, "num_val_samples")
    if optimizer is not None and learning_rate is not None:
        raise ValueError("pass either optimizer or learning_rate, not both")
    if optimizer is None:
        lr = 1e-2 if learning_rate is None else float(learning_rate)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning_rate must be positive and finite, got {learning_rate!r}")
        optimizer = _adam(lr)
    if not (0 < factor < 1):
        raise ValueError(f"factor must be in (0, 1), got {factor!r}")
    params = _strong(params)
    devices = _resolve_devices(devices)
    mesh = None
    if len(devices) > 1:
        if B % len(devices):
            raise ValueError(f"batch_size={B} must be divisible by the number of devices ({len(devices)})")
        mesh = Mesh(np.asarray(devices), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        params, x, y = jax.device_put((params, x, y), replicated)
        idx_sharding = NamedSharding(mesh, PartitionSpec(None, "data"))
    else:
        replicated = idx_sharding = devices[0]
        params, x, y = jax.device_put((params, x, y), replicated)

    k_data, k_mc, k_val, k_post = jax.random.split(key, 4)
    run = _make_round(model, optimizer, N, mesh, eval_every)
    opt_state = jax.device_put(optimizer.init(params), replicated)
    plateau, plateau_update = _optim.plateau(float(factor), int(patience))
    plateau_state = plateau.init(params)

    epoch, buffer = 0, np.zeros((0, B), np.int64)

    def next_indices(n):
        nonlocal epoch, buffer
        while buffer.shape[0] < n:
            perm = np.asarray(jax.random.permutation(jax.random.fold_in(k_data, epoch), N))
            buffer = np.concatenate([buffer, perm[: steps_per_epoch * B].reshape(steps_per_epoch, B)])
            epoch += 1
        out, buffer = buffer[:n], buffer[n:]
        return out

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, desc=f"{model.kind} {type(model.likelihood).__name__}", leave=False)
    history = []
    best = (math.inf, params, 0)
    t0 = time.perf_counter()
    step = 0
    since_best = 0
    try:
        while step < num_steps:
            idx = jax.device_put(jnp.asarray(next_indices(eval_every), jnp.int32), idx_sharding)
            lr_scale = jnp.asarray(plateau_state.scale, model.dtype)
            params, opt_state, dead, loss, n_active = run(params, opt_state, lr_scale, k_mc, step, num_steps, idx, x, y)
            done = int(n_active)
            if bool(dead):
                warnings.warn(f"variational fit: non-finite loss or gradient at step {step + done}; training stopped "
                              "and the last finite parameters kept", RuntimeWarning, stacklevel=2)
                step += done
                break
            step += done
            loss = float(loss)
            if has_val:
                v = _val_nll(model, params, x_val, y_val, k_val, num_val_samples)
                monitored = v if math.isfinite(v) else 1e30
                if v < best[0]:
                    best, since_best = (v, params, step), 0
                else:
                    since_best += 1
            else:
                v, monitored = math.nan, loss
            plateau_state = plateau_update(plateau_state, jnp.asarray(monitored, plateau_state.best_value.dtype))
            scale = float(plateau_state.scale)
            history.append({"step": step, "loss": loss, "val_nll": v, "lr_scale": scale,
                            "time": time.perf_counter() - t0})
            if bar is not None:
                bar.update(done)
                bar.set_postfix(loss=f"{loss:.4g}", val_nll=f"{v:.4g}", lr=f"{scale:.3g}")
            if scale < min_lr_scale or (stop_patience is not None and since_best >= stop_patience):
                break
    finally:
        if bar is not None:
            bar.close()
    if has_val and math.isfinite(best[0]):
        params, best_val, best_step = best[1], best[0], best[2]
    else:
        best_val, best_step = math.nan, step
    post = as_posterior(model, params, x, y, key=k_post)
    return FitResult(params, post, history, best_step, best_val)
