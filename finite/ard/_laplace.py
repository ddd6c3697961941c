"""Laplace posteriors (Eq. 22) of a trained network: `LaplacePosterior`, `laplace` (per-layer blocks of the
one-step likelihood), `laplace_simulation` (joint, under the free-run likelihood), `sample_laplace` and
`linearised_predictive`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from finite.ard._hessians import _clamp_psd, layer_hessians
from finite.ard._network import ArdMLP, Layer, _check_data
from finite.ard._prior import HESSIANS, ArdState
from finite.ard._simulation import simulate
from finite.checks import check_positive

__all__ = ["LaplacePosterior", "laplace", "laplace_simulation", "linearised_predictive", "sample_laplace"]


class LaplacePosterior(NamedTuple):
    """A Gaussian ``N(W*, Sigma)`` over the kept weights, mean at the trained weights (the Newton step of Eq. 22a
    is zero at an optimum); pruned weights have zero variance and biases are held at their trained values.

    ``structure="layer"`` (Eq. 22b): one independent Gaussian per layer, ``Sigma_l = (H_l + Upsilon_l^{-1})^{-1}``
    with ``H_l`` that layer's Hessian block; ``factors`` per layer a matrix ``F`` with ``F F^T`` the covariance of
    the row-major vectorised weights (dense Hessians), or the ``(n_in, n_out)`` standard deviations (diagonal).
    ``structure="network"``: one Gaussian over all layers' weights at once (concatenated in layer order, each
    row-major), ``Sigma = (G + Upsilon^{-1})^{-1}`` with ``G = J^T diag(w) J / sigma^2`` the Gauss-Newton matrix of
    the whole network; ``factors`` is a 1-tuple holding its ``F``. ``structure`` is read off the factors (one
    factor for several layers), so that the posterior is a pytree of arrays only (``jit``/``vmap`` take it); for a
    one-layer network the two structures coincide.

    Attributes:
        mean: the trained network parameters ``W*`` (with its biases), a tuple of :class:`Layer`.
        factors: the covariance factors described above (one per layer, or a 1-tuple for ``"network"``).
        masks: per layer, the 0/1 ``(n_in, n_out)`` weight masks; sampled weights are multiplied by them.
    """

    mean: tuple
    factors: tuple
    masks: tuple

    @property
    def structure(self) -> str:
        return "network" if len(self.factors) == 1 and len(self.mean) > 1 else "layer"


def _scaled_factor(v, H):
    """``F`` with ``F F^T = (H + diag(1/v))^{-1}`` for variances ``v >= 0`` (zero: the weight is fixed), via
    ``S (I + S H S)^{-1} S``, ``S = diag(sqrt(v))`` -- finite however small ``v`` gets; ``H`` is clamped to PSD."""
    s = jnp.sqrt(v)
    lam, U = jnp.linalg.eigh(jnp.eye(s.size, dtype=H.dtype) + s[:, None] * _clamp_psd(H) * s[None, :])
    return s[:, None] * U / jnp.sqrt(lam)[None, :]


def laplace(model: ArdMLP, params, state: ArdState, Z, y, *, weights=None, hessian: str = "exact",
            structure: str = "layer") -> LaplacePosterior:
    """The Laplace posterior at ``params`` with the prior variances ``state.upsilon`` (zero for pruned weights)
    and noise ``state.sigma2``. ``structure="layer"`` is the paper's per-layer posterior (Eq. 22) with ``hessian``
    one of :data:`HESSIANS`; ``structure="network"`` the joint posterior of all layers with the network's
    Gauss-Newton matrix (``hessian`` must be ``"gauss-newton"``; see :class:`LaplacePosterior`). Drawing the
    per-layer posteriors independently ignores how the layers' weights co-vary, which widens sampled free runs;
    the network posterior keeps those correlations (RESULTS.md section 4).

    Args:
        model: the :class:`ArdMLP`.
        params: the trained network parameters (the posterior mean), a tuple of :class:`Layer`.
        state: the :class:`ArdState` of the trained network (``upsilon``, ``masks`` and ``sigma2`` are used).
        Z: regressors ``(N, sizes[0])``.
        y: targets ``(N,)``.
        weights: optional sample weights ``(N,)`` of the data term (default all ones).
        hessian: one of :data:`HESSIANS` (``structure="layer"``); ``"gauss-newton"`` for ``"network"``.
        structure: ``"layer"`` or ``"network"``.

    Returns:
        The :class:`LaplacePosterior`.

    Raises:
        ValueError: invalid data, an unknown ``structure`` or ``hessian``, or ``structure="network"`` with a
            ``hessian`` other than ``"gauss-newton"``.
    """
    Z, y, w = _check_data(Z, y, weights, model, "laplace")
    if structure not in ("layer", "network"):
        raise ValueError(f"laplace: structure must be 'layer' or 'network', got {structure!r}")
    if structure == "network":
        if hessian != "gauss-newton":
            raise ValueError(f"laplace: structure='network' uses the network's Gauss-Newton matrix; pass "
                             f"hessian='gauss-newton' (got {hessian!r})")
        return _joint_laplace(params, state, lambda p: model.apply(p, Z), w, state.sigma2)
    if hessian not in HESSIANS:
        raise ValueError(f"laplace: unknown hessian {hessian!r}; choose from {HESSIANS}")
    H = layer_hessians(model, params, Z, y, w, state.sigma2, hessian)
    factors = []
    for Hl, u, m in zip(H, state.upsilon, state.masks):
        v = u * m
        if hessian == "diagonal":
            factors.append(jnp.sqrt(v / (1.0 + v * jnp.clip(Hl, 0.0, None))))
        else:
            factors.append(_scaled_factor(v.ravel(), Hl))
    return LaplacePosterior(tuple(params), tuple(factors), tuple(state.masks))


def _flat_weights(params):
    """All layers' weights concatenated, each row-major (the coordinates of the joint Laplace posterior)."""
    return jnp.concatenate([p.W.ravel() for p in params])


