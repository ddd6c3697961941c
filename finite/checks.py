"""Argument checks shared by the finite-network families (one home: `finite.ensembles` and `finite.lowrank` use
them), each raising a ``ValueError`` that names the function and the argument."""

from __future__ import annotations

import math

__all__ = ["check_positive"]


def check_positive(value, name: str, where: str) -> float:
    """``float(value)`` if it is a positive finite number, else ``ValueError("{where}: {name} must be ...")``.

    Args: ``value`` the argument; ``name`` its name; ``where`` the function or object it was given to.
    Returns: the value as a float.
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be a positive number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{where}: {name} must be positive and finite, got {value!r}")
    return v
