"""Sparse variational Gaussian and Student-t processes: SVGP and SVTP (paper App. C, D; notes 2.3).

Model, for C latent functions sharing one kernel ``k`` and M inducing inputs Z::

    SVGP:  f_c ~ GP(0, k)                          u_c = f_c(Z) = L v_c,   L = chol(K_ZZ + jitter I)
    SVTP:  sigma^2 ~ InvGamma(alpha, beta),  f_c | sigma^2 ~ GP(0, sigma^2 k)   (one sigma^2 for all classes)

Variational family (whitened: q is placed on v = L^{-1} u, whose prior is N(0, I) or N(0, sigma^2 I)):

    SVGP:  q(v_c) = N(m_c, S_c S_c^T)
    SVTP:  q(v_c | sigma^2) = N(m_c, sigma^2 S_c S_c^T),   q(sigma^2) = InvGamma(a, b)

with ``S_c`` lower triangular (``q_diag=True``: diagonal), and f | v the prior conditional.  With
``A = L^{-1} K_ZX`` the marginal of f_c(x_i) given sigma^2 (SVGP: sigma^2 = 1) is Gaussian with::

    mean_ic = A_i^T m_c,    var_ic = sigma^2 v_ic,    v_ic = k(x_i, x_i) - |A_i|^2 + |S_c^T A_i|^2

(the mean is not scaled by sigma^2, as in App. D), so that for the SVTP
``q(f_c(x)) = MVT(2a, A^T m_c, (b/a)(K_XX - A^T A + A^T S_c S_c^T A))``.

ELBO (App. C, D), for a minibatch B of a data set of size N::

    ELBO = (N / |B|) sum_{i in B} E_q[log p(y_i | f_i)] - KL

* SVGP:  ``KL = sum_c 1/2 [tr(S_c S_c^T) + m_c^T m_c - M - log|S_c S_c^T|]``.
* SVTP:  ``KL(q(v, sigma^2) || p(v, sigma^2)) = KL(q(sigma^2) || p(sigma^2)) + E_q(sigma^2)[sum_c KL(q(v_c|sigma^2) ||
  p(v_c|sigma^2))]``.  Given sigma^2, both Gaussians have covariance proportional to sigma^2, which cancels
  in the trace and the log-determinant, leaving ``1/2 [tr(S_c S_c^T) + m_c^T m_c / sigma^2 - M -
  log|S_c S_c^T|]``; its only sigma^2-dependence is through ``E[1/sigma^2] = a / b``.  The inverse-gamma KL equals
  the KL of the gamma laws of the precision 1/sigma^2 (KL is invariant under the bijection):
  ``(a - alpha) psi(a) - lnG(a) + lnG(alpha) + alpha (ln b - ln beta) + a (beta - b) / b``.  Together::

      KL = sum_c 1/2 [tr(S_c S_c^T) + (a/b) m_c^T m_c - M - log|S_c S_c^T|] + KL_IG(a, b; alpha, beta)

  (the notes' formula after whitening, K_ZZ -> I).

Expected log-likelihoods: ``Gaussian`` in closed form, ``E[log N(y | f, s2)] = -1/2 log(2 pi s2) - ((y - mean)^2 +
var) / (2 s2)``; for the SVTP this is linear in sigma^2, so it is exact with ``E[sigma^2] = b / (a - 1)``, which
needs a > 1: with a Gaussian likelihood the SVTP keeps ``a = 1 + softplus(raw)``.  ``Bernoulli`` (probit link,
``p(y=1|f) = Phi(f)``) by Gauss-Hermite quadrature in f (deterministic for the SVGP).  ``Softmax`` by Monte Carlo
with reparameterised draws ``f = mean + sqrt(sigma^2 var) eps``.  For the SVTP (non-Gaussian likelihood) each of
``num_mc`` draws takes one ``sigma^2 = b / g``, ``g ~ Gamma(a, 1)``, shared by the whole minibatch and every class;
``jax.random.gamma`` is differentiable in its shape by implicit reparameterisation, so the gradients in (a, b) are
pathwise.

Predictions draw sigma^2 once per joint sample (a true multivariate t: all test points and classes share it).

API (``model`` is a static, hashable description; ``params`` a pytree of arrays)::

    svgp(kernel, likelihood, inducing_inputs, *, num_latent=None, q_diag=False, ...) -> Model
    svtp(kernel, likelihood, inducing_inputs, *, prior=(alpha, beta)=(2, 2), ...)     -> Model
    init(model, key=None) -> Params
    elbo(model, params, batch, key=None, num_data=None) -> scalar;  kl_divergence(model, params)
    expected_log_likelihood(model, params, x, y, key=None) -> (B,)
    predict_f(model, params, x) -> Normal / StudentT of f(x), batch shape (N, C)
    predict(model, params, x, key=None, num_samples=1000, *, noisy=True) -> numpyro distribution of y
    sample_f(model, params, key, x, num_samples=1) -> (num_samples, N, C) joint latent draws
    scale_posterior(model, params) -> q(sigma^2) (InverseGamma; Delta(1) for the SVGP)
    stratified_inducing(x, y, num_inducing, key) -> (M, ...) training points, classes in proportion
    fit(model, params, x, y, *, key, ...) -> FitResult(params, posterior, history, best_step, best_val_nll)
    as_posterior(model, params, x=None, y=None, *, key=None) -> VariationalPosterior
    VariationalPosterior(model, params, log_marginal_likelihood): predict / predict_f / sample_f

Kernels: a `smnngp.kernels.ParametricKernel` (anything with ``.apply(theta, x1, x2)`` and ``.theta``), whose
unconstrained ``theta`` is trained with the variational parameters; or a fixed kernel accepted by
`smnngp.posterior.as_kernel_callable` (a stax ``kernel_fn``, a stax triple, a plain ``k(x1, x2)``).  For the SVTP
an amplitude in the kernel is redundant with sigma^2 (only their product is identified); fix it
(``train_kernel=False`` or a kernel without one) if that matters.

``Params`` fields: ``inducing`` (Z, (M, ...)), ``q_mean`` (C, M), ``q_scale`` (C, M, M) lower triangular (the
strict upper part is ignored) or (C, M) with ``q_diag``, ``kernel`` (theta, ``None`` for a fixed kernel),
``likelihood`` (``{'noise': raw}`` for the Gaussian, else ``None``), ``scale`` (SVTP: ``{'a': raw, 'b': raw}``, with
``a = a_min + softplus(raw_a)``, ``b = softplus(raw_b)``; SVGP: ``None``).  Gaussian noise is ``softplus(raw)``.

Training (:func:`fit`): Adam (or any optax transformation) on ``-ELBO / N``, one jitted ``lax.scan`` over the steps
between two evaluations, minibatches drawn without replacement per epoch; every ``eval_every`` steps (default one
epoch) the validation NLL (``-mean log p(y | x)`` under :func:`predict` with fixed random numbers) feeds
`optax.contrib.reduce_on_plateau`, whose scale multiplies the updates; training stops after ``num_steps``, when
the scale falls below ``min_lr_scale``, or ``stop_patience`` evaluations after the best one, and the parameters with
the best validation NLL are returned (without validation data: the plateau watches the training loss and the last
parameters are returned).  ``devices`` (default: every local device, when there is more than one) splits each
minibatch over a 1-D mesh with `jax.sharding`, parameters replicated.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
from jax.scipy.special import digamma, gammaln, log_ndtr, ndtr
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from smnngp import _optim, linalg, priors
from smnngp._axes import lead
from smnngp._checks import check_finite
from smnngp.kernels import softplus_inverse
from smnngp.posterior import as_kernel_callable

__all__ = [
    "Softmax",
    "Bernoulli",
    "Gaussian",
    "Model",
    "Params",
    "svgp",
    "svtp",
    "init",
    "elbo",
    "kl_divergence",
    "expected_log_likelihood",
    "predict_f",
    "predict",
    "sample_f",
    "scale_posterior",
    "stratified_inducing",
    "fit",
    "FitResult",
    "as_posterior",
    "VariationalPosterior",
]

_LOG_2PI = math.log(2.0 * math.pi)
_DEFAULT_JITTER = {"float32": 1e-5, "float64": 1e-8}


def _is_tracer(a) -> bool:
    return isinstance(a, jax.core.Tracer)


# --------------------------------------------------------------------------------------------
# Likelihoods: small immutable, hashable descriptions (they are part of the static model)


class _Likelihood:
    __slots__ = ()

    def _fields(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __eq__(self, other):
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self):
        return hash((type(self).__name__,) + self._fields())

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __repr__(self):
        args = ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__)
        return f"{type(self).__name__}({args})"

    def init_params(self, dtype):
        return None


class Softmax(_Likelihood):
    """Categorical likelihood ``p(y = c | f) = softmax(f)_c`` over ``num_classes`` latent functions.

    Targets: integer labels in ``0..num_classes-1``.  The expected log-likelihood is a Monte-Carlo average over
    reparameterised draws of f (``num_mc`` of the model).
    """

    __slots__ = ("num_classes",)

    def __init__(self, num_classes: int):
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"Softmax: num_classes must be an integer >= 2, got {num_classes!r}")
        object.__setattr__(self, "num_classes", int(num_classes))

    @property
    def num_latent(self):
        return self.num_classes

    def log_prob(self, lik_params, y, f):
        """``log softmax(f)[y]`` for f (..., B, C) and labels y (B,)."""
        logp = jax.nn.log_softmax(f, axis=-1)
        idx = jnp.broadcast_to(y[:, None], f.shape[:-1] + (1,))
        return jnp.take_along_axis(logp, idx, axis=-1)[..., 0]

    def check_targets(self, y, n, name="y"):
        return _check_labels(y, n, self.num_classes, name)


class Bernoulli(_Likelihood):
    """Binary likelihood with the probit link, ``p(y = 1 | f) = Phi(f)`` (one latent function).

    Targets: labels in {0, 1}.  The expected log-likelihood is a Gauss-Hermite quadrature with
    ``num_quadrature`` nodes (exact to quadrature error; deterministic for the SVGP), and the SVGP's class
    probability is the closed form ``Phi(mean / sqrt(1 + var))``.
    """

    __slots__ = ("num_quadrature",)

    def __init__(self, num_quadrature: int = 20):
        if isinstance(num_quadrature, bool) or not isinstance(num_quadrature, (int, np.integer)) or num_quadrature < 1:
            raise ValueError(f"Bernoulli: num_quadrature must be a positive integer, got {num_quadrature!r}")
        object.__setattr__(self, "num_quadrature", int(num_quadrature))

    num_latent = 1
    num_classes = 2

    def log_prob(self, lik_params, y, f):
        """``log Phi((2y - 1) f)`` for f (..., B, 1) and labels y (B,)."""
        sign = (2 * y - 1).astype(f.dtype)
        f0 = f[..., 0]
        return log_ndtr(lead(sign, f0.ndim) * f0)  # the labels broadcast over f's leading (sample) axes

    def check_targets(self, y, n, name="y"):
        return _check_labels(y, n, 2, name)


class Gaussian(_Likelihood):
    """Gaussian likelihood ``y | f ~ N(f, noise)`` per output (``num_outputs`` latent functions).

    ``noise`` is the initial variance (positive); it is trained (softplus-parameterised) unless
    ``trainable=False``.  Targets: floats of shape (N,) (one output) or (N, num_outputs).
    """

    __slots__ = ("noise", "trainable", "num_outputs")

    def __init__(self, noise: float = 1.0, *, trainable: bool = True, num_outputs: int = 1):
        try:
            noise = float(noise)
        except (TypeError, ValueError):
            raise ValueError(f"Gaussian: noise must be a positive finite variance, got {noise!r}") from None
        if not (math.isfinite(noise) and noise > 0):
            raise ValueError(f"Gaussian: noise must be a positive finite variance, got {noise!r}")
        if isinstance(num_outputs, bool) or not isinstance(num_outputs, (int, np.integer)) or num_outputs < 1:
            raise ValueError(f"Gaussian: num_outputs must be a positive integer, got {num_outputs!r}")
        object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "trainable", bool(trainable))
        object.__setattr__(self, "num_outputs", int(num_outputs))

    @property
    def num_latent(self):
        return self.num_outputs

    def init_params(self, dtype):
        return {"noise": softplus_inverse(jnp.asarray(self.noise, dtype))}

    @staticmethod
    def variance(lik_params):
        return jax.nn.softplus(lik_params["noise"])

    def expected_log_prob(self, lik_params, y, mean, var):
        """``sum_c E[log N(y_c | f_c, noise)]`` for ``f_c ~ N(mean_c, var_c)``, in closed form; shape (B,)."""
        s2 = self.variance(lik_params)
        return jnp.sum(-0.5 * (_LOG_2PI + jnp.log(s2)) - 0.5 * ((y - mean) ** 2 + var) / s2, axis=-1)

    def check_targets(self, y, n, name="y"):
        y = jnp.asarray(y)
        if not jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(jnp.result_type(float))
        if y.ndim == 1 and self.num_outputs == 1:
            y = y[:, None]
        if y.ndim != 2 or y.shape[1] != self.num_outputs:
            raise ValueError(f"{name} must have shape (N,) or (N, {self.num_outputs}) for a Gaussian likelihood with "
                             f"{self.num_outputs} output(s), got {y.shape}")
        if n is not None and y.shape[0] != n:
            raise ValueError(f"{name} has {y.shape[0]} rows but the inputs have {n}")
        check_finite(y, name)
        return y


def _check_labels(y, n, num_classes, name):
    y = jnp.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of integer labels, got shape {y.shape}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} labels but the inputs have {n} rows")
    if _is_tracer(y):
        return y.astype(jnp.int32)
    yn = np.asarray(y)
    if yn.dtype == bool:
        yn = yn.astype(np.int32)
    if not np.issubdtype(yn.dtype, np.integer):
        if not (np.isfinite(yn).all() and np.all(yn == np.round(yn))):
            raise ValueError(f"{name} must hold integer class labels, got non-integer values")
    if yn.size and (yn.min() < 0 or yn.max() > num_classes - 1):
        raise ValueError(f"{name} has labels outside 0..{num_classes - 1}: found {yn.min()}..{yn.max()}")
    return jnp.asarray(yn.astype(np.int32))


# --------------------------------------------------------------------------------------------
# The static model description and the parameter pytree


class _Frozen:
    """Arrays held by the static model description (initial values): compared and hashed by identity."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return "<initial values>"


