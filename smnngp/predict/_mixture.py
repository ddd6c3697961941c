"""Scale mixtures of Gaussians: the laws of trained infinite networks with a prior on the readout variance.

See the `smnngp.predict` package docstring (paper Thms 3.2, 3.3).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln, log_ndtr, logsumexp
from numpyro.distributions import constraints

from smnngp import linalg
from smnngp._axes import lead
from smnngp.kernels import canonical_get, pack
from smnngp.predict._ensemble import _float_array, gradient_descent_mse_ensemble
from smnngp.priors import as_prior, inverse_gamma_params, is_delta, is_inverse_gamma

__all__ = [
    "gradient_descent_mse_scale_mixture",
    "scale_mixture_predictive",
    "predictive_marginals",
    "ScaleMixtureNormal",
    "ScaleMixtureNormal1D",
]


# ---------------------------------------------------------------------------
# Scale mixtures of Gaussians
# ---------------------------------------------------------------------------

# Window of u = log sigma^2 searched by the quadrature, by dtype.
_LOG_WINDOW = {np.dtype("float64"): 100.0, np.dtype("float32"): 60.0}
_N_COARSE = 4097
_N_FINE = 1025
_DROP = 60.0  # the fine grid spans where the log integrand is within _DROP of its maximum


def _minus(value, loc):
    """``value - loc`` with numpy's broadcasting written out: ``value`` may carry sample axes in front of the batch
    and event axes of ``loc`` (numpyro's convention), or broadcast against them."""
    value = jnp.asarray(value)
    n = max(value.ndim, jnp.ndim(loc))
    return lead(value, n) - lead(loc, n)


def _log_window(dtype) -> float:
    return _LOG_WINDOW.get(np.dtype(dtype), 60.0)


def _log_prior_u(prior, u):
    """Log density of u = log sigma^2 under the prior on sigma^2: log h(e^u) + u."""
    lp = prior.log_prob(jnp.exp(u)) + u
    return jnp.where(jnp.isnan(lp), -jnp.inf, lp)


def _log_quad(log_f: Callable, batch_shape, dtype):
    """log of the integral over the real line of exp(log_f(u)) for a smooth, decaying, unimodal-ish integrand.

    ``log_f(u)`` maps a grid ``u`` of shape ``(..., G)`` (broadcasting against
    ``batch_shape + (1,)``) to log integrand values. A coarse grid over
    ``|u| <= W`` locates where the integrand is within ``exp(-60)`` of its
    peak; a fine trapezoid grid of 1025 points spans that bracket (the
    trapezoid rule converges geometrically for such integrands). Returns NaN
    where the integrand has not decayed inside the window (e.g. a density that
    is infinite at that point).
    """
    w = _log_window(dtype)
    u_c = jnp.linspace(-w, w, _N_COARSE, dtype=dtype)
    vals = jnp.broadcast_to(log_f(u_c), tuple(batch_shape) + (_N_COARSE,))
    vals = jnp.where(jnp.isnan(vals), -jnp.inf, vals)
    vmax = jnp.max(vals, axis=-1, keepdims=True)
    keep = vals > vmax - _DROP
    first = jnp.argmax(keep, axis=-1)
    last = _N_COARSE - 1 - jnp.argmax(keep[..., ::-1], axis=-1)
    lo = u_c[jnp.maximum(first - 1, 0)]
    hi = u_c[jnp.minimum(last + 1, _N_COARSE - 1)]
    s = jnp.linspace(0.0, 1.0, _N_FINE, dtype=dtype)
    u_f = lo[..., None] + (hi - lo)[..., None] * lead(s, lo.ndim + 1)
    v = log_f(u_f)
    v = jnp.where(jnp.isnan(v), -jnp.inf, v)
    h = (hi - lo) / (_N_FINE - 1)
    logw = jnp.log(jnp.concatenate([jnp.full((1,), 0.5, dtype), jnp.ones((_N_FINE - 2,), dtype),
                                    jnp.full((1,), 0.5, dtype)]))
    out = logsumexp(v + lead(logw, v.ndim), axis=-1) + jnp.log(h)
    touches = (first == 0) | (last == _N_COARSE - 1)
    return jnp.where(touches | ~jnp.isfinite(vmax[..., 0]), jnp.nan, out)


class ScaleMixtureNormal(dist.Distribution):
    """``x = loc + sqrt(s) L z`` with ``s ~ prior`` (one draw per joint sample) and ``z ~ N(0, I)``.

    ``loc`` has shape ``batch_shape + event_shape`` with ``event_shape`` either
    ``(M,)`` (``event_ndim=1``) or ``(M, C)`` (``event_ndim=2``: C outputs
    sharing one scale draw, the paper's one ``sigma_v^2`` per network);
    ``scale_tril`` ``L`` is (M, M) and correlates the M axis; outputs are
    conditionally independent. Every batch element has its own scale.

    ``log_prob`` of a joint value: with ``q = sum_c |L^{-1} (x_c - loc_c)|^2``
    and ``d = M C``, ``log p = -d/2 log 2 pi - C log|L| + log int s^{-d/2}
    exp(-q / 2s) h(s) ds``. The integral is closed-form for an inverse gamma
    prior (the multivariate Student t, ``closed_form=True``) and a point mass,
    and otherwise computed by quadrature over ``log s`` (see :func:`_log_quad`;
    relative accuracy about 1e-10 in float64 for smooth priors).

    Args:
        loc: location, ``batch_shape + event_shape``.
        scale_tril: lower-triangular ``L``, (M, M), shared by the batch and the outputs.
        prior: the law of ``s``, anything :func:`smnngp.priors.as_prior` accepts.
        event_ndim: 1 (event shape (M,)) or 2 (event shape (M, C)).
        closed_form: use the closed form for an inverse gamma prior; with ``False`` it goes through the
            quadrature like any other prior (useful to test the quadrature).
        validate_args: numpyro's flag to validate arguments and values (``None``: numpyro's global default).

    Raises:
        ValueError: if ``event_ndim`` is not 1 or 2, ``loc`` has fewer than ``event_ndim`` axes, or
            ``scale_tril`` is not (M, M).
    """

    arg_constraints = {"loc": constraints.real}
    support = constraints.real_vector
    reparametrized_params = ["loc"]

    def __init__(self, loc, scale_tril, prior, *, event_ndim: int = 1, closed_form: bool = True,
                 validate_args=None):
        if event_ndim not in (1, 2):
            raise ValueError(f"ScaleMixtureNormal: event_ndim must be 1 or 2, got {event_ndim}")
        loc = jnp.asarray(loc)
        L = jnp.asarray(scale_tril)
        if loc.ndim < event_ndim:
            raise ValueError(f"ScaleMixtureNormal: loc of shape {loc.shape} has fewer than {event_ndim} axes")
        m = loc.shape[-event_ndim]
        if L.shape != (m, m):
            raise ValueError(f"ScaleMixtureNormal: scale_tril must be ({m}, {m}) for loc {loc.shape}, got {L.shape}")
        self.prior = as_prior(prior)
        self.loc, self.scale_tril = loc, L
        self.event_ndim_ = event_ndim
        self.closed_form = closed_form
        batch_shape, event_shape = loc.shape[: loc.ndim - event_ndim], loc.shape[loc.ndim - event_ndim:]
        if event_ndim == 2:
            self.support = constraints.independent(constraints.real, 2)
        super().__init__(batch_shape=batch_shape, event_shape=event_shape, validate_args=validate_args)

    def _mul_L(self, z):
        if self.event_ndim_ == 1:
            return z @ self.scale_tril.T
        return jnp.einsum("ij,...jc->...ic", self.scale_tril, z)

    def sample(self, key, sample_shape=()):
        k_s, k_z = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        s = jnp.asarray(self.prior.sample(k_s, shape), self.loc.dtype)
        z = jax.random.normal(k_z, shape + self.event_shape, self.loc.dtype)
        scale = jnp.sqrt(s).reshape(shape + (1,) * self.event_ndim_)
        step = scale * self._mul_L(z)
        return lead(self.loc, step.ndim) + step

    def _quadratic(self, value):
        r = _minus(value, self.loc)
        m = self.event_shape[0]
        if self.event_ndim_ == 1:
            w = linalg.solve_triangular(self.scale_tril, r.reshape(-1, m).T).T.reshape(r.shape)
        else:
            c = self.event_shape[1]
            flat = jnp.moveaxis(r, -2, 0).reshape(m, -1)
            w = linalg.solve_triangular(self.scale_tril, flat).reshape((m,) + r.shape[:-2] + (c,))
            w = jnp.moveaxis(w, 0, -2)
        axes = tuple(range(-self.event_ndim_, 0))
        return jnp.sum(w**2, axis=axes)

    def log_prob(self, value):
        q = self._quadratic(value)
        d = math.prod(self.event_shape)
        n_out = d // self.event_shape[0]
        logdet = n_out * jnp.sum(jnp.log(jnp.diag(self.scale_tril)))
        const = -0.5 * d * math.log(2 * math.pi) - logdet
        return const + _log_mixture_integral(self.prior, q, d, self.closed_form, q.dtype)

    @property
    def mean(self):
        return jnp.broadcast_to(self.loc, self.batch_shape + self.event_shape)

    @property
    def variance(self):
        var = jnp.sum(self.scale_tril**2, axis=-1)
        if self.event_ndim_ == 2:
            var = var[:, None]
        return jnp.broadcast_to(_prior_mean(self.prior) * var, self.batch_shape + self.event_shape)

    def marginal(self) -> ScaleMixtureNormal1D:
        """Per-entry (univariate) laws: batch shape ``batch_shape + event_shape``."""
        sd = jnp.sqrt(jnp.sum(self.scale_tril**2, axis=-1))
        if self.event_ndim_ == 2:
            sd = sd[:, None]
        return ScaleMixtureNormal1D(self.loc, jnp.broadcast_to(sd, self.loc.shape), self.prior,
                                    closed_form=self.closed_form)


def _prior_mean(prior):
    if is_delta(prior):
        return prior.v
    try:
        return prior.mean
    except NotImplementedError:
        return jnp.nan


def _log_mixture_integral(prior, q, d: int, closed_form: bool, dtype):
    """log int s^{-d/2} exp(-q / (2 s)) h(s) ds, elementwise in q."""
    if is_delta(prior):
        s = jnp.asarray(prior.v, dtype)
        return -0.5 * d * jnp.log(s) - 0.5 * q / s
    if closed_form and is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return a * jnp.log(b) - gammaln(a) + gammaln(a + 0.5 * d) - (a + 0.5 * d) * jnp.log(b + 0.5 * q)
    return _quad_log_mixture(prior, jnp.asarray(q, dtype), d)


@functools.partial(jax.jit, static_argnames=("d",))
def _quad_log_mixture(prior, q, d: int):
    qe = q[..., None]

    def log_f(u):  # u: the shared grid (G,) or per-point grids (..., G); qe (..., 1)
        n = max(qe.ndim, u.ndim)
        return lead(_log_prior_u(prior, u) - 0.5 * d * u, n) - 0.5 * lead(qe, n) * lead(jnp.exp(-u), n)
    return _log_quad(log_f, q.shape, q.dtype)


@jax.jit
def _quad_log_cdf(prior, r):
    """log int Phi(r / sqrt(s)) h(s) ds."""
    re = r[..., None]

    def log_f(u):  # as in _quad_log_mixture
        n = max(re.ndim, u.ndim)
        return lead(_log_prior_u(prior, u), n) + log_ndtr(lead(re, n) * lead(jnp.exp(-0.5 * u), n))
    return _log_quad(log_f, r.shape, r.dtype)


class ScaleMixtureNormal1D(dist.Distribution):
    """Univariate ``x = loc + sqrt(s) scale z``, ``s ~ prior``, elementwise over the batch (marginal laws).

    ``log_prob`` and ``cdf`` are closed-form for an inverse gamma prior
    (Student t with ``2a`` degrees of freedom and scale ``sqrt(b/a) scale``) and a
    point mass, otherwise quadrature over ``log s``.

    Args:
        loc: location; broadcast with ``scale`` to the batch shape.
        scale: positive scale, broadcast with ``loc``.
        prior: the law of ``s``, anything :func:`smnngp.priors.as_prior` accepts.
        closed_form: use the closed forms for an inverse gamma prior; with ``False``, quadrature.
        validate_args: numpyro's flag to validate arguments and values (``None``: numpyro's global default).
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    reparametrized_params = ["loc", "scale"]

    def __init__(self, loc, scale, prior, *, closed_form: bool = True, validate_args=None):
        self.loc, self.scale = jnp.broadcast_arrays(jnp.asarray(loc), jnp.asarray(scale))
        self.prior = as_prior(prior)
        self.closed_form = closed_form
        super().__init__(batch_shape=self.loc.shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        k_s, k_z = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        s = jnp.asarray(self.prior.sample(k_s, shape), self.loc.dtype)
        n = len(shape)  # sample_shape + batch_shape: loc and scale broadcast over the sample axes
        return lead(self.loc, n) + jnp.sqrt(s) * lead(self.scale, n) * jax.random.normal(k_z, shape, self.loc.dtype)

    def log_prob(self, value):
        r = _minus(value, self.loc)
        r = r / lead(self.scale, r.ndim)
        const = -0.5 * math.log(2 * math.pi) - jnp.log(self.scale)
        return lead(const, r.ndim) + _log_mixture_integral(self.prior, r**2, 1, self.closed_form, r.dtype)

    def cdf(self, value):
        r = _minus(value, self.loc)
        r = r / lead(self.scale, r.ndim)
        prior = self.prior
        if is_delta(prior):
            return jax.scipy.stats.norm.cdf(r / jnp.sqrt(prior.v))
        if self.closed_form and is_inverse_gamma(prior):
            a, b = inverse_gamma_params(prior)
            return _t_cdf(r / jnp.sqrt(b / a), 2.0 * a)
        return jnp.exp(_quad_log_cdf(prior, r))

    @property
    def mean(self):
        return self.loc

    @property
    def variance(self):
        return _prior_mean(self.prior) * self.scale**2


def _t_cdf(x, df):
    """Student t CDF through the regularised incomplete beta function."""
    from jax.scipy.special import betainc

    tail = 0.5 * betainc(0.5 * df, 0.5, df / (df + x**2))
    return jnp.where(x > 0, 1.0 - tail, tail)


def _check_mean_cov(mean, cov, where):
    mean = _float_array(mean, "mean", where)
    cov = _float_array(cov, "cov", where)
    if mean.ndim not in (1, 2):
        raise ValueError(
            f"{where}: mean must be (M,) or (M, C), got shape {mean.shape} (index the time axis of a predict_fn "
            f"result first)"
        )
    m = mean.shape[0]
    if cov.shape != (m, m):
        raise ValueError(f"{where}: cov must be ({m}, {m}) for mean of shape {mean.shape}, got {cov.shape}")
    return mean, cov


def scale_mixture_predictive(mean, cov, prior, *, joint_outputs: bool = True):
    """Law of ``f = mean + sigma_v * N(0, cov)`` with ``sigma_v^2 ~ prior`` (paper Thms 3.1-3.3, eq. 5).

    ``(mean, cov)`` is the Gaussian of the kernel whose last layer has ``W_std = 1``
    (e.g. one :class:`Gaussian` from :func:`gradient_descent_mse_ensemble`).

    * ``mean`` (M,) or (M, 1): inverse gamma ``(a, b)`` gives numpyro's
      ``MultivariateStudentT(df=2a, loc=mean, scale_tril=chol((b/a) cov))``;
      a point mass ``Delta(s)`` gives ``MultivariateNormal(mean, s cov)``; any
      other prior a :class:`ScaleMixtureNormal`. Event shape (M,).
    * ``mean`` (M, C), C > 1, ``joint_outputs=True`` (default): one
      :class:`ScaleMixtureNormal` with event shape (M, C) in which all outputs
      share the scale draw, as the paper's single ``sigma_v^2`` per network
      implies (closed forms used for inverse gamma / point mass priors).
      ``joint_outputs=False``: a batch of C independent laws over the columns,
      batch shape (C,), event shape (M,) (built-in numpyro laws where they exist);
      each column's law is the exact marginal of the joint one.

    Args:
        mean: Gaussian mean, (M,) or (M, C).
        cov: Gaussian covariance between the M points, (M, M), positive definite (a tiny jitter is added, with a
            RuntimeWarning, when it is numerically singular).
        prior: scale prior on ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.
        joint_outputs: for C > 1 outputs, one joint law sharing the scale draw (default) or C independent laws.

    Returns:
        numpyro distribution: ``MultivariateStudentT``, ``MultivariateNormal`` or :class:`ScaleMixtureNormal`, as
        listed above.

    Raises:
        ValueError: if ``mean`` is not (M,) or (M, C), ``cov`` is not (M, M), an entry is not finite, the prior is
            invalid, or ``cov`` is not symmetric.
        NotPositiveDefiniteError: if ``cov`` is not positive definite even with jitter.
    """
    where = "scale_mixture_predictive"
    mean, cov = _check_mean_cov(mean, cov, where)
    prior = as_prior(prior)
    if mean.ndim == 2 and mean.shape[1] == 1:
        mean = mean[:, 0]
    fac = linalg.cholesky(cov, name="predictive covariance")
    if fac.jitter > 0:
        warnings.warn(f"{where}: the covariance is numerically singular; added jitter {fac.jitter:.3g}",
                      RuntimeWarning, stacklevel=2)
    L = fac.L
    if mean.ndim == 2 and joint_outputs:
        return ScaleMixtureNormal(mean, L, prior, event_ndim=2)
    loc = mean if mean.ndim == 1 else mean.T
    if is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return dist.MultivariateStudentT(2.0 * a, loc, jnp.sqrt(b / a) * L)
    if is_delta(prior):
        return dist.MultivariateNormal(loc, scale_tril=jnp.sqrt(jnp.asarray(prior.v, L.dtype)) * L)
    return ScaleMixtureNormal(loc, L, prior, event_ndim=1)


def predictive_marginals(mean, cov, prior):
    """Per-point laws of ``f_i = mean_i + sigma_v sqrt(cov_ii) z``: batch shape ``mean.shape``.

    Inverse gamma ``(a, b)``: numpyro ``StudentT(2a, mean, sqrt(b/a cov_ii))``;
    point mass ``Delta(s)``: ``Normal(mean, sqrt(s cov_ii))``; otherwise a
    :class:`ScaleMixtureNormal1D`.

    Args:
        mean: Gaussian mean, (M,) or (M, C).
        cov: Gaussian covariance, (M, M); only its diagonal is used, and it must be positive.
        prior: scale prior on ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.

    Returns:
        numpyro distribution with batch shape ``mean.shape``: ``StudentT``, ``Normal`` or
        :class:`ScaleMixtureNormal1D`.

    Raises:
        ValueError: if the shapes do not match, an entry is not finite, the prior is invalid, or a diagonal entry
            of ``cov`` is not positive.
    """
    mean, cov = _check_mean_cov(mean, cov, "predictive_marginals")
    prior = as_prior(prior)
    var = jnp.diag(cov)
    if bool(jnp.any(var <= 0)):
        raise ValueError(f"predictive_marginals: cov has non-positive diagonal entries (min {float(var.min()):.3g})")
    sd = jnp.sqrt(var) if mean.ndim == 1 else jnp.sqrt(var)[:, None]
    sd = jnp.broadcast_to(sd, mean.shape)
    if is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return dist.StudentT(2.0 * a, mean, jnp.sqrt(b / a) * sd)
    if is_delta(prior):
        return dist.Normal(mean, jnp.sqrt(jnp.asarray(prior.v, sd.dtype)) * sd)
    return ScaleMixtureNormal1D(mean, sd, prior)


def gradient_descent_mse_scale_mixture(
    kernel_fn: Callable,
    x_train,
    y_train,
    prior,
    *,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    learning_rate: float = 1.0,
    joint_outputs: bool = True,
) -> Callable:
    """Law of gradient-trained infinite networks whose readout variance is drawn from ``prior`` (Thms 3.2, 3.3).

    ``kernel_fn`` must be that of the network with last-layer ``W_std = 1``.
    Returns ``predict_fn(t=None, x_test=None, get='nngp')`` giving the
    distribution of :func:`scale_mixture_predictive` (a named tuple of them for
    a tuple ``get``). On the training inputs at ``t = inf`` the law is a point
    mass at ``y_train``, which has no density: pass ``x_test`` or a finite ``t``.

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get)`` of the network with last-layer ``W_std = 1``.
        x_train: (N, ...) training inputs.
        y_train: (N,) or (N, C) training targets.
        prior: scale prior on the readout variance ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.
        diag_reg: relative diagonal regulariser, as in :func:`gradient_descent_mse_ensemble`.
        diag_reg_absolute_scale: take ``diag_reg`` in absolute units.
        learning_rate: ``eta``; only ``eta * t`` matters.
        joint_outputs: passed to :func:`scale_mixture_predictive` (one law shared by the C outputs, or C laws).

    Returns:
        ``predict_fn(t=None, x_test=None, get='nngp')``, where ``t`` is a scalar training time (``None`` or
        ``inf``: converged), ``x_test`` (M, ...) test inputs (``None``: the training inputs) and ``get`` ``'nngp'``,
        ``'ntk'`` or a tuple of them; it returns a numpyro distribution (a named tuple of them for a tuple
        ``get``), and raises ValueError for a non-scalar ``t`` or for the training inputs at ``t = inf``.

    Raises:
        TypeError: if ``kernel_fn`` is not callable or ``prior`` is not a distribution.
        ValueError: if the training data have mismatched shapes or non-finite entries, ``diag_reg`` is negative,
            ``learning_rate`` is not positive, or the prior is invalid.
    """
    prior = as_prior(prior)
    ensemble = gradient_descent_mse_ensemble(kernel_fn, x_train, y_train, diag_reg=diag_reg,
                                             diag_reg_absolute_scale=diag_reg_absolute_scale,
                                             learning_rate=learning_rate)

    def predict_fn(t=None, x_test=None, get="nngp"):
        if t is not None and np.ndim(t) != 0:
            raise ValueError("gradient_descent_mse_scale_mixture: t must be a scalar (one distribution per call)")
        names, single = canonical_get(get)
        out = ensemble(t=t, x_test=x_test, get=names, compute_cov=True)
        laws = []
        for name in names:
            g = getattr(out, name)
            if x_test is None and not bool(jnp.any(jnp.diag(g.covariance) > 0)):
                raise ValueError("gradient_descent_mse_scale_mixture: at t=inf the training outputs equal y_train "
                                 "exactly (zero covariance); pass x_test or a finite t")
            laws.append(scale_mixture_predictive(g.mean, g.covariance, prior, joint_outputs=joint_outputs))
        return pack(names, single, laws)

    return predict_fn
