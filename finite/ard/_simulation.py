"""Free-run simulation of a NARX network: `simulate` (the model's own outputs fed back), `simulation_rmse`, and
`finetune_simulation` (training through the free run, fixed pruning masks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from finite.ard._network import ArdMLP, Layer, narx_regressors
from finite.checks import check_positive

__all__ = ["simulate", "simulation_rmse", "finetune_simulation"]


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