class _FixedKernel:
    """``apply(theta, x1, x2) = k(x1, x2)`` for a kernel without trainable hyperparameters."""

    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k

    def __call__(self, theta, x1, x2=None):
        return self.k(x1, x2)

    def __eq__(self, other):
        return type(other) is _FixedKernel and other.k is self.k

    def __hash__(self):
        return hash(id(self.k))


class Model(NamedTuple):
    """Static description of an SVGP / SVTP (hashable: pass it as a static argument); build with :func:`svgp`
    or :func:`svtp`.

    ``kernel`` is ``apply(theta, x1, x2)``; ``prior`` is ``(alpha, beta)`` of the SVTP's inverse gamma (``None``
    for the SVGP); ``a_min`` the lower bound of q(sigma^2)'s shape (1 with a Gaussian likelihood, else 0);
    ``num_mc`` the Monte-Carlo draws per ELBO evaluation; ``jitter`` the relative jitter on K_ZZ; ``initial`` the
    initial inducing inputs and kernel theta (held by identity).

    Attributes:
        kind: ``'svgp'`` or ``'svtp'``.
        kernel: the kernel as ``apply(theta, x1, x2)`` (a fixed kernel ignores ``theta``).
        likelihood: the likelihood, ``Softmax``, ``Bernoulli`` or ``Gaussian``.
        num_latent: number C of latent functions (fixed by the likelihood).
        num_inducing: number M of inducing inputs.
        point_shape: per-point shape of the inputs (that of the inducing inputs without their first axis).
        dtype: name of the floating dtype of the model (that of the inducing inputs), e.g. ``'float64'``.
        q_diag: whether the factors ``S_c`` are diagonal.
        q_scale_init: initial ``S_c = q_scale_init I``.
        train_inducing: whether :func:`fit` trains the inducing inputs Z.
        train_kernel: whether :func:`fit` trains the kernel's ``theta`` (false for a fixed kernel).
        jitter: relative jitter on K_ZZ (``jitter * mean(diag K_ZZ)`` is added to its diagonal).
        num_mc: Monte-Carlo draws per ELBO evaluation.
        prior: ``(alpha, beta)`` of the SVTP's inverse gamma prior on sigma^2, ``None`` for the SVGP.
        a_min: lower bound of the shape ``a`` of q(sigma^2).
        initial: the initial inducing inputs and kernel ``theta``, wrapped so that they compare by identity.
    """

    kind: str
    kernel: Callable
    likelihood: _Likelihood
    num_latent: int
    num_inducing: int
    point_shape: tuple
    dtype: str
    q_diag: bool
    q_scale_init: float
    train_inducing: bool
    train_kernel: bool
    jitter: float
    num_mc: int
    prior: tuple | None
    a_min: float
    initial: _Frozen


