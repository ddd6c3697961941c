"""Networks of layer specs: `_Network` (``apply``, ``kl``, ``apply_and_kl`` with one shared draw, ``predict``,
``num_params``), the multilayer perceptron `MLP` and its builder `mlp`, the helpers the builders share
(activations by name, per-layer options) and `predict`, the Monte-Carlo predictive samples of any network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from finite.lowrank._dense import _DENSE, DeterministicDense, dense
from finite.lowrank._meanfield import DEFAULT_PRIOR, _check_prior, _draw_specs, _flat_log_ratio, _kl_method
from finite.lowrank._stochastic import _as_array, _dispatch_kl, _hashable, _jit_init, _jit_run
from finite.lowrank._validation import _KL_METHODS, KINDS, _check_choice, _check_int, _check_last_dim, _float_dtype

__all__ = ["MLP", "mlp", "predict"]


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid,
    "elu": jax.nn.elu,
    "softplus": jax.nn.softplus,
    "identity": lambda x: x,
}


def _activation(activation, where: str):
    if callable(activation):
        return activation
    if isinstance(activation, str) and activation in _ACTIVATIONS:
        return _ACTIVATIONS[activation]
    raise ValueError(f"{where}: activation must be a callable or one of {tuple(_ACTIVATIONS)}, got {activation!r}")


class _Network:
    """Shared methods of the networks: ``apply``, ``kl``, ``apply_and_kl``, ``predict``, ``num_params``.

    A network draws the noise of all its layers (but an embedding's rows) from one uniform draw with its key
    (``sample``); ``apply`` and the Monte-Carlo ``kl`` with the same key use the same draw.
    """

    def init(self, key, dtype=jnp.float32):
        """Initial parameters (a NamedTuple / dict pytree) with floating ``dtype`` (default float32), drawn with
        ``key``; one jitted program per spec and dtype."""
        return _jit_init(self, key, _float_dtype(dtype))

    def apply(self, params, x, key=None):
        """Network output at one weight draw (``key``), shared across the batch."""
        return _jit_run(self, params, _as_array(x), key, None, "mc", ())[0]

    def kl(self, params, prior=DEFAULT_PRIOR, key=None, method: str = "auto"):
        """``sum`` of the layers' ``KL(q || p)`` (same draw as ``apply`` with ``key`` when Monte Carlo)."""
        where = type(self).__name__
        prior = _check_prior(prior, where)
        _check_choice(method, _KL_METHODS, "method", where)
        for spec in self._specs():  # validate the method against every layer before tracing
            _kl_method(method, prior, getattr(spec, "family", "gaussian"), f"{where}.kl")
        if key is None and any(s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"),
                                                                         where) == "mc" for s in self._specs()):
            raise ValueError(f"{where}.kl: key must be a PRNG key for a Monte-Carlo KL, got None")
        return _dispatch_kl(self, params, prior, key, method, where)

    def _kl_impl(self, params, prior, key, method):
        return self._run_kl(params, key, prior, method)

    @staticmethod
    def _kl_from(specs, plist, flat, prior, method):
        """KL of dense specs drawn together (``flat``): the Monte-Carlo ones in one vectorised sum, the rest in
        closed form."""
        if prior is None:
            return 0.0
        mc = [s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"), "kl") == "mc"
              for s in specs]
        total = 0.0
        for s, p, m in zip(specs, plist, mc):
            if s.kind != "deterministic" and not m:
                total = total + s._exact_kl(p, prior)
        if any(mc) and flat is not None:
            noisy = [m for s, m in zip(specs, mc) if s.noise_size]
            include = None if all(noisy) else [m for m, c in zip(mc, flat.counts) for _ in range(c)]
            total = total + _flat_log_ratio(flat, prior, include)
        return total

    def apply_and_kl(self, params, x, key, prior=DEFAULT_PRIOR, method: str = "auto"):
        """``(apply(params, x, key), kl(params, prior, key, method))`` with one shared draw."""
        prior = _check_prior(prior, type(self).__name__)
        _check_choice(method, _KL_METHODS, "method", type(self).__name__)
        x = _as_array(x)
        if _hashable(prior):
            return _jit_run(self, params, x, key, prior, method, ())
        return self._run(params, x, key, prior, method)

    def predict(self, params, x, key, num_samples: int = 50, batch_size: int | None = None):
        """``S`` Monte-Carlo outputs stacked along a new leading axis (:func:`predict`)."""
        return predict(self, params, x, key, num_samples, batch_size=batch_size)

    def num_params(self) -> int:
        """Closed-form number of scalars in ``init``'s pytree (sum over the layers)."""
        return sum(s.num_params() for s in self._specs()) + self._extra_params()

    def _extra_params(self) -> int:
        return 0

    def _need_key(self, key, where: str):
        if key is None and any(s.kind != "deterministic" for s in self._specs()):
            raise ValueError(f"{where}: key must be a PRNG key for a network with Bayesian layers, got None")

    def _run_kl(self, params, key, prior, method):
        specs, plist = self._dense_specs(), self._dense_params(params)
        need = any(s.kind != "deterministic" and _kl_method(method, prior, getattr(s, "family", "gaussian"),
                                                            "kl") == "mc" for s in specs)
        flat = _draw_specs(specs, plist, self._dense_key(key), with_flat=True)[1] if need else None
        return jnp.asarray(self._kl_from(specs, plist, flat, prior, method)) + self._extra_kl(params, key, prior,
                                                                                               method)

    def _dense_specs(self):
        return self._specs()

    def _dense_params(self, params):
        return self._param_list(params)

    def _dense_key(self, key):
        return key

    def _extra_kl(self, params, key, prior, method):
        return 0.0


