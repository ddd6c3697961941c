"""Scale priors H on the last-layer variance sigma_v^2 (paper section 3, notes 1.2-1.4).

The scale mixture of NNGPs draws ``sigma_v^2 ~ H`` once per network and
``f | sigma_v^2 ~ GP(0, sigma_v^2 Kbar)``.  Priors are numpyro distributions
(``sample(key, shape)``, ``log_prob``) with positive support:

* :func:`InverseGamma` ``(a, b)``: density ``b^a / Gamma(a) x^{-(a+1)} e^{-b/x}``,
  conjugate, turning the NNGP into a Student-t process ``MVT(2a, 0, (b/a) Kbar)``;
* :class:`BurrXII` ``(c, k)``: density ``c k x^{c-1} (1 + x^c)^{-(k+1)}``, tail
  ``x^{-(ck+1)}``; numpyro has no Burr XII, so it is written here in numpyro's interface;
* :func:`Delta` ``(s)``: a point mass, i.e. the plain NNGP with ``sigma_v^2 = s``;
* any other numpyro distribution on the positive reals (``HalfCauchy``,
  ``LogNormal``, ``Gamma``, ...), accepted by :func:`as_prior`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import betaln
from numpyro.distributions import constraints
from numpyro.distributions.util import promote_shapes, validate_sample

__all__ = ["InverseGamma", "BurrXII", "Delta", "as_prior", "is_inverse_gamma", "is_delta", "inverse_gamma_params"]


def _check_positive(name, value, owner):
    if isinstance(value, jax.core.Tracer):
        return
    arr = jnp.asarray(value)
    if not bool(jnp.all(jnp.isfinite(arr))) or not bool(jnp.all(arr > 0)):
        raise ValueError(f"{owner}: {name} must be positive and finite, got {value}")


def InverseGamma(a, b) -> dist.InverseGamma:
    """Inverse gamma with shape ``a`` and scale ``b`` (numpyro's ``InverseGamma(concentration=a, rate=b)``).

    Args:
        a: shape parameter, positive and finite (may be traced, in which case it is not checked).
        b: scale parameter, positive and finite (may be traced).

    Returns:
        numpyro ``InverseGamma`` distribution with density ``b^a / Gamma(a) x^{-(a+1)} e^{-b/x}``.

    Raises:
        ValueError: if a concrete ``a`` or ``b`` is not positive and finite.
    """
    _check_positive("a", a, "InverseGamma")
    _check_positive("b", b, "InverseGamma")
    return dist.InverseGamma(a, b)


def Delta(s=1.0) -> dist.Delta:
    """Point mass at ``sigma_v^2 = s`` (the Gaussian NNGP).

    Args:
        s: location of the point mass, a positive and finite variance (default 1.0; may be traced).

    Returns:
        numpyro ``Delta`` distribution at ``s``, in the default floating dtype.

    Raises:
        ValueError: if a concrete ``s`` is not positive and finite.
    """
    _check_positive("s", s, "Delta")
    return dist.Delta(jnp.asarray(s, dtype=jnp.result_type(float)))


class BurrXII(dist.Distribution):
    """Burr type XII on ``(0, inf)``: ``f(x) = c k x^{c-1} (1 + x^c)^{-(k+1)}`` (scipy's ``burr12(c, d=k)``).

    Sampling is by inverse CDF, ``x = ((1 - u)^{-1/k} - 1)^{1/c}``, so it is
    reparameterised: gradients flow to ``c`` and ``k`` (used when the prior's
    parameters are fitted by marginal likelihood).

    Args:
        c: first shape parameter, positive and finite (default 1.0); may be an array, giving a batch of laws.
        k: second shape parameter, positive and finite (default 1.0); broadcast against ``c``.
        validate_args: numpyro's flag to check parameters and sample values against their constraints
            (``None``: numpyro's global default).

    Raises:
        ValueError: if a concrete ``c`` or ``k`` is not positive and finite.
    """

    arg_constraints = {"c": constraints.positive, "k": constraints.positive}
    support = constraints.positive
    reparametrized_params = ["c", "k"]

    def __init__(self, c=1.0, k=1.0, *, validate_args=None):
        _check_positive("c", c, "BurrXII")
        _check_positive("k", k, "BurrXII")
        self.c, self.k = promote_shapes(c, k)
        batch_shape = jax.lax.broadcast_shapes(jnp.shape(c), jnp.shape(k))
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        shape = sample_shape + self.batch_shape
        u = jax.random.uniform(key, shape, minval=jnp.finfo(jnp.result_type(float)).tiny, maxval=1.0)
        return self.icdf(u)

    @validate_sample
    def log_prob(self, value):
        value, c, k = promote_shapes(value, self.c, self.k)  # value may carry sample axes: align ranks explicitly
        return jnp.log(c) + jnp.log(k) + (c - 1) * jnp.log(value) - (k + 1) * jnp.log1p(value**c)

    def cdf(self, value):
        value, c, k = promote_shapes(value, self.c, self.k)
        return -jnp.expm1(-k * jnp.log1p(value**c))

    def icdf(self, q):
        # (1 - q)^{-1/k} - 1 = expm1(-log1p(-q) / k), accurate for small q.
        q, c, k = promote_shapes(q, self.c, self.k)
        return jnp.expm1(-jnp.log1p(-q) / k) ** (1.0 / c)

    @property
    def mean(self):
        c, k = self.c, self.k
        # E[X] = k B(k - 1/c, 1 + 1/c), finite when c k > 1.
        m = k * jnp.exp(betaln(k - 1.0 / c, 1.0 + 1.0 / c))
        return jnp.where(c * k > 1, m, jnp.inf)

    @property
    def variance(self):
        c, k = self.c, self.k
        m2 = k * jnp.exp(betaln(k - 2.0 / c, 1.0 + 2.0 / c))
        return jnp.where(c * k > 2, m2 - self.mean**2, jnp.inf)


def is_inverse_gamma(prior) -> bool:
    """Whether a scale prior is an inverse gamma (the conjugate case with a closed form).

    Args:
        prior: any object, usually a numpyro distribution.

    Returns:
        True if ``prior`` is a numpyro ``InverseGamma``, else False.
    """
    return isinstance(prior, dist.InverseGamma)


def is_delta(prior) -> bool:
    """Whether a scale prior is a point mass (the plain Gaussian NNGP).

    Args:
        prior: any object, usually a numpyro distribution.

    Returns:
        True if ``prior`` is a numpyro ``Delta``, else False.
    """
    return isinstance(prior, dist.Delta)


def inverse_gamma_params(prior):
    """``(a, b)`` of an inverse gamma prior (shape, scale).

    Args:
        prior: numpyro ``InverseGamma`` distribution, e.g. from :func:`InverseGamma`.

    Returns:
        Tuple ``(a, b)``: the concentration and rate of the underlying gamma law, i.e. the shape and scale of
        the inverse gamma.
    """
    return prior.base_dist.concentration, prior.base_dist.rate


def _positive_preserving(prior) -> bool:
    """A positive base law pushed through positive scalings / powers (e.g. ``s * BurrXII``) stays positive.

    numpyro reports such supports as the real line, so they are recognised here.
    """
    if not isinstance(prior, dist.TransformedDistribution):
        return False
    base = prior.base_dist.support
    if not (isinstance(base, constraints._GreaterThan) and not isinstance(base.lower_bound, jax.core.Tracer)
            and float(jnp.asarray(base.lower_bound)) >= 0):
        return False
    for t in prior.transforms:
        if isinstance(t, dist.transforms.AffineTransform):
            if isinstance(t.scale, jax.core.Tracer) or isinstance(t.loc, jax.core.Tracer):
                continue
            if not (float(jnp.asarray(t.loc)) >= 0 and float(jnp.asarray(t.scale)) > 0):
                return False
        elif not isinstance(t, dist.transforms.PowerTransform):
            return False
    return True


def as_prior(prior) -> dist.Distribution:
    """Validate a scale prior: a scalar numpyro distribution supported on the positive reals.

    ``None`` means ``Delta(1)`` (the NNGP with the kernel as given); a positive
    number ``s`` means ``Delta(s)``.

    Args:
        prior: ``None``, a positive Python number, or a scalar numpyro distribution whose support lies in
            ``[0, inf)`` (also a positive base law under positive affine or power transforms).

    Returns:
        The prior as a numpyro distribution: ``prior`` itself when it is a distribution, otherwise a ``Delta``.

    Raises:
        TypeError: if ``prior`` is neither ``None``, a number nor a numpyro distribution.
        ValueError: if the distribution is not scalar, is a point mass at a non-positive value, has support
            that is not on the positive reals, or (for a number) is not positive and finite.
    """
    if prior is None:
        return Delta(1.0)
    if isinstance(prior, (int, float)) and not isinstance(prior, bool):
        return Delta(prior)
    if not isinstance(prior, dist.Distribution):
        raise TypeError(
            f"prior must be a numpyro distribution on (0, inf) (e.g. smnngp.priors.InverseGamma(2, 2)), "
            f"got {type(prior).__name__}"
        )
    if prior.event_shape != () or prior.batch_shape != ():
        raise ValueError(
            f"prior must be a scalar distribution, got batch_shape {prior.batch_shape}, event_shape {prior.event_shape}"
        )
    if is_delta(prior):
        v = prior.v
        if not isinstance(v, jax.core.Tracer) and not float(v) > 0:
            raise ValueError(f"Delta prior must sit at a positive variance, got {float(v)}")
        return prior
    support = prior.support
    ok = _positive_preserving(prior)
    if ok:
        pass
    elif isinstance(support, (constraints._GreaterThan, constraints._GreaterThanEq)):
        lb = support.lower_bound
        ok = isinstance(lb, jax.core.Tracer) or float(jnp.asarray(lb)) >= 0.0
    elif isinstance(support, constraints._Interval):
        ok = float(jnp.asarray(support.lower_bound)) >= 0.0
    if not ok:
        raise ValueError(
            f"prior {type(prior).__name__} has support {support}; a variance prior needs support on (0, inf)"
        )
    return prior
