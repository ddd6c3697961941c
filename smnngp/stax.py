"""Layers that give a finite network and its infinite-width NNGP / NTK kernels.

Every constructor returns a `Layer`, a 3-tuple ``(init_fn, apply_fn, kernel_fn)``
with the names and conventions of neural-tangents' ``stax``, so that code
written for it ports by changing the import::

    from smnngp import stax
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(), stax.Dense(1))

* ``init_fn(key, input_shape) -> (output_shape, params)`` and
  ``apply_fn(params, x)`` are the finite network;
* ``kernel_fn(x1, x2=None, get=None)`` is its infinite-width limit: a `Kernel`
  pytree for ``get=None``, the array for ``get='nngp'`` or ``'ntk'``, and a
  named tuple for ``get=('nngp', 'ntk')``. It is traceable (`jit` it with
  ``static_argnames='get'``) and computes in the dtype of its inputs.

Parameterisations (Jacot et al. 2018; neural-tangents' conventions):

* ``'ntk'``: W ~ N(0, 1), b ~ N(0, 1), output = W_std / sqrt(fan_in) * x W + b_std * b;
* ``'standard'``: W ~ N(0, W_std^2 / fan_in), b ~ N(0, b_std^2), output = x W + b.

Both have the same NNGP; their NTKs differ (the standard one scales with the
finite width, which is why kernels track the finite shapes).

Kernel recursions implemented here (c = cross covariance, v1, v2 variances):

* affine: K' = W_std^2 K + b_std^2;  NTK' = K' + W_std^2 NTK  ('ntk');
* activation phi: K' = E[phi(u) phi(v)], NTK' = NTK * E[phi'(u) phi'(v)] with
  (u, v) ~ N(0, [[v1, c], [c, v2]]); closed forms below, Gauss-Hermite otherwise;
* convolution: K'(i, j) = W_std^2 / |F| sum_{d in F} K(i + d, j + d) + b_std^2;
* average pooling, flattening and global pooling: linear maps of K.

Hyperparameters as a pytree. Every scale a constructor takes (``W_std``,
``b_std`` of `Dense` and `Conv`; the parameters of `ABRelu`, `LeakyRelu`,
`Erf`, `Sin`, `Gaussian`) may be a traced JAX scalar: concrete values are
checked when the layer is built (a clear error names the layer and the
argument), traced ones are used as they are, so that ``kernel_fn`` is
differentiable in them under `jit`. An architecture whose scales are fitted is
therefore written as a builder ``arch(params) -> Layer`` over a pytree of
scales, and `parametric_kernel` turns the builder and starting values into a
`smnngp.kernels.ParametricKernel` (unconstrained ``theta``, ``floor +
exp(theta)`` as the scales, the NNGP as the kernel): the one mechanism by which
`smnngp.hyper` fits the kernel of any architecture (MLP, CNN with pooling,
residual blocks) and `smnngp.variational` trains its kernel.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp.kernels import Kernel, ParametricKernel, canonical_get, select

__all__ = [
    "Layer",
    "Dense",
    "Conv",
    "Flatten",
    "AvgPool",
    "GlobalAvgPool",
    "Identity",
    "Relu",
    "ABRelu",
    "LeakyRelu",
    "Erf",
    "Gelu",
    "Sin",
    "Gaussian",
    "ElementwiseNumerical",
    "serial",
    "parallel",
    "FanOut",
    "FanInSum",
    "FanInConcat",
    "parametric_kernel",
]

_PADDINGS = ("SAME", "VALID", "CIRCULAR")


class Layer(tuple):
    """``(init_fn, apply_fn, kernel_fn)`` with the internals combinators need.

    Attributes (internal): ``name``; ``shape_fn(input_shape) -> output_shape``
    (raises ValueError naming the layer on incompatible shapes); ``kernel_map``
    (Kernel -> Kernel, lists for branches); ``needs_full(out_full) -> bool``,
    whether the layer's input kernel must track all position pairs given
    whether its output must; ``symmetric``, whether k(x2, x1) is exactly k(x1, x2)
    with its points swapped (false for quadrature, whose rule is not symmetric).
    """

    def __new__(cls, name, init_fn, apply_fn, shape_fn, kernel_map, needs_full, symmetric=True):
        public_kernel_fn = _make_public_kernel_fn(name, shape_fn, kernel_map, needs_full, symmetric)
        self = super().__new__(cls, (init_fn, apply_fn, public_kernel_fn))
        self.name = name
        self.shape_fn = shape_fn
        self.kernel_map = kernel_map
        self.needs_full = needs_full
        self.symmetric = symmetric
        return self

    def __repr__(self) -> str:
        return f"<smnngp.stax layer {self.name}>"


def _as_layer(obj, where: str) -> Layer:
    if not isinstance(obj, Layer):
        raise TypeError(
            f"{where}: expected a layer built by smnngp.stax (an (init_fn, apply_fn, kernel_fn) "
            f"Layer), got {type(obj).__name__}"
        )
    return obj


# ---------------------------------------------------------------------------
# Input validation and the public kernel_fn
# ---------------------------------------------------------------------------


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_input(x, name: str):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"kernel_fn: {name} must be an array, got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(
            f"kernel_fn: {name} must have a batch axis and a feature axis, got shape {tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"kernel_fn: {name} must be floating point, got dtype {x.dtype}")
    if _is_concrete(x):
        finite = np.isfinite(np.asarray(x))
        if not finite.all():
            bad = int((~finite).sum())
            raise ValueError(f"kernel_fn: {name} has {bad} non-finite (NaN or inf) entries")


def _input_kernel(x1, x2, full: bool, want_ntk: bool) -> Kernel:
    """Second moments of the inputs, averaged over the channel (last) axis."""
    n_chan = x1.shape[-1]
    spatial = x1.ndim - 2
    letters = "hwdefg"[:spatial]
    if spatial == 0:
        sub_pair, sub_self = "ac,bc->ab", "ac,ac->a"
    elif full:
        a_sp = letters
        b_sp = letters.upper()
        inter = "".join(l + u for l, u in zip(a_sp, b_sp))
        sub_pair = f"a{a_sp}c,b{b_sp}c->ab{inter}"
        sub_self = f"a{a_sp}c,a{b_sp}c->a{inter}"
    else:
        sub_pair = f"a{letters}c,b{letters}c->ab{letters}"
        sub_self = f"a{letters}c,a{letters}c->a{letters}"
    prec = lax.Precision.HIGHEST
    scale = 1.0 / n_chan
    x2_is_x1 = x2 is None
    xb = x1 if x2_is_x1 else x2
    nngp = jnp.einsum(sub_pair, x1, xb, precision=prec) * scale
    if x2_is_x1:
        # Take the batch diagonal of nngp itself so that k(x, x) and var(x) are the
        # same floating-point numbers: the arc-cosine kernels have a square-root
        # singularity at correlation 1, which would amplify a last-bit mismatch.
        cov1 = jnp.moveaxis(jnp.diagonal(nngp, axis1=0, axis2=1), -1, 0)
    else:
        cov1 = jnp.einsum(sub_self, x1, x1, precision=prec) * scale
    cov2 = None if x2_is_x1 else jnp.einsum(sub_self, x2, x2, precision=prec) * scale
    ntk = jnp.zeros((), x1.dtype) if want_ntk else None
    return Kernel(nngp, ntk, cov1, cov2, x1.shape, xb.shape, full, is_gaussian=False)


# With x2=None, a network whose inputs have spatial axes and whose output has none (after
# Flatten or GlobalAvgPool), and whose input kernel has at least this many entries (N^2 times
# the spatial positions), is evaluated on T (T + 1) / 2 of T^2 tiles (`_symmetric_kernel_map`):
# there the work is in the hidden layers and the output that must be assembled is small.
_SYMMETRIC_MIN_ENTRIES = 2**21
_SYMMETRIC_TILES = 8


def _batch_diagonal(mat):
    """(N, N, ...) -> (N, ...): the entries k(x_i, x_i)."""
    return jnp.moveaxis(jnp.diagonal(mat, axis1=0, axis2=1), -1, 0)


def _swap_points(tiles, full: bool):
    """k(a, b) -> k(b, a) for stacked tiles (P, n, n, spatial...), position pairs included."""
    rest = list(range(3, tiles.ndim))
    if full:  # (H, H', W, W', ...) -> (H', H, W', W, ...)
        rest = [ax for i in range(0, len(rest), 2) for ax in (rest[i + 1], rest[i])]
    return jnp.transpose(tiles, [0, 2, 1] + rest)


def _symmetric_kernel_map(kernel_map, x, full: bool, want_ntk: bool, tiles: int):
    """``kernel_map`` of the input kernel of (x, x), computed on T (T + 1) / 2 of the T^2 tiles.

    k(x_j, x_i) is k(x_i, x_j) with its two points swapped, so the tiles below the
    block diagonal are mirrored from those above: (T + 1) / (2 T) of the work. All
    tile pairs run as one `vmap`, each with the variances of its two tiles, and
    every point's variance is read off its own diagonal tile, so that k(x, x) and
    var(x) are the same floating-point numbers, as on the untiled path.
    """
    n_points = x.shape[0]
    n = -(-n_points // tiles)
    if tiles * n > n_points:  # pad with copies of the last point; their rows are cut off below
        x = jnp.concatenate([x, jnp.repeat(x[-1:], tiles * n - n_points, axis=0)])
    xt = x.reshape((tiles, n) + x.shape[1:])
    rows, cols = np.triu_indices(tiles)
    pair = {(int(i), int(j)): p for p, (i, j) in enumerate(zip(rows, cols))}
    on_diag = np.array([pair[i, i] for i in range(tiles)])
    nngp = jax.vmap(lambda a, b: _input_kernel(a, b, full, False).nngp)(xt[rows], xt[cols])
    var = jax.vmap(_batch_diagonal)(nngp[on_diag])
    shape = (n,) + x.shape[1:]
    ntk = jnp.zeros((), x.dtype) if want_ntk else None

    def tile_pair(nngp, cov1, cov2):
        return kernel_map(Kernel(nngp, ntk, cov1, cov2, shape, shape, full, is_gaussian=False))

    out = jax.vmap(tile_pair)(nngp, var[rows], var[cols])
    # Tile (r, c) of the result is pair (r, c) for r <= c and pair (c, r) swapped below the
    # diagonal: one gather from [pairs, swapped off-diagonal pairs] reads each entry once.
    off_diag = np.flatnonzero(rows < cols)
    swapped = {(int(cols[p]), int(rows[p])): len(rows) + q for q, p in enumerate(off_diag)}
    source = np.array([[pair[r, c] if r <= c else swapped[r, c] for c in range(tiles)] for r in range(tiles)])

    def mirror(t, full):
        if t.ndim == 1:  # the same constant for every tile (an NTK that no layer has touched)
            return t[0]
        grid = jnp.concatenate([t, _swap_points(t[off_diag], full)])[source]  # (T, T, n, n, spatial...)
        grid = jnp.moveaxis(grid, 2, 1).reshape((tiles * n, tiles * n) + grid.shape[4:])
        return grid[:n_points, :n_points]

    def assemble(k: Kernel) -> Kernel:
        cov1 = k.cov1[on_diag]
        return k.replace(
            nngp=mirror(k.nngp, k.full),
            ntk=None if k.ntk is None else mirror(k.ntk, k.full),
            cov1=cov1.reshape((tiles * n,) + cov1.shape[2:])[:n_points],
            cov2=None,
            shape1=(n_points,) + k.shape1[1:],
            shape2=(n_points,) + k.shape2[1:],
        )

    return [assemble(k) for k in out] if isinstance(out, list) else assemble(out)


def _make_public_kernel_fn(name, shape_fn, kernel_map, needs_full, symmetric):
    def kernel_fn(x1, x2=None, get=None, **unused):
        if unused:
            raise TypeError(f"kernel_fn of {name}: unexpected keyword arguments {sorted(unused)}")
        names, _ = canonical_get(get)
        _check_input(x1, "x1")
        if x2 is not None:
            _check_input(x2, "x2")
            if tuple(x1.shape[1:]) != tuple(x2.shape[1:]):
                raise ValueError(
                    f"kernel_fn of {name}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must agree "
                    f"beyond the batch axis"
                )
            if x1.dtype != x2.dtype:
                raise TypeError(f"kernel_fn of {name}: x1 is {x1.dtype} but x2 is {x2.dtype}")
        x1 = jnp.asarray(x1)
        x2 = None if x2 is None else jnp.asarray(x2)
        out_shape = shape_fn(tuple(x1.shape))  # raises with the layer name on incompatible shapes
        out_shapes = out_shape if isinstance(out_shape, list) else [out_shape]
        out_spatial = any(len(s) > 2 for s in out_shapes)
        full = needs_full(out_spatial) and x1.ndim > 2
        want_ntk = names is None or "ntk" in names
        n_points, entries = x1.shape[0], x1.shape[0] ** 2 * math.prod(x1.shape[1:-1]) ** (2 if full else 1)
        tile = symmetric and x2 is None and x1.ndim > 2 and not out_spatial and n_points >= 4 * _SYMMETRIC_TILES
        if tile and entries >= _SYMMETRIC_MIN_ENTRIES:
            k = _symmetric_kernel_map(kernel_map, x1, full, want_ntk, _SYMMETRIC_TILES)
        else:
            k = kernel_map(_input_kernel(x1, x2, full, want_ntk))
        if isinstance(k, list):
            return [select(ki, get) for ki in k]
        return select(k, get)

    kernel_fn.__name__ = f"kernel_fn_{name}"
    return kernel_fn


def _std_value(value):
    """A layer scale as a Python float, or unchanged when it is traced (hyperparameter fitting under grad/jit)."""
    return value if isinstance(value, jax.core.Tracer) else float(value)


def _act_param(value, name: str, layer: str):
    """An activation's parameter: a finite Python float when concrete, unchanged when traced.

    Traced values (the leaves of a hyperparameter pytree under `jax.grad` / `jit`) cannot be
    inspected; their range is the caller's business (`parametric_kernel` keeps its leaves positive).
    """
    if isinstance(value, jax.core.Tracer):
        if jnp.ndim(value) != 0:
            raise ValueError(f"{layer}: {name} must be a scalar, got a traced array of shape {jnp.shape(value)}")
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{layer}: {name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v):
        raise ValueError(f"{layer}: {name} must be finite, got {value}")
    return v


def _fmt(value) -> str:
    """A parameter in a layer's name: its value, or 'traced'."""
    return "traced" if isinstance(value, jax.core.Tracer) else repr(value)


