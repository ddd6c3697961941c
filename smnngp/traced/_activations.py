"""Name the activation a traced elementwise chain computes, so that its closed form is used.

A chain (``max(u, 0)``, ``u * (1 + tanh(...)) / 2``, ``where(u > 0, u, 0.1 u)``, ...) is a function of one
Gaussian pre-activation. It is compared, by value at `PROBES` points spread over ``[-1e4, 1e4]`` (dense near
zero, both signs, and a few random ones), with the families whose kernels `smnngp.stax` has in closed form; the
parameters of a family are read off a few values of the chain and then every probe must agree to a tolerance of
a few hundred units in the last place of the trace's floating-point type. A chain that matches no family gets
`quadrature_layer`: the polar rule `smnngp.stax.elementwise.gauss_polar_2d` (split where either argument is 0, so
spectral for kinks and jumps at 0), its NTK through ``jax.grad`` of the chain. Each match also carries the closed
form of ``E[phi(u)]`` and ``E[phi'(u)]`` for u ~ N(0, v), which layer normalisation and cross moments need;
without one, those are computed by one-dimensional quadrature split at 0 (`gauss_split_1d`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf

from smnngp import stax
from smnngp.stax.elementwise import _activation, gauss_polar_2d, gauss_split_1d


def quadrature_nodes(deg: int) -> tuple[int, int, int]:
    """``(n_theta, n_r, n_1d)`` for ``quadrature_degree=deg``: Gauss-Legendre nodes on each of the polar rule's four
    arcs of angle and on its ray, at least 16 and 48 (the default 32 gives those) and growing with ``deg``
    (``deg // 2``, ``deg + 16``); and the one-dimensional rule's, ``max(1024, 4 n_r)`` (means cost one node per
    point, and a centred covariance E[phi phi'] - E[phi] E[phi'] keeps their errors whole: |cos h| before a layer
    norm is 0.020 off 1e6 Gaussian draws with 192-node means, 0.014 with 1,024, issue 49)."""
    n_r = max(48, int(deg) + 16)
    return max(16, int(deg) // 2), n_r, max(1024, 4 * n_r)


def quadrature_layer(fn: Callable, deg: int):
    """The activation ``fn`` (no closed form) integrated by the polar rule with `quadrature_nodes` ``(deg)``: the
    NNGP E[fn(u) fn(v)], the NTK's E[fn'(u) fn'(v)] (``jax.grad`` of ``fn``), the variances E[fn(u)^2] (the same
    rule at correlation 1, so that they are the NNGP's diagonal) and the mean E[fn(u)] by the one-dimensional rule
    split at 0. Not symmetric in (x1, x2) to rounding (the rule is not)."""
    n_theta, n_r, n_1d = quadrature_nodes(deg)
    dfn = jnp.vectorize(jax.grad(fn))

    def moments(c, v1, v2, want_dot):
        val = gauss_polar_2d(fn, fn, c, v1, v2, n_theta, n_r)
        dot = gauss_polar_2d(dfn, dfn, c, v1, v2, n_theta, n_r) if want_dot else None
        return val, dot

    def mean(v):
        return gauss_split_1d(fn, v, n_1d)

    name = getattr(fn, "__name__", "fn")
    return _activation(f"Quadrature({name}, n_theta={n_theta}, n_r={n_r})", fn, moments, symmetric=False,
                       mean=mean)


def _probe_points() -> np.ndarray:
    mags = np.concatenate([np.logspace(-6, 4, 121), np.linspace(0.05, 6.0, 120)])
    rng = np.random.default_rng(20261128)
    extra = rng.normal(size=40) * 3.0
    return np.unique(np.concatenate([[0.0], mags, -mags, extra]))


PROBES = _probe_points()


def _values(fn: Callable, points: np.ndarray, dtype) -> np.ndarray | None:
    with jax.ensure_compile_time_eval():
        try:
            out = fn(jnp.asarray(points, dtype))
        except (TypeError, ValueError):
            return None
    out = np.asarray(out, dtype=np.float64)
    return out if out.shape == points.shape else None


def _agrees(got: np.ndarray, ref: Callable, dtype) -> bool:
    """Whether the chain's values ``got`` at `PROBES` are ``ref``'s to rounding: a few hundred units in the last
    place of the value, and of ``|u ref'(u)|`` (a parameter read off the chain is itself rounded)."""
    eps = float(np.finfo(dtype).eps)
    h = 1e-6
    with np.errstate(all="ignore"):
        want = np.asarray(ref(PROBES), dtype=np.float64)
        cond = np.abs(np.asarray(ref(PROBES * (1 + h)), np.float64) - np.asarray(ref(PROBES * (1 - h)),
                                                                                  np.float64)) / (2 * h)
    if not np.all(np.isfinite(want)):
        return False
    return bool(np.all(np.abs(got - want) <= 256 * eps * (1.0 + np.abs(want) + cond)))


