"""Optimiser pieces shared by the training loops (`smnngp.hyper`, `smnngp.variational`)."""

from __future__ import annotations

import functools

import jax
import optax


@functools.lru_cache(maxsize=32)
def plateau(factor: float, patience: int):
    """`optax.contrib.reduce_on_plateau` (rtol 1e-4) and its jitted state update ``update(state, value) -> state``.

    Called eagerly, the update's ``lax.cond`` is compiled anew on every call (a new closure each time); jitted once
    per (factor, patience) here, it is compiled once per process.
    """
    reducer = optax.contrib.reduce_on_plateau(factor=factor, patience=patience, rtol=1e-4, atol=0.0)
    return reducer, jax.jit(lambda state, value: reducer.update(updates=None, state=state, value=value)[1])