def _check_std(value, name: str, layer: str, allow_none: bool):
    """Validate a concrete scale; traced scales (gradients w.r.t. W_std, b_std) are checked by their caller."""
    if isinstance(value, jax.core.Tracer):
        return
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{layer}: {name} must be a positive number, got None")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{layer}: {name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v):
        raise ValueError(f"{layer}: {name} must be finite, got {value}")
    if name == "W_std" and v <= 0:
        raise ValueError(f"{layer}: W_std must be positive, got {value}")
    if name == "b_std" and v < 0:
        raise ValueError(f"{layer}: b_std must be non-negative, got {value}")


def _check_parameterization(p: str, layer: str):
    if p not in ("ntk", "standard"):
        raise ValueError(f"{layer}: parameterization must be 'ntk' or 'standard', got {p!r}")


def _single_shape(shape, layer: str):
    if not (isinstance(shape, tuple) and all(isinstance(s, (int, np.integer)) for s in shape)):
        raise ValueError(f"{layer}: expected one input, got a list of {len(shape)} branches")
    if len(shape) < 2:
        raise ValueError(f"{layer}: input shape {shape} needs a batch axis and a channel axis")
    return tuple(int(s) for s in shape)


def _map_covs(k: Kernel, fn, ntk_fn=None, **changes) -> Kernel:
    """Apply ``fn(mat, batch_ndim)`` to nngp, cov1, cov2 (and ntk via ``ntk_fn``)."""
    ntk = k.ntk
    if ntk is not None and ntk_fn is not None:
        ntk = ntk_fn(ntk, 2)
    return k.replace(
        nngp=fn(k.nngp, 2),
        cov1=fn(k.cov1, 1),
        cov2=None if k.cov2 is None else fn(k.cov2, 1),
        ntk=ntk,
        **changes,
    )


