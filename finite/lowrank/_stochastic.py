"""What every layer spec and network shares: the cached ``jit`` entry points (one compiled program per spec,
prior, method and shapes for ``init`` / ``apply`` / ``kl`` / a network's run), the KL dispatch, the deterministic
initialisers (Glorot, He, orthogonal, uniform) and `_Stochastic`, the base of the dense layers and embeddings:
the checks of their fields on construction, ``init``, the key check of ``apply``, and ``kl`` / ``kl_at`` over
their mean-field factors.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from finite.lowrank._meanfield import DEFAULT_PRIOR, _check_prior, _kl_method, _mf_exact_kl, _mf_log_ratio
from finite.lowrank._pytrees import _FACTOR_FIELDS
from finite.lowrank._validation import _KL_METHODS, FAMILIES, _check_choice, _check_int, _check_range, _float_dtype


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
    """What dense layers and embeddings share: the checks of their fields on construction, ``init`` and the KL
    of their stochastic parameters (subclasses give ``_SIZES``, ``_where``, ``sample``, ``kind`` and the checks of
    their own fields, ``_check_names`` and ``_check_scales``)."""

    #: the two size fields that lead every spec (``("n_in", "n_out")``, ``("vocab", "dim")``)
    _SIZES = ()
    #: what a ``rank`` above the smaller size is told to pass, after the error
    _RANK_HINT = ""

    def __post_init__(self):
        where = self._where()
        for name in self._SIZES:
            _check_int(getattr(self, name), name, where)
        if self.kind == "lowrank":
            _check_int(self.rank, "rank", where)
            sizes = [getattr(self, name) for name in self._SIZES]
            if self.rank > min(sizes) and not self.overcomplete:
                raise ValueError(f"{where}: rank {self.rank} exceeds min({', '.join(self._SIZES)}) = {min(sizes)}"
                                 f"{self._RANK_HINT}")
        self._check_options(where)

    def _keyed_apply(self, params, x, key, noun: str):
        """``apply`` of a checked input ``x``: one cached ``jit`` per spec; a Bayesian kind needs a ``key``."""
        if key is None and self.kind != "deterministic":
            raise ValueError(f"{self._where()}: key must be a PRNG key for a Bayesian {noun}, got None")
        return _jit_apply(self, params, x, key)

    def _check_options(self, where: str):
        """The Bayesian kinds' fields after the sizes (and rank), in this order: ``family``, the kind's names
        (``_check_names``) and scales (``_check_scales``), then ``rho_range`` (stored as a float pair or None)."""
        _check_choice(self.family, FAMILIES, "family", where)
        self._check_names(where)
        self._check_scales(where)
        object.__setattr__(self, "rho_range", _check_range(self.rho_range, "rho_range", where))

    def _check_names(self, where: str):
        pass

    def _check_scales(self, where: str):
        pass

    def _factors(self, tree) -> list:
        """The mean-field factors of ``params`` (or their drawn values in ``weights``), bias excluded."""
        return [getattr(tree, name) for name in _FACTOR_FIELDS[self.kind]]

    def _log_ratio(self, params, weights, prior):
        """``log q(w) - log p(w)`` of the factors at the drawn ``weights`` (0 for the deterministic kind)."""
        if self.kind == "deterministic":
            return jnp.zeros((), params.W.dtype)
        return _mf_log_ratio(self._factors(params), self._factors(weights), prior, self.family)

    def _exact_kl(self, params, prior):
        """Closed-form KL of the factors to a Gaussian prior (0 for the deterministic kind)."""
        if self.kind == "deterministic":
            return jnp.zeros((), params.W.dtype)
        return _mf_exact_kl(self._factors(params), prior)

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
