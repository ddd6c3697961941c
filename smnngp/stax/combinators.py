"""Combinators: `serial`, `parallel`, `FanOut`, `FanInSum`, `FanInConcat`, `Identity`."""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.stax._core import (
    Layer,
    _as_layer,
    _single_shape,
    first_layout,
)

# ---------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------

__all__ = ["serial", "parallel", "FanOut", "FanInSum", "FanInConcat", "Identity"]


def serial(*layers) -> Layer:
    """Compose layers left to right.

    Args:
        *layers: one or more `Layer` objects built by this module; the output of each feeds the next.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` of the composition; its parameters are the tuple of the
        layers' parameters.

    Raises:
        ValueError: if no layer is given.
        TypeError: if an argument is not a `Layer` of this module.
    """
    if not layers:
        raise ValueError("serial: needs at least one layer")
    layers = [_as_layer(l, f"serial (argument {i})") for i, l in enumerate(layers)]
    name = "serial(" + ", ".join(l.name for l in layers) + ")"

    def shape_fn(shape):
        for l in layers:
            shape = l.shape_fn(shape)
        return shape

    def init_fn(key, input_shape):
        keys = jax.random.split(key, len(layers))
        params = []
        shape = input_shape
        for l, k in zip(layers, keys):
            shape, p = l[0](k, shape)
            params.append(p)
        return shape, tuple(params)

    def apply_fn(params, x, **kwargs):
        if len(params) != len(layers):
            raise ValueError(f"serial: got {len(params)} parameter groups for {len(layers)} layers")
        for l, p in zip(layers, params):
            x = l[1](p, x, **kwargs)
        return x

    def kernel_map(k, **kwargs):
        for l in layers:
            k = l.kernel_map(k, **kwargs)
        return k

    def needs_full(full):
        for l in reversed(layers):
            full = l.needs_full(full)
        return full

    return Layer(
        name, init_fn, apply_fn, shape_fn, kernel_map, needs_full,
        all(l.symmetric for l in layers), first_layout(layers),
    )


def _check_branches(obj, n: int, layer: str):
    if not isinstance(obj, (list, tuple)) or (n and len(obj) != n):
        got = f"{len(obj)} inputs" if isinstance(obj, (list, tuple)) else type(obj).__name__
        raise ValueError(f"{layer}: expected a list of {n or 'several'} branches, got {got}")


def _is_shape_list(shape) -> bool:
    return isinstance(shape, list) or (isinstance(shape, tuple) and shape and isinstance(shape[0], tuple))


def parallel(*layers) -> Layer:
    """Apply the i-th layer to the i-th input of a list (after `FanOut`).

    Args:
        *layers: one or more `Layer` objects, one per branch.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` taking a list of as many inputs as there are layers and
        returning the list of their outputs; its parameters are the tuple of the layers' parameters.

    Raises:
        ValueError: if no layer is given.
        TypeError: if an argument is not a `Layer` of this module.
    """
    if not layers:
        raise ValueError("parallel: needs at least one layer")
    layers = [_as_layer(l, f"parallel (argument {i})") for i, l in enumerate(layers)]
    n = len(layers)
    name = "parallel(" + ", ".join(l.name for l in layers) + ")"

    def shape_fn(shapes):
        if not _is_shape_list(shapes):
            raise ValueError(f"{name}: expected {n} branch inputs (use FanOut first), got one input {shapes}")
        _check_branches(shapes, n, "parallel")
        return [l.shape_fn(s) for l, s in zip(layers, shapes)]

    def init_fn(key, input_shapes):
        shape_fn(list(input_shapes))
        keys = jax.random.split(key, n)
        outs = [l[0](k, s) for l, k, s in zip(layers, keys, input_shapes)]
        return [o[0] for o in outs], tuple(o[1] for o in outs)

    def apply_fn(params, xs, **kwargs):
        _check_branches(xs, n, "parallel")
        return [l[1](p, x, **kwargs) for l, p, x in zip(layers, params, xs)]

    def kernel_map(ks, **kwargs):
        _check_branches(ks, n, "parallel")
        return [l.kernel_map(k, **kwargs) for l, k in zip(layers, ks)]

    def needs_full(full):
        return any(l.needs_full(full) for l in layers)

    return Layer(
        name, init_fn, apply_fn, shape_fn, kernel_map, needs_full,
        all(l.symmetric for l in layers), first_layout(layers),
    )