# ---------------------------------------------------------------------------
# Affine layers
# ---------------------------------------------------------------------------


def Dense(
    out_dim: int,
    W_std: float = 1.0,
    b_std: float | None = None,
    parameterization: str = "ntk",
) -> Layer:
    """Fully connected layer acting on the last (channel) axis.

    ``b_std=None`` means no bias. See the module docstring for the two
    parameterisations.

    Args:
        out_dim: number of output channels (a positive int); the finite width of the layer.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        parameterization: ``'ntk'`` (default) or ``'standard'``.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping (N, ..., C_in) to (N, ..., out_dim); its parameters
        are ``(W, b)`` with ``W`` of shape (C_in, out_dim) and ``b`` of shape (out_dim,) or ``None``.

    Raises:
        ValueError: if ``out_dim`` is not a positive integer, a concrete ``W_std`` is not positive and finite,
            a concrete ``b_std`` is negative or not finite, or ``parameterization`` is unknown.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
    """
    layer = f"Dense({out_dim})"
    if not isinstance(out_dim, (int, np.integer)) or out_dim < 1:
        raise ValueError(f"Dense: out_dim must be a positive integer, got {out_dim!r}")
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    _check_parameterization(parameterization, layer)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    b_var = None if b_std is None else b_std**2

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        return shape[:-1] + (int(out_dim),)

    def init_fn(key, input_shape):
        out_shape = shape_fn(tuple(input_shape))
        fan_in = input_shape[-1]
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, (fan_in, out_dim))
        b = None if b_std is None else jax.random.normal(kb, (out_dim,))
        if parameterization == "standard":
            W = W * (W_std / math.sqrt(fan_in))
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = params
        if x.shape[-1] != W.shape[0]:
            raise ValueError(
                f"{layer}: input has {x.shape[-1]} features but W expects {W.shape[0]} (input shape {x.shape})"
            )
        out = x @ W.astype(x.dtype)
        if parameterization == "ntk":
            out = out * (W_std / math.sqrt(x.shape[-1]))
            if b is not None:
                out = out + b_std * b.astype(x.dtype)
        elif b is not None:
            out = out + b.astype(x.dtype)
        return out

    def affine(mat):
        mat = W_std**2 * mat
        return mat if b_var is None else mat + b_var

    def kernel_map(k: Kernel) -> Kernel:
        ntk = k.ntk
        nngp = affine(k.nngp)
        if ntk is not None:
            if parameterization == "ntk":
                ntk = nngp + W_std**2 * ntk
            else:
                ntk = float(k.shape1[-1]) * k.nngp + W_std**2 * ntk
                if b_var is not None:
                    ntk = ntk + 1.0
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=affine(k.cov1),
            cov2=None if k.cov2 is None else affine(k.cov2),
            shape1=shape_fn(k.shape1),
            shape2=shape_fn(k.shape2),
            is_gaussian=True,
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)


