"""The static model description and the parameter pytree: `Model`, `Params`, `svgp`, `svtp`, `init`.

`svgp` and `svtp` check their arguments (the kernel is evaluated and traced on the inducing inputs) and return a
hashable `Model`, a static argument of every jitted piece; `init` gives the `Params` pytree at the prior.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from smnngp import priors
from smnngp._checks import check_finite
from smnngp.kernels import softplus_inverse
from smnngp.posterior import as_kernel_callable
from smnngp.variational._likelihoods import Gaussian, _Likelihood

__all__ = ["Model", "Params", "svgp", "svtp", "init"]


_DEFAULT_JITTER = {"float32": 1e-5, "float64": 1e-8}


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
