"""The posterior object: `VariationalPosterior` (the project's posterior interface over a model and its
parameters) and `as_posterior`, whose ``log_marginal_likelihood`` is the full-data ELBO evaluated in chunks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.variational._elbo import _check_x, _ell, kl_divergence, scale_posterior
from smnngp.variational._model import Model, Params, _positive_int
from smnngp.variational._predict import predict, predict_f, sample_f

__all__ = ["VariationalPosterior", "as_posterior"]


@jax.tree_util.register_pytree_node_class
class VariationalPosterior:
    """An SVGP / SVTP posterior with the project's posterior interface; an immutable pytree (``model`` static).

    ``log_marginal_likelihood`` is the ELBO on the training data (a lower bound on ``log p(y)``; a Monte-Carlo
    estimate for Softmax and the non-Gaussian SVTP), NaN when the posterior was made without data.

    Args:
        model: the :class:`Model` (static pytree data).
        params: its :class:`Params`.
        log_marginal_likelihood: the full-data ELBO, or NaN (default).
    """

    __slots__ = ("model", "params", "log_marginal_likelihood")

    def __init__(self, model: Model, params: Params, log_marginal_likelihood=math.nan):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "log_marginal_likelihood", log_marginal_likelihood)

    def __setattr__(self, name, value):
        raise AttributeError("VariationalPosterior is immutable (use replace)")

    def tree_flatten(self):
        return (self.params, self.log_marginal_likelihood), (self.model,)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux[0], *children)

    def replace(self, **changes) -> VariationalPosterior:
        fields = {s: getattr(self, s) for s in self.__slots__}
        fields.update(changes)
        return VariationalPosterior(**fields)

    def __repr__(self):
        return (f"VariationalPosterior({self.model.kind}, {self.model.likelihood!r}, M={self.model.num_inducing}, "
                f"C={self.model.num_latent}, log_marginal_likelihood={self.log_marginal_likelihood})")

    @property
    def scale_posterior(self):
        return scale_posterior(self.model, self.params)

    def predict(self, x, *, key=None, num_samples: int = 1000, noisy: bool = True):
        """See :func:`predict`."""
        return predict(self.model, self.params, x, key, num_samples, noisy=noisy)

    def predict_f(self, x):
        """See :func:`predict_f`."""
        return predict_f(self.model, self.params, x)

    def sample_f(self, key, x, num_samples: int = 1):
        """See :func:`sample_f`."""
        return sample_f(self.model, self.params, key, x, num_samples)


def _ell_sum_masked(model, params, x, y, key, mask):
    return jnp.sum(mask * _ell(model, params, x, y, key))


_ell_sum_jit = jax.jit(_ell_sum_masked, static_argnums=0)
_kl_jit = jax.jit(kl_divergence, static_argnums=0)


def _full_elbo(model, params, x, y, key, chunk):
    """ELBO on the whole data set, evaluated in chunks of ``chunk`` points (the last one padded and masked)."""
    N = x.shape[0]
    chunk = min(chunk, N)
    total = 0.0
    for j, start in enumerate(range(0, N, chunk)):
        idx = np.arange(start, start + chunk)
        mask = (idx < N).astype(model.dtype)
        idx = np.where(idx < N, idx, 0)
        k = None if key is None else jax.random.fold_in(key, j)
        total = total + _ell_sum_jit(model, params, x[idx], y[idx], k, jnp.asarray(mask))
    return total - _kl_jit(model, params)


def as_posterior(model: Model, params: Params, x=None, y=None, *, key=None, chunk: int = 1024) -> VariationalPosterior:
    """A :class:`VariationalPosterior`; with training data ``(x, y)`` its ``log_marginal_likelihood`` is the
    full-data ELBO (Monte-Carlo for Softmax / SVTP classification: ``key`` defaults to ``PRNGKey(0)``).

    Args:
        model: the :class:`Model`.
        params: its :class:`Params`.
        x: training inputs (N, ...), or ``None``.
        y: training targets, or ``None`` (pass both or neither).
        key: JAX PRNG key for the Monte-Carlo ELBO (``None``: ``PRNGKey(0)``).
        chunk: number of points per evaluation of the full-data ELBO (a positive int; bounds memory).

    Returns:
        :class:`VariationalPosterior` of ``(model, params)``, with ``log_marginal_likelihood`` the full-data ELBO
        when data are given, else NaN.

    Raises:
        ValueError: if only one of ``x`` and ``y`` is given, the data are invalid, or ``chunk`` is not a positive
            integer.
    """
    if x is None and y is None:
        return VariationalPosterior(model, params)
    if x is None or y is None:
        raise ValueError("pass both x and y (or neither)")
    x = _check_x(model, x)
    y = model.likelihood.check_targets(y, x.shape[0])
    if key is None:
        key = jax.random.PRNGKey(0)
    return VariationalPosterior(model, params, _full_elbo(model, params, x, y, key, _positive_int(chunk, "chunk")))
