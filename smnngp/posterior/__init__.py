"""Exact regression posteriors of scale mixtures of NNGPs (paper section 3.1, notes 2.1-2.2).

Model, for training inputs X (N points), targets Y (N x C, C outputs sharing
one scale) and a kernel Kbar computed with last-layer variance 1::

    sigma^2 ~ H
    Y | sigma^2 ~ N(0, sigma^2 (Kbar + eps I))          noise_model="scaled"   (default, conjugate)
    Y | sigma^2 ~ N(0, sigma^2 Kbar + sigma_n^2 I)       noise_model="unscaled"

with H one of `smnngp.priors`. :func:`fit` factorises once and answers:

* ``H = Delta(s)`` (NNGP): Gaussian predictive, exact marginal likelihood;
* ``H = InverseGamma(a, b)`` with scaled noise (Student-t process):
  ``sigma^2 | Y ~ InvGamma(a + NC/2, b + q/2)``, ``q = tr(Y^T C^{-1} Y)``,
  ``f* | Y ~ MVT(2a + NC, m*, ((2b + q)/(2a + NC)) S*)`` and
  ``log p(Y) = lnG(a + NC/2) - lnG(a) - (NC/2) ln(2 pi b) - (C/2) ln|C| - (a + NC/2) ln(1 + q/(2b))``;
* any other prior, or unscaled noise: self-normalised importance sampling with
  the prior as proposal (notes 2.2).  Samples ``beta_s ~ H`` get weights
  ``p(Y | beta_s)``; one Cholesky (scaled noise) or one eigendecomposition of
  Kbar (unscaled noise) is shared by all samples, so S samples cost
  ``O(N^3 + S N)`` instead of ``O(S N^3)``.  The predictive density is the
  weighted Gaussian mixture, evaluated in log space.  Samples whose normalised
  weight is below ``exp(-60)`` are dropped before prediction (their total
  contribution is below ``S e^{-60}``, far under float64 resolution), which is
  what keeps 10^5 samples cheap.  The effective sample size is reported and a
  warning is raised when it is small.

Joint draws (:meth:`Posterior.sample_f`) share one sigma^2 over all test points
and outputs, as a multivariate t must (drawing each coordinate's t variate
independently, as the paper's code did, is a different distribution).

The three cases are three classes behind one interface, :class:`Posterior`
(``predict(x) ->`` a numpyro distribution, ``log_marginal_likelihood``,
``sample_f(key, x, num_samples)``), which `smnngp.variational`'s posteriors
share: :class:`GaussianPosterior`, :class:`StudentTPosterior` and
:class:`ImportancePosterior`.  Each is an immutable pytree (arrays as leaves,
configuration as static data), so a posterior is an argument and a result of
`jax.jit` and batches of posteriors are mapped over by `jax.vmap`.  Fitting
itself (:func:`fit`, :func:`fit_from_kernels`) runs on the host: it chooses the
jitter of a Cholesky, drops samples and warns about the effective sample size.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln, logsumexp, ndtr, ndtri

from smnngp import kernels as _kernels
from smnngp import linalg, matfree, priors, shifts
from smnngp._axes import lead
from smnngp._checks import check_finite

__all__ = [
    "fit",
    "fit_from_kernels",
    "Posterior",
    "GaussianPosterior",
    "StudentTPosterior",
    "ImportancePosterior",
    "GaussianMixture",
    "interval",
    "log_marginal_likelihood",
    "as_kernel_callable",
    "SmallESSWarning",
]

_LOG_2PI = math.log(2.0 * math.pi)
_PRUNE_LOG_WEIGHT = -60.0


class SmallESSWarning(UserWarning):
    """The importance sampler's effective sample size is small: its estimates are unreliable."""


# --------------------------------------------------------------------------------------------
# Input handling


def as_kernel_callable(kernel) -> Callable:
    """Turn ``kernel`` into ``k(x1, x2) -> matrix``.

    Accepts a ``kernel_fn(x1, x2, get)`` from `smnngp.stax` (or anything whose
    signature has a ``get`` parameter: the NNGP is used), a stax layer triple
    ``(init_fn, apply_fn, kernel_fn)``, or a plain ``k(x1, x2)``.

    Args:
        kernel: a stax ``kernel_fn``, a stax layer ``(init_fn, apply_fn, kernel_fn)`` or a callable ``k(x1, x2)``.

    Returns:
        Callable ``k(x1, x2=None) -> matrix``: for a ``kernel_fn`` a wrapper returning its NNGP (the same wrapper
        object for the same hashable ``kernel_fn``), otherwise ``kernel`` itself.

    Raises:
        TypeError: if ``kernel`` is not callable.
    """
    if isinstance(kernel, tuple) and len(kernel) == 3 and all(callable(f) for f in kernel):
        kernel = kernel[2]
    if not callable(kernel):
        raise TypeError(f"kernel must be callable (a stax kernel_fn or k(x1, x2)), got {type(kernel).__name__}")
    try:
        has_get = "get" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        has_get = False
    if has_get:
        return _nngp_of(kernel)
    return kernel


class _NNGPOfKernelFn:
    """``k(x1, x2) = kernel_fn(x1, x2, 'nngp')`` (one per ``kernel_fn``, see :func:`_nngp_of`)."""

    def __init__(self, kernel_fn):
        self.kernel_fn = kernel_fn

    def __call__(self, x1, x2=None):
        return self.kernel_fn(x1, x2, "nngp")


def _cached_per_object(make):
    """``make(obj)`` cached on ``obj`` (kept alive by the cache); uncached for unhashable objects."""
    cached = functools.lru_cache(maxsize=64)(make)

    def get(obj):
        try:
            hash(obj)
        except TypeError:
            return make(obj)
        return cached(obj)

    return get


# One wrapper per kernel_fn, so that the jitted evaluators below (cached on the wrapper) are reused by
# every fit with the same kernel_fn instead of being retraced and recompiled.
_nngp_of = _cached_per_object(_NNGPOfKernelFn)

# What tracing a kernel that is not traceable (numpy inside, value-dependent Python) raises.
_NOT_TRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                  jax.errors.TracerIntegerConversionError, jax.errors.UnexpectedTracerError)


