"""BlackJAX HMC / NUTS transitions and their warm-up adaptation: the one home of these pieces in ``samplers``.

* :func:`transition`: one BlackJAX HMC (fixed number of leapfrog steps) or
  NUTS (Hoffman and Gelman 2014, with BlackJAX's multinomial, iterative
  trajectory; Betancourt 2017) step from a full BlackJAX ``HMCState``,
  reported as a :class:`TrajectoryInfo` that both kernels share.
* :func:`hmc_step`: one trajectory for a log density that changes per call.
  The masked-BNN sampler changes its target between HMC trajectories (the
  masks and the noise move), so the HMC state (position, log density and its
  gradient) is rebuilt from the position for every trajectory; the step size
  lives in a BlackJAX ``DualAveragingAdaptationState`` that is updated during
  burn-in (``adapt=True``) and read through its running average afterwards
  (Hoffman and Gelman 2014, section 3.2.1).
* :func:`step_size_adaptation`: BlackJAX's dual averaging (Nesterov 2009 as
  adapted by Hoffman and Gelman 2014, eqs. (5)-(6)).
* :func:`warmup_adaptation`: the warm-up of a *fixed* target, advanced one
  iteration at a time so that a chunked, checkpointed run can carry it:
  step size only (dual averaging), or Stan's windowed adaptation of the step
  size and a diagonal mass matrix (Stan reference manual, "HMC algorithm
  parameters"; BlackJAX's ``window_adaptation``) built from BlackJAX's own
  pieces (``build_schedule``, ``dual_averaging_adaptation``,
  ``mass_matrix_adaptation``). A test checks that it reproduces
  ``blackjax.window_adaptation(...).run`` given the same keys.
* :func:`pool_min_step`: the pooled-step option, every chain given the
  smallest adapted step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["StepSizeAdaptation", "step_size_adaptation", "hmc_step", "TrajectoryInfo", "transition", "KERNELS",
           "check_kernel", "ADAPTATIONS", "WarmupState", "Warmup", "warmup_adaptation", "pool_min_step"]

KERNELS = ("hmc", "nuts")
ADAPTATIONS = ("window", "dual_averaging", "none")


class TrajectoryInfo(NamedTuple):
    """What HMC and NUTS both report for one transition.

    acceptance_rate: the Metropolis acceptance probability min(1, exp(-dH)) (HMC) or the mean of it over the
    trajectory (NUTS); NaN is reported as 0. is_accepted: whether the position moved. is_divergent: the energy
    error exceeded BlackJAX's divergence threshold (1000). num_integration_steps: leapfrog steps (= gradient
    evaluations) of the trajectory.
    """

    acceptance_rate: jnp.ndarray
    is_accepted: jnp.ndarray
    is_divergent: jnp.ndarray
    num_integration_steps: jnp.ndarray


class StepSizeAdaptation(NamedTuple):
    """``init(step_size) -> DualAveragingAdaptationState`` and ``update(state, acceptance_rate) -> state``."""

    init: Callable
    update: Callable


def check_kernel(kernel: str, who: str) -> str:
    """Return ``kernel`` if it is ``'hmc'`` or ``'nuts'``; otherwise raise ``ValueError`` naming ``who``'s argument."""
    if kernel not in KERNELS:
        raise ValueError(f"{who}: kernel must be 'hmc' or 'nuts', got {kernel!r}")
    return kernel


def step_size_adaptation(target_accept: float = 0.7, gamma: float = 0.2, t0: float = 10.0,
                         kappa: float = 0.75) -> StepSizeAdaptation:
    """BlackJAX dual averaging of ``log(step size)`` towards mean acceptance ``target_accept``.

    Hoffman and Gelman (2014), section 3.2.1:
    ``x_{t+1} = mu - sqrt(t)/gamma * H_t``, ``H_t = (1 - 1/(t + t0)) H_{t-1} + (target - alpha_t)/(t + t0)``,
    averaged iterate ``xbar_{t+1} = t^-kappa x_{t+1} + (1 - t^-kappa) xbar_t``, ``mu = log(10 eps_0)``.
    The defaults are the masked-BNN authors' settings (BlackJAX's gamma is 0.05).

    Returns:
        :class:`StepSizeAdaptation` ``(init, update)``.
    """
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    init, update, _ = dual_averaging_adaptation(target_accept, t0=t0, gamma=gamma, kappa=kappa)
    return StepSizeAdaptation(init, update)


