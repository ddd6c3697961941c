"""Finite-width counterparts of `kernel_fn`: Monte-Carlo NNGP and the empirical NTK (smnngp's own helpers).

Used to check convergence (tests, quickstart, notebooks) and for finite ensembles.
Both average over output channels, the convention of the infinite-width kernels
(one kernel per channel).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["sample_outputs", "monte_carlo_nngp", "empirical_ntk"]


def sample_outputs(init_fn: Callable, apply_fn: Callable, x, key, n_draws: int, chunk: int = 256) -> np.ndarray:
    """Outputs of ``n_draws`` independently initialised networks on ``x``: (n_draws, N, ...).

    Networks are drawn ``chunk`` at a time under one `jit` + `vmap`, so memory
    holds ``chunk`` parameter sets at once.

    Args:
        init_fn: network initialiser ``init_fn(key, input_shape) -> (output_shape, params)``, as returned by
            the layers of :mod:`smnngp.stax`.
        apply_fn: network forward pass ``apply_fn(params, x) -> outputs``.
        x: inputs of shape (N, ...), the same for every draw.
        key: JAX PRNG key; it is split into ``n_draws`` keys, one per network.
        n_draws: number of independently initialised networks (at least 1).
        chunk: number of networks evaluated per `jit` + `vmap` call (at least 1); bounds the memory used.

    Returns:
        NumPy array of shape (n_draws, N, ...): the outputs of each network on ``x``, stacked along the
        first axis.

    Raises:
        ValueError: if ``n_draws`` or ``chunk`` is smaller than 1.
    """
    if n_draws < 1 or chunk < 1:
        raise ValueError(f"sample_outputs: n_draws and chunk must be positive, got {n_draws}, {chunk}")
    x = jnp.asarray(x)

    @jax.jit
    def batch(keys):
        def one(k):
            _, params = init_fn(k, x.shape)
            return apply_fn(params, x)

        return jax.vmap(one)(keys)

    keys = jax.random.split(key, n_draws)
    return np.concatenate([np.asarray(batch(keys[i : i + chunk])) for i in range(0, n_draws, chunk)])


def monte_carlo_nngp(init_fn: Callable, apply_fn: Callable, x, key, n_draws: int, chunk: int = 256):
    """Empirical E[f(x_i) f(x_j)] over random initialisations, averaged over output channels.

    Returns (estimate, standard_error), both (N, N); the standard error is that of
    the mean of f_i f_j over draws (channels pooled per draw).

    Args:
        init_fn: network initialiser ``init_fn(key, input_shape) -> (output_shape, params)``.
        apply_fn: network forward pass ``apply_fn(params, x) -> outputs``.
        x: inputs of shape (N, ...).
        key: JAX PRNG key for the random initialisations.
        n_draws: number of networks drawn (at least 2 for a finite standard error).
        chunk: number of networks evaluated at once (see :func:`sample_outputs`).

    Returns:
        Tuple ``(estimate, standard_error)`` of NumPy arrays of shape (N, N): the Monte-Carlo mean of
        ``f(x_i) . f(x_j) / C`` over the draws (C the number of output channels) and its standard error.

    Raises:
        ValueError: if ``n_draws`` or ``chunk`` is smaller than 1 (from :func:`sample_outputs`).
    """
    f = sample_outputs(init_fn, apply_fn, x, key, n_draws, chunk)
    f = f.reshape(f.shape[0], f.shape[1], -1)
    prods = np.einsum("mic,mjc->mij", f, f) / f.shape[-1]
    return prods.mean(0), prods.std(0, ddof=1) / np.sqrt(n_draws)


def empirical_ntk(apply_fn: Callable, params, x1, x2=None):
    """sum_p df(x1)/dp df(x2)/dp over all parameters, averaged over output channels: (N1, N2).

    Args:
        apply_fn: network forward pass ``apply_fn(params, x) -> outputs`` of shape (N, ...).
        params: parameter pytree at which the Jacobians are taken.
        x1: first inputs, shape (N1, ...).
        x2: second inputs, shape (N2, ...); ``None`` (default) reuses ``x1`` and its Jacobian.

    Returns:
        JAX array of shape (N1, N2): the empirical neural tangent kernel, the inner product of the parameter
        Jacobians summed over all parameters and divided by the number of output channels.
    """
    x1 = jnp.asarray(x1)

    def flat_jac(x):
        jac = jax.jacrev(lambda p: apply_fn(p, x))(params)
        leaves = jax.tree_util.tree_leaves(jac)
        n, c = x.shape[0], int(np.prod(apply_fn(params, x).shape[1:]))
        return [leaf.reshape(n, c, -1) for leaf in leaves], c

    j1, c = flat_jac(x1)
    j2 = j1 if x2 is None else flat_jac(jnp.asarray(x2))[0]
    return sum(jnp.einsum("icp,jcp->ij", a, b) for a, b in zip(j1, j2)) / c