class _KernelEvaluator:
    """Jitted ``k(x1, x2)`` and diagonal ``k(x_i, x_i)`` of a kernel callable.

    Evaluating a stax ``kernel_fn`` op by op is tens of times slower than its
    compiled, fused form at N = 4,000.  A kernel that cannot be traced is
    called as given (eagerly) from its first failure on.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.traceable = True
        self._jitted = jax.jit(lambda x1, x2: kernel(x1, x2))
        self._diag = jax.jit(jax.vmap(lambda xi: kernel(xi[None], xi[None])[0, 0]))

    def __call__(self, x1, x2):
        if self.traceable:
            try:
                with jax.default_matmul_precision("highest"):  # no TF32 kernels on a GPU (see smnngp.matfree)
                    return self._jitted(x1, x2)
            except _NOT_TRACEABLE:
                self.traceable = False
        return self.kernel(x1, x2)

    def diag(self, x):
        """k(x_i, x_i) in O(N) (the stax kernel's own `smnngp.kernels.diagonal` when it has one)."""
        if isinstance(self.kernel, _NNGPOfKernelFn):
            return _kernels.diagonal(self.kernel.kernel_fn, x, get="nngp")
        if self.traceable:
            with jax.default_matmul_precision("highest"):
                return self._diag(x)
        return _kernel_diag(self.kernel, x)


_cached_evaluator = _cached_per_object(_KernelEvaluator)


@functools.lru_cache(maxsize=64)
def _parametric_jits(apply):
    """Jitted ``apply(theta, x1, x2)`` and its diagonal, one pair per ``apply`` (theta is an argument)."""
    return (jax.jit(lambda theta, x1, x2: apply(theta, x1, x2)),
            jax.jit(jax.vmap(lambda theta, xi: apply(theta, xi[None], xi[None])[0, 0], in_axes=(None, 0))))


class _ParametricEvaluator:
    """A `ParametricKernel`'s evaluator: its hyperparameters are traced arguments, so fitting the same kernel at
    new hyperparameters (or a new kernel object with the same ``apply``) reuses the compiled programs (the kernel
    object itself holds arrays and cannot key a cache)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._jitted, self._diag = _parametric_jits(kernel.apply)

    def __call__(self, x1, x2):
        with jax.default_matmul_precision("highest"):  # no TF32 kernels on a GPU (see smnngp.matfree)
            return self._jitted(self.kernel.theta, x1, x2)

    def diag(self, x):
        with jax.default_matmul_precision("highest"):
            return self._diag(self.kernel.theta, x)


def _evaluator(kernel):
    if isinstance(kernel, _kernels.ParametricKernel):
        return _ParametricEvaluator(kernel)
    return _cached_evaluator(kernel)


def _as_targets(y, n: int | None = None):
    y = jnp.asarray(y)
    if not jnp.issubdtype(y.dtype, jnp.floating):
        y = y.astype(jnp.result_type(float))
    if y.ndim not in (1, 2):
        raise ValueError(f"y_train must have shape (N,) or (N, C), got {y.shape}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"y_train has {y.shape[0]} rows but the training kernel/inputs have {n}")
    if y.shape[0] == 0:
        raise ValueError("y_train is empty")
    check_finite(y, "y_train")
    return y


def _check_noise(noise, noise_model):
    if noise_model not in ("scaled", "unscaled"):
        raise ValueError(f"noise_model must be 'scaled' or 'unscaled', got {noise_model!r}")
    noise = float(noise)
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a non-negative finite variance, got {noise}")
    return noise


# --------------------------------------------------------------------------------------------
# Pure (traceable) pieces, shared with hyperparameter fitting


def student_t_log_ml(q, logdet_c, n_obs, n_out, a, b):
    """``log p(Y)`` for ``Y ~ MVT(2a, 0, (b/a) I_C (x) C)`` given ``q = tr(Y^T C^-1 Y)`` and ``ln|C|``."""
    nc = n_obs * n_out
    return (
        gammaln(a + nc / 2) - gammaln(a) - nc / 2 * jnp.log(2 * jnp.pi * b) - n_out / 2 * logdet_c
        - (a + nc / 2) * jnp.log1p(q / (2 * b))
    )


def gaussian_log_ml(q, logdet_c, n_obs, n_out, s):
    """``log p(Y)`` for ``Y ~ N(0, s I_C (x) C)``."""
    nc = n_obs * n_out
    return -0.5 * q / s - 0.5 * n_out * logdet_c - 0.5 * nc * (jnp.log(s) + _LOG_2PI)


def scaled_log_weights(q, logdet_c, n_obs, n_out, beta):
    """``log N(Y; 0, beta C)`` for many ``beta`` at O(1) each (cached ``q`` and ``ln|C|``)."""
    return gaussian_log_ml(q, logdet_c, n_obs, n_out, beta)


def unscaled_log_weights(lam, ytilde_sq, noise, beta):
    """``log N(Y; 0, beta K + noise I)`` from ``K = U diag(lam) U^T`` and ``ytilde_sq = sum_c (U^T Y)^2``.

    O(N) per ``beta`` (vectorised over a 1-D ``beta``).
    """
    n_out = ytilde_sq.shape[-1] if ytilde_sq.ndim == 2 else 1
    ysq = ytilde_sq.sum(-1) if ytilde_sq.ndim == 2 else ytilde_sq
    d = beta[:, None] * lam[None, :] + noise
    n = lam.shape[0]
    quad = jnp.sum(ysq[None, :] / d, axis=1)
    return -0.5 * quad - 0.5 * n_out * jnp.sum(jnp.log(d), axis=1) - 0.5 * n * n_out * _LOG_2PI


def log_marginal_likelihood(k_train, y_train, prior=None, *, noise=0.0, noise_model="scaled", num_samples=10_000,
                            key=None):
    """``log p(Y)`` under the scale mixture (exact for Delta / conjugate inverse gamma, IS otherwise).

    A shortcut for ``fit_from_kernels(...).log_marginal_likelihood``; see :func:`fit_from_kernels` for the errors
    and warnings.

    Args:
        k_train: training kernel matrix Kbar, (N, N), computed with last-layer variance 1.
        y_train: training targets, (N,) or (N, C).
        prior: scale prior on sigma^2 (see :func:`smnngp.priors.as_prior`; ``None`` means ``Delta(1)``).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise), a non-negative variance.
        noise_model: ``'scaled'`` (default) or ``'unscaled'``.
        num_samples: importance samples drawn from the prior (non-conjugate cases only).
        key: JAX PRNG key for the importance samples (``None``: ``PRNGKey(0)``).

    Returns:
        ``log p(Y)``: exact for a ``Delta`` prior and for the inverse gamma prior with scaled noise, otherwise
        the importance-sampling estimate (a Python float outside transformations).
    """
    return fit_from_kernels(k_train, y_train, prior, noise=noise, noise_model=noise_model,
                            num_samples=num_samples, key=key).log_marginal_likelihood


# --------------------------------------------------------------------------------------------
# Predictive distributions


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


# --------------------------------------------------------------------------------------------
# The posterior objects


class _ByIdentity:
    """Static pytree data compared by identity (a kernel callable need not be hashable or comparable)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _ByIdentity) and other.obj is self.obj