def transition(key, state, logdensity: Callable, step_size, inverse_mass_matrix, *, kernel: str = "hmc",
               num_integration_steps: int = 20, max_num_doublings: int = 10):
    """One BlackJAX HMC or NUTS transition from a BlackJAX ``HMCState`` (position, log density, its gradient).

    Args:
        key: PRNG key of the transition.
        state: ``blackjax.mcmc.hmc.HMCState`` (``blackjax.mcmc.hmc.init(position, logdensity)``).
        logdensity: log density of the position pytree (a scalar).
        step_size: leapfrog step size (may be traced).
        inverse_mass_matrix: diagonal ``(d,)`` over the flattened position (``d`` = total size).
        kernel: ``'hmc'`` (``num_integration_steps`` leapfrog steps, Metropolis correction; Neal 2011) or
            ``'nuts'`` (at most ``2**max_num_doublings`` steps).

    Returns:
        ``(HMCState, TrajectoryInfo)``; a NaN acceptance probability is reported as 0.
    """
    from blackjax.mcmc import hmc, nuts

    if kernel == "nuts":
        new, info = nuts.build_kernel()(key, state, logdensity, step_size, inverse_mass_matrix, max_num_doublings)
    elif kernel == "hmc":
        new, info = hmc.build_kernel()(key, state, logdensity, step_size, inverse_mass_matrix, num_integration_steps)
    else:
        raise ValueError(f"transition: kernel must be 'hmc' or 'nuts', got {kernel!r}")
    acc = jnp.where(jnp.isnan(info.acceptance_rate), 0.0, info.acceptance_rate)
    accepted = getattr(info, "is_accepted", None)
    if accepted is None:  # NUTS reports no flag: the position moved or not
        accepted = jnp.any(jnp.stack([jnp.any(a != b) for a, b in zip(jax.tree_util.tree_leaves(new.position),
                                                                        jax.tree_util.tree_leaves(state.position))]))
    return new, TrajectoryInfo(acc, accepted, info.is_divergent, jnp.asarray(info.num_integration_steps))


def hmc_step(key, position, logdensity: Callable, da_state, adaptation: StepSizeAdaptation, *, adapt,
             num_integration_steps: int = 20, kernel: str = "hmc", sampling_scale: float = 1.0):
    """One trajectory for a log density that may change between calls (identity mass matrix).

    Args:
        key: PRNG key.
        position: the position pytree.
        logdensity: its log density now.
        da_state: ``DualAveragingAdaptationState`` of this chain.
        adaptation: from :func:`step_size_adaptation`.
        adapt: update the dual averaging (burn-in); may be traced (one compiled program serves burn-in and
            sampling). While adapting the step is ``exp(log_step_size)``; afterwards it is ``sampling_scale``
            times the averaged ``exp(log_step_size_avg)``.
        num_integration_steps: number of leapfrog steps of an ``'hmc'`` trajectory (see :func:`transition`).
        kernel: ``'hmc'`` or ``'nuts'`` (see :func:`transition`).
        sampling_scale: factor applied to the averaged step once the adaptation stops (see ``adapt``).

    Returns:
        ``(position, da_state, step_size, TrajectoryInfo)``. A trajectory whose acceptance probability is NaN
        counts as rejected (probability 0) in the step-size adaptation.
    """
    from blackjax.mcmc import hmc

    check_kernel(kernel, "hmc_step")
    adapt = jnp.asarray(adapt)
    eps = jnp.exp(jnp.where(adapt, da_state.log_step_size, da_state.log_step_size_avg + jnp.log(sampling_scale)))
    leaves = jax.tree_util.tree_leaves(position)
    inv_mass = jnp.ones((sum(x.size for x in leaves),), leaves[0].dtype)
    state, out = transition(key, hmc.init(position, logdensity), logdensity, eps, inv_mass, kernel=kernel,
                            num_integration_steps=num_integration_steps)
    updated = adaptation.update(da_state, out.acceptance_rate)
    da_state = jax.tree_util.tree_map(lambda new, old: jnp.where(adapt, new, old), updated, da_state)
    return state.position, da_state, eps, out