class Params(NamedTuple):
    """Variational, kernel and likelihood parameters (a pytree; see the module docstring for the fields).

    Attributes:
        inducing: inducing inputs Z, (M, ...).
        q_mean: whitened variational means ``m_c``, (C, M).
        q_scale: factors ``S_c``, (C, M, M) lower triangular (the strict upper part is ignored), or (C, M) with
            ``q_diag``.
        kernel: the kernel's unconstrained ``theta``, ``None`` for a fixed kernel.
        likelihood: ``{'noise': raw}`` for the Gaussian likelihood (noise ``softplus(raw)``), else ``None``.
        scale: SVTP: ``{'a': raw, 'b': raw}`` of q(sigma^2) (``a = a_min + softplus(raw)``, ``b = softplus(raw)``);
            SVGP: ``None``.
    """

    inducing: Any
    q_mean: Any
    q_scale: Any
    kernel: Any
    likelihood: Any
    scale: Any


def _as_parametric(kernel):
    """``(apply, theta0, trainable)`` for a ParametricKernel duck type or a fixed kernel callable."""
    if hasattr(kernel, "apply") and hasattr(kernel, "theta") and callable(kernel.apply):
        return kernel.apply, kernel.theta, True
    k = as_kernel_callable(kernel)
    return _FixedKernel(k), None, False


def _positive_int(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _build(kind, kernel, likelihood, inducing_inputs, *, num_latent, q_diag, q_scale_init, train_inducing,
           train_kernel, jitter, num_mc, prior):
    if not isinstance(likelihood, _Likelihood):
        raise TypeError(f"likelihood must be Softmax(C), Bernoulli() or Gaussian(noise), got {likelihood!r}")
    Z = jnp.asarray(inducing_inputs)
    if not jnp.issubdtype(Z.dtype, jnp.floating):
        Z = Z.astype(jnp.result_type(float))
    if Z.ndim < 2 or Z.shape[0] < 1:
        raise ValueError(f"inducing_inputs must have shape (M, features...) with M >= 1, got {Z.shape}")
    check_finite(Z, "inducing_inputs")
    M = Z.shape[0]
    C = likelihood.num_latent
    if num_latent is not None and _positive_int(num_latent, "num_latent") != C:
        raise ValueError(f"num_latent={num_latent} does not match the likelihood {likelihood!r}, which has {C} latent "
                         "function(s)")
    dtype = str(Z.dtype)
    if jitter is None:
        jitter = _DEFAULT_JITTER.get(dtype, 1e-8)
    jitter = float(jitter)
    if not (math.isfinite(jitter) and jitter >= 0):
        raise ValueError(f"jitter must be a non-negative finite relative jitter, got {jitter!r}")
    q_scale_init = float(q_scale_init)
    if not (math.isfinite(q_scale_init) and q_scale_init > 0):
        raise ValueError(f"q_scale_init must be positive and finite, got {q_scale_init!r}")
    num_mc = _positive_int(num_mc, "num_mc")
    apply, theta0, trainable = _as_parametric(kernel)
    # shape check of the kernel, eagerly, on the inducing inputs
    try:
        kzz = apply(theta0, Z, Z)
        kz1 = apply(theta0, Z[:1], Z)
    except Exception as e:  # noqa: BLE001 - re-raised with the argument named
        raise ValueError(f"kernel could not be evaluated on inducing_inputs of shape {Z.shape}: {e}") from e
    try:
        jax.eval_shape(lambda th, a: apply(th, a[:1], a), theta0, Z)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
            jax.errors.TracerIntegerConversionError) as e:
        raise ValueError("kernel must be traceable by JAX (written with jax.numpy, no numpy conversions or "
                         f"value-dependent Python): training runs it under jit and grad ({type(e).__name__})") from e
    kzz_shape = getattr(kzz, "shape", None)
    kz1_shape = getattr(kz1, "shape", None)
    if kzz_shape != (M, M) or kz1_shape != (1, M):
        raise ValueError(f"kernel must return an (N1, N2) matrix: for inputs of {M} and {M} points it returned shape "
                         f"{kzz_shape}, for 1 and {M} points {kz1_shape}")
    if not np.isfinite(np.asarray(kzz)).all():
        raise ValueError("kernel returned NaN or infinite values on inducing_inputs")
    a_min = 0.0
    if kind == "svtp":
        if prior is None:
            prior = (2.0, 2.0)
        elif isinstance(prior, dist.Distribution):
            if not priors.is_inverse_gamma(prior):
                raise ValueError(f"prior must be an inverse gamma (alpha, beta) for the SVTP, got {prior!r}")
            prior = tuple(float(v) for v in priors.inverse_gamma_params(prior))
        try:
            alpha, beta = (float(v) for v in prior)
        except (TypeError, ValueError):
            raise ValueError(f"prior must be (alpha, beta) or smnngp.priors.InverseGamma(alpha, beta), got {prior!r}") \
                from None
        if not (math.isfinite(alpha) and alpha > 0 and math.isfinite(beta) and beta > 0):
            raise ValueError(f"prior (alpha, beta) must be positive and finite, got {prior!r}")
        prior = (alpha, beta)
        if isinstance(likelihood, Gaussian):
            a_min = 1.0
    return Model(kind=kind, kernel=apply, likelihood=likelihood, num_latent=C, num_inducing=M,
                 point_shape=tuple(Z.shape[1:]), dtype=dtype, q_diag=bool(q_diag), q_scale_init=q_scale_init,
                 train_inducing=bool(train_inducing), train_kernel=bool(train_kernel) and trainable, jitter=jitter,
                 num_mc=num_mc, prior=prior, a_min=a_min, initial=_Frozen((Z, theta0)))