def _concrete(*trees) -> bool:
    """No leaf of ``trees`` is traced (values can be read, cached, checked on the host)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def _scalar(value):
    """A concrete scalar as a Python float; arrays (batched posteriors) and tracers unchanged."""
    if value is None or isinstance(value, float) or not _concrete(value) or jnp.ndim(value) != 0:
        return value
    return float(value)


# The predictive pieces of each posterior's most recent x_test (see Posterior._marginal_pieces): held beside the
# immutable posteriors, and dropped with them.
_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Posterior:
    """A fitted scale-mixture posterior: an immutable pytree; create it with :func:`fit` or :func:`fit_from_kernels`.

    The interface every posterior of the project shares (exact, importance-sampled, variational):

    * ``predict(x_test, ...)``: the marginal predictive at each test point, a numpyro distribution;
    * ``log_marginal_likelihood``: ``log p(Y)`` (exact, or its importance-sampling estimate);
    * ``sample_f(key, x_test, num_samples)``: joint draws at the test points;

    plus :meth:`log_predictive_density`, :meth:`predict_mean_std` and :meth:`predict_covariance`.
    The concrete classes are :class:`GaussianPosterior` (``Delta`` prior: the NNGP),
    :class:`StudentTPosterior` (inverse-gamma prior, scaled noise: the Student-t process) and
    :class:`ImportancePosterior` (any other prior, or unscaled noise).

    As a pytree its arrays are leaves (the factorisation, the scale posterior, ``x_train``, ``noise``,
    the prior's parameters, ``log_marginal_likelihood``), its configuration is static (``noise_model``,
    sizes, the kernel callable, compared by identity), so a posterior is an argument and a result of
    `jax.jit`, and a batch of posteriors (leaves stacked: same kind, sizes and kernel; importance
    posteriors only when they kept as many samples) is mapped over by `jax.vmap`. Outside
    transformations the scalar attributes (``log_marginal_likelihood``, ``jitter``, ``df``, ``ess``)
    read as Python floats. Attributes cannot be set; :meth:`replace` returns a changed copy.

    Attributes: ``prior``, ``noise``, ``noise_model``, ``kind`` (``'gaussian'``, ``'student_t'`` or
    ``'importance'``, read-only), ``log_marginal_likelihood``, ``jitter`` (absolute jitter the Cholesky
    needed), ``ess`` (importance sampling only), ``scale_posterior`` (``InvGamma`` for the Student-t
    process, the point mass for ``Delta``, else ``None``), ``df``, ``kernel`` and ``x_train`` (``None``
    when fitted from kernel matrices).

    Args:
        prior: the scale prior, a numpyro distribution (keyword-only, like every argument).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise).
        noise_model: ``'scaled'`` or ``'unscaled'``.
        n_train: number N of training points.
        n_out: number C of outputs.
        squeeze: whether the targets were given as (N,), so that predictions drop the output axis.
        log_marginal_likelihood: ``log p(Y)``, exact or estimated.
        state: arrays of the factorisation: ``L``, ``alpha``, ``q``, ``logdet`` (scaled noise) or ``lam``, ``U``,
            ``ytilde`` (unscaled noise).
        jitter: absolute jitter added to the training kernel to factorise it.
        kernel: the kernel callable ``k(x1, x2)``, or ``None`` when fitted from kernel matrices.
        x_train: the training inputs, or ``None``.
        solver: ``None`` for the dense path (a Cholesky factor in ``state``), or the `smnngp.matfree.CG`
            settings of a matrix-free fit (``state`` holds ``alpha``, ``q``, ``logdet`` and the preconditioner
            ``U``, ``lam``).
        **fields: the fields of the concrete class (``s``; ``a_post``, ``b_post``, ``_df``; ``beta``, ``log_w``,
            ``_ess``, ``_num_samples``).

    Raises:
        TypeError: when ``Posterior`` itself is instantiated, or a field is missing or unknown.
    """

    kind: str = ""
    # leaves (arrays, the prior's pytree, Python floats) and static fields; subclasses add their own
    _LEAVES: tuple[str, ...] = ("prior", "noise", "x_train", "_lml", "_jitter", "_state")
    _STATIC: tuple[str, ...] = ("noise_model", "n_train", "n_out", "squeeze", "_kernel", "_solver")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)

    def __init__(self, *, prior, noise, noise_model: str, n_train: int, n_out: int, squeeze: bool,
                 log_marginal_likelihood, state: dict, jitter=0.0, kernel=None, x_train=None, solver=None,
                 **fields):
        if type(self) is Posterior:
            raise TypeError("Posterior is the interface; build a posterior with posterior.fit or fit_from_kernels")
        values = dict(prior=prior, noise=noise, x_train=x_train, _lml=log_marginal_likelihood, _jitter=jitter,
                      _state=dict(state), noise_model=noise_model, n_train=int(n_train), n_out=int(n_out),
                      squeeze=bool(squeeze), _kernel=kernel, _solver=solver, **fields)
        missing = set(self._LEAVES + self._STATIC) - set(values)
        unknown = set(values) - set(self._LEAVES + self._STATIC)
        if missing or unknown:
            raise TypeError(f"{type(self).__name__}: missing fields {sorted(missing)}, unknown {sorted(unknown)}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    # -- pytree protocol and immutability --
    def _tree_flatten(self):
        children = tuple(getattr(self, n) for n in self._LEAVES)
        aux = tuple(_ByIdentity(self._kernel) if n == "_kernel" else getattr(self, n) for n in self._STATIC)
        return children, aux

    @classmethod
    def _tree_unflatten(cls, aux, children):
        self = object.__new__(cls)
        for name, value in zip(cls._LEAVES, children, strict=True):
            object.__setattr__(self, name, value)
        for name, value in zip(cls._STATIC, aux, strict=True):
            object.__setattr__(self, name, value.obj if name == "_kernel" else value)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...)")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def replace(self, **changes) -> Posterior:
        """A copy with the given fields changed (``kernel``, ``x_train``, ``noise``, ...; no refitting)."""
        renamed = {"kernel": "_kernel", "log_marginal_likelihood": "_lml", "jitter": "_jitter", "solver": "_solver"}
        changes = {renamed.get(k, k): v for k, v in changes.items()}
        unknown = set(changes) - set(self._LEAVES + self._STATIC)
        if unknown:
            raise TypeError(f"{type(self).__name__}.replace: unknown fields {sorted(unknown)}")
        children, aux = self._tree_flatten()
        new = self._tree_unflatten(aux, children)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(noise_model={self.noise_model!r}, n_train={self.n_train}, n_out={self.n_out}, "
                f"log_marginal_likelihood={self._lml!r}, prior={self.prior!r})")

    # -- the scale posterior and its summaries --
    @property
    def kernel(self):
        return self._kernel

    @property
    def log_marginal_likelihood(self):
        return _scalar(self._lml)

    @property
    def jitter(self):
        return _scalar(self._jitter)

    @property
    def method(self) -> str:
        """``'dense'`` (a Cholesky factor or eigendecomposition), ``'mixed'`` (a float32 factor refined by float64
        conjugate gradients) or ``'cg'`` (matrix-free, `smnngp.matfree`)."""
        if self._solver is None:
            return "dense"
        return "mixed" if "L32" in self._state else "cg"

    @property
    def diagnostics(self) -> dict:
        """How the fit went: the method, the jitter (dense), or for ``'cg'`` the CG iterations and relative
        residual of the training solve, the log-determinant's standard error, probes and preconditioner rank."""
        out = {"method": self.method, "jitter": self.jitter}
        if self._solver is not None:
            st = self._state
            out.update(cg_iterations=int(st["cg_iterations"]), cg_residual=float(st["cg_residual"]),
                       tol=float(st["cg_tol"]), logdet_stderr=float(st["logdet_stderr"]),
                       num_probes=self._solver.num_probes)
            if "L32" in st:
                out.update(precond=f"{jnp.dtype(st['L32'].dtype).name} Cholesky",
                           precond_jitter=float(st["precond_jitter"]))
            else:
                out.update(precond="pivoted Cholesky", precond_rank=int(st["U"].shape[1]),
                           precond_trace_error=float(st["precond_trace_error"]))
            if "grid_t" in st:
                out.update(shift_nodes=int(st["grid_nodes"]), interpolation_error=float(st["interpolation_error"]))
        return out

    @property
    def ess(self):
        """Effective sample size of the importance sampler (``None`` for exact posteriors)."""
        return None

    @property
    def num_samples(self):
        """Importance samples drawn (``None`` for exact posteriors)."""
        return None

    @property
    def df(self):
        """Degrees of freedom of the Student-t predictive (``2a + N C``), ``inf`` for the Gaussian, else ``None``."""
        return None

    @property
    def scale_posterior(self):
        """The posterior law of sigma^2 when it has a closed form (``None`` for importance sampling)."""
        return None

    def scale_posterior_samples(self):
        """``(beta, normalised log weights)`` of the importance sampler (after pruning)."""
        raise ValueError(f"scale_posterior_samples is only defined for importance sampling, not {self.kind!r}")

    # What each kind of posterior defines.
    def _predictive(self, mean, var, noisy):
        """The marginal predictive from the noise-free pieces of :meth:`_marginal_pieces`."""
        raise NotImplementedError

    def _draw_scales(self, key, num_samples):
        """``num_samples`` draws of sigma^2 from its posterior."""
        raise NotImplementedError

    def _scale_mean(self):
        """``E[sigma^2 | Y]`` (scaled noise)."""
        raise NotImplementedError

    def _scale_samples(self):
        """``(beta, log w)``: the scale posterior as weighted points (unscaled noise)."""
        raise NotImplementedError(f"{type(self).__name__} has no unscaled-noise form")

    # -- prediction --
    def _test_kernels(self, x_test, k_test_train, k_test_test, full_cov):
        if k_test_train is None:
            if self.kernel is None:
                raise ValueError("this posterior was fitted from kernel matrices: pass k_test_train (and k_test_test)")
            x_test = self._check_x_test(x_test)
            kernel = _evaluator(self.kernel)
            k_test_train = kernel(x_test, self.x_train)
            if full_cov:
                k_test_test = kernel(x_test, None)
            else:
                k_test_test = kernel.diag(x_test)
        else:
            k_test_train = jnp.asarray(k_test_train)
            if k_test_train.ndim != 2 or k_test_train.shape[1] != self.n_train:
                raise ValueError(f"k_test_train must have shape (L, {self.n_train}), got {k_test_train.shape}")
            if k_test_test is None:
                raise ValueError("k_test_test is required with k_test_train (its diagonal, or the full matrix)")
            k_test_test = jnp.asarray(k_test_test)
            L = k_test_train.shape[0]
            if full_cov and k_test_test.shape != (L, L):
                raise ValueError(f"full_cov=True needs k_test_test of shape ({L}, {L}), got {k_test_test.shape}")
            if not full_cov:
                if k_test_test.shape == (L, L):
                    k_test_test = jnp.diag(k_test_test)
                elif k_test_test.shape != (L,):
                    raise ValueError(f"k_test_test must have shape ({L},) or ({L}, {L}), got {k_test_test.shape}")
        check_finite(k_test_train, "k_test_train")
        check_finite(k_test_test, "k_test_test")
        return k_test_train, k_test_test

    def _check_x_test(self, x_test):
        if x_test is None:
            raise ValueError("pass x_test (or k_test_train)")
        x_test = jnp.asarray(x_test)
        if x_test.shape[1:] != jnp.shape(self.x_train)[1:]:
            raise ValueError(
                f"x_test has per-point shape {x_test.shape[1:]} but x_train has {jnp.shape(self.x_train)[1:]}"
            )
        check_finite(x_test, "x_test")
        return x_test

    def _operator(self):
        opts = self._solver
        return matfree.KernelOperator(self.kernel, self.x_train, float(self.noise), tile_size=opts.tile_size,
                                      devices=opts.devices)

    def _preconditioner(self):
        st = self._state
        if "L32" in st:
            return matfree.DenseCholesky(st["L32"], float(st["precond_jitter"]))
        return matfree.PivotedCholesky(None, st["U"], st["lam"], float(self.noise), float(st["precond_trace_error"]),
                                       None)

    def _matfree_marginals(self, x_test):
        """Mean and variance at the test points without the (L, N) cross-kernel where it can be avoided: the
        mean ``k*x alpha`` by column tiles; the variance by CG solves (``variance='solve'``) or LOVE."""
        x_test = self._check_x_test(x_test)
        if self._solver.variance == "solve" or "L32" in self._state:  # mixed: CG takes a few iterations
            kxt, kxx = self._test_kernels(x_test, None, None, full_cov=False)
            return self._latent(kxt, kxx, False)
        op = self._operator()
        kxx = _evaluator(self.kernel).diag(x_test)
        check_finite(kxx, "k_test_test")
        mean = op.cross_matmul(x_test, self._state["alpha"])
        pc = self._preconditioner()
        var = kxx - matfree.love_variance_reduction(op, x_test, self._solver.love_rank, pc)
        bad = int(jnp.sum(var <= 0))
        if bad:
            warnings.warn(f"LOVE variances fell to zero at {bad} of {var.shape[0]} test points (the Krylov space of "
                          "love_rank steps with this preconditioner is too small); raise love_rank or precond_rank, "
                          "or use CG(variance='solve')", matfree.ConvergenceWarning, stacklevel=4)
        return mean, jnp.clip(var, 0.0, None)

    def _latent(self, kxt, kxx, full_cov):
        """Gaussian conditional pieces for scaled noise: mean (L, C), covariance S* (diag or full)."""
        st = self._state
        if self._solver is not None:
            return self._latent_matfree(kxt, kxx, bool(full_cov))
        return _latent_jit(kxt, kxx, st["alpha"], st["L"], bool(full_cov))

    def _latent_matfree(self, kxt, kxx, full_cov):
        """As :meth:`_latent` without a factor: ``S* = k** - k*x A^{-1} kx*`` by one CG run over the L test
        columns (preconditioned as the fit was), ``A = K + noise I`` applied by tiles."""
        if not _concrete(kxt, self._state, self.x_train, self.noise):
            raise TypeError("a matrix-free posterior (method='cg') predicts outside jit/vmap: its solves run "
                            "conjugate gradients with host-side convergence checks")
        st, opts = self._state, self._solver
        op = self._operator()
        pc = self._preconditioner()
        v, _ = matfree.cg(op, kxt.T, precond=pc, tol=opts.tolerance(op.dtype), max_iter=opts.max_iter)
        mean = kxt @ st["alpha"]
        if full_cov:
            return mean, kxx - kxt @ v
        return mean, jnp.clip(kxx - jnp.sum(kxt.T * v, axis=0), 0.0, None)

    def _grid_nodes(self, kxt, full_cov):
        """At each shift node ``s_g`` of an unscaled matrix-free fit: the conditional mean ``k*x (K + s_g I)^-1 Y``
        (G, L, C) and the variance reduction ``k*x (K + s_g I)^-1 kx*`` (G, L), or (G, L, L) with ``full_cov``, by
        one preconditioned CG run over the test columns per node."""
        if not _concrete(kxt, self._state, self.x_train, self.noise):
            raise TypeError("a matrix-free posterior (method='cg') predicts outside jit/vmap: its solves run "
                            "conjugate gradients with host-side convergence checks")
        st, opts = self._state, self._solver
        op = self._operator()
        pc = matfree.PivotedCholesky(None, st["U"], st["lam"], 1.0, float(st["precond_trace_error"]), None)
        means, reductions = [], []
        for g, t in enumerate(np.asarray(st["grid_t"])):
            shift = math.exp(float(t))
            v, _ = matfree.cg(op.with_shift(shift), kxt.T, precond=pc._replace(shift=shift),
                              tol=opts.tolerance(op.dtype), max_iter=opts.max_iter)
            means.append(kxt @ st["grid_alpha"][g])
            reductions.append(kxt @ v if full_cov else jnp.sum(kxt.T * v, axis=0))
        return jnp.stack(means), jnp.stack(reductions)

    def _grid_basis(self, beta):
        """(S, G) spline weights of each sample's shift ``noise / beta`` on the fit's nodes."""
        t = np.log(float(self.noise) / np.asarray(beta, float))
        return jnp.asarray(shifts.spline_basis(np.asarray(self._state["grid_t"]), t), self._state["grid_alpha"].dtype)

    def _grid_pieces(self, kxt, kxx):
        """Per retained sample: mean (S, L, C) and latent variance (S, L), as the dense unscaled branch gives."""
        beta = self._scale_samples()[0]
        m_g, r_g = self._grid_nodes(kxt, False)
        B = self._grid_basis(beta)
        mean = jnp.einsum("sg,glc->slc", B, m_g)
        var = beta[:, None] * (kxx[None, :] - B @ r_g)
        return mean, jnp.clip(var, 0.0, None)

    def _marginal_pieces(self, x_test, k_test_train, k_test_test):
        """Noise-free predictive pieces at the test points: (mean, variance).

        Scaled noise: the Gaussian conditional's mean (L, C) and variance S*
        (L,).  Unscaled noise: per retained sample, mean (S, L, C) and variance
        (S, L).  The pieces for the most recent ``x_test`` of each posterior are
        kept (in a table beside it, as the posterior itself is immutable), so
        that ``predict(x)`` followed by ``log_predictive_density(y, x)``
        evaluates the test kernels and solves the (L, N) triangular system once.
        """
        cacheable = k_test_train is None and x_test is not None and self.kernel is not None and _concrete(
            x_test, self._state, self.x_train, self.noise)
        if cacheable:
            x = jnp.asarray(x_test)
            hit = _PIECES.get(self)
            if (hit is not None and hit[0].shape == x.shape and hit[0].dtype == x.dtype
                    and np.array_equal(np.asarray(hit[0]), np.asarray(x))):
                return hit[1]
        if "grid_t" in self._state:  # unscaled noise, matrix-free: splines through solves at a few shifts
            kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
            pieces = self._grid_pieces(kxt, kxx)
        elif self._solver is not None and k_test_train is None:
            pieces = self._matfree_marginals(x_test)
        elif self.noise_model == "scaled":
            chunk = _test_chunk(self.n_train)
            if k_test_train is None and x_test is not None and jnp.shape(x_test)[0] > chunk:
                # many test points: the (L, N) cross-kernel and its solve a chunk of rows at a time
                parts = [self._latent(*self._test_kernels(x_test[i:i + chunk], None, None, False), False)
                         for i in range(0, jnp.shape(x_test)[0], chunk)]
                pieces = tuple(jnp.concatenate(p) for p in zip(*parts))
            else:
                kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
                pieces = self._latent(kxt, kxx, False)
        else:
            kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=False)
            st = self._state
            lam, U, yt = st["lam"], st["U"], st["ytilde"]
            beta = self._scale_samples()[0]
            P = kxt @ U  # (L, N), once
            d = beta[:, None] * lam[None, :] + self.noise  # (S, N)
            mean = beta[:, None, None] * jnp.einsum("ln,snc->slc", P, yt[None] / d[:, :, None])  # a matmul, no (S,L,N)
            var = beta[:, None] * kxx[None, :] - beta[:, None] ** 2 * ((P**2) @ (1.0 / d).T).T
            pieces = mean, jnp.clip(var, 0.0, None)
        if cacheable:
            _PIECES[self] = (x, pieces)
        return pieces

    def predict(self, x_test=None, *, k_test_train=None, k_test_test=None, noisy: bool = True):
        """Marginal predictive distribution at each test point (and output).

        ``noisy=True`` gives the distribution of a new observation y* (noise
        included), ``noisy=False`` that of the latent f*.  Returns a numpyro
        distribution with ``batch_shape`` (L,) or (L, C): ``Normal`` (NNGP),
        ``StudentT`` (Student-t process) or :class:`GaussianMixture`
        (importance sampling); all have ``mean``, ``variance`` and
        ``log_prob``; :func:`interval` gives central intervals.
        """
        mean, var = self._marginal_pieces(x_test, k_test_train, k_test_test)
        return self._predictive(mean, var, noisy)

    def _squeeze(self, a):
        return a[..., 0] if self.squeeze else a

    def _unscaled_pieces(self, mean, var, noisy):
        """Per-sample mean and standard deviation (S, L[, C]) of the unscaled-noise predictive."""
        var = var + (self.noise if noisy else 0.0)
        scale = jnp.sqrt(var)[:, :, None] * jnp.ones_like(mean)
        return self._squeeze(mean), self._squeeze(scale)

    def predict_mean_std(self, x_test=None, **kw):
        """``(mean, std)`` of the predictive (``std`` is ``inf`` where the variance does not exist)."""
        p = self.predict(x_test, **kw)
        return p.mean, jnp.sqrt(p.variance)

    def log_predictive_density(self, y_test, x_test=None, *, noisy: bool = True, **kw):
        """Per-point ``log p(y*_i | Y)`` summed over outputs (shape (L,))."""
        p = self.predict(x_test, noisy=noisy, **kw)
        y_test = jnp.asarray(y_test)
        if y_test.shape != p.batch_shape:
            raise ValueError(f"y_test must have shape {p.batch_shape}, got {y_test.shape}")
        check_finite(y_test, "y_test")
        lp = p.log_prob(y_test)
        return lp if lp.ndim == 1 else lp.sum(-1)

    def predict_covariance(self, x_test=None, *, k_test_train=None, k_test_test=None, noisy: bool = True):
        """Joint predictive covariance at the test points, (L, L) or (L, L, C).

        * scaled noise: ``E[sigma^2 | Y] (S* + noise I)``, S* the Gaussian conditional covariance
          (``inf`` everywhere when ``E[sigma^2 | Y]`` is infinite, a Student-t with ``df <= 2``);
        * unscaled noise: the mixture's law of total covariance,
          ``sum_s w_s (beta_s K** - beta_s^2 P D_s^-1 P^T) + sum_s w_s (m_s - m)(m_s - m)^T + noise I``
          with ``K = U diag(lam) U^T``, ``P = K*x U`` and ``D_s = beta_s lam + noise``.

        ``k_test_test`` must be the full (L, L) matrix.
        """
        kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=True)
        n_test = kxt.shape[0]
        eye = jnp.eye(n_test, dtype=kxx.dtype)
        if self.noise_model == "scaled":
            _, s_star = self._latent(kxt, kxx, True)
            if noisy:
                s_star = s_star + self.noise * eye
            e_beta = self._scale_mean()
            cov = jnp.broadcast_to((e_beta * s_star)[..., None], (n_test, n_test, self.n_out))
            cov = jnp.where(jnp.isinf(e_beta), jnp.inf, cov)
        else:
            beta, log_w = self._scale_samples()
            w = jnp.exp(log_w)
            if "grid_t" in self._state:  # matrix-free: splines through the shift nodes
                m_g, r_g = self._grid_nodes(kxt, True)
                B = self._grid_basis(beta)
                within = jnp.sum(w * beta) * kxx - jnp.einsum("g,gij->ij", (w * beta) @ B, r_g)
                means = jnp.einsum("sg,glc->slc", B, m_g)
            else:
                st = self._state
                lam, U, yt = st["lam"], st["U"], st["ytilde"]
                P = kxt @ U
                dinv = 1.0 / (beta[:, None] * lam[None, :] + self.noise)  # (S, N)
                within = jnp.sum(w * beta) * kxx - (P * jnp.sum((w * beta**2)[:, None] * dinv, axis=0)[None, :]) @ P.T
                means = beta[:, None, None] * jnp.einsum("ln,sn,nc->slc", P, dinv, yt)  # (S, L, C)
            if noisy:
                within = within + self.noise * eye
            dev = jnp.sqrt(w)[:, None, None] * (means - jnp.sum(w[:, None, None] * means, axis=0)[None])
            cov = within[..., None] + jnp.einsum("slc,skc->lkc", dev, dev)
        return self._squeeze(cov)

    def sample_f(self, key, x_test=None, num_samples: int = 1, *, k_test_train=None, k_test_test=None,
                 noisy: bool = False):
        """Joint posterior draws at the test points, shape ``(num_samples, L)`` or ``(num_samples, L, C)``.

        One sigma^2 per draw, shared by all points and outputs.
        """
        kxt, kxx = self._test_kernels(x_test, k_test_train, k_test_test, full_cov=True)
        L = kxt.shape[0]
        k_beta, k_z = jax.random.split(key)
        beta = self._draw_scales(k_beta, num_samples)
        z_shape = (num_samples, L, self.n_out)
        if self.noise_model == "scaled":
            mean, cov = self._latent(kxt, kxx, True)
            if noisy:
                cov = cov + self.noise * jnp.eye(L, dtype=cov.dtype)
            chol = _joint_cholesky(cov)
            z = jax.random.normal(k_z, z_shape, dtype=cov.dtype)
            out = mean[None] + jnp.sqrt(beta)[:, None, None] * jnp.einsum("ij,sjc->sic", chol, z)
        else:
            if "grid_t" in self._state:  # matrix-free: splines through the shift nodes
                m_g, r_g = self._grid_nodes(kxt, True)
                B = self._grid_basis(beta)

                def conditional(i):
                    return (jnp.einsum("g,glc->lc", B[i], m_g),
                            beta[i] * (kxx - jnp.einsum("g,gij->ij", B[i], r_g)))
            else:
                st = self._state
                lam, U, yt = st["lam"], st["U"], st["ytilde"]
                P = kxt @ U

                def conditional(i):
                    b = beta[i]
                    dinv = 1.0 / (b * lam + self.noise)
                    return b * (P * dinv[None, :]) @ yt, b * kxx - b**2 * (P * dinv[None, :]) @ P.T

            keys = jax.random.split(k_z, num_samples)
            draws = []
            for i in range(num_samples):
                m, cov = conditional(i)
                if noisy:
                    cov = cov + self.noise * jnp.eye(L, dtype=cov.dtype)
                chol = _joint_cholesky(cov)
                draws.append(m + chol @ jax.random.normal(keys[i], (L, self.n_out), dtype=cov.dtype))
            out = jnp.stack(draws)
        return self._squeeze(out)


