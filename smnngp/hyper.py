"""Hyperparameter fitting for scale mixtures of NNGPs by marginal likelihood (paper App. G, notes 2.4).

Any kernel whose hyperparameters are a pytree is fitted: a
`smnngp.kernels.ParametricKernel`, built for any `smnngp.stax` architecture by
`smnngp.stax.parametric_kernel` (MLP, CNN with pooling, residual blocks) or
written by hand (`smnngp.kernels.rbf`). :func:`fit_kernel` fits, for a model of
`smnngp.models` (its kernel computed with readout variance 1 where a prior
carries the scale):

* the kernel's unconstrained ``theta`` (all of it);
* ``noise`` (``eps`` of the scaled-noise model);
* ``'student_t'``: ``a``, ``b`` of ``InverseGamma(a, b)``; ``'burr12'``: ``c``,
  ``k`` of ``BurrXII(c, k)``; ``'gaussian'``: nothing more (the prior is
  ``Delta(1)``, so the kernel's own readout scale is the NNGP's variance).

The noise and prior parameters are kept positive by a log transform
(``value = floor + exp(raw)``, so that Adam's steps are relative changes), as
`smnngp.stax.parametric_kernel` keeps the scales of an architecture.

The loss is ``-log p(Y) / (N C)`` (closed form for the Gaussian and the
Student-t process; for Burr XII a reparameterised importance-sampling estimate
with fixed uniforms, so the loss is a smooth function of ``c`` and ``k``).  Its
gradient with respect to the kernel's ``theta`` is written by hand (see
:func:`_gaussian_terms`): forward mode through the kernel, one pass per
hyperparameter, instead of reverse mode through a Cholesky and the kernel's
recursion.  Adam runs with a plateau-reduced learning rate
(`optax.contrib.reduce_on_plateau` fed the validation NLL every ``eval_every``
steps: factor 0.5, patience 5); training stops when the learning rate has been
halved ``max_halvings`` times or after ``max_steps``; the state with the best
validation NLL is kept (early stopping).

The MLP helpers are a convenience on top: :func:`mlp_kernel` (a stax
``kernel_fn``), :func:`mlp_parametric_kernel`, :func:`fit_hyperparameters`
(``depth`` hidden layers of ``activation``, ``Dense(W_std, b_std)`` each, then a
readout ``Dense(1, W_std=last_W_std, b_std=b_std)``; ``last_W_std`` is fitted
for ``'gaussian'`` and ``'burr12'`` and fixed at 1 for ``'student_t'``, whose
scale is ``b / a``) and :func:`select_architecture` (depth and activation by
validation NLL).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp

from smnngp import _optim, linalg, matfree, models, posterior, priors, stax
from smnngp._checks import check_finite
from smnngp.kernels import ParametricKernel
from smnngp.models import MODELS

__all__ = [
    "MODELS",
    "FitResult",
    "fit_kernel",
    "fit_hyperparameters",
    "fit_burr_given_kernel",
    "select_architecture",
    "mlp_kernel",
    "mlp_parametric_kernel",
    "default_init",
    "prior_of",
]

# value = floor + exp(raw) for every positive hyperparameter this module fits by name.
_FLOORS = {
    "scale": 1e-6, "noise": 1e-6, "W_std": 1e-3, "b_std": 0.0,
    "a": 1e-3, "b": 1e-6, "c": 1e-2, "k": 1e-2, "last_W_std": 1e-3,
}
_NOISE_INIT = 0.1
_MLP_SCALES = ("W_std", "b_std", "last_W_std")
# the names the noise and the priors use: a kernel's hyperparameters must be named otherwise
_RESERVED = ("noise", "scale", *sorted({n for names in models.PRIOR_PARAMS.values() for n in names}))

prior_of = models.prior


def _constrain(raw: dict) -> dict:
    return {k: jnp.exp(v) + _FLOORS[k] for k, v in raw.items()}


def _unconstrain(values: dict) -> dict:
    return {k: jnp.asarray(math.log(max(float(v) - _FLOORS[k], 1e-12))) for k, v in values.items()}


def _floats(tree):
    """A pytree of arrays as Python floats (scalars) and lists of floats (JSON-ready)."""
    return jax.tree_util.tree_map(lambda v: np.asarray(v, dtype=float).tolist(), tree)


# --------------------------------------------------------------------------------------------
# The MLP convenience


def mlp_kernel(depth: int, activation: str, W_std, b_std, last_W_std=1.0):
    """NNGP ``kernel_fn`` of an MLP with ``depth`` hidden layers (scales may be traced; `smnngp.models.mlp`).

    Args:
        depth: number of hidden layers, a positive int.
        activation: ``'relu'`` or ``'erf'``.
        W_std: weight standard deviation of the hidden layers.
        b_std: bias standard deviation of the hidden layers and the readout (``None``: no biases).
        last_W_std: weight standard deviation of the readout layer.

    Returns:
        The stax ``kernel_fn(x1, x2=None, get=None)`` of the MLP.

    Raises:
        ValueError: if ``depth`` is not a positive integer or ``activation`` is unknown.
    """
    _check_depth(depth)
    return models.mlp(depth, activation, W_std, b_std, last_W_std)[2]


def _check_depth(depth):
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")


def mlp_parametric_kernel(depth: int, activation: str, init: dict[str, float]) -> ParametricKernel:
    """The MLP's NNGP as a `ParametricKernel` over ``init``'s scales (``W_std``, ``b_std``, optionally ``last_W_std``).

    A scale left out of ``init`` is fixed (``last_W_std`` at 1). Floors as in this module (``W_std``,
    ``last_W_std`` above 1e-3, ``b_std`` above 0).

    Args:
        depth: number of hidden layers, a positive int.
        activation: ``'relu'`` or ``'erf'``.
        init: starting values of the fitted scales: ``W_std`` and ``b_std``, optionally ``last_W_std``; each must
            exceed its floor.

    Returns:
        `smnngp.kernels.ParametricKernel` of the MLP's NNGP (readout with bias), built by
        `smnngp.stax.parametric_kernel`, whose ``constrain(theta)`` gives the scales named in ``init``.

    Raises:
        ValueError: if ``depth`` is not a positive integer, ``init`` lacks ``W_std`` or ``b_std`` or holds other
            names, ``activation`` is unknown, or a starting value is not above its floor.
    """
    _check_depth(depth)
    unknown = set(init) - set(_MLP_SCALES)
    if unknown or not {"W_std", "b_std"} <= set(init):
        raise ValueError(f"mlp_parametric_kernel: init must hold W_std, b_std and optionally last_W_std, "
                         f"got {sorted(init)}")
    arch = models.mlp_arch(depth, activation)
    start = {k: float(v) for k, v in init.items()}
    return stax.parametric_kernel(arch, start, floor={k: _FLOORS[k] for k in start})


def default_init(model: str, activation: str = "relu") -> dict[str, float]:
    """Starting values of the MLP fit (for standardised inputs and targets), in `fit_hyperparameters`' order.

    Args:
        model: ``'gaussian'``, ``'student_t'`` or ``'burr12'``.
        activation: ``'relu'`` or ``'erf'``; sets the starting ``W_std`` (`smnngp.models.W_STD`).

    Returns:
        Dict of starting values: ``W_std``, ``b_std`` (0.1) and ``noise`` (0.1) for every model, then
        ``last_W_std`` (1) for ``'gaussian'``, ``a`` and ``b`` (2, 2) for ``'student_t'``, or ``c``, ``k`` (2, 1)
        and ``last_W_std`` (1) for ``'burr12'``.

    Raises:
        ValueError: if ``model`` or ``activation`` is unknown.
    """
    models.check_model(model)
    if activation not in models.ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(models.ACTIVATIONS)}, got {activation!r}")
    init = {"W_std": models.W_STD[activation], "b_std": models.B_STD, "noise": _NOISE_INIT}
    if model == "gaussian":
        init["last_W_std"] = 1.0
    elif model == "student_t":
        init.update({n: models.PRIOR_DEFAULTS[n] for n in models.PRIOR_PARAMS[model]})
    else:
        init.update({n: models.PRIOR_DEFAULTS[n] for n in models.PRIOR_PARAMS[model]}, last_W_std=1.0)
    return init


# --------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass
class FitResult:
    """Outcome of :func:`fit_kernel` / :func:`fit_hyperparameters`: the best state by validation NLL and its history.

    ``params`` holds the fitted values as Python floats: the kernel's (``kernel.constrain(theta)``), the
    ``noise`` and the prior's. ``kernel`` is the `ParametricKernel` at the fitted ``theta``; ``depth`` and
    ``activation`` are set for the MLP of :func:`fit_hyperparameters` (``None`` otherwise).

    Attributes:
        model: the model fitted, ``'gaussian'``, ``'student_t'`` or ``'burr12'``.
        depth: number of hidden layers of the MLP, or ``None`` for a kernel given to :func:`fit_kernel`.
        activation: the MLP's activation name, or ``None``.
        params: fitted values by name, as Python floats (lists of floats for array-valued kernel parameters).
        val_nll: validation negative log predictive density per point and output at the kept state.
        steps: number of optimisation steps after which the kept state was reached.
        seconds: wall-clock duration of the fit.
        history: one dict per evaluation with ``step``, ``loss`` (training loss), ``val_nll`` and, for
            :func:`fit_kernel` and :func:`fit_hyperparameters`, ``lr_scale`` (the plateau factor).
        kernel: the `ParametricKernel` at the fitted ``theta``.
    """

    model: str
    depth: int | None
    activation: str | None
    params: dict[str, Any]
    val_nll: float
    steps: int
    seconds: float
    history: list[dict[str, float]]
    kernel: ParametricKernel | None = None

    @property
    def kernel_fn(self):
        """The MLP's stax ``kernel_fn`` at the fitted scales; for other kernels, the fitted ``k(x1, x2)``."""
        if self.depth is not None:
            return mlp_kernel(self.depth, self.activation, self.params["W_std"], self.params["b_std"],
                              self.params.get("last_W_std", 1.0))
        return self.kernel

    @property
    def prior(self):
        return prior_of(self.model, self.params)

    def posterior(self, x_train, y_train, *, num_samples: int = 10_000, key=None, min_ess: float = 30.0):
        """The exact / importance-sampling posterior on (all) training data with these hyperparameters."""
        kt = _kernel_fns(self.kernel.apply)[0](self.kernel.theta, jnp.asarray(x_train))
        return posterior.fit_from_kernels(kt, y_train, self.prior, noise=self.params["noise"],
                                          num_samples=num_samples, key=key, min_ess=min_ess)

    def test_kernels(self, x_test, x_train):
        """``(k(x_test, x_train), diag k(x_test, x_test))`` for :meth:`smnngp.posterior.Posterior.predict`."""
        return _kernel_fns(self.kernel.apply)[1](self.kernel.theta, jnp.asarray(x_test), jnp.asarray(x_train))