def _abrelu(a, b):
    def mean(v):
        return (b - a) * jnp.sqrt(v / (2 * math.pi))

    def mean_dot(v):
        return (a + b) / 2 * jnp.ones_like(v)

    if (a, b) == (0.0, 1.0):
        layer = stax.Relu()
    elif (a, b) == (-1.0, 1.0):
        layer = stax.Abs()
    elif b == 1.0:
        layer = stax.LeakyRelu(a)
    else:
        layer = stax.ABRelu(a, b)
    return layer, mean, mean_dot


def _candidates(fn, dtype, snap: bool):
    """(layer, mean, mean_dot, reference function) for each family whose parameters fit the chain's values;
    with ``snap`` the fitted parameters are rounded to 12 significant digits."""

    def p(x):
        return float(f"{x:.12g}") if snap else float(x)

    at = _values(fn, np.array([-1.0, 0.0, 1.0, 2.0]), dtype)
    if at is None:
        return
    f_m1, f_0, f_1, _ = at
    # a min(u, 0) + b max(u, 0)
    if f_0 == 0.0:
        a, b = p(-f_m1) + 0.0, p(f_1) + 0.0  # + 0.0: no -0.0 in the layer's name
        layer, mean, mean_dot = _abrelu(a, b)
        yield layer, mean, mean_dot, lambda u: a * np.minimum(u, 0) + b * np.maximum(u, 0)
    # u Phi(u), the exact gelu (its tanh approximation is another function: it gets quadrature)
    yield (stax.Gelu(), lambda v: v / jnp.sqrt(2 * math.pi * (1 + v)), None,
           lambda u: np.asarray(jax.nn.gelu(jnp.asarray(u, np.float64), approximate=False)))
    # a erf(b u) + c, b > 0
    big = _values(fn, np.array([1e4, -1e4]), dtype)
    if big is not None and np.all(np.isfinite(big)):
        c = p(f_0)
        a = p((big[0] - big[1]) / 2)
        if a != 0.0:
            slope = float(np.asarray(jax.grad(fn)(jnp.asarray(0.0, dtype))))
            b = p(slope * math.sqrt(math.pi) / (2 * a))
            if b > 0:
                yield (stax.Erf(a, b, c), lambda v: c * jnp.ones_like(v),
                       lambda v: a * b * 2 / jnp.sqrt(math.pi * (1 + 2 * b * b * v)),
                       lambda u: a * np.asarray(erf(jnp.asarray(b * u, np.float64))) + c)
    # a exp(b u)
    if f_0 != 0.0:
        a = p(f_0)
        slope = float(np.asarray(jax.grad(fn)(jnp.asarray(0.0, dtype))))
        b = p(slope / a)
        if b != 0.0:
            yield (stax.Exp(a, b), lambda v: a * jnp.exp(b * b * v / 2), lambda v: a * b * jnp.exp(b * b * v / 2),
                   lambda u: a * np.exp(b * u))
    # a sin(b u + c): from the first three derivatives at 0
    d = [float(f_0)]
    g = fn
    for _ in range(3):
        g = jax.grad(g)
        d.append(float(np.asarray(g(jnp.asarray(0.0, dtype)))))
    f0, f1, f2, f3 = d
    b2 = -f3 / f1 if f1 != 0 else (-f2 / f0 if f0 != 0 else 0.0)
    if b2 > 0:
        b = p(math.sqrt(b2))
        phase = p(math.atan2(f0 * b, f1))
        a = p(math.hypot(f0, f1 / b))
        if a != 0.0:
            yield (stax.Sin(a, b, phase), lambda v: a * math.sin(phase) * jnp.exp(-b * b * v / 2),
                   lambda v: a * b * math.cos(phase) * jnp.exp(-b * b * v / 2),
                   lambda u: a * np.sin(b * u + phase))
    # E[sign'(u)] is the density's weight at 0, 2 / sqrt(2 pi v) (Stein's lemma with the jump of 2)
    yield stax.Sign(), lambda v: jnp.zeros_like(v), lambda v: jnp.sqrt(2 / (math.pi * v)), np.sign


def recognise(fn: Callable, dtype, deg: int):
    """``(layer, mean, mean_dot, closed)`` for the chain ``fn``: a stax activation (``.kernel_map``,
    ``.moments``), closed forms of E[phi(u)] and E[phi'(u)] as functions of the variance v (or None), and
    whether the layer is a closed form (False: `quadrature_layer` ``(fn, deg)``)."""
    with jax.ensure_compile_time_eval():  # concrete values even while kernel_fn is being traced
        got = _values(fn, PROBES, dtype)
        if got is not None and np.all(np.isfinite(got)):
            for snap in (True, False):  # parameters read off the chain, rounded to 12 digits first (1.0, not
                for layer, mean, mean_dot, ref in _candidates(fn, dtype, snap):  # 0.9999999999999999)
                    if _agrees(got, ref, dtype):
                        return layer, mean, mean_dot, True
    return quadrature_layer(fn, deg), None, None, False
