"""Matrix-free exact GP linear algebra: solves and log-determinants of ``K + s I`` without forming it.

The dense path (:mod:`smnngp.linalg`) factorises the N x N training kernel; its memory grows as N^2 and stops at
the size of one device. This module never holds the matrix. Everything is built from products ``(K + s I) V``
computed tile by tile: the kernel is evaluated on a (T, T) tile, multiplied into the matching rows of ``V`` and
discarded, so memory is O(N m + T^2) for ``m`` right-hand sides and time O(N^2 (d + m)) per product (``d`` the cost
of one kernel entry). Each tile of the symmetric kernel is computed once, by one device: the tile pairs are spread
over devices with ``jax.shard_map``, so one call uses every local device, and every device of a
``jax.distributed`` cluster when given the global device list.

On these products (Gardner et al., NeurIPS 2018; Wang et al., NeurIPS 2019):

* **preconditioner**: a rank-r pivoted Cholesky factor ``K ~ F F^T`` (greedy on the largest remaining diagonal
  entry, r kernel rows, O(N r^2)), giving ``P = F F^T + s I`` with ``P^{-1}`` by the Woodbury identity and
  ``log|P| = (N - r) log s + log|s I_r + F^T F|`` by the determinant lemma;
* **solves**: preconditioned conjugate gradients on many right-hand sides at once (one kernel pass per
  iteration for all of them), each column stopped when its relative residual ``|b - A x| / |b|`` reaches ``tol``;
* **log-determinant**: stochastic Lanczos quadrature. Probes ``z ~ N(0, P)`` ride along in the same CG run;
  CG's step sizes give, per probe, the Lanczos tridiagonal ``T`` of ``P^{-1/2} A P^{-1/2}`` started at
  ``w = P^{-1/2} z`` (``w ~ N(0, I)``), and ``w^T log(P^{-1/2} A P^{-1/2}) w ~ |w|^2 e1^T log(T) e1``.
  So ``log|A| = log|P| + tr log(P^{-1} A)`` is estimated without bias (up to quadrature error, which vanishes as
  CG converges) with a standard error from the spread over probes, reported beside the value. A good
  preconditioner makes ``P^{-1} A`` close to I and the estimate close to exact.

:func:`solve` runs the lot for the posteriors in `smnngp.posterior` (``fit(..., method='cg')``); :class:`CG`
holds its settings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec
from scipy.linalg import eigh_tridiagonal

from smnngp import linalg
from smnngp._checks import check_finite

__all__ = [
    "CG",
    "ConvergenceWarning",
    "KernelOperator",
    "PivotedCholesky",
    "DenseCholesky",
    "SolveInfo",
    "LogdetEstimate",
    "pivoted_cholesky",
    "cg",
    "solve",
    "MarginalTerms",
    "marginal_terms",
    "marginal_terms_grad",
    "available_memory_bytes",
    "love_variance_reduction",
    "love_reduction_bounds",
    "love_variances",
    "LoveBounds",
    "LoveInfo",
]


class ConvergenceWarning(UserWarning):
    """Conjugate gradients stopped at ``max_iter`` with a residual above its tolerance, or LOVE could not certify
    a variance to ``love_tol`` (and solved for it)."""


@dataclasses.dataclass(frozen=True)
class CG:
    """Settings of the matrix-free path (hashable: a posterior keeps them as static data).

    Attributes:
        tol: relative residual ``|b - A x| / |b|`` at which a column's solve stops (``None``: 1e-6 in float64,
            1e-4 in float32, about what each precision's CG reaches).
        max_iter: most CG iterations; a solve that stops there above ``tol`` warns (:class:`ConvergenceWarning`).
        precond_rank: rank r of the pivoted-Cholesky preconditioner (0: plain CG; at most N is used). It costs
            r kernel rows, O(N r^2) flops once and N r numbers, and buys iterations: on the RBF benchmark problem
            (N = 5,000, noise 0.01, float64, tol 1e-4) ranks 100 / 300 / 1,000 took 163 / 85 / 26 iterations and gave
            log-determinant standard errors of 47 / 25 / 22.
        num_probes: Gaussian probes of the stochastic log-determinant (at least 2, for its standard error).
        tile_size: rows per kernel tile (``None``: at most 2048 on a CPU, 8192 on an accelerator); memory per device
            is about ``tile_size^2`` kernel entries plus the kernel's own intermediates on one tile.
        devices: the devices the kernel tiles are spread over (``None``: all local devices); pass the global
            ``jax.devices()`` on a ``jax.distributed`` cluster.
        seed: seed of the probes (the estimate is a fixed function of it).
        variance: how predictive variances ``k** - k*x A^{-1} kx*`` are had: ``'solve'`` (one preconditioned CG
            run over the L test columns: exact to ``tol``, each iteration an (N, N) x (N, L) product) or
            ``'love'`` (a Lanczos cache, Pleiss et al. 2018: ``love_rank`` products with one vector, then
            ``A^{-1} ~ Q T^{-1} Q^T`` on the Krylov space of the test points' summed covariance, cost per test point
            O(N rank); each variance comes with a certified interval (:func:`love_variances`), the rank is doubled
            up to ``love_max_rank`` while some interval is wider than ``love_tol`` allows, and the test points still
            uncertified then get CG solves, with a :class:`ConvergenceWarning` naming the bound reached).
        love_rank: Lanczos steps of the ``'love'`` cache (the first rank tried).
        love_tol: largest relative error of a LOVE latent variance ``k** - k*x A^{-1} kx*`` (certified by the
            interval's half-width over its lower end); a test point whose interval is wider is solved by CG.
        love_max_rank: most Lanczos steps the cache is grown to (``None``: ``4 * love_rank``; at most N).
    """

    tol: float | None = None
    max_iter: int = 1000
    precond_rank: int = 1000
    num_probes: int = 16
    tile_size: int | None = None
    devices: tuple | None = None
    seed: int = 0
    variance: str = "solve"
    love_rank: int = 100
    love_tol: float = 1e-2
    love_max_rank: int | None = None

    def __post_init__(self):
        if self.tol is not None and not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol)
                                         and self.tol > 0):
            raise ValueError(f"CG: tol must be a positive finite number (or None), got {self.tol!r}")
        if self.variance not in ("solve", "love"):
            raise ValueError(f"CG: variance must be 'solve' or 'love', got {self.variance!r}")
        for name, low in (("max_iter", 1), ("precond_rank", 0), ("num_probes", 2), ("love_rank", 1)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ValueError(f"CG: {name} must be an integer >= {low}, got {value!r}")
        if not (isinstance(self.love_tol, (int, float)) and not isinstance(self.love_tol, bool)
                and math.isfinite(self.love_tol) and 0 < self.love_tol < 1):
            raise ValueError(f"CG: love_tol must be a number in (0, 1), got {self.love_tol!r}")
        if self.love_max_rank is not None and (not isinstance(self.love_max_rank, (int, np.integer))
                                               or isinstance(self.love_max_rank, bool)
                                               or self.love_max_rank < self.love_rank):
            raise ValueError(f"CG: love_max_rank must be an integer >= love_rank ({self.love_rank}) or None, got "
                             f"{self.love_max_rank!r}")
        if self.tile_size is not None and (not isinstance(self.tile_size, (int, np.integer)) or self.tile_size < 1):
            raise ValueError(f"CG: tile_size must be a positive integer (or None), got {self.tile_size!r}")
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))

    def tolerance(self, dtype) -> float:
        """The relative residual tolerance for ``dtype`` (the default depends on the precision)."""
        if self.tol is not None:
            return float(self.tol)
        return 1e-6 if jnp.dtype(dtype).itemsize >= 8 else 1e-4


class SolveInfo(NamedTuple):
    """How a CG solve went: ``iterations`` run (the most over the columns), the worst relative ``residual``
    ``|b - A x| / |b|`` over the columns, whether it ``converged`` (residual at most ``tol``), and ``tol``."""

    iterations: int
    residual: float
    converged: bool
    tol: float


class LogdetEstimate(NamedTuple):
    """Stochastic log-determinant ``value`` with its ``stderr`` (from the spread over ``num_probes`` probes),
    ``lanczos_steps`` (the most CG / Lanczos steps a probe took) and ``logdet_precond`` (``log|P|``, the exact part
    of the value)."""

    value: float
    stderr: float
    num_probes: int
    lanczos_steps: int
    logdet_precond: float


def available_memory_bytes(device=None) -> int | None:
    """Free memory of ``device`` (default: the first local device) in bytes, ``None`` when it cannot be told.

    An accelerator reports ``bytes_limit - bytes_in_use``; the CPU the host's available physical memory.

    Args:
        device: a ``jax.Device`` (``None``: ``jax.local_devices()[0]``).

    Returns:
        Bytes free, or ``None``.
    """
    device = jax.local_devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):  # pragma: no cover - backend dependent
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform == "cpu":
        try:
            return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_AVPHYS_PAGES"))
        except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
            return None
    return None


def _highest(jitted):
    """Run a jitted function with full float32 matmul precision: a GPU's default (TF32, about 1e-3 relative)
    makes kernel tiles inaccurate and unsymmetric, and CG then stalls or diverges (seen on an H100). The setting is
    read when the function is traced, so it goes around the call."""

    @functools.wraps(jitted)
    def call(*args):
        with jax.default_matmul_precision("highest"):
            return jitted(*args)

    return call


# --------------------------------------------------------------------------------------------
# The operator


def _split_kernel(kernel) -> tuple[Callable, Any]:
    """``(fn, params)`` with ``kernel(x1, x2) = fn(params, x1, x2)``: a `ParametricKernel`'s hyperparameters
    are traced arguments (its arrays are not hashable); any other callable is closed over."""
    from smnngp.kernels import ParametricKernel

    if isinstance(kernel, ParametricKernel):
        return kernel.apply, kernel.theta
    return _Closed(kernel), ()


class _Closed:
    """``fn(params, x1, x2) = kernel(x1, x2)``, hashable by the kernel's identity (a static jit argument)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, params, x1, x2=None):
        return self.kernel(x1, x2)

    def __hash__(self):
        return hash(id(self.kernel))

    def __eq__(self, other):
        return isinstance(other, _Closed) and other.kernel is self.kernel


class KernelOperator:
    """``A = k(X, X) + shift I`` as a linear operator: products by tiles recomputed on the fly.

    Args:
        kernel: ``k(x1, x2=None) -> (N1, N2)`` (a stax ``kernel_fn`` wrapped by
            `smnngp.posterior.as_kernel_callable`, a `ParametricKernel`, any traceable callable). A diagonal
            tile is evaluated as ``k(x_i, None)``, as the dense kernel would be.
        x: training inputs, (N, features...).
        shift: the added diagonal ``s >= 0`` (the noise).
        tile_size: rows per tile (``None``: ``min(N, 2048)`` on a CPU, ``min(N, 8192)`` on an accelerator, rounded
            so the tiles split N evenly).
        devices: devices the kernel tiles are spread over (``None``: all local devices).

    Raises:
        ValueError: if ``x`` has no feature axis or non-finite entries, or ``shift`` is negative or not finite.
    """

    def __init__(self, kernel, x, shift=0.0, *, tile_size: int | None = None, devices=None):
        x = jnp.asarray(x)
        if x.ndim < 2:
            raise ValueError(f"KernelOperator: x must have shape (N, features...), got {x.shape}")
        check_finite(x, "x", "KernelOperator")
        shift = float(shift)
        if not (math.isfinite(shift) and shift >= 0):
            raise ValueError(f"KernelOperator: shift must be non-negative and finite, got {shift}")
        self.kernel, self.x, self.shift = kernel, x, shift
        self.fn, self.params = _split_kernel(kernel)
        devs = tuple(jax.local_devices() if devices is None else devices)
        self.mesh = Mesh(np.array(devs), ("rows",))
        n = x.shape[0]
        default = 2048 if devs[0].platform == "cpu" else 8192  # an accelerator wants bigger tiles
        t = min(n, default) if tile_size is None else min(int(tile_size), n)
        t = -(-n // -(-n // t))  # the smallest tile that covers N with as many tiles
        # every device the same number of row tiles; the extra tiles are padding (zero rows of every product), so
        # the tiling, and with it every sum, is the same on one device and on many
        nb = math.ceil(math.ceil(n / t) / len(devs)) * len(devs)
        self.tile, self.num_tiles = t, nb
        pad = nb * t - n
        xp = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x
        self.blocks = xp.reshape((nb, t) + x.shape[1:])

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def with_shift(self, shift: float) -> KernelOperator:
        """The same kernel, inputs, tiles and devices with another diagonal ``shift``."""
        shift = float(shift)
        if not (math.isfinite(shift) and shift >= 0):
            raise ValueError(f"KernelOperator: shift must be non-negative and finite, got {shift}")
        new = object.__new__(KernelOperator)
        new.__dict__.update(self.__dict__, shift=shift)
        return new

    @property
    def dtype(self):
        return jnp.result_type(self.x.dtype, float)

    def _static(self):
        return self.fn, self.mesh, self.n

    def matmul(self, v) -> jax.Array:
        """``A v`` for ``v`` of shape (N,) or (N, m), in the dtype of the kernel."""
        v = jnp.asarray(v)
        vec = v.ndim == 1
        out = _matmul(*self._static(), self.params, self.blocks, v[:, None] if vec else v, self.shift)
        return out[:, 0] if vec else out

    def bilinear_grad(self, A, B):
        """``d/dtheta tr(A^T K(theta) B)`` for (N, m) ``A``, ``B``: the gradient, a pytree like the kernel's
        hyperparameters (a `ParametricKernel`'s ``theta``), by tiles (one tile's intermediates at a time).

        Raises:
            TypeError: if the kernel has no hyperparameters to differentiate (not a `ParametricKernel`).
        """
        if isinstance(self.fn, _Closed):
            raise TypeError("bilinear_grad needs a ParametricKernel: a plain callable has no hyperparameters")
        A, B = jnp.asarray(A), jnp.asarray(B)
        if A.shape != B.shape or A.ndim != 2 or A.shape[0] != self.n:
            raise ValueError(f"bilinear_grad: A and B must both have shape ({self.n}, m), got {A.shape}, {B.shape}")
        return _bilinear_grad(self.fn, self.mesh, self.n, self.params, self.blocks, A, B)

    def diag(self) -> jax.Array:
        """``k(x_i, x_i) + shift`` for every training point, (N,)."""
        return _diag(self.fn, self.n, self.params, self.blocks) + self.shift

    def cross_matmul(self, x_test, v) -> jax.Array:
        """``k(x_test, X) v`` by column tiles, (L, m) (the predictive mean without forming the (L, N) matrix)."""
        x_test = jnp.asarray(x_test)
        return _cross_matmul(self.fn, self.n, self.params, self.blocks, x_test, jnp.asarray(v, self.dtype))

    def cross_rmatmul(self, x_test, u) -> jax.Array:
        """``k(X, x_test) u`` by row tiles, (N, m)."""
        x_test = jnp.asarray(x_test)
        return _cross_rmatmul(self.fn, self.n, self.params, self.blocks, x_test, jnp.asarray(u, self.dtype))


def dense_tile_size(n: int, device=None) -> int:
    """Rows of the kernel evaluated per call when the dense path builds its N x N matrix (`dense_kernel`): all of
    them up to 4,096 points (one call), else about N / 16 and at most the matrix-free tile (2,048 on a CPU, 8,192
    on an accelerator), so that the kernel's own temporaries stay a small fraction of one N x N matrix."""
    if n <= 4096:
        return n
    dev = device or jax.local_devices()[0]
    return min(-(-n // 16), 2048 if dev.platform == "cpu" else 8192)


def dense_kernel(fn, params, x, tile: int, *, lower_only: bool = True, dtype=None):
    """``k(X, X)`` written straight into one (N, N) buffer, inside a trace.

    Row panels of ``tile`` rows (the last one moved back so that it ends at row N; its rows are written twice with
    the same values), each made of ``tile x tile`` kernel calls over the columns; with ``lower_only`` the tiles
    wholly above the panel's diagonal are skipped (zeros): a Cholesky factorisation reads only the lower triangle,
    and half the kernel evaluations are saved. Peak memory: the matrix plus one panel and one tile's temporaries.
    The diagonal is the kernel's cross form ``k(x_i, x_i)``; callers that need the self form ``k(x, None)``
    (Dropout) set it afterwards.

    Args:
        fn: ``fn(params, x1, x2) -> (n1, n2)``, traceable (`_split_kernel`).
        params: its hyperparameters (traced).
        x: inputs, (N, features...).
        tile: rows per panel and per kernel call (at most N).
        lower_only: skip the tiles above the diagonal.
        dtype: dtype of the buffer (``None``: the inputs' floating dtype). Each tile is computed in the inputs'
            precision and rounded once when stored (the mixed-precision path keeps a float32 matrix of a float64
            kernel).

    Returns:
        The (N, N) kernel matrix (strict upper triangle partly zero with ``lower_only``).
    """
    n = x.shape[0]
    t = min(int(tile), n)
    num_cols = -(-n // t)
    dtype = jnp.result_type(x.dtype, float) if dtype is None else jnp.dtype(dtype)
    if num_cols == 1:  # one call; a stax kernel's own symmetric form
        return (fn(params, x, None) if isinstance(fn, _Closed) else fn(params, x, x)).astype(dtype)
    xp = jnp.concatenate([x, jnp.repeat(x[-1:], num_cols * t - n, axis=0)]) if num_cols * t > n else x
    cols = xp.reshape((num_cols, t) + x.shape[1:])

    def panel(i, A):
        start = jnp.minimum(i * t, n - t)
        rows = lax.dynamic_slice_in_dim(x, start, t)

        def one(args):
            j, xc = args
            if not lower_only:
                return fn(params, rows, xc).astype(dtype)
            return lax.cond(j * t < start + t, lambda: fn(params, rows, xc).astype(dtype),
                            lambda: jnp.zeros((t, t), dtype))

        tiles = lax.map(one, (jnp.arange(num_cols), cols))  # (num_cols, t, t)
        block = jnp.moveaxis(tiles, 0, 1).reshape(t, num_cols * t)[:, :n]
        return lax.dynamic_update_slice(A, block, (start, jnp.zeros((), start.dtype)))

    return lax.fori_loop(0, num_cols, panel, jnp.zeros((n, n), dtype))


def _pad_rows(v, rows):
    pad = rows - v.shape[0]
    return jnp.pad(v, ((0, pad), (0, 0))) if pad else v


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _matmul(fn, mesh, n, params, blocks, v, shift):
    return _matmul_traced(fn, mesh, n, params, blocks, v, shift)


def _matmul_traced(fn, mesh, n, params, blocks, v, shift):
    """``(k(X, X) + shift I) v`` inside a trace, each kernel tile computed once.

    ``k(X, X)`` is symmetric, so only the tile pairs ``i <= j`` are evaluated: tile ``K_ij`` adds ``K_ij v_j`` to
    rows ``i`` and ``K_ij^T v_i`` to rows ``j`` (half the kernel evaluations of a row-by-row pass). The pairs are
    dealt out over the mesh's devices (``shard_map``); each device accumulates its pairs' contributions into all N
    rows, and a ``psum`` adds the devices' parts.
    """
    nb, t = blocks.shape[:2]
    m = v.shape[1]
    dtype = jnp.result_type(v.dtype, blocks.dtype, float)
    # a stax kernel tells k(x, None) from k(x, x) (Dropout): diagonal tiles are evaluated as the dense kernel
    # would; a ParametricKernel does not, and is spared the branch
    diagonal_as_self = isinstance(fn, _Closed)
    vb = _pad_rows(v.astype(dtype), nb * t).reshape(nb, t, m)
    # tiles past ceil(n / t) are padding (zero rows of v); dummy pairs (tile 0 with itself, weight 0) give every
    # device as many pairs
    pair_i, pair_j, weight = _tile_pairs(n, t, mesh.devices.size, dtype)

    def local(pi, pj, w, blocks, vb, params):
        def body(acc, pair):
            i, j, wij = pair
            xi = lax.dynamic_index_in_dim(blocks, i, keepdims=False)
            xj = lax.dynamic_index_in_dim(blocks, j, keepdims=False)
            if diagonal_as_self:
                kij = lax.cond(i == j, lambda: fn(params, xi, None), lambda: fn(params, xi, xj))
            else:
                kij = fn(params, xi, xj)
            kij = kij.astype(dtype)
            vi = lax.dynamic_index_in_dim(vb, i, keepdims=False)
            vj = lax.dynamic_index_in_dim(vb, j, keepdims=False)
            row_i = lax.dynamic_index_in_dim(acc, i, keepdims=False) + wij * (kij @ vj)
            acc = lax.dynamic_update_index_in_dim(acc, row_i, i, 0)
            off = jnp.where(i != j, wij, 0.0)  # a diagonal tile is added once
            row_j = lax.dynamic_index_in_dim(acc, j, keepdims=False) + off * (kij.T @ vi)
            return lax.dynamic_update_index_in_dim(acc, row_j, j, 0), None

        acc, _ = lax.scan(body, jnp.zeros((nb, t, m), dtype), (pi, pj, w))
        return lax.psum(acc, "rows")

    spec_rows, rep = PartitionSpec("rows"), PartitionSpec()
    out = jax.shard_map(local, mesh=mesh, in_specs=(spec_rows, spec_rows, spec_rows, rep, rep, rep), out_specs=rep,
                        check_vma=False)(pair_i, pair_j, weight, blocks, vb, params)
    return out.reshape(nb * t, m)[:n] + shift * v.astype(dtype)


def _tile_pairs(n, t, ndev, dtype):
    """The tile pairs ``i <= j`` of the symmetric kernel, padded with weight-0 pairs to a multiple of ``ndev``."""
    iu, ju = np.triu_indices(math.ceil(n / t))
    per = math.ceil(iu.size / ndev)
    fill = per * ndev - iu.size
    pair_i = jnp.asarray(np.concatenate([iu, np.zeros(fill, int)]), jnp.int32)
    pair_j = jnp.asarray(np.concatenate([ju, np.zeros(fill, int)]), jnp.int32)
    weight = jnp.asarray(np.concatenate([np.ones(iu.size), np.zeros(fill)]), dtype)
    return pair_i, pair_j, weight


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _bilinear_grad(fn, mesh, n, params, blocks, A, B):
    """``d/dparams tr(A^T k(X, X; params) B)``, tile by tile: each tile pair ``i <= j`` differentiates its own
    ``tr(A_i^T K_ij B_j) + tr(B_i^T K_ij A_j)`` (once for ``i = j``) and adds the gradient to a running sum, so
    reverse mode never holds more than one tile's intermediates. Pairs are dealt over the mesh as in the product."""
    nb, t = blocks.shape[:2]
    m = A.shape[1]
    dtype = jnp.result_type(A.dtype, blocks.dtype, float)
    Ab = _pad_rows(A.astype(dtype), nb * t).reshape(nb, t, m)
    Bb = _pad_rows(B.astype(dtype), nb * t).reshape(nb, t, m)
    pair_i, pair_j, weight = _tile_pairs(n, t, mesh.devices.size, dtype)

    def local(pi, pj, w, blocks, Ab, Bb, params):
        def body(acc, pair):
            i, j, wij = pair
            xi = lax.dynamic_index_in_dim(blocks, i, keepdims=False)
            xj = lax.dynamic_index_in_dim(blocks, j, keepdims=False)
            ai, bi = (lax.dynamic_index_in_dim(v, i, keepdims=False) for v in (Ab, Bb))
            aj, bj = (lax.dynamic_index_in_dim(v, j, keepdims=False) for v in (Ab, Bb))
            off = jnp.where(i != j, wij, 0.0)

            def scalar(p):
                kij = fn(p, xi, xj).astype(dtype)
                return wij * jnp.sum(ai * (kij @ bj)) + off * jnp.sum(bi * (kij @ aj))

            g = jax.grad(scalar)(params)
            return jax.tree_util.tree_map(jnp.add, acc, g), None

        zero = jax.tree_util.tree_map(jnp.zeros_like, params)
        acc, _ = lax.scan(body, zero, (pi, pj, w))
        return jax.tree_util.tree_map(lambda a: lax.psum(a, "rows"), acc)

    spec_rows, rep = PartitionSpec("rows"), PartitionSpec()
    return jax.shard_map(local, mesh=mesh, in_specs=(spec_rows, spec_rows, spec_rows, rep, rep, rep, rep),
                         out_specs=rep, check_vma=False)(pair_i, pair_j, weight, blocks, Ab, Bb, params)


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _diag(fn, n, params, blocks):
    one = jax.vmap(lambda xi: fn(params, xi[None], None)[0, 0])
    return lax.map(one, blocks).reshape(-1)[:n]


def _row_traced(fn, n, params, blocks, point):
    """``k(point, X)``, (N,), by column tiles."""
    return lax.map(lambda xj: fn(params, point[None], xj)[0], blocks).reshape(-1)[:n]


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _cross_matmul(fn, n, params, blocks, x_test, v):
    nb, t = blocks.shape[:2]
    vb = _pad_rows(v, nb * t).reshape(nb, t, v.shape[1])

    def body(acc, col):
        xj, vj = col
        return acc + fn(params, x_test, xj) @ vj, None

    out, _ = lax.scan(body, jnp.zeros((x_test.shape[0], v.shape[1]), v.dtype), (blocks, vb))
    return out


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _cross_rmatmul(fn, n, params, blocks, x_test, u):
    return lax.map(lambda xi: fn(params, xi, x_test) @ u, blocks).reshape(-1, u.shape[1])[:n]


# --------------------------------------------------------------------------------------------
# Lanczos cache of predictive variances (LOVE)
#
# With P = F F^T + p I the pivoted-Cholesky preconditioner (P = p I without one) and u = P^{-1/2} kx*, the variance
# reduction is k*x A^{-1} kx* = u^T M^{-1} u for M = P^{-1/2} A P^{-1/2}. Lanczos on M gives M Q = Q T + b q' e_k^T
# (Q (N, k) orthonormal, q' orthogonal to it, T = Q^T M Q). The Galerkin solution v = Q T^{-1} Q^T u leaves the
# residual r = u - M v = (u - Q Q^T u) - b q' (e_k^T T^{-1} Q^T u), orthogonal to Q, and
#     u^T M^{-1} u = u^T v + r^T M^{-1} r = l + r^T M^{-1} r,   l = |L_T^{-1} Q^T u|^2  (T = L_T L_T^T),
# since v^T r = 0. With M >= c I, 0 <= r^T M^{-1} r <= |r|^2 / c: the reduction lies in [l, l + |r|^2 / c], a
# certified interval per test point. c: pivoted Cholesky leaves K - F F^T positive semi-definite, so
# A = K + s I >= F F^T + s I >= min(1, s / p) P and M >= min(1, s / p) I.


class LoveBounds(NamedTuple):
    """Certified bounds of the variance reduction ``k*x A^{-1} kx*`` at each test point from a Lanczos space of
    dimension ``rank``: ``lower = l - slack`` (``l`` the Galerkin value), ``upper = l + |r|^2 / c + slack``
    (``inf`` where no lower bound ``c > 0`` of ``M``'s spectrum is known: no noise; ``slack`` the rounding
    allowance), and ``u_sq = |u|^2 = kx*^T P^{-1} kx*``; see :func:`love_reduction_bounds`."""

    lower: jax.Array
    upper: jax.Array
    rank: int
    u_sq: jax.Array


class LoveInfo(NamedTuple):
    """How :func:`love_variances` went: the Lanczos ``rank`` it ended at, the largest certified relative error
    ``bound`` of the variances it kept, how many test points fell back to CG solves (``num_solved``) and their
    :class:`SolveInfo`, ``solve_info`` (``None`` if none did)."""

    rank: int
    bound: float
    num_solved: int
    solve_info: SolveInfo | None


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _lanczos_extend(fn, mesh, n, params, blocks, shift, U, lam, pshift, Q, alphas, betas, first):
    """Lanczos steps ``first, ..., k - 1`` on ``M = P^{-1/2} A P^{-1/2}`` (``k = alphas.shape[0]``), fully
    reorthogonalised: ``Q`` (N, k + 1) holds ``q_0 .. q_first`` on entry and ``q_0 .. q_k`` on exit, with
    ``M q_j = b_{j-1} q_{j-1} + a_j q_j + b_j q_{j+1}``. A vanishing ``b_j`` (an invariant subspace) leaves zero
    columns and coefficients after it."""

    def body(j, carry):
        Q, alphas, betas = carry
        q = lax.dynamic_index_in_dim(Q, j, axis=1)  # (N, 1)
        w = _half_solve(U, lam, pshift, _matmul_traced(fn, mesh, n, params, blocks, _half_solve(U, lam, pshift, q),
                                                        shift))[:, 0]
        a = q[:, 0] @ w
        for _ in range(2):  # full reorthogonalisation, twice ("twice is enough"); zero columns add nothing
            w = w - Q @ (Q.T @ w)
        b = jnp.linalg.norm(w)
        nxt = jnp.where(b > 0, w / jnp.where(b > 0, b, 1.0), 0.0)
        Q = lax.dynamic_update_index_in_dim(Q, nxt[:, None], j + 1, axis=1)
        return Q, alphas.at[j].set(a), betas.at[j].set(b)

    return lax.fori_loop(first, alphas.shape[0], body, (Q, alphas, betas))


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 12))
def _love_chunk(fn, n, params, blocks, x_chunk, U, lam, pshift, Qk, q_next, beta, chol_t, residuals):
    """For a chunk of test points: ``l``, ``|r|^2`` and ``|u|^2`` (see the comment above :class:`LoveBounds`), with
    ``u = P^{-1/2} k(X, x_chunk)`` formed by row tiles, (N, c), and ``r`` formed explicitly (no cancellation);
    with ``residuals``, ``r`` (N, c) too."""
    c = x_chunk.shape[0]
    kc = lax.map(lambda xi: fn(params, xi, x_chunk), blocks).reshape(-1, c)[:n].astype(Qk.dtype)
    u = _half_solve(U, lam, pshift, kc)
    proj = Qk.T @ u  # (k, c)
    w = jax.scipy.linalg.solve_triangular(chol_t, proj, lower=True)
    sol = jax.scipy.linalg.solve_triangular(chol_t.T, w, lower=False)  # T^{-1} Q^T u
    r = u - Qk @ proj - beta * (q_next[:, None] * sol[-1:, :])
    out = jnp.sum(w * w, axis=0), jnp.sum(r * r, axis=0), jnp.sum(u * u, axis=0)
    return out + (r,) if residuals else out


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _love_curvature(fn, mesh, n, params, blocks, shift, U, lam, pshift, R):
    """``r^T M r`` per column of ``R`` (N, m): one tiled product for all the columns."""
    v = _half_solve(U, lam, pshift, R)
    return jnp.sum(v * _matmul_traced(fn, mesh, n, params, blocks, v, shift), axis=0)


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _cross_columns(fn, n, params, blocks, x_test):
    """``k(X, x_test)``, (N, L), by row tiles."""
    return lax.map(lambda xi: fn(params, xi, x_test), blocks).reshape(-1, x_test.shape[0])[:n]


class _LoveCache:
    """The Lanczos space of ``M`` from ``P^{-1/2} k(X, x_test) 1`` (the test points' summed covariance), grown on
    demand, and the bounds it gives (host-side bookkeeping around the jitted steps)."""

    def __init__(self, op: KernelOperator, x_test, precond: PivotedCholesky | None):
        self.op = op
        dtype = op.dtype
        if precond is not None and not isinstance(precond, PivotedCholesky):
            raise TypeError(f"LOVE needs a PivotedCholesky preconditioner (or None), got {type(precond).__name__}")
        if precond is None or precond.U.shape[1] == 0:  # P = p I
            U, lam = jnp.zeros((op.n, 0), dtype), jnp.zeros(0, dtype)
            p = op.shift if op.shift > 0 else 1.0
        else:
            if precond.U.shape[0] != op.n:
                raise ValueError(f"LOVE: the preconditioner is for N = {precond.U.shape[0]}, the operator has "
                                 f"N = {op.n}")
            U, lam, p = precond.U.astype(dtype), precond.lam.astype(dtype), float(precond.shift)
        self.U, self.lam, self.pshift = U, lam, jnp.asarray(p, dtype)
        self.c_low = min(1.0, op.shift / p)  # M >= c_low I (see the comment above LoveBounds)
        x_test = jnp.asarray(x_test)
        start = _half_solve(U, lam, self.pshift, op.cross_rmatmul(x_test, jnp.ones((x_test.shape[0], 1))))[:, 0]
        norm = float(jnp.linalg.norm(start))
        if not (norm > 0 and math.isfinite(norm)):  # no test point correlates with the data: any start will do
            start, norm = jnp.ones(op.n, dtype), math.sqrt(op.n)
        self.Q = jnp.zeros((op.n, 1), dtype).at[:, 0].set(start / norm)
        self.alphas, self.betas = jnp.zeros(0, dtype), jnp.zeros(0, dtype)
        self.rank, self.exhausted = 0, False  # exhausted: an invariant subspace reached, growing adds nothing

    def grow(self, steps: int):
        """Extend the space to ``steps`` Lanczos steps (at most N; nothing after an invariant subspace)."""
        steps = min(int(steps), self.op.n)
        done = self.alphas.shape[0]
        if self.exhausted or steps <= done:
            return
        op, pad = self.op, steps - done
        Q = jnp.concatenate([self.Q, jnp.zeros((op.n, pad), self.Q.dtype)], axis=1)
        alphas = jnp.concatenate([self.alphas, jnp.zeros(pad, self.Q.dtype)])
        betas = jnp.concatenate([self.betas, jnp.zeros(pad, self.Q.dtype)])
        self.Q, self.alphas, self.betas = _lanczos_extend(
            op.fn, op.mesh, op.n, op.params, op.blocks, jnp.asarray(op.shift, self.Q.dtype), self.U, self.lam,
            self.pshift, Q, alphas, betas, jnp.asarray(done, jnp.int32))
        a, b = np.asarray(self.alphas), np.asarray(self.betas)
        scale = max(float(np.max(np.abs(a))), 1e-300)
        stop = np.nonzero(b[:-1] <= 1e3 * np.finfo(b.dtype).eps * scale)[0]
        self.rank = int(stop[0]) + 1 if stop.size else steps
        self.exhausted = bool(stop.size) or steps == op.n

    def bounds(self, x_test, *, curvature: bool = False) -> LoveBounds:
        """:class:`LoveBounds` at ``x_test`` from the current space, by chunks of test points (each a (N, chunk)
        block of ``u``; at most about 2^23 numbers). With ``curvature``, one tiled product with every residual
        (an (N, L) block) raises the lower bound to ``l + |r|^4 / r^T M r`` (Cauchy-Schwarz:
        ``(r^T r)^2 <= (r^T M^{-1} r)(r^T M r)``), tight where ``r`` is an eigenvector of ``M``: ``M = I`` there
        after an invariant Krylov space with a preconditioner of rank near N."""
        op, k = self.op, self.rank
        a, b = self.alphas[:k], self.betas[:k]
        T = jnp.diag(a) + jnp.diag(b[: k - 1], 1) + jnp.diag(b[: k - 1], -1)
        chol_t = jnp.linalg.cholesky(T)
        beta = b[k - 1]
        Qk, q_next = self.Q[:, :k], self.Q[:, k]
        x_test = jnp.asarray(x_test)
        count = x_test.shape[0]
        chunk = max(1, min(count, 2**23 // op.n))
        parts = []
        for i in range(0, count, chunk):
            xc = x_test[i:i + chunk]
            if xc.shape[0] < chunk:  # the last chunk padded to the same shape (one compilation)
                xc = jnp.concatenate([xc, jnp.repeat(xc[-1:], chunk - xc.shape[0], axis=0)])
            parts.append(_love_chunk(op.fn, op.n, op.params, op.blocks, xc, self.U, self.lam, self.pshift, Qk,
                                     q_next, beta, chol_t, curvature))
        ell, r_sq, u_sq = (jnp.concatenate(p)[:count] for p in list(zip(*parts, strict=True))[:3])
        ell_galerkin = ell
        if curvature:
            R = jnp.concatenate([p[3] for p in parts], axis=1)[:, :count]
            rmr = _love_curvature(op.fn, op.mesh, op.n, op.params, op.blocks, jnp.asarray(op.shift, Qk.dtype),
                                  self.U, self.lam, self.pshift, R)
            ell = ell + jnp.where(rmr > 0, r_sq**2 / jnp.where(rmr > 0, rmr, 1.0), 0.0)
        # rounding: a relative perturbation eps of M moves u^T M^{-1} u by up to eps |u|^2 lam_max / c^2 (lam_max
        # estimated by the largest Ritz value); allowed 8 times over
        theta = float(np.max(np.linalg.eigvalsh(np.asarray(T)))) if k else 1.0
        slack = 8 * float(jnp.finfo(Qk.dtype).eps) * u_sq * theta / self.c_low**2 if self.c_low > 0 else jnp.inf
        upper = ell_galerkin + r_sq / self.c_low + slack if self.c_low > 0 else jnp.full_like(ell, jnp.inf)
        return LoveBounds(ell - slack if self.c_low > 0 else ell, upper, k, u_sq)


def love_reduction_bounds(op: KernelOperator, x_test, rank: int, precond: PivotedCholesky | None = None
                          ) -> LoveBounds:
    """Certified bounds of ``k*x A^{-1} kx*`` per test point from ``rank`` preconditioned Lanczos steps.

    With ``P = F F^T + p I`` (the pivoted-Cholesky preconditioner; ``p I`` without one, ``p`` the shift),
    ``u = P^{-1/2} kx*`` and ``M = P^{-1/2} A P^{-1/2}``, the reduction is ``u^T M^{-1} u``. Lanczos on ``M`` from
    ``P^{-1/2} k(X, x_test) 1`` gives ``M Q = Q T + b q' e_k^T``; the Galerkin solution ``v = Q T^{-1} Q^T u``
    leaves the residual ``r = u - M v``, orthogonal to ``Q``, and ``u^T M^{-1} u = l + r^T M^{-1} r`` with
    ``l = (Q^T u)^T T^{-1} (Q^T u)``. Pivoted Cholesky leaves ``K - F F^T >= 0``, so ``M >= c I`` with
    ``c = min(1, s / p)`` (``s`` the operator's shift) and::

        l  <=  k*x A^{-1} kx*  <=  l + |r|^2 / c     (-/+ 8 eps |u|^2 theta_max / c^2 for rounding)

    ``theta_max`` the largest Ritz value. The lower end is LOVE's estimate (Pleiss et al., ICML 2018); the gap is
    what the Krylov space misses, and it closes only as the space captures each ``u`` (at ``rank = N`` it is zero).
    ``r`` is formed explicitly (a (N, chunk) block of test columns at a time), so the gap has no cancellation
    error. Cost: ``rank`` products with one vector, then O(N L rank) for L test points.

    Args:
        op: the operator ``A = K + shift I``.
        x_test: (L, features...) test inputs.
        rank: Lanczos steps (at most N; fewer if the space becomes invariant).
        precond: the :class:`PivotedCholesky` of the same operator (``None``: ``P = shift I``).

    Returns:
        :class:`LoveBounds` (``upper`` is ``inf`` without a shift: no lower bound of ``M`` is known).
    """
    cache = _LoveCache(op, x_test, precond)
    cache.grow(max(1, int(rank)))
    return cache.bounds(x_test)


def love_variance_reduction(op: KernelOperator, x_test, rank: int, precond: PivotedCholesky | None = None):
    """``k*x A^{-1} kx*`` per test point at a fixed Lanczos ``rank``: the upper end of the certified interval of
    :func:`love_reduction_bounds`, ``l + |r|^2 / c``, which takes ``M = c I`` on the residual (``c = 1`` with the
    noise as the preconditioner's shift: "the preconditioner leaves ``M = I`` off the Krylov space"); ``l`` where
    there is no upper bound (no noise).

    It is exact once the Krylov space is invariant and the residual lies where ``M = I`` (a preconditioner of rank
    near N), and errs towards too small a variance by at most the interval's width ``|r|^2 / c``, which a fixed rank
    does not control: on the RBF benchmark problem (N = 2,000, d = 8, noise 0.01, preconditioner rank 100) the
    summed-covariance Krylov space of rank 1,600 still left intervals 90 times the variance, and at rank 100 the
    estimate exceeded the prior variance at every test point. :func:`love_variances` (what
    ``posterior.fit(..., cg=CG(variance='love'))`` uses) grows the rank until each variance meets ``love_tol`` and
    solves the rest by CG.

    Args:
        op: the operator ``A = K + shift I``.
        x_test: (L, features...) test inputs.
        rank: Lanczos steps r (capped at N).
        precond: the preconditioner (``None``: ``P = shift I``).

    Returns:
        (L,) the estimate.
    """
    b = love_reduction_bounds(op, x_test, rank, precond)
    return jnp.where(jnp.isfinite(b.upper), b.upper, b.lower)


def love_variances(op: KernelOperator, x_test, k_test_test, options: CG | None = None,
                   precond: PivotedCholesky | None = None) -> tuple[jax.Array, LoveInfo]:
    """Latent predictive variances ``k** - k*x A^{-1} kx*``, each within a relative ``options.love_tol`` of exact:
    LOVE where its certified interval allows, CG solves where it does not.

    From :func:`love_reduction_bounds`, the variance lies in ``[k** - upper, k** - lower]``; its middle is kept
    when the half-width is at most ``love_tol`` times the lower end (so its relative error is at most
    ``love_tol``). Otherwise the rank is doubled, from ``love_rank`` up to ``love_max_rank``, while some open test
    point's interval, shrinking by the factor the last doubling gave, could still meet the tolerance by the cap.
    The test points left are solved by preconditioned CG, ``k** - kx*^T A^{-1} kx*`` to CG's ``tol``, with a
    :class:`ConvergenceWarning` naming the worst relative bound, the rank reached and the options to change,
    and how many had a reduction whose interval reached above the prior variance ``k**``. A solved variance
    ``<= 0`` (rounding) is set to 0 with a warning.

    Args:
        op: the operator ``A = K + shift I``.
        x_test: (L, features...) test inputs.
        k_test_test: (L,) prior variances ``k(x*, x*)``.
        options: a :class:`CG` (``love_rank``, ``love_tol``, ``love_max_rank``, and ``tol``, ``max_iter`` for the
            solves); ``None``: ``CG(variance='love')``.
        precond: the :class:`PivotedCholesky` of the same operator (``None``: none).

    Returns:
        ``(variance, info)``: (L,) variances and a :class:`LoveInfo`.
    """
    options = CG(variance="love") if options is None else options
    x_test = jnp.asarray(x_test)
    kxx = np.asarray(k_test_test, np.float64).reshape(-1)
    count = x_test.shape[0]
    if kxx.shape[0] != count:
        raise ValueError(f"love_variances: k_test_test must have shape ({count},), got {np.shape(k_test_test)}")
    tol = float(options.love_tol)
    cap = min(op.n, options.love_max_rank if options.love_max_rank is not None else 4 * options.love_rank)
    rank = min(options.love_rank, cap)
    var = np.full(count, np.nan)
    bound = np.full(count, np.inf)  # certified relative error bound per test point (inf: none)
    open_ = np.arange(count)
    cache = _LoveCache(op, x_test, precond)

    def certify(b):
        """Keep the middles of the open points' certified variance intervals that meet ``tol``; return what is
        left open, with the width and the upper end of each open interval."""
        ell, up = np.asarray(b.lower, np.float64), np.asarray(b.upper, np.float64)
        hi, lo = kxx[open_] - ell, kxx[open_] - up  # the variance lies in [lo, hi]
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.where(lo > 0, 0.5 * (hi - lo) / np.where(lo > 0, lo, 1.0), np.inf)
        rel = np.where(np.isfinite(rel), rel, np.inf)
        ok = rel <= tol
        var[open_[ok]] = 0.5 * (hi + lo)[ok]
        bound[open_] = np.minimum(bound[open_], rel)
        return open_[~ok], (up - ell)[~ok], hi[~ok]

    prev_gap = None
    while True:
        cache.grow(rank)
        kept_open = open_
        open_, gap, hi = certify(cache.bounds(x_test[open_]))
        if not open_.size or cache.exhausted or cache.rank >= cap:
            break
        if prev_gap is not None:  # grow on only if some open point's gap, shrinking as it just did, could pass
            prev_gap = prev_gap[np.isin(kept_open, open_)]
            shrink = prev_gap / np.where(gap > 0, gap, np.inf)
            need = gap / np.maximum(2 * tol * hi, 1e-300)
            doublings = math.ceil(math.log2(cap / cache.rank))
            with np.errstate(over="ignore", invalid="ignore"):
                if not np.any((hi > 0) & (shrink > 1) & (shrink**doublings >= need)):
                    break
        prev_gap = gap
        rank = min(2 * cache.rank, cap)
    if open_.size and cache.c_low > 0:  # one product with each open residual: the Cauchy-Schwarz lower bound
        open_, _, _ = certify(cache.bounds(x_test[open_], curvature=True))
    solve_info = None
    kept = np.setdiff1d(np.arange(count), open_)
    finite = bound[kept]  # the certified bounds of the LOVE variances kept
    if open_.size:
        over_prior = int(np.sum(np.isinf(bound[open_])))
        warnings.warn(
            f"LOVE: at Lanczos rank {cache.rank} (love_rank {options.love_rank}, love_max_rank {cap}) the certified "
            f"bound on the variance's relative error stays above love_tol {tol:.3g} at {open_.size} of {count} test "
            f"points (bounds {np.min(bound[open_]):.3g} to {np.max(bound[open_]):.3g}; inf where the interval of "
            f"the reduction k*x A^-1 kx* reaches above the prior variance k(x*, x*), at {over_prior} of them); their "
            "variances are taken from CG solves. Raise precond_rank (the Krylov space converges as the "
            "preconditioner nears the operator) or love_max_rank, or use CG(variance='solve')",
            ConvergenceWarning, stacklevel=3)
        kc = _cross_columns(op.fn, op.n, op.params, op.blocks, x_test[open_]).astype(op.dtype)
        v, solve_info = cg(op, kc, precond=precond, tol=options.tolerance(op.dtype), max_iter=options.max_iter)
        solved = kxx[open_] - np.asarray(jnp.sum(kc * v, axis=0), np.float64)
        bad = int(np.sum(solved <= 0))
        if bad:
            warnings.warn(f"LOVE: the CG-solved variance k** - kx*^T A^-1 kx* is <= 0 at {bad} of {open_.size} test "
                          "points (the reduction reaches the prior variance: rounding, or a near-singular kernel); set "
                          "to 0 there", ConvergenceWarning, stacklevel=3)
        var[open_] = np.clip(solved, 0.0, None)
    info = LoveInfo(cache.rank, float(np.max(finite)) if finite.size else 0.0, int(open_.size), solve_info)
    return jnp.asarray(var, op.dtype), info


# --------------------------------------------------------------------------------------------
# Preconditioner


class PivotedCholesky(NamedTuple):
    """``P = F F^T + shift I`` from a rank-r pivoted Cholesky factor ``F`` (held transposed, ``Ft``: (r, N)).

    ``F F^T = U diag(lam) U^T`` with ``U`` (N, r) orthonormal (a QR of ``F`` and an r x r eigendecomposition), so
    that ``P^{-1} v = U (U^T v / (lam + shift)) + (v - U U^T v) / shift`` never solves with the ill-conditioned
    ``shift I + F^T F`` (which float32 cannot). Directions with ``lam`` below rounding are dropped (their column of
    ``U`` and ``lam`` are zero). ``trace_error`` is ``tr(K - F F^T)``, what the factor leaves out; ``pivots`` the
    rows chosen.
    """

    Ft: jax.Array
    U: jax.Array
    lam: jax.Array
    shift: float
    trace_error: float
    pivots: jax.Array

    def solve(self, v) -> jax.Array:
        """``P^{-1} v``, ``v`` of shape (N, m)."""
        return _precond_solve(self.U, self.lam, self.shift, v)

    def logdet(self) -> float:
        """``log|P| = N log(shift) + sum log(1 + lam / shift)``."""
        n = self.U.shape[0]
        return float(n * math.log(self.shift) + jnp.sum(jnp.log1p(self.lam / self.shift)))

    def sample(self, key, m: int) -> jax.Array:
        """``m`` draws of ``z ~ N(0, P)``, (N, m): ``U (sqrt(lam) e1) + sqrt(shift) e2``."""
        n, r = self.U.shape
        k1, k2 = jax.random.split(key)
        e1 = jax.random.normal(k1, (r, m), self.U.dtype)
        e2 = jax.random.normal(k2, (n, m), self.U.dtype)
        return self.U @ (jnp.sqrt(self.lam)[:, None] * e1) + math.sqrt(self.shift) * e2

    def _pcg_args(self, dtype):
        return "low-rank", (self.U.astype(dtype), self.lam.astype(dtype), jnp.asarray(self.shift, dtype))


class DenseCholesky(NamedTuple):
    """``P = L L^T`` from a dense Cholesky factor held in a lower precision than the solve (the mixed-precision
    path: ``L`` is the float32 factor of the float64 ``K + noise I``, with ``jitter`` added where float32 needed
    it). Solves run in ``L``'s precision on each column scaled to unit size, so CG in float64 sees ``P^{-1}`` to
    float32 rounding; as CG measures its residual with exact (float64) products, that rounding costs iterations,
    not accuracy.
    """

    L: jax.Array
    jitter: float

    def solve(self, v) -> jax.Array:
        """``P^{-1} v``, ``v`` of shape (N, m), in ``v``'s dtype."""
        return _cholesky_precond_solve(self.L, v)

    def logdet(self) -> float:
        """``log|P| = 2 sum log L_ii``, summed in float64 where enabled."""
        d = jnp.diagonal(self.L).astype(jnp.result_type(float))
        return float(2.0 * jnp.sum(jnp.log(d)))

    def sample(self, key, m: int) -> jax.Array:
        """``m`` draws of ``z = L e ~ N(0, P)``, (N, m), in ``L``'s dtype."""
        e = jax.random.normal(key, (self.L.shape[0], m), self.L.dtype)
        return _lower_times(self.L, e)

    def _pcg_args(self, dtype):
        return "cholesky", (self.L,)


@_highest
@jax.jit
def _lower_times(L, e):
    return L @ e


def _cholesky_precond_solve(L, v):
    """``(L L^T)^{-1} v`` in ``L``'s precision, each column scaled to unit max first (no float32 underflow)."""
    scale = jnp.max(jnp.abs(v), axis=0, keepdims=True)
    safe = jnp.where(scale > 0, scale, 1.0)
    return linalg.cho_solve(L, (v / safe).astype(L.dtype)).astype(v.dtype) * safe


def _apply_precond(kind, args, v):
    if kind == "cholesky":
        return _cholesky_precond_solve(args[0], v)
    return _precond_solve(*args, v)


def _precond_solve(U, lam, shift, v):
    if U.shape[1] == 0:
        return v / shift
    c = U.T @ v
    return U @ (c / (lam + shift)[:, None]) + (v - U @ c) / shift


def _half_solve(U, lam, shift, v):
    """``P^{-1/2} v`` in the same basis."""
    if U.shape[1] == 0:
        return v / jnp.sqrt(shift)
    c = U.T @ v
    return U @ (c / jnp.sqrt(lam + shift)[:, None]) + (v - U @ c) / jnp.sqrt(shift)


@_highest
@jax.jit
def _basis(Ft):
    """``U``, ``lam`` with ``Ft^T Ft = U diag(lam) U^T``, ``U`` orthonormal; directions below rounding dropped."""
    Q, R = jnp.linalg.qr(Ft.T)
    lam, W = jnp.linalg.eigh(R @ R.T)
    keep = lam > 1e2 * jnp.finfo(Ft.dtype).eps * jnp.max(lam) * Ft.shape[0]
    return jnp.where(keep, Q @ W, 0.0), jnp.where(keep, lam, 0.0)


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _pivoted_cholesky(fn, n, rank, params, blocks, diag):
    dtype = diag.dtype
    flat = blocks.reshape((-1,) + blocks.shape[2:])
    scale = jnp.sum(diag)

    def body(m, carry):
        Ft, d, piv = carry
        p = jnp.argmax(d).astype(jnp.int32)
        dp = d[p]
        row = _row_traced(fn, n, params, blocks, flat[p]).astype(dtype)
        ok = dp > 1e3 * jnp.finfo(dtype).eps * scale / n  # numerically exhausted: the rest of the factor is zero
        new = jnp.where(ok, (row - Ft[:, p] @ Ft) / jnp.sqrt(jnp.where(ok, dp, 1.0)), 0.0)
        Ft = Ft.at[m].set(new)
        d = jnp.clip(d - new**2, 0.0, None).at[p].set(0.0)
        return Ft, d, piv.at[m].set(p)

    Ft, d, piv = lax.fori_loop(0, rank, body, (jnp.zeros((rank, n), dtype), diag, jnp.zeros(rank, jnp.int32)))
    return Ft, jnp.sum(d), piv


def pivoted_cholesky(op: KernelOperator, rank: int) -> PivotedCholesky:
    """Greedy rank-``rank`` pivoted Cholesky of ``k(X, X)`` and the preconditioner ``P = F F^T + shift I``.

    At each step the point with the largest remaining diagonal ``d_p`` is pivoted; its kernel row ``k(x_p, X)``
    (one row, by column tiles) gives the new column ``(k(x_p, X) - F F[p]^T) / sqrt(d_p)``. Cost: ``rank`` kernel
    rows and O(N rank^2) flops; memory (rank, N).

    Args:
        op: the operator (its ``shift`` must be positive: the preconditioner is ``F F^T + shift I``).
        rank: number of pivots, ``0 <= rank`` (capped at N).

    Returns:
        :class:`PivotedCholesky`.

    Raises:
        ValueError: if ``op.shift`` is not positive or ``rank`` is negative.
    """
    if not op.shift > 0:
        raise ValueError("pivoted_cholesky: the preconditioner F F^T + shift I needs shift > 0 (the noise)")
    if rank < 0:
        raise ValueError(f"pivoted_cholesky: rank must be >= 0, got {rank}")
    rank = min(int(rank), op.n)
    diag = op.diag() - op.shift
    if rank == 0:
        return PivotedCholesky(jnp.zeros((0, op.n), diag.dtype), jnp.zeros((op.n, 0), diag.dtype),
                               jnp.zeros(0, diag.dtype), op.shift, float(jnp.sum(diag)), jnp.zeros(0, jnp.int32))
    Ft, err, piv = _pivoted_cholesky(op.fn, op.n, rank, op.params, op.blocks, diag)
    U, lam = _basis(Ft)
    return PivotedCholesky(Ft, U, lam, op.shift, float(err), piv)


# --------------------------------------------------------------------------------------------
# Conjugate gradients on many right-hand sides, with the Lanczos coefficients


@_highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _pcg(fn, mesh, n, max_iter, pkind, params, blocks, shift, pargs, B, tol):
    def matmul(v):
        return _matmul_traced(fn, mesh, n, params, blocks, v, shift)

    def precond(v):
        return _apply_precond(pkind, pargs, v)

    m = B.shape[1]
    bnorm = jnp.linalg.norm(B, axis=0)
    safe_b = jnp.where(bnorm > 0, bnorm, 1.0)
    Z = precond(B)
    rz = jnp.sum(B * Z, axis=0)
    done = bnorm == 0
    zeros_hist = jnp.zeros((max_iter, m), B.dtype)
    init = (0, jnp.zeros_like(B), B, Z, rz, done, jnp.zeros(m, jnp.int32), jnp.where(done, 0.0, 1.0),
            zeros_hist, zeros_hist)

    def cond(state):
        k, *_, done, _, _, _, _ = state
        return (k < max_iter) & ~jnp.all(done)

    def body(state):
        k, X, R, P, rz, done, iters, res, alphas, betas = state
        AP = matmul(P)
        pap = jnp.sum(P * AP, axis=0)
        alpha = jnp.where(done | (pap <= 0), 0.0, rz / jnp.where(pap > 0, pap, 1.0))
        X = X + alpha[None, :] * P
        R = R - alpha[None, :] * AP
        Z = precond(R)
        rz_new = jnp.sum(R * Z, axis=0)
        beta = jnp.where(done, 0.0, rz_new / jnp.where(rz > 0, rz, 1.0))
        res_new = jnp.linalg.norm(R, axis=0) / safe_b
        alphas = alphas.at[k].set(alpha)
        betas = betas.at[k].set(beta)
        iters = jnp.where(done, iters, k + 1)
        res = jnp.where(done, res, res_new)
        done = done | (res_new <= tol) | (pap <= 0)
        return k + 1, X, R, Z + beta[None, :] * P, rz_new, done, iters, res, alphas, betas

    _, X, _, _, _, _, iters, res, alphas, betas = lax.while_loop(cond, body, init)
    return X, iters, res, alphas, betas, rz  # rz: r0^T P^-1 r0 per column, the probes' |w|^2


def cg(op: KernelOperator, B, *, precond: PivotedCholesky | DenseCholesky | None = None, tol: float = 1e-6,
       max_iter: int = 1000) -> tuple[jax.Array, SolveInfo]:
    """Solve ``A X = B`` by preconditioned conjugate gradients, all columns in one run.

    Args:
        op: the operator ``A = K + shift I`` (positive definite: ``shift > 0``, or ``K`` itself positive definite).
        B: right-hand sides, (N,) or (N, m).
        precond: a :class:`PivotedCholesky` or :class:`DenseCholesky` of the same operator (``None``: plain CG).
        tol: relative residual ``|b - A x| / |b|`` at which a column stops.
        max_iter: most iterations.

    Returns:
        ``(X, info)``: the solution (shape of ``B``) and a :class:`SolveInfo`. It warns
        (:class:`ConvergenceWarning`) when a column stops at ``max_iter`` above ``tol``.

    Raises:
        ValueError: if ``B`` does not have N rows or has non-finite entries, ``tol`` is not positive or
            ``max_iter < 1``.
    """
    B = jnp.asarray(B)
    vec = B.ndim == 1
    B2 = B[:, None] if vec else B
    X, info, *_ = _run_pcg(op, B2, precond, tol, max_iter, what="solve")
    return (X[:, 0] if vec else X), info


def _check_solve_args(op, B, tol, max_iter):
    if B.ndim != 2 or B.shape[0] != op.n:
        raise ValueError(f"cg: right-hand sides must have shape ({op.n},) or ({op.n}, m), got {B.shape}")
    check_finite(B, "right-hand sides", "cg")
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"cg: tol must be a positive finite number, got {tol!r}")
    if not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"cg: max_iter must be a positive integer, got {max_iter!r}")


def _run_pcg(op, B, precond, tol, max_iter, *, what, check_cols=None):
    _check_solve_args(op, B, tol, max_iter)
    dtype = op.dtype
    B = B.astype(dtype)
    if precond is None:  # P = I: plain CG
        pkind, pargs = "low-rank", (jnp.zeros((op.n, 0), dtype), jnp.zeros(0, dtype), jnp.asarray(1.0, dtype))
    else:
        pn = (precond.L if isinstance(precond, DenseCholesky) else precond.U).shape[0]
        if pn != op.n:
            raise ValueError(f"cg: the preconditioner is for N = {pn}, the operator has N = {op.n}")
        pkind, pargs = precond._pcg_args(dtype)
    X, iters, res, alphas, betas, rz0 = _pcg(op.fn, op.mesh, op.n, int(max_iter), pkind, op.params, op.blocks,
                                             jnp.asarray(op.shift, dtype), pargs, B, jnp.asarray(tol, dtype))
    cols = slice(None) if check_cols is None else check_cols
    worst = float(jnp.max(res[cols])) if res[cols].size else 0.0
    info = SolveInfo(int(jnp.max(iters[cols])) if iters[cols].size else 0, worst, worst <= tol, float(tol))
    if not info.converged:
        warnings.warn(f"{what}: conjugate gradients stopped after {max_iter} iterations at relative residual "
                      f"{worst:.3g} > tol {tol:.3g}; raise max_iter or precond_rank", ConvergenceWarning,
                      stacklevel=3)
    return X, info, iters, alphas, betas, rz0


def _slq(iters, alphas, betas, rz0):
    """``|w|^2 e1^T log(T) e1`` per probe, from CG's coefficients (host side, small matrices)."""
    iters = np.asarray(iters)
    alphas, betas, rz0 = np.asarray(alphas, float), np.asarray(betas, float), np.asarray(rz0, float)
    out = np.empty(iters.shape[0])
    for i, k in enumerate(iters):
        k = int(k)
        bad = np.nonzero(~(np.isfinite(alphas[:k, i]) & (alphas[:k, i] > 0) & np.isfinite(betas[:k, i])))[0]
        k = int(bad[0]) if bad.size else k  # a breakdown (rounding in float32) ends the tridiagonal there
        if k == 0:
            out[i] = 0.0
            continue
        a, b = alphas[:k, i], betas[:k, i]
        diag = 1.0 / a
        diag[1:] += b[:-1] / a[:-1]
        off = np.sqrt(np.clip(b[:-1], 0.0, None)) / a[:-1]
        # LAPACK's tridiagonal solver: O(k^2), and no BLAS threads (a dense eigh of the same k x k matrix took
        # 0.1-0.8 s on a busy 2-core CPU, OpenBLAS's threads contending with XLA's: most of a whole solve)
        theta, U = eigh_tridiagonal(diag, off)
        out[i] = rz0[i] * np.sum(U[0] ** 2 * np.log(np.clip(theta, 1e-300, None)))
    return out


def solve(op: KernelOperator, Y, options: CG = CG(), *, logdet: bool = True,
          precond: PivotedCholesky | DenseCholesky | None = None):
    """``A^{-1} Y`` and, optionally, a stochastic ``log|A|``: the fit of a matrix-free posterior.

    One CG run solves for ``Y`` and the ``num_probes`` probes together; the preconditioner is a pivoted
    Cholesky of rank ``options.precond_rank`` unless one is given (the mixed-precision path passes its float32
    factor).

    Args:
        op: the operator ``A = K + shift I`` with ``shift > 0`` (``shift >= 0`` with a ``DenseCholesky``).
        Y: (N, C) right-hand sides.
        options: a :class:`CG`.
        logdet: whether to estimate ``log|A|`` (adds ``num_probes`` columns to the run).
        precond: the preconditioner (``None``: a pivoted Cholesky of rank ``options.precond_rank``).

    Returns:
        ``(alpha, info, estimate, precond)``: ``A^{-1} Y`` (N, C), the :class:`SolveInfo` of the ``Y`` columns,
        a :class:`LogdetEstimate` (``None`` without ``logdet``) and the preconditioner used.

    Raises:
        ValueError: if ``op.shift`` is not positive (without a dense preconditioner) or ``Y`` does not match the
            operator.
    """
    if not (op.shift > 0 or isinstance(precond, DenseCholesky)):
        raise ValueError("the matrix-free path needs noise > 0: CG and its preconditioner solve K + noise I")
    Y = jnp.asarray(Y, op.dtype)
    if Y.ndim != 2 or Y.shape[0] != op.n:
        raise ValueError(f"solve: Y must have shape ({op.n}, C), got {Y.shape}")
    X, info, estimate, pc, _ = _solve_with_probes(op, Y, options, logdet, precond)
    return X[:, :Y.shape[1]], info, estimate, pc


def _solve_with_probes(op, Y, options, logdet, precond):
    """:func:`solve`'s run; also returns the probes ``Z`` (the last columns of ``X`` are ``A^{-1} Z``)."""
    pc = pivoted_cholesky(op, options.precond_rank) if precond is None else precond
    tol = options.tolerance(op.dtype)
    c = Y.shape[1]
    B, probes = Y, None
    if logdet:
        probes = pc.sample(jax.random.PRNGKey(options.seed), options.num_probes).astype(op.dtype)
        B = jnp.concatenate([Y, probes], axis=1)
    X, info, iters, alphas, betas, rz0 = _run_pcg(op, B, pc, tol, options.max_iter, what="matrix-free solve",
                                                  check_cols=slice(0, c))
    estimate = None
    if logdet:
        per_probe = _slq(iters[c:], alphas[:, c:], betas[:, c:], rz0[c:])
        ld_p = pc.logdet()
        t = per_probe.shape[0]
        estimate = LogdetEstimate(float(ld_p + per_probe.mean()), float(per_probe.std(ddof=1) / math.sqrt(t)), t,
                                  int(np.max(np.asarray(iters[c:]))), ld_p)
    return X, info, estimate, pc, probes


class MarginalTerms(NamedTuple):
    """What a Gaussian-family log marginal likelihood needs from ``A = K + shift I``, and what its gradient needs.

    ``q = tr(Y^T A^{-1} Y)``, ``logdet`` (a :class:`LogdetEstimate`), ``info`` (the :class:`SolveInfo` of the
    ``Y`` columns), ``alpha = A^{-1} Y``, and per probe ``z_i ~ N(0, P)``: the columns of ``u`` are
    ``u_i = A^{-1} z_i`` and those of ``w`` are ``w_i = P^{-1} z_i``, so that ``E[u_i^T M w_i] = tr(A^{-1} M)``
    for any matrix ``M`` (Gardner et al. 2018).
    """

    q: jax.Array
    logdet: LogdetEstimate
    info: SolveInfo
    alpha: jax.Array
    u: jax.Array
    w: jax.Array


def marginal_terms(op: KernelOperator, Y, options: CG = CG(), *, precond=None) -> MarginalTerms:
    """``q = tr(Y^T A^{-1} Y)`` and ``log|A|`` from one CG run, keeping what :func:`marginal_terms_grad` needs.

    Args:
        op: the operator ``A = K + shift I``.
        Y: (N, C) targets.
        options: a :class:`CG` (its ``num_probes`` probes serve the log-determinant and the trace estimates).
        precond: the preconditioner (``None``: a pivoted Cholesky of rank ``options.precond_rank``).

    Returns:
        :class:`MarginalTerms`.
    """
    Y = jnp.asarray(Y, op.dtype)
    if Y.ndim != 2 or Y.shape[0] != op.n:
        raise ValueError(f"marginal_terms: Y must have shape ({op.n}, C), got {Y.shape}")
    X, info, est, pc, Z = _solve_with_probes(op, Y, options, True, precond)
    c = Y.shape[1]
    alpha, u = X[:, :c], X[:, c:]
    return MarginalTerms(jnp.sum(Y * alpha), est, info, alpha, u, pc.solve(Z).astype(op.dtype))


def marginal_terms_grad(op: KernelOperator, terms: MarginalTerms, g_q, g_logdet):
    """The gradient of ``f(q, log|A|)`` with respect to the kernel's hyperparameters and the shift, given
    ``g_q = df/dq`` and ``g_logdet = df/dlog|A|`` (BBMM, Gardner et al. 2018).

    ``dq/dtheta = -alpha^T K' alpha`` exactly (to CG's tolerance); ``dlog|A|/dtheta = tr(A^{-1} K')`` by the
    probes, ``mean_i u_i^T K' w_i`` (unbiased; its spread is that of the log-determinant's probes). Both go
    through one tiled pass, :meth:`KernelOperator.bilinear_grad`; ``K' = I`` for the shift.

    Args:
        op: the operator ``A = K + shift I`` the terms were computed for.
        terms: its :class:`MarginalTerms`.
        g_q: ``df/dq``.
        g_logdet: ``df/dlog|A|``.

    Returns:
        ``(d_theta, d_shift)``: a pytree like the kernel's hyperparameters, and a scalar.
    """
    m = terms.u.shape[1]
    g_q, g_logdet = jnp.asarray(g_q, op.dtype), jnp.asarray(g_logdet, op.dtype)
    A = jnp.concatenate([-g_q * terms.alpha, (g_logdet / m) * terms.u], axis=1)
    B = jnp.concatenate([terms.alpha, terms.w], axis=1)
    d_shift = -g_q * jnp.sum(terms.alpha**2) + (g_logdet / m) * jnp.sum(terms.u * terms.w)
    return op.bilinear_grad(A, B), d_shift