def _with_flat_weights(params, vec, scale=None):
    """``params`` with the weights replaced by the flat vector ``vec`` (:func:`_flat_weights`' layout), each
    layer's weights multiplied by ``scale[l]`` when given (masks); biases kept."""
    parts = jnp.split(vec, np.cumsum([p.W.size for p in params])[:-1])
    scale = (1.0,) * len(params) if scale is None else scale
    return tuple(Layer(v.reshape(p.W.shape) * sc, p.b) for v, p, sc in zip(parts, params, scale))


def _joint_laplace(params, state: ArdState, outputs: Callable, w, sigma2) -> LaplacePosterior:
    """``N(W*, (J^T diag(w) J / sigma2 + Upsilon^{-1})^{-1})`` over all layers' weights, ``J`` the Jacobian of
    ``outputs(params) -> (T,)`` with respect to the concatenated row-major weights (biases held fixed)."""
    J = jax.jacfwd(lambda vec: outputs(_with_flat_weights(params, vec)))(_flat_weights(params))
    G = (J * w[:, None]).T @ J / sigma2
    v = jnp.concatenate([(u * m).ravel() for u, m in zip(state.upsilon, state.masks)])
    return LaplacePosterior(tuple(params), (_scaled_factor(v, G),), tuple(state.masks))


def laplace_simulation(model: ArdMLP, params, state: ArdState, u, y, n_a: int, n_b: int | None = None, *,
                       sigma2=None) -> LaplacePosterior:
    """Our addition: the joint Laplace posterior of the *output-error* (free-run) model ``y(t) = sim_t(u; W) + e``,
    ``e ~ N(0, sigma2)``, for a network fine-tuned on its simulation error (:func:`finetune_simulation`):
    ``N(W*, (J^T J / sigma2 + Upsilon^{-1})^{-1})`` with ``J`` the Jacobian of the free run over the record
    ``(u, y)`` (after its ``max(n_a, n_b)`` measured start) through the ``lax.scan`` of :func:`simulate`, and
    ``sigma2`` by default the free run's MSE there. The one-step posterior (:func:`laplace`) constrains only the
    directions the one-step predictions see; the free run also depends on directions they leave at their prior
    variance, so its sampled free runs spread far wider than the errors of the free run itself.

    Args:
        model: the :class:`ArdMLP`.
        params: the fine-tuned network parameters (the posterior mean), a tuple of :class:`Layer`.
        state: an :class:`ArdState` whose ``upsilon`` and ``masks`` give the prior variances (zero for pruned
            weights); its ``sigma2`` is not used.
        u: the input record ``(T,)``.
        y: the measured output record ``(T,)``.
        n_a: the input lag (>= 0).
        n_b: the output lag (>= 1, default ``n_a``).
        sigma2: the noise variance of the free run; ``None`` takes the free run's MSE after the first
            ``max(n_a, n_b)`` samples.

    Returns:
        The :class:`LaplacePosterior` with a single factor over all layers' weights (the ``"network"``
        structure when the network has several layers).

    Raises:
        ValueError: ``sigma2`` is not positive and finite.
    """
    n_b = n_a if n_b is None else n_b
    m = max(n_a, n_b)
    u, y = jnp.asarray(u), jnp.asarray(y)
    if sigma2 is None:
        sigma2 = jnp.mean((simulate(model, params, u, y, n_a, n_b)[m:] - y[m:]) ** 2)
    sigma2 = check_positive(sigma2, "sigma2", "laplace_simulation")
    return _joint_laplace(params, state, lambda p: simulate(model, p, u, y, n_a, n_b)[m:],
                          jnp.ones(y.shape[0] - m, y.dtype), sigma2)