def _joint_cholesky(cov):
    """Cholesky factor of a (symmetrised) posterior covariance: with jitter escalation and an error naming the
    matrix when concrete; with a fixed relative jitter of 1e-10 under a transformation."""
    cov = 0.5 * (cov + cov.T)
    if _concrete(cov):
        return linalg.cholesky(cov, name="posterior covariance S*").L
    return linalg.cholesky_jittered(cov, 1e-10)


class GaussianPosterior(Posterior):
    """The NNGP posterior, ``sigma^2 = s`` (prior ``Delta(s)``): Gaussian predictive, exact marginal likelihood."""

    kind = "gaussian"
    _LEAVES = Posterior._LEAVES + ("s",)

    @property
    def df(self):
        return math.inf

    @property
    def scale_posterior(self):
        return priors.Delta(self.s)

    def _predictive(self, mean, var, noisy):
        if self.noise_model == "scaled":
            loc, _, scale = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 1.0, self.s, 1.0, self.squeeze)
            return dist.Normal(loc, scale)
        loc, scale = self._unscaled_pieces(mean, var, noisy)
        return dist.Normal(loc[0], scale[0])

    def _draw_scales(self, key, num_samples):
        return jnp.full((num_samples,), self.s)

    def _scale_mean(self):
        return self.s

    def _scale_samples(self):
        dtype = self._state["grid_alpha" if "grid_t" in self._state else "lam"].dtype
        return jnp.reshape(self.s, (1,)).astype(dtype), jnp.zeros(1, dtype)