@functools.lru_cache(maxsize=64)
def _kernel_fns(apply):
    """Jitted ``K(x, x)`` and ``(K(xs, x), diag K(xs, xs))`` of one kernel, compiled once per kernel and shape."""

    def test(theta, xs, x):
        return apply(theta, xs, x), jax.vmap(lambda xi: apply(theta, xi[None], xi[None])[0, 0])(xs)

    return jax.jit(lambda theta, x: apply(theta, x, None)), jax.jit(test)


# --------------------------------------------------------------------------------------------
# The loss and its gradient


@functools.lru_cache(maxsize=64)
def _gaussian_terms(apply):
    """``(q, ln|C|)`` of ``C = K(theta) + noise I`` with a hand-written reverse-mode rule.

    Reverse-mode differentiation through a Cholesky and through the kernel's
    arc-cosine recursion costs 10-30x the forward pass on CPU.  The gradient
    only needs ``dq/dC = -alpha alpha^T``, ``dln|C|/dC = C^{-1}`` and the kernel's
    derivatives with respect to its P hyperparameters, which forward mode gives
    for about P forward passes (one `vmap`): ``dL/dtheta_p = <G, dK/dtheta_p>``.
    Memory: the P tangents of every intermediate of the kernel are alive at
    once.
    """

    def forward(theta, noise, x, y):
        flat, unravel = ravel_pytree(theta)
        K, J = jax.vmap(lambda t: jax.jvp(lambda f: apply(unravel(f), x, None), (flat,), (t,)), out_axes=(None, 0))(
            jnp.eye(flat.shape[0], dtype=flat.dtype))
        n = x.shape[0]
        C = K + noise * jnp.eye(n, dtype=K.dtype)
        L = linalg.cholesky_jittered(C, 1e-9)
        alpha = linalg.cho_solve(L, y)
        return (jnp.sum(y * alpha), linalg.logdet(L)), (J, L, alpha)

    @jax.custom_vjp
    def terms(theta, noise, x, y):
        return forward(theta, noise, x, y)[0]

    def fwd(theta, noise, x, y):
        out, (J, L, alpha) = forward(theta, noise, x, y)
        return out, (theta, J, L, alpha, x, y)

    def bwd(res, g):
        theta, J, L, alpha, x, y = res
        g_q, g_ld = g
        c_inv = linalg.cho_solve(L, jnp.eye(L.shape[0], dtype=L.dtype))
        G = g_ld * c_inv - g_q * (alpha @ alpha.T)
        unravel = ravel_pytree(theta)[1]
        return unravel(jnp.einsum("ij,pij->p", G, J)), jnp.trace(G), jnp.zeros_like(x), 2 * g_q * alpha

    terms.defvjp(fwd, bwd)
    return terms