def svgp(kernel, likelihood, inducing_inputs, *, num_latent=None, q_diag=False, q_scale_init=1.0,
         train_inducing=True, train_kernel=True, jitter=None, num_mc=16) -> Model:
    """Whitened SVGP (App. C) with C latent functions sharing ``kernel``.

    Args:
      kernel: a `smnngp.kernels.ParametricKernel` (its ``theta`` trained unless ``train_kernel=False``) or a fixed
        kernel (stax ``kernel_fn``, stax triple, plain ``k(x1, x2)``).
      likelihood: ``Softmax(C)``, ``Bernoulli()`` or ``Gaussian(noise)``; it fixes C.
      inducing_inputs: (M, ...) initial Z (e.g. from :func:`stratified_inducing`); their dtype is the model's.
      num_latent: optional check of C.
      q_diag: diagonal S_c instead of a full lower-triangular factor.
      q_scale_init: initial ``S_c = q_scale_init I`` (1 = the prior).
      train_inducing: whether :func:`fit` trains Z.
      train_kernel: whether :func:`fit` trains the kernel's theta.
      jitter: relative jitter on K_ZZ (``jitter * mean(diag K_ZZ)``; default 1e-5 in float32, 1e-8 in float64).
      num_mc: Monte-Carlo draws per ELBO evaluation (Softmax; sigma^2 draws of the SVTP).

    Returns:
      The :class:`Model` (static and hashable); create its parameters with :func:`init`.

    Raises:
      TypeError: if ``likelihood`` is not ``Softmax``, ``Bernoulli`` or ``Gaussian``.
      ValueError: if ``inducing_inputs`` is empty or not finite, ``num_latent`` does not match the likelihood,
        ``jitter``, ``q_scale_init`` or ``num_mc`` is out of range, or ``kernel`` cannot be evaluated (or traced)
        on the inducing inputs or does not return an (N1, N2) matrix of finite values.
    """
    return _build("svgp", kernel, likelihood, inducing_inputs, num_latent=num_latent, q_diag=q_diag,
                  q_scale_init=q_scale_init, train_inducing=train_inducing, train_kernel=train_kernel, jitter=jitter,
                  num_mc=num_mc, prior=None)


def svtp(kernel, likelihood, inducing_inputs, *, prior=None, num_latent=None, q_diag=False, q_scale_init=1.0,
         train_inducing=True, train_kernel=True, jitter=None, num_mc=16) -> Model:
    """Whitened SVTP (App. D): sigma^2 ~ InvGamma(alpha, beta) shared by all classes, q(sigma^2) = InvGamma(a, b).

    ``prior``: ``(alpha, beta)`` or ``smnngp.priors.InverseGamma(alpha, beta)`` (default (2, 2), the authors'
    default); q(sigma^2) starts at the prior (with a Gaussian likelihood at ``a = max(alpha, 2)``, as a > 1 is
    needed there).  Other arguments as :func:`svgp`.

    Args:
      kernel: a `smnngp.kernels.ParametricKernel` or a fixed kernel, as for :func:`svgp`. An amplitude in a trained
        kernel is redundant with sigma^2.
      likelihood: ``Softmax(C)``, ``Bernoulli()`` or ``Gaussian(noise)``.
      inducing_inputs: (M, ...) initial inducing inputs Z.
      prior: the inverse gamma prior on sigma^2, ``(alpha, beta)`` or ``smnngp.priors.InverseGamma(alpha, beta)``;
        ``None`` means (2, 2).
      num_latent: optional check of C.
      q_diag: diagonal S_c instead of a full lower-triangular factor.
      q_scale_init: initial ``S_c = q_scale_init I``.
      train_inducing: whether :func:`fit` trains Z.
      train_kernel: whether :func:`fit` trains the kernel's theta.
      jitter: relative jitter on K_ZZ (default 1e-5 in float32, 1e-8 in float64).
      num_mc: sigma^2 (and, for Softmax, f) draws per ELBO evaluation with a non-Gaussian likelihood.

    Returns:
      The :class:`Model` of kind ``'svtp'``; create its parameters with :func:`init`.

    Raises:
      TypeError: if ``likelihood`` is not ``Softmax``, ``Bernoulli`` or ``Gaussian``.
      ValueError: for the cases of :func:`svgp`, or a ``prior`` that is not an inverse gamma or a pair of positive
        finite numbers.
    """
    return _build("svtp", kernel, likelihood, inducing_inputs, num_latent=num_latent, q_diag=q_diag,
                  q_scale_init=q_scale_init, train_inducing=train_inducing, train_kernel=train_kernel, jitter=jitter,
                  num_mc=num_mc, prior=prior)


def init(model: Model, key=None) -> Params:
    """Initial parameters: Z and theta as given to the model, ``m_c = 0``, ``S_c = q_scale_init I``, q(sigma^2) at
    the prior.  The initial state is deterministic; ``key`` is accepted for a uniform interface and unused.

    Args:
        model: the :class:`Model` from :func:`svgp` or :func:`svtp`.
        key: ignored.

    Returns:
        :class:`Params` in the model's dtype. For the SVTP with a Gaussian likelihood q(sigma^2) starts at
        ``a = max(alpha, 2)``, ``b = beta``.
    """
    del key
    Z, theta0 = model.initial.value
    dt = jnp.dtype(model.dtype)
    C, M = model.num_latent, model.num_inducing
    q_mean = jnp.zeros((C, M), dt)
    if model.q_diag:
        q_scale = jnp.full((C, M), model.q_scale_init, dt)
    else:
        q_scale = jnp.broadcast_to(model.q_scale_init * jnp.eye(M, dtype=dt), (C, M, M))
    scale = None
    if model.kind == "svtp":
        alpha, beta = model.prior
        a0 = max(alpha, 2.0) if model.a_min > 0 else alpha
        scale = {"a": softplus_inverse(jnp.asarray(a0 - model.a_min, dt)), "b": softplus_inverse(jnp.asarray(beta, dt))}
    return _strong(Params(inducing=Z, q_mean=q_mean, q_scale=q_scale, kernel=theta0,
                          likelihood=model.likelihood.init_params(dt), scale=scale))


def _strong(tree):
    """Copies of the leaves with strong (not weak) dtypes, so that jitted steps see one signature throughout."""
    return jax.tree_util.tree_map(lambda a: jnp.array(a, dtype=jnp.asarray(a).dtype), tree)


# --------------------------------------------------------------------------------------------
# Pure pieces (traceable)


def _scale_ab(model, params):
    a = model.a_min + jax.nn.softplus(params.scale["a"])
    b = jax.nn.softplus(params.scale["b"])
    return a, b


def scale_posterior(model: Model, params: Params):
    """q(sigma^2): ``InverseGamma(a, b)`` for the SVTP, the point mass ``Delta(1)`` for the SVGP.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.

    Returns:
        numpyro distribution of sigma^2 under the variational posterior.
    """
    if model.kind == "svgp":
        return dist.Delta(jnp.asarray(1.0, model.dtype))
    a, b = _scale_ab(model, params)
    return dist.InverseGamma(a, b)


def _kmat(model, theta, x1, x2):
    return jnp.asarray(model.kernel(theta, x1, x2)).astype(model.dtype)


def _kdiag(model, theta, x):
    one = lambda xi: model.kernel(theta, xi[None], xi[None])[0, 0]  # noqa: E731
    return jax.vmap(one)(x).astype(model.dtype)


def _q_factor(model, params):
    """S_c as (C, M, M) lower triangular (``q_diag``: (C, M) diagonal)."""
    return params.q_scale if model.q_diag else jnp.tril(params.q_scale)


def _projection(model, params, x):
    """``A = L^{-1} K_ZX`` (M, B) and ``diag K_XX`` (B,)."""
    Z, theta = params.inducing, params.kernel
    Kzz = _kmat(model, theta, Z, Z)
    Kzz = Kzz + (model.jitter * jnp.mean(jnp.diag(Kzz))) * jnp.eye(Kzz.shape[0], dtype=Kzz.dtype)
    A = linalg.whiten(Kzz, _kmat(model, theta, Z, x))
    return A, _kdiag(model, theta, x)


def _st_a(model, params, A):
    """``S_c^T A`` for every class, (C, M, B)."""
    S = _q_factor(model, params)
    if model.q_diag:
        return S[:, :, None] * A[None]
    return jnp.einsum("cmk,mb->ckb", S, A)


def _marginals(model, params, x):
    """Mean (B, C) and variance at sigma^2 = 1 (B, C) of q(f(x_i)) (module docstring)."""
    A, kxx = _projection(model, params, x)
    mean = (params.q_mean @ A).T
    cond = jnp.clip(kxx - jnp.sum(A * A, axis=0), 0.0, None)
    var = cond[:, None] + jnp.sum(_st_a(model, params, A) ** 2, axis=1).T
    return mean, var


