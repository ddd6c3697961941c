"""Function-space training dynamics over given kernel matrices (neural-tangents' ``predict`` functions).

Linearised networks trained by gradient flow move in function space along the kernel (Jacot et al. 2018; Lee et
al. 2019, "Wide neural networks of any depth evolve as linear models under gradient descent"). With the training
kernel ``Theta`` (P x P after flattening the kernel axes, see `smnngp.predict._axes`), the test-train kernel
``Theta_*`` (Q x P), the training targets ``Y`` and the network's outputs ``f`` at training time ``t``:

* :func:`gradient_descent_mse`: the loss ``0.5 * mean((f - Y)^2)`` over all ``n = Y.size`` entries gives
  ``df/dt = -(eta / n) Theta (f - Y)``, solved in closed form through ``Theta = U diag(lam) U^T``:
  ``f_t = f_0 + U diag(expm1(-eta t lam / n)) U^T (f_0 - Y)`` and
  ``f*_t = f*_0 + Theta_* U diag(expm1(-eta t lam / n) / lam) U^T (f_0 - Y)``; at ``t = inf``,
  ``f_t = Y`` and ``f*_t = f*_0 + Theta_* Theta^{-1} (Y - f_0)`` (one Cholesky factorisation).
* :func:`gradient_descent`: any loss ``L(f, Y)``: ``df/dt = -eta Theta dL/df`` and ``df*/dt = -eta Theta_* dL/df``
  (the loss carries its own normalisation), integrated by an adaptive Dormand-Prince solver
  (``jax.experimental.ode.odeint``). With momentum ``m`` the heavy-ball limit is solved in units of
  ``sqrt(eta)``: ``df/ds = q``, ``dq/ds = -Theta dL/df - ((1 - m) / sqrt(eta)) q`` with ``s = sqrt(eta) t``.
* :func:`gp_inference`: the posterior of the GP with the NNGP / NTK covariance, and the ``t = inf`` ensemble of
  NTK-trained networks (the same formulas as `gradient_descent_mse_ensemble` at ``t = inf``).

``diag_reg`` adds ``diag_reg * mean(diag Theta) * I`` (``diag_reg * I`` with ``diag_reg_absolute_scale``) to the
training kernel before it is factorised or diagonalised. Kernels act as ``Theta ⊗ I`` along ``trace_axes`` of the
targets.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import ode

from smnngp import linalg
from smnngp.predict._axes import OutputLayout, from_2d, to_2d, zipped
from smnngp.predict._ensemble import Gaussian, _cached, _canonical_time, _check_scalar, _cholesky, _eigen, _float_array

__all__ = ["ODEState", "gradient_descent", "gradient_descent_mse", "gp_inference"]


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def _train_kernel(k, layout: OutputLayout, name: str, where: str) -> jax.Array:
    k = _float_array(k, name, where)
    want = zipped(layout.nontrace_shape, layout.nontrace_shape)
    if k.shape != want:
        raise ValueError(
            f"{where}: {name} has shape {tuple(k.shape)}, expected {want} (the axes of y_train {layout.shape} other "
            f"than trace_axes {layout.trace}, each twice, interleaved)"
        )
    return to_2d(k)


def _test_kernel(k, layout: OutputLayout, name: str, where: str) -> tuple[jax.Array, tuple[int, ...]]:
    """The test-train kernel as a (Q, P) matrix, and the test outputs' kernel axes."""
    k = _float_array(k, name, where)
    m = len(layout.nontrace_shape)
    if k.ndim != 2 * m or tuple(k.shape[1::2]) != layout.nontrace_shape:
        raise ValueError(
            f"{where}: {name} has shape {tuple(k.shape)}; its odd axes must be the training kernel axes "
            f"{layout.nontrace_shape} (test axes and training axes interleaved)"
        )
    return to_2d(k), tuple(k.shape[::2])


