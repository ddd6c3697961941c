"""Axis arguments: the one place where an ``int``-or-sequence axis specification is checked and normalised.

Used by the empirical kernels (``trace_axes``, ``diagonal_axes`` of network outputs) and by the predictors
(``trace_axes`` of the targets).
"""

from __future__ import annotations

import numpy as np

__all__ = ["canonical_axes"]


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
