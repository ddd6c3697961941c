"""Inducing-point initialisation: `stratified_inducing` (training inputs with the classes in proportion)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from smnngp._checks import check_finite
from smnngp.variational._model import _positive_int

__all__ = ["stratified_inducing"]


def stratified_inducing(x, y, num_inducing: int, key):
    """``num_inducing`` distinct training inputs with classes in proportion to their frequencies.

    Each class c gets ``round(M n_c / N)`` points (largest remainders; at least one per class when M >= number of
    classes, never more than the class has), drawn uniformly without replacement within the class; ``y=None``
    draws a uniform subset.  Returns (M, ...) inputs, grouped by class.

    Args:
        x: training inputs, (N, ...).
        y: class labels, (N,), or ``None`` for a uniform subset.
        num_inducing: number M of inducing inputs, at most N.
        key: JAX PRNG key for the draws.

    Returns:
        JAX array (M, ...) of rows of ``x``: grouped by class in sorted label order, or in their original order when
        ``y`` is ``None``.

    Raises:
        ValueError: if ``x`` is not (N, ...) or not finite, ``num_inducing`` is not a positive integer at most N, or
            ``y`` is not (N,).
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (N, features...), got {x.shape}")
    N = x.shape[0]
    M = _positive_int(num_inducing, "num_inducing")
    if M > N:
        raise ValueError(f"num_inducing={M} exceeds the {N} training points in x")
    check_finite(x, "x")
    if y is None:
        idx = np.asarray(jax.random.choice(key, N, (M,), replace=False))
        return jnp.asarray(x[np.sort(idx)])
    y = np.asarray(y)
    if y.shape != (N,):
        raise ValueError(f"y must have shape ({N},) (one label per row of x), got {y.shape}")
    classes, counts = np.unique(y, return_counts=True)
    exact = M * counts / N
    alloc = np.floor(exact).astype(int)
    if M >= len(classes):
        alloc = np.maximum(alloc, 1)
    alloc = np.minimum(alloc, counts)
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    while alloc.sum() != M:
        if alloc.sum() < M:
            for j in order:
                if alloc[j] < counts[j]:
                    alloc[j] += 1
                    break
        else:
            j = int(np.argmax(alloc - exact))
            alloc[j] -= 1
    idx = []
    for j, c in enumerate(classes):
        members = np.flatnonzero(y == c)
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, j), members.shape[0]))
        idx.append(members[perm[: alloc[j]]])
    return jnp.asarray(x[np.concatenate(idx)])
