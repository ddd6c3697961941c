"""Axis arguments: the one place where an ``int``-or-sequence axis specification is checked and normalised.

Used by the empirical kernels (``trace_axes``, ``diagonal_axes`` of network outputs) and by the predictors
(``trace_axes`` of the targets). Also home of :func:`lead`, the explicit broadcast of a per-feature vector over
batch axes that the packages use instead of NumPy's implicit rank promotion (the tests run with JAX's
``jax_numpy_rank_promotion='raise'``, as neural-tangents' do).
"""

from __future__ import annotations

import numpy as np

__all__ = ["canonical_axes", "lead"]


def lead(v, ndim: int):
    """``v`` with leading unit axes up to rank ``ndim``: NumPy's rank promotion, written out.

    For a per-feature array (a bias ``(p,)``, a mask, a scale) that meets a batch ``(..., p)`` of any rank, so that
    the broadcast is explicit and code runs under ``jax_numpy_rank_promotion='raise'``. The values are unchanged.

    Args:
        v: a NumPy or JAX array (a scalar is returned as it is: scalars never promote).
        ndim: the rank of the array ``v`` is combined with, at least ``v``'s own.

    Returns:
        ``v`` reshaped to ``(1,) * (ndim - v.ndim) + v.shape``, of its own array type.

    Raises:
        ValueError: if ``v`` has more than ``ndim`` axes.
    """
    k = np.ndim(v)
    if k == 0:
        return v
    if k > ndim:
        raise ValueError(f"lead: an array of shape {np.shape(v)} has more than {ndim} axes")
    return v.reshape((1,) * (ndim - k) + np.shape(v))


def canonical_axes(axes, ndim: int, where: str, what: str = "", repeats: str = "merge") -> tuple[int, ...]:
    """``axes`` as sorted, distinct, non-negative axes of an ``ndim``-dimensional array.

    Args:
        axes: an int or a sequence of ints; negative ones count from the end.
        ndim: the number of axes of the array they index.
        where: the function named in error messages.
        what: what the axes are, for error messages (``"trace"``, ``"diagonal"``).
        repeats: ``"merge"`` keeps one copy of a repeated axis (neural-tangents' empirical kernels do); ``"raise"``
            refuses it.

    Returns:
        The axes as a sorted tuple of distinct non-negative ints.

    Raises:
        TypeError: if an axis is not an int (``bool`` included).
        ValueError: if an axis is out of range, or repeated when ``repeats="raise"``.
    """
    label = f"{what} axis" if what else "axis"
    items = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{where}: {label} must be an int, got {a!r} (in {axes!r})")
        if not -ndim <= int(a) < ndim:
            raise ValueError(f"{where}: {label} {a} is out of range for an array with {ndim} axes")
        out.append(int(a) % ndim)
    if repeats == "raise" and len(set(out)) != len(out):
        raise ValueError(f"{where}: {what + '_axes' if what else 'axes'} {axes!r} repeats an axis")
    return tuple(sorted(set(out)))