def _log_ml(model, q, ld, n, n_out, p, u, n_is):
    """The log marginal likelihood of ``model`` from ``q = tr(Y^T C^-1 Y)`` and ``ln|C|`` (dense or matrix-free)."""
    if model == "gaussian":
        return posterior.gaussian_log_ml(q, ld, n, n_out, 1.0)
    if model == "student_t":
        return posterior.student_t_log_ml(q, ld, n, n_out, p["a"], p["b"])
    beta = priors.BurrXII(p["c"], p["k"]).icdf(u)
    lw = posterior.scaled_log_weights(q, ld, n, n_out, beta)
    return logsumexp(lw) - jnp.log(n_is)


def _loss_fn(model, apply, n_is):
    """``loss(raw, x, y, u) = -log p(Y) / (N C)`` with ``raw = {'kernel': theta, 'noise': ..., prior's ...}``."""
    terms = _gaussian_terms(apply)

    def loss(raw, x, y, u):
        p = _constrain({k: v for k, v in raw.items() if k != "kernel"})
        q, ld = terms(raw["kernel"], p["noise"], x, y)
        n, n_out = x.shape[0], y.shape[1]
        return -_log_ml(model, q, ld, n, n_out, p, u, n_is) / (n * n_out)

    return loss


@functools.lru_cache(maxsize=64)
def _step_fn(model, apply, n_is, learning_rate):
    """One jitted Adam step per model and kernel (shapes are handled by jit's own cache)."""
    loss = _loss_fn(model, apply, n_is)
    adam = optax.adam(learning_rate)

    @jax.jit
    def step(raw, opt_state, scale, x, y, u):
        value, grads = jax.value_and_grad(loss)(raw, x, y, u)
        updates, opt_state = adam.update(grads, opt_state, raw)
        updates = jax.tree_util.tree_map(lambda g: g * scale, updates)
        return optax.apply_updates(raw, updates), opt_state, value

    return adam, step


