"""`fit`: the posterior from a kernel and training inputs, by the dense, mixed-precision or matrix-free path.

``method='auto'`` takes the dense path (the N x N kernel built tile by tile into one buffer and factorised in
place) when `dense_copies` N x N matrices fit in the device's free memory, else the mixed path (a float32 factor
preconditioning float64 conjugate gradients) when its float32 matrices do, else the matrix-free path
(`smnngp.matfree`; unscaled noise by solves at a grid of shifts, `smnngp.shifts`). Each path hands its
factorisation (or solver state) to the steps in `smnngp.posterior._from_kernels`. ``docs/scaling.md`` has the
measurements behind `DENSE_COPIES`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from smnngp import linalg, matfree, priors, shifts
from smnngp._checks import check_finite
from smnngp.posterior._evaluators import _NOT_TRACEABLE, _as_targets, _evaluator, as_kernel_callable
from smnngp.posterior._from_kernels import (
    _cholesky_posterior,
    _eigh_posterior,
    _importance_posterior,
    _prepare,
    _prior_samples,
    _scaled_posterior,
    fit_from_kernels,
)
from smnngp.posterior._marginal import scaled_log_weights
from smnngp.posterior._posteriors import GaussianPosterior, Posterior

__all__ = ["fit"]


def fit(kernel, x_train, y_train, prior=None, *, noise: float = 0.0, noise_model: str = "scaled",
        num_samples: int = 10_000, key=None, min_ess: float = 30.0, proposal: str = "prior",
        method: str = "auto", cg: matfree.CG | None = None) -> Posterior:
    """Posterior of the scale mixture given training data (see the module docstring).

    Args:
      kernel: a ``kernel_fn`` from `smnngp.stax` (NNGP used; build it with the
        last layer's ``W_std=1`` so that the prior carries the scale) or any
        ``k(x1, x2) -> matrix``.
      x_train: (N, ...) inputs.
      y_train: (N,) or (N, C) targets.
      prior: a scale prior from `smnngp.priors` (``None`` = ``Delta(1)``).
      noise: ``eps`` (scaled) or ``sigma_n^2`` (unscaled), see the module docstring.
      num_samples: importance samples drawn (non-conjugate cases only).
      key: JAX PRNG key for the importance samples (non-conjugate cases only; ``None``: ``PRNGKey(0)``).
      min_ess: warn (:class:`SmallESSWarning`) below this effective sample size.
      proposal: ``'prior'`` (the paper's importance sampler: draws from H) or ``'likelihood'`` (draws from a
        widened inverse gamma shaped like the likelihood in sigma^2, reweighted by prior / proposal; scaled noise
        only). With many training points the posterior of sigma^2 is narrow and the prior puts few samples in
        it (effective sample sizes of tens out of 10^4); the likelihood proposal keeps most of them.
      noise_model: ``'scaled'`` (default: the noise is scaled by sigma^2, ``sigma^2 (Kbar + eps I)``) or
        ``'unscaled'`` (``sigma^2 Kbar + sigma_n^2 I``, which needs ``noise > 0``).
      method: ``'dense'`` (the N x N kernel and its Cholesky factor), ``'mixed'`` (float64 inputs, scaled noise:
        the float32 factor in one float32 buffer preconditions float64 conjugate gradients on kernel tiles, so
        solves reach float64 accuracy in half the memory; ``log|C|``'s small correction by stochastic Lanczos
        quadrature), ``'cg'`` (matrix-free, `smnngp.matfree`: the kernel is never formed; conjugate gradients
        for ``C^{-1} Y``, stochastic Lanczos quadrature for ``log|C|``, reported in ``diagnostics``; ``noise > 0``;
        unscaled noise by solves at a grid of shifts, `smnngp.shifts`) or ``'auto'`` (dense when
        :func:`dense_copies` N x N matrices fit in the free memory of the device, else mixed when its float32
        matrices do, else ``'cg'``). ``docs/scaling.md`` has the details and measurements.
      cg: settings of the mixed and matrix-free paths (`smnngp.matfree.CG`; ``None``: its defaults, with
        ``tol=1e-10`` for ``'mixed'``).

    Returns:
      A :class:`Posterior`: :class:`GaussianPosterior` for a ``Delta`` prior, :class:`StudentTPosterior` for an
      inverse gamma prior with scaled noise, :class:`ImportancePosterior` otherwise; it holds ``kernel`` and
      ``x_train`` so that ``predict(x_test)`` evaluates the test kernels itself.

    Raises:
      TypeError: if ``kernel`` is not callable or ``prior`` is not a distribution.
      ValueError: for inputs or targets of the wrong shape or with non-finite values, a negative noise, an
        unknown ``noise_model`` or ``proposal``, or an invalid prior (see :func:`fit_from_kernels`).
      NotPositiveDefiniteError: if the training kernel (plus noise) cannot be factorised.
      MemoryError: for ``method='dense'`` when the matrices it needs exceed the device's free memory.
    """
    kfn = as_kernel_callable(kernel)
    x_train = jnp.asarray(x_train)
    if x_train.ndim < 2:
        raise ValueError(f"x_train must have shape (N, features...), got {x_train.shape}")
    check_finite(x_train, "x_train")
    y_train = _as_targets(y_train, x_train.shape[0])
    method = _choose_method(method, x_train.shape[0], jnp.result_type(x_train.dtype, float), cg, noise_model,
                            noise)
    if method == "cg":
        return _fit_matfree(kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                            num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal,
                            options=matfree.CG() if cg is None else cg)
    if method == "mixed":
        return _fit_mixed(_evaluator(kfn), kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                          num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal,
                          options=MIXED_CG if cg is None else cg)
    post = _fit_dense(_evaluator(kfn), kfn, x_train, y_train, prior, noise=noise, noise_model=noise_model,
                      num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal)
    return post.replace(kernel=kfn, x_train=x_train)


# Peak memory of the dense path, in N x N matrices (measured: docs/scaling.md). On a CPU the kernel is factorised
# in its own buffer by the blocked Cholesky (XLA's plan 1.36 matrices; fit + predict measured 1.50 at N = 20,000
# and 1.41 at 30,000 beside the runtime's own 0.33 GiB); on an accelerator XLA's one-call factorisation adds a
# transposed copy and its output (3). Unscaled noise: the kernel and its eigenvectors, with the solver's copy.
DENSE_COPIES = {"cpu": 1.5, "accelerator": 3.0}
DENSE_COPIES_UNSCALED = 3.0


def dense_copies(noise_model: str = "scaled", platform: str | None = None) -> float:
    """Peak memory of ``fit(method='dense')`` + ``predict``, in N x N matrices of the inputs' dtype.

    Args:
        noise_model: ``'scaled'`` or ``'unscaled'`` (an eigendecomposition).
        platform: ``'cpu'``, ``'gpu'``, ... (``None``: the first local device's).

    Returns:
        The factor (e.g. 1.5 on a CPU: the kernel factorised in its own buffer plus panels).
    """
    if noise_model == "unscaled":
        return DENSE_COPIES_UNSCALED
    platform = jax.local_devices()[0].platform if platform is None else platform
    return DENSE_COPIES["cpu" if platform == "cpu" else "accelerator"]


def _fit_dense(evaluator, kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess,
               proposal):
    """:func:`fit` by the dense path in one N x N buffer: the kernel built tile by tile into it, its diagonal set
    to the self-covariance plus noise (and jitter), and the Cholesky factor (or the eigendecomposition, for
    unscaled noise) computed in place; a failed factorisation rebuilds the kernel with more jitter."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    noise = common["noise"]
    diag = _traced_diag(evaluator, x_train)
    if diag is None:
        # a kernel that cannot be traced is called as given, and its matrix factorised as a user's would be
        return fit_from_kernels(evaluator(x_train, None), y_train, prior, noise=noise, noise_model=noise_model,
                                num_samples=num_samples, key=key, min_ess=min_ess, proposal=proposal)
    n, dtype = x_train.shape[0], jnp.result_type(x_train.dtype, float)
    fn, params = matfree._split_kernel(kfn)
    if noise_model == "scaled" or priors.is_delta(common["prior"]) and noise == 0.0:
        chol = _factor_in_place(fn, params, x_train, diag, noise, dtype)
        return _cholesky_posterior(chol, Y, common, dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                                   proposal=proposal)
    if noise == 0.0:
        raise ValueError("noise_model='unscaled' needs noise > 0 (with noise 0 both noise models coincide)")
    tile = matfree.dense_tile_size(n)
    lam, U = _dense_eigh(fn, tile, params, x_train, diag)
    if not bool(jnp.all(jnp.isfinite(lam))) and not bool(_dense_finite(fn, tile, params, x_train)):
        raise ValueError("the training kernel contains NaN or infinite entries")
    lam = linalg.clip_psd_eigenvalues(lam, "training kernel")
    return _eigh_posterior(lam, U, Y, common, dtype, num_samples=num_samples, key=key, min_ess=min_ess)


def _traced_diag(evaluator, x_train):
    """The training kernel's self-covariances ``k(x_i, None)`` (checked finite), or ``None`` for a kernel that
    cannot be traced (it is then marked so, and called as given)."""
    try:
        if getattr(evaluator, "traceable", True):
            with jax.default_matmul_precision("highest"):
                diag = evaluator.diag(x_train)
    except _NOT_TRACEABLE:
        evaluator.traceable = False
    if not getattr(evaluator, "traceable", True):
        return None
    diag = diag.astype(jnp.result_type(x_train.dtype, float))
    check_finite(diag, "the training kernel's diagonal")
    return diag


def _factor_in_place(fn, params, x_train, diag, noise, store) -> linalg.Cholesky:
    """The Cholesky factor of ``k(X, X) + noise I`` built and factorised in one (N, N) buffer of dtype ``store``
    (float32 for the mixed-precision path), with jitter escalation: each try rebuilds the kernel."""
    n = x_train.shape[0]
    tile, block = matfree.dense_tile_size(n), linalg.cholesky_block_size(n)
    store = jnp.dtype(store)
    name = f"training kernel + noise ({n}x{n}, {store.name})"
    mean_diag = float(jnp.mean(diag)) + noise
    if not mean_diag > 0:
        raise linalg.NotPositiveDefiniteError(f"{name} has non-positive mean diagonal {mean_diag:.3g}")

    def factor(jitter):
        L, ok = _dense_factor(fn, tile, block, store, params, x_train, diag + (noise + jitter))
        if not bool(ok) and jitter == 0.0:
            # NaN in the factor: a kernel that is not finite (checked once, only now: a check beside the
            # in-place factorisation would make XLA keep a copy of the kernel), or one that needs jitter
            del L
            if not bool(_dense_finite(fn, tile, params, x_train)):
                raise ValueError("the training kernel contains NaN or infinite entries")
            return None, False
        return L, ok

    return linalg.escalate_jitter(factor, mean_diag, store, name=name)


def _fit_mixed(evaluator, kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess, proposal,
               options):
    """:func:`fit` in mixed precision: the float32 factor of ``C = K + noise I`` (one float32 N x N buffer, as the
    dense path builds it) preconditions conjugate gradients whose products recompute the float64 kernel by tiles.
    ``C^{-1} Y`` reaches float64 accuracy to ``tol``; ``log|C| = log|P| + tr log(P^{-1} C)`` with the first term
    exact from the factor and the second (small: ``P^{-1} C`` is I up to float32 rounding) by stochastic Lanczos
    quadrature with its standard error."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    dtype = jnp.result_type(x_train.dtype, float)
    if jnp.dtype(dtype).itemsize < 8:
        raise ValueError(f"method='mixed' factorises in float32 and refines in float64, but the inputs are "
                         f"{jnp.dtype(dtype).name}: enable float64 (jax_enable_x64) or use method='dense'")
    if common["noise_model"] != "scaled":
        raise ValueError("method='mixed' supports noise_model='scaled' (conjugate in sigma^2); unscaled noise needs an "
                         "eigendecomposition: use method='dense'")
    if not common["noise"] > 0:
        raise ValueError("method='mixed' needs noise > 0: its float64 solves are of K + noise I")
    diag = _traced_diag(evaluator, x_train)
    if diag is None:
        raise TypeError("method='mixed' recomputes kernel tiles inside compiled code: the kernel must be traceable "
                        "by JAX (use method='dense' for a NumPy kernel)")
    fn, params = matfree._split_kernel(kfn)
    chol = _factor_in_place(fn, params, x_train, diag, common["noise"], jnp.float32)
    pc = matfree.DenseCholesky(chol.L, chol.jitter)
    op = matfree.KernelOperator(kfn, x_train, common["noise"], tile_size=options.tile_size, devices=options.devices)
    alpha, info, est, _ = matfree.solve(op, Y, options, precond=pc)
    q = jnp.sum(Y.astype(alpha.dtype) * alpha)
    state = dict(alpha=alpha, q=q, logdet=jnp.asarray(est.value, alpha.dtype), L32=pc.L,
                 precond_jitter=chol.jitter, logdet_stderr=est.stderr, cg_iterations=info.iterations,
                 cg_residual=info.residual, cg_tol=info.tol)
    post = _scaled_posterior(common, state, 0.0, alpha.dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal, solver=options)
    return post.replace(kernel=kfn, x_train=x_train)


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _dense_factor(fn, tile, block, store, params, x, diag):
    """Kernel (lower triangle, in dtype ``store``) with ``diag`` on its diagonal, and its Cholesky factor in the
    same buffer."""
    A = matfree.dense_kernel(fn, params, x, tile, lower_only=True, dtype=store)
    idx = jnp.arange(x.shape[0])
    A = A.at[idx, idx].set(diag.astype(A.dtype))
    L = linalg.blocked_cholesky(A, block)
    return L, jnp.all(jnp.isfinite(jnp.diagonal(L)))


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _dense_finite(fn, tile, params, x):
    return jnp.all(jnp.isfinite(matfree.dense_kernel(fn, params, x, tile, lower_only=True)))


@matfree._highest
@functools.partial(jax.jit, static_argnums=(0, 1))
def _dense_eigh(fn, tile, params, x, diag):
    """Kernel with ``diag`` on its diagonal and its eigendecomposition (the eigenvectors in the kernel's buffer)."""
    A = matfree.dense_kernel(fn, params, x, tile, lower_only=False)
    idx = jnp.arange(x.shape[0])
    A = A.at[idx, idx].set(diag.astype(A.dtype))
    return jnp.linalg.eigh(A.T, symmetrize_input=False)


# CG settings of method='mixed' when none are given: float64 accuracy. With the float32 factor as preconditioner
# each further digit costs about one iteration (a pass of float64 kernel tiles).
MIXED_CG = matfree.CG(tol=1e-10)


def _choose_method(method, n, dtype, cg, noise_model="scaled", noise=0.0):
    if method not in ("auto", "dense", "mixed", "cg"):
        raise ValueError(f"method must be 'auto', 'dense', 'mixed' or 'cg', got {method!r}")
    if cg is not None and not isinstance(cg, matfree.CG):
        raise TypeError(f"cg must be a smnngp.matfree.CG, got {type(cg).__name__}")
    if method == "cg":
        return method
    copies = dense_copies(noise_model if noise_model in ("scaled", "unscaled") else "scaled")
    free = matfree.available_memory_bytes()

    def need(store):
        return copies * n * n * jnp.dtype(store).itemsize

    if method in ("dense", "mixed"):
        store = dtype if method == "dense" else jnp.float32
        if free is not None and need(store) > free:
            raise MemoryError(f"method={method!r} needs about {need(store) / 2**30:.1f} GiB ({copies:g} x {n} x {n} "
                              f"{jnp.dtype(store).name}) and the device has {free / 2**30:.1f} GiB free; use "
                              "method='cg' (matrix-free) or method='auto'")
        return method
    if free is None or need(dtype) <= free:
        return "dense"
    # float64 that does not fit: its float32 factor refined in float64 (the same accuracy, half the memory)
    mixed_ok = jnp.dtype(dtype).itemsize >= 8 and noise_model == "scaled" and _positive(noise)
    return "mixed" if mixed_ok and need(jnp.float32) <= free else "cg"


def _positive(noise) -> bool:
    try:
        return float(noise) > 0
    except (TypeError, ValueError):
        return False


def _fit_matfree(kfn, x_train, y_train, prior, *, noise, noise_model, num_samples, key, min_ess, proposal, options):
    """:func:`fit` by the matrix-free path: q and log|C| from one preconditioned CG run with SLQ probes."""
    Y, common = _prepare(y_train, x_train.shape[0], prior, noise, noise_model, proposal)
    if not common["noise"] > 0:
        raise ValueError("method='cg' needs noise > 0: conjugate gradients and the preconditioner solve K + noise I")
    if common["noise_model"] != "scaled":
        post = _fit_matfree_unscaled(kfn, x_train, Y, common, num_samples=num_samples, key=key, min_ess=min_ess,
                                     options=options)
        return post.replace(kernel=kfn, x_train=x_train)
    op = matfree.KernelOperator(kfn, x_train, common["noise"], tile_size=options.tile_size, devices=options.devices)
    alpha, info, est, pc = matfree.solve(op, Y, options)
    q = jnp.sum(Y.astype(alpha.dtype) * alpha)
    state = dict(alpha=alpha, q=q, logdet=jnp.asarray(est.value, alpha.dtype), U=pc.U, lam=pc.lam,
                 logdet_stderr=est.stderr, cg_iterations=info.iterations, cg_residual=info.residual, cg_tol=info.tol,
                 precond_trace_error=pc.trace_error)
    post = _scaled_posterior(common, state, 0.0, alpha.dtype, num_samples=num_samples, key=key, min_ess=min_ess,
                             proposal=proposal, solver=options)
    return post.replace(kernel=kfn, x_train=x_train)


def _fit_matfree_unscaled(kfn, x_train, Y, common, *, num_samples, key, min_ess, options):
    """Unscaled noise without the matrix: ``beta K + noise I = beta (K + s I)`` with ``s = noise / beta``, so every
    sample's ``q`` and ``log|C|`` are splines in ``log s`` through matrix-free solves at a few shifts
    (`smnngp.shifts`): a coarse grid over all sampled shifts, then a fine one where the weight is."""
    prior, noise = common["prior"], common["noise"]
    n, n_out = common["n_train"], common["n_out"]
    dtype = jnp.result_type(x_train.dtype, float)
    if priors.is_delta(prior):
        beta = jnp.reshape(jnp.asarray(prior.v, dtype), (1,))
    else:
        beta = _prior_samples(prior, key, num_samples, dtype)
    s = noise / np.asarray(beta, float)
    op = matfree.KernelOperator(kfn, x_train, float(np.median(s)), tile_size=options.tile_size,
                                devices=options.devices)
    pc = matfree.pivoted_cholesky(op, options.precond_rank)
    Y = Y.astype(dtype)

    def log_w(grid, idx=slice(None)):
        B = shifts.spline_basis(grid.t, np.log(s[idx]))
        return np.asarray(scaled_log_weights(B @ grid.q, B @ grid.logdet, n, n_out, np.asarray(beta)[idx]))

    coarse = shifts.fit_grid(op, Y, shifts.log_spaced(s.min(), s.max(), shifts.COARSE_NODES), options, pc)
    lw = np.array(log_w(coarse))
    interp_error = 0.0
    if coarse.t.shape[0] == 1:
        fine = coarse
    else:
        # the fine grid spans the samples within exp(-FINE_SPAN) of the largest weight (by the coarse grid, with a
        # margin for its error); the rest carry less than num_samples x exp(-FINE_SPAN) of the mass and are dropped
        mass = lw - lw.max() > -(shifts.FINE_SPAN + 10.0)
        fine = shifts.fit_grid(op, Y, shifts.log_spaced(s[mass].min(), s[mass].max(), shifts.FINE_NODES), options,
                               pc)
        inside = (np.log(s) >= fine.t[0] - 1e-12) & (np.log(s) <= fine.t[-1] + 1e-12)
        lw = np.full(s.shape, -np.inf)
        lw[inside] = log_w(fine, inside)
        # the interpolation's error, over-estimated: the log ML from a spline through every other fine node
        if fine.t.shape[0] >= 4:
            half = fine._replace(t=fine.t[::2], q=fine.q[::2], logdet=fine.logdet[::2])
            lw_half = log_w(half, inside)
            interp_error = float(abs(logsumexp(lw_half) - logsumexp(lw[inside])))
    state = dict(grid_t=fine.t, grid_alpha=fine.alpha, U=pc.U, lam=pc.lam, logdet_stderr=float(np.max(
        np.concatenate([coarse.logdet_stderr, fine.logdet_stderr]))), cg_iterations=max(coarse.iterations,
        fine.iterations), cg_residual=max(coarse.residual, fine.residual), cg_tol=fine.tol,
        precond_trace_error=pc.trace_error, interpolation_error=interp_error, grid_nodes=int(coarse.t.shape[0] + (
        0 if fine is coarse else fine.t.shape[0])))
    log_w_all = jnp.asarray(lw, dtype)
    if priors.is_delta(prior):
        return GaussianPosterior(log_marginal_likelihood=float(lw[0]), state=state, s=prior.v, solver=options,
                                 **common)
    return _importance_posterior(common, state, beta, log_w_all, 0.0, num_samples, min_ess, solver=options)