def kl_divergence(model: Model, params: Params):
    """KL(q || p) of the whitened inducing variables (and of sigma^2 for the SVTP); module docstring.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.

    Returns:
        Scalar KL divergence, summed over the C latent functions (traceable and differentiable).
    """
    S = _q_factor(model, params)
    diag = S if model.q_diag else jnp.diagonal(S, axis1=-2, axis2=-1)
    C, M = params.q_mean.shape
    gauss = 0.5 * (jnp.sum(S * S) - C * M - 2.0 * jnp.sum(jnp.log(jnp.abs(diag))))
    mm = jnp.sum(params.q_mean**2)
    if model.kind == "svgp":
        return gauss + 0.5 * mm
    a, b = _scale_ab(model, params)
    alpha, beta = model.prior
    kl_ig = ((a - alpha) * digamma(a) - gammaln(a) + gammaln(alpha) + alpha * (jnp.log(b) - math.log(beta))
             + a * (beta - b) / b)
    return gauss + 0.5 * (a / b) * mm + kl_ig


def _draw_scale(model, params, key, shape):
    """sigma^2 ~ InvGamma(a, b) as ``b / g``, ``g ~ Gamma(a, 1)`` (implicitly reparameterised in a)."""
    a, b = _scale_ab(model, params)
    g = jax.random.gamma(key, a, shape, dtype=jnp.dtype(model.dtype))
    return b / jnp.maximum(g, jnp.finfo(model.dtype).tiny)


def _ell(model, params, x, y, key):
    """Per-point expected log-likelihood ``E_q[log p(y_i | f_i)]`` (B,), with validated/converted y."""
    mean, var = _marginals(model, params, x)
    lik = model.likelihood
    if isinstance(lik, Gaussian):
        if model.kind == "svtp":
            a, b = _scale_ab(model, params)
            var = var * (b / (a - 1.0))
        return lik.expected_log_prob(params.likelihood, y, mean, var)
    if isinstance(lik, Bernoulli):
        if model.kind == "svgp":
            s = jnp.ones((1,), mean.dtype)
        else:
            s = _draw_scale(model, params, _need_key(key), (model.num_mc,))
        nodes, weights = np.polynomial.hermite.hermgauss(lik.num_quadrature)
        nodes = jnp.asarray(nodes * math.sqrt(2.0), mean.dtype)
        weights = jnp.asarray(weights / math.sqrt(math.pi), mean.dtype)
        std = jnp.sqrt(s[:, None, None] * var[None])  # (T, B, 1)
        f = mean[None, None] + nodes[:, None, None, None] * std[None]  # (K, T, B, 1)
        return jnp.einsum("k,ktb->b", weights, lik.log_prob(None, y, f)) / s.shape[0]
    key = _need_key(key)
    k_s, k_e = jax.random.split(key)
    T = model.num_mc
    if model.kind == "svgp":
        s = jnp.ones((T,), mean.dtype)
    else:
        s = _draw_scale(model, params, k_s, (T,))
    eps = jax.random.normal(k_e, (T,) + mean.shape, mean.dtype)
    f = mean[None] + jnp.sqrt(s[:, None, None] * var[None]) * eps
    return jnp.mean(lik.log_prob(None, y, f), axis=0)


def _need_key(key):
    if key is None:
        raise ValueError("key is required: this expectation is estimated by Monte Carlo")
    return key