def _matfree_loss_and_grad(model, kernel, n_is, options):
    """``(loss, grads)(raw, x, y, u)`` of the matrix-free loss (``method='cg'``): ``q`` and ``ln|C|`` from one CG
    run with SLQ probes (`smnngp.matfree.marginal_terms`), the kernel's gradient by BBMM's estimates
    (`smnngp.matfree.marginal_terms_grad`: ``-alpha^T K' alpha`` exactly, ``tr(C^-1 K')`` from the probes), the
    rest (noise, prior parameters) by autodiff of the closed-form log marginal likelihood. Not one jitted
    function: CG checks its convergence on the host. The probes are fixed (``options.seed``), so the estimated
    loss is a smooth function of the hyperparameters."""

    def outer(q, ld, rest, n, n_out, u):
        return -_log_ml(model, q, ld, n, n_out, _constrain(rest), u, n_is) / (n * n_out)

    value_and_grad = jax.jit(jax.value_and_grad(outer, argnums=(0, 1, 2)), static_argnums=(3, 4))

    def loss_and_grad(raw, x, y, u):
        rest = {k: v for k, v in raw.items() if k != "kernel"}
        noise = float(_constrain(rest)["noise"])
        op = matfree.KernelOperator(kernel.with_theta(raw["kernel"]), x, noise, tile_size=options.tile_size,
                                    devices=options.devices)
        terms = matfree.marginal_terms(op, y, options)
        value, (g_q, g_ld, g_rest) = value_and_grad(terms.q, terms.logdet.value, rest, x.shape[0], y.shape[1], u)
        d_theta, d_shift = matfree.marginal_terms_grad(op, terms, g_q, g_ld)
        g_rest = dict(g_rest)
        g_rest["noise"] = g_rest["noise"] + d_shift * (noise - _FLOORS["noise"])  # noise = floor + exp(raw)
        return value, {"kernel": d_theta, **g_rest}

    return loss_and_grad


def _matfree_step_fn(model, kernel, n_is, learning_rate, options):
    """Adam steps on :func:`_matfree_loss_and_grad` (the signature of :func:`_step_fn`'s ``step``)."""
    adam = optax.adam(learning_rate)
    loss_and_grad = _matfree_loss_and_grad(model, kernel, n_is, options)

    @jax.jit
    def update(raw, grads, opt_state, scale):
        updates, opt_state = adam.update(grads, opt_state, raw)
        updates = jax.tree_util.tree_map(lambda g: g * scale, updates)
        return optax.apply_updates(raw, updates), opt_state

    def step(raw, opt_state, scale, x, y, u):
        value, grads = loss_and_grad(raw, x, y, u)
        raw, opt_state = update(raw, grads, opt_state, scale)
        return raw, opt_state, value

    return adam, step


def _val_nll(model, kernel, theta, p, x, y, xv, yv, num_samples, key, options=None):
    if options is not None:  # matrix-free: the posterior never forms the training kernel
        post = posterior.fit(kernel.with_theta(theta), x, y, prior_of(model, p), noise=p["noise"],
                             num_samples=num_samples, key=key, min_ess=0.0, method="cg", cg=options)
        lpd = post.log_predictive_density(yv, xv)
        return -float(jnp.mean(lpd)) / (1 if yv.ndim == 1 else yv.shape[1])
    train, test = _kernel_fns(kernel.apply)
    kt = train(theta, x)
    kvt, kvv = test(theta, xv, x)
    post = posterior.fit_from_kernels(kt, y, prior_of(model, p), noise=p["noise"], num_samples=num_samples,
                                      key=key, min_ess=0.0)
    lpd = post.log_predictive_density(yv, k_test_train=kvt, k_test_test=kvv)
    return -float(jnp.mean(lpd)) / (1 if yv.ndim == 1 else yv.shape[1])


# --------------------------------------------------------------------------------------------
# Fitting


def _check_data(x, y, xv, yv, per_point: str):
    if x.ndim < 2 or xv.ndim != x.ndim or x.shape[1:] != xv.shape[1:]:
        raise ValueError(f"x_train and x_val must be {per_point} with the same per-point shape, "
                         f"got {x.shape} and {xv.shape}")
    if y.shape[0] != x.shape[0] or yv.shape[0] != xv.shape[0]:
        raise ValueError(f"row counts differ: x_train {x.shape[0]} vs y_train {y.shape[0]}, "
                         f"x_val {xv.shape[0]} vs y_val {yv.shape[0]}")
    for name, arr in (("x_train", x), ("y_train", y), ("x_val", xv), ("y_val", yv)):
        check_finite(arr, name)


