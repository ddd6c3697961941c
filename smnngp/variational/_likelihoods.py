"""The likelihoods of the SVGP / SVTP: `Softmax`, `Bernoulli` (probit) and `Gaussian`.

Small immutable, hashable descriptions (part of the static `Model`), each with its targets' check and its
``log_prob`` (or, for the Gaussian, the closed-form expected log-likelihood); the expectations over q(f) are taken
in `smnngp.variational._elbo`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr

from smnngp._axes import lead
from smnngp._checks import check_finite
from smnngp.kernels import softplus_inverse

__all__ = ["Softmax", "Bernoulli", "Gaussian"]


_LOG_2PI = math.log(2.0 * math.pi)


def _is_tracer(a) -> bool:
    return isinstance(a, jax.core.Tracer)


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