class StudentTPosterior(Posterior):
    """The Student-t process (prior ``InverseGamma(a, b)``, scaled noise): ``sigma^2 | Y ~ InvGamma(a_post, b_post)``,
    Student-t predictive with ``df = 2a + N C``, exact marginal likelihood."""

    kind = "student_t"
    _LEAVES = Posterior._LEAVES + ("a_post", "b_post", "_df")

    @property
    def df(self):
        return _scalar(self._df)

    @property
    def scale_posterior(self):
        return priors.InverseGamma(self.a_post, self.b_post)

    def _predictive(self, mean, var, noisy):
        # scale^2 = (2 b' / df) var
        loc, _, scale = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 2.0, self.b_post, self._df,
                                          self.squeeze)
        return dist.StudentT(self._df, loc, scale)

    def _draw_scales(self, key, num_samples):
        return priors.InverseGamma(self.a_post, self.b_post).sample(key, (num_samples,))

    def _scale_mean(self):
        # E[InvGamma(a', b')] = b' / (a' - 1), infinite for a' <= 1 (df <= 2)
        return jnp.where(self._df > 2, self.b_post / (self.a_post - 1), jnp.inf)


class ImportancePosterior(Posterior):
    """Any other prior, or unscaled noise: the scale posterior as self-normalised importance samples
    ``(beta, log w)`` (pruned of negligible weights); Gaussian-mixture predictive."""

    kind = "importance"
    _LEAVES = Posterior._LEAVES + ("beta", "log_w", "_ess")
    _STATIC = Posterior._STATIC + ("_num_samples",)

    @property
    def ess(self):
        return _scalar(self._ess)

    @property
    def num_samples(self):
        return self._num_samples

    def scale_posterior_samples(self):
        return self.beta, self.log_w

    def _predictive(self, mean, var, noisy):
        if self.noise_model == "scaled":
            # scale = sqrt(beta_s * var): kept factorised, (S, L) arrays are never formed to answer mean,
            # variance or log_prob
            loc, var, _ = _scaled_marginals(mean, var, self.noise if noisy else 0.0, 1.0, 1.0, 1.0, self.squeeze)
            return GaussianMixture._from_scale_factors(self.log_w, loc[None], self.beta, var)
        loc, scale = self._unscaled_pieces(mean, var, noisy)
        return GaussianMixture(self.log_w, loc, scale)

    def _draw_scales(self, key, num_samples):
        return self.beta[_weighted_indices(key, self.log_w, (num_samples,))]

    def _scale_mean(self):
        return jnp.sum(jnp.exp(self.log_w) * self.beta)

    def _scale_samples(self):
        return self.beta, self.log_w


