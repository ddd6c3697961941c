"""Matrix-free solves of ``K + s I`` over a grid of shifts ``s``, interpolated between them.

The unscaled-noise model ``Y ~ N(0, beta K + sigma_n^2 I)`` needs, for every importance sample ``beta`` of the
scale, ``q = tr(Y^T C^-1 Y)`` and ``log|C|`` of ``C = beta K + sigma_n^2 I = beta (K + s I)`` with
``s = sigma_n^2 / beta``. The dense path has them for all ``beta`` from one eigendecomposition. Without the
matrix, they are smooth (analytic) functions of ``t = log s``: ``d log|K + s I| / dt = s tr((K + s I)^-1)`` lies in
``(0, N)``. So :func:`fit_grid` solves at a few nodes ``t_g`` (each one matrix-free run of `smnngp.matfree`,
with the pivoted-Cholesky factor of ``K`` computed once and shifted, and the same probes at every node so that
the log-determinant estimates vary smoothly), and everything per sample is a cubic spline through the nodes,
written as a fixed basis: ``f(t) = sum_g B_g(t) f(t_g)`` (:func:`spline_basis`). That basis is linear in the node
values, which is what makes the predictions cheap: a mixture's mean, variance and covariance are weighted sums
over samples of interpolated node values, i.e. sums over nodes.

Two passes: a coarse grid over the whole range of the sampled shifts locates the posterior's mass; a fine grid
over the shifts whose weight is within ``exp(-FINE_SPAN)`` of the largest carries it (the samples outside, less
than ``num_samples x exp(-30)`` of the mass together, are dropped). The interpolation's error is estimated by the
change in the log marginal likelihood when every other fine node is left out, and reported.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.interpolate import CubicSpline

from smnngp import matfree

__all__ = ["GridFit", "fit_grid", "spline_basis", "log_spaced", "COARSE_NODES", "FINE_NODES", "FINE_SPAN"]

# nodes of the two passes (log-spaced in s); the fine pass is what the retained samples are interpolated from
COARSE_NODES = 12
FINE_NODES = 12
# the fine grid spans the samples whose weight is within exp(-FINE_SPAN) of the largest
FINE_SPAN = 30.0


class GridFit(NamedTuple):
    """Solves of ``K + s I`` at nodes ``t = log s`` (ascending): ``alpha`` (G, N, C), ``q`` (G,), ``logdet``
    (G,) with ``logdet_stderr`` (G,), CG ``iterations`` and ``residual`` (worst over the nodes) and the CG
    ``tol``."""

    t: np.ndarray
    alpha: jax.Array
    q: np.ndarray
    logdet: np.ndarray
    logdet_stderr: np.ndarray
    iterations: int
    residual: float
    tol: float


def spline_basis(t_nodes, t) -> np.ndarray:
    """The spline as a basis: ``f(t) = B @ f(t_nodes)`` for the not-a-knot cubic spline through the nodes (linear
    for two nodes, constant for one); outside the nodes' range the end polynomials extrapolate.

    Args:
        t_nodes: ascending node positions, (G,).
        t: where to evaluate, scalar or (M,).

    Returns:
        ``B``, (M, G).
    """
    t_nodes, t = np.asarray(t_nodes, float), np.atleast_1d(np.asarray(t, float))
    g = t_nodes.shape[0]
    if g == 1:
        return np.ones((t.shape[0], 1))
    return CubicSpline(t_nodes, np.eye(g), axis=0)(t)


def log_spaced(lo: float, hi: float, count: int) -> np.ndarray:
    """Nodes for shifts from ``lo`` to ``hi``.

    Returns:
        ``count`` values ``t = log s`` from ``log lo`` to ``log hi`` (one when the range is a point).
    """
    if not hi > lo * (1 + 1e-9):
        return np.array([math.log(lo)])
    return np.linspace(math.log(lo), math.log(hi), count)


def fit_grid(op: matfree.KernelOperator, Y, t_nodes, options: matfree.CG, precond: matfree.PivotedCholesky):
    """Matrix-free solves at every node: ``(K + e^t I)^-1 Y`` and ``log|K + e^t I|`` (SLQ), one CG run per node.

    Args:
        op: the operator of ``K`` (any shift; it is replaced by each node's).
        Y: (N, C) right-hand sides.
        t_nodes: ascending node values ``t = log s``.
        options: a `smnngp.matfree.CG` (its ``seed`` fixes the probes: the same at every node).
        precond: a pivoted-Cholesky factor of ``K`` (its shift is replaced by each node's).

    Returns:
        :class:`GridFit`.
    """
    alphas, qs, lds, ses, iters, worst = [], [], [], [], 0, 0.0
    tol = options.tolerance(op.dtype)
    for t in np.asarray(t_nodes, float):
        s = math.exp(t)
        op_s, pc_s = op.with_shift(s), precond._replace(shift=s)
        alpha, info, est, _ = matfree.solve(op_s, Y, options, precond=pc_s)
        alphas.append(alpha)
        qs.append(float(jnp.sum(Y * alpha)))
        lds.append(est.value)
        ses.append(est.stderr)
        iters, worst = max(iters, info.iterations), max(worst, info.residual)
    return GridFit(np.asarray(t_nodes, float), jnp.stack(alphas), np.array(qs), np.array(lds), np.array(ses),
                   iters, worst, tol)