def _spatial_pads(in_sizes, window, strides, padding):
    """Per-dimension (lo, hi) zero padding for SAME/VALID, or the wrap padding for CIRCULAR."""
    if padding == "VALID":
        return [(0, 0)] * len(in_sizes)
    return [tuple(p) for p in lax.padtype_to_pads(tuple(in_sizes), tuple(window), tuple(strides), "SAME")]


def _out_sizes(in_sizes, window, strides, padding):
    pads = _spatial_pads(in_sizes, window, strides, padding)
    out = []
    for n, w, s, (lo, hi) in zip(in_sizes, window, strides, pads):
        size = (n + lo + hi - w) // s + 1
        out.append(size)
    return tuple(out)


def _pad_axes(x, axes, pads, circular: bool):
    """Pad ``x`` along ``axes`` (each with its (lo, hi)); wrap-around when circular."""
    widths = [(0, 0)] * x.ndim
    for ax, p in zip(axes, pads):
        widths[ax] = p
    if all(w == (0, 0) for w in widths):
        return x
    return jnp.pad(x, widths, mode="wrap" if circular else "constant")


def _diag_window_sum(x, axis_a, axis_b, window, stride, pad, circular, out_size):
    """sum_{d < window} x[i*s + d, j*s + d] over the pair of axes (axis_a, axis_b)."""
    x = _pad_axes(x, (axis_a, axis_b), (pad, pad), circular)
    span = stride * (out_size - 1) + 1
    total = None
    for d in range(window):
        piece = lax.slice_in_dim(x, d, d + span, stride, axis_a)
        piece = lax.slice_in_dim(piece, d, d + span, stride, axis_b)
        total = piece if total is None else total + piece
    return total


def _window_sum(x, axes, window, strides, pads, circular):
    """Box-filter sum over ``axes`` (reduce_window with zero or wrap padding)."""
    dims = [1] * x.ndim
    strd = [1] * x.ndim
    padding = [(0, 0)] * x.ndim
    for ax, w, s, p in zip(axes, window, strides, pads):
        dims[ax] = w
        strd[ax] = s
        padding[ax] = tuple(p)
    if circular:
        x = _pad_axes(x, axes, pads, True)
        padding = [(0, 0)] * x.ndim
    # Zero padding inside reduce_window: no padded copy of the kernel is written out first. The zero is a
    # concrete (numpy) scalar: under jit a jnp zero is traced, and reduce_window then falls back to its generic
    # form, which has no derivative (hyperparameter gradients through Conv and AvgPool).
    return lax.reduce_window(x, np.zeros((), x.dtype), lax.add, tuple(dims), tuple(strd), padding)