def _regularised(k2, diag_reg: float, absolute: bool):
    """``k2 + diag_reg * s * I`` with ``s = 1`` (absolute) or ``s = mean(diag k2)``."""
    scale = 1.0 if absolute else jnp.mean(jnp.diag(k2))
    return k2 + (diag_reg * scale) * jnp.eye(k2.shape[0], dtype=k2.dtype)


def _check_requested(where: str, fx_train_0, fx_test_0, k_test_train):
    if fx_train_0 is None and fx_test_0 is None:
        raise ValueError(f"{where}: fx_train_0 and fx_test_0 are both None, so there is nothing to predict")
    if fx_test_0 is not None and k_test_train is None:
        raise ValueError(f"{where}: test-set predictions (fx_test_0 given) need k_test_train")


def _outputs(fx, shape, dtype, name: str, where: str):
    fx = _float_array(fx, name, where).astype(dtype)
    try:
        return jnp.broadcast_to(fx, shape)
    except ValueError:
        raise ValueError(f"{where}: {name} of shape {tuple(fx.shape)} does not broadcast to the outputs' shape "
                         f"{tuple(shape)}") from None


def _select(fx_train_0, fx_test_0, train, test):
    """neural-tangents' return convention: the train outputs, the test outputs, or both as a tuple."""
    if fx_test_0 is None:
        return train
    if fx_train_0 is None:
        return test
    return train, test


# ---------------------------------------------------------------------------
# Mean squared error: closed form
# ---------------------------------------------------------------------------


