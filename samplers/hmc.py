"""One BlackJAX HMC (or NUTS) transition with dual-averaging step size, for a log density that changes per call.

The masked-BNN sampler changes its target between HMC trajectories (the
masks and the noise move), so the HMC state (position, log density and its
gradient) is rebuilt from the position for every trajectory; the step size
lives in a BlackJAX ``DualAveragingAdaptationState`` that is updated during
burn-in (``adapt=True``) and read through its running average afterwards
(Hoffman and Gelman 2014, section 3.2.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["StepSizeAdaptation", "step_size_adaptation", "hmc_step", "TrajectoryInfo"]


class TrajectoryInfo(NamedTuple):
    """What HMC and NUTS both report: mean acceptance probability, whether the position moved, divergence,
    and gradient evaluations."""

    acceptance_rate: jnp.ndarray
    is_accepted: jnp.ndarray
    is_divergent: jnp.ndarray
    num_integration_steps: jnp.ndarray


class StepSizeAdaptation(NamedTuple):
    init: Callable
    update: Callable


def step_size_adaptation(target_accept: float = 0.7, gamma: float = 0.2, t0: float = 10.0,
                         kappa: float = 0.75) -> StepSizeAdaptation:
    """BlackJAX dual averaging; the defaults are the masked-BNN authors' settings (BlackJAX's gamma is 0.05)."""
    from blackjax.adaptation.step_size import dual_averaging_adaptation

    init, update, _ = dual_averaging_adaptation(target_accept, t0=t0, gamma=gamma, kappa=kappa)
    return StepSizeAdaptation(init, update)


def hmc_step(key, position, logdensity: Callable, da_state, adaptation: StepSizeAdaptation, *, adapt,
             num_integration_steps: int = 20, kernel: str = "hmc", sampling_scale: float = 1.0):
    """One trajectory. Returns ``(position, da_state, step_size, TrajectoryInfo)``.

    ``adapt`` may be traced (one compiled program serves burn-in and sampling). After adaptation the step is
    ``sampling_scale`` times the dual-averaging result.

    A trajectory whose acceptance probability is NaN counts as rejected
    (probability 0) in the step-size adaptation.
    """
    from blackjax.mcmc import hmc, nuts

    adapt = jnp.asarray(adapt)
    eps = jnp.exp(jnp.where(adapt, da_state.log_step_size, da_state.log_step_size_avg + jnp.log(sampling_scale)))
    leaves = jax.tree_util.tree_leaves(position)
    inv_mass = jnp.ones((sum(x.size for x in leaves),), leaves[0].dtype)
    state = hmc.init(position, logdensity)
    if kernel == "nuts":
        state, info = nuts.build_kernel()(key, state, logdensity, eps, inv_mass)
    elif kernel == "hmc":
        state, info = hmc.build_kernel()(key, state, logdensity, eps, inv_mass, num_integration_steps)
    else:
        raise ValueError(f"hmc_step: kernel must be 'hmc' or 'nuts', got {kernel!r}")
    acc = jnp.where(jnp.isnan(info.acceptance_rate), 0.0, info.acceptance_rate)
    updated = adaptation.update(da_state, acc)
    da_state = jax.tree_util.tree_map(lambda new, old: jnp.where(adapt, new, old), updated, da_state)
    moved = jnp.any(jnp.stack([jnp.any(a != b) for a, b in zip(jax.tree_util.tree_leaves(state.position),
                                                                  jax.tree_util.tree_leaves(position))]))
    out = TrajectoryInfo(acc, getattr(info, "is_accepted", moved), info.is_divergent,
                         jnp.asarray(info.num_integration_steps))
    return state.position, da_state, eps, out