def Conv(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    W_std: float = 1.0,
    b_std: float | None = None,
    parameterization: str = "ntk",
) -> Layer:
    """Convolution over 1-D (N, W, C) or 2-D (N, H, W, C) inputs, filters (..., C_in, C_out).

    ``padding`` is 'SAME', 'VALID' or 'CIRCULAR' (periodic boundary). The fan-in
    is C_in * prod(filter_shape).

    Args:
        out_chan: number of output channels (a positive int).
        filter_shape: spatial size of the filter, 1 or 2 positive ints (one per spatial axis).
        strides: stride per spatial axis, positive ints; ``None`` means stride 1 everywhere.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        parameterization: ``'ntk'`` (default) or ``'standard'``.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping (N, *spatial, C_in) to (N, *spatial_out, out_chan);
        its parameters are ``(W, b)`` with ``W`` of shape ``filter_shape + (C_in, out_chan)``.

    Raises:
        ValueError: if ``filter_shape`` does not have 1 or 2 positive entries, ``out_chan`` is not a positive
            integer, ``strides`` does not match ``filter_shape``, ``padding`` or ``parameterization`` is
            unknown, or a concrete scale is out of range.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
    """
    filter_shape = tuple(int(f) for f in filter_shape)
    nd = len(filter_shape)
    layer = f"Conv({out_chan}, {filter_shape})"
    if nd not in (1, 2):
        raise ValueError(f"{layer}: filter_shape must have 1 or 2 entries, got {filter_shape}")
    if any(f < 1 for f in filter_shape):
        raise ValueError(f"{layer}: filter sizes must be positive, got {filter_shape}")
    if not isinstance(out_chan, (int, np.integer)) or out_chan < 1:
        raise ValueError(f"Conv: out_chan must be a positive integer, got {out_chan!r}")
    strides = (1,) * nd if strides is None else tuple(int(s) for s in strides)
    if len(strides) != nd or any(s < 1 for s in strides):
        raise ValueError(f"{layer}: strides must be {nd} positive integers, got {strides}")
    padding = str(padding).upper()
    if padding not in _PADDINGS:
        raise ValueError(f"{layer}: padding must be one of {_PADDINGS}, got {padding!r}")
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    _check_parameterization(parameterization, layer)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    b_var = None if b_std is None else b_std**2
    filter_size = math.prod(filter_shape)
    circular = padding == "CIRCULAR"
    dn = ("NWC", "WIO", "NWC") if nd == 1 else ("NHWC", "HWIO", "NHWC")

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) != nd + 2:
            raise ValueError(
                f"{layer}: a {nd}-D convolution needs inputs of rank {nd + 2} (batch, {nd} spatial, "
                f"channels), got shape {shape}"
            )
        spatial = shape[1:-1]
        if padding == "VALID" and any(n < f for n, f in zip(spatial, filter_shape)):
            raise ValueError(f"{layer}: VALID padding needs spatial size >= filter, got input shape {shape}")
        return (shape[0],) + _out_sizes(spatial, filter_shape, strides, padding) + (int(out_chan),)

    def init_fn(key, input_shape):
        out_shape = shape_fn(tuple(input_shape))
        c_in = input_shape[-1]
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, filter_shape + (c_in, out_chan))
        b = None if b_std is None else jax.random.normal(kb, (out_chan,))
        if parameterization == "standard":
            W = W * (W_std / math.sqrt(c_in * filter_size))
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = params
        if x.ndim != nd + 2:
            raise ValueError(f"{layer}: input of rank {nd + 2} expected, got shape {x.shape}")
        if x.shape[-1] != W.shape[-2]:
            raise ValueError(f"{layer}: input has {x.shape[-1]} channels but W expects {W.shape[-2]}")
        if circular:
            pads = _spatial_pads(x.shape[1:-1], filter_shape, strides, "SAME")
            x = _pad_axes(x, tuple(range(1, nd + 1)), pads, True)
        out = lax.conv_general_dilated(
            x, W.astype(x.dtype), strides, "VALID" if circular else padding, dimension_numbers=dn,
            precision=lax.Precision.HIGHEST,
        )
        if parameterization == "ntk":
            out = out * (W_std / math.sqrt(x.shape[-1] * filter_size))
            if b is not None:
                out = out + b_std * b.astype(x.dtype)
        elif b is not None:
            out = out + b.astype(x.dtype)
        return out

    def conv_moments(k: Kernel):
        spatial = k.shape1[1:-1]
        pads = _spatial_pads(spatial, filter_shape, strides, "SAME" if circular else padding)
        outs = _out_sizes(spatial, filter_shape, strides, padding)

        def op(mat, batch_ndim):
            if k.full:
                for i in range(nd):
                    a = batch_ndim + 2 * i
                    mat = _diag_window_sum(mat, a, a + 1, filter_shape[i], strides[i], pads[i], circular, outs[i])
            else:
                axes = tuple(range(batch_ndim, batch_ndim + nd))
                mat = _window_sum(mat, axes, filter_shape, strides, pads, circular)
            return mat * (1.0 / filter_size)

        return op

    def kernel_map(k: Kernel) -> Kernel:
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        op = conv_moments(k)

        def affine(mat):
            mat = W_std**2 * mat
            return mat if b_var is None else mat + b_var

        conv_nngp = op(k.nngp, 2)
        nngp = affine(conv_nngp)
        ntk = k.ntk
        if ntk is not None:
            conv_ntk = op(ntk, 2) if ntk.ndim else ntk
            if parameterization == "ntk":
                ntk = nngp + W_std**2 * conv_ntk
            else:
                fan_in = float(k.shape1[-1] * filter_size)
                ntk = fan_in * conv_nngp + W_std**2 * conv_ntk
                if b_var is not None:
                    ntk = ntk + 1.0
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=affine(op(k.cov1, 1)),
            cov2=None if k.cov2 is None else affine(op(k.cov2, 1)),
            shape1=shape_fn(k.shape1),
            shape2=shape_fn(k.shape2),
            is_gaussian=True,
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full)


# ---------------------------------------------------------------------------
# Pooling and reshaping
# ---------------------------------------------------------------------------