def gradient_descent_mse(
    k_train_train,
    y_train,
    learning_rate: float = 1.0,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    trace_axes=(-1,),
) -> Callable:
    """Outputs of a linearised network trained by gradient flow on the MSE, in closed form (module docstring).

    ``f_t = f_0 + U diag(expm1(-eta t lam / n)) U^T (f_0 - Y)`` on the training set and
    ``f*_t = f*_0 + Theta_* U diag(expm1(-eta t lam / n) / lam) U^T (f_0 - Y)`` on a test set, with
    ``Theta + reg I = U diag(lam) U^T`` and ``n = y_train.size``; ``t = None`` means converged: ``f_t = Y``,
    ``f*_t = f*_0 + Theta_* (Theta + reg I)^{-1} (Y - f_0)`` by a Cholesky solve. On the null space of ``Theta``
    the outputs do not move (eigenvalue 0: ``expm1(0) / 0`` is read as its limit ``-eta t / n``).

    Args:
        k_train_train: kernel of the training outputs, the axes of ``y_train`` other than ``trace_axes`` twice,
            interleaved (``(N, N)`` for ``y_train`` of shape ``(N, C)`` and ``trace_axes=(-1,)``).
        y_train: training targets.
        learning_rate: ``eta``; only ``eta * t`` matters.
        diag_reg: diagonal regulariser added to ``k_train_train`` before it is diagonalised or factorised.
        diag_reg_absolute_scale: take ``diag_reg`` in absolute units instead of relative to the mean diagonal.
        trace_axes: axes of ``y_train`` along which the kernel is the identity (``Theta ⊗ I``).

    Returns:
        ``predict_fn(t=None, fx_train_0=0.0, fx_test_0=None, k_test_train=None)``: ``t`` a scalar or an array of
        non-negative times (leading axes of the result; ``None`` is converged), ``fx_train_0`` / ``fx_test_0`` the
        outputs at ``t = 0`` (``None``: not computed; scalars broadcast), ``k_test_train`` the test-train kernel
        (test and training axes interleaved). It returns the training outputs, the test outputs, or both as a
        tuple ``(fx_train_t, fx_test_t)``, as neural-tangents does, and raises ValueError when both initial
        outputs are None or test outputs are asked without ``k_test_train``.

    Raises:
        ValueError: if the kernel's shape does not match ``y_train`` and ``trace_axes``, an entry is not finite,
            ``learning_rate`` is not positive or ``diag_reg`` is negative.
    """
    where = "gradient_descent_mse"
    y = _float_array(y_train, "y_train", where)
    layout = OutputLayout.of(y.shape, trace_axes, where)
    k2 = _train_kernel(k_train_train, layout, "k_train_train", where)
    dtype = k2.dtype
    lr = _check_scalar(learning_rate, "learning_rate", where, positive=True)
    reg = _check_scalar(diag_reg, "diag_reg", where, positive=False)
    y_flat = layout.flat(y.astype(dtype))
    n = y.size
    cache: dict[str, Any] = {}

    def eigen():
        return _cached(cache, "eig", k2, lambda: _eigen(_regularised(k2, reg, diag_reg_absolute_scale),
                                                        "k_train_train (+ diag_reg)"))

    def chol():
        return _cached(cache, "chol", k2, lambda: _cholesky(_regularised(k2, reg, diag_reg_absolute_scale),
                                                            "k_train_train (+ diag_reg)", where))

    def predict_fn(t=None, fx_train_0=0.0, fx_test_0=None, k_test_train=None):
        _check_requested(where, fx_train_0, fx_test_0, k_test_train)
        t_arr = _canonical_time(t)
        f0 = None if fx_train_0 is None else _outputs(fx_train_0, y.shape, dtype, "fx_train_0", where)
        kt2 = ft0 = test_axes = None
        if fx_test_0 is not None:
            kt2, test_axes = _test_kernel(k_test_train, layout, "k_test_train", where)
            ft0 = _outputs(fx_test_0, layout.out_shape(test_axes), dtype, "fx_test_0", where)
        train = test = None
        if t_arr is None:
            if f0 is not None:
                train = y.astype(dtype)
            if ft0 is not None:
                rhs = y_flat if f0 is None else y_flat - layout.flat(f0)
                test = ft0 + layout.unflat(kt2 @ linalg.cho_solve(chol(), rhs), test_axes)
        else:
            lam, U, pos = eigen()
            rate = jnp.asarray(lr * t_arr.reshape(-1) / n, dtype)[:, None]
            resid = -y_flat if f0 is None else layout.flat(f0) - y_flat
            d_train, d_test = _mse_core(lam, U, pos, rate, resid, kt2, train=f0 is not None)
            lead = t_arr.shape
            times = (1,) * len(lead)  # the initial outputs broadcast over the time axes, explicitly
            if f0 is not None:
                train = (jnp.reshape(f0, times + jnp.shape(f0))
                         + layout.unflat(d_train.reshape(lead + d_train.shape[1:]), layout.nontrace_shape))
            if ft0 is not None:
                test = (jnp.reshape(ft0, times + jnp.shape(ft0))
                        + layout.unflat(d_test.reshape(lead + d_test.shape[1:]), test_axes))
        return _select(fx_train_0, fx_test_0, train, test)

    return predict_fn


def _expm1_and_ratio(lam, pos, rate):
    """``expm1(-lam r)`` and ``expm1(-lam r) / lam`` per eigenvalue and time, limits on the null space and at inf."""
    lam, pos = lam[None, :], pos[None, :]  # (1, P) against the times' rate (T, 1)
    inf = jnp.isinf(rate)
    lam_safe = jnp.where(pos, lam, 1.0)
    z = jnp.where(pos, lam * jnp.where(inf, 0.0, rate), 0.0)
    em1 = jnp.where(inf, jnp.where(pos, -1.0, 0.0), jnp.expm1(-z))
    ratio = jnp.where(pos, em1 / lam_safe, jnp.where(inf, 0.0, -rate))
    return em1, ratio


@functools.partial(jax.jit, static_argnames=("train",))
def _mse_core(lam, U, pos, rate, resid, kt2, *, train: bool):
    em1, ratio = _expm1_and_ratio(lam, pos, rate)  # (T, P)
    w = U.T @ resid  # residual in the eigenbasis, (P, R)
    d_train = jnp.einsum("pi,ti,ir->tpr", U, em1, w) if train else None
    d_test = None if kt2 is None else jnp.einsum("qi,ti,ir->tqr", kt2 @ U, ratio, w)
    return d_train, d_test


