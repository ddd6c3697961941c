"""The ARD log density for HMC (`samplers.ard` drives it): the non-centred position ``W = sqrt(upsilon) z``
(`position_to_params`, `init_position`) and `log_density` with inverse-gamma hyper-priors on the group
variances.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from finite.ard._network import ArdMLP, Layer
from finite.ard._prior import GROUPS, _combine, groupings
from finite.checks import check_positive

__all__ = ["log_density", "position_to_params", "init_position"]


def position_to_params(position, model: ArdMLP, group: str, block=(2, 2), fixed_variances=None):
    """Network parameters from an HMC position (non-centred: ``W = sqrt(upsilon) * z``, ``upsilon`` the combined
    per-weight variance of the groupings' ``exp(log_var)``, or ``fixed_variances`` per layer).

    Args:
        position: a dict with ``"layers"`` (per layer ``{"z": (n_in, n_out), "b": (n_out,)}``) and, unless
            ``fixed_variances`` is given, ``"log_var"`` (per layer, per grouping, ``(num_groups,)``).
        model: the :class:`ArdMLP`.
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` variance used instead of ``"log_var"``, or
            ``None``.

    Returns:
        ``(params, per-layer upsilon)``: a tuple of :class:`Layer` and the per-weight variances
        ``(n_in, n_out)`` per layer.
    """
    out, ups = [], []
    for l, shape in enumerate(model.shapes):
        layer = position["layers"][l]
        if fixed_variances is not None:
            v = jnp.broadcast_to(jnp.asarray(fixed_variances[l], layer["z"].dtype), shape)
        else:
            lg = groupings(shape, group, block)
            v = _combine([jnp.exp(lv)[jnp.asarray(g.ids)] for lv, g in zip(position["log_var"][l], lg)])
        out.append(Layer(jnp.sqrt(v) * layer["z"], layer["b"]))
        ups.append(v)
    return tuple(out), tuple(ups)


def init_position(key, model: ArdMLP, group: str, block=(2, 2), fixed_variances=None, params=None):
    """A starting HMC position: ``log_var = 0`` (every group variance 1), zero biases and standard-normal ``z``;
    or, from ``params`` (e.g. Algorithm 1's weights), ``z = W / sqrt(upsilon_0)`` with ``upsilon_0`` the starting
    combined variance (1/2 for ``"row+column"``, or ``fixed_variances``) and the given biases, so that
    :func:`position_to_params` returns ``params`` exactly.

    Args:
        key: PRNG key of the standard-normal ``z`` (not used when ``params`` is given).
        model: the :class:`ArdMLP`.
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` fixed variance (the position then has no
            ``"log_var"``), or ``None``.
        params: optional network parameters (a tuple of :class:`Layer`) to start from.

    Returns:
        The position: a dict with ``"layers"`` (per layer ``{"z", "b"}``) and, unless ``fixed_variances`` is
        given, ``"log_var"`` (per layer, per grouping, zeros of shape ``(num_groups,)``).
    """
    layers = []
    keys = jax.random.split(key, len(model.shapes))
    pos = {}
    if fixed_variances is None:
        pos["log_var"] = tuple(tuple(jnp.zeros(g.num) for g in groupings(s, group, block)) for s in model.shapes)
    for l, (k, shape) in enumerate(zip(keys, model.shapes)):
        if params is None:
            layers.append({"z": jax.random.normal(k, shape), "b": jnp.zeros(shape[1])})
            continue
        W = jnp.asarray(params[l].W)
        if fixed_variances is not None:
            v0 = jnp.broadcast_to(jnp.asarray(fixed_variances[l], W.dtype), shape)
        else:
            v0 = _combine([jnp.ones(shape, W.dtype) for _ in groupings(shape, group, block)])
        layers.append({"z": W / jnp.sqrt(v0), "b": jnp.asarray(params[l].b)})
    pos["layers"] = tuple(layers)
    return pos


def log_density(model: ArdMLP, Z, y, sigma2: float, *, group: str = "row+column", block=(2, 2),
                hyper=(1.0, 1e-2), bias_var: float = 1.0, fixed_variances=None) -> Callable:
    """The log posterior of the ARD / group-ARD network for HMC, in the non-centred parameterisation of
    :func:`position_to_params`:

        log N(y | Net(Z; W, b), sigma^2 I) + sum log N(z | 0, 1) + sum log N(b | 0, bias_var)
        + sum_groups [log InvGamma(Upsilon_g | a, b) + log Upsilon_g]        (the last term: d Upsilon / d log)

    ``hyper = (a, b)`` the inverse-gamma hyper-prior on every group variance (a proper version of the paper's
    flat Gamma(0, 0) hyper-prior, which has no normalisable posterior); ``fixed_variances`` (per layer, scalar or
    ``(n_in, n_out)``) drops the hyper-prior and fixes the variances (the Gaussian linear model of the tests).

    Args:
        model: the :class:`ArdMLP`.
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        sigma2: the noise variance ``sigma^2`` (positive, held fixed).
        group: one of :data:`GROUPS`.
        block: the ``(rows, cols)`` block of the ``"shape"`` grouping.
        hyper: ``(a, b)`` of the inverse-gamma hyper-prior, both positive.
        bias_var: the prior variance of every bias (positive).
        fixed_variances: per layer, a scalar or ``(n_in, n_out)`` fixed variance, or ``None``.

    Returns:
        The log density, a function ``position -> scalar`` (positions as in :func:`position_to_params`).

    Raises:
        ValueError: a ``sigma2``, ``bias_var`` or ``hyper`` entry that is not positive, or an unknown ``group``.
    """
    Z, y = jnp.asarray(Z), jnp.asarray(y)
    sigma2 = check_positive(sigma2, "sigma2", "log_density")
    bias_var = check_positive(bias_var, "bias_var", "log_density")
    a0 = check_positive(hyper[0], "hyper[0]", "log_density")
    b0 = check_positive(hyper[1], "hyper[1]", "log_density")
    if group not in GROUPS:
        raise ValueError(f"log_density: unknown group {group!r}; choose from {GROUPS}")
    n = y.shape[0]
    const = -0.5 * n * math.log(2 * math.pi * sigma2)

    def logp(position):
        params, _ = position_to_params(position, model, group, block, fixed_variances)
        r = model.apply(params, Z) - y
        lp = const - 0.5 * jnp.sum(r * r) / sigma2
        for layer in position["layers"]:
            lp = lp - 0.5 * jnp.sum(layer["z"] ** 2) - 0.5 * jnp.sum(layer["b"] ** 2) / bias_var
        if fixed_variances is None:
            for lvs in position["log_var"]:
                for lv in lvs:
                    # InvGamma(v | a, b) v = b^a / Gamma(a) v^{-a} exp(-b / v)   (density times the Jacobian)
                    lp = lp + jnp.sum(a0 * math.log(b0) - math.lgamma(a0) - a0 * lv - b0 * jnp.exp(-lv))
        return lp
    return logp
