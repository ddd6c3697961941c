"""A reshape of an activation's positions (an image's rows and columns flattened into one sequence axis, and back)
as a map on its kernel.

Reshaping the block of spatial axes (row-major, the axes contiguous and in the kernel's canonical order) only
relabels positions: the covariance of positions p and q moves to the pair of their new indices. On a kernel with
every pair of positions, (N1, N2, P1, P1', P2, P2', ...), the first positions of the pairs are gathered, reshaped,
and interleaved again with the second ones, reshaped alike; on a kernel of same-position covariances,
(N1, N2, P1, P2, ...), the spatial block is reshaped.
"""

from __future__ import annotations

import jax.numpy as jnp

from smnngp.kernels import Kernel


class Reposition:
    """The kernel map of reshaping spatial sizes ``before`` into ``after`` (equal products)."""

    def __init__(self, before: tuple, after: tuple):
        self.before, self.after = tuple(before), tuple(after)

    @staticmethod
    def needs_full(out_full: bool) -> bool:
        return out_full  # position pairs are relabelled, never created or dropped

    def _full(self, t, lead: int):
        d, e = len(self.before), len(self.after)
        firsts = [lead + 2 * i for i in range(d)]
        t = jnp.transpose(t, list(range(lead)) + firsts + [a + 1 for a in firsts])
        t = t.reshape(t.shape[:lead] + self.after + self.after)
        return jnp.transpose(t, list(range(lead)) + [lead + x for i in range(e) for x in (i, e + i)])

    def _map(self, t, full: bool):
        if t is None or jnp.ndim(t) == 0:
            return t
        lead = jnp.ndim(t) - (2 if full else 1) * len(self.before)
        return self._full(t, lead) if full else t.reshape(t.shape[:lead] + self.after)

    def kernel_map(self, k: Kernel) -> Kernel:
        full = k.full
        ntk = k.ntk
        if ntk is not None and jnp.ndim(ntk) and jnp.shape(ntk) != jnp.shape(k.nngp):
            ntk = jnp.broadcast_to(ntk, jnp.shape(k.nngp))
        return k.replace(nngp=self._map(k.nngp, full), ntk=self._map(ntk, full), cov1=self._map(k.cov1, full),
                         cov2=self._map(k.cov2, full),
                         shape1=k.shape1[:1] + self.after + k.shape1[-1:],
                         shape2=k.shape2[:1] + self.after + k.shape2[-1:])


class PositionMap:
    """The kernel map of moving positions along each spatial axis: output position ``i`` of axis ``a`` holds input
    position ``sources[a][i]``, or zero where it is -1 (slices, padding with zeros, reversal; concatenation is a
    sum of padded parts). Covariances move with both positions of a pair; a zero position has zero covariance."""

    def __init__(self, sources: tuple):
        self.sources = tuple(tuple(int(i) for i in s) for s in sources)

    @staticmethod
    def needs_full(out_full: bool) -> bool:
        return out_full  # a position pair maps to one position pair (the diagonal to the diagonal)

    def _move(self, t, lead: int, full: bool):
        if t is None or jnp.ndim(t) == 0:
            return t
        per_axis = 2 if full else 1
        for a, src in enumerate(self.sources):
            idx = jnp.asarray([max(i, 0) for i in src])
            keep = jnp.asarray([i >= 0 for i in src])
            for j in range(per_axis):
                axis = lead + per_axis * a + j
                t = jnp.take(t, idx, axis=axis)
                shape = [1] * t.ndim
                shape[axis] = len(src)
                t = jnp.where(keep.reshape(shape), t, jnp.zeros((), t.dtype))
        return t

    def kernel_map(self, k: Kernel) -> Kernel:
        full = k.full
        n_sp = len(self.sources) * (2 if full else 1)
        ntk = k.ntk
        if ntk is not None and jnp.ndim(ntk) and jnp.shape(ntk) != jnp.shape(k.nngp):
            ntk = jnp.broadcast_to(ntk, jnp.shape(k.nngp))
        after = tuple(len(s) for s in self.sources)

        def move(t):
            return None if t is None else self._move(t, jnp.ndim(t) - n_sp, full)

        return k.replace(nngp=move(k.nngp), ntk=move(ntk), cov1=move(k.cov1), cov2=move(k.cov2),
                         shape1=k.shape1[:1] + after + k.shape1[-1:], shape2=k.shape2[:1] + after + k.shape2[-1:])
