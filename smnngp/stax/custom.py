"""User-written layers in neural-tangents' style: `layer`, `requires`, `supports_masking`, `Bool`, `Diagonal`.

A layer written for neural-tangents 0.6.5 is a function returning ``(init_fn, apply_fn, kernel_fn)`` whose
``kernel_fn`` maps the input `smnngp.kernels.Kernel` to the output one, decorated::

    @stax.layer
    @stax.supports_masking(remask_kernel=False)     # optional: masked inputs (mask_constant)
    def Square():
        def init_fn(key, input_shape):
            return input_shape, ()

        def apply_fn(params, x, **kwargs):
            return x ** 2

        @stax.requires(diagonal_spatial=stax.Diagonal())   # same-position covariances suffice
        def kernel_fn(k, **kwargs):
            ...                                            # k.nngp, k.cov1, k.cov2, k.ntk, k.is_gaussian, ...
            return k.replace(nngp=..., cov1=..., cov2=..., ntk=..., is_gaussian=False)

        return init_fn, apply_fn, kernel_fn

`layer` turns the triple into an smnngp `Layer`, so the result composes with every built-in layer (``serial``,
``parallel``, ``kernel_fn(x1, x2, get=...)``, masks, ``jit``). What the decorators mean here:

* the `Kernel` a user ``kernel_fn`` sees has neural-tangents' field names besides smnngp's: ``diagonal_spatial``
  (``not full``), ``diagonal_batch`` (always True: layers see batch diagonals), ``x1_is_x2``, ``is_reversed``
  (False: smnngp never reverses spatial axes), ``is_input`` (False), ``batch_axis`` (0) and ``channel_axis``
  (the last axis): kernels are held in the canonical layout, batch first and channels last, and so are ``shape1``
  / ``shape2``; ``Kernel.replace`` takes those names too, and ``Kernel.mask(mask1, mask2)`` remasks. The output
  shapes ``shape1`` / ``shape2`` are set from ``init_fn`` after the user's ``kernel_fn`` (as neural-tangents
  does), so the user ``kernel_fn`` need not track them.
* ``requires(diagonal_spatial=...)`` tells which spatial covariances the layer needs: ``Diagonal()`` (input
  ``Bool.YES``) or ``True``, same-position covariances suffice when the layers after it need no more;
  ``Diagonal(input=Bool.MAYBE)``, ``Diagonal(input=Bool.NO)``, ``False`` or no requirement at all (neural-tangents'
  default), every pair of positions (always correct, costlier); ``batch_axis`` / ``channel_axis`` the layout of the
  finite activations. ``diagonal_batch=False`` (covariances across the batch inside the layer) has no counterpart
  in smnngp's kernels and raises with the layer's name when the layer is built.
* ``supports_masking(remask_kernel)`` (placed below ``layer``): ``apply_fn`` gets the input mask as ``mask=``
  when inputs are masked, the optional fourth function ``mask_fn(mask, input_shape)`` maps the mask forward
  (identity when absent), and ``remask_kernel=True`` zeroes the covariances of masked positions after the layer
  (`smnngp.stax.masking`). Without the decorator a layer rejects masked inputs with its name.
* A user layer is evaluated as written: large symmetric kernels (``x2=None``) are not tiled for it (its
  ``kernel_fn`` need not be exactly symmetric in its two inputs).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math

import jax

from smnngp.kernels import Kernel
from smnngp.stax import masking
from smnngp.stax._core import Layer, canonical_shape

__all__ = ["Bool", "Diagonal", "layer", "requires", "supports_masking"]

_REQUIREMENTS = "_smnngp_requirements"
_KNOWN = ("diagonal_batch", "diagonal_spatial", "batch_axis", "channel_axis")


class Bool(enum.IntEnum):
    """Three-valued logic of neural-tangents' requirements: ``NO`` < ``MAYBE`` < ``YES``; ``a & b`` is the lesser."""

    NO = 0
    MAYBE = 1
    YES = 2

    def __and__(self, other):
        return Bool(min(int(self), int(other)))

    __rand__ = __and__


@dataclasses.dataclass(frozen=True)
class Diagonal:
    """Whether a layer can work with same-position (spatially diagonal) covariances only.

    Attributes:
        input: ``Bool.YES``: the layer's input may hold same-position covariances only; ``Bool.MAYBE``: only
            where the covariances between different positions are zero; ``Bool.NO``: it needs every pair.
        output: whether everything from this layer to the network's output may be diagonal (``YES``), may be
            diagonal right after this layer (``MAYBE``), or not (``NO``).

    ``a & b`` is the requirement both layers of a parallel pair accept (the lesser of each field); ``a >> b`` the
    requirement of ``b`` applied after ``a``; ``bool(d)`` whether a kernel may be diagonal (input ``YES`` and
    output above ``NO``).
    """

    input: Bool = Bool.YES
    output: Bool = Bool.NO

    def __and__(self, other: Diagonal) -> Diagonal:
        return Diagonal(self.input & other.input, self.output & other.output)

    __rand__ = __and__

    def __rshift__(self, other: Diagonal) -> Diagonal:
        if self.output == Bool.YES:  # everything after `self` may be diagonal already
            return self
        if self.output == Bool.NO:
            # `self` must see full covariances unless `other` takes diagonal ones without condition
            first = self.input & other.input if other.input == Bool.YES else Bool.NO
        else:  # self.output == MAYBE: diagonal right after `self`
            first = self.input if other.input != Bool.NO else self.input & other.input
        return Diagonal(first, other.output)

    def __lshift__(self, other: Diagonal) -> Diagonal:
        return other >> self

    def __bool__(self) -> bool:
        return self.input == Bool.YES and self.output != Bool.NO


