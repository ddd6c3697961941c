"""The Gaussian law of gradient-flow-trained infinite networks (see the `smnngp.predict` package docstring).

Holds :class:`Gaussian`, :func:`max_learning_rate` and :func:`gradient_descent_mse_ensemble`, with the input
checks the other modules of the package share.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from smnngp import linalg
from smnngp._checks import check_finite
from smnngp.kernels import canonical_get, pack
from smnngp.predict._axes import OutputLayout, from_2d, to_2d, zipped

__all__ = ["Gaussian", "gradient_descent_mse_ensemble", "max_learning_rate"]

class Gaussian(NamedTuple):
    """Mean ``(..., M, C)`` (or ``(..., M)`` for 1-D targets) and covariance ``(..., M, M)``, shared by the outputs.

    Attributes:
        mean: predictive mean at the M points, (..., M, C) or (..., M); leading axes are those of the training
            time ``t``.
        covariance: covariance between the M points, (..., M, M), the same for every output.
    """

    mean: Any
    covariance: Any


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------


def _float_array(x, name: str, where: str) -> jax.Array:
    if not hasattr(x, "shape"):
        try:
            x = np.asarray(x)
        except Exception:  # pragma: no cover - exotic inputs
            raise TypeError(f"{where}: {name} must be an array, got {type(x).__name__}") from None
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == bool:
            x = x.astype(jnp.result_type(float))
        else:
            raise TypeError(f"{where}: {name} must be real, got dtype {x.dtype}")
    check_finite(x, name, where)
    return x


def _check_scalar(value, name: str, where: str, *, positive: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        kind = "positive" if positive else "non-negative"
        raise ValueError(f"{where}: {name} must be {kind} and finite, got {value}")
    return v


def _canonical_time(t):
    """``None`` for t = None / scalar inf (the Cholesky path), else a float array of non-negative times."""
    if t is None:
        return None
    if isinstance(t, jax.core.Tracer):  # under jit: used as given (an infinite time is handled by the eigenbasis)
        return jnp.asarray(t, jnp.result_type(float))
    arr = np.asarray(t, dtype=float) if not hasattr(t, "dtype") else np.asarray(t).astype(float)
    if arr.size == 0:
        raise ValueError("predict_fn: t is empty")
    if np.isnan(arr).any():
        raise ValueError("predict_fn: t contains NaN")
    if (arr < 0).any():
        raise ValueError(f"predict_fn: training time t must be non-negative, got min {arr.min():g}")
    if arr.ndim == 0 and np.isinf(arr):
        return None
    return arr


def _cholesky(k2, name: str, where: str) -> jax.Array:
    if isinstance(k2, jax.core.Tracer):  # the predictor was built inside jit / grad: no values to inspect
        return linalg.cholesky_jittered(k2, 0.0)
    fac = linalg.cholesky(k2, name=name)
    if fac.jitter > 0:
        warnings.warn(f"{where}: the {name} is numerically singular; added jitter {fac.jitter:.3g} (pass diag_reg > 0 "
                      f"to control the regularisation)", RuntimeWarning, stacklevel=4)
    return fac.L


def _cached(cache: dict, key: str, source, compute):
    """``compute()``, kept in ``cache`` under ``key``, for a factorisation of the training kernel ``source``.

    A predict_fn may be called under ``jit``: a concrete training kernel is then still factorised eagerly
    (`jax.ensure_compile_time_eval`), once, so that the cached factor is an array and not a tracer of one trace.
    A traced training kernel (the predictor built inside ``jit``) is factorised in the trace and not cached.
    """
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(source)):
        return compute()
    if key not in cache:
        with jax.ensure_compile_time_eval():
            cache[key] = compute()
    return cache[key]


def _eigen(k2, name: str):
    if isinstance(k2, jax.core.Tracer):
        lam, U = jnp.linalg.eigh(k2)
        lam = jnp.maximum(lam, 0.0)
    else:
        lam, U = linalg.eigh_psd(k2, name=name)
    tol = k2.shape[0] * jnp.finfo(lam.dtype).eps * 10 * jnp.max(lam)
    return lam, U, lam > tol


def _as_matrix(k, name: str, rows: tuple[int, ...], cols: tuple[int, ...]) -> jax.Array:
    """A kernel returned by ``kernel_fn``, checked to be ``zip(rows, cols)``-shaped, as a (prod rows, prod cols)
    matrix."""
    k = jnp.asarray(k)
    want = zipped(rows, cols)
    if k.shape != want:
        raise ValueError(
            f"gradient_descent_mse_ensemble: kernel_fn returned a {name} kernel of shape {tuple(k.shape)}, expected "
            f"{want} (one kernel per output channel, see trace_axes; flatten or pool spatial axes before the readout "
            f"layer)"
        )
    return to_2d(k)


def _is_arrays(v) -> bool:
    return all(isinstance(leaf, (np.ndarray, jax.Array)) for leaf in jax.tree_util.tree_leaves(v))


def _split_kernel_kwargs(train_kw: dict, test_kw: dict, where: str) -> tuple[dict, dict]:
    """Keyword arguments of ``kernel_fn`` for the test-train and test-test kernels (neural-tangents' rule).

    A keyword given at ``predict_fn`` time replaces the training one; when both are pairs of arrays ``(a1, a2)``
    (one per input of the kernel), the test-train call gets ``(test's a1, train's a1)``; non-array values must
    agree with the training ones.
    """
    td, tt = dict(train_kw), dict(train_kw)
    for key, v_tt in test_kw.items():
        v_dd = train_kw.get(key)
        if key in train_kw and _is_arrays(v_dd) and _is_arrays(v_tt):
            pair = isinstance(v_dd, tuple) and len(v_dd) == 2 and isinstance(v_tt, tuple) and len(v_tt) == 2
            v_td = (v_tt[0], v_dd[0]) if pair else v_tt
        elif key in train_kw and not _same(v_dd, v_tt):
            raise ValueError(f"{where}: kernel_fn keyword {key!r} is {v_dd!r} for the training kernel but {v_tt!r} "
                             f"for the test kernels; a non-array keyword must be the same for both")
        else:
            v_td = v_tt
        td[key], tt[key] = v_td, v_tt
    return td, tt


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a truth value compare unequal
        return a is b


# ---------------------------------------------------------------------------
# The Gaussian ensemble
# ---------------------------------------------------------------------------


def max_learning_rate(ntk_train_train, y_train_size: int | None = None, momentum: float = 0.0,
                      eps: float = 1e-12) -> float:
    """Largest stable full-batch GD learning rate for the convention above: ``2 (1 + m) n / (lambda_max + eps)``.

    One GD step maps the training residual by ``I - eta Theta / n``, a contraction iff ``eta < 2 n / lambda_max``;
    heavy-ball momentum ``m`` widens the stable range to ``eta < 2 (1 + m) n / lambda_max`` (Goh 2017, "Why
    momentum really works"). ``eps`` keeps the divisor away from zero, as in neural-tangents.

    Args:
        ntk_train_train: the NTK (or NNGP kernel, for readout-only training) on the training inputs, (N, N), or
            an interleaved kernel ``(N, N, C, C, ...)`` (``trace_axes=()``), which is flattened to its matrix.
        y_train_size: ``n``, the number of target entries the MSE averages over (N times the number of outputs
            C); ``None`` means the side of the (flattened) kernel.
        momentum: the momentum ``m`` of the optimiser (0 for plain gradient descent).
        eps: added to ``lambda_max`` in the divisor.

    Returns:
        ``2 (1 + m) n / (lambda_max + eps)`` as a Python float.

    Raises:
        ValueError: if ``ntk_train_train`` is not a non-empty square matrix (or interleaved square kernel), has no
            positive eigenvalue, or ``momentum`` / ``eps`` is negative.
    """
    k = jnp.asarray(ntk_train_train)
    if k.ndim >= 2 and k.ndim % 2 == 0 and k.shape[0::2] == k.shape[1::2]:
        k = to_2d(k)
    theta = linalg.check_square(k, "max_learning_rate: ntk_train_train")
    m = _check_scalar(momentum, "momentum", "max_learning_rate", positive=False)
    eps = _check_scalar(eps, "eps", "max_learning_rate", positive=False)
    n = theta.shape[0] if y_train_size is None else int(y_train_size)
    lam = float(jnp.linalg.eigvalsh(theta)[-1])
    if not lam > 0:
        raise ValueError(f"max_learning_rate: the NTK has no positive eigenvalue (largest {lam:g})")
    return 2.0 * (1.0 + m) * n / (lam + eps)


def gradient_descent_mse_ensemble(
    kernel_fn: Callable,
    x_train,
    y_train,
    *,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    learning_rate: float = 1.0,
    trace_axes=(-1,),
    **kernel_fn_train_train_kwargs,
) -> Callable:
    """Gaussian law of infinitely wide networks trained by gradient flow on the MSE (module docstring).

    Args:
      kernel_fn: ``kernel_fn(x1, x2, get, **kwargs)`` returning the NNGP / NTK (e.g. from
        `smnngp.stax`); for the scale mixtures of the paper its last layer has ``W_std=1``.
      x_train: (N, ...) training inputs.
      y_train: (N,) or (N, C) training targets (any shape with the batch axis first when ``trace_axes`` is not
        the default).
      diag_reg: relative diagonal regulariser (see the module docstring).
      diag_reg_absolute_scale: take ``diag_reg`` in absolute units.
      learning_rate: ``eta``; only ``eta * t`` matters.
      trace_axes: axes of ``y_train`` along which the kernel is the identity (``Theta ⊗ I``); the kernels from
        ``kernel_fn`` carry the other axes, interleaved (the default ``(-1,)``: (N, N) kernels, one per output).
      **kernel_fn_train_train_kwargs: keyword arguments of ``kernel_fn`` for the training kernel, and defaults
        for the test kernels (neural-tangents' rule: a keyword given to ``predict_fn`` replaces it; for pairs of
        arrays ``(a1, a2)`` the test-train kernel gets the test's ``a1`` and the training ``a1``).

    Returns:
      ``predict_fn(t=None, x_test=None, get=None, compute_cov=True, **kernel_fn_test_test_kwargs)``:

      * ``t``: training time, a scalar or an array of any shape (leading axes of
        the result); ``None`` or ``inf`` means converged (``t -> inf``);
      * ``x_test``: (M, ...) test inputs; ``None`` means the training inputs,
        for which ``f_t(X)`` has mean ``(I - E) Y`` and covariance ``E K E``
        with ``E = exp(-eta t Theta_reg / n)`` (``K`` is the regularised NNGP
        for ``get='nngp'``, the plain one for ``'ntk'``, as in neural-tangents;
        ``Y`` and 0 at ``t = inf``); with ``diag_reg = 0`` this equals
        ``x_test=x_train``;
      * ``get``: ``'nngp'`` (readout-only training), ``'ntk'`` (all layers) or
        a tuple of them; ``None`` means ``('nngp', 'ntk')``;
      * ``kernel_fn_test_test_kwargs``: keyword arguments of ``kernel_fn`` for the test kernels;
      * returns a :class:`Gaussian` ``(mean, covariance)`` (just the mean with
        ``compute_cov=False``), or a named tuple of them for a tuple ``get``;
        the covariance's axes are the kernel axes, interleaved ((M, M) by default).
    """
    where = "gradient_descent_mse_ensemble"
    if not callable(kernel_fn):
        raise TypeError(f"{where}: kernel_fn must be callable, got {type(kernel_fn).__name__}")
    x_train = _float_array(x_train, "x_train", where)
    y_train = _float_array(y_train, "y_train", where)
    if x_train.ndim < 2:
        raise ValueError(f"{where}: x_train must have a batch axis and a feature axis, got shape {x_train.shape}")
    default_trace = isinstance(trace_axes, (tuple, list)) and tuple(trace_axes) == (-1,) or trace_axes == -1
    if y_train.ndim < 1:
        raise ValueError(f"{where}: y_train must have a batch axis, got a scalar")
    if y_train.ndim == 0:
        raise ValueError(f"{where}: y_train must have a batch axis, got a scalar")
    if y_train.shape[0] != x_train.shape[0]:
        raise ValueError(
            f"{where}: x_train has {x_train.shape[0]} points but y_train has {y_train.shape[0]} rows "
            f"(shapes {x_train.shape} and {y_train.shape})"
        )
    diag_reg = _check_scalar(diag_reg, "diag_reg", where, positive=False)
    learning_rate = _check_scalar(learning_rate, "learning_rate", where, positive=True)
    squeeze = y_train.ndim == 1 and default_trace
    y2 = y_train[:, None] if squeeze else y_train
    layout = OutputLayout.of(y2.shape, (1,) if squeeze else trace_axes, where)
    train_axes = layout.nontrace_shape
    n_train, n_norm = layout.n_kernel, y2.size
    train_kw = dict(kernel_fn_train_train_kwargs)

    cache: dict[str, Any] = {}

    def kernels(x1, x2, names, kw):
        out = kernel_fn(x1, x2, tuple(names), **kw)
        return {n: getattr(out, n) for n in names}

    def train_kernel(name: str) -> jax.Array:
        # The NTK comes with the NNGP in one kernel_fn call; the NNGP alone when only it is needed.
        want = ("nngp",) if name == "nngp" and "k_both" not in cache else ("nngp", "ntk")

        def compute():
            got = kernels(x_train, None, want, train_kw)
            return {n: _as_matrix(got[n], f"train-train {n}", train_axes, train_axes) for n in want}

        return _cached(cache, "k_" + ("nngp" if len(want) == 1 else "both"), x_train, compute)[name]

    def regularised(name: str) -> jax.Array:
        k = train_kernel(name)
        scale = 1.0 if diag_reg_absolute_scale else jnp.mean(jnp.diag(k))
        return k + (diag_reg * scale) * jnp.eye(n_train, dtype=k.dtype)

    def eig(name: str):
        return _cached(cache, "eig_" + name, x_train, lambda: _eigen(regularised(name), f"train {name} kernel"))

    def chol(name: str) -> jax.Array:
        return _cached(cache, "chol_" + name, x_train,
                       lambda: _cholesky(regularised(name), f"train {name} kernel (+ diag_reg)", where))

    def predict_fn(t=None, x_test=None, get=None, compute_cov: bool = True, **kernel_fn_test_test_kwargs):
        names, single = canonical_get(("nngp", "ntk") if get is None else get)
        t_arr = _canonical_time(t)
        if x_test is not None:
            x_test = _float_array(x_test, "x_test", "predict_fn")
            if x_test.ndim != x_train.ndim or x_test.shape[1:] != x_train.shape[1:]:
                raise ValueError(
                    f"predict_fn: x_test {tuple(x_test.shape)} must match x_train {tuple(x_train.shape)} beyond the "
                    f"batch axis"
                )
        dtype = train_kernel("nngp").dtype
        y = layout.flat(y2.astype(dtype))
        test = None
        test_axes = train_axes
        if x_test is not None:
            if 0 in layout.trace:  # the examples are independent outputs: the test set must line up with them
                if x_test.shape[0] != y2.shape[0]:
                    raise ValueError(
                        f"predict_fn: trace_axes {trace_axes!r} trace the batch axis of y_train, so x_test must "
                        f"have as many points as x_train ({y2.shape[0]}), got {x_test.shape[0]}"
                    )
            else:
                test_axes = (x_test.shape[0],) + train_axes[1:]
            kw_td, kw_tt = _split_kernel_kwargs(train_kw, kernel_fn_test_test_kwargs, where)
            want = sorted(set(names) | ({"nngp"} if compute_cov else set()))
            k_td = kernels(x_test, x_train, want, kw_td)
            test = {n: _as_matrix(v, f"test-train {n}", test_axes, train_axes) for n, v in k_td.items()}
            if compute_cov:
                test["nngp_tt"] = _as_matrix(kernels(x_test, None, ("nngp",), kw_tt)["nngp"], "test-test nngp",
                                             test_axes, test_axes)
        outs = []
        for name in names:
            if t_arr is None:
                mean, cov = _predict_inf(name, y, test, compute_cov, train_kernel, chol)
            else:
                k_dd = None
                if compute_cov:
                    k_dd = regularised("nngp") if (test is None and name == "nngp") else train_kernel("nngp")
                mean, cov = _predict_finite(name, y, test, compute_cov, t_arr, learning_rate, n_norm, k_dd, eig)
            mean = layout.unflat(mean, test_axes)
            if squeeze:
                mean = mean[..., 0]
            outs.append(Gaussian(mean, from_2d(cov, test_axes)) if compute_cov else mean)
        return pack(names, single, outs)

    return predict_fn


def _sym(c):
    return 0.5 * (c + jnp.swapaxes(c, -1, -2))


def _predict_inf(name, y, test, compute_cov, train_kernel, chol):
    if test is None:  # converged training outputs interpolate the targets exactly
        n = y.shape[0]
        return y, (jnp.zeros((n, n), y.dtype) if compute_cov else None)
    k_dd = train_kernel("nngp") if (compute_cov and name == "ntk") else None
    return _inf_core(chol(name), y, test[name], test.get("nngp"), test.get("nngp_tt"), k_dd,
                     ntk=name == "ntk", compute_cov=compute_cov)


@functools.partial(jax.jit, static_argnames=("ntk", "compute_cov"))
def _inf_core(L, y, k_td_g, k_td, k_tt, k_dd, *, ntk: bool, compute_cov: bool):
    mean = k_td_g @ linalg.cho_solve(L, y)
    if not compute_cov:
        return mean, None
    if not ntk:
        v = linalg.solve_triangular(L, k_td.T)
        return mean, _sym(k_tt - v.T @ v)
    b = linalg.cho_solve(L, k_td_g.T)  # Theta^{-1} Theta(X, x*)
    cross = k_td @ b
    return mean, _sym(k_tt + b.T @ k_dd @ b - cross - cross.T)


def _predict_finite(name, y, test, compute_cov, t_arr, learning_rate, n_norm, k_dd, eig):
    lam, U, pos = eig(name)
    rate = jnp.asarray((learning_rate * t_arr.reshape(-1)) / n_norm, lam.dtype)[:, None]  # (T, 1)
    if test is None:
        mean, cov = _finite_train_core(lam, U, pos, rate, y, k_dd, compute_cov=compute_cov)
    else:
        mean, cov = _finite_test_core(lam, U, pos, rate, y, test[name], test.get("nngp"), test.get("nngp_tt"), k_dd,
                                      ntk=name == "ntk", compute_cov=compute_cov)
    mean = mean.reshape(t_arr.shape + mean.shape[1:])
    if cov is not None:
        cov = cov.reshape(t_arr.shape + cov.shape[1:])
    return mean, cov


def _decay(lam, pos, rate):
    """Eigenvalues of exp(-eta t Theta / n): 1 on the null space, 0 elsewhere at t = inf."""
    lam, pos = lam[None, :], pos[None, :]  # (1, N) against the times' rate (T, 1)
    inf = jnp.isinf(rate)
    z = jnp.where(pos, lam * jnp.where(inf, 0.0, rate), 0.0)
    return jnp.where(inf, jnp.where(pos, 0.0, 1.0), jnp.exp(-z))


def _coef(lam, pos, rate):
    """Eigenvalues of Theta^{-1} (I - exp(-eta t Theta / n)): (1 - e^{-lam r}) / lam, r on the null space, and the
    pseudo-inverse (1 / lam, 0 on the null space) at r = inf."""
    lam, pos = lam[None, :], pos[None, :]  # (1, N) against the times' rate (T, 1)
    inf = jnp.isinf(rate)
    lam_safe = jnp.where(pos, lam, 1.0)
    z = jnp.where(pos, lam * jnp.where(inf, 0.0, rate), 0.0)
    finite = jnp.where(pos, -jnp.expm1(-z) / lam_safe, rate)
    return jnp.where(inf, jnp.where(pos, 1.0 / lam_safe, 0.0), finite)


@functools.partial(jax.jit, static_argnames=("compute_cov",))
def _finite_train_core(lam, U, pos, rate, y, k_dd, *, compute_cov: bool):
    decay = _decay(lam, pos, rate)  # (T, N)
    mean = jnp.einsum("ji,ti,ic->tjc", U, 1.0 - decay, U.T @ y)
    if not compute_cov:
        return mean, None
    E = jnp.einsum("ji,ti,ki->tjk", U, decay, U)
    return mean, _sym(E @ k_dd @ E)


@functools.partial(jax.jit, static_argnames=("ntk", "compute_cov"))
def _finite_test_core(lam, U, pos, rate, y, k_td_g, k_td, k_tt, k_dd, *, ntk: bool, compute_cov: bool):
    c = _coef(lam, pos, rate)  # (T, N)
    tu = k_td_g @ U  # Theta(x*, X) U
    mean = jnp.einsum("mi,ti,ic->tmc", tu, c, U.T @ y)
    if not compute_cov:
        return mean, None
    if not ntk:
        return mean, _sym(k_tt[None] - jnp.einsum("mi,ti,li->tml", tu, _coef(lam, pos, 2.0 * rate), tu))
    A = jnp.einsum("mi,ti,ji->tmj", tu, c, U)  # A_t(x*)
    cross = A @ k_td.T
    return mean, _sym(k_tt[None] + A @ k_dd @ jnp.swapaxes(A, -1, -2) - cross - jnp.swapaxes(cross, -1, -2))