@dataclasses.dataclass(frozen=True)
class MLP(_Network):
    """A multilayer perceptron of dense layer specs (any of the four kinds, mixed freely), ``activation`` after
    every layer but the last (paper Sec. 2.4). Build with :func:`mlp`. ``params`` is a tuple of layer params
    (layer ``i`` initialised with ``fold_in(key, i)``); one draw of all layers comes from one uniform draw."""

    layers: tuple
    activation: Callable = jax.nn.relu

    def __post_init__(self):
        if len(self.layers) < 1:
            raise ValueError("MLP: layers must hold at least one dense layer")
        for i, (a, b) in enumerate(zip(self.layers[:-1], self.layers[1:])):
            if a.n_out != b.n_in:
                raise ValueError(f"MLP: layer {i} outputs {a.n_out} features but layer {i + 1} takes {b.n_in}")

    @property
    def in_dim(self) -> int:
        return self.layers[0].n_in

    @property
    def out_dim(self) -> int:
        return self.layers[-1].n_out

    @property
    def kinds(self) -> tuple:
        return tuple(s.kind for s in self.layers)

    def _specs(self):
        return self.layers

    def _param_list(self, params):
        return params

    def _init_impl(self, key, dtype=jnp.float32):
        """A tuple of layer params (``fold_in(key, i)`` for layer ``i``)."""
        return tuple(s.init(jax.random.fold_in(key, i), dtype) for i, s in enumerate(self.layers))

    def sample(self, params, key):
        """A tuple of drawn layer weights (one weight sample of the whole network, one uniform draw)."""
        return tuple(_draw_specs(self.layers, params, key))

    def _weight_list(self, weights):
        return list(weights)

    def forward(self, weights, x):
        """The network at drawn ``weights``."""
        h = x
        for i, (s, w) in enumerate(zip(self.layers, weights)):
            h = s.forward(w, h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h

    def _run(self, params, x, key, prior, method):
        _check_last_dim(x, self.in_dim, "MLP.apply")
        self._need_key(key, "MLP.apply")
        if len(params) != len(self.layers):
            raise ValueError(f"MLP: params hold {len(params)} layers, the network has {len(self.layers)}")
        weights, flat = _draw_specs(self.layers, params, key, with_flat=True)
        out = self.forward(weights, x)
        return out, jnp.asarray(self._kl_from(self.layers, params, flat, prior, method), out.dtype)

    def from_deterministic(self, det_params, key):
        """Warm-start every layer from the params of the deterministic twin (same sizes): SVD for low-rank
        layers (App. F.9), ``mu = W`` for BBB, ``W_bar = W`` for rank-1."""
        if len(det_params) != len(self.layers):
            raise ValueError(f"MLP.from_deterministic: det_params hold {len(det_params)} layers, "
                             f"the network has {len(self.layers)}")
        return tuple(s.from_deterministic(p, jax.random.fold_in(key, i))
                     for i, (s, p) in enumerate(zip(self.layers, det_params)))

    def mean_weights(self, params):
        """``E[W]`` of every layer (posterior-mean matrices, e.g. for the bounds of ``lowrank_theory``)."""
        return tuple(s.mean_weight(p) for s, p in zip(self.layers, params))

    def deterministic_twin(self) -> MLP:
        """The same architecture with deterministic layers (the source of :meth:`from_deterministic`)."""
        return MLP(tuple(DeterministicDense(s.n_in, s.n_out, bias="none" if s.bias == "none" else "deterministic")
                         for s in self.layers), self.activation)


def _per_layer(value, n: int, name: str, where: str):
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{where}: {name} must be one value or one per layer ({n}), got {len(value)}")
        return tuple(value)
    return (value,) * n


def mlp(sizes: Sequence[int], kind="lowrank", *, rank=None, activation="relu", bias=None, init=None,
        family: str = "gaussian", **options) -> MLP:
    """An :class:`MLP` with layer sizes ``sizes = (d_in, h_1, ..., d_out)``.

    Args:
      sizes: the layer widths ``(d_in, h_1, ..., d_out)``, positive integers (at least two).
      kind: one of :data:`KINDS`, or one per layer (e.g. the toy model ``("bbb", "lowrank", "bbb")``).
      rank: for low-rank layers, one int or one per layer (``None`` for other kinds).
      activation: a callable or a name (``"relu"``, ``"tanh"``, ``"gelu"``, ...).
      bias: ``"bayes"``, ``"deterministic"``, ``"none"`` (one or per layer); default per kind (:func:`dense`).
      init: initialiser name (one or per layer); default per kind (low-rank: ``"he"`` after ReLU, else
        ``"glorot"``).
      family: ``"gaussian"`` or ``"laplace"`` factors.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`MLP` spec (call its ``init`` for parameters).

    Raises:
      ValueError: if ``sizes`` has fewer than two entries or a non-positive one, a per-layer sequence has the
        wrong length, a kind or the activation name is unknown, a low-rank layer has no rank, or a layer
        rejects its settings.
    """
    where = "mlp"
    sizes = tuple(sizes)
    if len(sizes) < 2:
        raise ValueError(f"{where}: sizes must hold at least input and output sizes, got {sizes!r}")
    for s in sizes:
        _check_int(s, "sizes", where)
    n = len(sizes) - 1
    kinds = _per_layer(kind, n, "kind", where)
    ranks = _per_layer(rank, n, "rank", where)
    biases = _per_layer(bias, n, "bias", where)
    inits = _per_layer(init, n, "init", where)
    act = _activation(activation, where)
    layers = []
    for i in range(n):
        k = _check_choice(kinds[i], KINDS, "kind", f"{where} layer {i}")
        r = ranks[i] if k == "lowrank" else None
        if k == "lowrank" and r is None:
            raise ValueError(f"{where}: layer {i} is low-rank but rank is None")
        ini = inits[i]
        if ini is None and k == "lowrank":
            ini = "he" if act is jax.nn.relu else "glorot"
        opts = _layer_options(_DENSE[k], dict(options, family=family))
        layers.append(dense(k, sizes[i], sizes[i + 1], rank=r, bias=biases[i], init=ini, **opts))
    return MLP(tuple(layers), act)


def _layer_options(cls, options: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in options.items() if k in names}


def predict(model, params, x, key, num_samples: int = 50, *, batch_size: int | None = None):
    """Monte-Carlo predictive samples: ``S = num_samples`` outputs of ``model.apply(params, x, k_s)`` with
    ``k_s = split(key, S)[s]``, stacked along a new leading axis (shape ``(S,) + output shape``). Average the
    softmax of the logits (classification) or take mean / std over axis 0 (regression). ``batch_size``: how
    many draws are evaluated at once (``lax.map``'s ``batch_size``; default all at once).

    Args:
        model: the network spec.
        params: its parameters.
        x: inputs, as for ``model.apply``.
        key: PRNG key, split into ``S`` draw keys.
        num_samples: number of draws ``S`` (a positive integer).
        batch_size: draws evaluated together (a positive integer), or ``None`` for all at once under ``vmap``.

    Returns:
        Array of shape ``(S,) + output shape``, one network output per weight draw.

    Raises:
        ValueError: if ``num_samples`` or ``batch_size`` is not a positive integer.
    """
    s = _check_int(num_samples, "num_samples", "predict")
    keys = jax.random.split(key, s)
    f = lambda k: model.apply(params, x, k)  # noqa: E731
    if batch_size is None:
        return jax.vmap(f)(keys)
    return lax.map(f, keys, batch_size=_check_int(batch_size, "batch_size", "predict"))