# ---------------------------------------------------------------------------
# Any loss: ODE solve
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ODEState:
    """State of the function-space ODE of :func:`gradient_descent` (a pytree; ``None`` fields are absent).

    Attributes:
        fx_train: training-set outputs.
        fx_test: test-set outputs.
        qx_train: training-set auxiliary variable (the velocity ``df/ds`` under momentum).
        qx_test: test-set auxiliary variable.
    """

    fx_train: Any = None
    fx_test: Any = None
    qx_train: Any = None
    qx_test: Any = None

    def replace(self, **changes) -> ODEState:
        """A copy with the named fields changed.

        Args:
            **changes: new values of fields, by name.

        Returns:
            The new :class:`ODEState`.
        """
        return dataclasses.replace(self, **changes)


jax.tree_util.register_dataclass(ODEState, data_fields=["fx_train", "fx_test", "qx_train", "qx_test"],
                                 meta_fields=[])


def gradient_descent(
    loss: Callable,
    k_train_train,
    y_train,
    learning_rate: float = 1.0,
    momentum: float | None = None,
    trace_axes=(-1,),
    *,
    rtol: float = 1.4e-8,
    atol: float = 1.4e-8,
    mxstep: float = np.inf,
) -> Callable:
    """Outputs of a linearised network trained by gradient flow (or heavy-ball momentum) on any loss (module docstring).

    Solves ``df/dt = -eta Theta grad_f L(f, Y)``, ``df*/dt = -eta Theta_* grad_f L(f, Y)`` (and, with momentum
    ``m``, ``df/ds = q``, ``dq/ds = -Theta grad_f L - ((1 - m) / sqrt(eta)) q`` in ``s = sqrt(eta) t``, likewise
    for the test outputs) with ``jax.experimental.ode.odeint`` (Dormand-Prince, adaptive steps): the error per step
    is held below ``atol + rtol * |state|``, so results are accurate to about ``rtol`` relative, not to machine
    precision. The defaults are odeint's and neural-tangents'.

    Args:
        loss: ``loss(fx_train, y_train) -> scalar``, differentiable in its first argument.
        k_train_train: kernel of the training outputs (interleaved axes of ``y_train`` other than ``trace_axes``).
        y_train: training targets.
        learning_rate: ``eta``.
        momentum: heavy-ball momentum ``m`` in [0, 1), or ``None`` for plain gradient flow.
        trace_axes: axes of ``y_train`` along which the kernel is the identity.
        rtol: relative tolerance of the ODE solver.
        atol: absolute tolerance of the ODE solver.
        mxstep: largest number of solver steps between two requested times.

    Returns:
        ``predict_fn(t=None, fx_train_or_state_0=0.0, fx_test_0=None, k_test_train=None)``: ``t`` a scalar or an
        array of increasing non-negative times (``None``: ``inf``, which the solver may not reach),
        ``fx_train_or_state_0`` the training outputs at ``t = 0`` or a whole :class:`ODEState` (then an
        :class:`ODEState` is returned, with leading time axes), ``fx_test_0`` the test outputs at ``t = 0`` and
        ``k_test_train`` the test-train kernel. It returns the training outputs, the test outputs or both, as
        :func:`gradient_descent_mse` does, and raises ValueError for inconsistent arguments or decreasing times.

    Raises:
        TypeError: if ``loss`` is not callable.
        ValueError: if the kernel's shape does not match ``y_train``, an entry is not finite, ``learning_rate`` is
            not positive or ``momentum`` is outside [0, 1).
    """
    where = "gradient_descent"
    if not callable(loss):
        raise TypeError(f"{where}: loss must be callable, got {type(loss).__name__}")
    y = _float_array(y_train, "y_train", where)
    layout = OutputLayout.of(y.shape, trace_axes, where)
    k2 = _train_kernel(k_train_train, layout, "k_train_train", where)
    dtype = k2.dtype
    lr = _check_scalar(learning_rate, "learning_rate", where, positive=True)
    friction = None
    if momentum is not None:
        m = _check_scalar(momentum, "momentum", where, positive=False)
        if m >= 1:
            raise ValueError(f"{where}: momentum must be in [0, 1), got {momentum}")
        lr = lr ** 0.5
        friction = (m - 1.0) / lr
    y_d = y.astype(dtype)
    grad_loss = jax.grad(lambda fx: loss(fx, y_d))

    # one function object per solver, the kernels passed as arguments: odeint compiles it once per state layout
    def velocity(state: ODEState, _t, k_dd, k_td=None) -> ODEState:
        g = layout.flat(grad_loss(state.fx_train))
        d_train = -layout.unflat(k_dd @ g, layout.nontrace_shape)
        d_test = None if state.fx_test is None else -layout.unflat(k_td @ g, layout.kernel_axes(state.fx_test.shape))
        if friction is None:
            return ODEState(d_train, d_test)
        d_test = None if d_test is None else d_test + friction * state.qx_test
        return ODEState(state.qx_train, state.qx_test, d_train + friction * state.qx_train, d_test)

    def predict_fn(t=None, fx_train_or_state_0=0.0, fx_test_0=None, k_test_train=None):
        is_state = isinstance(fx_train_or_state_0, ODEState)
        if is_state:
            if fx_test_0 is not None:
                raise ValueError(f"{where}: fx_test_0 must be None when an ODEState is given (it holds fx_test)")
            s0 = fx_train_or_state_0
            fx_train_0, fx_test_0, q_train_0, q_test_0 = s0.fx_train, s0.fx_test, s0.qx_train, s0.qx_test
        else:
            fx_train_0, q_train_0, q_test_0 = fx_train_or_state_0, None, None
        _check_requested(where, fx_train_0, fx_test_0, k_test_train)
        if friction is None and (q_train_0 is not None or q_test_0 is not None):
            raise ValueError(f"{where}: the ODEState has momentum variables but momentum is None")
        if isinstance(t, jax.core.Tracer):  # under jit: the times cannot be checked, only used
            times = jnp.asarray(t, dtype)
            flat_t = times.reshape(-1)
            start = jnp.where(flat_t[0] == 0, -1e-24, 0.0).astype(dtype).reshape(1)
        else:
            times = np.asarray(np.inf if t is None else t, dtype=float)
            flat_t = times.reshape(-1)
            if flat_t.size == 0 or np.isnan(flat_t).any() or (flat_t < 0).any() or (np.diff(flat_t) <= 0).any():
                raise ValueError(f"{where}: t must be non-negative and strictly increasing, got {t!r}")
            start = jnp.full((1,), -1e-24 if flat_t[0] == 0 else 0.0, dtype)
        ts = jnp.asarray(flat_t, dtype) * lr
        # the solver starts at its first time: put the initial state at 0 (just before 0 when 0 is asked for)
        ts = jnp.concatenate([start, ts])

        kt2, test_axes = (None, None) if k_test_train is None else _test_kernel(k_test_train, layout,
                                                                                  "k_test_train", where)
        test_shape = None if kt2 is None else layout.out_shape(test_axes)
        f0 = jnp.zeros(y.shape, dtype) if fx_train_0 is None else _outputs(fx_train_0, y.shape, dtype,
                                                                            "fx_train_0", where)
        ft0 = None if fx_test_0 is None else _outputs(fx_test_0, test_shape, dtype, "fx_test_0", where)
        if friction is None:
            state0 = ODEState(f0, ft0)
        else:
            q0 = jnp.zeros(y.shape, dtype) if q_train_0 is None else _outputs(q_train_0, y.shape, dtype,
                                                                             "qx_train", where)
            qt0 = None if ft0 is None else (jnp.zeros(test_shape, dtype) if q_test_0 is None else
                                            _outputs(q_test_0, test_shape, dtype, "qx_test", where))
            state0 = ODEState(f0, ft0, q0, qt0)

        kernels = (k2,) if kt2 is None else (k2, kt2)
        path = ode.odeint(velocity, state0, ts, *kernels, rtol=rtol, atol=atol, mxstep=mxstep)
        path = jax.tree_util.tree_map(lambda a: a[1:].reshape(times.shape + a.shape[1:]), path)
        if is_state:
            return path
        return _select(fx_train_0, fx_test_0, path.fx_train, path.fx_test)

    return predict_fn