# ---------------------------------------------------------------------------
# warm-up of a fixed target, one iteration at a time
# ---------------------------------------------------------------------------

class WarmupState(NamedTuple):
    """Per-chain warm-up state.

    da: BlackJAX ``DualAveragingAdaptationState`` of ``log(step size)``. mass: BlackJAX
    ``MassMatrixAdaptationState`` (Welford accumulator of the current slow window; ``None`` unless the adaptation
    is ``'window'``). step_size: the step the kernel takes at the next iteration. inverse_mass_matrix: the
    diagonal ``(d,)`` the kernel uses at the next iteration.
    """

    da: Any
    mass: Any
    step_size: jnp.ndarray
    inverse_mass_matrix: jnp.ndarray


class Warmup(NamedTuple):
    """``init(position, step_size, inverse_mass_matrix=None) -> WarmupState`` and
    ``update(state, t, position, acceptance_rate) -> WarmupState`` for warm-up iteration ``t`` (may be traced,
    ``0 <= t < num_steps``); ``schedule`` is Stan's ``(num_steps, 2)`` table of (slow window?, window end?).

    Attributes:
        init: builds the initial :class:`WarmupState` of a chain.
        update: advances the state by warm-up iteration ``t``.
        schedule: the ``(num_steps, 2)`` int32 table (all zeros unless the adaptation is ``'window'``).
        num_steps: the number of warm-up iterations.
        name: the adaptation: ``'window'``, ``'dual_averaging'`` or ``'none'``.
    """

    init: Callable
    update: Callable
    schedule: np.ndarray
    num_steps: int
    name: str