def FanOut(num: int) -> Layer:
    """Copy the input into ``num`` branches.

    Args:
        num: number of branches (a positive int).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters whose output is a list of ``num`` copies
        of its input (to be consumed by `parallel`, `FanInSum` or `FanInConcat`).

    Raises:
        ValueError: if ``num`` is not a positive integer.
    """
    if not isinstance(num, (int, np.integer)) or num < 1:
        raise ValueError(f"FanOut: num must be a positive integer, got {num!r}")
    layer = f"FanOut({num})"

    def shape_fn(shape):
        return [_single_shape(shape, layer)] * num

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    return Layer(layer, init_fn, lambda p, x, **kw: [x] * num, shape_fn, lambda k: [k] * num, lambda full: full)


def _branch_shapes(shapes, layer):
    if not _is_shape_list(shapes):
        raise ValueError(f"{layer}: expects a list of branches (after FanOut/parallel), got one input {shapes}")
    return [tuple(s) for s in shapes]


def FanInSum() -> Layer:
    """Sum the branches (residual connections); all branch shapes must agree.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping a list of branches to their sum;
        its kernels are the sums of the branch kernels.
    """
    layer = "FanInSum"

    def shape_fn(shapes):
        shapes = _branch_shapes(shapes, layer)
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"{layer}: branch shapes differ: {shapes}")
        return shapes[0]

    def init_fn(key, input_shapes):
        return shape_fn(list(input_shapes)), ()

    def apply_fn(params, xs, **kwargs):
        shape_fn([tuple(x.shape) for x in xs])
        return functools.reduce(operator.add, xs)

    def kernel_map(ks):
        shape_fn([k.shape1 for k in ks])

        def total(attr):
            vals = [getattr(k, attr) for k in ks]
            if any(v is None for v in vals):
                return None
            return functools.reduce(operator.add, vals)

        return ks[0].replace(
            nngp=total("nngp"),
            ntk=total("ntk"),
            cov1=total("cov1"),
            cov2=total("cov2"),
            is_gaussian=all(k.is_gaussian for k in ks),
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)


def FanInConcat(axis: int = -1) -> Layer:
    """Concatenate the branches along ``axis``.

    The kernel is defined for the channel axis (the default): concatenating
    channels averages the branch kernels weighted by their finite widths.

    Args:
        axis: axis along which the branch outputs are concatenated (default -1, the channels).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping a list of branches to one array.
        Its ``kernel_fn`` raises NotImplementedError when ``axis`` is not the channel axis.
    """
    layer = f"FanInConcat(axis={axis})"

    def shape_fn(shapes):
        shapes = _branch_shapes(shapes, layer)
        ndim = len(shapes[0])
        ax = axis % ndim
        for s in shapes:
            if len(s) != ndim or any(s[i] != shapes[0][i] for i in range(ndim) if i != ax):
                raise ValueError(f"{layer}: branch shapes {shapes} differ outside axis {axis}")
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return tuple(out)

    def init_fn(key, input_shapes):
        return shape_fn(list(input_shapes)), ()

    def apply_fn(params, xs, **kwargs):
        shape_fn([tuple(x.shape) for x in xs])
        return jnp.concatenate(xs, axis=axis)

    def kernel_map(ks):
        out_shape = shape_fn([k.shape1 for k in ks])
        if axis % len(out_shape) != len(out_shape) - 1:
            raise NotImplementedError(
                f"{layer}: the infinite-width kernel is implemented for concatenation along the channel "
                f"(last) axis only"
            )
        widths = [float(k.shape1[-1]) for k in ks]
        total_w = sum(widths)

        def mix(attr):
            vals = [getattr(k, attr) for k in ks]
            if any(v is None for v in vals):
                return None
            return functools.reduce(operator.add, [v * (w / total_w) for v, w in zip(vals, widths)])

        return ks[0].replace(
            nngp=mix("nngp"),
            ntk=mix("ntk"),
            cov1=mix("cov1"),
            cov2=mix("cov2"),
            shape1=out_shape,
            shape2=shape_fn([k.shape2 for k in ks]),
            is_gaussian=all(k.is_gaussian for k in ks),
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)



def Identity() -> Layer:
    """The identity map.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters that passes inputs and kernels unchanged.
    """

    def init_fn(key, input_shape):
        return input_shape, ()

    return Layer("Identity", init_fn, lambda params, x, **kw: x, lambda s: s, lambda k: k, lambda full: full)