def requires(**static_reqs):
    """Decorate a layer's ``kernel_fn`` with the input it needs (neural-tangents' ``stax.requires``).

    Args:
        **static_reqs: ``diagonal_spatial`` (a `Diagonal`, a `Bool` or a bool), ``diagonal_batch`` (bool),
            ``batch_axis``, ``channel_axis`` (ints); other names are accepted and ignored, as neural-tangents
            threads them through as keyword arguments.

    Returns:
        A decorator; the decorated ``kernel_fn`` raises a ValueError naming itself when it is handed a Kernel with
        same-position covariances only while it needs every pair.
    """
    for key in ("batch_axis", "channel_axis"):
        if key in static_reqs and not isinstance(static_reqs[key], int):
            raise TypeError(f"requires: {key} must be an int, got {static_reqs[key]!r}")

    def decorate(kernel_fn):
        if not callable(kernel_fn):
            raise TypeError(f"requires: expected a kernel_fn, got {type(kernel_fn).__name__}")

        @functools.wraps(kernel_fn)
        def checked(k, **kwargs):
            if isinstance(k, Kernel) and k.spatial_ndim > 0 and not k.full and _input_need(static_reqs) != Bool.YES:
                raise ValueError(
                    f"{getattr(kernel_fn, '__name__', 'kernel_fn')} requires the covariances of all pairs of "
                    f"spatial positions (diagonal_spatial={static_reqs.get('diagonal_spatial')!r}), but its input "
                    f"Kernel holds same-position covariances only")
            return kernel_fn(k, **kwargs)

        setattr(checked, _REQUIREMENTS, dict(static_reqs))
        return checked

    return decorate


def _input_need(reqs) -> Bool:
    """How diagonal a layer's input may be: ``Bool.YES`` (same positions suffice) or less (every pair)."""
    value = reqs.get("diagonal_spatial", False)  # neural-tangents' default: every pair
    if isinstance(value, Diagonal):
        return Bool(value.input)
    if isinstance(value, Bool):
        return value
    return Bool.YES if bool(value) else Bool.NO


class _MaskingFns(tuple):
    """``(init_fn, apply_fn, kernel_fn)`` marked by `supports_masking` with its mask map and remasking flag."""

    def __new__(cls, fns, mask_fn, remask: bool):
        self = super().__new__(cls, fns)
        self.mask_fn = mask_fn
        self.remask = remask
        return self


def supports_masking(remask_kernel: bool):
    """Let a user layer take masked inputs (neural-tangents' ``stax.supports_masking``); apply below `layer`.

    Args:
        remask_kernel: whether the covariances that involve a masked position are set to zero after the layer.

    Returns:
        A decorator for a function returning ``(init_fn, apply_fn, kernel_fn)`` or ``(init_fn, apply_fn,
        kernel_fn, mask_fn)``; ``apply_fn`` must accept ``mask=`` (the input mask, or absent when nothing is
        masked) and ``mask_fn(mask, input_shape)`` returns the output mask.
    """
    if not isinstance(remask_kernel, (bool, int)):
        raise TypeError(f"supports_masking: remask_kernel must be a bool, got {remask_kernel!r}")

    def decorate(layer_fn):
        @functools.wraps(layer_fn)
        def with_masking(*args, **kwargs):
            fns = tuple(layer_fn(*args, **kwargs))
            if len(fns) not in (3, 4):
                raise ValueError(f"{layer_fn.__name__}: expected (init_fn, apply_fn, kernel_fn) or (..., mask_fn), "
                                 f"got {len(fns)} functions")
            return _MaskingFns(fns[:3], fns[3] if len(fns) == 4 else None, bool(remask_kernel))

        return with_masking

    return decorate


