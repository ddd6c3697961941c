"""Architectures whose scales are a pytree: `parametric_kernel`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.kernels import ParametricKernel
from smnngp.stax._core import (
    _as_layer,
)

# ---------------------------------------------------------------------------
# Hyperparameters as a pytree
# ---------------------------------------------------------------------------

__all__ = ["parametric_kernel"]


def parametric_kernel(arch: Callable, init, *, floor=0.0) -> ParametricKernel:
    """The NNGP of an architecture whose scales are a pytree, as a `smnngp.kernels.ParametricKernel`.

    ``arch(params) -> Layer`` builds the architecture from a pytree ``params`` of
    positive scales (``W_std``, ``b_std`` of each layer, activation parameters
    such as ``ABRelu``'s slopes), e.g.::

        def arch(p):
            return stax.serial(stax.Conv(1, (3, 3), padding='SAME', W_std=p['conv'], b_std=p['b']), stax.Relu(),
                               stax.AvgPool((2, 2), (2, 2)), stax.Flatten(), stax.Dense(1, W_std=p['out']))

        kernel = stax.parametric_kernel(arch, {'conv': 1.5, 'b': 0.1, 'out': 1.0})

    ``init`` has the structure of ``params`` and holds their starting values.
    Each leaf is ``value = floor + exp(theta)`` of an unconstrained ``theta``
    (so that gradient steps on ``theta`` are relative changes of the value);
    ``floor`` is one number or a pytree like ``init`` (default 0), and every
    initial value must exceed its floor. The kernel is

        ``apply(theta, x1, x2) = arch(floor + exp(theta))[2](x1, x2, 'nngp')``,

    ``jit``-able and differentiable in ``theta``: every layer constructor takes
    traced scales and checks its arguments only when they are concrete.
    Parameters that may be zero or negative (a LeakyRelu slope, an Erf shift)
    are not leaves of ``params``: close over them in ``arch`` to keep them
    fixed. The scales are cast to the inputs' dtype, so the kernel computes in
    the dtype of ``x1``. ``constrain(theta)`` returns the values (the
    structure of ``init``).
    """
    if not callable(arch):
        raise TypeError(f"parametric_kernel: arch must be callable (params -> stax layer), got {type(arch).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten(init)
    if not leaves:
        raise ValueError("parametric_kernel: init has no leaves; give the starting value of each scale")
    floors = _broadcast_floor(floor, init, treedef)
    theta_leaves = []
    for path, value, lo in zip(_leaf_paths(init), leaves, floors):
        v = np.asarray(value, dtype=float)
        if v.ndim != 0:
            raise ValueError(f"parametric_kernel: init{path} must be a scalar, got shape {v.shape}")
        v = float(v)
        if not (math.isfinite(v) and v > lo):
            raise ValueError(f"parametric_kernel: init{path} = {value!r} must be finite and above its floor {lo}")
        theta_leaves.append(jnp.asarray(math.log(v - lo)))
    theta = jax.tree_util.tree_unflatten(treedef, theta_leaves)
    apply, constrain = _stax_nngp(arch, treedef, tuple(floors))
    layer = arch(init)  # fails here, with the layer's own message, on an architecture its init cannot build
    _as_layer(layer, "parametric_kernel: arch(init)")
    return ParametricKernel(apply, theta, constrain)


def _leaf_paths(tree):
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _broadcast_floor(floor, init, treedef):
    if isinstance(floor, (int, float, np.integer, np.floating)):
        floors = [float(floor)] * treedef.num_leaves
    else:
        try:
            floors = [float(f) for f in treedef.flatten_up_to(floor)]
        except (ValueError, TypeError) as e:
            raise ValueError(f"parametric_kernel: floor must be a number or a pytree like init: {e}") from None
    if any(not (math.isfinite(f) and f >= 0) for f in floors):
        raise ValueError(f"parametric_kernel: floors must be finite and non-negative, got {floors}")
    return floors


@functools.lru_cache(maxsize=128)
def _stax_nngp(arch, treedef, floors):
    """``(apply, constrain)`` for one architecture and parameter structure.

    Cached, so that kernels built from the same ``arch`` share one ``apply``
    function object, and with it every compilation keyed on it (`jit`'s cache,
    the step functions of `smnngp.hyper`).
    """

    def constrain(theta):
        leaves = treedef.flatten_up_to(theta)
        return jax.tree_util.tree_unflatten(treedef, [lo + jnp.exp(t) for t, lo in zip(leaves, floors)])

    def apply(theta, x1, x2=None):
        dtype = jnp.result_type(x1)
        params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), constrain(theta))
        return arch(params)[2](x1, x2, "nngp")

    apply.__name__ = f"nngp_of_{getattr(arch, '__name__', 'arch')}"
    return apply, constrain
