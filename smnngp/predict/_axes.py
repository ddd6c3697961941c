"""Axis bookkeeping shared by the predictors: trace axes of the targets and interleaved kernel layouts.

neural-tangents' convention, kept here: a kernel over outputs of shape ``(a_1, ..., a_m)`` (the axes of ``y`` that
are not trace axes) is stored interleaved, ``(a_1, a_1', a_2, a_2', ...)``, and stands for ``Theta ⊗ I`` along
the trace axes, whose size ``R`` is the product of their lengths. Every predictor flattens the targets to
``(P, R)`` (non-trace axes first, in order, then the trace axes) and the kernel to its ``(P, P)`` matrix, works in
that flat form and restores the layout at the end.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from smnngp._axes import canonical_axes


def canonical_trace_axes(trace_axes, ndim: int, where: str) -> tuple[int, ...]:
    """``trace_axes`` as sorted non-negative axes of an ``ndim``-dimensional target array.

    As in neural-tangents, a repeated axis counts once, and any axes may be traced, the batch axis and all of
    them included: the kernel then acts on the remaining axes (a scalar kernel when none remains).

    Args:
        trace_axes: an int or a sequence of ints, negative ones counted from the end.
        ndim: number of axes of the targets.
        where: the function named in error messages.

    Returns:
        The axes as a sorted tuple of distinct non-negative ints (:func:`smnngp._axes.canonical_axes`).

    Raises:
        TypeError: if an axis is not an int.
        ValueError: if an axis is out of range.
    """
    return canonical_axes(trace_axes, ndim, where, "trace", repeats="merge")


class OutputLayout(NamedTuple):
    """How targets of one shape split into kernel axes and trace axes.

    Attributes:
        shape: the shape of the targets.
        trace: the trace axes, sorted, non-negative.
        nontrace_shape: the lengths of the other axes, in order (the kernel's axes, each appearing twice).
        trace_shape: the lengths of the trace axes.
    """

    shape: tuple[int, ...]
    trace: tuple[int, ...]
    nontrace_shape: tuple[int, ...]
    trace_shape: tuple[int, ...]

    @classmethod
    def of(cls, shape, trace_axes, where: str) -> OutputLayout:
        """The layout of targets of ``shape`` with ``trace_axes`` (see :func:`canonical_trace_axes`)."""
        shape = tuple(int(s) for s in shape)
        trace = canonical_trace_axes(trace_axes, len(shape), where)
        return cls(shape, trace, tuple(s for i, s in enumerate(shape) if i not in trace),
                   tuple(shape[i] for i in trace))

    @property
    def n_kernel(self) -> int:
        """``P``, the side of the flattened kernel."""
        return math.prod(self.nontrace_shape)

    @property
    def n_trace(self) -> int:
        """``R``, the number of independent outputs the kernel acts on."""
        return math.prod(self.trace_shape)

    def flat(self, y):
        """``y`` of this layout's shape (after any leading axes) as ``(..., P, R)``."""
        lead = y.ndim - len(self.shape)
        y = jnp.moveaxis(y, [lead + a for a in self.trace], list(range(y.ndim - len(self.trace), y.ndim)))
        return y.reshape(y.shape[:lead] + (self.n_kernel, self.n_trace))

    def unflat(self, z, nontrace_shape):
        """Inverse of :meth:`flat` for ``z`` of shape ``(..., Q, R)``, with ``nontrace_shape`` for the ``Q`` axis."""
        lead = z.shape[:-2]
        z = z.reshape(lead + tuple(nontrace_shape) + self.trace_shape)
        k, m = len(lead), len(nontrace_shape)
        return jnp.moveaxis(z, list(range(k + m, z.ndim)), [k + a for a in self.trace])

    def kernel_axes(self, shape) -> tuple[int, ...]:
        """The kernel axes (the non-trace axes) of outputs of ``shape``, which has this layout's trace axes."""
        return tuple(s for i, s in enumerate(shape) if i not in self.trace)

    def out_shape(self, nontrace_shape) -> tuple[int, ...]:
        """The shape of outputs whose kernel axes are ``nontrace_shape`` (the trace axes put back in place)."""
        out, it = [], iter(nontrace_shape)
        for i in range(len(self.shape)):
            out.append(self.shape[i] if i in self.trace else next(it))
        return tuple(out)


def zipped(shape1, shape2) -> tuple[int, ...]:
    """The interleaved kernel shape ``(a_1, b_1, a_2, b_2, ...)`` of outputs ``shape1`` against ``shape2``."""
    return tuple(s for pair in zip(shape1, shape2) for s in pair)


def to_2d(k):
    """An interleaved kernel ``(a_1, b_1, ..., a_m, b_m)`` as the matrix ``(prod a, prod b)``."""
    m = k.ndim // 2
    k = jnp.transpose(k, list(range(0, 2 * m, 2)) + list(range(1, 2 * m, 2)))
    return k.reshape(math.prod(k.shape[:m]), math.prod(k.shape[m:]))


def from_2d(c, shape):
    """A matrix ``(..., Q, Q)`` as the interleaved ``(..., a_1, a_1', ..., a_m, a_m')`` for ``shape = (a_1..a_m)``."""
    lead, m = c.shape[:-2], len(shape)
    c = c.reshape(lead + tuple(shape) + tuple(shape))
    k = len(lead)
    order = list(range(k)) + [k + j for i in range(m) for j in (i, m + i)]
    return jnp.transpose(c, order)
