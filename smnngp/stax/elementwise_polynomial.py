"""Polynomial activations: monomials, rectified monomials, polynomials and normalised Hermite polynomials.

Their kernels are polynomials in the covariances (the rectified ones times the arc-cosine angle), derived
from the Hermite expansion of the activation: for z ~ N(0, 1), x^m = sum_l [m! / (2^i i! sqrt(l!))] h_l(z)
over m = 2i + l, with h_l = He_l / sqrt(l!) orthonormal, and E[h_l(z1) h_k(z2)] = delta_lk rho^l for
standard normals of correlation rho (Mehler).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from numpy.polynomial import polynomial as npoly

from smnngp.stax._core import Layer
from smnngp.stax.elementwise import _activation, _angle

__all__ = ["Monomial", "RectifiedMonomial", "Polynomial", "Hermite"]


class DegreeError(ValueError, NotImplementedError):
    """A polynomial layer's degree is not a non-negative integer (both a ValueError and, as in
    neural-tangents, a NotImplementedError)."""


def _check_degree(degree, layer: str) -> int:
    if isinstance(degree, (bool, np.bool_)) or not isinstance(degree, (int, np.integer)):
        raise DegreeError(f"{layer}: degree must be a non-negative integer, got {degree!r}")
    if degree < 0:
        raise DegreeError(f"{layer}: degree must be a non-negative integer, got {degree}")
    return int(degree)


def _hermite_factors(coef: np.ndarray) -> list[np.ndarray]:
    """Coefficients (in v, lowest first) of R_l(v), l < len(coef), with phi(sqrt(v) z) = sum_l v^{l/2} R_l(v) h_l(z).

    For phi(x) = sum_m a_m x^m: R_l(v) = sum_i a_{2i+l} (2i + l)! / (2^i i! sqrt(l!)) v^i.
    """
    n = len(coef)
    out = []
    for l in range(n):
        out.append(np.array([coef[2 * i + l] * math.factorial(2 * i + l)
                             / (2.0 ** i * math.factorial(i) * math.sqrt(math.factorial(l)))
                             for i in range((n - 1 - l) // 2 + 1)], dtype=np.float64))
    return out


def _horner(coefs, x):
    """sum_i coefs[i] x^i."""
    acc = jnp.zeros_like(x)
    for a in reversed(list(coefs)):
        acc = acc * x + float(a)
    return acc


def _polynomial_layer(name: str, fn, coef: np.ndarray) -> Layer:
    """Elementwise layer of phi = sum_m coef[m] x^m, by Mehler's formula.

    E[phi(u) phi(v)] = sum_l v1^{l/2} v2^{l/2} R_l(v1) R_l(v2) rho^l = sum_l cov^l R_l(v1) R_l(v2),
    a polynomial in (cov, v1, v2) without square roots; E[phi' phi'] = d/dcov of it
    = sum_{l >= 1} l cov^{l-1} R_l(v1) R_l(v2) (Price's theorem). On the diagonal: sum_l v^l R_l(v)^2.
    """
    factors = _hermite_factors(coef)

    def moments(cov, v1, v2, want_dot):
        val = jnp.zeros(jnp.broadcast_shapes(cov.shape, jnp.shape(v1), jnp.shape(v2)), cov.dtype)
        dot = jnp.zeros_like(val) if want_dot else None
        powers = [jnp.ones_like(cov)]  # cov^l
        for _ in range(1, len(factors)):
            powers.append(powers[-1] * cov)
        for l, r in enumerate(factors):
            term = _horner(r, v1) * _horner(r, v2)
            val = val + powers[l] * term
            if want_dot and l >= 1:
                dot = dot + l * powers[l - 1] * term
        return val, dot

    def diag(v):
        out = jnp.zeros_like(v)
        power = jnp.ones_like(v)
        for r in factors:
            out = out + power * _horner(r, v) ** 2
            power = power * v
        return out

    return _activation(name, fn, moments, diag, remask=False)


def Polynomial(coef: Sequence[float]) -> Layer:
    """phi(x) = coef[0] + coef[1] x + ... + coef[n] x^n (numpy.polynomial's order: lowest degree first).

    With R_l(v) = sum_i coef[2i + l] (2i + l)! / (2^i i! sqrt(l!)) v^i (the Hermite coefficients of
    phi(sqrt(v) z), divided by v^{l/2}):
    E[phi phi] = sum_l cov^l R_l(v1) R_l(v2),  E[phi' phi'] = sum_{l >= 1} l cov^{l - 1} R_l(v1) R_l(v2).
    (Exact polynomials in the covariances; an empty ``coef`` is phi = 0.)

    Args:
        coef: the coefficients, a one-dimensional sequence of finite numbers.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``coef`` is not a sequence of numbers.
        ValueError: if ``coef`` is not one-dimensional or has a non-finite entry.
    """
    try:
        arr = np.asarray(coef, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"Polynomial: coef must be a sequence of numbers, got {coef!r}") from None
    if arr.ndim != 1:
        raise ValueError(f"Polynomial: coef must be one-dimensional, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"Polynomial: coef must be finite, got {arr.tolist()}")

    def fn(x):
        return _horner(arr, x)

    return _polynomial_layer(f"Polynomial({arr.tolist()})", fn, arr)


def Monomial(degree: int) -> Layer:
    """phi(x) = x^degree.

    E[u^n v^n] = sum_{k <= n, n - k even} C(n, k)^2 k! ((n - k - 1)!!)^2 cov^k (v1 v2)^{(n - k)/2}
    (e.g. 2 cov^2 + v1 v2 for n = 2), E[phi' phi'] = n^2 E[u^{n-1} v^{n-1}]; on the diagonal (2n - 1)!! v^n.
    (`Polynomial` with the single coefficient x^n.)

    Args:
        degree: the power n, a non-negative integer (neural-tangents allows 0 to 5; any is fine here).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        DegreeError: (a ValueError and NotImplementedError) if ``degree`` is not a non-negative integer.
    """
    n = _check_degree(degree, "Monomial")
    coef = np.zeros(n + 1)
    coef[n] = 1.0

    def fn(x):
        return x**n

    return _polynomial_layer(f"Monomial({n})", fn, coef)


def Hermite(degree: int) -> Layer:
    """phi(x) = He_n(x) / sqrt(n!), the probabilists' Hermite polynomial normalised to E[phi(z)^2] = 1.

    For pre-activations of unit variance (v1 = v2 = 1), Mehler's formula gives E[phi phi] = cov^n and
    E[phi' phi'] = n cov^{n-1} (phi' = sqrt(n) He_{n-1} / sqrt((n-1)!)), which is the kernel map used; it is
    the kernel of the finite network only when the inputs to the layer have unit variance (e.g. inputs with
    ||x||^2 = d before ``Dense(W_std=1, b_std=0)``). A concrete kernel whose variances differ from 1 by more
    than sqrt(eps) raises; under `jit` they cannot be checked, and a warning says so (as neural-tangents warns).

    Args:
        degree: the degree n, a non-negative integer.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        DegreeError: (a ValueError and NotImplementedError) if ``degree`` is not a non-negative integer.
        ValueError: from ``kernel_fn``, if the concrete input variances are not 1.
    """
    n = _check_degree(degree, "Hermite")
    norm = 1.0 / math.sqrt(math.factorial(n))
    name = f"Hermite({n})"

    def fn(x):
        # He_{k+1} = x He_k - k He_{k-1}.
        prev, cur = jnp.ones_like(x), x
        if n == 0:
            return prev
        for k in range(1, n):
            prev, cur = cur, x * cur - k * prev
        return cur * norm

    def check(*variances):
        if any(isinstance(v, jax.core.Tracer) for v in variances):
            warnings.warn(f"{name}: the kernel assumes inputs of unit variance across channels (it is cov^n); "
                          f"under jit this cannot be checked", stacklevel=3)
            return
        tol = math.sqrt(float(jnp.finfo(variances[0].dtype).eps))
        dev = max(float(jnp.max(jnp.abs(v - 1))) if jnp.size(v) else 0.0 for v in variances)
        if dev > tol:
            raise ValueError(f"{name}: the inputs to the layer must have unit variance (its kernel cov^n holds only "
                             f"then); the variances differ from 1 by up to {dev:.3g}. Normalise the inputs (e.g. "
                             f"||x||^2 = d before Dense(W_std=1, b_std=0))")

    def moments(cov, v1, v2, want_dot):
        check(v1, v2)
        val = cov**n
        dot = None
        if want_dot:
            dot = jnp.zeros_like(cov) if n == 0 else n * cov ** (n - 1)
        return val, dot

    def diag(v):
        check(v)
        return v**n

    return _activation(name, fn, moments, diag)


def _arccos_polynomials(n: int):
    """Coefficients (in rho, lowest first) of P_n, Q_n with J_n(theta) = P_n(rho) sin(theta) + (pi - theta) Q_n(rho).

    J_n is Cho & Saul's (2009) angular factor of the order-n arc-cosine kernel,
    J_n = (-1)^n sin^{2n+1}(theta) ((1 / sin theta) d/dtheta)^n ((pi - theta) / sin theta). Differentiating
    gives J_{n+1} = (2n + 1) rho J_n + (1 - rho^2) dJ_n/drho with rho = cos theta, hence
    P_{n+1} = 2n rho P_n + (1 - rho^2) P_n' + Q_n,  Q_{n+1} = (2n + 1) rho Q_n + (1 - rho^2) Q_n',
    from P_0 = 0, Q_0 = 1.
    """
    p, q = np.zeros(1), np.ones(1)
    one_minus_sq = np.array([1.0, 0.0, -1.0])
    for k in range(n):
        p, q = (npoly.polyadd(npoly.polyadd(npoly.polymulx(p) * 2 * k, npoly.polymul(one_minus_sq, npoly.polyder(p))),
                              q),
                npoly.polyadd(npoly.polymulx(q) * (2 * k + 1), npoly.polymul(one_minus_sq, npoly.polyder(q))))
    return npoly.polytrim(p), npoly.polytrim(q)


def _homogeneous(coefs, c, r, degree: int):
    """sum_k coefs[k] c^k r^{degree - k}: r^degree times the polynomial at rho = c / r, without dividing."""
    total = jnp.zeros(jnp.broadcast_shapes(jnp.shape(c), jnp.shape(r)), c.dtype)
    for k, a in enumerate(coefs):
        if a != 0:
            total = total + float(a) * c**k * r ** (degree - k)
    return total


def RectifiedMonomial(degree: int) -> Layer:
    """phi(x) = x^n for x >= 0, 0 otherwise (the order-n arc-cosine kernel, Cho & Saul 2009).

    With r = sqrt(v1 v2), theta = arccos(cov / r) and J_n = P_n(cos theta) sin theta + (pi - theta) Q_n(cos theta)
    (polynomials from the recurrence in `_arccos_polynomials`; J_0 = pi - theta,
    J_1 = sin theta + (pi - theta) cos theta):
    E[phi phi] = r^n J_n(theta) / (2 pi), evaluated as [r sin(theta) sum_k P_k cov^k r^{n-1-k}
    + (pi - theta) sum_k Q_k cov^k r^{n-k}] / (2 pi);
    E[phi' phi'] = n^2 E[(u)_+^{n-1} (v)_+^{n-1}] = n^2 r^{n-1} J_{n-1}(theta) / (2 pi), and 0 for n = 0
    (the step function's derivative is taken as 0, as neural-tangents does); on the diagonal (2n - 1)!! v^n / 2.
    Correlations within 16 ulps of +-1 are taken as +-1 (as `ABRelu`).

    Args:
        degree: the power n, a non-negative integer.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        DegreeError: (a ValueError and NotImplementedError) if ``degree`` is not a non-negative integer.
    """
    n = _check_degree(degree, "RectifiedMonomial")
    polys = [_arccos_polynomials(m) for m in (n, n - 1)] if n > 0 else [_arccos_polynomials(0)]
    double_factorial = math.prod(range(2 * n - 1, 0, -2))

    def fn(x):
        return jnp.where(x >= 0, x**n, 0.0).astype(x.dtype)

    def kernel(m, pq, sin_part, theta, c, r):
        p, q = pq
        val = (math.pi - theta) * _homogeneous(q, c, r, m)
        if m > 0:
            val = val + sin_part * _homogeneous(p, c, r, m - 1)
        return val / (2 * math.pi)

    def moments(c, v1, v2, want_dot):
        sin_part, theta, r, c = _angle(c, v1, v2)  # c rounded through the correlation (see `_angle`)
        val = kernel(n, polys[0], sin_part, theta, c, r)
        dot = None
        if want_dot:
            dot = jnp.zeros_like(val) if n == 0 else n * n * kernel(n - 1, polys[1], sin_part, theta, c, r)
        return val, dot

    def diag(v):
        return (double_factorial / 2) * v**n

    def mean(v):  # E[u^n 1(u >= 0)] = v^{n/2} 2^{n/2} Gamma((n + 1) / 2) / (2 sqrt(pi))
        return (2.0 ** (n / 2) * math.gamma((n + 1) / 2) / (2 * math.sqrt(math.pi))) * v ** (n / 2)

    return _activation(f"RectifiedMonomial({n})", fn, moments, diag, remask=False, mean=mean)