def AvgPool(
    window_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    normalize_edges: bool = False,
) -> Layer:
    """Average pooling over spatial windows; ``strides=None`` means stride 1.

    With 'SAME' padding the window average divides by the full window size,
    unless ``normalize_edges`` (then by the number of real pixels).

    Args:
        window_shape: pooling window per spatial axis, positive ints.
        strides: stride per spatial axis, positive ints; ``None`` means stride 1.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'``, case-insensitive.
        normalize_edges: with ``'SAME'`` padding, divide each window by its number of unpadded pixels instead
            of the window size; no effect otherwise.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping (N, *spatial, C) to
        (N, *spatial_out, C). Its kernel tracks the covariances of all pairs of positions.

    Raises:
        ValueError: if ``window_shape`` or ``strides`` are not positive integers of matching length, or
            ``padding`` is unknown.
    """
    window_shape = tuple(int(w) for w in window_shape)
    nd = len(window_shape)
    layer = f"AvgPool({window_shape})"
    strides = (1,) * nd if strides is None else tuple(int(s) for s in strides)
    if len(strides) != nd or any(s < 1 for s in strides) or any(w < 1 for w in window_shape):
        raise ValueError(f"{layer}: window and strides must be {nd} positive integers, got {window_shape}, {strides}")
    padding = str(padding).upper()
    if padding not in _PADDINGS:
        raise ValueError(f"{layer}: padding must be one of {_PADDINGS}, got {padding!r}")
    circular = padding == "CIRCULAR"
    size = math.prod(window_shape)

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) != nd + 2:
            raise ValueError(f"{layer}: needs inputs of rank {nd + 2}, got shape {shape}")
        if padding == "VALID" and any(n < w for n, w in zip(shape[1:-1], window_shape)):
            raise ValueError(f"{layer}: VALID pooling needs spatial size >= window, got {shape}")
        return (shape[0],) + _out_sizes(shape[1:-1], window_shape, strides, padding) + (shape[-1],)

    def counts(spatial, pads):
        """Number of real (unpadded) pixels in each window, per dimension."""
        res = []
        for n, w, s, (lo, hi) in zip(spatial, window_shape, strides, pads):
            ones = np.pad(np.ones(n), (lo, hi))
            n_out = (n + lo + hi - w) // s + 1
            res.append(np.array([ones[i * s : i * s + w].sum() for i in range(n_out)]))
        return res

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        spatial = x.shape[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        out = _window_sum(x, tuple(range(1, nd + 1)), window_shape, strides, pads, circular)
        if normalize_edges and padding == "SAME":
            for i, c in enumerate(counts(spatial, pads)):
                shape = [1] * out.ndim
                shape[1 + i] = c.shape[0]
                out = out / jnp.asarray(c, x.dtype).reshape(shape)
            return out
        return out * (1.0 / size)

    def kernel_map(k: Kernel) -> Kernel:
        if not k.full:  # pragma: no cover - the requirement pass guarantees full
            raise RuntimeError(f"{layer}: internal error, kernel must track all position pairs")
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        spatial = k.shape1[1:-1]
        pads = _spatial_pads(spatial, window_shape, strides, "SAME" if circular else padding)
        cnt = counts(spatial, pads) if (normalize_edges and padding == "SAME") else None

        def op(mat, batch_ndim):
            axes, win, strd, pp = [], [], [], []
            for i in range(nd):
                a = batch_ndim + 2 * i
                axes += [a, a + 1]
                win += [window_shape[i]] * 2
                strd += [strides[i]] * 2
                pp += [pads[i]] * 2
            out = _window_sum(mat, tuple(axes), win, strd, pp, circular)
            if cnt is None:
                return out * (1.0 / size**2)
            for i, c in enumerate(cnt):
                for j in (0, 1):
                    shape = [1] * out.ndim
                    shape[batch_ndim + 2 * i + j] = c.shape[0]
                    out = out / jnp.asarray(c, out.dtype).reshape(shape)
            return out

        return _map_covs(k, op, op, shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2))

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True)


def GlobalAvgPool() -> Layer:
    """Mean over all spatial positions: (N, ..., C) -> (N, C).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; its inputs need at least one spatial axis.
    """
    layer = "GlobalAvgPool"

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) < 3:
            raise ValueError(f"{layer}: needs spatial dimensions, got input shape {shape}")
        return (shape[0], shape[-1])

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        shape_fn(tuple(x.shape))
        return jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))

    def kernel_map(k: Kernel) -> Kernel:
        shapes = dict(shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2))
        return _map_covs(k, _spatial_mean, _spatial_mean, full=False, **shapes)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True)


def _spatial_mean(mat, batch_ndim: int):
    """Mean over all axes after the batch ones.

    Written as a product with a vector of 1 / count: XLA:CPU fuses that with the
    elementwise kernel map before it, where a reduction goes to a library kernel
    that first writes out every broadcast constant of that map as a full array.
    """
    flat = mat.reshape(mat.shape[:batch_ndim] + (-1,))
    return flat @ jnp.full((flat.shape[-1],), 1.0 / flat.shape[-1], flat.dtype)


def _spatial_diagonal(mat, batch_ndim: int):
    """(batch..., H, H', W, W') -> (batch..., H, W): same-position entries."""
    nd = (mat.ndim - batch_ndim) // 2
    for _ in range(nd):
        # Take the diagonal of the leading pair and move it to the end.
        mat = jnp.diagonal(mat, axis1=batch_ndim, axis2=batch_ndim + 1)
    return mat


def Flatten() -> Layer:
    """Flatten all non-batch axes: (N, H, W, C) -> (N, H*W*C).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters. Its kernel averages the same-position
        covariances over the spatial positions (the flattened channels), so it needs no position pairs.
    """
    layer = "Flatten"

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        return (shape[0], int(math.prod(shape[1:])))

    def init_fn(key, input_shape):
        return shape_fn(tuple(input_shape)), ()

    def apply_fn(params, x, **kwargs):
        return jnp.reshape(x, (x.shape[0], -1))

    def kernel_map(k: Kernel) -> Kernel:
        def op(mat, batch_ndim):
            if mat.ndim <= batch_ndim:
                return mat
            if k.full:
                mat = _spatial_diagonal(mat, batch_ndim)
            return _spatial_mean(mat, batch_ndim)

        return _map_covs(k, op, op, shape1=shape_fn(k.shape1), shape2=shape_fn(k.shape2), full=False)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: False)


def Identity() -> Layer:
    """The identity map.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters that passes inputs and kernels unchanged.
    """

    def init_fn(key, input_shape):
        return input_shape, ()

    return Layer("Identity", init_fn, lambda params, x, **kw: x, lambda s: s, lambda k: k, lambda full: full)


# ---------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------


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


