"""HMC / NUTS for ARD and group-ARD networks (`finite.ard`), on the shared driver (`samplers.driver`).

The position is the non-centred one of `finite.ard.position_to_params`: ``z`` per weight (``W = sqrt(upsilon) z``),
the biases and one ``log Upsilon_g`` per group, with an inverse-gamma hyper-prior on every group variance
(`finite.ard.log_density`). Non-centring removes the funnel between a group's variance and its weights that
stalls a centred HMC when a group is switched off. Weights pruned by Algorithm 1 can be held at zero
(``masks``): their ``z`` still moves but multiplies a zero, so only the kept weights enter the likelihood.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from finite import ard
from samplers import driver

__all__ = ["sample", "summarise"]


def sample(model: ard.ArdMLP, Z, y, key, *, sigma2: float, group: str = "row+column", block=(2, 2),
           hyper=(1.0, 1e-2), bias_var: float = 1.0, fixed_variances=None, masks=None, init_params=None,
           functions: dict[str, Callable] | None = None, keep_position: bool = True,
           **driver_kwargs) -> driver.DriverResult:
    """Sample the ARD network's posterior with `samplers.driver.sample` (NUTS with window adaptation unless
    ``driver_kwargs`` say otherwise: ``num_chains``, ``num_warmup``, ``num_samples``, ``thinning``, ``chunk``,
    ``checkpoint``, ``progress``, ...).

    Args:
      model: the :class:`~finite.ard.ArdMLP` network.
      Z: regressors ``(N, d)`` of its regression data (`finite.ard.narx_regressors`).
      y: targets ``(N,)`` of its regression data.
      key: PRNG key.
      sigma2: the noise variance (e.g. Algorithm 1's training MSE).
      group: the prior's grouping of the weights, one of `finite.ard.GROUPS` (`finite.ard.log_density`).
      block: the ``(rows, cols)`` block of the ``"shape"`` grouping (`finite.ard.log_density`).
      hyper: ``(a, b)`` of the inverse-gamma hyper-prior on every group variance (`finite.ard.log_density`).
      bias_var: the prior variance of every bias (`finite.ard.log_density`).
      fixed_variances: per layer, a scalar or ``(n_in, n_out)`` fixed prior variance that replaces the
        hyper-prior, or ``None`` (`finite.ard.log_density`).
      masks: optional per-layer 0/1 masks (Algorithm 1's sparsity pattern) held fixed during sampling.
      init_params: optional network to start from (e.g. Algorithm 1's weights): every chain starts at the position
        that maps back to it exactly (`finite.ard.init_position`), perturbed by 0.01 standard normals in the
        non-centred coordinates (``z``: 1 % of a prior standard deviation; ``log_var``: 1 % in scale).
      functions: extra ``name -> fn(params)`` kept at every draw (evaluated on the *network parameters*, not the
        raw position); ``"params"`` (the weights and biases) and ``"upsilon"`` (per-weight prior variances, zero
        where ``masks`` hold a weight at zero) are always kept.
      keep_position: also keep the raw position (``z``, the biases and, unless ``fixed_variances`` is given,
        ``log_var``) at every draw, as ``"position"``.
      **driver_kwargs: passed on to `samplers.driver.sample`.

    Returns:
      the driver's :class:`~samplers.driver.DriverResult`.

    Raises:
      ValueError: ``masks`` whose shapes are not the model's weight shapes; also the errors of
        `finite.ard.log_density` and `samplers.driver.sample`.
    """
    logp = ard.log_density(model, Z, y, sigma2, group=group, block=block, hyper=hyper, bias_var=bias_var,
                           fixed_variances=fixed_variances)
    if masks is not None:
        if len(masks) != len(model.shapes) or any(tuple(m.shape) != s for m, s in zip(masks, model.shapes)):
            raise ValueError(f"samplers.ard.sample: masks must have shapes {model.shapes}")
        masks = tuple(jnp.asarray(m) for m in masks)

        def logp_masked(pos):
            layers = tuple({"z": L["z"] * m, "b": L["b"]} for L, m in zip(pos["layers"], masks))
            # the masked z's keep a standard-normal prior so that the target stays proper
            rest = sum(-0.5 * jnp.sum((L["z"] * (1 - m)) ** 2) for L, m in zip(pos["layers"], masks))
            return logp({**pos, "layers": layers}) + rest
        target = logp_masked
    else:
        target = logp

    def to_params(pos):
        if masks is not None:
            pos = {**pos, "layers": tuple({"z": L["z"] * m, "b": L["b"]} for L, m in zip(pos["layers"], masks))}
        return ard.position_to_params(pos, model, group, block, fixed_variances)

    def init(k):
        k1, k2 = jax.random.split(k)
        pos = ard.init_position(k1, model, group, block, fixed_variances, params=init_params)
        if init_params is not None:
            leaves, tree = jax.tree_util.tree_flatten(pos)
            ks = jax.random.split(k2, len(leaves))
            leaves = [v + 0.01 * jax.random.normal(kk, v.shape, v.dtype) for v, kk in zip(leaves, ks)]
            pos = jax.tree_util.tree_unflatten(tree, leaves)
        return pos

    def variances(pos):
        ups = to_params(pos)[1]
        # a weight held at zero by its mask has no prior variance left: report 0 so that summaries of the sampled
        # sparsity count only the kept weights
        return ups if masks is None else tuple(u * m for u, m in zip(ups, masks))

    fns = {"params": lambda pos: to_params(pos)[0], "upsilon": variances}
    for name, fn in (functions or {}).items():
        fns[name] = (lambda f: (lambda pos: f(to_params(pos)[0])))(fn)
    return driver.sample(target, key, init, functions=fns, keep_position=keep_position, **driver_kwargs)


def summarise(result: driver.DriverResult, threshold: float = 1e-4) -> dict:
    """Posterior summaries of an ARD run: per layer the posterior-median variance of every weight and the
    fraction of weights whose median variance is at least ``threshold`` (the sampled sparsity pattern, beside
    Algorithm 1's ``kappa_upsilon`` pruning; weights held at zero by ``masks`` have variance 0 and count as pruned),
    and the driver's diagnostics of the weights.

    Args:
        result: the :class:`~samplers.driver.DriverResult` of :func:`sample` (its draws hold ``"upsilon"``).
        threshold: the variance at or above which a weight counts as kept (default 1e-4).

    Returns:
        A dict with ``"median_upsilon"`` (per layer, the ``(n_in, n_out)`` posterior medians over all chains and
        draws), ``"fraction_remaining"`` (a float) and ``"diagnostics"`` (the scalar entries of
        `samplers.driver.diagnostics`).
    """
    ups = result.draws["upsilon"]
    med = [np.median(np.asarray(u).reshape(-1, *np.shape(u)[2:]), axis=0) for u in ups]
    kept = sum(float(np.sum(m >= threshold)) for m in med) / sum(m.size for m in med)
    diag = driver.diagnostics(result)
    return {"median_upsilon": med, "fraction_remaining": kept,
            "diagnostics": {k: v for k, v in diag.items() if np.isscalar(v)}}
