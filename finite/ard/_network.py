"""The NARX network of the ARD paper (section 2, Eq. 4): activations with the first and second derivatives the
Hessian recursion needs (`ACTIVATIONS`), `Layer`, `ArdMLP` (weights stored ``(n_{l-1}, n_l)``: a row is an input
node's outgoing weights, a column a node's incoming ones), the builder `mlp`, `narx_regressors`, and the check of
regression data ``(Z, y, w)`` against a network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ACTIVATIONS", "Layer", "ArdMLP", "mlp", "narx_regressors"]



def _relu_d1(h):
    return (h > 0).astype(h.dtype)


def _tanh_d1(h):
    return 1.0 - jnp.tanh(h) ** 2


def _tanh_d2(h):
    t = jnp.tanh(h)
    return -2.0 * t * (1.0 - t * t)


def _sigmoid_d1(h):
    s = jax.nn.sigmoid(h)
    return s * (1.0 - s)


def _sigmoid_d2(h):
    s = jax.nn.sigmoid(h)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


ACTIVATIONS: dict[str, tuple[Callable, Callable, Callable]] = {
    "relu": (jax.nn.relu, _relu_d1, jnp.zeros_like),
    "tanh": (jnp.tanh, _tanh_d1, _tanh_d2),
    "sigmoid": (jax.nn.sigmoid, _sigmoid_d1, _sigmoid_d2),
}


class Layer(NamedTuple):
    """One dense layer: ``W`` of shape ``(n_in, n_out)`` (rows = inputs), ``b`` of shape ``(n_out,)``."""

    W: jax.Array
    b: jax.Array


class ArdMLP(NamedTuple):
    """An MLP ``sizes[0] -> ... -> 1`` with a hidden ``activation`` and a linear scalar output (hashable: usable
    as a static argument). Build it with :func:`mlp`."""

    sizes: tuple
    activation: str

    @property
    def shapes(self) -> tuple:
        """``(n_in, n_out)`` of every weight matrix."""
        return tuple(zip(self.sizes[:-1], self.sizes[1:]))

    def num_weights(self) -> int:
        """Number of weights (biases excluded: they carry no prior and are never pruned)."""
        return sum(a * b for a, b in self.shapes)

    def init(self, key, dtype=jnp.float32) -> tuple:
        """Weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (the common default of deep-learning
        libraries, which the paper's authors used). Returns a tuple of :class:`Layer`."""
        params = []
        for k, (n_in, n_out) in zip(jax.random.split(key, len(self.shapes)), self.shapes):
            kw, kb = jax.random.split(k)
            s = 1.0 / math.sqrt(n_in)
            params.append(Layer(jax.random.uniform(kw, (n_in, n_out), dtype, -s, s),
                                jax.random.uniform(kb, (n_out,), dtype, -s, s)))
        return tuple(params)

    def forward(self, params, x):
        """``(output (N,), pre-activations [h^1 .. h^L], inputs of each layer [a^0 .. a^{L-1}])``."""
        f = ACTIVATIONS[self.activation][0]
        a, hs, ins = x, [], []
        for i, layer in enumerate(params):
            ins.append(a)
            h = a @ layer.W
            h = h + jnp.broadcast_to(layer.b, h.shape)  # inputs of any batch rank
            hs.append(h)
            a = f(h) if i < len(params) - 1 else h
        return a[..., 0], hs, ins

    def apply(self, params, x):
        """Network output for inputs ``x`` of shape ``(..., sizes[0])``: shape ``(...)``."""
        return self.forward(params, x)[0]


def mlp(sizes, activation: str = "relu") -> ArdMLP:
    """An :class:`ArdMLP` with layer widths ``sizes`` (input dimension first, output 1 last), e.g. the paper's
    one-step network ``mlp((11, 100, 100, 1))`` and simulation network ``mlp((39, 10, 10, 10, 1))``.

    Args: ``sizes`` a sequence of positive ints ending in 1; ``activation`` one of ``"relu"``, ``"tanh"``,
    ``"sigmoid"``. Returns: the spec. Raises ``ValueError`` naming a bad argument."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"mlp: sizes must be >= 2 positive widths, got {sizes}")
    if sizes[-1] != 1:
        raise ValueError(f"mlp: the output width must be 1 (scalar y(t)), got {sizes[-1]}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"mlp: unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    return ArdMLP(sizes, activation)


def narx_regressors(u, y, n_a: int, n_b: int | None = None):
    """NARX regressors ``z(t) = [u(t-n_a), ..., u(t), y(t-n_b), ..., y(t-1)]`` and targets ``y(t)`` for
    ``t = m, ..., T-1``, ``m = max(n_a, n_b)`` (the first ``m`` samples only serve as lags).

    Args: ``u``, ``y`` 1-D records of equal length ``T > m``; ``n_a`` the input lag (>= 0); ``n_b`` the output lag
    (>= 1, default ``n_a``). Returns: ``(Z (T-m, n_a+1+n_b), targets (T-m,))``.
    """
    n_b = n_a if n_b is None else n_b
    if int(n_a) != n_a or n_a < 0 or int(n_b) != n_b or n_b < 1:
        raise ValueError(f"narx_regressors: lags must be integers n_a >= 0 and n_b >= 1, got {n_a}, {n_b}")
    u, y = jnp.asarray(u), jnp.asarray(y)
    if u.ndim != 1 or y.shape != u.shape:
        raise ValueError(f"narx_regressors: u and y must be 1-D of equal length, got {u.shape} and {y.shape}")
    m = max(n_a, n_b)
    T = u.shape[0]
    if T <= m:
        raise ValueError(f"narx_regressors: a record of {T} samples is too short for lags {n_a}, {n_b}")
    t = np.arange(m, T)
    Z = jnp.concatenate([u[t[:, None] + np.arange(-n_a, 1)], y[t[:, None] + np.arange(-n_b, 0)]], axis=1)
    return Z, y[m:]


def _check_data(Z, y, w, model, who):
    Z, y = jnp.asarray(Z), jnp.asarray(y)
    if Z.ndim != 2 or Z.shape[1] != model.sizes[0]:
        raise ValueError(f"{who}: Z must have shape (N, {model.sizes[0]}), got {Z.shape}")
    if y.shape != (Z.shape[0],):
        raise ValueError(f"{who}: y must have shape ({Z.shape[0]},), got {y.shape}")
    if not (bool(jnp.all(jnp.isfinite(Z))) and bool(jnp.all(jnp.isfinite(y)))):
        raise ValueError(f"{who}: Z and y must be finite (NaN or inf found)")
    if w is None:
        w = jnp.ones(y.shape, Z.dtype)
    w = jnp.asarray(w, Z.dtype)
    if w.shape[-1] != y.shape[0] or bool(jnp.any(w < 0)) or bool(jnp.any(jnp.sum(w, axis=-1) <= 0)):
        raise ValueError(f"{who}: sample weights must be >= 0 with a positive sum and last axis {y.shape[0]}, "
                         f"got shape {w.shape}")
    return Z, y.astype(Z.dtype), w
