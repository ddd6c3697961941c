"""neural-tangents 0.6.5's ``predict`` module: its names, signatures and defaults, over `smnngp.predict`.

Code written for ``neural_tangents.predict`` runs unchanged against ``smnngp.nt.predict``. Everything here is a
thin wrapper over (or the very object of) `smnngp.predict`; the equations are documented there. The one
difference of `smnngp.predict` that this module undoes is the ensemble's: positional ``learning_rate`` and
``compute_cov=False`` by default, as neural-tangents has them.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable

from smnngp import predict as _predict
from smnngp.predict import (
    Gaussian,
    ODEState,
    gp_inference,
    gradient_descent_mse,
    max_learning_rate,
)

__all__ = [
    "gradient_descent",
    "gradient_descent_mse",
    "gradient_descent_mse_ensemble",
    "gp_inference",
    "max_learning_rate",
    "ODEState",
    "Gaussian",
]


def gradient_descent(loss: Callable, k_train_train, y_train, learning_rate: float = 1.0,
                     momentum: float | None = None, trace_axes=(-1,)) -> Callable:
    """neural-tangents' ``predict.gradient_descent``: `smnngp.predict.gradient_descent` with its default tolerances.

    Solves ``df/dt = -eta Theta grad_f loss(f, y_train)`` (heavy-ball momentum when ``momentum`` is given) by an
    adaptive ODE solver, accurate to about 1.4e-8 relative.

    Args:
        loss: ``loss(fx_train, y_train) -> scalar``.
        k_train_train: kernel of the training outputs (axes of ``y_train`` other than ``trace_axes``, interleaved).
        y_train: training targets.
        learning_rate: ``eta``.
        momentum: heavy-ball momentum in [0, 1), or ``None``.
        trace_axes: axes of ``y_train`` along which the kernel is the identity.

    Returns:
        ``predict_fn(t=None, fx_train_or_state_0=0.0, fx_test_0=None, k_test_train=None)`` as in
        `smnngp.predict.gradient_descent`.
    """
    return _predict.gradient_descent(loss, k_train_train, y_train, learning_rate, momentum, trace_axes)


@functools.cache
def _gaussians(names: tuple[str, ...]):
    return collections.namedtuple("Gaussians", names)


def gradient_descent_mse_ensemble(kernel_fn: Callable, x_train, y_train, learning_rate: float = 1.0,
                                  diag_reg: float = 0.0, diag_reg_absolute_scale: bool = False, trace_axes=(-1,),
                                  **kernel_fn_train_train_kwargs) -> Callable:
    """neural-tangents' ``predict.gradient_descent_mse_ensemble`` over `smnngp.predict.gradient_descent_mse_ensemble`.

    The Gaussian law at training time ``t`` of infinitely wide networks trained by gradient flow on the MSE:
    mean ``Theta*X Theta^{-1} (I - exp(-eta t Theta / n)) Y`` and the covariance given there.

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get, **kwargs)`` giving the NNGP / NTK.
        x_train: training inputs.
        y_train: training targets.
        learning_rate: ``eta``.
        diag_reg: diagonal regulariser (relative to the mean diagonal unless ``diag_reg_absolute_scale``).
        diag_reg_absolute_scale: take ``diag_reg`` in absolute units.
        trace_axes: axes of ``y_train`` along which the kernel is the identity.
        **kernel_fn_train_train_kwargs: keyword arguments of ``kernel_fn`` for the training kernel.

    Returns:
        ``predict_fn(t=None, x_test=None, get=None, compute_cov=False, **kernel_fn_test_test_kwargs)`` returning
        the mean (``compute_cov=False``, neural-tangents' default) or a :class:`Gaussian`, or a named tuple
        ``Gaussians`` of them for a tuple ``get`` (``None``: ``('nngp', 'ntk')``).
    """
    ensemble = _predict.gradient_descent_mse_ensemble(
        kernel_fn, x_train, y_train, learning_rate=learning_rate, diag_reg=diag_reg,
        diag_reg_absolute_scale=diag_reg_absolute_scale, trace_axes=trace_axes, **kernel_fn_train_train_kwargs)

    def predict_fn(t=None, x_test=None, get=None, compute_cov: bool = False, **kernel_fn_test_test_kwargs):
        out = ensemble(t, x_test, get, compute_cov, **kernel_fn_test_test_kwargs)
        if isinstance(get, str):
            return out
        return _gaussians(tuple(out._fields))(*out)

    return predict_fn