def layer(layer_fn):
    """Turn a function returning ``(init_fn, apply_fn, kernel_fn)`` into a layer constructor (nt's ``stax.layer``).

    The constructor takes the arguments of ``layer_fn`` and returns an smnngp `Layer` named after it; its
    ``kernel_fn`` takes arrays (``kernel_fn(x1, x2, get=...)``, with every keyword of smnngp's) or a `Kernel`.
    A ``layer_fn`` that returns an smnngp `Layer` (``stax.serial(...)``, say) gives that layer unchanged.

    Raises (when the layer is built): ValueError if ``layer_fn`` does not return three functions (four only under
    `supports_masking`); NotImplementedError if its ``kernel_fn`` requires ``diagonal_batch=False``.
    """
    if not callable(layer_fn):
        raise TypeError(f"layer: expected a function returning (init_fn, apply_fn, kernel_fn), got "
                        f"{type(layer_fn).__name__}")
    name = getattr(layer_fn, "__name__", "layer")

    @functools.wraps(layer_fn)
    def build(*args, **kwargs):
        fns = layer_fn(*args, **kwargs)
        if isinstance(fns, Layer):
            return fns
        if not isinstance(fns, tuple) or len(fns) != 3 or not all(callable(f) for f in fns):
            raise ValueError(f"{name}: a layer function must return (init_fn, apply_fn, kernel_fn), got "
                             f"{type(fns).__name__} of {len(fns) if isinstance(fns, tuple) else '?'} items "
                             f"(a fourth, mask_fn, needs @supports_masking below @layer)")
        init_fn, apply_fn, kernel_fn = fns
        reqs = getattr(kernel_fn, _REQUIREMENTS, {})
        if reqs.get("diagonal_batch", True) is False:
            raise NotImplementedError(
                f"{name}: its kernel_fn requires diagonal_batch=False (covariances across the batch inside the "
                f"layer); smnngp's layers see batch diagonals only. Build it from smnngp's layers instead "
                f"(Aggregate, FanInConcat(axis=0), ... have their own rules)")
        layout = None
        if "batch_axis" in reqs or "channel_axis" in reqs:
            layout = (reqs.get("batch_axis", 0), reqs.get("channel_axis", -1))
        shape_fn = _shape_fn(name, init_fn)
        diagonal_ok = _input_need(reqs) == Bool.YES
        rule = None
        if isinstance(fns, _MaskingFns):
            rule = masking.MaskRule(fn=_canonical_mask_fn(fns.mask_fn, layout), remask=fns.remask, wants_mask=True)
        return Layer(name, init_fn, apply_fn, shape_fn, _kernel_map(name, kernel_fn, shape_fn, layout),
                     (lambda full: full) if diagonal_ok else (lambda full: True), symmetric=False, layout=layout,
                     masking=rule)

    return build


def _shape_fn(name, init_fn):
    """``input_shape -> output_shape`` from ``init_fn`` without initialising its weights (abstract evaluation)."""

    def shape_fn(input_shape):
        found = []

        def init_params():
            out_shape, params = init_fn(jax.random.PRNGKey(0), tuple(input_shape))
            found.append(out_shape)
            return params

        try:
            jax.eval_shape(init_params)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name}: init_fn rejects input shape {tuple(input_shape)}: {err}") from err
        out = found[0]
        return [tuple(s) for s in out] if isinstance(out, list) else tuple(out)

    return shape_fn


def _finite_shape(shape, layout):
    """Inverse of `canonical_shape`: a canonical shape back in ``layout = (batch_axis, channel_axis)``."""
    shape = tuple(shape)
    if layout is None or len(shape) < 2:
        return shape
    n = len(shape)
    b, c = layout[0] % n, layout[1] % n
    rest = iter(shape[1:-1])
    return tuple(shape[0] if i == b else shape[-1] if i == c else next(rest) for i in range(n))


def _kernel_map(name, kernel_fn, shape_fn, layout):
    """The user ``kernel_fn`` as a `Layer` kernel map: output type checked, output shapes from ``init_fn``."""

    def out_shape(shape):
        return canonical_shape(shape_fn(_finite_shape(shape, layout)), layout)

    def kernel_map(k, **kwargs):
        out = kernel_fn(k, **kwargs)
        if not isinstance(out, Kernel):
            raise TypeError(f"{name}: kernel_fn must return a Kernel, got {type(out).__name__}")
        return out.replace(shape1=out_shape(k.shape1), shape2=out_shape(k.shape2))

    return kernel_map


def _canonical_mask_fn(mask_fn, layout):
    """A user ``mask_fn(mask, input_shape)`` (finite layout) as a `MaskRule` map on canonical masks."""
    if mask_fn is None:
        return None

    def fn(mask, shape):
        finite = _finite_shape(shape, layout)
        m = mask if layout is None else jax.numpy.moveaxis(mask, (0, mask.ndim - 1), _axes(layout, mask.ndim))
        out = mask_fn(jax.numpy.broadcast_to(m, finite) if math.prod(m.shape) != math.prod(finite) else m, finite)
        if layout is None:
            return out
        return jax.numpy.moveaxis(out, _axes(layout, out.ndim), (0, out.ndim - 1))

    return fn


def _axes(layout, ndim):
    return layout[0] % ndim, layout[1] % ndim
