"""Gradient-descent-trained infinite networks, and their scale mixtures (paper Thms 3.2, 3.3; notes 1.5).

An infinitely wide network trained by gradient flow on the mean squared error
evolves as its linearisation (Lee et al. 2019), so an ensemble over random
initialisations is Gaussian at every training time ``t``.
:func:`gradient_descent_mse_ensemble` returns that Gaussian, with the names and
conventions of neural-tangents' function of the same name.

Convention (neural-tangents'): the loss is ``0.5 * mean((f(X) - Y)**2)``, the
mean taken over all ``n = Y.size`` entries (N training points times C
outputs), and the kernel acts on each output separately (``Theta ⊗ I_C``).
Gradient flow with learning rate ``eta`` then gives, for the training
outputs, ``f_t(X) = f_0(X) + (I - exp(-eta t Theta / n)) (Y - f_0(X))`` and for
any input ``f_t(x) = f_0(x) + Theta(x, X) Theta^{-1} (I - exp(-eta t Theta / n)) (Y - f_0(X))``,
where ``Theta`` is the NTK (``get='ntk'``: all layers trained) or the NNGP
kernel ``K`` (``get='nngp'``: only the readout is trained, whose tangent kernel
is the NNGP kernel). With ``f_0 ~ GP(0, K)``, writing
``A_t(x) = Theta(x, X) Theta^{-1} (I - exp(-eta t Theta / n))``:

* mean ``mu_t(x) = A_t(x) Y``;
* ``get='ntk'``: covariance ``K(x, x') - A_t(x) K(X, x') - K(x, X) A_t(x')^T + A_t(x) K(X, X) A_t(x')^T``;
  at ``t = inf`` this is the ``Theta'`` of Lee et al. (2019) / the paper's Thm 3.3 (notes 1.5):
  ``K** + T*X T^{-1} K T^{-1} TX* - (T*X T^{-1} KX* + K*X T^{-1} TX*)``;
* ``get='nngp'``: covariance ``K(x, x') - K(x, X) K^{-1} (I - exp(-2 eta t K / n)) K(X, x')``,
  which is the expression above with ``Theta = K``; at ``t = inf`` it is the
  NNGP posterior covariance ``K** - K*X K^{-1} KX*`` (Thm 3.2).

``diag_reg`` (as in neural-tangents): the kernel that is inverted or
exponentiated is ``Theta + diag_reg * mean(diag Theta) * I`` (the factor
``mean(diag Theta)`` is dropped with ``diag_reg_absolute_scale=True``); the NNGP
matrices that enter the covariances are used as they are, except in the
``'nngp'`` formula above, whose ``K^{-1}`` and exponential are regularised (at
``t = inf`` this is the GP posterior with noise variance ``diag_reg * mean(diag K)``).

Finite ``t`` uses one eigendecomposition of the (regularised) training kernel
per ``get``; ``t = None`` / ``inf`` uses one Cholesky factorisation
(`smnngp.linalg.cholesky`). Both are computed on first use and cached.

Scale mixing (paper Thms 3.2, 3.3): with the readout variance
``sigma_v^2 ~ H`` drawn once per network, ``f | sigma_v^2 ~ N(mu, sigma_v^2 C)``
where ``(mu, C)`` is the Gaussian above for the kernel whose last layer has
``W_std = 1``. The mixing is over the PRIOR ``H``: for ``H = InvGamma(a, b)``
the law is ``MVT(2a, mu, (b/a) C)``, with ``2a`` degrees of freedom, not the
``2a + N`` of a Bayesian posterior. :func:`scale_mixture_predictive` builds that
law; :class:`ScaleMixtureNormal` handles any prior by one-dimensional quadrature
over ``log sigma_v^2``.
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
import numpyro.distributions as dist
from jax.scipy.special import gammaln, log_ndtr, logsumexp
from numpyro.distributions import constraints

from smnngp import linalg
from smnngp.kernels import canonical_get, pack
from smnngp.priors import as_prior, inverse_gamma_params, is_delta, is_inverse_gamma

__all__ = [
    "Gaussian",
    "gradient_descent_mse_ensemble",
    "gradient_descent_mse_scale_mixture",
    "scale_mixture_predictive",
    "predictive_marginals",
    "ScaleMixtureNormal",
    "ScaleMixtureNormal1D",
    "max_learning_rate",
]


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
    if not bool(jnp.all(jnp.isfinite(x))):
        bad = int(jnp.sum(~jnp.isfinite(x)))
        raise ValueError(f"{where}: {name} has {bad} non-finite (NaN or inf) entries")
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


def _as_matrix(k, name: str, shape: tuple[int, int]) -> jax.Array:
    k = jnp.asarray(k)
    if k.shape != shape:
        raise ValueError(
            f"gradient_descent_mse_ensemble: kernel_fn returned a {name} kernel of shape {tuple(k.shape)}, expected "
            f"{shape} (one kernel per output channel; flatten or pool spatial axes before the readout layer)"
        )
    return k


# ---------------------------------------------------------------------------
# The Gaussian ensemble
# ---------------------------------------------------------------------------


def max_learning_rate(ntk_train_train, y_train_size: int | None = None) -> float:
    """Largest stable full-batch GD learning rate for the convention above: ``2 n / lambda_max(Theta)``.

    One GD step maps the training residual by ``I - eta Theta / n``, a contraction iff ``eta < 2 n / lambda_max``.

    Args:
        ntk_train_train: the NTK (or NNGP kernel, for readout-only training) on the training inputs, (N, N).
        y_train_size: ``n``, the number of target entries the MSE averages over (N times the number of outputs
            C); ``None`` means N (one output).

    Returns:
        ``2 n / lambda_max`` as a Python float.

    Raises:
        ValueError: if ``ntk_train_train`` is not a non-empty square matrix or has no positive eigenvalue.
    """
    theta = linalg.check_square(jnp.asarray(ntk_train_train), "ntk_train_train")
    n = theta.shape[0] if y_train_size is None else int(y_train_size)
    lam = float(jnp.linalg.eigvalsh(theta)[-1])
    if not lam > 0:
        raise ValueError(f"max_learning_rate: the NTK has no positive eigenvalue (largest {lam:g})")
    return 2.0 * n / lam


def gradient_descent_mse_ensemble(
    kernel_fn: Callable,
    x_train,
    y_train,
    *,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    learning_rate: float = 1.0,
) -> Callable:
    """Gaussian law of infinitely wide networks trained by gradient flow on the MSE (module docstring).

    Args:
      kernel_fn: ``kernel_fn(x1, x2, get)`` returning the NNGP / NTK (e.g. from
        `smnngp.stax`); for the scale mixtures of the paper its last layer has ``W_std=1``.
      x_train: (N, ...) training inputs.
      y_train: (N,) or (N, C) training targets.
      diag_reg: relative diagonal regulariser (see the module docstring).
      diag_reg_absolute_scale: take ``diag_reg`` in absolute units.
      learning_rate: ``eta``; only ``eta * t`` matters.

    Returns:
      ``predict_fn(t=None, x_test=None, get=None, compute_cov=True)``:

      * ``t``: training time, a scalar or an array of any shape (leading axes of
        the result); ``None`` or ``inf`` means converged (``t -> inf``);
      * ``x_test``: (M, ...) test inputs; ``None`` means the training inputs,
        for which ``f_t(X)`` has mean ``(I - E) Y`` and covariance ``E K E``
        with ``E = exp(-eta t Theta_reg / n)`` (``Y`` and 0 at ``t = inf``);
        with ``diag_reg = 0`` this equals ``x_test=x_train``;
      * ``get``: ``'nngp'`` (readout-only training), ``'ntk'`` (all layers) or
        a tuple of them; ``None`` means ``('nngp', 'ntk')``;
      * returns a :class:`Gaussian` ``(mean, covariance)`` (just the mean with
        ``compute_cov=False``), or a named tuple of them for a tuple ``get``.
    """
    where = "gradient_descent_mse_ensemble"
    if not callable(kernel_fn):
        raise TypeError(f"{where}: kernel_fn must be callable, got {type(kernel_fn).__name__}")
    x_train = _float_array(x_train, "x_train", where)
    y_train = _float_array(y_train, "y_train", where)
    if x_train.ndim < 2:
        raise ValueError(f"{where}: x_train must have a batch axis and a feature axis, got shape {x_train.shape}")
    if y_train.ndim not in (1, 2):
        raise ValueError(f"{where}: y_train must be (N,) or (N, C), got shape {y_train.shape}")
    if y_train.shape[0] != x_train.shape[0]:
        raise ValueError(
            f"{where}: x_train has {x_train.shape[0]} points but y_train has {y_train.shape[0]} rows "
            f"(shapes {x_train.shape} and {y_train.shape})"
        )
    diag_reg = _check_scalar(diag_reg, "diag_reg", where, positive=False)
    learning_rate = _check_scalar(learning_rate, "learning_rate", where, positive=True)
    squeeze = y_train.ndim == 1
    y2 = y_train[:, None] if squeeze else y_train
    n_train, n_norm = x_train.shape[0], y2.size

    cache: dict[str, Any] = {}

    def kernels(x1, x2, names):
        out = kernel_fn(x1, x2, tuple(names))
        return {n: getattr(out, n) for n in names}

    def train_kernel(name: str) -> jax.Array:
        if name not in cache:
            want = ("nngp",) if name == "nngp" else ("nngp", "ntk")
            got = kernels(x_train, None, want)
            for n in want:
                cache[n] = _as_matrix(got[n], f"train-train {n}", (n_train, n_train))
        return cache[name]

    def regularised(name: str) -> jax.Array:
        k = train_kernel(name)
        scale = 1.0 if diag_reg_absolute_scale else jnp.mean(jnp.diag(k))
        return k + (diag_reg * scale) * jnp.eye(n_train, dtype=k.dtype)

    def eig(name: str):
        key = "eig_" + name
        if key not in cache:
            lam, U = linalg.eigh_psd(regularised(name), name=f"train {name} kernel")
            tol = n_train * float(jnp.finfo(lam.dtype).eps) * 10 * float(jnp.max(lam))
            cache[key] = (lam, U, lam > tol)
        return cache[key]

    def chol(name: str) -> jax.Array:
        key = "chol_" + name
        if key not in cache:
            fac = linalg.cholesky(regularised(name), name=f"train {name} kernel (+ diag_reg)")
            if fac.jitter > 0:
                warnings.warn(
                    f"{where}: the train {name} kernel is numerically singular; added jitter {fac.jitter:.3g} "
                    f"(pass diag_reg > 0 to control the regularisation)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            cache[key] = fac.L
        return cache[key]

    def predict_fn(t=None, x_test=None, get=None, compute_cov: bool = True):
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
        y = y2.astype(dtype)
        test = None
        if x_test is not None:
            m = x_test.shape[0]
            want = sorted(set(names) | ({"nngp"} if compute_cov else set()))
            k_td = kernels(x_test, x_train, want)
            test = {n: _as_matrix(v, f"test-train {n}", (m, n_train)) for n, v in k_td.items()}
            if compute_cov:
                test["nngp_tt"] = _as_matrix(kernels(x_test, None, ("nngp",))["nngp"], "test-test nngp", (m, m))
        outs = []
        for name in names:
            if t_arr is None:
                mean, cov = _predict_inf(name, y, test, compute_cov, train_kernel, chol)
            else:
                mean, cov = _predict_finite(name, y, test, compute_cov, t_arr, learning_rate, n_norm, train_kernel, eig)
            if squeeze:
                mean = mean[..., 0]
            outs.append(Gaussian(mean, cov) if compute_cov else mean)
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


def _predict_finite(name, y, test, compute_cov, t_arr, learning_rate, n_norm, train_kernel, eig):
    lam, U, pos = eig(name)
    rate = jnp.asarray((learning_rate * t_arr.reshape(-1)) / n_norm, lam.dtype)[:, None]  # (T, 1)
    k_dd = train_kernel("nngp") if compute_cov else None
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
    inf = jnp.isinf(rate)
    z = jnp.where(pos, lam * jnp.where(inf, 0.0, rate), 0.0)
    return jnp.where(inf, jnp.where(pos, 0.0, 1.0), jnp.exp(-z))


def _coef(lam, pos, rate):
    """Eigenvalues of Theta^{-1} (I - exp(-eta t Theta / n)): (1 - e^{-lam r}) / lam, r on the null space, and the
    pseudo-inverse (1 / lam, 0 on the null space) at r = inf."""
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
        return mean, _sym(k_tt - jnp.einsum("mi,ti,li->tml", tu, _coef(lam, pos, 2.0 * rate), tu))
    A = jnp.einsum("mi,ti,ji->tmj", tu, c, U)  # A_t(x*)
    cross = A @ k_td.T
    return mean, _sym(k_tt + A @ k_dd @ jnp.swapaxes(A, -1, -2) - cross - jnp.swapaxes(cross, -1, -2))


# ---------------------------------------------------------------------------
# Scale mixtures of Gaussians
# ---------------------------------------------------------------------------

# Window of u = log sigma^2 searched by the quadrature, by dtype.
_LOG_WINDOW = {np.dtype("float64"): 100.0, np.dtype("float32"): 60.0}
_N_COARSE = 4097
_N_FINE = 1025
_DROP = 60.0  # the fine grid spans where the log integrand is within _DROP of its maximum


def _log_window(dtype) -> float:
    return _LOG_WINDOW.get(np.dtype(dtype), 60.0)


def _log_prior_u(prior, u):
    """Log density of u = log sigma^2 under the prior on sigma^2: log h(e^u) + u."""
    lp = prior.log_prob(jnp.exp(u)) + u
    return jnp.where(jnp.isnan(lp), -jnp.inf, lp)


def _log_quad(log_f: Callable, batch_shape, dtype):
    """log of the integral over the real line of exp(log_f(u)) for a smooth, decaying, unimodal-ish integrand.

    ``log_f(u)`` maps a grid ``u`` of shape ``(..., G)`` (broadcasting against
    ``batch_shape + (1,)``) to log integrand values. A coarse grid over
    ``|u| <= W`` locates where the integrand is within ``exp(-60)`` of its
    peak; a fine trapezoid grid of 1025 points spans that bracket (the
    trapezoid rule converges geometrically for such integrands). Returns NaN
    where the integrand has not decayed inside the window (e.g. a density that
    is infinite at that point).
    """
    w = _log_window(dtype)
    u_c = jnp.linspace(-w, w, _N_COARSE, dtype=dtype)
    vals = jnp.broadcast_to(log_f(u_c), tuple(batch_shape) + (_N_COARSE,))
    vals = jnp.where(jnp.isnan(vals), -jnp.inf, vals)
    vmax = jnp.max(vals, axis=-1, keepdims=True)
    keep = vals > vmax - _DROP
    first = jnp.argmax(keep, axis=-1)
    last = _N_COARSE - 1 - jnp.argmax(keep[..., ::-1], axis=-1)
    lo = u_c[jnp.maximum(first - 1, 0)]
    hi = u_c[jnp.minimum(last + 1, _N_COARSE - 1)]
    s = jnp.linspace(0.0, 1.0, _N_FINE, dtype=dtype)
    u_f = lo[..., None] + (hi - lo)[..., None] * s
    v = log_f(u_f)
    v = jnp.where(jnp.isnan(v), -jnp.inf, v)
    h = (hi - lo) / (_N_FINE - 1)
    logw = jnp.log(jnp.concatenate([jnp.full((1,), 0.5, dtype), jnp.ones((_N_FINE - 2,), dtype),
                                    jnp.full((1,), 0.5, dtype)]))
    out = logsumexp(v + logw, axis=-1) + jnp.log(h)
    touches = (first == 0) | (last == _N_COARSE - 1)
    return jnp.where(touches | ~jnp.isfinite(vmax[..., 0]), jnp.nan, out)


class ScaleMixtureNormal(dist.Distribution):
    """``x = loc + sqrt(s) L z`` with ``s ~ prior`` (one draw per joint sample) and ``z ~ N(0, I)``.

    ``loc`` has shape ``batch_shape + event_shape`` with ``event_shape`` either
    ``(M,)`` (``event_ndim=1``) or ``(M, C)`` (``event_ndim=2``: C outputs
    sharing one scale draw, the paper's one ``sigma_v^2`` per network);
    ``scale_tril`` ``L`` is (M, M) and correlates the M axis; outputs are
    conditionally independent. Every batch element has its own scale.

    ``log_prob`` of a joint value: with ``q = sum_c |L^{-1} (x_c - loc_c)|^2``
    and ``d = M C``, ``log p = -d/2 log 2 pi - C log|L| + log int s^{-d/2}
    exp(-q / 2s) h(s) ds``. The integral is closed-form for an inverse gamma
    prior (the multivariate Student t, ``closed_form=True``) and a point mass,
    and otherwise computed by quadrature over ``log s`` (see :func:`_log_quad`;
    relative accuracy about 1e-10 in float64 for smooth priors).

    Args:
        loc: location, ``batch_shape + event_shape``.
        scale_tril: lower-triangular ``L``, (M, M), shared by the batch and the outputs.
        prior: the law of ``s``, anything :func:`smnngp.priors.as_prior` accepts.
        event_ndim: 1 (event shape (M,)) or 2 (event shape (M, C)).
        closed_form: use the closed form for an inverse gamma prior; with ``False`` it goes through the
            quadrature like any other prior (useful to test the quadrature).
        validate_args: numpyro's flag to validate arguments and values (``None``: numpyro's global default).

    Raises:
        ValueError: if ``event_ndim`` is not 1 or 2, ``loc`` has fewer than ``event_ndim`` axes, or
            ``scale_tril`` is not (M, M).
    """

    arg_constraints = {"loc": constraints.real}
    support = constraints.real_vector
    reparametrized_params = ["loc"]

    def __init__(self, loc, scale_tril, prior, *, event_ndim: int = 1, closed_form: bool = True,
                 validate_args=None):
        if event_ndim not in (1, 2):
            raise ValueError(f"ScaleMixtureNormal: event_ndim must be 1 or 2, got {event_ndim}")
        loc = jnp.asarray(loc)
        L = jnp.asarray(scale_tril)
        if loc.ndim < event_ndim:
            raise ValueError(f"ScaleMixtureNormal: loc of shape {loc.shape} has fewer than {event_ndim} axes")
        m = loc.shape[-event_ndim]
        if L.shape != (m, m):
            raise ValueError(f"ScaleMixtureNormal: scale_tril must be ({m}, {m}) for loc {loc.shape}, got {L.shape}")
        self.prior = as_prior(prior)
        self.loc, self.scale_tril = loc, L
        self.event_ndim_ = event_ndim
        self.closed_form = closed_form
        batch_shape, event_shape = loc.shape[: loc.ndim - event_ndim], loc.shape[loc.ndim - event_ndim:]
        if event_ndim == 2:
            self.support = constraints.independent(constraints.real, 2)
        super().__init__(batch_shape=batch_shape, event_shape=event_shape, validate_args=validate_args)

    def _mul_L(self, z):
        if self.event_ndim_ == 1:
            return z @ self.scale_tril.T
        return jnp.einsum("ij,...jc->...ic", self.scale_tril, z)

    def sample(self, key, sample_shape=()):
        k_s, k_z = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        s = jnp.asarray(self.prior.sample(k_s, shape), self.loc.dtype)
        z = jax.random.normal(k_z, shape + self.event_shape, self.loc.dtype)
        scale = jnp.sqrt(s).reshape(shape + (1,) * self.event_ndim_)
        return self.loc + scale * self._mul_L(z)

    def _quadratic(self, value):
        r = jnp.asarray(value) - self.loc
        m = self.event_shape[0]
        if self.event_ndim_ == 1:
            w = linalg.solve_triangular(self.scale_tril, r.reshape(-1, m).T).T.reshape(r.shape)
        else:
            c = self.event_shape[1]
            flat = jnp.moveaxis(r, -2, 0).reshape(m, -1)
            w = linalg.solve_triangular(self.scale_tril, flat).reshape((m,) + r.shape[:-2] + (c,))
            w = jnp.moveaxis(w, 0, -2)
        axes = tuple(range(-self.event_ndim_, 0))
        return jnp.sum(w**2, axis=axes)

    def log_prob(self, value):
        q = self._quadratic(value)
        d = math.prod(self.event_shape)
        n_out = d // self.event_shape[0]
        logdet = n_out * jnp.sum(jnp.log(jnp.diag(self.scale_tril)))
        const = -0.5 * d * math.log(2 * math.pi) - logdet
        return const + _log_mixture_integral(self.prior, q, d, self.closed_form, q.dtype)

    @property
    def mean(self):
        return jnp.broadcast_to(self.loc, self.batch_shape + self.event_shape)

    @property
    def variance(self):
        var = jnp.sum(self.scale_tril**2, axis=-1)
        if self.event_ndim_ == 2:
            var = var[:, None]
        return jnp.broadcast_to(_prior_mean(self.prior) * var, self.batch_shape + self.event_shape)

    def marginal(self) -> ScaleMixtureNormal1D:
        """Per-entry (univariate) laws: batch shape ``batch_shape + event_shape``."""
        sd = jnp.sqrt(jnp.sum(self.scale_tril**2, axis=-1))
        if self.event_ndim_ == 2:
            sd = sd[:, None]
        return ScaleMixtureNormal1D(self.loc, jnp.broadcast_to(sd, self.loc.shape), self.prior,
                                    closed_form=self.closed_form)


def _prior_mean(prior):
    if is_delta(prior):
        return prior.v
    try:
        return prior.mean
    except NotImplementedError:
        return jnp.nan


def _log_mixture_integral(prior, q, d: int, closed_form: bool, dtype):
    """log int s^{-d/2} exp(-q / (2 s)) h(s) ds, elementwise in q."""
    if is_delta(prior):
        s = jnp.asarray(prior.v, dtype)
        return -0.5 * d * jnp.log(s) - 0.5 * q / s
    if closed_form and is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return a * jnp.log(b) - gammaln(a) + gammaln(a + 0.5 * d) - (a + 0.5 * d) * jnp.log(b + 0.5 * q)
    return _quad_log_mixture(prior, jnp.asarray(q, dtype), d)


@functools.partial(jax.jit, static_argnames=("d",))
def _quad_log_mixture(prior, q, d: int):
    qe = q[..., None]
    return _log_quad(lambda u: _log_prior_u(prior, u) - 0.5 * d * u - 0.5 * qe * jnp.exp(-u), q.shape, q.dtype)


@jax.jit
def _quad_log_cdf(prior, r):
    """log int Phi(r / sqrt(s)) h(s) ds."""
    re = r[..., None]
    return _log_quad(lambda u: _log_prior_u(prior, u) + log_ndtr(re * jnp.exp(-0.5 * u)), r.shape, r.dtype)


class ScaleMixtureNormal1D(dist.Distribution):
    """Univariate ``x = loc + sqrt(s) scale z``, ``s ~ prior``, elementwise over the batch (marginal laws).

    ``log_prob`` and ``cdf`` are closed-form for an inverse gamma prior
    (Student t with ``2a`` degrees of freedom and scale ``sqrt(b/a) scale``) and a
    point mass, otherwise quadrature over ``log s``.

    Args:
        loc: location; broadcast with ``scale`` to the batch shape.
        scale: positive scale, broadcast with ``loc``.
        prior: the law of ``s``, anything :func:`smnngp.priors.as_prior` accepts.
        closed_form: use the closed forms for an inverse gamma prior; with ``False``, quadrature.
        validate_args: numpyro's flag to validate arguments and values (``None``: numpyro's global default).
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    reparametrized_params = ["loc", "scale"]

    def __init__(self, loc, scale, prior, *, closed_form: bool = True, validate_args=None):
        self.loc, self.scale = jnp.broadcast_arrays(jnp.asarray(loc), jnp.asarray(scale))
        self.prior = as_prior(prior)
        self.closed_form = closed_form
        super().__init__(batch_shape=self.loc.shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        k_s, k_z = jax.random.split(key)
        shape = tuple(sample_shape) + self.batch_shape
        s = jnp.asarray(self.prior.sample(k_s, shape), self.loc.dtype)
        return self.loc + jnp.sqrt(s) * self.scale * jax.random.normal(k_z, shape, self.loc.dtype)

    def log_prob(self, value):
        r = (jnp.asarray(value) - self.loc) / self.scale
        const = -0.5 * math.log(2 * math.pi) - jnp.log(self.scale)
        return const + _log_mixture_integral(self.prior, r**2, 1, self.closed_form, r.dtype)

    def cdf(self, value):
        r = (jnp.asarray(value) - self.loc) / self.scale
        prior = self.prior
        if is_delta(prior):
            return jax.scipy.stats.norm.cdf(r / jnp.sqrt(prior.v))
        if self.closed_form and is_inverse_gamma(prior):
            a, b = inverse_gamma_params(prior)
            return _t_cdf(r / jnp.sqrt(b / a), 2.0 * a)
        return jnp.exp(_quad_log_cdf(prior, r))

    @property
    def mean(self):
        return self.loc

    @property
    def variance(self):
        return _prior_mean(self.prior) * self.scale**2


def _t_cdf(x, df):
    """Student t CDF through the regularised incomplete beta function."""
    from jax.scipy.special import betainc

    tail = 0.5 * betainc(0.5 * df, 0.5, df / (df + x**2))
    return jnp.where(x > 0, 1.0 - tail, tail)


def _check_mean_cov(mean, cov, where):
    mean = _float_array(mean, "mean", where)
    cov = _float_array(cov, "cov", where)
    if mean.ndim not in (1, 2):
        raise ValueError(
            f"{where}: mean must be (M,) or (M, C), got shape {mean.shape} (index the time axis of a predict_fn "
            f"result first)"
        )
    m = mean.shape[0]
    if cov.shape != (m, m):
        raise ValueError(f"{where}: cov must be ({m}, {m}) for mean of shape {mean.shape}, got {cov.shape}")
    return mean, cov


def scale_mixture_predictive(mean, cov, prior, *, joint_outputs: bool = True):
    """Law of ``f = mean + sigma_v * N(0, cov)`` with ``sigma_v^2 ~ prior`` (paper Thms 3.1-3.3, eq. 5).

    ``(mean, cov)`` is the Gaussian of the kernel whose last layer has ``W_std = 1``
    (e.g. one :class:`Gaussian` from :func:`gradient_descent_mse_ensemble`).

    * ``mean`` (M,) or (M, 1): inverse gamma ``(a, b)`` gives numpyro's
      ``MultivariateStudentT(df=2a, loc=mean, scale_tril=chol((b/a) cov))``;
      a point mass ``Delta(s)`` gives ``MultivariateNormal(mean, s cov)``; any
      other prior a :class:`ScaleMixtureNormal`. Event shape (M,).
    * ``mean`` (M, C), C > 1, ``joint_outputs=True`` (default): one
      :class:`ScaleMixtureNormal` with event shape (M, C) in which all outputs
      share the scale draw, as the paper's single ``sigma_v^2`` per network
      implies (closed forms used for inverse gamma / point mass priors).
      ``joint_outputs=False``: a batch of C independent laws over the columns,
      batch shape (C,), event shape (M,) (built-in numpyro laws where they exist);
      each column's law is the exact marginal of the joint one.

    Args:
        mean: Gaussian mean, (M,) or (M, C).
        cov: Gaussian covariance between the M points, (M, M), positive definite (a tiny jitter is added, with a
            RuntimeWarning, when it is numerically singular).
        prior: scale prior on ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.
        joint_outputs: for C > 1 outputs, one joint law sharing the scale draw (default) or C independent laws.

    Returns:
        numpyro distribution: ``MultivariateStudentT``, ``MultivariateNormal`` or :class:`ScaleMixtureNormal`, as
        listed above.

    Raises:
        ValueError: if ``mean`` is not (M,) or (M, C), ``cov`` is not (M, M), an entry is not finite, the prior is
            invalid, or ``cov`` is not symmetric.
        NotPositiveDefiniteError: if ``cov`` is not positive definite even with jitter.
    """
    where = "scale_mixture_predictive"
    mean, cov = _check_mean_cov(mean, cov, where)
    prior = as_prior(prior)
    if mean.ndim == 2 and mean.shape[1] == 1:
        mean = mean[:, 0]
    fac = linalg.cholesky(cov, name="predictive covariance")
    if fac.jitter > 0:
        warnings.warn(f"{where}: the covariance is numerically singular; added jitter {fac.jitter:.3g}",
                      RuntimeWarning, stacklevel=2)
    L = fac.L
    if mean.ndim == 2 and joint_outputs:
        return ScaleMixtureNormal(mean, L, prior, event_ndim=2)
    loc = mean if mean.ndim == 1 else mean.T
    if is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return dist.MultivariateStudentT(2.0 * a, loc, jnp.sqrt(b / a) * L)
    if is_delta(prior):
        return dist.MultivariateNormal(loc, scale_tril=jnp.sqrt(jnp.asarray(prior.v, L.dtype)) * L)
    return ScaleMixtureNormal(loc, L, prior, event_ndim=1)


def predictive_marginals(mean, cov, prior):
    """Per-point laws of ``f_i = mean_i + sigma_v sqrt(cov_ii) z``: batch shape ``mean.shape``.

    Inverse gamma ``(a, b)``: numpyro ``StudentT(2a, mean, sqrt(b/a cov_ii))``;
    point mass ``Delta(s)``: ``Normal(mean, sqrt(s cov_ii))``; otherwise a
    :class:`ScaleMixtureNormal1D`.

    Args:
        mean: Gaussian mean, (M,) or (M, C).
        cov: Gaussian covariance, (M, M); only its diagonal is used, and it must be positive.
        prior: scale prior on ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.

    Returns:
        numpyro distribution with batch shape ``mean.shape``: ``StudentT``, ``Normal`` or
        :class:`ScaleMixtureNormal1D`.

    Raises:
        ValueError: if the shapes do not match, an entry is not finite, the prior is invalid, or a diagonal entry
            of ``cov`` is not positive.
    """
    mean, cov = _check_mean_cov(mean, cov, "predictive_marginals")
    prior = as_prior(prior)
    var = jnp.diag(cov)
    if bool(jnp.any(var <= 0)):
        raise ValueError(f"predictive_marginals: cov has non-positive diagonal entries (min {float(var.min()):.3g})")
    sd = jnp.sqrt(var) if mean.ndim == 1 else jnp.sqrt(var)[:, None]
    sd = jnp.broadcast_to(sd, mean.shape)
    if is_inverse_gamma(prior):
        a, b = inverse_gamma_params(prior)
        return dist.StudentT(2.0 * a, mean, jnp.sqrt(b / a) * sd)
    if is_delta(prior):
        return dist.Normal(mean, jnp.sqrt(jnp.asarray(prior.v, sd.dtype)) * sd)
    return ScaleMixtureNormal1D(mean, sd, prior)


def gradient_descent_mse_scale_mixture(
    kernel_fn: Callable,
    x_train,
    y_train,
    prior,
    *,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    learning_rate: float = 1.0,
    joint_outputs: bool = True,
) -> Callable:
    """Law of gradient-trained infinite networks whose readout variance is drawn from ``prior`` (Thms 3.2, 3.3).

    ``kernel_fn`` must be that of the network with last-layer ``W_std = 1``.
    Returns ``predict_fn(t=None, x_test=None, get='nngp')`` giving the
    distribution of :func:`scale_mixture_predictive` (a named tuple of them for
    a tuple ``get``). On the training inputs at ``t = inf`` the law is a point
    mass at ``y_train``, which has no density: pass ``x_test`` or a finite ``t``.

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get)`` of the network with last-layer ``W_std = 1``.
        x_train: (N, ...) training inputs.
        y_train: (N,) or (N, C) training targets.
        prior: scale prior on the readout variance ``sigma_v^2``, anything :func:`smnngp.priors.as_prior` accepts.
        diag_reg: relative diagonal regulariser, as in :func:`gradient_descent_mse_ensemble`.
        diag_reg_absolute_scale: take ``diag_reg`` in absolute units.
        learning_rate: ``eta``; only ``eta * t`` matters.
        joint_outputs: passed to :func:`scale_mixture_predictive` (one law shared by the C outputs, or C laws).

    Returns:
        ``predict_fn(t=None, x_test=None, get='nngp')``, where ``t`` is a scalar training time (``None`` or
        ``inf``: converged), ``x_test`` (M, ...) test inputs (``None``: the training inputs) and ``get`` ``'nngp'``,
        ``'ntk'`` or a tuple of them; it returns a numpyro distribution (a named tuple of them for a tuple
        ``get``), and raises ValueError for a non-scalar ``t`` or for the training inputs at ``t = inf``.

    Raises:
        TypeError: if ``kernel_fn`` is not callable or ``prior`` is not a distribution.
        ValueError: if the training data have mismatched shapes or non-finite entries, ``diag_reg`` is negative,
            ``learning_rate`` is not positive, or the prior is invalid.
    """
    prior = as_prior(prior)
    ensemble = gradient_descent_mse_ensemble(kernel_fn, x_train, y_train, diag_reg=diag_reg,
                                             diag_reg_absolute_scale=diag_reg_absolute_scale,
                                             learning_rate=learning_rate)

    def predict_fn(t=None, x_test=None, get="nngp"):
        if t is not None and np.ndim(t) != 0:
            raise ValueError("gradient_descent_mse_scale_mixture: t must be a scalar (one distribution per call)")
        names, single = canonical_get(get)
        out = ensemble(t=t, x_test=x_test, get=names, compute_cov=True)
        laws = []
        for name in names:
            g = getattr(out, name)
            if x_test is None and not bool(jnp.any(jnp.diag(g.covariance) > 0)):
                raise ValueError("gradient_descent_mse_scale_mixture: at t=inf the training outputs equal y_train "
                                 "exactly (zero covariance); pass x_test or a finite t")
            laws.append(scale_mixture_predictive(g.mean, g.covariance, prior, joint_outputs=joint_outputs))
        return pack(names, single, laws)

    return predict_fn
