"""Which leaves of a model's parameters are random, with which distribution, and which are fixed.

A leaf is named by its path in the parameter pytree, the keys joined by ``/`` (``params/Dense_0/kernel`` for a
Flax linen model, ``layers/0/weight`` for an Equinox one, ``W1`` for a dict). Defaults read the frameworks' own
initialisers as scales; an explicit entry of ``priors`` always wins.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax

__all__ = ["Weight", "Bias", "Fixed"]  # leaf_paths / resolve_priors serve smnngp.traced itself

_PARAMETERIZATIONS = ("ntk", "standard")
_INITS = ("fan_in", "unit")


def _check_scale(value, what: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}")
    return value


def _check_parameterization(p, what: str) -> str:
    if p not in _PARAMETERIZATIONS:
        raise ValueError(f"{what}: parameterization must be 'ntk' or 'standard', got {p!r}")
    return p


@dataclasses.dataclass(frozen=True)
class Weight:
    """A random weight leaf: i.i.d. centred entries, multiplied into activations (``dot_general``).

    Args:
        W_std: the layer's weight scale.
        init: ``'fan_in'`` (default): entries have variance ``W_std**2 / fan_in``, ``fan_in`` the number of
            entries each output sums (Flax's ``lecun_normal`` is ``W_std=1``, Equinox's uniform initialiser
            ``W_std=1/sqrt(3)``, neural-tangents' ``'standard'`` layers); ``'unit'``: entries have variance
            ``W_std**2`` (code that multiplies by ``1/sqrt(fan_in)`` itself, as neural-tangents' ``'ntk'``
            layers do).
        parameterization: which NTK: ``'ntk'`` (default) differentiates with respect to the leaf divided by its
            standard deviation, the width-independent limit of neural-tangents' default layers; ``'standard'``
            differentiates with respect to the leaf as it is, at the traced widths (neural-tangents'
            ``parameterization='standard'``).
    """

    W_std: float = 1.0
    init: str = "fan_in"
    parameterization: str = "ntk"

    def __post_init__(self):
        object.__setattr__(self, "W_std", _check_scale(self.W_std, "Weight: W_std", positive=True))
        if self.init not in _INITS:
            raise ValueError(f"Weight: init must be 'fan_in' or 'unit', got {self.init!r}")
        _check_parameterization(self.parameterization, "Weight")

    def variance(self, fan_in: int) -> float:
        """Variance of one entry for a use that sums ``fan_in`` of them."""
        return self.W_std**2 / fan_in if self.init == "fan_in" else self.W_std**2


@dataclasses.dataclass(frozen=True)
class Bias:
    """A random bias leaf: i.i.d. centred entries of standard deviation ``b_std``, added to activations.

    Args:
        b_std: standard deviation of each entry (0 for a zero-initialised bias, Flax's default).
        parameterization: ``'ntk'`` (default; the bias contributes ``b_std**2`` to the NTK) or ``'standard'``
            (it contributes 1).
    """

    b_std: float = 0.0
    parameterization: str = "ntk"

    def __post_init__(self):
        object.__setattr__(self, "b_std", _check_scale(self.b_std, "Bias: b_std", positive=False))
        _check_parameterization(self.parameterization, "Bias")


@dataclasses.dataclass(frozen=True)
class Fixed:
    """A leaf held at its value in the example parameters (layer-norm scales, fixed embeddings, masks)."""


Prior = Weight | Bias | Fixed


def _key_name(entry) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def leaf_paths(params) -> tuple[list[str], list[Any], Any]:
    """``(paths, leaves, treedef)`` of ``params``, each path the keys joined by ``/``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = []
    for path, _ in flat:
        keys = [_key_name(e) for e in path]
        if len(keys) > 1 and keys[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
            keys = keys[:-1]  # a Flax NNX Variable holds its array in .value: the leaf is named by the Variable
        paths.append("/".join(keys))
    return paths, [leaf for _, leaf in flat], treedef


class _EquinoxBias:
    """Default of an Equinox bias: its variance comes from its weight's fan-in, read when priors are resolved."""


def _default(path: str, paths: set[str], leaf) -> Prior | _EquinoxBias | None:
    """The framework's own initialiser read as a prior, or None when the name says nothing."""
    parent, _, name = path.rpartition("/")
    sibling = (parent + "/" if parent else "")
    if name == "kernel":  # Flax (linen and NNX) Dense / Conv: lecun_normal
        return Weight(1.0)
    if name == "bias" and sibling + "kernel" in paths:  # Flax: zeros
        return Bias(0.0)
    if name == "weight" and jax.numpy.ndim(leaf) >= 2:
        # Equinox Linear / Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), variance 1/(3 fan_in)
        return Weight(1.0 / math.sqrt(3.0))
    if name == "weight":  # a vector named weight: Equinox LayerNorm / GroupNorm's elementwise scale
        return Fixed()
    if name == "bias" and sibling + "weight" in paths:
        # Equinox draws the bias from the same uniform as the weight: its variance depends on the fan-in, read off
        # the weight's shape (out, in, *window) when the priors are resolved (a normalisation's offset is fixed)
        return _EquinoxBias()
    if path.startswith("batch_stats/"):  # Flax's running statistics: values, not random
        return Fixed()
    if name in ("scale", "embedding", "bias") or jax.numpy.ndim(leaf) == 0:
        return Fixed()  # normalisation scales and offsets (Flax LayerNorm's scale and bias), embeddings
    return None


def resolve_priors(params, priors) -> tuple[list[str], list[Prior], Any]:
    """The prior of every leaf of ``params``: ``priors`` (a mapping from path patterns, as in `fnmatch`, to
    `Weight` / `Bias` / `Fixed`, or a callable ``(path, leaf) -> prior or None``) first, then the defaults.

    Raises:
        TypeError: if ``priors`` or one of its values has the wrong type.
        ValueError: if a leaf has no prior (its path is named, with how to give one), or a pattern of ``priors``
            matches no leaf.
    """
    paths, leaves, treedef = leaf_paths(params)
    path_set = set(paths)
    explicit: Callable[[str, Any], Any]
    if priors is None:
        def explicit(path, leaf):
            return None
    elif isinstance(priors, Mapping):
        for pattern, prior in priors.items():
            if not isinstance(prior, (Weight, Bias, Fixed)):
                raise TypeError(f"priors[{pattern!r}] must be smnngp.traced.Weight, Bias or Fixed, got "
                                f"{type(prior).__name__}")
            if not any(fnmatch.fnmatchcase(p, pattern) for p in paths):
                raise ValueError(f"priors: the pattern {pattern!r} matches no parameter; the parameters are "
                                 f"{paths}")

        def explicit(path, leaf):
            for pattern, prior in priors.items():
                if fnmatch.fnmatchcase(path, pattern):
                    return prior
            return None
    elif callable(priors):
        def explicit(path, leaf):
            prior = priors(path, leaf)
            if prior is not None and not isinstance(prior, (Weight, Bias, Fixed)):
                raise TypeError(f"priors({path!r}, leaf) must return smnngp.traced.Weight, Bias, Fixed or None, "
                                f"got {type(prior).__name__}")
            return prior
    else:
        raise TypeError(f"priors must be a mapping from path patterns to priors, a callable or None, got "
                        f"{type(priors).__name__}")
    out: list[Prior] = []
    missing = []
    for path, leaf in zip(paths, leaves):
        prior = explicit(path, leaf)
        if prior is None:
            prior = _default(path, path_set, leaf)
        if isinstance(prior, _EquinoxBias):
            weight = leaves[paths.index(path.rpartition("/")[0] + "/weight")]
            if jax.numpy.ndim(weight) < 2:
                prior = Fixed()
            else:
                fan_in = math.prod(jax.numpy.shape(weight)[1:])
                prior = Bias(1.0 / math.sqrt(3.0 * fan_in))
        if prior is None:
            missing.append(path)
        out.append(prior)
    if missing:
        raise ValueError(
            f"smnngp.traced: no prior for the parameters {missing}; say which are random weights, biases or fixed "
            f"values, e.g. priors={{{missing[0]!r}: smnngp.traced.Weight(W_std=1.0)}} (names 'kernel'/'weight' and "
            f"'bias' get the framework's initialiser by default)")
    return paths, out, treedef