def sample_laplace(key, post: LaplacePosterior, num_samples: int):
    """``num_samples`` parameter draws from :class:`LaplacePosterior` (stacked on a leading axis).

    Args:
        key: PRNG key.
        post: the :class:`LaplacePosterior` to draw from (either structure).
        num_samples: the number of draws.

    Returns:
        A tuple of :class:`Layer` whose arrays have a leading axis ``num_samples``: the drawn weights (pruned
        weights are zero) and the posterior mean's biases.
    """
    if post.structure == "network":
        (F,) = post.factors
        flat = _flat_weights(post.mean)

        def joint(k):
            return _with_flat_weights(post.mean, flat + F @ jax.random.normal(k, (F.shape[1],), F.dtype), post.masks)
        return jax.vmap(joint)(jax.random.split(key, num_samples))

    def one(k):
        out = []
        for kk, p, F, m in zip(jax.random.split(k, len(post.mean)), post.mean, post.factors, post.masks):
            if F.shape == p.W.shape:
                W = p.W + F * jax.random.normal(kk, p.W.shape, p.W.dtype)
            else:
                W = p.W + (F @ jax.random.normal(kk, (F.shape[1],), p.W.dtype)).reshape(p.W.shape)
            out.append(Layer(W * m, p.b))
        return tuple(out)
    return jax.vmap(one)(jax.random.split(key, num_samples))


def linearised_predictive(post: LaplacePosterior, fn: Callable):
    """The predictive of ``fn(params) -> (T,)`` (one-step outputs, a free run, ...) under the Laplace posterior
    *linearised* at its mean, ``fn(W) ~ fn(W*) + J (W - W*)``: returns ``(fn(W*), std (T,))`` with
    ``std_t^2 = [J Sigma J^T]_tt`` (parameter uncertainty only; add the noise variance for a band of
    observations). Where ``fn`` is strongly non-linear in the weights -- a free run near the edge of stability --
    sampled weights (:func:`sample_laplace`) can leave the region where the Gaussian is meaningful and diverge;
    the linearised predictive (the GLM predictive of the linearised network) stays in it.

    Args:
        post: the :class:`LaplacePosterior` (either structure).
        fn: a function of the network parameters (a tuple of :class:`Layer`) returning a ``(T,)`` array,
            differentiable in the weights.

    Returns:
        ``(fn(W*), std)``: the prediction at the posterior mean and its standard deviation, both ``(T,)``.
    """
    mean = fn(tuple(post.mean))
    if post.structure == "network":
        (F,) = post.factors
        JF = jax.jacfwd(lambda vec: fn(_with_flat_weights(post.mean, vec)))(_flat_weights(post.mean)) @ F
        return mean, jnp.sqrt(jnp.sum(JF * JF, axis=1))
    var = jnp.zeros_like(mean)
    for l, (p, F) in enumerate(zip(post.mean, post.factors)):
        def g(W, l=l):
            ps = list(post.mean)
            ps[l] = Layer(W, ps[l].b)
            return fn(tuple(ps))
        J = jax.jacfwd(g)(p.W).reshape(mean.shape[0], -1)
        JF = J * F.ravel()[None, :] if F.shape == p.W.shape else J @ F
        var = var + jnp.sum(JF * JF, axis=1)
    return mean, jnp.sqrt(var)
