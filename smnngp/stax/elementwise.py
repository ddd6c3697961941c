"""Elementwise activations and their closed-form (or quadrature) kernel maps."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp._axes import lead
from smnngp.kernels import Kernel
from smnngp.stax import _flow
from smnngp.stax._core import (
    Layer,
    _act_param,
    _fmt,
    _spatial_diagonal,
    self_covariances,
)
from smnngp.stax.masking import MaskRule

# ---------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------

__all__ = [
    "Relu", "ABRelu", "LeakyRelu", "Abs", "Sign", "Erf", "Sigmoid_like", "Gelu", "Sin", "Cos", "Rbf", "Exp",
    "Gaussian", "Gabor", "ExpNormalized", "Elementwise", "ElementwiseNumerical",
]


def _pair_variances(k: Kernel):
    """Variances matching each entry of nngp, cov1 and cov2 (broadcastable)."""
    nd = k.spatial_ndim
    if not k.full or nd == 0:
        v1 = k.cov1
        v2 = k.cov1 if k.cov2 is None else k.cov2
        nngp_pair = (v1[:, None], v2[None])
        return nngp_pair, (k.cov1, k.cov1), None if k.cov2 is None else (k.cov2, k.cov2)

    d1 = _spatial_diagonal(k.cov1, 1)  # (N1, H, W)
    d2 = d1 if k.cov2 is None else _spatial_diagonal(k.cov2, 1)

    def interleave(d, first: bool, batch_pos):
        # (N, H, W) -> positions (H, 1, W, 1) or (1, H, 1, W) after batch axes.
        n = d.shape[0]
        shape = [1] * len(batch_pos)
        shape[batch_pos.index(True)] = n
        for size in d.shape[1:]:
            shape += [size, 1] if first else [1, size]
        return d.reshape(shape)

    nngp_pair = (interleave(d1, True, [True, False]), interleave(d2, False, [False, True]))
    cov1_pair = (interleave(d1, True, [True]), interleave(d1, False, [True]))
    cov2_pair = None if k.cov2 is None else (interleave(d2, True, [True]), interleave(d2, False, [True]))
    return nngp_pair, cov1_pair, cov2_pair


def _activation(name: str, fn: Callable, moments: Callable, diag: Callable | None = None, symmetric=True,
                remask: bool = True, mean: Callable | None | str = "quadrature") -> Layer:
    """Elementwise layer from ``moments(c, v1, v2, need_dot) -> (E[phi phi], E[phi' phi'] or None)``.

    ``diag(v) = E[phi(u)^2]`` for u ~ N(0, v), when given, is the closed form of
    ``moments(v, v, v)`` used for the batch diagonals ``cov1``/``cov2`` when they
    hold same-position variances only (dense or ``full=False``); it spares the
    general formula's transcendental functions on those entries.

    Masks pass unchanged; with ``remask`` the covariances of masked positions are zeroed after the map (the
    layers neural-tangents leaves unzeroed, those with phi(0) = 0 or whose constant term it keeps, pass
    ``remask=False``).

    ``mean(v) = E[phi(u)]`` for u ~ N(0, v) (what a sum with another branch needs, `smnngp.stax._flow`): a closed
    form, ``'quadrature'`` (the default: `gauss_split_1d` of ``fn``, spectral for kinks at 0), or
    ``None`` when the layer has no finite network.
    """
    if mean == "quadrature":
        def mean(v):
            return gauss_split_1d(fn, v)

    def init_fn(key, input_shape):
        return input_shape, ()

    def apply_fn(params, x, **kwargs):
        return fn(x)

    def kernel_map(k: Kernel) -> Kernel:
        if not k.is_gaussian:
            flow = _flow.of(k)
            if flow.chain is not None and mean is not None and not _flow.has_masks(k):
                # phi after other activations of one Gaussian u: the chain phi(psi(u)) by quadrature over u
                return _flow.chain_kernel(flow, fn, k)
            raise ValueError(
                f"{name}: the input to an activation must be Gaussian, i.e. an affine layer (Dense or "
                f"Conv) must come before it, or a chain of activations of one Gaussian; got activations of "
                f"shape {k.shape1} that are neither"
            )
        nngp_pair, cov1_pair, cov2_pair = _pair_variances(k)
        want_dot = k.ntk is not None
        nngp, dot = moments(k.nngp, *nngp_pair, want_dot)
        cov1, cov2 = self_covariances(k, nngp), None  # x2 is x1 with full covariances: off the new nngp
        if cov1 is None and diag is not None and (not k.full or k.spatial_ndim == 0):
            cov1 = diag(k.cov1)
            cov2 = None if k.cov2 is None else diag(k.cov2)
        elif cov1 is None:
            cov1, _ = moments(k.cov1, *cov1_pair, False)
            cov2 = None if cov2_pair is None else moments(k.cov2, *cov2_pair, False)[0]
        ntk = None if k.ntk is None else k.ntk * dot
        return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2, is_gaussian=False)

    layer = Layer(name, init_fn, apply_fn, lambda s: s, kernel_map, lambda full: full, symmetric,
                  masking=MaskRule(remask=remask), means=_flow.activation(mean, fn))
    # The bivariate moments, phi itself and its mean, for engines that pair two different Gaussians (traced).
    layer.moments = moments
    layer.activation = fn
    layer.mean = mean
    return layer


def _safe_sqrt(x):
    return jnp.sqrt(jnp.maximum(x, 0.0))


# Cephes' atan (S. L. Moshier): tan(3 pi / 8), the coefficients of P(z) / Q(z) ~ (atan(r) - r) / r^3
# on |r| <= 0.66 (Q monic).
_ATAN_T3P8 = 2.41421356237309504880
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)


def _pow2_inverse(d):
    """2^-floor(log2 d) for positive normal ``d``: multiplying by it is exact."""
    int_type, mantissa, twice_bias = (jnp.int64, 52, 2046) if d.dtype == jnp.float64 else (jnp.int32, 23, 254)
    exponent = lax.shift_right_logical(lax.bitcast_convert_type(d, int_type), jnp.asarray(mantissa, int_type))
    return lax.bitcast_convert_type(
        lax.shift_left(jnp.asarray(twice_bias, int_type) - exponent, jnp.asarray(mantissa, int_type)), d.dtype
    )


def _atan2(y, x, x_nonnegative: bool = False):
    """atan2(y, x) for finite arguments, within 3 ulps, in arithmetic that XLA fuses and vectorises.

    XLA:CPU evaluates float64 atan2 (and atan) by one scalar library call per
    element, which dominated the arc-cosine and erf kernels; this is several
    times faster. Cephes' reduction: with a = |y| / |x|, atan(a) = pi/2 +
    atan(-1/a) for a > tan(3 pi/8), pi/4 + atan((a - 1)/(a + 1)) for a > 0.66,
    else atan(a). Each reduced ratio n / d is kept as a pair, scaled by a power
    of two, P and Q are evaluated homogeneously in (n^2, d^2), and the result
    is a single division that nothing but sign flips follows: XLA ends a fusion
    at a costly op (division, square root) whose result has several consumers,
    so any later use of ``d`` or of the branch would cut the fusion again.
    ``x_nonnegative`` promises x >= 0 and drops the read of x's sign for the
    same reason (``x`` is a square root at the call sites).
    Signed zeros follow IEEE atan2; NaN propagates.
    """
    ay, ax = jnp.abs(y), jnp.abs(x)
    big, mid = ay > _ATAN_T3P8 * ax, ay > 0.66 * ax
    n = jnp.where(big, -ax, jnp.where(mid, ay - ax, ay))
    d = jnp.where(big, ay, jnp.where(mid, ay + ax, ax))
    d = jnp.where(d == 0, 1.0, d)  # x = y = 0: n = 0, and the result is 0 rather than 0 / 0
    base = jnp.where(big, math.pi / 2, jnp.where(mid, math.pi / 4, 0.0))
    scale = _pow2_inverse(d)
    n, d = n * scale, d * scale
    u, w = n * n, d * d
    w2 = w * w
    w3, w4 = w2 * w, w2 * w2
    p = (((_ATAN_P[0] * u + _ATAN_P[1] * w) * u + _ATAN_P[2] * w2) * u + _ATAN_P[3] * w3) * u + _ATAN_P[4] * w4
    q = ((((u + _ATAN_Q[0] * w) * u + _ATAN_Q[1] * w2) * u + _ATAN_Q[2] * w3) * u + _ATAN_Q[3] * w4) * u
    q = q + _ATAN_Q[4] * w4 * w
    # base + atan(n / d) = base + (n / d) (1 + z P(z) / Q(z)) with z = n^2 / d^2, as one division whose
    # numerator carries the quadrant (pi - t for x < 0, -t for y < 0; d q > 0): a select after the division
    # would make the result a cheap function of the signs of y and x, which XLA recomputes in every
    # consumer, down through all the layers whose output feeds y.
    dq = d * q
    num = base * dq + n * (q + u * p)
    if not x_nonnegative:
        num = jnp.where(jnp.signbit(x), math.pi * dq - num, num)
    return jnp.where(jnp.signbit(y), -num, num) / dq


@jax.custom_jvp
def _sqrt_variance(v):
    """sqrt(v) of a variance (v >= 0) whose derivative is taken as 0 where v = 0.

    The arc-cosine kernels are homogeneous of degree 1 in each input, so at a point of zero variance (a zero
    input without bias) they have no derivative; sqrt's infinite slope there would make gradients NaN. Taking
    it as 0 (the kernel's derivative along the radial direction, as neural-tangents does) keeps forward and
    reverse mode finite and equal.
    """
    return jnp.sqrt(v)


@_sqrt_variance.defjvp
def _sqrt_variance_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    root = jnp.sqrt(v)
    positive = v > 0
    return root, jnp.where(positive, dv / (2 * jnp.where(positive, root, 1.0)), 0.0)


def _angle(c, v1, v2):
    """``(sin_part, theta, root, c_hat)`` for the arc-cosine kernels, all from the correlation c / sqrt(v1 v2).

    root = sqrt(v1) sqrt(v2), theta = arccos(c / root) in [0, pi], sin_part = root sin(theta) = sqrt(v1 v2 - c^2)
    and c_hat = root cos(theta), which is ``c`` rounded through the correlation. Callers build their output from
    ``c_hat``, never from ``c``: the correlation is a division, which XLA keeps as an array of its own, so a
    layer's output is a function of arrays the layer computed. With ``c`` in the output (slope sin_part +
    dot c), each layer's output was a cheap expression of the previous layer's, which XLA recomputes inside
    every consumer: a depth-L network compiled O(L^2) code (the MLP-4 ReLU kernel of 2,000 points compiled
    in 0.27 s and ran in 0.10 s; now 0.19 s and 0.05 s on 2 CPU cores). The square roots are taken per point,
    not per pair (3 layers of 1,000 points: 0.036 s -> 0.029 s).

    Correlations within 16 ulps of +-1 are taken as exactly +-1 (collinear inputs): beyond that the inputs'
    rounding cannot resolve the angle, and the square root would turn last-bit noise into ~1e-8 errors and
    tiny negative eigenvalues. On the diagonal (c = v1 = v2 = v) this makes theta = 0 and sin_part = 0
    exactly, while root and c_hat are v to within an ulp. Where a variance is 0 the correlation is taken as 1
    (theta = 0) and root, sin_part and c_hat are 0.
    """
    root = _sqrt_variance(v1) * _sqrt_variance(v2)
    positive = root > 0
    cos = jnp.where(positive, c / jnp.where(positive, root, 1.0), 1.0)
    tol = 16 * jnp.finfo(c.dtype).eps
    lo, hi = 1 - cos, 1 + cos
    lo = jnp.where(lo <= tol, 0.0, lo)
    hi = jnp.where(hi <= tol, 0.0, hi)
    prod = lo * hi
    # Double where: sqrt's derivative at 0 is infinite, and inf * 0 would poison
    # hyperparameter gradients at coincident points; values are unchanged.
    sin_unit = jnp.where(prod > 0, jnp.sqrt(jnp.where(prod > 0, prod, 1.0)), 0.0)
    return root * sin_unit, _atan2(sin_unit, cos), root, root * cos


def _pow2_scale(c):
    """An exact even power of two within a factor 4 of 1 / max|c| (1 when c is all zero), without gradient.

    Multiplying by it is exact in floating point, and so is taking its square root (the arc-cosine kernels
    take sqrt(v1) and sqrt(v2) apart), so a kernel map that is homogeneous of degree 1 in (c, v1, v2) gives,
    bit for bit, the same result on rescaled inputs; the rescaling only moves the intermediate products
    (v1 v2) away from overflow and underflow.
    """
    m = lax.stop_gradient(jnp.max(jnp.abs(c)))
    m = jnp.where((m > 0) & jnp.isfinite(m), m, 1.0)
    _, e = jnp.frexp(m)
    info = jnp.finfo(c.dtype)
    e = jnp.clip(e, int(info.minexp) + 2, int(info.maxexp) - 2)
    e = e - e % 2
    return jnp.ldexp(jnp.ones((), c.dtype), -e)


def _check_flag(value, name: str, layer: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{layer}: {name} must be True or False, got {value!r}")
    return bool(value)


def ABRelu(a: float, b: float, do_stabilize: bool = False) -> Layer:
    """phi(x) = a min(x, 0) + b max(x, 0) (Cho & Saul 2009 arc-cosine kernel, generalised).

    With theta the angle between u and v:
    E[phi phi] = (a - b)^2 / (2 pi) sqrt(v1 v2) sin(theta) + [(a^2 + b^2)/2 - (a - b)^2 theta / (2 pi)] c,
    E[phi' phi'] = (a^2 + b^2)/2 - (a - b)^2 theta / (2 pi).

    E[phi phi] is homogeneous of degree 1 in (c, v1, v2) and E[phi' phi'] of degree 0. ``do_stabilize=True``
    evaluates both on (c, v1, v2) divided by the power of two nearest max|c| and multiplies E[phi phi] back:
    the rescaling is exact, so the values are those of ``do_stabilize=False`` wherever the latter neither
    overflows nor underflows (v1 v2 beyond the dtype's range, as in very deep networks), and finite there.

    Args:
        a: slope for negative inputs, a finite number (may be traced).
        b: slope for positive inputs, a finite number (may be traced).
        do_stabilize: rescale the covariances before the formula (for very deep networks; see above).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine
        layer (`Dense` or `Conv`).

    Raises:
        TypeError: if ``a`` or ``b`` is not a number, or ``do_stabilize`` not a bool.
        ValueError: if a concrete ``a`` or ``b`` is not finite, or a traced one is not a scalar.
    """
    a, b = _act_param(a, "a", "ABRelu"), _act_param(b, "b", "ABRelu")
    stabilize = _check_flag(do_stabilize, "do_stabilize", "ABRelu")

    def fn(x):
        return a * jnp.minimum(x, 0) + b * jnp.maximum(x, 0)

    def moments(c, v1, v2, want_dot):
        sin_part, theta, _, c_hat = _angle(c, v1, v2)
        slope = (a - b) ** 2 / (2 * math.pi)
        dot = (a * a + b * b) / 2 - slope * theta
        return slope * sin_part + dot * c_hat, (dot if want_dot else None)

    def diag(v):
        # theta = 0 on the diagonal: moments(v, v, v) to within an ulp (see `_angle`).
        return ((a * a + b * b) / 2) * v

    if stabilize:
        moments = _stabilized(moments)
    def mean(v):
        return (b - a) * jnp.sqrt(v / (2 * math.pi))

    return _activation(f"ABRelu({_fmt(a)}, {_fmt(b)})", fn, moments, diag, remask=False, mean=mean)


def _stabilized(moments):
    """``moments`` of degree-1 homogeneous E[phi phi], evaluated on exactly rescaled covariances."""

    def wrapped(c, v1, v2, want_dot):
        scale = _pow2_scale(c)
        val, dot = moments(c * scale, v1 * scale, v2 * scale, want_dot)
        return val / scale, dot

    return wrapped


def Relu(do_stabilize: bool = False) -> Layer:
    """phi(x) = max(x, 0).

    Args:
        do_stabilize: rescale the covariances before the arc-cosine formula (see `ABRelu`).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)``: `ABRelu` with ``a = 0``, ``b = 1``, named "Relu".

    Raises:
        TypeError: if ``do_stabilize`` is not a bool.
    """
    layer = ABRelu(0.0, 1.0, _check_flag(do_stabilize, "do_stabilize", "Relu"))
    layer.name = "Relu"
    return layer


def LeakyRelu(alpha: float, do_stabilize: bool = False) -> Layer:
    """phi(x) = x for x > 0, alpha x otherwise.

    Args:
        alpha: slope for negative inputs, a finite number (may be traced).
        do_stabilize: rescale the covariances before the arc-cosine formula (see `ABRelu`).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)``: `ABRelu` with ``a = alpha``, ``b = 1``.

    Raises:
        TypeError: if ``alpha`` is not a number, or ``do_stabilize`` not a bool.
        ValueError: if a concrete ``alpha`` is not finite.
    """
    layer = ABRelu(_act_param(alpha, "alpha", "LeakyRelu"), 1.0,
                   _check_flag(do_stabilize, "do_stabilize", "LeakyRelu"))
    layer.name = f"LeakyRelu({_fmt(alpha)})"
    return layer


def Abs(do_stabilize: bool = False) -> Layer:
    """phi(x) = |x|: `ABRelu` with a = -1, b = 1.

    E[phi phi] = (2 / pi) (sqrt(v1 v2 - c^2) + (pi/2 - theta) c), E[phi' phi'] = 1 - 2 theta / pi.

    Args:
        do_stabilize: rescale the covariances before the arc-cosine formula (see `ABRelu`).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` named "Abs"; it must follow an affine layer.

    Raises:
        TypeError: if ``do_stabilize`` is not a bool.
    """
    layer = ABRelu(-1.0, 1.0, _check_flag(do_stabilize, "do_stabilize", "Abs"))
    layer.name = "Abs"
    return layer


def Sign() -> Layer:
    """phi(x) = sign(x).

    E[sign(u) sign(v)] = 1 - 2 theta / pi (theta = arccos(c / sqrt(v1 v2)); 0 where a variance is 0), and
    E[phi phi] = 1 on the diagonal of a nonzero variance. phi' = 0 almost everywhere, so the NTK after the
    layer is 0 (the layer passes no gradient to what comes before it).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.
    """

    def moments(c, v1, v2, want_dot):
        _, theta, root, _ = _angle(c, v1, v2)
        val = jnp.where(root > 0, 1 - theta * (2 / math.pi), 0.0)
        return val, (jnp.zeros_like(val) if want_dot else None)

    def diag(v):
        return jnp.where(v == 0, 0.0, 1.0).astype(v.dtype)

    return _activation("Sign", jnp.sign, moments, diag, remask=False, mean=jnp.zeros_like)


def Erf(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """phi(x) = a erf(b x) + c (Williams 1997).

    E[erf(bu) erf(bv)] = (2/pi) arcsin(2 b^2 c / sqrt((1 + 2 b^2 v1)(1 + 2 b^2 v2))),
    E[phi' phi'] = a^2 b^2 (4/pi) / sqrt((1 + 2b^2 v1)(1 + 2b^2 v2) - 4 b^4 c^2).

    (In these two formulas ``c`` is the cross covariance; the argument ``c`` adds ``c^2`` to E[phi phi].)

    Args:
        a: output scale, a finite number (may be traced).
        b: input scale, a finite number (may be traced).
        c: constant output shift, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``a``, ``b`` or ``c`` is not a number.
        ValueError: if a concrete one of them is not finite.
    """
    a, b, shift = (_act_param(v, n, "Erf") for v, n in ((a, "a"), (b, "b"), (c, "c")))

    def fn(x):
        return a * jax.scipy.special.erf(b * x) + shift

    def moments(cov, v1, v2, want_dot):
        b2 = b * b
        prod = (1 + 2 * b2 * v1) * (1 + 2 * b2 * v2)
        det = jnp.maximum(prod - 4 * (b2 * cov) ** 2, 0.0)
        val = a * a * (2 / math.pi) * _atan2(2 * b2 * cov, jnp.sqrt(det), x_nonnegative=True) + shift * shift
        # rsqrt(det) rather than 1 / sqrt(det): a square root with two consumers would be its own
        # XLA fusion (and array), while each of these fuses into its single consumer.
        dot = a * a * b2 * (4 / math.pi) * lax.rsqrt(det) if want_dot else None
        return val, dot

    def diag(v):
        # (1 + 2 b^2 v)^2 - 4 b^4 v^2 = 1 + 4 b^2 v. One value per point: the library atan2 is fast
        # enough here, and cheaper to compile than `_atan2`.
        b2v = b * b * v
        return a * a * (2 / math.pi) * jnp.arctan2(2 * b2v, jnp.sqrt(1 + 4 * b2v)) + shift * shift

    def mean(v):
        return jnp.full_like(v, shift)

    return _activation(f"Erf({_fmt(a)}, {_fmt(b)}, {_fmt(shift)})", fn, moments, diag, mean=mean)


def Sigmoid_like() -> Layer:
    """phi(x) = erf(x / 2.4020563531719796) / 2 + 1/2, an erf fitted to the logistic sigmoid on [-5, 5].

    The constant minimises the squared difference to 1 / (1 + e^-x) on [-5, 5] (neural-tangents' choice);
    the kernel is that of `Erf` with a = 1/2, b = 1 / 2.4020563531719796, c = 1/2.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` named "Sigmoid_like"; it must follow an affine layer.
    """
    layer = Erf(a=0.5, b=1 / 2.4020563531719796, c=0.5)
    layer.name = "Sigmoid_like"
    return layer


def Gelu(approximate: bool = False) -> Layer:
    """phi(x) = x Phi(x) (Tsuchida et al. 2021 give the NNGP).

    With P = (1 + v1)(1 + v2), D^2 = P - c^2, A = arctan(c / D):
    E[phi phi] = c/4 + [c A + (c^2 + v1 v2 D^2) / (P D)] / (2 pi),
    E[phi' phi'] = 1/4 + A / (2 pi) + c (1/D^2 + (1 - v1 v2)/P + 1) / (2 pi D).
    ``approximate`` only changes the finite network (tanh approximation).

    Args:
        approximate: if true, ``apply_fn`` uses the tanh approximation of GELU; the kernel is always the exact one.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.
    """

    def fn(x):
        return jax.nn.gelu(x, approximate=approximate)

    def moments(c, v1, v2, want_dot):
        prod_plus = (1 + v1) * (1 + v2)
        prod = v1 * v2
        d2 = prod_plus - c * c
        d = _safe_sqrt(d2)
        angle = _atan2(c, d, x_nonnegative=True)
        val = 0.25 * c + (c * angle + (c * c + prod * d2) / (prod_plus * d)) / (2 * math.pi)
        dot = None
        if want_dot:
            dot = 0.25 + angle / (2 * math.pi) + c * (1 / d2 + (1 - prod) / prod_plus + 1) / (2 * math.pi * d)
        return val, dot

    def mean(v):  # E[u Phi(u)] = v E[phi_N(u)] (Stein) = v / sqrt(2 pi (1 + v))
        return v / jnp.sqrt(2 * math.pi * (1 + v))

    return _activation("Gelu", fn, moments, remask=False, mean=mean)


def Sin(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """phi(x) = a sin(b x + c).

    E[phi phi] = a^2/2 [e^{-b^2 (v1 + v2 - 2c)/2} - e^{-b^2 (v1 + v2 + 2c)/2} cos 2c_phase].

    (In this formula ``c`` is the cross covariance and ``c_phase`` the argument ``c``.)

    Args:
        a: output scale, a finite number (may be traced).
        b: frequency, a finite number (may be traced).
        c: phase, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``a``, ``b`` or ``c`` is not a number.
        ValueError: if a concrete one of them is not finite.
    """
    a, b, phase = (_act_param(v, n, "Sin") for v, n in ((a, "a"), (b, "b"), (c, "c")))
    cos_2phase = jnp.cos(2 * phase) if isinstance(phase, jax.core.Tracer) else math.cos(2 * phase)

    def fn(x):
        return a * jnp.sin(b * x + phase)

    def moments(cov, v1, v2, want_dot):
        half = -0.5 * (v1 + v2)
        s1 = jnp.exp(b * b * (half + cov))
        s2 = jnp.exp(b * b * (half - cov)) * cos_2phase
        val = 0.5 * a * a * (s1 - s2)
        dot = 0.5 * a * a * b * b * (s1 + s2) if want_dot else None
        return val, dot

    def mean(v):  # E[sin(b u + c)] = sin(c) exp(-b^2 v / 2)
        return a * jnp.sin(phase) * jnp.exp(-b * b * v / 2)

    return _activation(f"Sin({_fmt(a)}, {_fmt(b)}, {_fmt(phase)})", fn, moments, mean=mean)


def Cos(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """phi(x) = a cos(b x + c) = a sin(b x + c + pi/2): `Sin` with the phase moved by pi/2.

    E[phi phi] = a^2/2 [e^{-b^2 (v1 + v2 - 2 cov)/2} + e^{-b^2 (v1 + v2 + 2 cov)/2} cos 2c],
    E[phi' phi'] = a^2 b^2 / 2 [e^{-b^2 (v1 + v2 - 2 cov)/2} - e^{-b^2 (v1 + v2 + 2 cov)/2} cos 2c].

    Args:
        a: output scale, a finite number (may be traced).
        b: frequency, a finite number (may be traced).
        c: phase, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``a``, ``b`` or ``c`` is not a number.
        ValueError: if a concrete one of them is not finite.
    """
    phase = _act_param(c, "c", "Cos")
    layer = Sin(_act_param(a, "a", "Cos"), _act_param(b, "b", "Cos"), phase + math.pi / 2)
    layer.name = f"Cos({_fmt(a)}, {_fmt(b)}, {_fmt(phase)})"
    return layer


def Rbf(gamma: float = 1.0) -> Layer:
    """The activation whose NNGP is the squared-exponential kernel of its pre-activations.

    phi(x) = sqrt(2) sin(sqrt(2 gamma) x + pi/4) (`Sin` with a = sqrt(2), b = sqrt(2 gamma), c = pi/4, for
    which the cos 2c term vanishes), so that
    E[phi phi] = exp(-gamma (v1 + v2 - 2 cov)) = exp(-gamma E(u - v)^2), E[phi' phi'] = 2 gamma E[phi phi].
    After ``Dense(W_std=1, b_std=0)`` on inputs of dimension d this is exp(-gamma |x - x'|^2 / d).

    Args:
        gamma: inverse squared length scale, gamma = 1 / (2 l^2); a non-negative number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``gamma`` is not a number.
        ValueError: if a concrete ``gamma`` is negative or not finite.
    """
    gamma = _act_param(gamma, "gamma", "Rbf")
    if not isinstance(gamma, jax.core.Tracer) and gamma < 0:
        raise ValueError(f"Rbf: gamma must be non-negative, got {gamma}")

    def fn(x):
        return math.sqrt(2) * jnp.sin(jnp.sqrt(2 * gamma) * x + math.pi / 4)

    def moments(cov, v1, v2, want_dot):
        val = jnp.exp(gamma * (2 * cov - v1 - v2))
        return val, (2 * gamma * val if want_dot else None)

    def diag(v):
        return jnp.ones_like(v)

    def mean(v):  # sqrt(2) sin(pi / 4) exp(-2 gamma v / 2)
        return jnp.exp(-gamma * v)

    return _activation(f"Rbf({_fmt(gamma)})", fn, moments, diag, mean=mean)


def Exp(a: float = 1.0, b: float = 1.0) -> Layer:
    """phi(x) = a exp(b x).

    E[phi phi] = a^2 E[e^{b(u + v)}] = a^2 exp(b^2 (v1 + v2 + 2 cov) / 2) (the Gaussian moment generating
    function), E[phi' phi'] = b^2 E[phi phi].

    Args:
        a: output scale, a finite number (may be traced).
        b: input scale, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``a`` or ``b`` is not a number.
        ValueError: if a concrete ``a`` or ``b`` is not finite.
    """
    a, b = _act_param(a, "a", "Exp"), _act_param(b, "b", "Exp")

    def fn(x):
        return a * jnp.exp(b * x)

    def moments(cov, v1, v2, want_dot):
        val = a * a * jnp.exp(b * b * ((v1 + v2) / 2 + cov))
        return val, (b * b * val if want_dot else None)

    def diag(v):
        return a * a * jnp.exp(2 * b * b * v)

    def mean(v):  # the moment generating function at b
        return a * jnp.exp(b * b * v / 2)

    return _activation(f"Exp({_fmt(a)}, {_fmt(b)})", fn, moments, diag, mean=mean)


def Gabor() -> Layer:
    """phi(x) = exp(-x^2) sin(x).

    With s = v1 + v2, Delta = 4 (v1 v2 - cov^2) and D = det(I + 2 Sigma) = 1 + 2 s + Delta, writing
    sin u sin v = [cos(u - v) - cos(u + v)] / 2 and using E[e^{-|z|^2 + i w.z}] = D^{-1/2}
    exp(-w' Sigma (I + 2 Sigma)^{-1} w / 2) with w = (1, -+1):
    E[phi phi] = exp(-(s + Delta) / (2D)) sinh(cov / D) / sqrt(D);
    E[phi' phi'] = d E[phi phi] / d cov (Price's theorem)
                 = exp(-(s + Delta) / (2D)) D^{-5/2} [(D + 8 cov^2) cosh(cov / D) + 4 cov (1 + s + D) sinh(cov / D)].
    On the diagonal (u = v, variance v): (1 - exp(-2v / (1 + 4v))) / (2 sqrt(1 + 4v)).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.
    """

    def fn(x):
        return jnp.exp(-x * x) * jnp.sin(x)

    def moments(cov, v1, v2, want_dot):
        s = v1 + v2
        delta = 4 * (v1 * v2 - cov * cov)
        d = 1 + 2 * s + delta
        r = cov / d
        env = jnp.exp(-(s + delta) / (2 * d))
        val = env * jnp.sinh(r) * lax.rsqrt(d)
        dot = None
        if want_dot:
            dot = env * (d + 8 * cov * cov) * jnp.cosh(r) + env * 4 * cov * (1 + s + d) * jnp.sinh(r)
            dot = dot * lax.rsqrt(d) / (d * d)
        return val, dot

    def diag(v):
        d = 1 + 4 * v
        return -jnp.expm1(-2 * v / d) / (2 * jnp.sqrt(d))

    return _activation("Gabor", fn, moments, diag, remask=False, mean=jnp.zeros_like)  # an odd function


def Gaussian(a: float = 1.0, b: float = -1.0) -> Layer:
    """phi(x) = a exp(b x^2).

    E[phi phi] = a^2 / sqrt((1 - 2b v1)(1 - 2b v2) - 4 b^2 c^2); the derivative
    kernel is a^2 4 b^2 c / det^{3/2}.

    Args:
        a: output scale, a finite number (may be traced).
        b: exponent coefficient, a finite number (may be traced); the default -1 gives a bump. A positive ``b``
            makes the moments finite only while ``det > 0``.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine layer.

    Raises:
        TypeError: if ``a`` or ``b`` is not a number.
        ValueError: if a concrete ``a`` or ``b`` is not finite.
    """
    a, b = _act_param(a, "a", "Gaussian"), _act_param(b, "b", "Gaussian")

    def fn(x):
        return a * jnp.exp(b * x * x)

    def moments(c, v1, v2, want_dot):
        det = (1 - 2 * b * v1) * (1 - 2 * b * v2) - 4 * b * b * c * c
        root = _safe_sqrt(det)
        val = a * a / root
        dot = a * a * 4 * b * b * c / root**3 if want_dot else None
        return val, dot

    def mean(v):
        return a * lax.rsqrt(1 - 2 * b * v)

    return _activation(f"Gaussian({_fmt(a)}, {_fmt(b)})", fn, moments, mean=mean)


@functools.lru_cache(maxsize=64)
def legendre_rule(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-1, 1] (cached: NumPy's rule costs O(n^2), 0.1-1 s at 1,024 nodes,
    and the quadrature functions are called once per layer and kernel entry kind)."""
    nodes, weights = np.polynomial.legendre.leggauss(int(n))
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


@functools.lru_cache(maxsize=64)
def hermite_rule(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Hermite nodes and weights (weight exp(-x^2)), cached as `legendre_rule`."""
    nodes, weights = np.polynomial.hermite.hermgauss(int(n))
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


def gauss_hermite_2d(f1: Callable, f2: Callable, c, v1, v2, deg: int):
    """E[f1(u) f2(v)] for (u, v) centred Gaussian with variances ``v1``, ``v2`` and covariance ``c``, by
    ``deg``-point Gauss-Hermite quadrature in each dimension (arrays broadcast together).

    (u, v) = (sqrt(2 v1) x, c sqrt(2 / v1) x + sqrt(2 (v2 - c^2 / v1)) y), x and y the Hermite nodes (the
    Cholesky factor of the 2x2 covariance); memory grows as (entries x deg), one outer node at a time.
    """
    nodes, weights = hermite_rule(deg)
    dtype = jnp.result_type(c, v1, v2)
    x = jnp.asarray(nodes, dtype)
    w = jnp.asarray(weights, dtype)
    c, v1, v2 = jnp.broadcast_arrays(c, v1, v2)
    safe_v1 = jnp.maximum(v1, jnp.finfo(dtype).tiny)
    scale_u = jnp.sqrt(2 * v1)
    slope = c * jnp.sqrt(2 / safe_v1)
    rest = _safe_sqrt(2 * (v2 - c * c / safe_v1))[..., None]

    def body(acc, node):
        xi, wi = node
        inner = f2((slope * xi)[..., None] + rest * lead(x, rest.ndim)) @ w
        return acc + wi * f1(scale_u * xi) * inner, None

    total, _ = lax.scan(body, jnp.zeros(c.shape, dtype), (x, w))
    return total / math.pi


def gauss_polar_2d(f1: Callable, f2: Callable, c, v1, v2, n_theta: int = 16, n_r: int = 48, r_max: float = 9.5):
    """E[f1(u) f2(v)] for (u, v) centred Gaussian with variances ``v1``, ``v2`` and covariance ``c``, in polar
    coordinates with the angle split where u = 0 or v = 0 (arrays broadcast together).

    With (u, v) = (s1 r cos t, s2 r (rho cos t + sqrt(1 - rho^2) sin t)) the expectation is
    (1 / 2 pi) int dt int_0^inf r exp(-r^2 / 2) f1(u) f2(v) dr. Along a ray the signs of u and v are fixed, so
    activations whose kinks and jumps sit at 0 (ReLU, |u|, sign, and chains of them with smooth functions) are
    smooth in r, and the angular integrand is smooth between the four angles where u or v changes sign: Gauss-Legendre
    with ``n_theta`` nodes on each of the four arcs and ``n_r`` nodes on [0, ``r_max``] (the tail beyond is
    exp(-r_max^2 / 2) ~ 2e-20) converge spectrally there, where Gauss-Hermite in (u, v) converges algebraically
    across a kink (1e-3 at 64 nodes for erf(relu(u))). Memory grows as (entries x n_r), one angle at a time.
    """
    dtype = jnp.result_type(c, v1, v2)
    c, v1, v2 = jnp.broadcast_arrays(c, v1, v2)
    s1, s2 = jnp.sqrt(jnp.maximum(v1, 0)), jnp.sqrt(jnp.maximum(v2, 0))
    denom = s1 * s2
    rho = jnp.clip(jnp.where(denom > 0, c / jnp.where(denom > 0, denom, 1.0), 0.0), -1.0, 1.0)
    comp = jnp.sqrt(jnp.maximum(1 - rho * rho, 0.0))
    # the angles in [0, 2 pi) where u = 0 (pi / 2, 3 pi / 2) and where v = 0 (atan2(-rho, comp) and that + pi)
    t_v = jnp.mod(jnp.arctan2(-rho, comp), math.pi)
    breaks = jnp.sort(jnp.stack([jnp.full_like(rho, math.pi / 2), jnp.full_like(rho, 1.5 * math.pi), t_v,
                                 t_v + math.pi], axis=-1), axis=-1)
    ends = jnp.concatenate([breaks, breaks[..., :1] + 2 * math.pi], axis=-1)  # four arcs covering the circle
    tn, tw = legendre_rule(n_theta)
    rn, rw = legendre_rule(n_r)
    r = jnp.asarray((rn + 1) * (r_max / 2), dtype)
    r_weight = jnp.asarray(rw * (r_max / 2), dtype) * r * jnp.exp(-r * r / 2)
    nodes = [(a, jnp.asarray(t, dtype), jnp.asarray(w, dtype)) for a in range(4) for t, w in zip(tn, tw)]
    arcs = jnp.asarray([a for a, _, _ in nodes])
    ts = jnp.stack([t for _, t, _ in nodes])
    ws = jnp.stack([w for _, _, w in nodes])

    def body(acc, node):
        arc, t, w = node
        lo, hi = ends[..., arc], ends[..., arc + 1]
        half = (hi - lo) / 2
        theta = lo + half * (t + 1)
        cu, cv = jnp.cos(theta), rho * jnp.cos(theta) + comp * jnp.sin(theta)
        u = (s1 * cu)[..., None] * lead(r, c.ndim + 1)
        v = (s2 * cv)[..., None] * lead(r, c.ndim + 1)
        return acc + (w * half) * ((f1(u) * f2(v)) @ r_weight), None

    total, _ = lax.scan(body, jnp.zeros(c.shape, dtype), (arcs, ts, ws))
    return total / (2 * math.pi)


def gauss_split_1d(f: Callable, v, n: int = 48, r_max: float = 9.5):
    """E[f(u)] for u ~ N(0, v) as int_0^inf [f(s z) + f(-s z)] phi(z) dz, Gauss-Legendre with ``n`` nodes on
    [0, ``r_max``]: spectral for functions smooth on each side of 0 (a kink or jump at 0, as `gauss_polar_2d`)."""
    zn, zw = legendre_rule(n)
    w_np = zw * (r_max / 2) * np.exp(-((zn + 1) * (r_max / 2)) ** 2 / 2) / math.sqrt(2 * math.pi)
    z_np = (zn + 1) * (r_max / 2)
    scale = jnp.sqrt(jnp.maximum(v, 0))[..., None]
    chunk = 64  # nodes per pass: memory grows as (points x chunk), not (points x n)
    if n <= chunk:
        s = scale * lead(jnp.asarray(z_np, v.dtype), v.ndim + 1)
        return (f(s) + f(-s)) @ jnp.asarray(w_np, v.dtype)
    pad = -n % chunk  # padded nodes carry zero weight
    z = jnp.asarray(np.concatenate([z_np, np.zeros(pad)]).reshape(-1, chunk), v.dtype)
    w = jnp.asarray(np.concatenate([w_np, np.zeros(pad)]).reshape(-1, chunk), v.dtype)

    def body(acc, zw_chunk):
        zc, wc = zw_chunk
        s = scale * lead(zc, v.ndim + 1)
        return acc + (f(s) + f(-s)) @ wc, None

    total, _ = lax.scan(body, jnp.zeros(v.shape, v.dtype), (z, w))
    return total


def gauss_hermite_1d(f: Callable, v, deg: int):
    """E[f(u)] for u ~ N(0, v) by ``deg``-point Gauss-Hermite quadrature (v an array)."""
    nodes, weights = hermite_rule(deg)
    x = jnp.asarray(nodes, v.dtype)
    w = jnp.asarray(weights, v.dtype)
    s = jnp.sqrt(2 * jnp.maximum(v, 0))[..., None]
    return (f(s * lead(x, s.ndim)) @ w) / math.sqrt(math.pi)


def ElementwiseNumerical(fn: Callable, deg: int, df: Callable | None = None) -> Layer:
    """Any elementwise phi by ``deg``-point Gauss-Hermite quadrature in two dimensions.

    (u, v) = (sqrt(2 v1) x, c sqrt(2 / v1) x + sqrt(2 (v2 - c^2 / v1)) y) with
    x, y the Hermite nodes (the Cholesky factor of the 2x2 covariance); the
    NTK uses phi' from `jax.grad` unless ``df`` is given. Cost and memory grow
    as deg^2 per kernel entry.

    Args:
        fn: the activation phi, a callable on JAX arrays applied elementwise.
        deg: number of Gauss-Hermite nodes per dimension (a positive int).
        df: derivative phi' for the NTK, elementwise; ``None`` uses ``jax.grad(fn)``, vectorised.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine
        layer. Its kernel is not exactly symmetric under swapping ``x1`` and ``x2`` (the quadrature rule is not).

    Raises:
        ValueError: if ``deg`` is not a positive integer.
        TypeError: if ``fn`` is not callable.
    """
    if not isinstance(deg, (int, np.integer)) or deg < 1:
        raise ValueError(f"ElementwiseNumerical: deg must be a positive integer, got {deg!r}")
    if not callable(fn):
        raise TypeError(f"ElementwiseNumerical: fn must be callable, got {type(fn).__name__}")
    dfn = df if df is not None else jnp.vectorize(jax.grad(fn))

    def moments(c, v1, v2, want_dot):
        val = gauss_hermite_2d(fn, fn, c, v1, v2, deg)
        dot = gauss_hermite_2d(dfn, dfn, c, v1, v2, deg) if want_dot else None
        return val, dot

    name = getattr(fn, "__name__", "fn")
    return _activation(f"ElementwiseNumerical({name}, deg={deg})", fn, moments, symmetric=False)


def ExpNormalized(gamma: float = 1, shift: float = -1, do_clip: bool = False) -> Layer:
    """The "Gaussian normalised kernel" map (Shankar et al. 2020, "Neural Kernels Without Tangents", p. 6).

    Not the kernel of an elementwise activation: with r = sqrt(max(v1 v2, 1e-30)) and rho = cov / r
    (clipped to [-1, 1] when ``do_clip``), the covariances become
    K' = r exp(gamma (rho + shift)),  and the NTK  NTK' = NTK gamma exp(gamma (rho + shift)) = NTK dK'/dcov.
    It is homogeneous of degree 1 in (cov, v1, v2), so the scale of the input kernel is kept.

    Args:
        gamma: exponent coefficient, a finite number (may be traced).
        shift: added to the normalised covariance before exponentiating, a finite number (may be traced).
        do_clip: clip the normalised covariance to [-1, 1] (rounding can push it slightly beyond).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` whose ``kernel_fn`` is the map above; it must follow an
        affine layer. It has no finite-width counterpart: ``apply_fn`` raises NotImplementedError.

    Raises:
        TypeError: if ``gamma`` or ``shift`` is not a number, or ``do_clip`` not a bool.
        ValueError: if a concrete ``gamma`` or ``shift`` is not finite.
    """
    gamma, shift = _act_param(gamma, "gamma", "ExpNormalized"), _act_param(shift, "shift", "ExpNormalized")
    clip = _check_flag(do_clip, "do_clip", "ExpNormalized")

    def fn(x):
        raise NotImplementedError("ExpNormalized: the layer is a kernel map with no finite-width network; "
                                  "apply_fn is not available")

    def moments(cov, v1, v2, want_dot):
        r = jnp.sqrt(jnp.maximum(v1 * v2, 1e-30))
        rho = cov / r
        if clip:
            rho = jnp.clip(rho, -1.0, 1.0)
        e = jnp.exp(gamma * (rho + shift))
        return r * e, (gamma * e if want_dot else None)

    return _activation(f"ExpNormalized({_fmt(gamma)}, {_fmt(shift)}, do_clip={clip})", fn, moments, mean=None)


def Elementwise(fn: Callable | None = None, nngp_fn: Callable | None = None,
                d_nngp_fn: Callable | None = None) -> Layer:
    """An activation from user-supplied closed forms of its two-dimensional Gaussian integrals.

    ``nngp_fn(cov, var1, var2) = E[fn(u) fn(v)]`` and ``d_nngp_fn(cov, var1, var2) = E[fn'(u) fn'(v)]`` for
    (u, v) ~ N(0, [[var1, cov], [cov, var2]]), both on scalars (they are vectorised here). The kernel maps are
    K' = nngp_fn(K, v1, v2) and NTK' = NTK d_nngp_fn(K, v1, v2). Without ``d_nngp_fn`` it is
    d nngp_fn / d cov by automatic differentiation (Price's theorem: E[fn' fn'] = dE[fn fn]/dcov); closed forms
    are more accurate, and autodiff of a ``jnp.where`` may give NaN. Without ``nngp_fn`` only the finite network
    exists (use `ElementwiseNumerical` for quadrature).

    Args:
        fn: the activation phi on arrays, elementwise; ``None`` makes ``apply_fn`` raise NotImplementedError.
        nngp_fn: ``(cov, var1, var2) -> E[phi(u) phi(v)]``; ``None`` makes ``kernel_fn`` raise
            NotImplementedError.
        d_nngp_fn: ``(cov, var1, var2) -> E[phi'(u) phi'(v)]``; ``None`` differentiates ``nngp_fn``.

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` named after ``fn`` (else ``nngp_fn``); it must
        follow an affine layer.

    Raises:
        ValueError: if neither ``fn`` nor ``nngp_fn`` is given.
        TypeError: if a given argument is not callable.
    """
    for arg, value in (("fn", fn), ("nngp_fn", nngp_fn), ("d_nngp_fn", d_nngp_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"Elementwise: {arg} must be callable or None, got {type(value).__name__}")
    if fn is None and nngp_fn is None:
        raise ValueError("Elementwise: neither fn (the finite network) nor nngp_fn (the kernel) was given, "
                         "the layer would do nothing")
    name = f"Elementwise({getattr(fn if fn is not None else nngp_fn, '__name__', 'fn')})"

    def apply(x):
        if fn is None:
            raise NotImplementedError(f"{name}: no fn was given, so the finite network (apply_fn) is undefined")
        return fn(x)

    if nngp_fn is not None:
        value_fn = jnp.vectorize(nngp_fn)
        dot_fn = jnp.vectorize(d_nngp_fn if d_nngp_fn is not None else jax.grad(nngp_fn))

    def moments(cov, v1, v2, want_dot):
        if nngp_fn is None:
            raise NotImplementedError(f"{name}: no nngp_fn was given, so the kernel is undefined; give nngp_fn "
                                      f"or use ElementwiseNumerical(fn, deg) for quadrature")
        val = value_fn(cov, v1, v2).astype(cov.dtype)
        return val, (dot_fn(cov, v1, v2).astype(cov.dtype) if want_dot else None)

    return _activation(name, apply, moments, mean="quadrature" if fn is not None else None)