def _test_chunk(n_train: int) -> int:
    """Test points predicted together by the dense path: their (L, N) cross-kernel and its triangular solve stay
    under a sixteenth of the N x N factor (at least 1,024 points)."""
    return max(1024, n_train // 16)


@functools.partial(jax.jit, static_argnums=6)
def _scaled_marginals(mean, var, noise, mult, num, den, squeeze):
    """Per test point (and output): mean, variance ``var + noise`` and ``sqrt(factor (var + noise))`` with
    ``factor = mult num / den``, compiled as one function."""
    var = (var + noise)[:, None] * jnp.ones_like(mean)
    scale = jnp.sqrt(mult * num / den * var)
    if squeeze:
        return mean[..., 0], var[..., 0], scale[..., 0]
    return mean, var, scale


@functools.partial(jax.jit, static_argnums=4)
def _latent_jit(kxt, kxx, alpha, chol_l, full_cov):
    # one compiled function rather than a handful of eager ops, each compiled on first use of a shape
    mean = kxt @ alpha
    v = linalg.solve_triangular(chol_l, kxt.T)
    if full_cov:
        cov = kxx - v.T @ v
    else:
        cov = jnp.clip(kxx - jnp.sum(v * v, axis=0), 0.0, None)
    return mean, cov


def _kernel_diag(kernel, x):
    """Diagonal k(x_i, x_i) in O(N) kernel evaluations (one row at a time, vmapped)."""
    one = jax.vmap(lambda xi: kernel(xi[None], xi[None])[0, 0])
    return one(x)


# --------------------------------------------------------------------------------------------
# Fitting


def fit(kernel, x_train, y_train, prior=None, *, noise: float = 0.0, noise_model: str = "scaled",
        num_samples: int = 10_000, key=None, min_ess: float = 30.0, proposal: str = "prior",
        method: str = "auto", cg: matfree.CG | None = None) -> Posterior:
    """Posterior of the scale mixture given training data (see the module docstring).

    Args:
      kernel: a ``kernel_fn`` from `smnngp.stax` (NNGP used; build it with the
        last layer's ``W_std=1`` so that the prior carries the scale) or any
        ``k(x1, x2) -> matrix``.
      x_train: (N, ...) inputs.
      y_train: (N,) or (N, C) targets.
      prior: a scale prior from `smnngp.priors` (``None`` = ``Delta(1)``).
      noise: ``eps`` (scaled) or ``sigma_n^2`` (unscaled), see the module docstring.
      num_samples: importance samples drawn (non-conjugate cases only).
      key: JAX PRNG key for the importance samples (non-conjugate cases only; ``None``: ``PRNGKey(0)``).
      min_ess: warn (:class:`SmallESSWarning`) below this effective sample size.
      proposal: ``'prior'`` (the paper's importance sampler: draws from H) or ``'likelihood'`` (draws from a
        widened inverse gamma shaped like the likelihood in sigma^2, reweighted by prior / proposal; scaled noise
        only). With many training points the posterior of sigma^2 is narrow and the prior puts few samples in
        it (effective sample sizes of tens out of 10^4); the likelihood proposal keeps most of them.
      noise_model: ``'scaled'`` (default: the noise is scaled by sigma^2, ``sigma^2 (Kbar + eps I)``) or
        ``'unscaled'`` (``sigma^2 Kbar + sigma_n^2 I``, which needs ``noise > 0``).
      method: ``'dense'`` (the N x N kernel and its Cholesky factor), ``'mixed'`` (float64 inputs, scaled noise:
        the float32 factor in one float32 buffer preconditions float64 conjugate gradients on kernel tiles, so
        solves reach float64 accuracy in half the memory; ``log|C|``'s small correction by stochastic Lanczos
        quadrature), ``'cg'`` (matrix-free, `smnngp.matfree`: the kernel is never formed; conjugate gradients
        for ``C^{-1} Y``, stochastic Lanczos quadrature for ``log|C|``, reported in ``diagnostics``; ``noise > 0``;
        unscaled noise by solves at a grid of shifts, `smnngp.shifts`) or ``'auto'`` (dense when
        :func:`dense_copies` N x N matrices fit in the free memory of the device, else mixed when its float32
        matrices do, else ``'cg'``). ``docs/scaling.md`` has the details and measurements.
      cg: settings of the mixed and matrix-free paths (`smnngp.matfree.CG`; ``None``: its defaults, with
        ``tol=1e-10`` for ``'mixed'``).

    Returns:
      A :class:`Posterior`: :class:`GaussianPosterior` for a ``Delta`` prior, :class:`StudentTPosterior` for an
      inverse gamma prior with scaled noise, :class:`ImportancePosterior` otherwise; it holds ``kernel`` and
      ``x_train`` so that ``predict(x_test)`` evaluates the test kernels itself.

    Raises:
      TypeError: if ``kernel`` is not callable or ``prior`` is not a distribution.
      ValueError: for inputs or targets of the wrong shape or with non-finite values, a negative noise, an
        unknown ``noise_model`` or ``proposal``, or an invalid prior (see :func:`fit_from_kernels`).
      NotPositiveDefiniteError: if the training kernel (plus noise) cannot be factorised.
      MemoryError: for ``method='dense'`` when the matrices it needs exceed the device's free memory.
    """
    kfn = as_kernel_callable(kernel)
    x_train = jnp.asarray(x_train)
    if x_train.ndim < 2:
        raise ValueError(f"x_train must have shape (N, features...), got {x_train.shape}")
    check_finite(x_train, "x_train")
    y_train = _as_targets(y_train, x_train.shape[0])
    method = _choose_method(method, x_train.shape[0], jnp.result_type(x_train.dtype, float), cg, noise_model,
                            noise)
    if method == "cg":
        return _fit_matfree(kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                            num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal,
                            options=matfree.CG() if cg is None else cg)
    if method == "mixed":
        return _fit_mixed(_evaluator(kfn), kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                          num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal,
                          options=MIXED_CG if cg is None else cg)
    post = _fit_dense(_evaluator(kfn), kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                      num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal)
    return post.replace(kernel=kfn, x_train=x_train)


# Peak memory of the dense path, in N x N matrices (measured: docs/scaling.md). On a CPU the kernel is factorised
# in its own buffer by the blocked Cholesky (XLA's plan 1.36 matrices; fit + predict measured 1.50 at N = 20,000
# and 1.41 at 30,000 beside the runtime's own 0.33 GiB); on an accelerator XLA's one-call factorisation adds a
# transposed copy and its output (3). Unscaled noise: the kernel and its eigenvectors, with the solver's copy.
DENSE_COPIES = {"cpu": 1.5, "accelerator": 3.0}
DENSE_COPIES_UNSCALED = 3.0


def dense_copies(noise_model: str = "scaled", platform: str | None = None) -> float:
    """Peak memory of ``fit(method='dense')`` + ``predict``, in N x N matrices of the inputs' dtype.

    Args:
        noise_model: ``'scaled'`` or ``'unscaled'`` (an eigendecomposition).
        platform: ``'cpu'``, ``'gpu'``, ... (``None``: the first local device's).

    Returns:
        The factor (e.g. 1.5 on a CPU: the kernel factorised in its own buffer plus panels).
    """
    if noise_model == "unscaled":
        return DENSE_COPIES_UNSCALED
    platform = jax.local_devices()[0].platform if platform is None else platform
    return DENSE_COPIES["cpu" if platform == "cpu" else "accelerator"]


def _fit_dense(evaluator, kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess,
               proposal):
    """:func:`fit` by the dense path in one N x N buffer: the kernel built tile by tile into it, its diagonal set
    to the self-covariance plus noise (and jitter), and the Cholesky factor (or the eigendecomposition, for
    unscaled noise) computed in place; a failed factorisation rebuilds the kernel with more jitter."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    noise = common["noise"]
    diag = _traced_diag(evaluator, x_train)
    if diag is None:
        # a kernel that cannot be traced is called as given, and its matrix factorised as a user's would be
        return fit_from_kernels(evaluator(x_train, None), y_train, prior, noise=noise, noise_model=noise_model,
                                num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal)
    n, dtype = x_train.shape[0], jnp.result_type(x_train.dtype, float)
    fn, params = matfree._split_kernel(kfn)
    if noise_model == "scaled" or priors.is_delta(common["prior"]) and noise == 0.0:
        chol = _factor_in_place(fn, params, x_train, diag, noise, dtype)
        return _cholesky_posterior(chol, Y, common, dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                                   proposal=proposal)
    if noise == 0.0:
        raise ValueError("noise_model='unscaled' needs noise > 0 (with noise 0 both noise models coincide)")
    tile = matfree.dense_tile_size(n)
    lam, U = _dense_eigh(fn, tile, params, x_train, diag)
    if not bool(jnp.all(jnp.isfinite(lam))) and not bool(_dense_finite(fn, tile, params, x_train)):
        raise ValueError("the training kernel contains NaN or infinite entries")
    lam = linalg.clip_psd_eigenvalues(lam, "training kernel")
    return _eigh_posterior(lam, U, Y, common, dtype, num_samples=num_samples, key=key, min_ess=min_ess)


def _traced_diag(evaluator, x_train):
    """The training kernel's self-covariances ``k(x_i, None)`` (checked finite), or ``None`` for a kernel that
    cannot be traced (it is then marked so, and called as given)."""
    try:
        if getattr(evaluator, "traceable", True):
            with jax.default_matmul_precision("highest"):
                diag = evaluator.diag(x_train)
    except _NOT_TRACEABLE:
        evaluator.traceable = False
    if not getattr(evaluator, "traceable", True):
        return None
    diag = diag.astype(jnp.result_type(x_train.dtype, float))
    check_finite(diag, "the training kernel's diagonal")
    return diag


def _factor_in_place(fn, params, x_train, diag, noise, store) -> linalg.Cholesky:
    """The Cholesky factor of ``k(X, X) + noise I`` built and factorised in one (N, N) buffer of dtype ``store``
    (float32 for the mixed-precision path), with jitter escalation: each try rebuilds the kernel."""
    n = x_train.shape[0]
    tile, block = matfree.dense_tile_size(n), linalg.cholesky_block_size(n)
    store = jnp.dtype(store)
    name = f"training kernel + noise ({n}x{n}, {store.name})"
    mean_diag = float(jnp.mean(diag)) + noise
    if not mean_diag > 0:
        raise linalg.NotPositiveDefiniteError(f"{name} has non-positive mean diagonal {mean_diag:.3g}")

    def factor(jitter):
        L, ok = _dense_factor(fn, tile, block, store, params, x_train, diag + (noise + jitter))
        if not bool(ok) and jitter == 0.0:
            # NaN in the factor: a kernel that is not finite (checked once, only now: a check beside the
            # in-place factorisation would make XLA keep a copy of the kernel), or one that needs jitter
            del L
            if not bool(_dense_finite(fn, tile, params, x_train)):
                raise ValueError("the training kernel contains NaN or infinite entries")
            return None, False
        return L, ok

    return linalg.escalate_jitter(factor, mean_diag, store, name=name)


def _fit_mixed(evaluator, kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess, proposal,
               options):
    """:func:`fit` in mixed precision: the float32 factor of ``C = K + noise I`` (one float32 N x N buffer, as the
    dense path builds it) preconditions conjugate gradients whose products recompute the float64 kernel by tiles.
    ``C^{-1} Y`` reaches float64 accuracy to ``tol``; ``log|C| = log|P| + tr log(P^{-1} C)`` with the first term
    exact from the factor and the second (small: ``P^{-1} C`` is I up to float32 rounding) by stochastic Lanczos
    quadrature with its standard error."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    dtype = jnp.result_type(x_train.dtype, float)
    if jnp.dtype(dtype).itemsize < 8:
        raise ValueError(f"method='mixed' factorises in float32 and refines in float64, but the inputs are "
                         f"{jnp.dtype(dtype).name}: enable float64 (jax_enable_x64) or use method='dense'")
    if common["noise_model"] != "scaled":
        raise ValueError("method='mixed' supports noise_model='scaled' (conjugate in sigma^2); unscaled noise needs an "
                         "eigendecomposition: use method='dense'")
    if not common["noise"] > 0:
        raise ValueError("method='mixed' needs noise > 0: its float64 solves are of K + noise I")
    diag = _traced_diag(evaluator, x_train)
    if diag is None:
        raise TypeError("method='mixed' recomputes kernel tiles inside compiled code: the kernel must be traceable "
                        "by JAX (use method='dense' for a NumPy kernel)")
    fn, params = matfree._split_kernel(kfn)
    chol = _factor_in_place(fn, params, x_train, diag, common["noise"], jnp.float32)
    pc = matfree.DenseCholesky(chol.L, chol.jitter)
    op = matfree.KernelOperator(kfn, x_train, common["noise"], tile_size=options.tile_size, devices=options.devices)
    alpha, info, est, _ = matfree.solve(op, Y, options, precond=pc)
    q = jnp.sum(Y.astype(alpha.dtype) * alpha)
    state = dict(alpha=alpha, q=q, logdet=jnp.asarray(est.value, alpha.dtype), L32=pc.L,
                 precond_jitter=chol.jitter, logdet_stderr=est.stderr, cg_iterations=info.iterations,
                 cg_residual=info.residual, cg_tol=info.tol)
    post = _scaled_posterior(common, state, 0.0, alpha.dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal, solver=options)
    return post.replace(kernel=kfn, x_train=x_train)


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _dense_factor(fn, tile, block, store, params, x, diag):
    """Kernel (lower triangle, in dtype ``store``) with ``diag`` on its diagonal, and its Cholesky factor in the
    same buffer."""
    A = matfree.dense_kernel(fn, params, x, tile, lower_only=True, dtype=store)
    idx = jnp.arange(x.shape[0])
    A = A.at[idx, idx].set(diag.astype(A.dtype))
    L = linalg.blocked_cholesky(A, block)
    return L, jnp.all(jnp.isfinite(jnp.diagonal(L)))


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _dense_finite(fn, tile, params, x):
    return jnp.all(jnp.isfinite(matfree.dense_kernel(fn, params, x, tile, lower_only=True)))


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _dense_eigh(fn, tile, params, x, diag):
    """Kernel with ``diag`` on its diagonal and its eigendecomposition (the eigenvectors in the kernel's buffer)."""
    A = matfree.dense_kernel(fn, params, x, tile, lower_only=False)
    idx = jnp.arange(x.shape[0])
    A = A.at[idx, idx].set(diag.astype(A.dtype))
    return jnp.linalg.eigh(A.T, symmetrize_input=False)


# CG settings of method='mixed' when none are given: float64 accuracy. With the float32 factor as preconditioner
# each further digit costs about one iteration (a pass of float64 kernel tiles).
MIXED_CG = matfree.CG(tol=1e-10)


def _choose_method(method, n, dtype, cg, noise_model="scaled", noise=0.0):
    if method not in ("auto", "dense", "mixed", "cg"):
        raise ValueError(f"method must be 'auto', 'dense', 'mixed' or 'cg', got {method!r}")
    if cg is not None and not isinstance(cg, matfree.CG):
        raise TypeError(f"cg must be a smnngp.matfree.CG, got {type(cg).__name__}")
    if method == "cg":
        return method
    copies = dense_copies(noise_model if noise_model in ("scaled", "unscaled") else "scaled")
    free = matfree.available_memory_bytes()

    def need(store):
        return copies * n * n * jnp.dtype(store).itemsize

    if method in ("dense", "mixed"):
        store = dtype if method == "dense" else jnp.float32
        if free is not None and need(store) > free:
            raise MemoryError(f"method={method!r} needs about {need(store) / 2**30:.1f} GiB ({copies:g} x {n} x {n} "
                              f"{jnp.dtype(store).name}) and the device has {free / 2**30:.1f} GiB free; use "
                              "method='cg' (matrix-free) or method='auto'")
        return method
    if free is None or need(dtype) <= free:
        return "dense"
    # float64 that does not fit: its float32 factor refined in float64 (the same accuracy, half the memory)
    mixed_ok = jnp.dtype(dtype).itemsize >= 8 and noise_model == "scaled" and _positive(noise)
    return "mixed" if mixed_ok and need(jnp.float32) <= free else "cg"


def _positive(noise) -> bool:
    try:
        return float(noise) > 0
    except (TypeError, ValueError):
        return False


def _fit_matfree(kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess, proposal, options):
    """:func:`fit` by the matrix-free path: q and log|C| from one preconditioned CG run with SLQ probes."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    if not common["noise"] > 0:
        raise ValueError("method='cg' needs noise > 0: conjugate gradients and the preconditioner solve K + noise I")
    if common["noise_model"] != "scaled":
        post = _fit_matfree_unscaled(kfn, x_train, Y, common, num_samples=num_samples, key=key, min_ess=min_ess,
                                     options=options)
        return post.replace(kernel=kfn, x_train=x_train)
    op = matfree.KernelOperator(kfn, x_train, common["noise"], tile_size=options.tile_size, devices=options.devices)
    alpha, info, est, pc = matfree.solve(op, Y, options)
    q = jnp.sum(Y.astype(alpha.dtype) * alpha)
    state = dict(alpha=alpha, q=q, logdet=jnp.asarray(est.value, alpha.dtype), U=pc.U, lam=pc.lam,
                 logdet_stderr=est.stderr, cg_iterations=info.iterations, cg_residual=info.residual, cg_tol=info.tol,
                 precond_trace_error=pc.trace_error)
    post = _scaled_posterior(common, state, 0.0, alpha.dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal, solver=options)
    return post.replace(kernel=kfn, x_train=x_train)


def _fit_matfree_unscaled(kfn, x_train, Y, common, *, num_samples, key, min_ess, options):
    """Unscaled noise without the matrix: ``beta K + noise I = beta (K + s I)`` with ``s = noise / beta``, so every
    sample's ``q`` and ``log|C|`` are splines in ``log s`` through matrix-free solves at a few shifts
    (`smnngp.shifts`): a coarse grid over all sampled shifts, then a fine one where the weight is."""
    prior, noise = common["prior"], common["noise"]
    n, n_out = common["n_train"], common["n_out"]
    dtype = jnp.result_type(x_train.dtype, float)
    if priors.is_delta(prior):
        beta = jnp.reshape(jnp.asarray(prior.v, dtype), (1,))
    else:
        beta = _prior_samples(prior, key, num_samples, dtype)
    s = noise / np.asarray(beta, float)
    op = matfree.KernelOperator(kfn, x_train, float(np.median(s)), tile_size=options.tile_size,
                                devices=options.devices)
    pc = matfree.pivoted_cholesky(op, options.precond_rank)
    Y = Y.astype(dtype)

    def log_w(grid, idx=slice(None)):
        B = shifts.spline_basis(grid.t, np.log(s[idx]))
        return np.asarray(scaled_log_weights(B @ grid.q, B @ grid.logdet, n, n_out, np.asarray(beta)[idx]))

    coarse = shifts.fit_grid(op, Y, shifts.log_spaced(s.min(), s.max(), shifts.COARSE_NODES), options, pc)
    lw = np.array(log_w(coarse))
    interp_error = 0.0
    if coarse.t.shape[0] == 1:
        fine = coarse
    else:
        # the fine grid spans the samples within exp(-FINE_SPAN) of the largest weight (by the coarse grid, with a
        # margin for its error); the rest carry less than num_samples x exp(-FINE_SPAN) of the mass and are dropped
        mass = lw - lw.max() > -(shifts.FINE_SPAN + 10.0)
        fine = shifts.fit_grid(op, Y, shifts.log_spaced(s[mass].min(), s[mass].max(), shifts.FINE_NODES), options,
                               pc)
        inside = (np.log(s) >= fine.t[0] - 1e-12) & (np.log(s) <= fine.t[-1] + 1e-12)
        lw = np.full(s.shape, -np.inf)
        lw[inside] = log_w(fine, inside)
        # the interpolation's error, over-estimated: the log ML from a spline through every other fine node
        if fine.t.shape[0] >= 4:
            half = fine._replace(t=fine.t[::2], q=fine.q[::2], logdet=fine.logdet[::2])
            lw_half = log_w(half, inside)
            interp_error = float(abs(logsumexp(lw_half) - logsumexp(lw[inside])))
    state = dict(grid_t=fine.t, grid_alpha=fine.alpha, U=pc.U, lam=pc.lam, logdet_stderr=float(np.max(
        np.concatenate([coarse.logdet_stderr, fine.logdet_stderr]))), cg_iterations=max(coarse.iterations,
        fine.iterations), cg_residual=max(coarse.residual, fine.residual), cg_tol=fine.tol,
        precond_trace_error=pc.trace_error, interpolation_error=interp_error, grid_nodes=int(coarse.t.shape[0] + (
        0 if fine is coarse else fine.t.shape[0])))
    log_w_all = jnp.asarray(lw, dtype)
    if priors.is_delta(prior):
        return GaussianPosterior(log_marginal_likelihood=float(lw[0]), state=state, s=prior.v, solver=options,
                                 **common)
    return _importance_posterior(common, state, beta, log_w_all, 0.0, num_samples, min_ess, solver=options)


def fit_from_kernels(k_train, y_train, prior=None, *, noise: float = 0.0, noise_model: str = "scaled",
                     num_samples: int = 10_000, key=None, min_ess: float = 30.0, proposal: str = "prior") -> Posterior:
    """As :func:`fit`, from a precomputed (N, N) training kernel; predict with ``k_test_train``/``k_test_test``.

    Args:
        k_train: training kernel matrix Kbar, (N, N), symmetric positive semi-definite.
        y_train: training targets, (N,) or (N, C).
        prior: scale prior on sigma^2 (``None``: ``Delta(1)``; a positive number ``s``: ``Delta(s)``).
        noise: ``eps`` (scaled noise) or ``sigma_n^2`` (unscaled noise), non-negative and finite.
        noise_model: ``'scaled'`` (default) or ``'unscaled'`` (needs ``noise > 0``).
        num_samples: importance samples drawn (non-conjugate cases only), a positive int.
        key: JAX PRNG key for the importance samples (``None``: ``PRNGKey(0)``).
        min_ess: warn (:class:`SmallESSWarning`) below this effective sample size.
        proposal: ``'prior'`` or ``'likelihood'`` (scaled noise only), as in :func:`fit`.

    Returns:
        A :class:`Posterior` (Gaussian, Student-t or importance-sampled, as in :func:`fit`) without kernel or
        training inputs: pass ``k_test_train`` and ``k_test_test`` to its prediction methods.

    Raises:
        ValueError: if ``k_train`` is not a non-empty square matrix, is not symmetric or not finite, the targets
            do not match it, ``noise``, ``noise_model``, ``proposal`` or ``num_samples`` is invalid, the prior is
            invalid, or no prior sample of sigma^2 is positive and finite.
        TypeError: if ``prior`` is not a numpyro distribution, a number or ``None``.
        NotPositiveDefiniteError: if the training kernel (plus noise) is not positive (semi-)definite.
        FloatingPointError: if all importance weights are zero or not finite.

    Warns:
        SmallESSWarning: when the effective sample size is below ``min_ess``.
        UserWarning: when the Cholesky factorisation needed jitter, or some prior samples were dropped.
    """
    k_train = linalg.check_square(k_train, "k_train")
    if not jnp.issubdtype(k_train.dtype, jnp.floating):
        k_train = k_train.astype(jnp.result_type(float))
    Y, common = _prepare(y_train, k_train.shape[0], prior, noise, noise_model, proposal)
    prior, noise = common["prior"], common["noise"]
    is_delta = priors.is_delta(prior)

    if noise_model == "scaled" or is_delta and noise == 0.0:
        # the Cholesky of C = k_train + noise I, without forming C
        chol = linalg._shifted_cholesky(k_train, noise, name="training kernel + noise")
        return _cholesky_posterior(chol, Y, common, k_train.dtype, num_samples=num_samples, key=key,
                                   min_ess=min_ess, proposal=proposal)

    # unscaled noise: one eigendecomposition, O(N) per sigma^2
    if noise == 0.0:
        raise ValueError("noise_model='unscaled' needs noise > 0 (with noise 0 both noise models coincide)")
    lam, U = linalg.eigh_psd(k_train, name="training kernel")
    return _eigh_posterior(lam, U, Y, common, k_train.dtype, num_samples=num_samples, key=key, min_ess=min_ess)


def _cholesky_posterior(chol, Y, common, dtype, *, num_samples, key, min_ess, proposal):
    """Scaled noise (or noise-free ``Delta``): the posterior from the factor of ``C = Kbar + eps I``."""
    if chol.jitter > 0:
        warnings.warn(f"the training kernel needed jitter {chol.jitter:.3g} to factorise (singular, e.g. repeated "
                      "inputs); consider noise > 0", stacklevel=3)
    alpha, q, ld = _scaled_fit_stats(chol.L, Y.astype(chol.L.dtype))
    state = dict(L=chol.L, alpha=alpha, q=q, logdet=ld)
    return _scaled_posterior(common, state, chol.jitter, dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal)


def _eigh_posterior(lam, U, Y, common, dtype, *, num_samples, key, min_ess):
    """Unscaled noise: the posterior from ``Kbar = U diag(lam) U^T`` (O(N) per sample of sigma^2)."""
    prior, noise = common["prior"], common["noise"]
    ytilde = U.T @ Y.astype(U.dtype)
    state = dict(lam=lam, U=U, ytilde=ytilde)
    if priors.is_delta(prior):
        beta = jnp.reshape(prior.v, (1,)).astype(dtype)
        log_w = unscaled_log_weights(lam, ytilde**2, noise, beta)
        return GaussianPosterior(log_marginal_likelihood=float(log_w[0]), state=state, s=prior.v, **common)
    beta = _prior_samples(prior, key, num_samples, dtype)
    log_w = unscaled_log_weights(lam, ytilde**2, noise, beta)
    return _importance_posterior(common, state, beta, log_w, 0.0, num_samples, min_ess)


def _prepare(y_train, n, prior, noise, noise_model, proposal):
    """Checked targets as (N, C) and the fields every posterior shares."""
    y = _as_targets(y_train, n)
    squeeze = y.ndim == 1
    Y = y[:, None] if squeeze else y
    noise = _check_noise(noise, noise_model)
    prior = priors.as_prior(prior)
    if proposal not in ("prior", "likelihood"):
        raise ValueError(f"proposal must be 'prior' or 'likelihood', got {proposal!r}")
    if proposal == "likelihood" and noise_model != "scaled":
        raise ValueError("proposal='likelihood' is implemented for noise_model='scaled' only; use proposal='prior'")
    return Y, dict(prior=prior, noise=noise, noise_model=noise_model, n_train=n, n_out=Y.shape[1], squeeze=squeeze)


# Compiled groups of the scalar / O(N^2) steps of fit_from_kernels (eagerly, each op would be compiled on first use).


@jax.jit
def _scaled_fit_stats(chol_l, Y):
    alpha = linalg.cho_solve(chol_l, Y)
    return alpha, jnp.sum(Y * alpha), linalg.logdet(chol_l)


_gaussian_log_ml_jit = jax.jit(gaussian_log_ml, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _student_t_fit(q, ld, n, n_out, a, b):
    nc = n * n_out
    return student_t_log_ml(q, ld, n, n_out, a, b), a + nc / 2, b + q / 2, 2 * a + nc


def _scaled_posterior(common, state, jitter, dtype, *, num_samples, key, min_ess, proposal, solver=None):
    """The posterior for scaled noise from ``q = tr(Y^T C^-1 Y)`` and ``log|C|`` in ``state`` (dense or
    matrix-free alike): Gaussian for a ``Delta`` prior, Student-t for an inverse gamma, else importance-sampled."""
    prior, n, n_out = common["prior"], common["n_train"], common["n_out"]
    q, ld, nc = state["q"], state["logdet"], n * n_out
    if priors.is_delta(prior):
        s = prior.v
        lml = _gaussian_log_ml_jit(q, ld, n, n_out, s)
        return GaussianPosterior(log_marginal_likelihood=float(lml), jitter=jitter, state=state, s=s, solver=solver,
                                 **common)
    if priors.is_inverse_gamma(prior):
        a, b = priors.inverse_gamma_params(prior)
        lml, a_post, b_post, df = _student_t_fit(q, ld, n, n_out, a, b)
        return StudentTPosterior(log_marginal_likelihood=float(lml), jitter=jitter, state=state, a_post=a_post,
                                 b_post=b_post, _df=df, solver=solver, **common)
    if proposal == "prior":
        beta = _prior_samples(prior, key, num_samples, dtype)
        log_w = scaled_log_weights(q, ld, n, n_out, beta)
    else:
        # The likelihood in beta is an inverse-gamma kernel, beta^{-NC/2} e^{-q/(2 beta)}; a proposal with
        # that shape, widened (half the shape and rate: the same centre, larger spread, heavier tail), puts
        # the samples where the posterior is. Weights: prior / proposal x likelihood.
        prop = priors.InverseGamma(max(0.5, (nc / 2 - 1) / 2), float(q) / 4)
        beta = _prior_samples(prop, key, num_samples, dtype)
        log_w = scaled_log_weights(q, ld, n, n_out, beta) + prior.log_prob(beta) - prop.log_prob(beta)
    return _importance_posterior(common, state, beta, log_w, jitter, num_samples, min_ess, solver=solver)


def _prior_samples(prior, key, num_samples, dtype):
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if key is None:
        key = jax.random.PRNGKey(0)
    beta = jnp.asarray(prior.sample(key, (int(num_samples),)), dtype)
    if not bool(jnp.all(jnp.isfinite(beta) & (beta > 0))):
        bad = int(jnp.sum(~(jnp.isfinite(beta) & (beta > 0))))
        warnings.warn(f"{bad} of {num_samples} prior samples of sigma^2 were not positive and finite; dropped",
                      stacklevel=3)
        beta = beta[jnp.isfinite(beta) & (beta > 0)]
        if beta.shape[0] == 0:
            raise ValueError("no usable prior samples of sigma^2")
    return beta


def _importance_posterior(common, state, beta, log_w, jitter, num_samples, min_ess, solver=None):
    total = logsumexp(log_w)
    lml = float(total - jnp.log(log_w.shape[0]))
    log_wn = log_w - total
    ess = float(1.0 / jnp.sum(jnp.exp(2 * log_wn)))
    if not math.isfinite(lml):
        raise FloatingPointError("importance weights are all zero or non-finite; the prior misses the posterior")
    if ess < min_ess:
        warnings.warn(
            f"importance sampling effective sample size is {ess:.1f} of {log_w.shape[0]} samples: the prior is a poor "
            "proposal here; increase num_samples or check the prior", SmallESSWarning, stacklevel=3,
        )
    keep = np.asarray(log_wn > _PRUNE_LOG_WEIGHT)
    return ImportancePosterior(log_marginal_likelihood=lml, jitter=jitter, state=state, beta=beta[keep],
                               log_w=log_wn[keep] - logsumexp(log_wn[keep]), _ess=ess,
                               _num_samples=int(log_w.shape[0]), solver=solver, **common)