# ---------------------------------------------------------------------------
# GP inference (t = inf)
# ---------------------------------------------------------------------------

_GP_GET = ("nngp", "ntk", "ntkgp")


@functools.cache
def _gaussians_type(names: tuple[str, ...]):
    return collections.namedtuple("Gaussians", names)


def _gp_get(get, where: str) -> tuple[tuple[str, ...], bool]:
    if get is None:
        return ("nngp", "ntk"), False
    single = isinstance(get, str)
    names = (get,) if single else tuple(get)
    if not names:
        raise ValueError(f"{where}: get is empty; ask for 'nngp', 'ntk' or 'ntkgp'")
    names = tuple(str(g).lower() for g in names)
    for g in names:
        if g not in _GP_GET:
            raise ValueError(f"{where}: unknown get {g!r}; valid are {_GP_GET}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: get {get!r} repeats a name")
    return names, single


def _part(k, g: str, what: str, where: str):
    """``k`` itself when it is an array, else its attribute ``g`` (a `Kernel` or a named tuple)."""
    if not (hasattr(k, "nngp") or hasattr(k, "ntk")):
        return k
    v = getattr(k, g, None)
    if v is None:
        raise ValueError(f"{where}: {what} has no {g!r} kernel, which get asks for")
    return v


def gp_inference(
    k_train_train,
    y_train,
    diag_reg: float = 0.0,
    diag_reg_absolute_scale: bool = False,
    trace_axes=(-1,),
) -> Callable:
    """Posterior of the NNGP / NTK / NTK-GP, and the converged ensemble of NTK-trained networks (module docstring).

    With ``K`` the NNGP, ``T`` the NTK and ``reg`` the diagonal regulariser: ``get='nngp'`` is the GP posterior
    ``N(K*X (K + reg)^{-1} Y, K** - K*X (K + reg)^{-1} KX*)``; ``'ntkgp'`` the same with ``T`` in place of ``K``;
    ``'ntk'`` the infinite-time ensemble of networks trained on all layers, mean ``T*X (T + reg)^{-1} Y`` and
    covariance ``K** + A K A^T - A KX* - K*X A^T`` with ``A = T*X (T + reg)^{-1}`` (``K`` unregularised there).

    Args:
        k_train_train: the training kernel: an array (used for every ``get``) or an object with ``nngp`` / ``ntk``
            attributes (a `Kernel`, a named tuple); its kernel axes are those of ``y_train`` other than
            ``trace_axes``, interleaved.
        y_train: training targets.
        diag_reg: diagonal regulariser added to the kernel that is inverted.
        diag_reg_absolute_scale: take ``diag_reg`` in absolute units instead of relative to the mean diagonal.
        trace_axes: axes of ``y_train`` along which the kernels are the identity.

    Returns:
        ``predict_fn(get=None, k_test_train=None, k_test_test=None)``: ``get`` ``'nngp'``, ``'ntk'``, ``'ntkgp'``
        or a tuple (``None``: ``('nngp', 'ntk')``); ``k_test_train`` the test-train kernel(s) (``None``: the
        training set, whose law is ``N(y_train, 0)``); ``k_test_test`` the test-test kernel (``None``: mean only;
        any non-None value on the training set). It returns the mean, or a :class:`Gaussian` ``(mean,
        covariance)`` with the covariance's axes interleaved, or a named tuple ``Gaussians`` of them for a tuple
        ``get``; it raises ValueError when the ``'ntk'`` covariance is asked from kernels without ``nngp``.

    Raises:
        ValueError: if the kernel's shape does not match ``y_train``, an entry is not finite or ``diag_reg`` is
            negative.
    """
    where = "gp_inference"
    y = _float_array(y_train, "y_train", where)
    layout = OutputLayout.of(y.shape, trace_axes, where)
    reg = _check_scalar(diag_reg, "diag_reg", where, positive=False)
    cache: dict[str, Any] = {}

    def train(g: str):
        return _cached(cache, "k_" + g, k_train_train, lambda: _train_kernel(
            _part(k_train_train, g, "k_train_train", where), layout, f"k_train_train.{g}", where))

    def chol(g: str):
        return _cached(cache, "chol_" + g, k_train_train, lambda: _cholesky(
            _regularised(train(g), reg, diag_reg_absolute_scale), f"train {g} kernel (+ diag_reg)", where))

    def predict_fn(get=None, k_test_train=None, k_test_test=None):
        names, single = _gp_get(get, where)
        out = []
        for g in names:
            k = "ntk" if g == "ntkgp" else g
            kdd = train(k)
            dtype = kdd.dtype
            if k_test_train is None:
                mean = y.astype(dtype)
                if k_test_test is None:
                    out.append(mean)
                else:
                    raw = _part(k_train_train, k, "k_train_train", where)
                    out.append(Gaussian(mean, jnp.zeros(jnp.shape(raw), dtype)))
                continue
            ktd, test_axes = _test_kernel(_part(k_test_train, k, "k_test_train", where), layout,
                                          f"k_test_train.{k}", where)
            L = chol(k)
            mean = layout.unflat(ktd @ linalg.cho_solve(L, layout.flat(y.astype(dtype))), test_axes)
            if k_test_test is None:
                out.append(mean)
                continue
            prior = "ntk" if g == "ntkgp" else "nngp"
            q = math.prod(test_axes)
            if g == "ntk" and not (_has_nngp(k_train_train) and _has_nngp(k_test_train)):
                raise ValueError(f"{where}: the 'ntk' covariance needs the NNGP as well as the NTK in k_train_train "
                                 f"and k_test_train (pass Kernels or named tuples with both)")
            ktt = _float_array(_part(k_test_test, prior, "k_test_test", where), "k_test_test", where)
            if ktt.shape != zipped(test_axes, test_axes):
                raise ValueError(f"{where}: k_test_test has shape {tuple(ktt.shape)}, expected "
                                 f"{zipped(test_axes, test_axes)}")
            ktt = to_2d(ktt)
            if g == "ntk":
                k_init, _ = _test_kernel(k_test_train.nngp, layout, "k_test_train.nngp", where)
                cov = _ntk_cov(L, ktd, k_init, train("nngp"), ktt)
            else:
                cov = _gp_cov(L, ktd, ktt)
            out.append(Gaussian(mean, from_2d(cov.reshape(q, q), test_axes)))
        return out[0] if single else _gaussians_type(names)(*out)

    return predict_fn


def _has_nngp(k) -> bool:
    return not isinstance(k, (np.ndarray, jax.Array)) and getattr(k, "nngp", None) is not None


@jax.jit
def _gp_cov(L, ktd, ktt):
    v = linalg.solve_triangular(L, ktd.T)
    return ktt - v.T @ v


@jax.jit
def _ntk_cov(L, ttd, ktd, kdd, ktt):
    a = linalg.cho_solve(L, ttd.T)  # T^{-1} T_X*
    cross = ktd @ a
    return ktt + a.T @ kdd @ a - cross - cross.T
