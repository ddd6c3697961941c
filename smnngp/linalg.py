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

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

__all__ = [
    "Cholesky",
    "NotPositiveDefiniteError",
    "cholesky",
    "cholesky_jittered",
    "cho_solve",
    "solve_triangular",
    "logdet",
    "eigh_psd",
    "check_square",
]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """Raised when no jitter up to the limit makes a matrix numerically positive definite."""


class Cholesky(NamedTuple):
    """Lower Cholesky factor ``L`` of ``A + jitter * I`` (``jitter`` is absolute)."""

    L: jax.Array
    jitter: float


def check_square(A, name: str = "matrix") -> jax.Array:
    A = jnp.asarray(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{name} must be a square 2-D matrix, got shape {A.shape}")
    if A.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {A.shape})")
    return A


def _shifted(A, shift):
    return A + shift * jnp.eye(A.shape[0], dtype=A.dtype)


def _chol(A, shift, jitter):
    n = A.shape[0]
    L = jnp.linalg.cholesky(_shifted(A, shift) + jitter * jnp.eye(n, dtype=A.dtype))
    return L, jnp.all(jnp.isfinite(L))


_chol_jit = jax.jit(_chol)


@functools.partial(jax.jit, static_argnums=2)
def _input_stats(A, shift, check_symmetric: bool):
    """For ``A + shift I`` (not materialised): all entries finite, max |A|, max |A - A^T| (when asked) and
    mean diagonal, in one compiled pass."""
    A = _shifted(A, shift)
    finite = jnp.all(jnp.isfinite(A))
    mean_diag = jnp.mean(jnp.diag(A))
    if not check_symmetric:
        return finite, None, None, mean_diag
    return finite, jnp.max(jnp.abs(A)), jnp.max(jnp.abs(A - A.T)), mean_diag


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
    finite, scale, asym, mean_diag = _input_stats(A, shift, bool(check_symmetric))
    if not bool(finite):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if check_symmetric:
        scale, asym = float(scale), float(asym)
        tol = 1e3 * float(jnp.finfo(A.dtype).eps) * max(scale, 1e-300)
        if asym > tol:
            raise ValueError(f"{name} is not symmetric (max |A - A^T| = {asym:.3g}, scale {scale:.3g})")
    mean_diag = float(mean_diag)
    if not mean_diag > 0:
        raise NotPositiveDefiniteError(f"{name} has non-positive mean diagonal {mean_diag:.3g}")
    eps = float(jnp.finfo(A.dtype).eps)
    jitter = 0.0
    while True:
        L, finite = _chol_jit(A, shift, jnp.asarray(jitter, A.dtype))
        if bool(finite):
            return Cholesky(L, jitter)
        jitter = (10 * eps * mean_diag) if jitter == 0.0 else jitter * 10
        if jitter > max_relative_jitter * mean_diag:
            lam_min = float(jnp.linalg.eigvalsh(_shifted(A, shift))[0])
            raise NotPositiveDefiniteError(
                f"{name} ({A.shape[0]}x{A.shape[0]}, {A.dtype}) is not positive definite: smallest eigenvalue "
                f"{lam_min:.3g}; jitter up to {max_relative_jitter:g} x mean diagonal ({mean_diag:.3g}) did not help"
            )


def cholesky_jittered(A, relative_jitter: float = 1e-10) -> jax.Array:
    """Traceable Cholesky of ``A + relative_jitter * mean(diag A) * I`` (for use under jit/grad)."""
    n = A.shape[0]
    j = relative_jitter * jnp.mean(jnp.diag(A))
    return jnp.linalg.cholesky(A + j * jnp.eye(n, dtype=A.dtype))


def solve_triangular(L, B, *, trans: bool = False):
    """``L^{-1} B`` (or ``L^{-T} B`` with ``trans``) for lower-triangular ``L``."""
    return jsl.solve_triangular(L, B, lower=True, trans=1 if trans else 0)


def cho_solve(L, B):
    """``(L L^T)^{-1} B``."""
    return jsl.cho_solve((L, True), B)


def logdet(L):
    """``log det(L L^T)`` from a Cholesky factor."""
    return 2.0 * jnp.sum(jnp.log(jnp.diag(L)))


def eigh_psd(A, *, name: str = "kernel matrix"):
    """Eigendecomposition ``A = U diag(lam) U^T`` of a symmetric PSD matrix.

    Eigenvalues below ``-n * eps * max(lam)`` raise (the matrix is not PSD);
    the tiny negative ones that round-off leaves are clipped to zero.
    """
    A = check_square(A, name)
    if not bool(jnp.all(jnp.isfinite(A))):
        raise ValueError(f"{name} contains NaN or infinite entries")
    lam, U = jnp.linalg.eigh(A)
    top = float(jnp.max(jnp.abs(lam)))
    tol = A.shape[0] * float(jnp.finfo(A.dtype).eps) * max(top, 1e-300) * 10
    if float(lam[0]) < -tol:
        raise NotPositiveDefiniteError(f"{name} is not positive semi-definite: smallest eigenvalue {float(lam[0]):.3g}")
    return jnp.clip(lam, 0.0, None), U