def fit_kernel(
    kernel: ParametricKernel,
    x_train,
    y_train,
    x_val,
    y_val,
    model: str = "student_t",
    *,
    init: dict[str, float] | None = None,
    learning_rate: float = 5e-2,
    max_steps: int = 2000,
    eval_every: int = 50,
    patience: int = 5,
    max_halvings: int = 6,
    num_is_samples: int = 1000,
    num_val_samples: int = 10_000,
    seed: int = 0,
    progress: bool = False,
    method: str = "dense",
    cg: matfree.CG | None = None,
) -> FitResult:
    """Fit ``kernel``'s ``theta``, the noise and ``model``'s prior by marginal likelihood; early-stop on validation NLL.

    ``kernel`` is any `ParametricKernel` (e.g. `smnngp.stax.parametric_kernel` of an architecture) whose
    ``constrain(theta)`` is a dict; its names must differ from ``noise``, ``scale`` and the priors'
    (``a``, ``b``, ``c``, ``k``). Its ``theta`` is the starting point; ``init`` sets the starting
    ``noise`` (0.1) and prior parameters (`smnngp.models.PRIOR_DEFAULTS`). Inputs ``(N, ...)`` of any
    per-point shape; targets should be standardised, ``(N,)`` or ``(N, C)`` (C outputs sharing one scale).
    Returns the state with the best validation NLL (:class:`FitResult`, ``depth = activation = None``).

    Args:
        kernel: `ParametricKernel` to fit, starting from its ``theta``.
        x_train: training inputs, (N, ...).
        y_train: training targets, (N,) or (N, C), standardised.
        x_val: validation inputs with the per-point shape of ``x_train``.
        y_val: validation targets, (N_val,) or (N_val, C).
        model: ``'gaussian'``, ``'student_t'`` (default) or ``'burr12'``: which scale prior is fitted.
        init: starting values of ``noise`` and of the prior's parameters (a subset); the rest take their
            defaults.
        learning_rate: Adam's initial learning rate.
        max_steps: largest number of Adam steps.
        eval_every: Adam steps between two evaluations of the validation NLL (and updates of the plateau rule).
        patience: evaluations without improvement before the plateau rule halves the learning rate.
        max_halvings: training stops once the learning rate has been halved this many times.
        num_is_samples: fixed importance-sampling draws of the training loss for ``'burr12'``.
        num_val_samples: prior samples of the importance-sampling posterior used for the validation NLL
            (``'burr12'``).
        seed: seed of the importance-sampling uniforms and of the validation posterior's key.
        progress: show a tqdm progress bar.
        method: ``'dense'`` (the training kernel and its Cholesky factor, exact gradients) or ``'cg'``
            (matrix-free, for N past the dense path's memory: ``q`` by conjugate gradients, ``ln|C|`` by
            stochastic Lanczos quadrature, the gradient by BBMM's stochastic trace estimates over the same
            probes, Gardner et al. 2018; validation by a matrix-free posterior).
        cg: settings of ``method='cg'`` (`smnngp.matfree.CG`; ``None``: its defaults).

    Returns:
        :class:`FitResult` at the evaluation with the lowest validation NLL, with the kernel at that ``theta``.

    Raises:
        TypeError: if ``kernel`` is not a `ParametricKernel` or its ``constrain(theta)`` is not a dict.
        ValueError: if ``model`` is unknown, the data have mismatched shapes or non-finite values, the kernel's
            names clash with ``noise``, ``scale``, ``a``, ``b``, ``c`` or ``k``, or ``init`` names an unknown
            hyperparameter.
        FloatingPointError: if no evaluation gave a finite validation NLL.
    """
    models.check_model(model)
    if not isinstance(kernel, ParametricKernel):
        raise TypeError(f"kernel must be a smnngp.kernels.ParametricKernel (see smnngp.stax.parametric_kernel), "
                        f"got {type(kernel).__name__}")
    x, xv, y, yv = (jnp.asarray(a) for a in (x_train, x_val, y_train, y_val))
    _check_data(x, y, xv, yv, "(N, ...)")
    names = kernel.constrain(kernel.theta)
    if not isinstance(names, dict):
        raise TypeError(f"kernel.constrain(theta) must return a dict of named values, got {type(names).__name__}")
    clash = sorted(set(names) & set(_RESERVED))
    if clash:
        raise ValueError(f"the kernel's hyperparameters {clash} clash with the names of the noise and the priors "
                         f"{_RESERVED}; rename them in the kernel")
    start = {"noise": _NOISE_INIT, **{n: models.PRIOR_DEFAULTS[n] for n in models.PRIOR_PARAMS[model]}}
    if init:
        unknown = set(init) - set(start)
        if unknown:
            raise ValueError(f"unknown hyperparameters {sorted(unknown)} for model {model!r}; known: {sorted(start)} "
                             f"(the kernel starts from its own theta)")
        start.update(init)
    return _fit(kernel, x, y, xv, yv, model, start, learning_rate=learning_rate, max_steps=max_steps,
                eval_every=eval_every, patience=patience, max_halvings=max_halvings, num_is_samples=num_is_samples,
                num_val_samples=num_val_samples, seed=seed, progress=progress, desc=model, method=method, cg=cg)


