"""Kernel callables and their compiled evaluators; the checks of targets and noise that every fit path shares.

`as_kernel_callable` turns a stax ``kernel_fn``, a stax triple or a plain ``k(x1, x2)`` into ``k(x1, x2)``;
``_evaluator(kernel)`` is its jitted ``k(x1, x2)`` and O(N) diagonal (one per kernel, cached; a `ParametricKernel`'s
hyperparameters are traced arguments), which the fit paths (`smnngp.posterior._fit`) and the posteriors'
predictions (`smnngp.posterior._posteriors`) call.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from smnngp import kernels as _kernels
from smnngp._checks import check_finite

__all__ = ["as_kernel_callable"]


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


def _kernel_diag(kernel, x):
    """Diagonal k(x_i, x_i) in O(N) kernel evaluations (one row at a time, vmapped)."""
    one = jax.vmap(lambda xi: kernel(xi[None], xi[None])[0, 0])
    return one(x)