def _check_x(model, x, name="x"):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(model.dtype)
    if x.ndim < 1 or tuple(x.shape[1:]) != model.point_shape:
        raise ValueError(f"{name} must have shape (N, {', '.join(map(str, model.point_shape))}) like the inducing "
                         f"inputs, got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    check_finite(x, name)
    return x.astype(model.dtype)


def expected_log_likelihood(model: Model, params: Params, x, y, key=None):
    """``E_q[log p(y_i | f_i)]`` for each point, shape (B,) (Monte Carlo for Softmax / SVTP: pass ``key``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (B, ...) with the per-point shape of the inducing inputs.
        y: targets: labels (B,) for ``Softmax`` / ``Bernoulli``, (B,) or (B, C) floats for ``Gaussian``.
        key: JAX PRNG key, required for ``Softmax`` and for the SVTP with ``Bernoulli``; unused otherwise.

    Returns:
        Array of shape (B,): the expected log-likelihood of each point, summed over outputs.

    Raises:
        ValueError: if ``x`` or ``y`` has the wrong shape, invalid values, or ``key`` is needed and missing.
    """
    x = _check_x(model, x)
    y = model.likelihood.check_targets(y, x.shape[0])
    return _ell(model, params, x, y, key)


def elbo(model: Model, params: Params, batch, key=None, num_data=None):
    """``(N / B) sum_{i in batch} E_q[log p(y_i | f_i)] - KL`` for ``batch = (x, y)`` (B points), ``N = num_data``
    (default B: the batch is the data set).  Unbiased for the full-data ELBO when the batch is drawn uniformly.
    Deterministic for the Gaussian likelihood and the Bernoulli SVGP; otherwise a Monte-Carlo estimate (``key``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        batch: tuple ``(x, y)`` of B inputs and targets.
        key: JAX PRNG key for the Monte-Carlo cases (see :func:`expected_log_likelihood`).
        num_data: size N of the whole data set (positive); ``None`` means B.

    Returns:
        Scalar ELBO estimate (traceable and differentiable in ``params``).

    Raises:
        ValueError: if the batch is invalid, ``num_data`` is not positive, or ``key`` is needed and missing.
    """
    x, y = batch
    x = _check_x(model, x, "batch x")
    y = model.likelihood.check_targets(y, x.shape[0], "batch y")
    B = x.shape[0]
    n = B if num_data is None else num_data
    if not _is_tracer(n) and not (isinstance(n, (int, float, np.integer, np.floating)) and n > 0):
        raise ValueError(f"num_data must be a positive number of training points, got {num_data!r}")
    return (n / B) * jnp.sum(_ell(model, params, x, y, key)) - kl_divergence(model, params)


# --------------------------------------------------------------------------------------------
# Prediction


def predict_f(model: Model, params: Params, x):
    """Marginal q(f(x)) per point and latent function, batch shape (N, C): ``Normal`` (SVGP) or
    ``StudentT(2a, mean, sqrt((b/a) v))`` (SVTP).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (N, ...) with the per-point shape of the inducing inputs.

    Returns:
        numpyro ``Normal`` (SVGP) or ``StudentT`` (SVTP) with batch shape (N, C).

    Raises:
        ValueError: if ``x`` has the wrong shape, is empty or is not finite.
    """
    x = _check_x(model, x)
    mean, var = _marginals_jit(model, params, x)
    if model.kind == "svgp":
        return dist.Normal(mean, jnp.sqrt(var))
    a, b = _scale_ab(model, params)
    return dist.StudentT(2.0 * a, mean, jnp.sqrt((b / a) * var))


_marginals_jit = jax.jit(_marginals, static_argnums=0)


def _mc_average(one, key, num_samples, out_shape, dtype):
    """``(1/S) sum_s one(key_s)`` in blocks of vectorised draws (O(block * out) memory)."""
    size = int(np.prod(out_shape)) or 1
    block = max(1, min(num_samples, (1 << 22) // size))
    nb = -(-num_samples // block)
    keys = jax.random.split(key, nb * block)
    keys = keys.reshape((nb, block) + keys.shape[1:])
    w = (jnp.arange(nb * block) < num_samples).astype(dtype).reshape(nb, block) / num_samples

    def body(acc, inp):
        k, wk = inp
        return acc + jnp.tensordot(wk, jax.vmap(one)(k), axes=1), None

    acc, _ = jax.lax.scan(body, jnp.zeros(out_shape, dtype), (keys, w))
    return acc


def _class_probs(model, params, x, key, num_samples):
    """Predictive class probabilities (N, K), MC-averaged over joint draws (sigma^2 once per draw)."""
    mean, var = _marginals(model, params, x)
    lik = model.likelihood
    if isinstance(lik, Bernoulli):
        if model.kind == "svgp":
            p1 = ndtr(mean[:, 0] / jnp.sqrt(1.0 + var[:, 0]))
        else:
            def one(k):
                s = _draw_scale(model, params, k, ())
                return ndtr(mean[:, 0] / jnp.sqrt(1.0 + s * var[:, 0]))

            p1 = _mc_average(one, key, num_samples, mean.shape[:1], mean.dtype)
        return jnp.stack([1.0 - p1, p1], axis=-1)

    def one(k):
        k_s, k_e = jax.random.split(k)
        s = 1.0 if model.kind == "svgp" else _draw_scale(model, params, k_s, ())
        f = mean + jnp.sqrt(s * var) * jax.random.normal(k_e, mean.shape, mean.dtype)
        return jax.nn.softmax(f, axis=-1)

    return _mc_average(one, key, num_samples, mean.shape, mean.dtype)


def _gaussian_predictive(model, params, x, key, num_samples, noisy):
    mean, var = _marginals(model, params, x)
    noise = model.likelihood.variance(params.likelihood) if noisy else 0.0
    if model.kind == "svgp":
        return dist.Normal(mean, jnp.sqrt(var + noise))
    a, b = _scale_ab(model, params)
    if not noisy:
        return dist.StudentT(2.0 * a, mean, jnp.sqrt((b / a) * var))
    # y = f + e with f a t and e Gaussian is not a t: a mixture over draws of sigma^2 (equal weights)
    s = _draw_scale(model, params, key, (num_samples,))
    comp = dist.Normal(mean[..., None], jnp.sqrt(s * var[..., None] + noise))
    mix = dist.Categorical(logits=jnp.zeros((num_samples,), mean.dtype))
    return dist.MixtureSameFamily(mix, comp)


_class_probs_jit = jax.jit(_class_probs, static_argnums=(0, 4))
_gaussian_predictive_jit = jax.jit(_gaussian_predictive, static_argnums=(0, 4, 5))


def _predict(model, params, x, key, num_samples, noisy):
    # predict and the validation NLL of fit share these two compiled functions
    if isinstance(model.likelihood, Gaussian):
        return _gaussian_predictive_jit(model, params, x, key, num_samples, noisy)
    return dist.Categorical(probs=_class_probs_jit(model, params, x, key, num_samples))


def predict(model: Model, params: Params, x, key=None, num_samples: int = 1000, *, noisy: bool = True):
    """Predictive distribution of y at each point of ``x``.

    * Softmax / Bernoulli: ``Categorical(probs)``, batch shape (N,), with ``probs`` (N, C) the average over
      ``num_samples`` joint draws of f (sigma^2 drawn once per draw) of the class probabilities (the Bernoulli
      SVGP is exact: ``Phi(mean / sqrt(1 + var))``; the Bernoulli SVTP averages that closed form over sigma^2).
    * Gaussian: batch shape (N, C); SVGP ``Normal``; SVTP ``StudentT`` for ``noisy=False`` (the latent f), else
      the equal-weight ``MixtureSameFamily`` of ``N(mean, sigma_s^2 v + noise)`` over ``num_samples`` draws of
      sigma^2 (a t plus Gaussian noise is not a t).
    ``noisy=False`` gives the latent f (Gaussian likelihood only).  ``key`` defaults to ``PRNGKey(0)``.

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: inputs, (N, ...).
        key: JAX PRNG key for the Monte-Carlo draws (``None``: ``PRNGKey(0)``).
        num_samples: number of draws of f or sigma^2 (a positive int).
        noisy: include the observation noise (Gaussian likelihood; ignored otherwise).

    Returns:
        numpyro distribution of y: ``Categorical``, ``Normal``, ``StudentT`` or ``MixtureSameFamily``, as above.

    Raises:
        ValueError: if ``x`` is invalid or ``num_samples`` is not a positive integer.
    """
    x = _check_x(model, x)
    num_samples = _positive_int(num_samples, "num_samples")
    if key is None:
        key = jax.random.PRNGKey(0)
    return _predict(model, params, x, key, num_samples, bool(noisy))


def _full_latent(model, params, x):
    """Mean (N, C) and covariance at sigma^2 = 1 (C, N, N) of q(f(x))."""
    A, _ = _projection(model, params, x)
    kxx = _kmat(model, params.kernel, x, x)
    SA = _st_a(model, params, A)
    mean = (params.q_mean @ A).T
    cov = kxx[None] - (A.T @ A)[None] + jnp.einsum("ckb,ckd->cbd", SA, SA)
    return mean, 0.5 * (cov + jnp.swapaxes(cov, -1, -2))


_full_latent_jit = jax.jit(_full_latent, static_argnums=0)


def sample_f(model: Model, params: Params, key, x, num_samples: int = 1):
    """Joint draws of the latent functions at ``x`` from q, shape (num_samples, N, C).

    For the SVTP each draw takes one sigma^2 ~ q(sigma^2), shared by all points and classes (multivariate t).
    The (N, N) covariance per class is factorised with `smnngp.linalg.cholesky` (jitter escalation, eager).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        key: JAX PRNG key.
        x: inputs, (N, ...).
        num_samples: number of joint draws (a positive int).

    Returns:
        Array of shape (num_samples, N, C) of latent function values.

    Raises:
        ValueError: if ``x`` is invalid or ``num_samples`` is not a positive integer.
        NotPositiveDefiniteError: if a class covariance cannot be factorised even with jitter.
    """
    x = _check_x(model, x)
    num_samples = _positive_int(num_samples, "num_samples")
    mean, cov = _full_latent_jit(model, params, x)
    chols = jnp.stack([linalg.cholesky(c, name=f"variational covariance of class {i}").L for i, c in enumerate(cov)])
    k_s, k_z = jax.random.split(key)
    z = jax.random.normal(k_z, (num_samples,) + mean.shape, mean.dtype)
    draws = mean[None] + jnp.einsum("cij,sjc->sic", chols, z)
    if model.kind == "svtp":
        s = _draw_scale(model, params, k_s, (num_samples,))
        draws = mean[None] + jnp.sqrt(s)[:, None, None] * (draws - mean[None])
    return draws


# --------------------------------------------------------------------------------------------
# Inducing-point initialisation


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


# --------------------------------------------------------------------------------------------
# The posterior object


@jax.tree_util.register_pytree_node_class
class VariationalPosterior:
    """An SVGP / SVTP posterior with the project's posterior interface; an immutable pytree (``model`` static).

    ``log_marginal_likelihood`` is the ELBO on the training data (a lower bound on ``log p(y)``; a Monte-Carlo
    estimate for Softmax and the non-Gaussian SVTP), NaN when the posterior was made without data.

    Args:
        model: the :class:`Model` (static pytree data).
        params: its :class:`Params`.
        log_marginal_likelihood: the full-data ELBO, or NaN (default).
    """

    __slots__ = ("model", "params", "log_marginal_likelihood")

    def __init__(self, model: Model, params: Params, log_marginal_likelihood=math.nan):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "log_marginal_likelihood", log_marginal_likelihood)

    def __setattr__(self, name, value):
        raise AttributeError("VariationalPosterior is immutable (use replace)")

    def tree_flatten(self):
        return (self.params, self.log_marginal_likelihood), (self.model,)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux[0], *children)

    def replace(self, **changes) -> VariationalPosterior:
        fields = {s: getattr(self, s) for s in self.__slots__}
        fields.update(changes)
        return VariationalPosterior(**fields)

    def __repr__(self):
        return (f"VariationalPosterior({self.model.kind}, {self.model.likelihood!r}, M={self.model.num_inducing}, "
                f"C={self.model.num_latent}, log_marginal_likelihood={self.log_marginal_likelihood})")

    @property
    def scale_posterior(self):
        return scale_posterior(self.model, self.params)

    def predict(self, x, *, key=None, num_samples: int = 1000, noisy: bool = True):
        """See :func:`predict`."""
        return predict(self.model, self.params, x, key, num_samples, noisy=noisy)

    def predict_f(self, x):
        """See :func:`predict_f`."""
        return predict_f(self.model, self.params, x)

    def sample_f(self, key, x, num_samples: int = 1):
        """See :func:`sample_f`."""
        return sample_f(self.model, self.params, key, x, num_samples)


def _ell_sum_masked(model, params, x, y, key, mask):
    return jnp.sum(mask * _ell(model, params, x, y, key))


_ell_sum_jit = jax.jit(_ell_sum_masked, static_argnums=0)
_kl_jit = jax.jit(kl_divergence, static_argnums=0)


def _full_elbo(model, params, x, y, key, chunk):
    """ELBO on the whole data set, evaluated in chunks of ``chunk`` points (the last one padded and masked)."""
    N = x.shape[0]
    chunk = min(chunk, N)
    total = 0.0
    for j, start in enumerate(range(0, N, chunk)):
        idx = np.arange(start, start + chunk)
        mask = (idx < N).astype(model.dtype)
        idx = np.where(idx < N, idx, 0)
        k = None if key is None else jax.random.fold_in(key, j)
        total = total + _ell_sum_jit(model, params, x[idx], y[idx], k, jnp.asarray(mask))
    return total - _kl_jit(model, params)


def as_posterior(model: Model, params: Params, x=None, y=None, *, key=None, chunk: int = 1024) -> VariationalPosterior:
    """A :class:`VariationalPosterior`; with training data ``(x, y)`` its ``log_marginal_likelihood`` is the
    full-data ELBO (Monte-Carlo for Softmax / SVTP classification: ``key`` defaults to ``PRNGKey(0)``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: training inputs (N, ...), or ``None``.
        y: training targets, or ``None`` (pass both or neither).
        key: JAX PRNG key for the Monte-Carlo ELBO (``None``: ``PRNGKey(0)``).
        chunk: number of points per evaluation of the full-data ELBO (a positive int; bounds memory).

    Returns:
        :class:`VariationalPosterior` of ``(model, params)``, with ``log_marginal_likelihood`` the full-data ELBO
        when data are given, else NaN.

    Raises:
        ValueError: if only one of ``x`` and ``y`` is given, the data are invalid, or ``chunk`` is not a positive
            integer.
    """
    if x is None and y is None:
        return VariationalPosterior(model, params)
    if x is None or y is None:
        raise ValueError("pass both x and y (or neither)")
    x = _check_x(model, x)
    y = model.likelihood.check_targets(y, x.shape[0])
    if key is None:
        key = jax.random.PRNGKey(0)
    return VariationalPosterior(model, params, _full_elbo(model, params, x, y, key, _positive_int(chunk, "chunk")))


# --------------------------------------------------------------------------------------------
# Training


class FitResult(NamedTuple):
    """What :func:`fit` returns: the kept ``params`` (best validation NLL, else the last), the matching
    ``posterior`` (its ``log_marginal_likelihood`` the full-data ELBO), ``history`` (one dict per evaluation:
    ``step``, ``loss`` = mean of ``-ELBO / N`` over the steps since the last evaluation, ``val_nll``, ``lr_scale``,
    ``time``), ``best_step`` and ``best_val_nll`` (NaN without validation data)."""

    params: Params
    posterior: VariationalPosterior
    history: list
    best_step: int
    best_val_nll: float


def _trainable_mask(model, params):
    lik = model.likelihood
    return Params(
        inducing=jax.tree_util.tree_map(lambda _: model.train_inducing, params.inducing),
        q_mean=True,
        q_scale=True,
        kernel=jax.tree_util.tree_map(lambda _: model.train_kernel, params.kernel),
        likelihood=jax.tree_util.tree_map(lambda _: isinstance(lik, Gaussian) and lik.trainable, params.likelihood),
        scale=jax.tree_util.tree_map(lambda _: True, params.scale),
    )


def _mask(mask, tree):
    return jax.tree_util.tree_map(lambda m, t: t if m else jnp.zeros_like(t), mask, tree)


def _gaussian_nll(model, params, x, y, key, num_samples):
    p = _gaussian_predictive(model, params, x, key, num_samples, True)
    return -jnp.mean(jnp.sum(p.log_prob(y), axis=-1))


_gaussian_nll_jit = jax.jit(_gaussian_nll, static_argnums=(0, 5))


def _val_nll(model, params, x, y, key, num_samples) -> float:
    """Mean negative log predictive density of (x, y) under :func:`predict` (the validation NLL)."""
    if isinstance(model.likelihood, Gaussian):
        return float(_gaussian_nll_jit(model, params, x, y, key, num_samples))
    probs = np.asarray(_class_probs_jit(model, params, x, key, num_samples))
    py = probs[np.arange(probs.shape[0]), np.asarray(y)]
    return float(-np.mean(np.log(np.maximum(py, np.finfo(probs.dtype).tiny))))


def _resolve_devices(devices):
    if devices is None:
        devices = jax.local_devices()
    devices = list(devices)
    if not devices:
        raise ValueError("devices is empty")
    return devices


@functools.lru_cache(maxsize=32)
def _adam(learning_rate):
    return optax.adam(learning_rate)


@functools.lru_cache(maxsize=32)
def _make_round(model, optimizer, num_data, mesh, length):
    """One jitted call running ``length`` optimisation steps in a ``lax.scan`` (steps past ``stop`` are no-ops)."""
    batch_sharding = None if mesh is None else NamedSharding(mesh, PartitionSpec("data"))

    def loss_fn(params, key, xb, yb):
        return -(num_data / xb.shape[0] * jnp.sum(_ell(model, params, xb, yb, key))
                 - kl_divergence(model, params)) / num_data

    def run(params, opt_state, lr_scale, key, first_step, stop, idx, x, y):
        mask = _trainable_mask(model, params)

        def body(carry, inp):
            params, opt_state, dead = carry
            t, idx_t = inp
            xb, yb = x[idx_t], y[idx_t]
            if batch_sharding is not None:
                xb = jax.lax.with_sharding_constraint(xb, batch_sharding)
                yb = jax.lax.with_sharding_constraint(yb, batch_sharding)
            loss, g = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(key, t), xb, yb)
            g = _mask(mask, g)
            upd, new_opt = optimizer.update(g, opt_state, params)
            upd = _mask(mask, jax.tree_util.tree_map(lambda u: lr_scale * u, upd))
            new_params = optax.apply_updates(params, upd)
            finite = jnp.isfinite(loss) & jnp.all(jnp.stack(
                [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(g)]))
            live = t < stop
            active = live & ~dead & finite
            params, opt_state = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b),
                                                       (new_params, new_opt), (params, opt_state))
            dead = dead | (live & ~finite)
            return (params, opt_state, dead), (jnp.where(active, loss, 0.0), active)

        steps = first_step + jnp.arange(length)
        (params, opt_state, dead), (losses, active) = jax.lax.scan(
            body, (params, opt_state, jnp.asarray(False)), (steps, idx))
        n_active = jnp.sum(active)
        return params, opt_state, dead, jnp.sum(losses) / jnp.maximum(n_active, 1), n_active

    return jax.jit(run)