def _matfree_options(method, cg):
    """``None`` for the dense loss, else the `smnngp.matfree.CG` settings of the matrix-free one."""
    if method not in ("dense", "cg"):
        raise ValueError(f"method must be 'dense' or 'cg', got {method!r}")
    if cg is not None and not isinstance(cg, matfree.CG):
        raise TypeError(f"cg must be a smnngp.matfree.CG, got {type(cg).__name__}")
    if method == "dense":
        return None
    return matfree.CG() if cg is None else cg


def _fit(kernel, x, y, xv, yv, model, start, *, learning_rate, max_steps, eval_every, patience, max_halvings,
         num_is_samples, num_val_samples, seed, progress, desc, method="dense", cg=None):
    y2 = y[:, None] if y.ndim == 1 else y
    # strongly typed leaves of x's dtype: Python floats give weakly typed scalars, Adam's updates strongly typed
    # ones, and `step` would be compiled once for each (a few seconds per model and data shape)
    raw = jax.tree_util.tree_map(lambda v: jnp.asarray(v, x.dtype), {"kernel": kernel.theta, **_unconstrain(start)})
    key = jax.random.PRNGKey(seed)
    k_u, k_val = jax.random.split(key)
    u = jax.random.uniform(k_u, (num_is_samples,), dtype=x.dtype, minval=1e-12, maxval=1.0 - 1e-12)
    options = _matfree_options(method, cg)
    if options is None:
        adam, step = _step_fn(model, kernel.apply, num_is_samples, learning_rate)
    else:
        adam, step = _matfree_step_fn(model, kernel, num_is_samples, learning_rate, options)
    plateau, plateau_update = _optim.plateau(0.5, int(patience))
    opt_state = adam.init(raw)
    plateau_state = plateau.init(raw)

    def values(raw):
        """The constrained state as Python floats: the kernel's values, then the noise and the prior's."""
        rest = _constrain({k: v for k, v in raw.items() if k != "kernel"})
        return {**_floats(kernel.constrain(raw["kernel"])), **{k: float(v) for k, v in rest.items()}}

    best = (math.inf, values(raw), 0, raw["kernel"])
    history = []
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_steps, desc=desc, leave=False)
    step_i = 0
    while step_i < max_steps:
        n = min(eval_every, max_steps - step_i)
        for _ in range(n):
            new_raw, new_opt, value = step(raw, opt_state, jnp.asarray(plateau_state.scale, x.dtype), x, y2, u)
            if not bool(jnp.isfinite(value)):
                break
            raw, opt_state = new_raw, new_opt
        step_i += n
        if bar is not None:
            bar.update(n)
        p = values(raw)
        try:
            vnll = _val_nll(model, kernel, raw["kernel"], p, x, y, xv, yv, num_val_samples, k_val, options)
        except (np.linalg.LinAlgError, FloatingPointError, ValueError):
            vnll = math.inf
        history.append({"step": step_i, "loss": float(value), "val_nll": vnll, "lr_scale": float(plateau_state.scale)})
        if vnll < best[0]:
            best = (vnll, p, step_i, raw["kernel"])
        if bar is not None:
            bar.set_postfix(loss=f"{float(value):.3f}", val_nll=f"{vnll:.3f}")
        monitored = jnp.asarray(vnll if math.isfinite(vnll) else 1e30, x.dtype)
        plateau_state = plateau_update(plateau_state, monitored)
        if not bool(jnp.isfinite(value)) or float(plateau_state.scale) < 0.5**max_halvings * 1.0001:
            break
    if bar is not None:
        bar.close()
    if not math.isfinite(best[0]):
        raise FloatingPointError(f"hyperparameter fitting for {model} produced no finite validation NLL")
    return FitResult(model, None, None, best[1], best[0], best[2], time.perf_counter() - t0, history,
                     kernel.with_theta(best[3]))


