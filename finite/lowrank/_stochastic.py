"""What every layer spec and network shares: the cached ``jit`` entry points (one compiled program per spec,
prior, method and shapes for ``init`` / ``apply`` / ``kl`` / a network's run), the KL dispatch, the deterministic
initialisers (Glorot, He, orthogonal, uniform) and `_Stochastic`, the ``init`` / ``kl`` / ``kl_at`` base of the
dense layers and embeddings.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from finite.lowrank._meanfield import DEFAULT_PRIOR, _check_prior, _kl_method
from finite.lowrank._validation import _KL_METHODS, _check_choice, _float_dtype


def _glorot_uniform(key, shape, dtype):
    lim = math.sqrt(6.0 / (shape[0] + shape[1]))
    return jax.random.uniform(key, shape, dtype, -lim, lim)


def _det_init(key, shape, dtype, init: str):
    if init == "glorot":
        return _glorot_uniform(key, shape, dtype)
    if init == "he":
        return jax.random.normal(key, shape, dtype) * math.sqrt(2.0 / shape[0])
    if init == "orthogonal":
        return jax.nn.initializers.orthogonal()(key, shape, dtype)
    return jax.random.uniform(key, shape, dtype, -0.05, 0.05)  # "uniform": Keras Embedding default


def _hashable(*objs) -> bool:
    try:
        for o in objs:
            hash(o)
    except TypeError:
        return False
    return True


# Public apply / kl calls go through one cached jit per (spec, prior, method, shapes): run op by op, every
# primitive would compile its own small XLA program. Inside an outer trace (fit, vmap) the jit is inlined.
@functools.partial(jax.jit, static_argnums=(0, 2))
def _jit_init(spec, key, dtype):
    return spec._init_impl(key, dtype)


@functools.partial(jax.jit, static_argnums=(0,))
def _jit_apply(spec, params, x, key):
    return spec._apply_impl(params, x, key)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _jit_kl(spec, params, key, prior, method):
    return spec._kl_impl(params, prior, key, method)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _jit_run(model, params, x, key, prior, method, extra):
    return model._run(params, x, key, prior, method, *extra)


@functools.partial(jax.jit, static_argnums=(0,))
def _jit_encode(model, params, tokens, key):
    return model._encode(params, tokens, key, None, "mc")[0]


def _as_array(x):
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else jnp.asarray(x)


def _dispatch_kl(spec, params, prior, key, method, where):
    prior = _check_prior(prior, where)
    _check_choice(method, _KL_METHODS, "method", where)
    if _hashable(prior):
        return _jit_kl(spec, params, key, prior, method)
    return spec._kl_impl(params, prior, key, method)


class _Stochastic:
    """What dense layers and embeddings share: ``init`` and the KL of their stochastic parameters (subclasses
    give ``_where``, ``sample``, ``_log_ratio``, ``_exact_kl`` and ``kind``)."""

    def init(self, key, dtype=jnp.float32):
        """Initial parameters (a NamedTuple / dict pytree) with floating ``dtype`` (default float32), drawn with
        ``key``; one jitted program per spec and dtype."""
        return _jit_init(self, key, _float_dtype(dtype))

    def kl(self, params, prior=DEFAULT_PRIOR, key=None, method: str = "auto"):
        """``KL(q || p)`` of the stochastic parameters (paper Eq. 1; for an embedding, of the whole table).

        ``method="mc"``: ``log q(w) - log p(w)`` at ``w = sample(params, key)`` (the draw ``apply`` uses with
        ``key``), unbiased; ``"exact"``: closed form for Gaussian factors and a :class:`GaussianPrior`;
        ``"auto"``: exact when available. Returns a scalar (0 for deterministic kinds).
        """
        where = self._where()
        _kl_method(method, _check_prior(prior, where), getattr(self, "family", "gaussian"), where)
        if key is None and _kl_method(method, prior, getattr(self, "family", "gaussian"), where) == "mc":
            raise ValueError(f"{where}: kl with method='mc' needs a PRNG key")
        return _dispatch_kl(self, params, prior, key, method, where)

    def _kl_impl(self, params, prior, key, method):
        where = self._where()
        method = _kl_method(method, prior, getattr(self, "family", "gaussian"), where)
        if method == "exact" or self.kind == "deterministic":
            return self._exact_kl(params, prior)
        if key is None:
            raise ValueError(f"{where}: kl with method='mc' needs a PRNG key")
        return self.kl_at(params, self.sample(params, key), prior)

    def kl_at(self, params, weights, prior=DEFAULT_PRIOR):
        """Single-sample Monte-Carlo KL ``log q(weights) - log p(weights)`` at given drawn ``weights`` (for an
        embedding, a full-table draw)."""
        return self._log_ratio(params, weights, prior)