def warmup_adaptation(adaptation: str = "window", num_steps: int = 1000, *, target_accept: float = 0.8,
                      gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75,
                      step_scale: float = 1.0) -> Warmup:
    """Warm-up adaptation advanced one iteration at a time (chunkable, checkpointable).

    Args:
        adaptation: ``'window'``: Stan's windowed adaptation (BlackJAX ``window_adaptation`` with a diagonal mass
            matrix): an initial fast window (step size only), slow windows doubling in length in which the
            Welford variance of the positions is accumulated and, at each window's end, becomes the inverse mass
            matrix ``(n/(n+5)) var + 1e-3 (5/(n+5))`` and the dual averaging restarts from the window's averaged
            step, then a final fast window (BlackJAX ``build_schedule``: 75 / 25... / 50 iterations, scaled down
            for short warm-ups, all fast below 20). ``'dual_averaging'``: step size only, identity (or the given)
            mass matrix. ``'none'``: nothing adapts.
        num_steps: warm-up iterations.
        target_accept: the dual averaging's target mean acceptance (see :func:`step_size_adaptation`); default
            BlackJAX's.
        gamma: the dual averaging's ``gamma`` (see :func:`step_size_adaptation`); default BlackJAX's.
        t0: the dual averaging's ``t0`` (see :func:`step_size_adaptation`); default BlackJAX's.
        kappa: the dual averaging's ``kappa`` (see :func:`step_size_adaptation`); default BlackJAX's.
        step_scale: after the last warm-up iteration the step is ``step_scale * exp(log_step_size_avg)``.

    Returns:
        :class:`Warmup`. After update ``t = num_steps - 1`` the state holds the final step and mass matrix.
    """
    from blackjax.adaptation.mass_matrix import mass_matrix_adaptation
    from blackjax.adaptation.window_adaptation import build_schedule

    if adaptation not in ADAPTATIONS:
        raise ValueError(f"warmup_adaptation: adaptation must be one of {ADAPTATIONS}, got {adaptation!r}")
    num_steps = int(num_steps)
    if num_steps < 0:
        raise ValueError(f"warmup_adaptation: num_steps must be >= 0, got {num_steps}")
    da = step_size_adaptation(target_accept, gamma=gamma, t0=t0, kappa=kappa)
    mm_init, mm_update, mm_final = mass_matrix_adaptation(True)
    if adaptation == "window" and num_steps > 0:
        schedule = np.asarray(build_schedule(num_steps), dtype=np.int32).reshape(num_steps, 2)
    else:
        schedule = np.zeros((num_steps, 2), np.int32)

    def init(position, step_size, inverse_mass_matrix=None) -> WarmupState:
        flat, _ = ravel_pytree(position)
        imm = jnp.ones(flat.shape, flat.dtype) if inverse_mass_matrix is None else jnp.asarray(inverse_mass_matrix)
        mass = None
        if adaptation == "window":
            mass = mm_init(flat.shape[0])._replace(inverse_mass_matrix=imm)
        step = jnp.asarray(step_size, flat.dtype)
        return WarmupState(da.init(step), mass, step, imm)

    def update(state: WarmupState, t, position, acceptance_rate) -> WarmupState:
        if adaptation == "none":
            return state
        acc = jnp.where(jnp.isnan(acceptance_rate), 0.0, acceptance_rate)
        t = jnp.asarray(t)
        new_da = da.update(state.da, acc)
        step = jnp.exp(new_da.log_step_size)
        mass, imm = state.mass, state.inverse_mass_matrix
        if adaptation == "window":
            stage = jnp.asarray(schedule)[t]
            flat, _ = ravel_pytree(position)
            mass = _where(stage[0] == 1, mm_update(mass, flat), mass)
            # end of a slow window: new mass matrix, dual averaging restarted from the window's averaged step
            ended = mm_final(mass)
            da_restart = da.init(jnp.exp(new_da.log_step_size_avg))
            mass, new_da, step, imm = _where(stage[1] == 1,
                                             (ended, da_restart, jnp.exp(da_restart.log_step_size),
                                              ended.inverse_mass_matrix),
                                             (mass, new_da, step, imm))
        final = (step_scale * jnp.exp(new_da.log_step_size_avg)).astype(step.dtype)
        step = jnp.where(t == num_steps - 1, final, step.astype(state.step_size.dtype))
        return WarmupState(new_da, mass, step, imm.astype(state.inverse_mass_matrix.dtype))

    return Warmup(init, update, schedule, num_steps, adaptation)


def _where(cond, a, b):
    return jax.tree_util.tree_map(lambda x, y: jnp.where(cond, x, y), a, b)


def pool_min_step(step):
    """The pooled-step option: every chain (leading axis) gets the smallest of the chains' adapted steps.

    Args:
        step: the chains' step sizes ``(chains,)``, or their stacked ``DualAveragingAdaptationState`` (then the
            averaged ``log_step_size_avg``, the one used after burn-in, is pooled).

    Returns:
        The same structure with every chain's (averaged) step replaced by the minimum over chains. A chain that
        is still far from the posterior bulk when burn-in ends adapts to its flatter surroundings; its larger
        step becomes unstable as it descends (cross-chain adaptation, frozen before the first kept iteration).
    """
    if hasattr(step, "log_step_size_avg"):
        avg = step.log_step_size_avg
        return step._replace(log_step_size_avg=jnp.full_like(avg, jnp.min(avg)))
    step = jnp.asarray(step)
    return jnp.full_like(step, jnp.min(step))
