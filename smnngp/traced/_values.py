"""What a variable of a traced program is when every weight's width goes to infinity.

* `Const`: a concrete array that depends on neither the input nor a random parameter (folded already).
* `Param`: a random parameter leaf (or a reshaped, transposed or rescaled view of it) before it meets an
  activation.
* `DataIn`: the input (after any preprocessing that depends on it alone), where it enters a weight.
* `Field`: an infinite-width activation, ``sum_k coef_k * term_k``; its terms are `Affine` (``W a`` for a weight
  ``W``: Gaussian), `BiasTerm` (Gaussian), `Ones` (the deterministic all-ones vector) and `Nonlin` (``phi(g)``
  for a Gaussian field ``g``); a coefficient is a Python float or a `PerEx`.
* `PerEx`: a number per example that the limit makes deterministic (a mean or a second moment over the width:
  layer normalisation's statistics), held as one array per input set.
* `FieldProduct`: the entrywise product of two fields that are not functions of one Gaussian; only its mean over
  the width (their second moment) has a limit.
* `PerPos`: deterministic values per example and position pair (attention logits and weights), and `Mixed`, a
  field's positions mixed by them (attention's weighted sum of values).
* `Mapped`: a linear map of a field along its spatial axes (pooling, flattening, a global mean), done by a stax
  layer's kernel map (the field's term in the width space of the map's output).
* `PerExChannels`: a per-example statistic times a constant per channel (a normalisation's scale multiplied into
  the statistic before it meets the field), applied when it meets one.
* `Concat`: fields side by side along the width (a concatenation over the channels, or a per-channel constant
  that takes a few values: the units split into groups), each part on its own set of the units.

Axes carry roles: ``'b'`` the batch, ``'w'`` the width (infinite), ``'f'`` a finite feature axis of the input,
``'s0'``, ``'s1'``, ... the spatial axes (numbered in the order of the kernel's canonical layout), ``'1'`` an axis
of size one that broadcasts. A field's ``spatial`` holds the sizes of its spatial axes in that order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

_uids = itertools.count(1)


def new_uid() -> int:
    return next(_uids)


@dataclasses.dataclass(eq=False)
class Const:
    value: Any


@dataclasses.dataclass(eq=False)
class Param:
    """Leaf ``leaf`` viewed as ``shape``; ``scale`` multiplies it; ``view`` names the view (reuse identity)."""

    leaf: int
    shape: tuple
    scale: float
    view: tuple
    carry: tuple | None = None  # the axes that hold the leaf's entries (None: all of its non-unit axes)

    def carrying(self) -> tuple:
        if self.carry is not None:
            return self.carry
        return tuple(a for a, s in enumerate(self.shape) if s != 1)


@dataclasses.dataclass(eq=False)
class DataIn:
    """The input where it enters a weight; ``index`` numbers it among several such values (else None)."""

    roles: tuple
    index: int | None = None


@dataclasses.dataclass(eq=False)
class PerEx:
    """Values per example: ``v1`` over the points of x1, ``v2`` over those of x2 (``None``: x2 is x1);
    ``zero`` marks an exact zero (the mean of a centred field), ``power`` counts factors of the width still in
    the value (a sum over the width not yet divided by it)."""

    v1: Any
    v2: Any
    roles: tuple
    zero: bool = False
    power: int = 0
    power_width: int = 0  # the width summed over, while power is 1
    # while power is 1, the readings of the constant factors applied so far: (powers of sqrt(width), the other
    # constants); one reading reaching sqrt(width)^-2 makes the sum a mean
    scalings: tuple = ((0, 1.0),)


class Term:
    """A basis vector of the width space; compared by identity, ordered by ``uid`` (numbered when first asked)."""

    gaussian = False

    @property
    def uid(self) -> int:
        if "_uid" not in self.__dict__:
            self.__dict__["_uid"] = new_uid()
        return self.__dict__["_uid"]


@dataclasses.dataclass(eq=False)
class Affine(Term):
    """``W a``: ``layer`` (a stax Dense with the leaf's variance) maps the moments of ``inp`` to this term's."""

    weight: tuple  # (leaf, view, fan_in): the same tuple for every use of the same weight
    inp: Any  # Field, Concat or DataIn
    layer: Any
    # the weight's output units (columns) this term holds, in order (a slice of a fused projection: ``W[:, r] a``);
    # None: all of them
    units: tuple | None = None
    gaussian = True


@dataclasses.dataclass(eq=False)
class BiasTerm(Term):
    """A bias; with ``positional`` (spatial axes, canonical order) a positional embedding: one independent draw per
    position along those axes (covariance zero between two positions), shared along the others."""

    leaf: tuple
    variance: float
    ntk: float  # what the bias adds to the NTK
    positional: tuple = ()
    units: tuple | None = None  # the bias's units this term holds, in order (as `Affine.units`)
    gaussian = True


@dataclasses.dataclass(eq=False)
class Ones(Term):
    pass


ONES = Ones()


@dataclasses.dataclass(eq=False)
class Nonlin(Term):
    """``fn(base)`` for the Gaussian field ``base``; ``prod`` = (F, G) when it is the product of two fields
    (its mean over the width is then their second moment, exactly); ``where`` the source line that made it."""

    fn: Callable
    base: Any  # Field
    prod: Any = None
    where: str = ""
    # the operation that ends the chain (recognition is cached by it); for a sum fused into one function, the
    # pair (that sum's operation, the number of the pre-activation among the sum's)
    origin: Any = 0


@dataclasses.dataclass(eq=False)
class Mapped(Term):
    """``layer`` (a stax pooling / Flatten layer, linear in its input) applied to the field ``inp``; ``key`` names
    the operation, so that two uses of one map on two fields pair up (``layer`` applied to their moments)."""

    layer: Any
    inp: Any  # Field
    key: tuple

    @property
    def gaussian(self) -> bool:  # a linear map keeps a Gaussian field Gaussian
        return self.inp.gaussian


@dataclasses.dataclass(eq=False)
class PerPos:
    """Deterministic values per example and per position (pair): attention logits and weights. ``v1`` has the
    program's shape with the batch axis over the points of x1, ``v2`` over those of x2 (``None``: x2 is x1);
    ``power`` as for `PerEx` (a sum over the width not yet divided by it)."""

    v1: Any
    v2: Any
    roles: tuple
    power: int = 0
    power_width: int = 0
    scalings: tuple = ((0, 1.0),)


@dataclasses.dataclass(eq=False)
class Mixed(Term):
    """``sum_s A[t, s] inp[s]``: positions of the field ``inp`` mixed by the per-example weights ``weights`` (a
    `PerPos` over (batch, query position, key position)); ``key`` names the operation that made it."""

    weights: Any
    inp: Any  # Field
    key: int

    @property
    def gaussian(self) -> bool:  # a deterministic linear map keeps a Gaussian field Gaussian
        return self.inp.gaussian


@dataclasses.dataclass(eq=False)
class Field:
    terms: tuple  # ((Term, coef), ...)
    roles: tuple
    width: int
    spatial: tuple = ()  # sizes of the spatial axes, in canonical order

    def like(self, terms, roles=None) -> Field:
        """A field with other terms (and roles) on this one's width and spatial axes."""
        return Field(tuple(terms), self.roles if roles is None else roles, self.width, self.spatial)

    @property
    def gaussian(self) -> bool:
        return all(t.gaussian for t, _ in self.terms)

    def key(self):
        """Identity of a Gaussian field with scalar coefficients: the set of (term, coefficient)."""
        return frozenset((id(t), c) for t, c in self.terms)


@dataclasses.dataclass(eq=False)
class FieldProduct:
    left: Field
    right: Field
    roles: tuple
    width: int
    spatial: tuple = ()


@dataclasses.dataclass(eq=False)
class Concat:
    """Values side by side along the width: part ``i`` (a `Field` or a `FieldProduct`) holds the units
    ``units[i]`` (indices into the width, in the part's order); together the parts hold every unit once.

    The moments of two concatenations split alike are the width-weighted average of their parts' moments,
    ``sum_i len(units[i]) / width * E[F_i G_i]`` (stax's `FanInConcat` over the channels): the coordinates of the
    parts never pair with one another, and the limit keeps each part's share of the width fixed."""

    parts: tuple
    units: tuple
    roles: tuple
    spatial: tuple = ()

    @property
    def width(self) -> int:
        return sum(len(u) for u in self.units)

    @property
    def gaussian(self) -> bool:
        return all(isinstance(p, Field) and p.gaussian for p in self.parts)


@dataclasses.dataclass(eq=False)
class PerExChannels:
    """``perex * const``: a per-example statistic times ``const``, a constant that varies along one axis (the
    channels: Flax's ``rsqrt(var + eps) * scale`` in a layer norm or RMSNorm with a scale per channel), with the
    rank of the operation's output. It has a rule only as the factor of a field."""

    perex: PerEx
    const: Any
