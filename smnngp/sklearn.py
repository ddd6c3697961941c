"""A scikit-learn regressor over the exact scale-mixture posteriors of `smnngp.posterior`.

:class:`ScaleMixtureRegressor` is a thin estimator layer: ``fit`` validates the
data, optionally standardises ``y``, and calls :func:`smnngp.posterior.fit`;
every prediction method maps the functional posterior back to the original
units of ``y``.  It follows :class:`sklearn.gaussian_process.GaussianProcessRegressor`
where the two overlap (``predict(return_std=, return_cov=)``, ``sample_y``,
``normalize_y``), so a Student-t process drops into existing pipelines::

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from smnngp.sklearn import ScaleMixtureRegressor

    model = make_pipeline(StandardScaler(), ScaleMixtureRegressor(prior="student_t"))
    model.fit(X, y).predict(X_test)

Floating point: kernels of deep networks are close to singular, and a float32
Cholesky of them is often meaningless.  The estimator therefore computes in
float64 *without touching the global flag*: every method runs inside JAX's
thread-local ``jax.enable_x64(True)`` context (``jax.experimental.enable_x64``
on older JAX), so the rest of the program keeps whatever precision it chose.
All arrays returned are NumPy float64.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_array, check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from smnngp import models
from smnngp import posterior as _posterior
from smnngp import priors as _priors

__all__ = ["ScaleMixtureRegressor"]


def _x64():
    """Thread-local float64 context (``jax.enable_x64`` on current JAX, ``jax.experimental`` before)."""
    cm = getattr(jax, "enable_x64", None)
    if cm is None:  # pragma: no cover - JAX < 0.4.36
        from jax.experimental import enable_x64 as cm
    return cm(True)


def _jax_key(random_state):
    """A JAX PRNG key drawn from anything :func:`sklearn.utils.check_random_state` accepts."""
    seed = check_random_state(random_state).randint(np.iinfo(np.int32).max)
    return jax.random.PRNGKey(seed)


# --------------------------------------------------------------------------------------------
# Picklable kernels (fitted estimators must survive pickle / joblib, so no lambdas or closures are stored)


@functools.lru_cache(maxsize=16)
def _mlp_kernel_fns(depth, activation, W_std, b_std):
    """Jitted ``k(x, None)`` and ``k(x1, x2)`` of the default MLP, shared by all estimators with these settings.

    Jitting the whole kernel costs one compilation per input shape instead of one
    per primitive and shape (eager dispatch); sharing it across estimators lets
    clones, cross-validation folds and refits reuse those compilations.
    """
    kernel_fn = models.mlp(depth, activation, W_std, b_std, readout_bias=False)[2]
    return jax.jit(lambda x1: kernel_fn(x1, None, "nngp")), jax.jit(lambda x1, x2: kernel_fn(x1, x2, "nngp"))


class _MLPKernel:
    """NNGP of ``depth`` x [Dense(W_std, b_std), activation] followed by Dense(1, W_std=1), as ``k(x1, x2)``.

    (`smnngp.models.mlp` without a readout bias.)

    The readout has unit weight variance and no bias so that the scale prior on
    sigma_v^2 carries the output scale (paper section 3).  Picklable: it holds
    only its settings.
    """

    def __init__(self, depth, activation, W_std, b_std):
        self.params = (int(depth), activation, float(W_std), None if b_std is None else float(b_std))

    def __call__(self, x1, x2=None):
        k_self, k_cross = _mlp_kernel_fns(*self.params)
        return k_self(x1) if x2 is None else k_cross(x1, x2)

    def __repr__(self):
        depth, activation, W_std, b_std = self.params
        return f"_MLPKernel(depth={depth}, activation={activation!r}, W_std={W_std}, b_std={b_std})"


class _NNGPOf:
    """``k(x1, x2) = kernel_fn(x1, x2, 'nngp')`` for a stax-style ``kernel_fn``; picklable when it is."""

    def __init__(self, kernel_fn):
        self.kernel_fn = kernel_fn

    def __call__(self, x1, x2=None):
        return self.kernel_fn(x1, x2, "nngp")


def _has_get(fn) -> bool:
    try:
        return "get" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# Parameter checks (sklearn: no validation in __init__, so it happens at fit)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _positive(est, name, allow_zero=False):
    v = getattr(est, name)
    ok = _is_real(v) and math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if not ok:
        what = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{type(est).__name__}: parameter {name!r} must be {what} finite number, got {v!r}")
    return float(v)


# --------------------------------------------------------------------------------------------


class ScaleMixtureRegressor(RegressorMixin, BaseEstimator):
    """Regression with a scale mixture of an infinite-width network's NNGP (paper section 3.1).

    The model, for training targets ``y`` (standardised when ``normalize_y``)::

        sigma^2 ~ prior,    y | sigma^2 ~ N(0, sigma^2 (K + noise I))     (noise_model='scaled')
                            y | sigma^2 ~ N(0, sigma^2 K + noise I)       (noise_model='unscaled')

    ``prior='gaussian'`` is the NNGP (``sigma^2 = 1``), ``'student_t'`` the
    Student-t process (``sigma^2 ~ InvGamma(a, b)``, exact), ``'burr12'`` a
    heavy-tailed Burr XII scale prior (``BurrXII(c, k)``, by importance sampling
    with ``num_samples`` prior draws).  Several targets (2-D ``y``) share one
    ``sigma^2``.

    Parameters
    ----------
    kernel : callable or None, default=None
        A stax ``kernel_fn(x1, x2, get)`` (its NNGP is used; build it with a
        readout ``Dense(1, W_std=1)`` so the prior carries the scale), a stax
        layer triple, or a plain ``k(x1, x2) -> (n1, n2)`` with ``k(x, None)``
        the training kernel.  ``None`` builds the NNGP of an MLP from
        ``depth``, ``activation``, ``W_std`` and ``b_std``.
    prior : {'gaussian', 'student_t', 'burr12'} or distribution, default='student_t'
        The scale prior, or any positive scalar distribution from
        `smnngp.priors` / numpyro (a number ``s`` means the point mass at ``s``).
    noise : float, default=1e-2
        Observation noise variance (relative to sigma^2 when ``noise_model='scaled'``).
    noise_model : {'scaled', 'unscaled'}, default='scaled'
        ``'scaled'`` is conjugate (exact Student-t process); ``'unscaled'`` needs ``noise > 0``.
    normalize_y : bool, default=True
        Standardise each target to zero mean and unit variance before fitting
        (a constant target gets scale 1); predictions, standard deviations,
        covariances, samples and densities are returned in the original units.
    num_samples : int, default=10000
        Prior draws of sigma^2 for importance sampling (non-conjugate priors only).
    random_state : int, RandomState instance or None, default=None
        Seeds the importance sampler.
    method : {'auto', 'dense', 'cg'}, default='auto'
        The dense path or the matrix-free one (`smnngp.matfree`), as in :func:`smnngp.posterior.fit`.
    cg : smnngp.matfree.CG or None, default=None
        Settings of the matrix-free path (``None``: its defaults).
    depth, activation, W_std, b_std :
        Hidden layers, activation (``'relu'`` or ``'erf'``) and weight / bias
        standard deviations of the default MLP kernel (ignored when ``kernel`` is given).
    a, b : float, default=2.0
        Shape and scale of the inverse-gamma prior of ``prior='student_t'``.
    c, k : float, default=2.0, 1.0
        Parameters of the Burr XII prior of ``prior='burr12'``.

    Attributes
    ----------
    posterior_ : smnngp.posterior.Posterior
        The fitted functional posterior (in standardised units when ``normalize_y``).
    log_marginal_likelihood_ : float
        ``log p(y)`` in the original units of ``y`` (the Jacobian of the
        standardisation, ``-N sum_c log std_c``, is included).
    prior_ : numpyro distribution
        The scale prior that was used.
    kernel_ : callable
        ``k(x1, x2)`` that was used.
    y_train_mean_, y_train_std_ : ndarray
        The standardisation of ``y`` (0 and 1 when ``normalize_y=False``).
    n_features_in_ : int
    feature_names_in_ : ndarray, only when ``X`` has string feature names.

    Notes
    -----
    All predictive quantities describe a *new observation* ``y*`` (observation
    noise included) unless ``noisy=False`` is passed, which gives the latent
    function ``f*``.  The predictive of the Student-t process is a Student-t
    with ``df = 2a + N C`` degrees of freedom: its standard deviation and
    covariance are ``inf`` when ``df <= 2``.  With a 2-D ``y`` of one column,
    outputs keep the target axis (scikit-learn's GaussianProcessRegressor drops it).
    Computation is in float64 (see the module docstring).  A fitted estimator
    pickles when its kernel does: the default kernel and module-level functions
    do, closures such as a stax ``kernel_fn`` do not.  The default kernel is
    jitted; jit a custom one (``jax.jit(kernel_fn, static_argnames='get')``) to
    avoid op-by-op dispatch.
    """

    def __init__(
        self,
        kernel=None,
        prior="student_t",
        *,
        noise=1e-2,
        noise_model="scaled",
        normalize_y=True,
        num_samples=10_000,
        random_state=None,
        method="auto",
        cg=None,
        depth=2,
        activation="relu",
        W_std=models.W_STD["relu"],
        b_std=models.B_STD,
        a=models.PRIOR_DEFAULTS["a"],
        b=models.PRIOR_DEFAULTS["b"],
        c=models.PRIOR_DEFAULTS["c"],
        k=models.PRIOR_DEFAULTS["k"],
    ):
        self.kernel = kernel
        self.prior = prior
        self.noise = noise
        self.noise_model = noise_model
        self.normalize_y = normalize_y
        self.num_samples = num_samples
        self.random_state = random_state
        self.method = method
        self.cg = cg
        self.depth = depth
        self.activation = activation
        self.W_std = W_std
        self.b_std = b_std
        self.a = a
        self.b = b
        self.c = c
        self.k = k

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags

    def __getstate__(self):
        # JAX arrays unpickle in the dtype the *loading* process allows (float32 unless x64 is on there),
        # so the fitted posterior travels as NumPy float64 arrays, which every method re-reads under x64.
        state = dict(super().__getstate__())  # object.__getstate__ returns __dict__ itself
        post = state.get("posterior_")
        if post is not None:
            state["posterior_"] = jax.tree.map(np.asarray, post)  # every leaf of the pytree, the prior's included
        return state

    # -- parameter resolution --

    def _resolve_kernel(self):
        kernel = self.kernel
        name = type(self).__name__
        if kernel is None:
            depth = self.depth
            if not (isinstance(depth, numbers.Integral) and not isinstance(depth, bool) and depth >= 0):
                raise ValueError(f"{name}: parameter 'depth' must be a non-negative integer, got {depth!r}")
            if self.activation not in models.ACTIVATIONS:
                raise ValueError(f"{name}: parameter 'activation' must be one of {tuple(models.ACTIVATIONS)}, "
                                 f"got {self.activation!r}")
            W_std = _positive(self, "W_std")
            b_std = None if self.b_std is None else _positive(self, "b_std", allow_zero=True)
            return _MLPKernel(depth, self.activation, W_std, b_std)
        if isinstance(kernel, tuple) and len(kernel) == 3 and all(callable(f) for f in kernel):
            kernel = kernel[2]
        if not callable(kernel):
            raise ValueError(f"{name}: parameter 'kernel' must be None, a stax kernel_fn or a callable "
                             f"k(x1, x2), got {type(kernel).__name__}")
        return _NNGPOf(kernel) if _has_get(kernel) else kernel

    def _resolve_prior(self):
        prior = self.prior
        name = type(self).__name__
        if isinstance(prior, str):
            if prior not in models.MODELS:
                raise ValueError(f"{name}: parameter 'prior' must be one of {models.MODELS} or a distribution, "
                                 f"got {prior!r}")
            return models.prior(prior, {p: _positive(self, p) for p in models.PRIOR_PARAMS[prior]})
        try:
            return _priors.as_prior(prior)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}: parameter 'prior' is invalid: {e}") from e

    def _check_params(self):
        name = type(self).__name__
        noise = _positive(self, "noise", allow_zero=True)
        if self.noise_model not in ("scaled", "unscaled"):
            raise ValueError(f"{name}: parameter 'noise_model' must be 'scaled' or 'unscaled', "
                             f"got {self.noise_model!r}")
        if self.noise_model == "unscaled" and noise == 0:
            raise ValueError(f"{name}: parameter 'noise' must be positive with noise_model='unscaled'")
        if not isinstance(self.normalize_y, (bool, np.bool_)):
            raise ValueError(f"{name}: parameter 'normalize_y' must be a bool, got {self.normalize_y!r}")
        ns = self.num_samples
        if not (isinstance(ns, numbers.Integral) and not isinstance(ns, bool) and ns >= 1):
            raise ValueError(f"{name}: parameter 'num_samples' must be a positive integer, got {ns!r}")
        return noise

    # -- fitting --

    def fit(self, X, y):
        """Fit the posterior to ``X`` (n_samples, n_features) and ``y`` (n_samples,) or (n_samples, n_targets)."""
        noise = self._check_params()
        kernel = self._resolve_kernel()
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if self.normalize_y:
            mean = np.mean(y, axis=0)
            std = np.std(y, axis=0)
            # a constant target (or a single sample) gets unit scale, as in sklearn's GaussianProcessRegressor
            std = np.where(std > 10 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(mean)), std, 1.0)
        else:
            mean, std = np.zeros(y.shape[1:]), np.ones(y.shape[1:])
        y_std = (y - mean) / std
        with _x64():
            prior = self._resolve_prior()
            key = _jax_key(self.random_state)
            post = _posterior.fit(kernel, jnp.asarray(X), jnp.asarray(y_std), prior, noise=noise,
                                  noise_model=self.noise_model, num_samples=int(self.num_samples), key=key,
                                  method=self.method, cg=self.cg)
        self.kernel_ = kernel
        self.prior_ = post.prior
        self.posterior_ = post
        self.y_train_mean_ = np.asarray(mean, dtype=np.float64)
        self.y_train_std_ = np.asarray(std, dtype=np.float64)
        self.log_marginal_likelihood_ = float(post.log_marginal_likelihood - y.shape[0] * np.sum(np.log(std)))
        return self

    # -- prediction --

    def _check_X(self, X):
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def _predictive(self, X, noisy):
        return self.posterior_.predict(jnp.asarray(X), noisy=noisy)

    def predict(self, X, return_std=False, return_cov=False, *, noisy=True):
        """Predictive mean at ``X``, and optionally its standard deviation or joint covariance.

        Returns ``y_mean`` (n_samples_X,) or (n_samples_X, n_targets); with
        ``return_std`` also ``y_std`` of the same shape, with ``return_cov``
        also ``y_cov`` (n_samples_X, n_samples_X) or (n_samples_X, n_samples_X,
        n_targets).  At most one of the two can be requested.  ``std`` and
        ``cov`` are ``inf`` for a Student-t predictive with ``df <= 2``.
        """
        if return_std and return_cov:
            raise RuntimeError("At most one of return_std or return_cov can be requested.")
        X = self._check_X(X)
        mu, sd = self.y_train_mean_, self.y_train_std_
        with _x64():
            p = self._predictive(X, noisy)
            mean = np.asarray(p.mean, dtype=np.float64) * sd + mu
            if return_std:
                var = np.asarray(p.variance, dtype=np.float64)
                if isinstance(self.posterior_, _posterior.StudentTPosterior) and self.posterior_.df <= 2:
                    var = np.full_like(var, np.inf)
                return mean, np.sqrt(var) * sd
            if return_cov:
                cov = np.asarray(self.posterior_.predict_covariance(jnp.asarray(X), noisy=noisy), dtype=np.float64)
                return mean, cov * sd**2
        return mean

    def predict_interval(self, X, level=0.95, *, noisy=True):
        """Central ``level`` predictive interval ``(lower, upper)`` at ``X``, each shaped like ``predict(X)``."""
        if not (_is_real(level) and 0 < level < 1):
            raise ValueError(f"level must be in (0, 1), got {level!r}")
        X = self._check_X(X)
        mu, sd = self.y_train_mean_, self.y_train_std_
        with _x64():
            lo, hi = _posterior.interval(self._predictive(X, noisy), float(level))
            lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
        return lo * sd + mu, hi * sd + mu

    def sample_y(self, X, n_samples=1, random_state=0, *, noisy=True):
        """Joint draws from the predictive at ``X`` (one sigma^2 per draw, shared by all points and targets).

        Returns an array of shape (n_samples_X, n_samples) for 1-D ``y``, else
        (n_samples_X, n_targets, n_samples), as GaussianProcessRegressor.sample_y.
        """
        if not (isinstance(n_samples, numbers.Integral) and not isinstance(n_samples, bool) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        X = self._check_X(X)
        with _x64():
            draws = self.posterior_.sample_f(_jax_key(random_state), jnp.asarray(X), int(n_samples), noisy=noisy)
            draws = np.asarray(draws, dtype=np.float64)
        draws = draws * self.y_train_std_ + self.y_train_mean_  # (n_samples, n_X[, n_targets])
        return np.moveaxis(draws, 0, -1)

    def log_predictive_density(self, X, y, *, noisy=True):
        """Mean over points of the marginal predictive log density ``log p(y_i | X_i, training data)``.

        In the original units of ``y`` (``log p(y) = log p(y_tilde) - sum_c log std_c``
        under standardisation), summed over targets for 2-D ``y``.
        """
        X = self._check_X(X)
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")
        expected = (X.shape[0],) + self.y_train_mean_.shape
        if y.shape != expected:
            raise ValueError(f"y must have shape {expected} (like the training targets), got {y.shape}")
        y_std = (y - self.y_train_mean_) / self.y_train_std_
        with _x64():
            lp = np.asarray(self.posterior_.log_predictive_density(jnp.asarray(y_std), jnp.asarray(X), noisy=noisy),
                            dtype=np.float64)
        return float(np.mean(lp) - np.sum(np.log(self.y_train_std_)))

