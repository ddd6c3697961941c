"""Ensembles of finite networks with a fixed or random last-layer scale (notes 002, section 3.5; paper Sec. 4.5,
Table 3; issue 14, section 3).

An ensemble is ``K`` copies of one ``smnngp.stax`` network (by default :func:`cnn`, the paper's
``depth x [Conv(channels, 3x3, SAME, W_std=1, b_std=0) + Relu] + Flatten + Dense(C, W_std=sigma_v)`` in NTK
parameterisation), initialised independently and trained together: every leaf of the parameter pytree carries a
leading member axis, and one ``jit`` of a ``vmap`` over that axis runs a training step for all members at once; an
epoch is one ``lax.scan`` over its minibatches (on CPU, a loop over the compiled step instead, because XLA:CPU
runs convolutions inside loops slowly; see ``train_ensemble``'s ``scan``). The data stay in device memory.
Training minimises the softmax cross-entropy with optax (Adam by default).

**Last-layer scale.** Member ``k`` has a scale ``sigma_v[k] > 0`` that multiplies its network output, fixed during
training:

    logits_k(x) = sigma_v[k] * f(theta_k, x).

For a network that ends in a bias-free ``Dense(C, W_std=1)`` in NTK parameterisation the readout is
``f = (1 / sqrt(n)) h W`` (``n`` the fan-in, ``h`` the last features), so ``sigma_v f = (sigma_v / sqrt(n)) h W``
is *exactly* that readout with ``W_std = sigma_v``: the same function of the same parameters, hence the same
gradients, the same Adam updates and the same trained network (the tests check both). With a readout bias
``b_std`` the multiplier also scales it, i.e. it equals ``Dense(C, W_std=sigma_v W_std, b_std=sigma_v b_std)``.
(In the standard parameterisation the multiplier gives the same function at initialisation but not the same
training dynamics as changing ``W_std``, which there rescales the initial weights instead of the output.)

* ``scale="fixed"``: every member has ``sigma_v`` (default 1), the paper's "Gaussian" column;
* ``scale="inverse_gamma"``: member ``k`` draws ``sigma_v[k]^2 ~ InvGamma(a, b)`` independently (default
  ``a = b = 2``, the authors' choice), the paper's "Inverse Gamma Prior (Ours)" column; the finite counterpart of
  the scale mixture ``f | sigma_v^2 ~ GP(0, sigma_v^2 Kbar)``;
* any scalar numpyro distribution on the positive reals (``smnngp.priors.BurrXII(c, k)``, ...) as the law of
  ``sigma_v^2``.

**Prediction** (:func:`predict`) averages the members' class probabilities,
``p(y | x) = (1/K) sum_k softmax(logits_k(x))`` (``combine="probs"``, the deep-ensemble predictive); the authors'
code instead averages logits, ``softmax((1/K) sum_k logits_k(x))``, available as ``combine="logits"``.

Randomness: ``init_ensemble`` splits its key into the scale draw and ``K`` member keys; ``train_ensemble`` gives
member ``k`` the key ``keys[k]`` (``keys = jax.random.split(key, K)`` for a single key) and shuffles its data in
epoch ``e`` with ``fold_in(keys[k], e)``, so members see independent minibatch orders and member ``k`` trained
alone (an ensemble of one, sliced with :func:`select_members`, given ``keys[k:k+1]``) follows the same trajectory.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from finite.checks import check_positive
from smnngp import stax
from smnngp._checks import check_finite
from smnngp.priors import InverseGamma, as_prior

__all__ = [
    "EnsembleParams",
    "TrainInfo",
    "cnn",
    "draw_scales",
    "init_ensemble",
    "select_members",
    "ensemble_logits",
    "member_probabilities",
    "predict",
    "train_ensemble",
    "fit_ensemble",
]

_SCALES = ("fixed", "inverse_gamma")
_COMBINES = ("probs", "logits")


class EnsembleParams(NamedTuple):
    """A trained or freshly initialised ensemble.

    ``params``: the network's parameter pytree, every leaf with a leading member axis of length ``K``;
    ``scales``: ``(K,)`` last-layer scales ``sigma_v`` (not variances), fixed during training.
    """

    params: Any
    scales: jnp.ndarray

    @property
    def num_members(self) -> int:
        return int(self.scales.shape[0])


class TrainInfo(NamedTuple):
    """What :func:`train_ensemble` reports besides the parameters.

    ``losses``: ``(epochs, K)`` mean training cross-entropy of each member over each epoch's minibatches;
    ``opt_state``: the optimiser state (member axis first), to continue training;
    ``epochs_done``: ``start_epoch + epochs``, the ``start_epoch`` that continues this run exactly.
    """

    losses: np.ndarray
    opt_state: Any
    epochs_done: int


# ---------------------------------------------------------------------------
# Architecture and initialisation
# ---------------------------------------------------------------------------


def cnn(depth: int = 4, channels: int = 32, num_classes: int = 10, *, filter_shape: Sequence[int] = (3, 3),
        W_std: float = 1.0, b_std: float | None = 0.0, readout_W_std: float = 1.0,
        parameterization: str = "ntk") -> stax.Layer:
    """The CNN of Table 3 (notes 002, section 3.5, [REPO] architecture).

    ``depth x [Conv(channels, filter_shape, SAME, W_std, b_std) + Relu] + Flatten + Dense(num_classes,
    W_std=readout_W_std)`` with a bias-free readout. The paper uses 128 channels, the authors' code 32. Keep
    ``readout_W_std=1`` and set the scale through the ensemble's ``scale`` (module docstring); the two are
    equivalent in NTK parameterisation.

    Args:
        depth: number of convolution + ReLU blocks (0 gives a linear readout of the flattened input).
        channels: output channels of every convolution.
        num_classes: number of classes, the width of the readout (at least 2).
        filter_shape: spatial shape of the convolution filters.
        W_std: weight standard deviation of the convolutions.
        b_std: bias standard deviation of the convolutions; ``None`` for convolutions without bias.
        readout_W_std: weight standard deviation of the readout ``Dense`` layer.
        parameterization: ``"ntk"`` (default) or ``"standard"``, used by every layer (see ``smnngp.stax``).

    Returns:
        The ``smnngp.stax`` triple ``(init_fn, apply_fn, kernel_fn)`` of the network.

    Raises:
        ValueError: if ``depth`` is not a non-negative integer, ``channels`` not a positive integer or
            ``num_classes`` not an integer of at least 2 (the layers raise on invalid standard deviations).
    """
    if not isinstance(depth, (int, np.integer)) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"cnn: depth must be a non-negative integer, got {depth!r}")
    if not isinstance(channels, (int, np.integer)) or isinstance(channels, bool) or channels < 1:
        raise ValueError(f"cnn: channels must be a positive integer, got {channels!r}")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(f"cnn: num_classes must be an integer >= 2, got {num_classes!r}")
    layers = []
    for _ in range(int(depth)):
        layers += [stax.Conv(int(channels), tuple(filter_shape), padding="SAME", W_std=W_std, b_std=b_std,
                             parameterization=parameterization), stax.Relu()]
    layers += [stax.Flatten(), stax.Dense(int(num_classes), W_std=readout_W_std, parameterization=parameterization)]
    return stax.serial(*layers)


def _check_network(network, where: str):
    if not (isinstance(network, tuple) and len(network) == 3 and all(callable(f) for f in network)):
        raise TypeError(f"{where}: network must be a stax triple (init_fn, apply_fn, kernel_fn), "
                        f"got {type(network).__name__}")
    return network[0], network[1]


def _check_num_members(num_members, where: str) -> int:
    if isinstance(num_members, bool) or not isinstance(num_members, (int, np.integer)) or num_members < 1:
        raise ValueError(f"{where}: num_members (K) must be an integer >= 1, got {num_members!r}")
    return int(num_members)


_check_positive = check_positive


def _float_dtype(dtype):
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    return dtype


def draw_scales(key, num_members: int = 8, scale="fixed", *, sigma_v: float = 1.0, a: float = 2.0,
                b: float = 2.0, dtype=None) -> jnp.ndarray:
    """Last-layer scales ``sigma_v`` of ``num_members`` members, shape ``(K,)``.

    ``scale="fixed"``: all equal to ``sigma_v``; ``"inverse_gamma"``: ``sigma_v^2 ~ InvGamma(a, b)`` i.i.d.
    (``smnngp.priors.InverseGamma``, density ``b^a / Gamma(a) s^{-a-1} e^{-b/s}``); a numpyro distribution:
    ``sigma_v^2`` drawn from it. Returns ``sqrt`` of the variances.

    Args:
        key: JAX PRNG key for the random scales (unused with ``scale="fixed"``).
        num_members: number of members ``K`` (an integer >= 1).
        scale: ``"fixed"``, ``"inverse_gamma"`` or a scalar numpyro distribution on ``(0, inf)``, the law of
            ``sigma_v^2``.
        sigma_v: the common scale with ``scale="fixed"`` (positive).
        a: shape of the inverse-gamma law with ``scale="inverse_gamma"`` (positive).
        b: scale of the inverse-gamma law with ``scale="inverse_gamma"`` (positive).
        dtype: floating dtype of the result; ``None`` for JAX's default float.

    Returns:
        Array of shape ``(K,)``, the scales ``sigma_v`` (standard deviations, not variances).

    Raises:
        ValueError: if ``num_members`` is not a positive integer, ``dtype`` is not floating, ``scale`` is an
            unknown string or not a valid distribution, or ``sigma_v``, ``a`` or ``b`` (where used) is not
            positive and finite.
    """
    where = "draw_scales"
    k = _check_num_members(num_members, where)
    dtype = _float_dtype(dtype)
    if isinstance(scale, str):
        if scale not in _SCALES:
            raise ValueError(f"{where}: scale must be one of {_SCALES} or a numpyro distribution on (0, inf), "
                             f"got {scale!r}")
        if scale == "fixed":
            s = _check_positive(sigma_v, "sigma_v", where)
            return jnp.full((k,), s, dtype=dtype)
        a = _check_positive(a, "a", where)
        b = _check_positive(b, "b", where)
        prior = InverseGamma(a, b)
    else:
        try:
            prior = as_prior(scale)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: scale must be one of {_SCALES} or a numpyro distribution on (0, inf): "
                             f"{err}") from None
    var = prior.sample(key, (k,))
    return jnp.sqrt(var).astype(dtype)


def init_ensemble(key, network, input_shape: Sequence[int], num_members: int = 8, *, scale="fixed",
                  sigma_v: float = 1.0, a: float = 2.0, b: float = 2.0, dtype=None) -> EnsembleParams:
    """Initialise ``K`` members independently (``init_fn`` under ``vmap`` over ``K`` keys) and draw their scales.

    ``input_shape`` is the stax input shape with a batch axis, e.g. ``(-1, 8, 8, 1)``; the network must map it to
    ``(batch, C)`` logits. Parameters are cast to ``dtype`` (default JAX's default float). See
    :func:`draw_scales` for ``scale``, ``sigma_v``, ``a``, ``b``.

    Args:
        key: JAX PRNG key, split into the key of the scale draw and ``K`` member keys.
        network: a ``smnngp.stax`` triple ``(init_fn, apply_fn, kernel_fn)``, e.g. from :func:`cnn`.
        input_shape: stax input shape with a leading batch axis.
        num_members: number of members ``K`` (an integer >= 1).
        scale: law of the last-layer scales, passed to :func:`draw_scales`.
        sigma_v: fixed scale, passed to :func:`draw_scales`.
        a: inverse-gamma shape, passed to :func:`draw_scales`.
        b: inverse-gamma scale, passed to :func:`draw_scales`.
        dtype: floating dtype of the parameters and scales; ``None`` for JAX's default float.

    Returns:
        :class:`EnsembleParams` with the members' parameters (leading axis ``K`` on every leaf) and their
        ``(K,)`` scales.

    Raises:
        TypeError: if ``network`` is not a stax triple.
        ValueError: if ``num_members`` or ``dtype`` is invalid, the network does not output 2-D logits for
            ``input_shape``, or the scale arguments are invalid (see :func:`draw_scales`).
    """
    where = "init_ensemble"
    init_fn, _ = _check_network(network, where)
    k = _check_num_members(num_members, where)
    dtype = _float_dtype(dtype)
    input_shape = tuple(int(s) for s in input_shape)
    out_shape, _ = jax.eval_shape(lambda kk: init_fn(kk, input_shape), jax.random.PRNGKey(0))
    if len(out_shape) != 2:
        raise ValueError(f"{where}: network must output (batch, num_classes) logits, got output shape "
                         f"{tuple(out_shape)} for input_shape {input_shape}")
    k_scale, k_init = jax.random.split(key)
    member_keys = jax.random.split(k_init, k)
    params = jax.vmap(lambda kk: init_fn(kk, input_shape)[1])(member_keys)
    params = jax.tree.map(lambda leaf: leaf.astype(dtype), params)
    scales = draw_scales(k_scale, k, scale, sigma_v=sigma_v, a=a, b=b, dtype=dtype)
    return EnsembleParams(params, scales)


def select_members(ens: EnsembleParams, index) -> EnsembleParams:
    """The sub-ensemble ``index`` (an int, slice or index array) along the member axis; an int keeps the axis.

    Args:
        ens: the ensemble to slice.
        index: an integer member index (negative values count from the end), a slice, or an integer or
            boolean index array over the ``K`` members.

    Returns:
        :class:`EnsembleParams` holding the selected members, with the member axis kept (length 1 for an int).

    Raises:
        ValueError: if an integer ``index`` is outside ``-K .. K-1``.
    """
    if isinstance(index, (int, np.integer)):
        k = ens.num_members
        if not -k <= index < k:
            raise ValueError(f"select_members: index {index} out of range for {k} members")
        index = slice(int(index), int(index) + 1 if index != -1 else None)
    return jax.tree.map(lambda leaf: leaf[index], ens)


# ---------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------


def _check_x(x, where: str, dtype):
    if not hasattr(x, "shape"):
        x = np.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise ValueError(f"{where}: x must be a numeric array, got dtype {x.dtype}")
    if x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"{where}: x must have a batch axis and feature axes, got shape {tuple(x.shape)}")
    x = jnp.asarray(x, dtype=dtype)
    check_finite(x, "x", where)
    return x


def _check_y(y, n: int, num_classes: int, where: str):
    y_np = np.asarray(y)
    if y_np.ndim != 1 or y_np.shape[0] != n:
        raise ValueError(f"{where}: y must be a vector of {n} integer labels (one per row of x), "
                         f"got shape {y_np.shape}")
    if not np.issubdtype(y_np.dtype, np.integer):
        if not (np.issubdtype(y_np.dtype, np.floating) and np.all(np.isfinite(y_np))
                and np.all(y_np == np.round(y_np))):
            raise ValueError(f"{where}: y must hold integer class labels, got dtype {y_np.dtype}")
    lo, hi = int(y_np.min()), int(y_np.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"{where}: y must lie in 0..{num_classes - 1} (the network has {num_classes} outputs), "
                         f"got labels in {lo}..{hi}")
    return jnp.asarray(y_np.astype(np.int32))


def _check_ens(ens, where: str):
    if not isinstance(ens, EnsembleParams):
        raise TypeError(f"{where}: ens must be an EnsembleParams (from init_ensemble), got {type(ens).__name__}")
    return ens


def _params_dtype(ens: EnsembleParams):
    return ens.scales.dtype


def _num_classes(apply_fn, ens: EnsembleParams, x_shape, dtype, where: str) -> int:
    one = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), ens.params)
    try:
        out = jax.eval_shape(apply_fn, one, jax.ShapeDtypeStruct((1,) + tuple(x_shape[1:]), dtype))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: x of shape {tuple(x_shape)} does not fit the network: {err}") from None
    if len(out.shape) != 2:
        raise ValueError(f"{where}: network must output (batch, num_classes) logits, got {out.shape}")
    return int(out.shape[1])


# ---------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def _logits(apply_fn, params, scales, x):
    return jax.vmap(lambda p, s: s * apply_fn(p, x))(params, scales)


def _chunked_logits(apply_fn, ens, x, batch_size):
    """Member logits ``(K, N, C)`` in chunks of ``batch_size`` points (the last chunk padded: one compilation)."""
    n = x.shape[0]
    bs = n if batch_size is None else min(int(batch_size), n)
    if bs == n:
        return _logits(apply_fn, ens.params, ens.scales, x)
    outs = []
    for start in range(0, n, bs):
        chunk = x[start:start + bs]
        m = chunk.shape[0]
        if m < bs:
            chunk = jnp.concatenate([chunk, jnp.zeros((bs - m,) + chunk.shape[1:], chunk.dtype)])
        outs.append(_logits(apply_fn, ens.params, ens.scales, chunk)[:, :m])
    return jnp.concatenate(outs, axis=1)


def _check_batch_size(batch_size, where):
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"{where}: batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def ensemble_logits(network, ens: EnsembleParams, x, *, batch_size: int | None = 1024) -> jnp.ndarray:
    """Member logits ``sigma_v[k] * f(theta_k, x)``, shape ``(K, N, C)``, evaluated ``batch_size`` points at a time.

    Args:
        network: the ``smnngp.stax`` triple the ensemble was initialised with.
        ens: the ensemble, from :func:`init_ensemble` or :func:`train_ensemble`.
        x: inputs ``(N, ...)`` with the network's input shape after the batch axis; cast to the parameters'
            dtype.
        batch_size: number of points per evaluation (the last chunk is padded, so one compilation serves all
            chunks); ``None`` evaluates all ``N`` at once.

    Returns:
        Array of shape ``(K, N, C)``, the scaled logits of every member at every point.

    Raises:
        TypeError: if ``network`` is not a stax triple or ``ens`` not an :class:`EnsembleParams`.
        ValueError: if ``batch_size`` is not a positive integer or ``None``, or ``x`` is not numeric, lacks
            feature axes, has non-finite entries or does not fit the network.
    """
    where = "ensemble_logits"
    _, apply_fn = _check_network(network, where)
    ens = _check_ens(ens, where)
    batch_size = _check_batch_size(batch_size, where)
    x = _check_x(x, where, _params_dtype(ens))
    _num_classes(apply_fn, ens, x.shape, x.dtype, where)
    return _chunked_logits(apply_fn, ens, x, batch_size)


def member_probabilities(network, ens: EnsembleParams, x, *, batch_size: int | None = 1024) -> jnp.ndarray:
    """Each member's class probabilities ``softmax(logits_k(x))``, shape ``(K, N, C)``.

    Args:
        network: the ``smnngp.stax`` triple the ensemble was initialised with.
        ens: the ensemble, an :class:`EnsembleParams`.
        x: inputs ``(N, ...)``, as for :func:`ensemble_logits`.
        batch_size: number of points per evaluation; ``None`` evaluates all at once.

    Returns:
        Array of shape ``(K, N, C)``; every row sums to one over the classes.

    Raises:
        TypeError: as :func:`ensemble_logits`.
        ValueError: as :func:`ensemble_logits`.
    """
    return jax.nn.softmax(ensemble_logits(network, ens, x, batch_size=batch_size), axis=-1)


def predict(network, ens: EnsembleParams, x, *, combine: str = "probs", batch_size: int | None = 1024,
            return_members: bool = False):
    """Ensemble predictive probabilities ``(N, C)`` (module docstring, "Prediction").

    ``combine="probs"``: ``(1/K) sum_k softmax(logits_k)``; ``"logits"``: ``softmax((1/K) sum_k logits_k)`` (the
    authors' code). With ``return_members=True`` also returns the ``(K, N, C)`` member probabilities.

    Args:
        network: the ``smnngp.stax`` triple the ensemble was initialised with.
        ens: the ensemble, an :class:`EnsembleParams`.
        x: inputs ``(N, ...)``, as for :func:`ensemble_logits`.
        combine: ``"probs"`` (average the probabilities) or ``"logits"`` (average the logits).
        batch_size: number of points per evaluation; ``None`` evaluates all at once.
        return_members: also return the members' probabilities.

    Returns:
        The ``(N, C)`` predictive probabilities, or the pair ``(probs, members)`` with ``members`` of shape
        ``(K, N, C)`` when ``return_members`` is true.

    Raises:
        ValueError: if ``combine`` is not ``"probs"`` or ``"logits"``, and as :func:`ensemble_logits`.
        TypeError: as :func:`ensemble_logits`.
    """
    if combine not in _COMBINES:
        raise ValueError(f"predict: combine must be one of {_COMBINES}, got {combine!r}")
    logits = ensemble_logits(network, ens, x, batch_size=batch_size)
    members = jax.nn.softmax(logits, axis=-1)
    if combine == "probs":
        probs = members.mean(axis=0)
    else:
        probs = jax.nn.softmax(logits.mean(axis=0), axis=-1)
    return (probs, members) if return_members else probs


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _adam(learning_rate: float) -> optax.GradientTransformation:
    # One object per learning rate, so that the compiled epoch below is reused across calls.
    return optax.adam(learning_rate)


class _EpochFns(NamedTuple):
    batches: Any  # (member_keys, epoch_index, x) -> (K, steps, batch) minibatch indices
    step: Any  # (params, opt_state, scales, batches, t, x, y) -> params, opt_state, (K,) loss of minibatch t
    epoch: Any  # (params, opt_state, scales, member_keys, epoch_index, x, y) -> params, opt_state, (K,) mean loss


@functools.lru_cache(maxsize=32)
def _epoch_fns(apply_fn, optimizer, batch_size: int, steps: int) -> _EpochFns:
    """The jitted pieces of an epoch, every one a ``vmap`` over the members.

    ``epoch`` runs a whole epoch as one ``lax.scan`` over its minibatches; ``batches`` + ``step`` run the same
    arithmetic one minibatch per call (a Python loop over one compiled step), for XLA:CPU, where convolutions
    inside a loop body run an order of magnitude slower than outside (jax-ml/jax#12868; measured here: a
    K = 8 step of the 4-layer CNN took 15 s inside ``scan`` against 1.3 s outside).
    """

    def member_batches(key, n):
        return jax.random.permutation(key, n)[: steps * batch_size].reshape(steps, batch_size)

    def member_step(params, opt_state, scale, idx, x, y):
        def loss_fn(p):
            logits = scale * apply_fn(p, x[idx])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y[idx]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    all_step = jax.vmap(member_step, in_axes=(0, 0, 0, 0, None, None))

    def batches(member_keys, epoch_index, x):
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(member_keys, epoch_index)
        return jax.vmap(member_batches, in_axes=(0, None))(keys, x.shape[0])

    @jax.jit
    def step(params, opt_state, scales, idx, t, x, y):
        return all_step(params, opt_state, scales, idx[:, t], x, y)

    @jax.jit
    def epoch(params, opt_state, scales, member_keys, epoch_index, x, y):
        idx = jnp.swapaxes(batches(member_keys, epoch_index, x), 0, 1)  # (steps, K, batch)

        def body(carry, idx_t):
            p, s, loss = all_step(*carry, scales, idx_t, x, y)
            return (p, s), loss

        (params, opt_state), losses = lax.scan(body, (params, opt_state), idx)
        return params, opt_state, losses.mean(axis=0)

    return _EpochFns(jax.jit(batches), step, epoch)


def _run_epoch(fns: _EpochFns, use_scan: bool, steps: int, params, opt_state, scales, member_keys, e, x, y):
    if use_scan:
        return fns.epoch(params, opt_state, scales, member_keys, e, x, y)
    idx = fns.batches(member_keys, e, x)
    total = 0.0
    for t in range(steps):
        params, opt_state, loss = fns.step(params, opt_state, scales, idx, jnp.asarray(t, jnp.int32), x, y)
        total = total + loss
    return params, opt_state, total / steps


def _member_keys(key, k: int, where: str):
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    single_ndim = 0 if typed else 1
    if key.ndim == single_ndim:
        return jax.random.split(key, k)
    if key.ndim == single_ndim + 1:
        if key.shape[0] != k:
            raise ValueError(f"{where}: key holds {key.shape[0]} member keys for {k} members")
        return key
    raise ValueError(f"{where}: key must be one PRNG key or one per member, got shape {tuple(key.shape)}")


def train_ensemble(key, network, ens: EnsembleParams, x, y, *, epochs: int = 300, batch_size: int = 500,
                   learning_rate: float = 1e-2, optimizer: optax.GradientTransformation | None = None,
                   opt_state=None, start_epoch: int = 0, scan: bool | None = None, progress: bool = True,
                   callback=None) -> tuple[EnsembleParams, TrainInfo]:
    """Train all members on softmax cross-entropy, in parallel (module docstring; defaults from the authors'
    code: Adam, lr 1e-2, batch 500, 300 epochs).

    ``key``: one PRNG key (split into ``K`` member keys) or ``K`` keys. ``x``: ``(N, ...)`` inputs, cast to the
    parameters' dtype and kept on the device; ``y``: ``(N,)`` integer labels in ``0..C-1``. Each epoch shuffles
    the data per member and takes ``N // batch_size`` full minibatches (the remainder of the shuffle is dropped).
    ``optimizer`` replaces ``optax.adam(learning_rate)``. To continue a run, pass the returned ``opt_state`` and
    ``start_epoch=info.epochs_done`` with the same key: the result equals the uninterrupted run. ``scan``: run each
    epoch as one ``lax.scan`` over its minibatches (True) or loop over one compiled minibatch step (False); the
    default scans except on CPU (see ``_epoch_fns``); both give the same numbers to rounding. ``progress``
    shows a tqdm bar with the members' mean loss. ``callback(epochs_done, ens, opt_state)``, if given, runs after
    every epoch (e.g. to write a checkpoint). A non-finite loss raises ``FloatingPointError``.

    Args:
        key: one PRNG key or ``K`` member keys (a leading axis of length ``K``).
        network: the ``smnngp.stax`` triple the ensemble was initialised with.
        ens: the ensemble to train, from :func:`init_ensemble` (or a previous call); its scales stay fixed.
        x: training inputs ``(N, ...)``.
        y: integer class labels ``(N,)`` in ``0..C-1`` (floats holding whole numbers are accepted).
        epochs: number of epochs to run (a non-negative integer).
        batch_size: minibatch size (a positive integer, capped at ``N``).
        learning_rate: Adam step size, used when ``optimizer`` is ``None``.
        optimizer: an optax ``GradientTransformation`` applied to every member, instead of Adam.
        opt_state: optimiser state (member axis first) to continue from; ``None`` initialises it.
        start_epoch: index of the first epoch, which sets the shuffles; use ``info.epochs_done`` to continue.
        scan: ``True`` scans over minibatches, ``False`` loops over a compiled step, ``None`` picks by backend.
        progress: show a tqdm progress bar.
        callback: optional ``callback(epochs_done, ens, opt_state)`` called after every epoch.

    Returns:
        A pair ``(ens, info)``: the trained :class:`EnsembleParams` (same scales) and a :class:`TrainInfo` with
        the ``(epochs, K)`` losses, the final optimiser state and ``epochs_done``.

    Raises:
        TypeError: if ``network`` is not a stax triple or ``ens`` not an :class:`EnsembleParams`.
        ValueError: if ``epochs``, ``start_epoch``, ``batch_size``, ``learning_rate``, ``optimizer``, ``key``,
            ``x`` or ``y`` is invalid (wrong type, shape, range or non-finite values).
        FloatingPointError: if a member's mean training loss in an epoch is not finite.
    """
    where = "train_ensemble"
    _, apply_fn = _check_network(network, where)
    ens = _check_ens(ens, where)
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"{where}: epochs must be a non-negative integer, got {epochs!r}")
    if isinstance(start_epoch, bool) or not isinstance(start_epoch, (int, np.integer)) or start_epoch < 0:
        raise ValueError(f"{where}: start_epoch must be a non-negative integer, got {start_epoch!r}")
    batch_size = _check_batch_size(batch_size, where)
    if batch_size is None:
        raise ValueError(f"{where}: batch_size must be a positive integer, got None")
    if optimizer is None:
        optimizer = _adam(_check_positive(learning_rate, "learning_rate", where))
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"{where}: optimizer must be an optax GradientTransformation, got {type(optimizer).__name__}")
    k = ens.num_members
    member_keys = _member_keys(key, k, where)
    x = _check_x(x, where, _params_dtype(ens))
    num_classes = _num_classes(apply_fn, ens, x.shape, x.dtype, where)
    y = _check_y(y, x.shape[0], num_classes, where)
    x, y = jax.device_put(x), jax.device_put(y)

    n = x.shape[0]
    bs = min(batch_size, n)
    steps = n // bs
    if opt_state is None:
        opt_state = jax.vmap(optimizer.init)(ens.params)
    fns = _epoch_fns(apply_fn, optimizer, bs, steps)
    use_scan = (jax.default_backend() != "cpu") if scan is None else bool(scan)

    params = ens.params
    losses = np.zeros((int(epochs), k))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(epochs), desc=f"ensemble K={k}", unit="epoch", leave=False, mininterval=2.0)
    t0 = time.perf_counter()
    try:
        for i in range(int(epochs)):
            e = start_epoch + i
            params, opt_state, loss = _run_epoch(fns, use_scan, steps, params, opt_state, ens.scales, member_keys,
                                                 jnp.asarray(e, jnp.uint32), x, y)
            losses[i] = np.asarray(loss)
            if not np.all(np.isfinite(losses[i])):
                bad = np.flatnonzero(~np.isfinite(losses[i])).tolist()
                raise FloatingPointError(f"{where}: the training loss of member(s) {bad} became non-finite in "
                                         f"epoch {e} (try a smaller learning_rate)")
            if bar is not None:
                bar.update(1)
                per_epoch = (time.perf_counter() - t0) / (i + 1)
                bar.set_postfix(loss=f"{losses[i].mean():.4f}", s_per_epoch=f"{per_epoch:.2f}", refresh=False)
            if callback is not None:
                callback(e + 1, EnsembleParams(params, ens.scales), opt_state)
    finally:
        if bar is not None:
            bar.close()
    return EnsembleParams(params, ens.scales), TrainInfo(losses, opt_state, int(start_epoch) + int(epochs))


def fit_ensemble(key, network, x, y, *, num_members: int = 8, scale="fixed", sigma_v: float = 1.0, a: float = 2.0,
                 b: float = 2.0, epochs: int = 300, batch_size: int = 500, learning_rate: float = 1e-2,
                 optimizer: optax.GradientTransformation | None = None,
                 progress: bool = True) -> tuple[EnsembleParams, TrainInfo]:
    """:func:`init_ensemble` then :func:`train_ensemble` (keys: ``k_init, k_train = jax.random.split(key)``).

    The parameters take ``x``'s dtype when it is floating (JAX's default float otherwise).

    Args:
        key: JAX PRNG key, split into the initialisation key and the training key.
        network: a ``smnngp.stax`` triple ``(init_fn, apply_fn, kernel_fn)`` with 2-D logit output.
        x: training inputs ``(N, ...)``; the input shape of the network is ``x.shape[1:]``.
        y: integer class labels ``(N,)`` in ``0..C-1``.
        num_members: number of members ``K``.
        scale: law of the last-layer scales (``"fixed"``, ``"inverse_gamma"`` or a distribution of
            ``sigma_v^2``), see :func:`draw_scales`.
        sigma_v: fixed scale with ``scale="fixed"``.
        a: inverse-gamma shape with ``scale="inverse_gamma"``.
        b: inverse-gamma scale with ``scale="inverse_gamma"``.
        epochs: number of training epochs.
        batch_size: minibatch size.
        learning_rate: Adam step size, used when ``optimizer`` is ``None``.
        optimizer: an optax ``GradientTransformation`` to use instead of Adam.
        progress: show a tqdm progress bar.

    Returns:
        A pair ``(ens, info)`` as returned by :func:`train_ensemble`.

    Raises:
        TypeError: if ``network`` is not a stax triple.
        ValueError: if ``x`` has fewer than two axes, and as :func:`init_ensemble` and :func:`train_ensemble`.
        FloatingPointError: as :func:`train_ensemble`.
    """
    where = "fit_ensemble"
    _check_network(network, where)
    x_arr = x if hasattr(x, "dtype") else np.asarray(x)
    dtype = x_arr.dtype if jnp.issubdtype(x_arr.dtype, jnp.floating) else None
    if x_arr.ndim < 2:
        raise ValueError(f"{where}: x must have a batch axis and feature axes, got shape {tuple(x_arr.shape)}")
    k_init, k_train = jax.random.split(key)
    ens = init_ensemble(k_init, network, (-1,) + tuple(x_arr.shape[1:]), num_members, scale=scale,
                        sigma_v=sigma_v, a=a, b=b, dtype=dtype)
    return train_ensemble(k_train, network, ens, x, y, epochs=epochs, batch_size=batch_size,
                          learning_rate=learning_rate, optimizer=optimizer, progress=progress)
