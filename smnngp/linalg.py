"""Dense linear algebra for kernel matrices: one Cholesky helper, solves, log-determinants.

Every posterior in the project factorises its kernel through :func:`cholesky`.
It adds jitter only when the plain factorisation fails, escalating it by
factors of ten relative to the mean diagonal, and reports the jitter it needed
so that callers can surface it (a GP silently fitted with 1e-2 jitter is a bug
report waiting to happen).  Non-finite input raises at once.

:func:`cholesky` is an eager (host-checking) function: it inspects the factor
for NaNs to decide whether to retry.  Inside ``jit``/``grad`` (hyperparameter
fitting) use :func:`cholesky_jittered`, which adds a fixed relative jitter and
never inspects values.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

__all__ = [
    "Cholesky",
    "NotPositiveDefiniteError",
    "cholesky",
    "cholesky_jittered",
    "blocked_cholesky",
    "cholesky_block_size",
    "escalate_jitter",
    "whiten",
    "cho_solve",
    "solve_triangular",
    "logdet",
    "eigh_psd",
    "clip_psd_eigenvalues",
    "check_square",
    "blas_threads",
]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """Raised when no jitter up to the limit makes a matrix numerically positive definite."""


class Cholesky(NamedTuple):
    """Lower Cholesky factor ``L`` of ``A + jitter * I`` (``jitter`` is absolute)."""

    L: jax.Array
    jitter: float


def check_square(A, name: str = "matrix") -> jax.Array:
    """Check that ``A`` is a non-empty square 2-D matrix.

    Args:
        A: array-like to check; it is converted with ``jnp.asarray``.
        name: how the matrix is called in error messages.

    Returns:
        ``A`` as a JAX array, unchanged otherwise.

    Raises:
        ValueError: if ``A`` is not 2-D, not square, or has zero rows.
    """
    A = jnp.asarray(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{name} must be a square 2-D matrix, got shape {A.shape}")
    if A.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {A.shape})")
    return A


def _shifted(A, shift):
    return A + shift * jnp.eye(A.shape[0], dtype=A.dtype)


def _chol(A, shift, jitter):
    # A + (shift + jitter) I in one pass, its lower triangle factorised (blocked: at large N in its own buffer)
    L = blocked_cholesky(_shifted(A, shift + jitter))
    return L, jnp.all(jnp.isfinite(jnp.diagonal(L)))


_chol_jit = jax.jit(_chol)


@jax.jit
def _input_stats(A, shift):
    """For ``C = A + shift I``, from A and its diagonal (a fused select of the diagonal is ~5x slower on CPU):
    all entries finite, max |C| (NaN when it cannot be had this way: see below) and mean diagonal."""
    a_diag = jnp.diagonal(A)
    c_diag = a_diag + shift
    finite = jnp.all(jnp.isfinite(A)) & jnp.all(jnp.isfinite(c_diag))
    # |a_ii + shift| >= |a_ii| when a_ii >= 0 and shift >= 0 (rounding is monotone), so then
    # max |C| = max(max |A|, max |diag C|); otherwise the caller forms it (_max_abs_shifted)
    exact = (shift == 0) | ((shift > 0) & jnp.all(a_diag >= 0))
    scale = jnp.where(exact, jnp.maximum(jnp.max(jnp.abs(A)), jnp.max(jnp.abs(c_diag))), jnp.nan)
    return finite, scale, jnp.mean(c_diag)


@jax.jit
def _max_abs_shifted(A, shift):
    return jnp.max(jnp.abs(_shifted(A, shift)))


@jax.jit
def _max_asymmetry_jit(A):
    return jnp.max(jnp.abs(A - A.T))


def _max_asymmetry(A) -> float:
    """``max |A - A^T|`` (the same for ``A + shift I``).

    For a matrix in host memory this is done in NumPy, one block of rows
    against the matching block of columns (upper triangle only): about five
    times faster than XLA's fused transpose on CPU, with the same value.
    """
    if isinstance(A, np.ndarray) or all(d.platform == "cpu" for d in A.devices()):
        a = np.asarray(A)
        n, block, worst = a.shape[0], 128, 0.0
        for i in range(0, n, block):
            worst = max(worst, float(np.max(np.abs(a[i : i + block, i:] - a[i:, i : i + block].T))))
        return worst
    return float(_max_asymmetry_jit(A))


def cholesky(
    A,
    *,
    name: str = "kernel matrix",
    max_relative_jitter: float = 1e-2,
    check_symmetric: bool = True,
) -> Cholesky:
    """Cholesky factor of a symmetric PSD matrix, with jitter escalation.

    Tries ``A`` as given, then ``A + j I`` with ``j = 10^k * eps * mean(diag A)``
    for ``k = 0, 1, ...`` (``eps`` the dtype's machine epsilon, times 10 for
    float64's first step) until the factor is finite or ``j`` would exceed
    ``max_relative_jitter * mean(diag A)``; then raises
    :class:`NotPositiveDefiniteError` naming the matrix and the smallest
    eigenvalue.

    This function inspects values on the host and cannot be traced; under ``jit``/``grad`` use
    :func:`cholesky_jittered`.

    Args:
        A: symmetric positive (semi-)definite matrix of shape (N, N); integer input is cast to the default
            floating dtype.
        name: how the matrix is called in error messages.
        max_relative_jitter: largest jitter tried, relative to the mean diagonal of ``A``.
        check_symmetric: if true (default), raise when ``max |A - A^T|`` exceeds ``1e3 * eps`` times the
            largest absolute entry.

    Returns:
        :class:`Cholesky` with the lower factor ``L`` and the absolute ``jitter`` that was added (0.0 when the
        plain factorisation succeeded).

    Raises:
        ValueError: if ``A`` is not a non-empty square matrix, contains NaN or infinite entries, or (with
            ``check_symmetric``) is not symmetric.
        NotPositiveDefiniteError: if the mean diagonal is not positive, or no jitter up to the limit gives a
            finite factor.
    """
    return _shifted_cholesky(A, 0.0, name=name, max_relative_jitter=max_relative_jitter,
                             check_symmetric=check_symmetric)


def _shifted_cholesky(A, shift: float, *, name: str = "kernel matrix", max_relative_jitter: float = 1e-2,
                      check_symmetric: bool = True) -> Cholesky:
    """:func:`cholesky` of ``A + shift I``, without materialising that sum (an extra N^2 pass and copy)."""
    A = check_square(A, name)
    if not jnp.issubdtype(A.dtype, jnp.floating):
        A = A.astype(jnp.result_type(float))
    shift = jnp.asarray(shift, A.dtype)
    finite, scale, mean_diag = _input_stats(A, shift)
    if not bool(finite):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if check_symmetric:
        scale, asym = float(scale), _max_asymmetry(A)
        if scale != scale:  # NaN: a negative diagonal entry with a shift
            scale = float(_max_abs_shifted(A, shift))
        tol = 1e3 * float(jnp.finfo(A.dtype).eps) * max(scale, 1e-300)
        if asym > tol:
            raise ValueError(f"{name} is not symmetric (max |A - A^T| = {asym:.3g}, scale {scale:.3g})")
    mean_diag = float(mean_diag)
    if not mean_diag > 0:
        raise NotPositiveDefiniteError(f"{name} has non-positive mean diagonal {mean_diag:.3g}")
    return escalate_jitter(lambda jitter: _chol_jit(A, shift, jnp.asarray(jitter, A.dtype)), mean_diag, A.dtype,
                           name=f"{name} ({A.shape[0]}x{A.shape[0]}, {A.dtype})",
                           max_relative_jitter=max_relative_jitter,
                           smallest_eigenvalue=lambda: float(jnp.linalg.eigvalsh(_shifted(A, shift))[0]))


def escalate_jitter(factor, mean_diag: float, dtype, *, name: str, max_relative_jitter: float = 1e-2,
                    smallest_eigenvalue=None) -> Cholesky:
    """The jitter escalation of :func:`cholesky` around any factorisation ``factor(jitter) -> (L, ok)``.

    Tries ``jitter = 0``, then ``10 eps mean_diag`` and ten times more at each step, until ``ok`` or the jitter would
    exceed ``max_relative_jitter * mean_diag``. The dense posterior's in-place path uses it with a ``factor`` that
    rebuilds the kernel into the buffer each try (a failed in-place factorisation has overwritten it).

    Args:
        factor: ``factor(jitter)`` returns the factor of the matrix plus ``jitter I`` and whether it is finite.
        mean_diag: mean diagonal of the matrix (positive).
        dtype: its dtype (for the machine epsilon).
        name: how the matrix is called in the error message.
        max_relative_jitter: largest jitter tried, relative to ``mean_diag``.
        smallest_eigenvalue: optional ``() -> float`` reported in the error (skipped when ``None``).

    Returns:
        :class:`Cholesky` with the factor and the absolute jitter it needed.

    Raises:
        NotPositiveDefiniteError: when no jitter up to the limit gives a finite factor.
    """
    eps = float(jnp.finfo(dtype).eps)
    jitter = 0.0
    while True:
        L, ok = factor(jitter)
        if bool(ok):
            return Cholesky(L, jitter)
        del L, ok  # a failed factor is garbage: its N x N buffer goes before the next try builds another
        jitter = (10 * eps * mean_diag) if jitter == 0.0 else jitter * 10
        if jitter > max_relative_jitter * mean_diag:
            lam = "" if smallest_eigenvalue is None else f": smallest eigenvalue {smallest_eigenvalue():.3g}"
            raise NotPositiveDefiniteError(
                f"{name} is not positive definite{lam}; jitter up to {max_relative_jitter:g} x mean diagonal "
                f"({mean_diag:.3g}) did not help"
            )


def cholesky_block_size(n: int, platform: str | None = None) -> int:
    """Column block of :func:`blocked_cholesky` for an (n, n) matrix.

    On a CPU: the whole matrix below 8,192 rows (one LAPACK call), else about n / 16 rounded up to a multiple of
    256, so that the temporaries (a panel of ``n x b`` and a few ``b x b`` tiles) stay small and the program
    (unrolled over the blocks) small; measured there, build + factorisation then plan 1.18 matrices instead of 2-3
    (XLA's plan, jaxlib 0.10 and 0.12), at the speed of LAPACK's own (single-threaded CPU time at n = 8,192). On an
    accelerator: the whole matrix (one cuSOLVER call). There the blocked program (before its trailing update became
    a loop of tiles) measured no leaner on an H100 (XLA's GPU layout assignment adds a transposed copy either way:
    3 matrices at N = 40,000) and it compiled one autotuned GEMM per distinct block shape (a minute for float32 at
    N = 10,000), so the library does not use it there until it is measured again.

    Args:
        n: the matrix's size.
        platform: ``'cpu'``, ``'gpu'``, ... (``None``: the first local device's).

    Returns:
        The block size ``b`` (``b = n``: one factorisation call).
    """
    platform = jax.local_devices()[0].platform if platform is None else platform
    if n < 8192 or platform != "cpu":
        return n
    return int(-(-n // 16 // 256) * 256)


def blocked_cholesky(A, block: int | None = None):
    """Lower Cholesky factor of a symmetric positive definite ``A``, overwriting ``A`` (under ``jit`` with ``A``
    donated, the factor takes the matrix's own buffer: peak memory one matrix plus panels, not two matrices).

    Right-looking by column blocks of ``b``: for each block ``k``, ``L_kk = chol(A_kk)``, the panel below,
    ``L_ik = A_ik L_kk^{-T}`` (a product with the triangular inverse of the b x b block), and the trailing lower
    triangle ``A_ij -= L_ik L_jk^T``, updated tile by tile (``b x b`` tiles on and below the diagonal, in a
    ``lax.fori_loop``: see :func:`_trailing_update`). Only the lower triangle of ``A`` is read; the strict upper
    triangle of the result is zero. Traceable: a matrix that is not positive definite gives NaNs, as
    ``jnp.linalg.cholesky`` does. Every matrix product runs at full precision (no TF32 on a GPU).

    Args:
        A: symmetric positive definite (n, n) matrix (only its lower triangle is used).
        block: column block ``b`` (``None``: :func:`cholesky_block_size`); ``b >= n`` is one factorisation call.

    Returns:
        The lower factor ``L`` with ``L L^T = A``, shape (n, n).
    """
    n = A.shape[0]
    b = min(n, cholesky_block_size(n) if block is None else int(block))
    if b < 1:
        raise ValueError(f"blocked_cholesky: block must be positive, got {block!r}")
    if b >= n:  # one factorisation call (it reads the lower triangle)
        return lax.linalg.cholesky(A, symmetrize_input=False)
    last = None  # the last block's update, P P^T, when the trailing matrix is that block alone
    for k0 in range(0, n, b):
        k1 = min(k0 + b, n)
        # the diagonal block from its lower triangle, transposed: the same symmetric matrix, in the layout LAPACK
        # wants (so XLA does not turn all of A column-major around the call: a full copy on a CPU)
        low = A[k0:k1, k0:k1] if last is None else A[k0:k1, k0:k1] - last
        D = lax.linalg.cholesky((jnp.tril(low) + jnp.tril(low, -1).T).T, symmetrize_input=False)
        A = A.at[k0:k1, k0:k1].set(D)
        if k1 == n:
            break
        d_inv = lax.linalg.triangular_solve(D, jnp.eye(k1 - k0, dtype=A.dtype), left_side=True, lower=True)
        P = jnp.matmul(A[k1:, k0:k1], d_inv.T, precision=lax.Precision.HIGHEST)
        A = A.at[k1:, k0:k1].set(P)
        A = A.at[k0:k1, k1:].set(0.0)
        if n - k1 <= b:
            # The rest is the last diagonal block: its update goes straight into its factorisation, never into A.
            # Written into A, jaxlib 0.12 read the block back as (A before the update) - P P^T and so kept A
            # before the update alive beside the updated one: a full copy (2.12 N^2 instead of 1.18).
            last = jnp.matmul(P, P.T, precision=lax.Precision.HIGHEST)
        else:
            A = _trailing_update(A, P, k1, b)
    return A


def _trailing_update(A, P, k1: int, t: int):
    """``A[k1:, k1:] -= P P^T`` on and below the diagonal, in ``t x t`` tiles, one tile per step of a
    ``lax.fori_loop`` that carries ``A``.

    Each step reads one tile of ``A``, subtracts the product of two ``t``-row slices of the panel ``P`` and writes
    the tile back in place, so the temporaries are a few ``t x t`` tiles whatever the compiler does. The loop is
    what keeps it so: unrolled (one product per row chunk, as this function replaced), the schedule was XLA's to
    choose, and it changed with the compiler. jaxlib 0.10 computed every chunk's product first and held them at once
    (1.63 N^2 for the build + factorisation at N = 2,048, b = N / 16) unless each product was tied to the previous
    chunk's update by a data dependence (1.36 N^2); jaxlib 0.12's simplifier rewrote that tie (an entry of the
    updated matrix) into the entry before the update plus the update, so every update then had to copy the whole
    matrix to leave the older one readable (3.02 N^2). Inside a loop the update's only reader of ``A`` is the
    step itself, and no rewriting can reach across steps.

    The tiles cover rows ``k1 + i t`` and columns ``k1 + j t`` for ``j <= i``; when ``n - k1`` is not a multiple
    of ``t`` the last tile is moved back to end at row (column) ``n`` and its rows (columns) that an earlier tile
    covers are masked out of the product, so that every entry is updated once. The strict upper triangle of
    the diagonal tiles is updated too (garbage there, zeroed when its rows' block is factorised, as the caller
    does).
    """
    n = A.shape[0]
    m = n - k1
    hi = lax.Precision.HIGHEST
    if m <= t:
        raise ValueError(f"_trailing_update: the trailing matrix ({m} rows) is one tile of {t}: the caller folds it "
                         "into the last block's factorisation")
    num = -(-m // t)
    logical = np.arange(num) * t
    physical = np.minimum(logical, m - t)  # the last tile moved back to end at n
    ii, jj = np.tril_indices(num)
    rows, cols = (jnp.asarray(physical[ii], jnp.int32), jnp.asarray(physical[jj], jnp.int32))
    skip_r, skip_c = (jnp.asarray((logical - physical)[ii], jnp.int32),
                      jnp.asarray((logical - physical)[jj], jnp.int32))
    offsets = jnp.arange(t, dtype=jnp.int32)

    def step(p, A):
        r, c = rows[p], cols[p]
        prod = jnp.matmul(lax.dynamic_slice_in_dim(P, r, t), lax.dynamic_slice_in_dim(P, c, t).T, precision=hi)
        keep = (offsets[:, None] >= skip_r[p]) & (offsets[None, :] >= skip_c[p])
        at = (k1 + r, k1 + c)
        tile = lax.dynamic_slice(A, at, (t, t))
        return lax.dynamic_update_slice(A, tile - jnp.where(keep, prod, jnp.zeros((), A.dtype)), at)

    return lax.fori_loop(0, ii.size, step, A)


def cholesky_jittered(A, relative_jitter: float = 1e-10) -> jax.Array:
    """Traceable Cholesky of ``A + relative_jitter * mean(diag A) * I`` (for use under jit/grad).

    Values are never inspected: a matrix that is not positive definite gives a factor with NaNs rather
    than an error.

    Args:
        A: symmetric positive (semi-)definite matrix of shape (N, N).
        relative_jitter: jitter added to the diagonal, relative to the mean diagonal of ``A``.

    Returns:
        Lower-triangular Cholesky factor of the jittered matrix, shape (N, N).
    """
    n = A.shape[0]
    j = relative_jitter * jnp.mean(jnp.diag(A))
    return jnp.linalg.cholesky(A + j * jnp.eye(n, dtype=A.dtype))


@jax.custom_vjp
def whiten(K, B):
    """``L^{-1} B`` with ``L = chol(K)``: the whitening projection of inducing-point models (``K = K_ZZ``,
    ``B = K_ZX``), differentiable in both ``K`` and ``B`` under ``jit`` (no jitter is added here).

    Its reverse-mode rule is written out instead of chaining JAX's Cholesky and triangular-solve rules, which
    form ``dL`` explicitly and spend two more O(M^3) solves and an O(M^3) product. With ``A = L^{-1} B`` and the
    cotangent ``Abar``: ``dA = L^{-1} dB - Phi(L^{-1} dK L^{-T}) A`` (Murray 2016, "Differentiation of the
    Cholesky decomposition", eq. 9: ``L^{-1} dL = Phi(L^{-1} dK L^{-T})``, ``Phi`` = lower triangle with half
    the diagonal), hence ``Bbar = L^{-T} Abar`` and ``Kbar = -sym(L^{-T} Phi(Abar A^T) L^{-1})``: two O(M^2 B)
    and two O(M^3) triangular solves in all.
    """
    return _whiten_fwd(K, B)[0]


def _whiten_fwd(K, B):
    L = jnp.linalg.cholesky(K, symmetrize_input=False)
    A = jsl.solve_triangular(L, B, lower=True)
    return A, (L, A)


def _whiten_bwd(res, A_bar):
    L, A = res
    B_bar = jsl.solve_triangular(L, A_bar, lower=True, trans=1)
    G = A_bar @ A.T
    phi = jnp.tril(G) - 0.5 * jnp.diag(jnp.diag(G))
    Y = jsl.solve_triangular(L, phi, lower=True, trans=1)  # L^{-T} Phi
    P = jsl.solve_triangular(L, Y.T, lower=True, trans=1).T  # L^{-T} Phi L^{-1}
    return -0.5 * (P + P.T), B_bar


whiten.defvjp(_whiten_fwd, _whiten_bwd)


def solve_triangular(L, B, *, trans: bool = False):
    """``L^{-1} B`` (or ``L^{-T} B`` with ``trans``) for lower-triangular ``L``.

    Computed as the solve with the upper-triangular ``L^T``: the same numbers, read in the column-major layout the
    LAPACK / cuBLAS routines want, so that XLA does not copy (transpose) an N x N factor for every solve. Where this
    XLA does copy it (jaxlib 0.12 on a CPU: it wraps the transpose in a fusion before the pass that turned it into a
    bitcast; XLA's plan of one solve went from 0 to 1.0 N^2 of temporaries, and the dense path's run-time peak up by
    a matrix), the solve is by blocks instead (:func:`_blocked_solve`), from the size at which
    :func:`blocked_cholesky` factorises by blocks (N >= 8,192 on a CPU; below it the copy is small).

    Args:
        L: lower-triangular matrix of shape (N, N), typically a Cholesky factor.
        B: right-hand side of shape (N,) or (N, K).
        trans: if true, solve with ``L^T`` instead of ``L``.

    Returns:
        The solution ``L^{-1} B`` (or ``L^{-T} B``), with the shape of ``B``.
    """
    vec = jnp.ndim(B) == 1
    B2 = B[:, None] if vec else B
    dtype = jnp.result_type(L.dtype, B2.dtype)
    n = L.shape[0]
    block = cholesky_block_size(n)
    if block < n and not _transpose_is_free(jax.local_devices()[0].platform):
        out = _blocked_solve(L.astype(dtype), B2.astype(dtype), trans, block)
    else:
        out = lax.linalg.triangular_solve(L.T.astype(dtype), B2.astype(dtype), left_side=True, lower=False,
                                          transpose_a=not trans)
    return out[:, 0] if vec else out


@functools.cache
def _transpose_is_free(platform: str) -> bool:
    """Whether this XLA hands ``L.T`` to the triangular solve as a view of ``L`` (a bitcast) rather than a copy.

    Asked of the compiler itself (the plan of a 64 x 64 solve, compiled once per platform) rather than of its
    version, so that the library goes back to the one LAPACK call when XLA does.
    """
    n = 64
    a = jax.ShapeDtypeStruct((n, n), jnp.float32)
    b = jax.ShapeDtypeStruct((n, 1), jnp.float32)
    solve = jax.jit(lambda a, b: lax.linalg.triangular_solve(a.T, b, left_side=True, lower=False, transpose_a=True))
    plan = solve.lower(a, b).compile().memory_analysis()
    return plan is None or plan.temp_size_in_bytes < n * n * 4


def _blocked_solve(L, B, trans: bool, s: int):
    """``L^{-1} B`` (``L^{-T} B`` with ``trans``) by block substitution on row blocks of ``s``, reading ``L`` only
    through ``s``-wide tiles, so that no N x N copy of it is made.

    Forward (``L X = B``): ``X_i = L_ii^{-1} (B_i - sum_{j<i} L_ij X_j)``, blocks from the top, the last one
    shorter when ``s`` does not divide N. Backward (``L^T X = B``): ``X_i = L_ii^{-T} (B_i - sum_{j>i} L_ji^T X_j)``,
    blocks from the bottom, the first one shorter. Each block's sum is a ``lax.fori_loop`` over its ``s x s`` tiles
    (a scan: differentiable, and the tiles' products are made one at a time); the diagonal blocks are solved by
    LAPACK (their transposed copies are ``s x s``). Every product runs at full precision.
    """
    n, k = B.shape
    hi = lax.Precision.HIGHEST
    if not trans:
        blocks = [(r0, min(r0 + s, n)) for r0 in range(0, n, s)]
    else:  # from the bottom: the block at the top is the short one
        blocks = [(max(0, r1 - s), r1) for r1 in range(n, 0, -s)]
    X = B
    for r0, r1 in blocks:
        h = r1 - r0
        rhs = X[r0:r1]
        if not trans and r0 > 0:  # the tiles L[r0:r1, j s:(j+1) s] for j < r0 / s
            def fwd(j, acc, X=X, r0=r0, h=h):
                return acc + jnp.matmul(lax.dynamic_slice(L, (r0, j * s), (h, s)),
                                        lax.dynamic_slice_in_dim(X, j * s, s), precision=hi)
            rhs = rhs - lax.fori_loop(0, r0 // s, fwd, jnp.zeros((h, k), X.dtype))
        if trans and r1 < n:  # the tiles L[r1 + j s:r1 + (j+1) s, r0:r1] for j < (n - r1) / s
            def bwd(j, acc, X=X, r0=r0, r1=r1, h=h):
                tile = lax.dynamic_slice(L, (r1 + j * s, r0), (s, h))
                return acc + jnp.matmul(tile.T, lax.dynamic_slice_in_dim(X, r1 + j * s, s), precision=hi)
            rhs = rhs - lax.fori_loop(0, (n - r1) // s, bwd, jnp.zeros((h, k), X.dtype))
        Xi = lax.linalg.triangular_solve(L[r0:r1, r0:r1].T, rhs, left_side=True, lower=False, transpose_a=not trans)
        X = X.at[r0:r1].set(Xi)
    return X


def cho_solve(L, B):
    """``(L L^T)^{-1} B``.

    Args:
        L: lower Cholesky factor of shape (N, N).
        B: right-hand side of shape (N,) or (N, K).

    Returns:
        The solution ``(L L^T)^{-1} B``, with the shape of ``B``.
    """
    return solve_triangular(L, solve_triangular(L, B), trans=True)


def logdet(L):
    """``log det(L L^T)`` from a Cholesky factor.

    Args:
        L: lower Cholesky factor of shape (N, N) with a positive diagonal.

    Returns:
        Scalar ``2 * sum(log(diag L))``.
    """
    return 2.0 * jnp.sum(jnp.log(jnp.diag(L)))


def eigh_psd(A, *, name: str = "kernel matrix"):
    """Eigendecomposition ``A = U diag(lam) U^T`` of a symmetric PSD matrix.

    Eigenvalues below ``-n * eps * max(lam)`` raise (the matrix is not PSD);
    the tiny negative ones that round-off leaves are clipped to zero.

    Args:
        A: symmetric positive semi-definite matrix of shape (n, n).
        name: how the matrix is called in error messages.

    Returns:
        Tuple ``(lam, U)``: the eigenvalues in ascending order, clipped at zero, shape (n,), and the
        orthonormal eigenvectors as the columns of ``U``, shape (n, n).

    Raises:
        ValueError: if ``A`` is not a non-empty square matrix or contains NaN or infinite entries.
        NotPositiveDefiniteError: if the smallest eigenvalue is below ``-10 * n * eps * max |lam|``.
    """
    A = check_square(A, name)
    if not bool(jnp.all(jnp.isfinite(A))):
        raise ValueError(f"{name} contains NaN or infinite entries")
    lam, U = jnp.linalg.eigh(A)
    return clip_psd_eigenvalues(lam, name), U


def clip_psd_eigenvalues(lam, name: str = "kernel matrix"):
    """Eigenvalues (ascending) of a symmetric matrix that must be PSD, with round-off's tiny negatives clipped.

    Args:
        lam: the eigenvalues in ascending order, (n,).
        name: how the matrix is called in error messages.

    Returns:
        ``lam`` clipped at zero.

    Raises:
        NotPositiveDefiniteError: if the smallest eigenvalue is below ``-10 n eps max |lam|``.
    """
    top = float(jnp.max(jnp.abs(lam)))
    tol = lam.shape[0] * float(jnp.finfo(lam.dtype).eps) * max(top, 1e-300) * 10
    if float(lam[0]) < -tol:
        raise NotPositiveDefiniteError(f"{name} is not positive semi-definite: smallest eigenvalue {float(lam[0]):.3g}")
    return jnp.clip(lam, 0.0, None)


@contextlib.contextmanager
def blas_threads(n: int | None = 1):
    """Run the enclosed code with at most ``n`` BLAS/LAPACK threads (``None``: leave them as they are).

    On the CPU, JAX hands Cholesky factorisations and triangular solves to the LAPACK of scipy's OpenBLAS, whose
    threads then compete with XLA's own thread pool for the same cores. For the small, repeated factorisations
    of a training loop (M x M with M in the hundreds) one BLAS thread is several times faster, and under load
    tens of times (a 200 x 200 Cholesky: 0.45 ms against 15-24 ms with two OpenBLAS threads on a busy 2-core
    machine). The limit is set with threadpoolctl and restored on exit; without threadpoolctl it does nothing.

    Args:
        n: largest number of BLAS threads inside the block; ``None`` leaves the thread count unchanged.

    Returns:
        A context manager; it yields nothing (use as ``with blas_threads(1): ...``).
    """
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn (a dependency) brings threadpoolctl
        yield
        return
    with threadpool_limits(limits=int(n), user_api="blas"):
        yield