def fit(model: Model, params: Params, x, y, *, key, optimizer=None, learning_rate=None, batch_size: int = 100,
        num_steps: int = 1000, x_val=None, y_val=None, eval_every: int | None = None, num_val_samples: int = 100,
        patience: int = 5, factor: float = 0.5, min_lr_scale: float = 1e-2, stop_patience: int | None = None,
        devices: Sequence | None = None, progress: bool = True, blas_threads: int | None = 1) -> FitResult:
    """Maximise the ELBO by minibatch stochastic optimisation (module docstring, "Training").

    Args:
      model: the :class:`Model`, from :func:`svgp`/:func:`svtp`.
      params: its parameters, from :func:`init` (or an earlier fit).
      x: training inputs (N points).
      y: training targets (N points).
      key: PRNG key for minibatches and Monte-Carlo draws.
      optimizer: an optax transformation (default ``optax.adam(learning_rate)``).
      learning_rate: the step size of the default optimizer (default 1e-2); not together with ``optimizer``.
      batch_size: minibatch size B (<= N; divisible by the number of devices).
      num_steps: maximum number of optimisation steps.
      x_val: validation inputs for plateau reduction, early stopping and keeping the best parameters (pass both
        ``x_val`` and ``y_val`` or neither).
      y_val: validation targets matching ``x_val``.
      eval_every: steps between evaluations (default: one epoch, ``N // B``).
      num_val_samples: Monte-Carlo draws of the validation predictive (fixed random numbers across evaluations).
      patience: evaluations without improvement before `optax.contrib.reduce_on_plateau` reduces the
        learning-rate scale.
      factor: the factor, in (0, 1), by which `optax.contrib.reduce_on_plateau` multiplies the learning-rate scale.
      min_lr_scale: stop once the learning-rate scale falls below it.
      stop_patience: stop after this many evaluations without a better validation NLL (``None``: never).
      devices: devices for data-parallel steps (default: all local devices; one device = no sharding).
      progress: show a tqdm bar.
      blas_threads: BLAS/LAPACK threads during training (`smnngp.linalg.blas_threads`; default 1: the M x M
        factorisations are small, and more LAPACK threads only compete with XLA's; ``None`` leaves them alone).

    Returns:
      :class:`FitResult` with the kept parameters (best validation NLL, or the last ones without validation data),
      their :class:`VariationalPosterior`, the history of evaluations, ``best_step`` and ``best_val_nll``.

    Raises:
      TypeError: if ``model`` was not built by :func:`svgp` or :func:`svtp`.
      ValueError: for invalid data, ``M > N``, ``batch_size > N`` or not divisible by the number of devices, both
        ``optimizer`` and ``learning_rate`` given, a non-positive ``learning_rate``, ``factor`` outside (0, 1), only
        one of ``x_val`` and ``y_val``, an empty ``devices``, or non-positive step counts.

    Warns:
      RuntimeWarning: when a loss or gradient is not finite; training stops with the last finite parameters.
    """
    with linalg.blas_threads(blas_threads):
        return _fit(model, params, x, y, key=key, optimizer=optimizer, learning_rate=learning_rate,
                    batch_size=batch_size, num_steps=num_steps, x_val=x_val, y_val=y_val, eval_every=eval_every,
                    num_val_samples=num_val_samples, patience=patience, factor=factor, min_lr_scale=min_lr_scale,
                    stop_patience=stop_patience, devices=devices, progress=progress)


