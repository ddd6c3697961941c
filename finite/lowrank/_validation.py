"""Argument checks of the low-rank layers and networks (each error names the layer and the argument), and
the names every builder validates against: the layer kinds `KINDS`, the factor families `FAMILIES`, the bias
options and the KL methods.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from finite.checks import check_positive

__all__ = ["KINDS", "FAMILIES"]



KINDS = ("deterministic", "bbb", "lowrank", "rank1")
FAMILIES = ("gaussian", "laplace")
_BIASES = ("bayes", "deterministic", "none")
_KL_METHODS = ("auto", "mc", "exact")


def _check_choice(value, choices, name: str, where: str):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{where}: {name} must be one of {choices}, got {value!r}")
    return value


def _check_int(value, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


_check_pos = check_positive


def _check_range(value, name: str, where: str):
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a pair (low, high), got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{where}: {name} must be a finite pair with low <= high, got {value!r}")
    return (lo, hi)


def _check_last_dim(x, n: int, where: str):
    if not hasattr(x, "shape") or x.ndim < 1:
        raise ValueError(f"{where}: x must be an array with a feature axis, got {type(x).__name__}")
    if x.shape[-1] != n:
        raise ValueError(f"{where}: x must have last dimension {n}, got shape {tuple(x.shape)}")


def _float_dtype(dtype):
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    return dtype