def fit_hyperparameters(
    x_train,
    y_train,
    x_val,
    y_val,
    model: str = "student_t",
    *,
    depth: int = 2,
    activation: str = "relu",
    init: dict[str, float] | None = None,
    learning_rate: float = 5e-2,
    max_steps: int = 2000,
    eval_every: int = 50,
    patience: int = 5,
    max_halvings: int = 6,
    num_is_samples: int = 1000,
    num_val_samples: int = 10_000,
    seed: int = 0,
    progress: bool = False,
    method: str = "dense",
    cg: matfree.CG | None = None,
) -> FitResult:
    """:func:`fit_kernel` for the MLP (module docstring): ``init`` may set any of :func:`default_init`'s values.

    Inputs ``(N, d)``; targets standardised, ``(N,)`` or ``(N, C)``. ``params`` of the result are sorted by name.

    Args:
        x_train: training inputs, (N, d).
        y_train: training targets, (N,) or (N, C), standardised.
        x_val: validation inputs, (N_val, d).
        y_val: validation targets, (N_val,) or (N_val, C).
        model: ``'gaussian'``, ``'student_t'`` (default) or ``'burr12'``.
        depth: number of hidden layers of the MLP, a positive int.
        activation: ``'relu'`` or ``'erf'``.
        init: starting values overriding those of :func:`default_init` (a subset of its names).
        learning_rate: Adam's initial learning rate.
        max_steps: largest number of Adam steps.
        eval_every: Adam steps between two evaluations of the validation NLL.
        patience: evaluations without improvement before the learning rate is halved.
        max_halvings: training stops once the learning rate has been halved this many times.
        num_is_samples: fixed importance-sampling draws of the training loss for ``'burr12'``.
        num_val_samples: prior samples of the importance-sampling posterior for the validation NLL.
        seed: seed of the importance-sampling uniforms and of the validation posterior's key.
        progress: show a tqdm progress bar.
        method: ``'dense'`` or ``'cg'`` (matrix-free), as in :func:`fit_kernel`.
        cg: settings of ``method='cg'``.

    Returns:
        :class:`FitResult` of the best validation NLL, with ``depth`` and ``activation`` set and the MLP scales,
        ``noise`` and the prior's parameters in ``params``.

    Raises:
        ValueError: if ``model``, ``activation`` or a name in ``init`` is unknown, ``depth`` is not a positive
            integer, or the data have mismatched shapes or non-finite values.
        FloatingPointError: if no evaluation gave a finite validation NLL.
    """
    models.check_model(model)
    x, xv, y, yv = (jnp.asarray(a) for a in (x_train, x_val, y_train, y_val))
    if x.ndim != 2 or xv.ndim != 2 or x.shape[1] != xv.shape[1]:
        raise ValueError(f"x_train and x_val must be (N, d) with the same d, got {x.shape} and {xv.shape}")
    _check_data(x, y, xv, yv, "(N, d)")
    start_values = default_init(model, activation)
    if init:
        unknown = set(init) - set(start_values)
        if unknown:
            raise ValueError(f"unknown hyperparameters {sorted(unknown)} for model {model!r}; "
                             f"known: {sorted(start_values)}")
        start_values.update(init)
    kernel = mlp_parametric_kernel(depth, activation, {k: v for k, v in start_values.items() if k in _MLP_SCALES})
    rest = {k: v for k, v in start_values.items() if k not in _MLP_SCALES}
    fit = _fit(kernel, x, y, xv, yv, model, rest, learning_rate=learning_rate, max_steps=max_steps,
               eval_every=eval_every, patience=patience, max_halvings=max_halvings, num_is_samples=num_is_samples,
               num_val_samples=num_val_samples, seed=seed, progress=progress,
               desc=f"{model} d={depth} {activation}", method=method, cg=cg)
    # sorted by name, the order these results have always been reported (and recorded) in
    return dataclasses.replace(fit, depth=depth, activation=activation, params=dict(sorted(fit.params.items())))


def select_architecture(
    x_train, y_train, x_val, y_val, model: str = "student_t", *,
    depths: Sequence[int] = (1, 2, 3, 4), activations: Sequence[str] = ("relu", "erf"), **kwargs: Any,
) -> tuple[FitResult, list[FitResult]]:
    """Fit every (depth, activation) and return the best by validation NLL, plus all fits.

    Args:
        x_train: training inputs, (N, d).
        y_train: training targets, (N,) or (N, C).
        x_val: validation inputs, (N_val, d).
        y_val: validation targets.
        model: ``'gaussian'``, ``'student_t'`` (default) or ``'burr12'``.
        depths: numbers of hidden layers to try.
        activations: activation names to try.
        **kwargs: passed on to :func:`fit_hyperparameters` (``learning_rate``, ``max_steps``, ...).

    Returns:
        Tuple ``(best, fits)``: the :class:`FitResult` with the lowest ``val_nll`` and the list of all fits,
        ordered by activation, then depth.
    """
    fits = []
    for act in activations:
        for d in depths:
            fits.append(fit_hyperparameters(x_train, y_train, x_val, y_val, model, depth=d, activation=act, **kwargs))
    best = min(fits, key=lambda f: f.val_nll)
    return best, fits