def _fit(model, params, x, y, *, key, optimizer, learning_rate, batch_size, num_steps, x_val, y_val, eval_every,
         num_val_samples, patience, factor, min_lr_scale, stop_patience, devices, progress):
    if not isinstance(model, Model):
        raise TypeError(f"model must be built by svgp() or svtp(), got {type(model).__name__}")
    x = _check_x(model, x)
    N = x.shape[0]
    y = model.likelihood.check_targets(y, N)
    if model.num_inducing > N:
        raise ValueError(f"inducing_inputs has M={model.num_inducing} points, more than the N={N} training points "
                         "in x")
    has_val = x_val is not None or y_val is not None
    if has_val:
        if x_val is None or y_val is None:
            raise ValueError("pass both x_val and y_val (or neither)")
        x_val = _check_x(model, x_val, "x_val")
        y_val = model.likelihood.check_targets(y_val, x_val.shape[0], "y_val")
    B = _positive_int(batch_size, "batch_size")
    if B > N:
        raise ValueError(f"batch_size={B} exceeds the N={N} training points")
    num_steps = _positive_int(num_steps, "num_steps")
    steps_per_epoch = N // B
    eval_every = steps_per_epoch if eval_every is None else _positive_int(eval_every, "eval_every")
    eval_every = min(eval_every, num_steps)
    num_val_samples = _positive_int(num_val_samples, "num_val_samples")
    if optimizer is not None and learning_rate is not None:
        raise ValueError("pass either optimizer or learning_rate, not both")
    if optimizer is None:
        lr = 1e-2 if learning_rate is None else float(learning_rate)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning_rate must be positive and finite, got {learning_rate!r}")
        optimizer = _adam(lr)
    if not (0 < factor < 1):
        raise ValueError(f"factor must be in (0, 1), got {factor!r}")
    params = _strong(params)
    devices = _resolve_devices(devices)
    mesh = None
    if len(devices) > 1:
        if B % len(devices):
            raise ValueError(f"batch_size={B} must be divisible by the number of devices ({len(devices)})")
        mesh = Mesh(np.asarray(devices), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        params, x, y = jax.device_put((params, x, y), replicated)
        idx_sharding = NamedSharding(mesh, PartitionSpec(None, "data"))
    else:
        replicated = idx_sharding = devices[0]
        params, x, y = jax.device_put((params, x, y), replicated)

    k_data, k_mc, k_val, k_post = jax.random.split(key, 4)
    run = _make_round(model, optimizer, N, mesh, eval_every)
    opt_state = jax.device_put(optimizer.init(params), replicated)
    plateau, plateau_update = _optim.plateau(float(factor), int(patience))
    plateau_state = plateau.init(params)

    epoch, buffer = 0, np.zeros((0, B), np.int64)

    def next_indices(n):
        nonlocal epoch, buffer
        while buffer.shape[0] < n:
            perm = np.asarray(jax.random.permutation(jax.random.fold_in(k_data, epoch), N))
            buffer = np.concatenate([buffer, perm[: steps_per_epoch * B].reshape(steps_per_epoch, B)])
            epoch += 1
        out, buffer = buffer[:n], buffer[n:]
        return out

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_steps, desc=f"{model.kind} {type(model.likelihood).__name__}", leave=False)
    history = []
    best = (math.inf, params, 0)
    t0 = time.perf_counter()
    step = 0
    since_best = 0
    try:
        while step < num_steps:
            idx = jax.device_put(jnp.asarray(next_indices(eval_every), jnp.int32), idx_sharding)
            lr_scale = jnp.asarray(plateau_state.scale, model.dtype)
            params, opt_state, dead, loss, n_active = run(params, opt_state, lr_scale, k_mc, step, num_steps, idx, x, y)
            done = int(n_active)
            if bool(dead):
                warnings.warn(f"variational fit: non-finite loss or gradient at step {step + done}; training stopped "
                              "and the last finite parameters kept", RuntimeWarning, stacklevel=2)
                step += done
                break
            step += done
            loss = float(loss)
            if has_val:
                v = _val_nll(model, params, x_val, y_val, k_val, num_val_samples)
                monitored = v if math.isfinite(v) else 1e30
                if v < best[0]:
                    best, since_best = (v, params, step), 0
                else:
                    since_best += 1
            else:
                v, monitored = math.nan, loss
            plateau_state = plateau_update(plateau_state, jnp.asarray(monitored, plateau_state.best_value.dtype))
            scale = float(plateau_state.scale)
            history.append({"step": step, "loss": loss, "val_nll": v, "lr_scale": scale,
                            "time": time.perf_counter() - t0})
            if bar is not None:
                bar.update(done)
                bar.set_postfix(loss=f"{loss:.4g}", val_nll=f"{v:.4g}", lr=f"{scale:.3g}")
            if scale < min_lr_scale or (stop_patience is not None and since_best >= stop_patience):
                break
    finally:
        if bar is not None:
            bar.close()
    if has_val and math.isfinite(best[0]):
        params, best_val, best_step = best[1], best[0], best[2]
    else:
        best_val, best_step = math.nan, step
    post = as_posterior(model, params, x, y, key=k_post)
    return FitResult(params, post, history, best_step, best_val)
