"""The importance-sampling predictive: `GaussianMixture` (a numpyro distribution) and `interval`.

The (S, L) component arrays are reduced by compiled, fused functions, and a mixture whose scales factor as
``sqrt(beta_s var_i)`` is kept factorised, so that ``log_prob``, ``mean`` and ``variance`` cost O(S + L) memory.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import logsumexp, ndtr, ndtri

from smnngp._axes import lead
from smnngp.posterior._marginal import _LOG_2PI

__all__ = ["GaussianMixture", "interval"]


class GaussianMixture(dist.Distribution):
    """Per-point Gaussian mixture with shared component weights (the importance-sampling predictive).

    Component ``s`` has weight ``exp(log_weights[s])`` and, for every point,
    mean ``loc[s]`` and standard deviation ``scale[s]`` (broadcast to
    ``(S,) + batch_shape``).  ``log_prob`` is a ``logsumexp`` over components.

    Args:
        log_weights: unnormalised log weights of the S components, shape (S,); they are normalised on
            construction.
        loc: component means, broadcastable to ``(S,) + batch_shape`` with a leading axis of size 1 or S.
        scale: component standard deviations, broadcastable likewise.
        validate_args: numpyro's flag to validate arguments and values (``None``: numpyro's global default).

    Raises:
        ValueError: if ``loc`` and ``scale`` do not broadcast to a leading component axis of size 1 or S.
    """

    arg_constraints = {}
    support = dist.constraints.real
    # a pytree (numpyro's protocol), so that a predictive can be returned from jit; the batch shape is static
    pytree_data_fields = ("log_weights", "loc", "_scale", "_scale_factors")

    def __init__(self, log_weights, loc, scale, *, validate_args=None):
        self._setup(log_weights, loc, jnp.shape(scale), validate_args)
        self.scale = scale

    @classmethod
    def _from_scale_factors(cls, log_weights, loc, beta, var, *, validate_args=None):
        """The mixture with ``scale[s, ...] = sqrt(beta[s] * var[...])``, kept factorised.

        ``log_prob``, ``mean`` and ``variance`` then cost O(S + L) memory: the
        (S, L) ``scale`` array is only formed if the attribute is read.
        """
        self = cls.__new__(cls)
        self._setup(log_weights, loc, (jnp.shape(beta)[0],) + jnp.shape(var), validate_args)
        self._scale, self._scale_factors = None, (beta, var)
        return self

    def _setup(self, log_weights, loc, scale_shape, validate_args):
        self.log_weights = log_weights - logsumexp(log_weights)
        s = log_weights.shape[0]
        shape = jnp.broadcast_shapes(jnp.shape(loc), scale_shape)
        if len(shape) == 0 or shape[0] not in (1, s):
            raise ValueError(f"loc/scale must have a leading component axis of size 1 or {s}, got {shape}")
        self.loc = loc
        super().__init__(batch_shape=shape[1:], validate_args=validate_args)

    @property
    def scale(self):
        if self._scale is not None:
            return self._scale
        scale = _factored_scale(*self._scale_factors)
        if not isinstance(scale, jax.core.Tracer):  # formed under a trace: not kept (it would leak)
            self._scale = scale
        return scale

    @scale.setter
    def scale(self, value):
        self._scale, self._scale_factors = value, None

    def _lw(self):
        return self.log_weights.reshape((-1,) + (1,) * len(self.batch_shape))

    # The (S, L) component arrays are reduced by compiled, fused functions (below the class), which read them
    # once instead of materialising every intermediate: at 10^4-10^5 components that is most of the cost.
    def _per_component(self, value):
        """``value`` (broadcastable to ``batch_shape``) with leading unit axes up to the rank of the
        ``(S,) + batch_shape`` component arrays, so that it broadcasts against them explicitly."""
        return lead(jnp.asarray(value), 1 + len(self.batch_shape))

    def log_prob(self, value):
        value = self._per_component(value)
        if self._scale is None:
            return _mixture_log_prob_factored(self._lw(), self.loc, *self._scale_factors, value)
        return _mixture_log_prob(self._lw(), self.loc, self.scale, value)

    @property
    def mean(self):
        return _mixture_mean(self._lw(), self.loc, self.batch_shape)

    @property
    def variance(self):
        if self._scale is None:
            return _mixture_variance_factored(self._lw(), self.loc, *self._scale_factors, self.batch_shape)
        return _mixture_variance(self._lw(), self.loc, self.scale, self.batch_shape)

    def cdf(self, value):
        w = jnp.exp(self._lw())
        return jnp.sum(w * ndtr((self._per_component(value) - self.loc) / self.scale), axis=0)

    def icdf(self, q, iterations: int = 100):
        """Quantiles by bisection on the mixture CDF (bracketed by the components' own quantiles)."""
        q = jnp.broadcast_to(jnp.asarray(q, self.log_weights.dtype), self.batch_shape)
        zq = ndtri(q)
        comp_q = jnp.broadcast_to(self.loc + self.scale * zq[None], (self.log_weights.shape[0],) + self.batch_shape)
        lo, hi = comp_q.min(0), comp_q.max(0)

        def body(_, bounds):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            below = self.cdf(mid) < q
            return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

        lo, hi = jax.lax.fori_loop(0, iterations, body, (lo, hi))
        return 0.5 * (lo + hi)

    def sample(self, key, sample_shape=()):
        k1, k2 = jax.random.split(key)
        idx = _weighted_indices(k1, self.log_weights, sample_shape)
        loc = jnp.broadcast_to(self.loc, (self.log_weights.shape[0],) + self.batch_shape)[idx]
        scale = jnp.broadcast_to(self.scale, (self.log_weights.shape[0],) + self.batch_shape)[idx]
        return loc + scale * jax.random.normal(k2, sample_shape + self.batch_shape, dtype=loc.dtype)


def _factored_scale(beta, var):
    return jnp.sqrt(beta.reshape((-1,) + (1,) * jnp.ndim(var)) * var[None])


@jax.jit
def _mixture_log_prob(lw, loc, scale, value):
    z = (value - loc) / scale
    comp = -0.5 * z**2 - jnp.log(scale) - 0.5 * _LOG_2PI
    return logsumexp(lw + comp, axis=0)


@jax.jit
def _mixture_log_prob_factored(lw, loc, beta, var, value):
    if jnp.shape(loc)[0] != 1:
        return _mixture_log_prob(lw, loc, _factored_scale(beta, var), value)
    # one location for all components: z^2 = r / beta with r = (value - loc)^2 / var per point, and
    # log scale = (log beta + log var) / 2, so only the exponentials are S x L
    b = beta.reshape((-1,) + (1,) * jnp.ndim(var))
    r = (value - loc) ** 2 / var[None]
    comp = -0.5 * r / b - 0.5 * jnp.log(b) - 0.5 * jnp.log(var)[None] - 0.5 * _LOG_2PI
    return logsumexp(lw + comp, axis=0)


@functools.partial(jax.jit, static_argnums=2)
def _mixture_mean(lw, loc, batch_shape):
    w = jnp.exp(lw)
    return jnp.sum(w * jnp.broadcast_to(loc, (w.shape[0],) + batch_shape), axis=0)


@functools.partial(jax.jit, static_argnums=3)
def _mixture_variance(lw, loc, scale, batch_shape):
    w = jnp.exp(lw)
    loc = jnp.broadcast_to(loc, (w.shape[0],) + batch_shape)
    m = jnp.sum(w * loc, axis=0)
    return jnp.sum(w * (scale**2 + loc**2), axis=0) - m**2


@functools.partial(jax.jit, static_argnums=4)
def _mixture_variance_factored(lw, loc, beta, var, batch_shape):
    # E[scale^2] = E[beta] var; with one location for all components, E[loc] = loc sum(w): O(S + L)
    w = jnp.exp(lw)
    e_scale2 = jnp.sum(w.reshape(-1) * beta) * var
    if jnp.shape(loc)[0] == 1:
        sum_w = jnp.sum(w)
        m = jnp.broadcast_to(loc[0] * sum_w, batch_shape)
        return e_scale2 + loc[0] ** 2 * sum_w - m**2
    loc = jnp.broadcast_to(loc, (w.shape[0],) + batch_shape)
    m = jnp.sum(w * loc, axis=0)
    return e_scale2 + jnp.sum(w * loc**2, axis=0) - m**2


def _weighted_indices(key, log_w, shape):
    """Indices drawn with probabilities ``exp(log_w)`` by inverse CDF: O(S + draws) memory.

    (``jax.random.categorical`` with a shape builds a draws x S array of Gumbel noise.)
    """
    cdf = jnp.cumsum(jnp.exp(log_w - logsumexp(log_w)))
    u = jax.random.uniform(key, shape, dtype=cdf.dtype) * cdf[-1]
    return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), log_w.shape[0] - 1)


def _student_t_icdf(d: dist.StudentT, q):
    from scipy import stats

    return jnp.asarray(stats.t.ppf(np.asarray(q), np.asarray(d.df), np.asarray(d.loc), np.asarray(d.scale)))


def interval(predictive, level: float = 0.95):
    """Central ``level`` interval (lower, upper) of a marginal predictive from :meth:`Posterior.predict`.

    Args:
        predictive: a numpyro distribution from :meth:`Posterior.predict` (``Normal``, ``StudentT`` or
            :class:`GaussianMixture`); Student-t quantiles are computed with scipy on the host.
        level: probability mass of the interval, strictly between 0 and 1 (default 0.95).

    Returns:
        Tuple ``(lower, upper)`` of arrays with the predictive's ``batch_shape``: its ``(1 - level) / 2`` and
        ``(1 + level) / 2`` quantiles.

    Raises:
        ValueError: if ``level`` is not in (0, 1).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    if isinstance(predictive, dist.StudentT):
        return _student_t_icdf(predictive, lo_q), _student_t_icdf(predictive, hi_q)
    shape = predictive.batch_shape
    return predictive.icdf(jnp.full(shape, lo_q)), predictive.icdf(jnp.full(shape, hi_q))