def _activation(name: str, fn: Callable, moments: Callable, diag: Callable | None = None, symmetric=True) -> Layer:
    """Elementwise layer from ``moments(c, v1, v2, need_dot) -> (E[phi phi], E[phi' phi'] or None)``.

    ``diag(v) = E[phi(u)^2]`` for u ~ N(0, v), when given, is the closed form of
    ``moments(v, v, v)`` used for the batch diagonals ``cov1``/``cov2`` when they
    hold same-position variances only (dense or ``full=False``); it spares the
    general formula's transcendental functions on those entries.
    """

    def init_fn(key, input_shape):
        return input_shape, ()

    def apply_fn(params, x, **kwargs):
        return fn(x)

    def kernel_map(k: Kernel) -> Kernel:
        if not k.is_gaussian:
            raise ValueError(
                f"{name}: the input to an activation must be Gaussian, i.e. an affine layer (Dense or "
                f"Conv) must come before it; got activations of shape {k.shape1} that are not"
            )
        nngp_pair, cov1_pair, cov2_pair = _pair_variances(k)
        want_dot = k.ntk is not None
        nngp, dot = moments(k.nngp, *nngp_pair, want_dot)
        if diag is not None and (not k.full or k.spatial_ndim == 0):
            cov1 = diag(k.cov1)
            cov2 = None if k.cov2 is None else diag(k.cov2)
        else:
            cov1, _ = moments(k.cov1, *cov1_pair, False)
            cov2 = None if cov2_pair is None else moments(k.cov2, *cov2_pair, False)[0]
        ntk = None if k.ntk is None else k.ntk * dot
        return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2, is_gaussian=False)

    return Layer(name, init_fn, apply_fn, lambda s: s, kernel_map, lambda full: full, symmetric)


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
    # base + atan(n / d) = base + (n / d) (1 + z P(z) / Q(z)) with z = n^2 / d^2, as one division.
    dq = d * q
    t = (base * dq + n * (q + u * p)) / dq
    if not x_nonnegative:
        t = jnp.where(jnp.signbit(x), math.pi - t, t)
    return jnp.where(jnp.signbit(y), -t, t)


def ABRelu(a: float, b: float) -> Layer:
    """phi(x) = a min(x, 0) + b max(x, 0) (Cho & Saul 2009 arc-cosine kernel, generalised).

    With theta the angle between u and v:
    E[phi phi] = (a - b)^2 / (2 pi) sqrt(v1 v2) sin(theta) + [(a^2 + b^2)/2 - (a - b)^2 theta / (2 pi)] c,
    E[phi' phi'] = (a^2 + b^2)/2 - (a - b)^2 theta / (2 pi).

    Args:
        a: slope for negative inputs, a finite number (may be traced).
        b: slope for positive inputs, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters; it must follow an affine
        layer (`Dense` or `Conv`).

    Raises:
        TypeError: if ``a`` or ``b`` is not a number.
        ValueError: if a concrete ``a`` or ``b`` is not finite, or a traced one is not a scalar.
    """
    a, b = _act_param(a, "a", "ABRelu"), _act_param(b, "b", "ABRelu")

    def fn(x):
        return a * jnp.minimum(x, 0) + b * jnp.maximum(x, 0)

    def moments(c, v1, v2, want_dot):
        # sqrt(v1 v2 - c^2) = sqrt(v1 v2) sin(theta), written as (s - c)(s + c) so that it is
        # exactly 0 at coincident points even when XLA contracts v1 v2 - c^2 into an FMA.
        # Correlations within 16 ulps of +-1 are taken as exactly +-1 (collinear inputs):
        # beyond that the inputs' rounding cannot resolve the angle, and the square root
        # would turn last-bit noise into ~1e-8 errors and tiny negative eigenvalues.
        root = jnp.sqrt(v1 * v2)
        tol = 16 * jnp.finfo(c.dtype).eps * root
        lo, hi = root - c, root + c
        lo = jnp.where(lo <= tol, 0.0, lo)
        hi = jnp.where(hi <= tol, 0.0, hi)
        prod = lo * hi
        # Double where: sqrt's derivative at 0 is infinite, and inf * 0 would poison
        # hyperparameter gradients at coincident points; values are unchanged.
        sin_part = jnp.where(prod > 0, jnp.sqrt(jnp.where(prod > 0, prod, 1.0)), 0.0)
        theta = _atan2(sin_part, c)
        slope = (a - b) ** 2 / (2 * math.pi)
        dot = (a * a + b * b) / 2 - slope * theta
        return slope * sin_part + dot * c, (dot if want_dot else None)

    def diag(v):
        # theta = 0 on the diagonal; equal, bit for bit, to moments(v, v, v).
        return ((a * a + b * b) / 2) * v

    return _activation(f"ABRelu({_fmt(a)}, {_fmt(b)})", fn, moments, diag)


def Relu() -> Layer:
    """phi(x) = max(x, 0).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)``: `ABRelu` with ``a = 0``, ``b = 1``, named "Relu".
    """
    layer = ABRelu(0.0, 1.0)
    layer.name = "Relu"
    return layer


def LeakyRelu(alpha: float) -> Layer:
    """phi(x) = x for x > 0, alpha x otherwise.

    Args:
        alpha: slope for negative inputs, a finite number (may be traced).

    Returns:
        Elementwise `Layer` ``(init_fn, apply_fn, kernel_fn)``: `ABRelu` with ``a = alpha``, ``b = 1``.

    Raises:
        TypeError: if ``alpha`` is not a number.
        ValueError: if a concrete ``alpha`` is not finite.
    """
    layer = ABRelu(_act_param(alpha, "alpha", "LeakyRelu"), 1.0)
    layer.name = f"LeakyRelu({_fmt(alpha)})"
    return layer


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

    return _activation(f"Erf({_fmt(a)}, {_fmt(b)}, {_fmt(shift)})", fn, moments, diag)


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

    return _activation("Gelu", fn, moments)


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

    return _activation(f"Sin({_fmt(a)}, {_fmt(b)}, {_fmt(phase)})", fn, moments)


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

    return _activation(f"Gaussian({_fmt(a)}, {_fmt(b)})", fn, moments)


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
    nodes, weights = np.polynomial.hermite.hermgauss(int(deg))
    dfn = df if df is not None else jnp.vectorize(jax.grad(fn))

    def integrate(f, c, v1, v2):
        dtype = c.dtype
        x = jnp.asarray(nodes, dtype)
        w = jnp.asarray(weights, dtype)
        c, v1, v2 = jnp.broadcast_arrays(c, v1, v2)
        safe_v1 = jnp.maximum(v1, jnp.finfo(dtype).tiny)
        scale_u = jnp.sqrt(2 * v1)
        slope = c * jnp.sqrt(2 / safe_v1)
        rest = _safe_sqrt(2 * (v2 - c * c / safe_v1))[..., None]

        # One outer node at a time keeps memory at (entries x deg), not deg^2.
        def body(acc, node):
            xi, wi = node
            inner = f((slope * xi)[..., None] + rest * x) @ w
            return acc + wi * f(scale_u * xi) * inner, None

        total, _ = lax.scan(body, jnp.zeros_like(c), (x, w))
        return total / math.pi

    def moments(c, v1, v2, want_dot):
        val = integrate(fn, c, v1, v2)
        dot = integrate(dfn, c, v1, v2) if want_dot else None
        return val, dot

    name = getattr(fn, "__name__", "fn")
    return _activation(f"ElementwiseNumerical({name}, deg={deg})", fn, moments, symmetric=False)