@functools.lru_cache(maxsize=16)
def _burr_steps(learning_rate, length):
    """``length`` jitted Adam steps on the Burr XII importance-sampling marginal likelihood (cached q, ln|C|)."""
    adam = optax.adam(learning_rate)

    def loss(raw, q, ld, nc, n_out, u):
        p = _constrain(raw)
        beta = p["scale"] * priors.BurrXII(p["c"], p["k"]).icdf(u)
        lw = posterior.scaled_log_weights(q, ld, nc // n_out, n_out, beta)
        return -(logsumexp(lw) - jnp.log(u.shape[0])) / nc

    @functools.partial(jax.jit, static_argnums=(4, 5))
    def run(raw, opt_state, q, ld, nc, n_out, u):
        def body(carry, _):
            raw, opt_state = carry
            value, g = jax.value_and_grad(loss)(raw, q, ld, nc, n_out, u)
            upd, opt_state = adam.update(g, opt_state, raw)
            return (optax.apply_updates(raw, upd), opt_state), value

        (raw, opt_state), values = jax.lax.scan(body, (raw, opt_state), None, length=length)
        return raw, opt_state, values[-1]

    return adam, run


def fit_burr_given_kernel(
    base: FitResult,
    x_train,
    y_train,
    x_val,
    y_val,
    *,
    init: dict[str, float] | None = None,
    learning_rate: float = 5e-2,
    steps: int = 500,
    eval_every: int = 50,
    num_is_samples: int = 2000,
    num_val_samples: int = 10_000,
    seed: int = 0,
) -> FitResult:
    """Burr XII prior on top of a fitted kernel: only ``c``, ``k`` and a scale ``s`` are fitted.

    The prior is ``sigma^2 = s * B`` with ``B ~ BurrXII(c, k)`` (Burr XII has no
    scale parameter of its own); the kernel is ``base``'s (for the MLP, with
    ``last_W_std = 1``: ``s`` is the readout's scale).

    With the kernel's hyperparameters and ``noise`` taken from ``base`` (e.g.
    the Student-t fit), ``q`` and ``ln|C|`` are computed once and every step of
    Adam on the importance-sampling marginal likelihood costs O(S).  The
    checkpoint with the best validation NLL is kept.  This is how the UCI
    experiment fits its Burr XII model (documented there).

    Args:
        base: a previous fit (e.g. the Student-t one) whose kernel and ``noise`` are kept fixed.
        x_train: training inputs, as used for ``base``.
        y_train: training targets, (N,) or (N, C).
        x_val: validation inputs.
        y_val: validation targets.
        init: starting values of ``c``, ``k`` and ``scale`` (defaults 2, 1 and 1).
        learning_rate: Adam's learning rate (constant).
        steps: number of Adam steps, run in blocks of ``eval_every`` (rounded up to a multiple of it).
        eval_every: Adam steps between two evaluations of the validation NLL.
        num_is_samples: fixed importance-sampling draws of the training loss.
        num_val_samples: prior samples of the importance-sampling posterior for the validation NLL.
        seed: seed of the importance-sampling uniforms (the validation key uses ``seed + 1``).

    Returns:
        :class:`FitResult` with model ``'burr12'`` at the evaluation with the lowest validation NLL; its
        ``params`` hold the kernel's values, ``noise``, ``c``, ``k`` and ``scale``.

    Raises:
        NotPositiveDefiniteError: if the training kernel plus noise cannot be factorised.
        FloatingPointError: if no evaluation gave a finite validation NLL.
    """
    t0 = time.perf_counter()
    x, y, xv, yv = (jnp.asarray(a) for a in (x_train, y_train, x_val, y_val))
    y2 = y[:, None] if y.ndim == 1 else y
    kernel = base.kernel
    if base.depth is not None and "last_W_std" in base.params:
        kernel = mlp_parametric_kernel(base.depth, base.activation, {k: base.params[k] for k in ("W_std", "b_std")})
    kp = {**_floats(kernel.constrain(kernel.theta)), "noise": base.params["noise"]}
    train, test = _kernel_fns(kernel.apply)
    kt = train(kernel.theta, x)
    kvt, kvv = test(kernel.theta, xv, x)
    chol = linalg.cholesky(kt + kp["noise"] * jnp.eye(x.shape[0], dtype=kt.dtype), name="training kernel + noise")
    alpha = linalg.cho_solve(chol.L, y2)
    q, ld = jnp.sum(y2 * alpha), linalg.logdet(chol.L)
    n, n_out = y2.shape
    start = {**{n_: models.PRIOR_DEFAULTS[n_] for n_ in models.PRIOR_PARAMS["burr12"]}, "scale": 1.0, **(init or {})}
    raw = jax.tree_util.tree_map(lambda v: jnp.asarray(v, x.dtype), _unconstrain(start))  # strong types (see _fit)
    u = jax.random.uniform(jax.random.PRNGKey(seed), (num_is_samples,), dtype=x.dtype, minval=1e-12,
                           maxval=1.0 - 1e-12)

    adam, run = _burr_steps(learning_rate, eval_every)
    opt_state = adam.init(raw)
    best = (math.inf, None, 0)
    history = []
    key_val = jax.random.PRNGKey(seed + 1)
    for i in range(0, steps, eval_every):
        raw, opt_state, value = run(raw, opt_state, q, ld, n * n_out, n_out, u)
        p = {**kp, **{k: float(v) for k, v in _constrain(raw).items()}}
        post = posterior.fit_from_kernels(kt, y, prior_of("burr12", p), noise=p["noise"],
                                          num_samples=num_val_samples, key=key_val, min_ess=0.0)
        lpd = post.log_predictive_density(yv, k_test_train=kvt, k_test_test=kvv)
        vnll = -float(jnp.mean(lpd)) / (1 if yv.ndim == 1 else yv.shape[1])
        history.append({"step": i + eval_every, "loss": float(value), "val_nll": vnll})
        if vnll < best[0]:
            best = (vnll, p, i + eval_every)
    if best[1] is None:
        raise FloatingPointError("Burr XII fitting produced no finite validation NLL")
    return FitResult("burr12", base.depth, base.activation, best[1], best[0], best[2],
                     time.perf_counter() - t0, history, kernel)