# ---------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------


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

    def kernel_map(k):
        for l in layers:
            k = l.kernel_map(k)
        return k

    def needs_full(full):
        for l in reversed(layers):
            full = l.needs_full(full)
        return full

    return Layer(name, init_fn, apply_fn, shape_fn, kernel_map, needs_full, all(l.symmetric for l in layers))


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

    def kernel_map(ks):
        _check_branches(ks, n, "parallel")
        return [l.kernel_map(k) for l, k in zip(layers, ks)]

    def needs_full(full):
        return any(l.needs_full(full) for l in layers)

    return Layer(name, init_fn, apply_fn, shape_fn, kernel_map, needs_full, all(l.symmetric for l in layers))


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


# ---------------------------------------------------------------------------
# Hyperparameters as a pytree
# ---------------------------------------------------------------------------


def parametric_kernel(arch: Callable, init, *, floor=0.0) -> ParametricKernel:
    """The NNGP of an architecture whose scales are a pytree, as a `smnngp.kernels.ParametricKernel`.

    ``arch(params) -> Layer`` builds the architecture from a pytree ``params`` of
    positive scales (``W_std``, ``b_std`` of each layer, activation parameters
    such as ``ABRelu``'s slopes), e.g.::

        def arch(p):
            return stax.serial(stax.Conv(1, (3, 3), padding='SAME', W_std=p['conv'], b_std=p['b']), stax.Relu(),
                               stax.AvgPool((2, 2), (2, 2)), stax.Flatten(), stax.Dense(1, W_std=p['out']))

        kernel = stax.parametric_kernel(arch, {'conv': 1.5, 'b': 0.1, 'out': 1.0})

    ``init`` has the structure of ``params`` and holds their starting values.
    Each leaf is ``value = floor + exp(theta)`` of an unconstrained ``theta``
    (so that gradient steps on ``theta`` are relative changes of the value);
    ``floor`` is one number or a pytree like ``init`` (default 0), and every
    initial value must exceed its floor. The kernel is

        ``apply(theta, x1, x2) = arch(floor + exp(theta))[2](x1, x2, 'nngp')``,

    ``jit``-able and differentiable in ``theta``: every layer constructor takes
    traced scales and checks its arguments only when they are concrete.
    Parameters that may be zero or negative (a LeakyRelu slope, an Erf shift)
    are not leaves of ``params``: close over them in ``arch`` to keep them
    fixed. The scales are cast to the inputs' dtype, so the kernel computes in
    the dtype of ``x1``. ``constrain(theta)`` returns the values (the
    structure of ``init``).
    """
    if not callable(arch):
        raise TypeError(f"parametric_kernel: arch must be callable (params -> stax layer), got {type(arch).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten(init)
    if not leaves:
        raise ValueError("parametric_kernel: init has no leaves; give the starting value of each scale")
    floors = _broadcast_floor(floor, init, treedef)
    theta_leaves = []
    for path, value, lo in zip(_leaf_paths(init), leaves, floors):
        v = np.asarray(value, dtype=float)
        if v.ndim != 0:
            raise ValueError(f"parametric_kernel: init{path} must be a scalar, got shape {v.shape}")
        v = float(v)
        if not (math.isfinite(v) and v > lo):
            raise ValueError(f"parametric_kernel: init{path} = {value!r} must be finite and above its floor {lo}")
        theta_leaves.append(jnp.asarray(math.log(v - lo)))
    theta = jax.tree_util.tree_unflatten(treedef, theta_leaves)
    apply, constrain = _stax_nngp(arch, treedef, tuple(floors))
    layer = arch(init)  # fails here, with the layer's own message, on an architecture its init cannot build
    _as_layer(layer, "parametric_kernel: arch(init)")
    return ParametricKernel(apply, theta, constrain)


def _leaf_paths(tree):
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _broadcast_floor(floor, init, treedef):
    if isinstance(floor, (int, float, np.integer, np.floating)):
        floors = [float(floor)] * treedef.num_leaves
    else:
        try:
            floors = [float(f) for f in treedef.flatten_up_to(floor)]
        except (ValueError, TypeError) as e:
            raise ValueError(f"parametric_kernel: floor must be a number or a pytree like init: {e}") from None
    if any(not (math.isfinite(f) and f >= 0) for f in floors):
        raise ValueError(f"parametric_kernel: floors must be finite and non-negative, got {floors}")
    return floors


@functools.lru_cache(maxsize=128)
def _stax_nngp(arch, treedef, floors):
    """``(apply, constrain)`` for one architecture and parameter structure.

    Cached, so that kernels built from the same ``arch`` share one ``apply``
    function object, and with it every compilation keyed on it (`jit`'s cache,
    the step functions of `smnngp.hyper`).
    """

    def constrain(theta):
        leaves = treedef.flatten_up_to(theta)
        return jax.tree_util.tree_unflatten(treedef, [lo + jnp.exp(t) for t, lo in zip(leaves, floors)])

    def apply(theta, x1, x2=None):
        dtype = jnp.result_type(x1)
        params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), constrain(theta))
        return arch(params)[2](x1, x2, "nngp")

    apply.__name__ = f"nngp_of_{getattr(arch, '__name__', 'arch')}"
    return apply, constrain
