"""Combinators: `serial`, `repeat`, `parallel`, `FanOut`, `FanInSum`, `FanInProd`, `FanInConcat`, `Identity`.

A PRNG key passed to a composite ``apply_fn`` as ``rng=`` (what `Dropout` in train mode needs) is split
among the layers as in ``jax.example_libraries.stax``: `serial` and `parallel` give layer i the i-th key of
``jax.random.split(rng, n_layers)``, `repeat` the i-th of ``jax.random.split(rng, n)``.
"""

from __future__ import annotations

import functools
import operator
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import (
    Layer,
    _as_layer,
    _single_shape,
    first_layout,
)

# ---------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------

__all__ = ["serial", "repeat", "parallel", "FanOut", "FanInSum", "FanInProd", "FanInConcat", "Identity"]


def _split_rng(kwargs, n: int):
    """``n`` keyword dicts, one per layer: ``rng`` (when given) split into ``n`` keys, the rest shared."""
    rng = kwargs.get("rng")
    if rng is None:
        return [kwargs] * n
    rest = {k: v for k, v in kwargs.items() if k != "rng"}
    return [dict(rest, rng=r) for r in jax.random.split(rng, n)]


def serial(*layers) -> Layer:
    """Compose layers left to right: f = f_n o ... o f_1, and the kernel maps in the same order.

    ``apply_fn(params, x, rng=key)`` gives layer i the i-th key of ``jax.random.split(key, len(layers))``.

    Args:
        *layers: one or more `Layer` objects built by this module; the output of each feeds the next.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` of the composition; its parameters are the list of the
        layers' parameters (``apply_fn`` takes any sequence), layer i's drawn with the second key of the i-th
        ``key, layer_key = jax.random.split(key)``: neural-tangents' structure and keys.

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
        # neural-tangents' keys (those of jax.example_libraries.stax.serial): before each layer,
        # key, layer_key = split(key), so that prefixes of a network draw the same parameters.
        params = []
        shape = input_shape
        for l in layers:
            key, layer_key = jax.random.split(key)
            shape, p = l[0](layer_key, shape)
            params.append(p)
        return shape, params

    def apply_fn(params, x, **kwargs):
        if len(params) != len(layers):
            raise ValueError(f"serial: got {len(params)} parameter groups for {len(layers)} layers")
        for l, p, kw in zip(layers, params, _split_rng(kwargs, len(layers))):
            x = l[1](p, x, **kw)
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
        all(l.symmetric for l in layers), first_layout(layers), masking.COMPOSITE, means="composite",
    )


def repeat(layer: Layer, n: int) -> Layer:
    """Apply ``layer`` ``n`` times in a compiled loop: the network of ``serial(*[layer] * n)``.

    The ``n`` copies have independent parameters, stacked along a leading axis of length ``n`` (copy i drawn
    by ``layer``'s ``init_fn`` with the second key of the i-th ``key, layer_key = jax.random.split(key)``, as
    neural-tangents draws them); ``apply_fn`` and ``kernel_fn`` run as one `lax.scan` over the copies, so
    compilation time does not grow with ``n``. The kernel is K_n = T^n(K_0), T the kernel map of ``layer``.
    The layer must keep the shape of its activations. ``apply_fn(params, x, rng=key)`` gives copy i the i-th
    key of ``jax.random.split(key, n)``. When one application of ``layer`` changes what a `Kernel` holds
    beyond its values (whether it is Gaussian, its shapes), the kernel loop is unrolled instead: the
    numbers are the same.

    Args:
        layer: the `Layer` to repeat; its output shape must equal its input shape.
        n: number of applications, a non-negative int (0 gives the identity).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)``; its parameters are those of ``layer`` with a leading axis
        of length ``n`` on every array.

    Raises:
        TypeError: if ``layer`` is not a `Layer` of this module.
        ValueError: if ``n`` is not a non-negative integer; from ``init_fn`` / ``kernel_fn`` when ``layer``
            changes the shape of its input.
    """
    layer = _as_layer(layer, "repeat")
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise ValueError(f"repeat: n must be a non-negative integer, got {n!r}")
    n = int(n)
    name = f"repeat({layer.name}, {n})"
    inner_init, inner_apply = layer[0], layer[1]

    def shape_fn(shape):
        out = layer.shape_fn(shape)
        if n and out != shape:
            raise ValueError(
                f"{name}: the layer maps shape {shape} to {out}; repeat needs the output shape to equal the "
                f"input shape (use serial(*[layer] * n) instead)"
            )
        return shape

    def init_fn(key, input_shape):
        input_shape = shape_fn(tuple(input_shape) if not _is_shape_list(input_shape) else input_shape)

        # neural-tangents' keys: copy i draws with the second key of the i-th key, layer_key = split(key).
        def draw(carry, _):
            carry, layer_key = jax.random.split(carry)
            return carry, inner_init(layer_key, input_shape)[1]

        _, params = jax.lax.scan(draw, key, None, length=n)
        return input_shape, params

    def apply_fn(params, x, **kwargs):
        if n == 0:
            return x
        rng = kwargs.pop("rng", None)
        keys = None if rng is None else jax.random.split(rng, n)

        def step(h, inputs):
            p, key = inputs
            kw = kwargs if key is None else dict(kwargs, rng=key)
            return inner_apply(p, h, **kw), None

        out, _ = jax.lax.scan(step, x, (params, keys), length=n)  # length: a layer without parameters
        return out

    def kernel_map(k, **kwargs):
        if n == 0:
            return k
        shape_fn(k.shape1)
        # The loop carries means but not the Gaussian a chain of activations reads (`smnngp.stax._flow`): a
        # kernel per step that later fan-ins rarely need.
        k = _flow.without_chain(layer.kernel_map(k, **kwargs))
        try:
            k, _ = jax.lax.scan(lambda c, _: (_flow.without_chain(layer.kernel_map(c, **kwargs)), None), k, None,
                                length=n - 1)
        except TypeError:
            # The carry changed type (metadata or shapes): unroll, which computes the same composition.
            for _ in range(n - 1):
                k = _flow.without_chain(layer.kernel_map(k, **kwargs))
        return k

    def needs_full(full):
        for _ in range(n):
            full = layer.needs_full(full)
        return full

    return Layer(name, init_fn, apply_fn, shape_fn, kernel_map, needs_full, layer.symmetric, layer.layout,
                 masking.COMPOSITE, means="composite")


def _check_branches(obj, n: int, layer: str):
    if not isinstance(obj, (list, tuple)) or (n and len(obj) != n):
        got = f"{len(obj)} inputs" if isinstance(obj, (list, tuple)) else type(obj).__name__
        raise ValueError(f"{layer}: expected a list of {n or 'several'} branches, got {got}")


def _is_shape_list(shape) -> bool:
    return isinstance(shape, list) or (isinstance(shape, tuple) and shape and isinstance(shape[0], tuple))


def parallel(*layers) -> Layer:
    """Apply the i-th layer to the i-th input of a list (after `FanOut`).

    ``apply_fn(params, xs, rng=key)`` gives layer i the i-th key of ``jax.random.split(key, len(layers))``.

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
        return [l[1](p, x, **kw) for l, p, x, kw in zip(layers, params, xs, _split_rng(kwargs, n))]

    def kernel_map(ks, **kwargs):
        _check_branches(ks, n, "parallel")
        return [l.kernel_map(k, **kwargs) for l, k in zip(layers, ks)]

    def needs_full(full):
        return any(l.needs_full(full) for l in layers)

    return Layer(
        name, init_fn, apply_fn, shape_fn, kernel_map, needs_full,
        all(l.symmetric for l in layers), first_layout(layers), masking.COMPOSITE, means="composite",
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

    token = object()  # names this fan-out in the branches' flows (shared sources, `smnngp.stax._flow`)

    def kernel_map(k):
        return [_flow.attach(k.replace(), f) for f in _flow.fan_out(_flow.of(k), k, token, num)]

    return Layer(layer, init_fn, lambda p, x, **kw: [x] * num, shape_fn, kernel_map, lambda full: full,
                 masking=masking.COMPOSITE, means="composite")


def _branch_shapes(shapes, layer):
    if not _is_shape_list(shapes):
        raise ValueError(f"{layer}: expects a list of branches (after FanOut/parallel), got one input {shapes}")
    return [tuple(s) for s in shapes]


def _elementwise_fan_in(layer: str, op):
    """``(shape_fn, init_fn, apply_fn)`` of a fan-in combining branches of one shape elementwise with ``op``."""

    def shape_fn(shapes):
        shapes = _branch_shapes(shapes, layer)
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"{layer}: branch shapes differ: {shapes}")
        return shapes[0]

    def init_fn(key, input_shapes):
        return shape_fn(list(input_shapes)), ()

    def apply_fn(params, xs, **kwargs):
        shape_fn([tuple(x.shape) for x in xs])
        return functools.reduce(op, xs)

    return shape_fn, init_fn, apply_fn


def FanInSum() -> Layer:
    """Sum the branches (residual connections); all branch shapes must agree.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping a list of branches to their sum;
        its kernels are the sums of the branch kernels.
    """
    layer = "FanInSum"

    shape_fn, init_fn, apply_fn = _elementwise_fan_in(layer, operator.add)

    def kernel_map(ks):
        shape_fn([k.shape1 for k in ks])
        flows = _flow.of(ks)
        # E[(sum_b f_b)(sum_c f_c')] = sum_b K_b + sum_{b != c} E[f_b f_c']. For independent branches the cross
        # moment is m_b m_c' (the means of branches that end with an activation are not zero) and the NTK has no
        # cross terms (their gradients are orthogonal in the limit); for two functions of one Gaussian u it is
        # E[psi_b(u) psi_c(u')], NTK E[psi_b'(u) psi_c'(u')] Theta_u (quadrature).
        pairs = _flow.dependent_pairs(flows, layer)
        cross = _flow.mean_products(flows, ks, layer, skip=pairs)
        extra = {"nngp": [], "ntk": [], "cov1": [], "cov2": []}
        if cross is not None:
            for name, term in zip(("nngp", "cov1", "cov2"), cross):
                extra[name].append(term)
        for b, c in pairs:
            for name, term in zip(("nngp", "ntk", "cov1", "cov2"),
                                  _flow.joint_terms(flows[b], flows[c], ks[0].ntk is not None)):
                extra[name].append(term)

        def total(attr):
            vals = [getattr(k, attr) for k in ks]
            if any(v is None for v in vals):
                return None
            return functools.reduce(operator.add, vals + [t for t in extra[attr] if t is not None])

        return ks[0].replace(
            nngp=total("nngp"),
            ntk=total("ntk"),
            cov1=total("cov1"),
            cov2=total("cov2"),
            is_gaussian=all(k.is_gaussian for k in ks) and not pairs,
        )

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full,
                 masking=masking.MaskRule(_and_masks), means=lambda flows, k, out, name: _flow.summed(flows))


def FanInProd() -> Layer:
    """Multiply the branches elementwise; all branch shapes must agree.

    Kernel of independent branches f_1, ..., f_m (each with at least one affine layer of its own):

        K'   = prod_i K_i,
        NTK' = sum_i NTK_i prod_{j != i} K_j,

    (the product rule: the gradient of prod_i f_i is sum_i (prod_{j != i} f_j) grad f_i), and the same
    products for the variances cov1, cov2. The product of two or more branches is not Gaussian.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping a list of branches to their
        elementwise product.

    Raises:
        ValueError: (from ``init_fn``, ``apply_fn`` or ``kernel_fn``) if the branch shapes differ.
    """
    layer = "FanInProd"

    shape_fn, init_fn, apply_fn = _elementwise_fan_in(layer, operator.mul)

    def kernel_map(ks):
        shape_fn([k.shape1 for k in ks])
        shape_fn([k.shape2 for k in ks])
        flows = _flow.of(ks)
        # Branches that are functions of one Gaussian multiply into one function of it (quadrature); the
        # groups are independent of one another.
        parts = _flow.groups(len(ks), _flow.dependent_pairs(flows, layer))
        if len(parts) < len(ks):
            want_ntk = all(k.ntk is not None for k in ks)
            merged, merged_flows = [], []
            for g in parts:
                if len(g) == 1:
                    merged.append(ks[g[0]])
                    merged_flows.append(flows[g[0]])
                    continue
                nngp_g, ntk_g, cov1_g, cov2_g, m1, m2, chain = _flow.product_terms([flows[i] for i in g],
                                                                                   want_ntk)
                merged.append(_flow.attach(
                    ks[g[0]].replace(nngp=nngp_g, ntk=ntk_g, cov1=cov1_g, cov2=cov2_g, is_gaussian=False),
                    _flow.Flow("known", m1, m2, True, _flow.merged_labels([flows[i] for i in g]), chain=chain,
                               base=flows[g[0]].base)))
                merged_flows.append(_flow.of(merged[-1]))
            ks, flows = merged, merged_flows
        data = [i for i, f in enumerate(flows) if not f.exchangeable]
        if len(data) > 1:
            raise NotImplementedError(
                f"{layer}: branches {data[0]} and {data[1]} both carry input data (no affine layer since the "
                f"input); the channel average of their product is not the product of their averages. Put an "
                f"affine layer on one")
        nngp, ntk = ks[0].nngp, ks[0].ntk
        for k in ks[1:]:
            # (prod_{<i} K) NTK_i + NTK_{<i} K_i: the product rule, one branch at a time.
            ntk = None if ntk is None or k.ntk is None else ntk * k.nngp + nngp * k.ntk
            nngp = nngp * k.nngp
        cov2 = None if any(k.cov2 is None for k in ks) else functools.reduce(operator.mul, [k.cov2 for k in ks])
        return _flow.attach(ks[0].replace(
            nngp=nngp,
            ntk=ntk,
            cov1=functools.reduce(operator.mul, [k.cov1 for k in ks]),
            cov2=cov2,
            is_gaussian=len(ks) == 1 and ks[0].is_gaussian,
        ), _flow.multiplied(flows))

    def means(flows, ks, out, name):
        # the map's own flow (dependent branches multiplied first); masks rebuild the kernel without it
        own = getattr(out, "_flow", None)
        return own if own is not None else _flow.unknown(f"{layer} of masked inputs", _flow.merged_labels(flows))

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full,
                 masking=masking.MaskRule(_and_masks), means=means)


def _block_concat(mats, first_axis: int):
    """Covariances of concatenated independent blocks along a position pair (first_axis, first_axis + 1).

    Block (i, j) of the result is ``mats[i]`` when i == j and zero otherwise (independent branches).
    """
    sizes = [m.shape[first_axis] for m in mats]
    rows = []
    for i, m in enumerate(mats):
        pads = [(0, 0)] * m.ndim
        pads[first_axis] = (sum(sizes[:i]), sum(sizes[i + 1:]))
        rows.append(jnp.pad(m, pads))
    return jnp.concatenate(rows, axis=first_axis + 1)


def FanInConcat(axis: int = -1) -> Layer:
    """Concatenate the branches along ``axis`` (kernel axes in the canonical layout: batch first, channels last).

    Kernels of independent branches with channel widths C_i:

    * channel axis: the channel average of the concatenation is the width-weighted average
      K' = sum_i C_i K_i / sum_i C_i (the same for NTK, cov1, cov2). A concatenation of independent
      Gaussian branches is Gaussian, so the output keeps ``is_gaussian`` of its branches.
    * spatial axis s: positions of branch i and branch j != i are independent, so the kernel over the
      concatenated positions is block diagonal, K'(p in block i, p' in block j) = K_i(p, p') if i == j
      else 0 (with same-position covariances only, K' is the concatenation of the K_i along s). This needs
      every branch to be Gaussian (mean zero); otherwise the cross-branch products do not vanish.
    * batch axis: the points of the branches are stacked; cross-branch entries of the NNGP / NTK are 0
      (the same rule as a spatial axis) and the variances are concatenated. A warning says that such a
      kernel depends on how the inputs are batched.

    Args:
        axis: axis along which the branch outputs are concatenated (default -1, the channels).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters, mapping a list of branches to one array.

    Raises:
        TypeError: if ``axis`` is not an int.
        ValueError: (from ``init_fn``, ``apply_fn`` or ``kernel_fn``) if the branches differ in rank or
            outside ``axis``, or ``axis`` is out of range.
        NotImplementedError: from ``kernel_fn`` when ``axis`` is not the channel axis and a branch is not
            Gaussian (no affine layer at its end).
    """
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"FanInConcat: axis must be an int, got {axis!r}")
    axis = int(axis)
    layer = f"FanInConcat(axis={axis})"

    def shape_fn(shapes):
        shapes = _branch_shapes(shapes, layer)
        ndim = len(shapes[0])
        if not -ndim <= axis < ndim:
            raise ValueError(f"{layer}: axis {axis} is out of range for branches of rank {ndim}")
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

    def channel_mix(ks, out1, out2):
        widths = [float(k.shape1[-1]) for k in ks]
        total_w = sum(widths)

        def mix(attr):
            vals = [getattr(k, attr) for k in ks]
            if any(v is None for v in vals):
                return None
            return functools.reduce(operator.add, [v * (w / total_w) for v, w in zip(vals, widths)])

        return ks[0].replace(nngp=mix("nngp"), ntk=mix("ntk"), cov1=mix("cov1"), cov2=mix("cov2"),
                             shape1=out1, shape2=out2, is_gaussian=all(k.is_gaussian for k in ks))

    def kernel_map(ks):
        out1 = shape_fn([k.shape1 for k in ks])
        out2 = shape_fn([k.shape2 for k in ks])
        ndim = len(out1)
        ax = axis % ndim
        if ax == ndim - 1:
            return channel_mix(ks, out1, out2)
        if _flow.dependent_pairs(_flow.of(ks), layer):
            raise NotImplementedError(
                f"{layer}: concatenating functions of the same activations along a non-channel axis is not "
                f"supported (their cross-position moments are not zero); give each branch an affine layer")
        if not all(k.is_gaussian for k in ks):
            raise NotImplementedError(
                f"{layer}: concatenation along a non-channel axis is implemented for Gaussian (mean-zero) "
                f"branches only; end every branch with an affine layer (Dense, Conv)"
            )
        full = ks[0].full

        def ntks():
            if any(k.ntk is None for k in ks):
                return None
            return [k.ntk if k.ntk.ndim else jnp.broadcast_to(k.ntk, k.nngp.shape) for k in ks]

        if ax == 0:
            warnings.warn(f"{layer}: concatenating along the batch axis gives a kernel that depends on how the "
                          f"inputs are batched", stacklevel=2)

            def cross(mats):
                return None if mats is None else _block_concat(mats, 0)

            def own(mats):
                return None if any(m is None for m in mats) else jnp.concatenate(mats, axis=0)
        elif full:
            # Spatial axis s (1-based) holds the position pair (2s, 2s + 1) in nngp, (2s - 1, 2s) in cov1.
            def cross(mats):
                return None if mats is None else _block_concat(mats, 2 * ax)

            def own(mats):
                return None if any(m is None for m in mats) else _block_concat(mats, 2 * ax - 1)
        else:
            def cross(mats):
                return None if mats is None else jnp.concatenate(mats, axis=ax + 1)

            def own(mats):
                return None if any(m is None for m in mats) else jnp.concatenate(mats, axis=ax)

        return Kernel(cross([k.nngp for k in ks]), cross(ntks()), own([k.cov1 for k in ks]),
                      own([k.cov2 for k in ks]), x1_is_x2=ks[0].x1_is_x2, shape1=out1, shape2=out2, full=full,
                      is_gaussian=True)

    def means(flows, ks, out, name):
        labels = _flow.merged_labels(flows)
        if all(f.status == "zero" for f in flows):
            return _flow.Flow("zero", labels=labels)
        bad = next((f for f in flows if f.status == "unknown"), None)
        if bad is not None:
            return _flow.unknown(bad.why, labels)

        def zeros(k, shape):
            return jnp.zeros(shape[:-1], k.nngp.dtype)

        m1 = [f.mean1 if f.status == "known" else zeros(k, k.shape1) for f, k in zip(flows, ks)]
        has2 = ks[0].cov2 is not None
        m2 = None if not has2 else [(f.mean1 if f.mean2 is None else f.mean2) if f.status == "known"
                                    else zeros(k, k.shape2) for f, k in zip(flows, ks)]
        ndim = len(ks[0].shape1)
        if axis % ndim == ndim - 1:  # channels: the width-weighted average; channels of different branches differ
            w = [float(k.shape1[-1]) for k in ks]

            def mix(ms):
                return None if ms is None else functools.reduce(
                    operator.add, [m * (wi / sum(w)) for m, wi in zip(ms, w)])

            return _flow.Flow("known", mix(m1), mix(m2), False, labels)

        def cat(ms):
            return None if ms is None else jnp.concatenate(ms, axis=axis % ndim)

        return _flow.Flow("known", cat(m1), cat(m2), all(f.exchangeable for f in flows), labels)

    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: full,
                 masking=masking.MaskRule(lambda ms, shapes: _concat_masks(ms, shapes, axis)), means=means)


def _and_masks(masks, shapes):
    """Mask of a sum or product of branches: an entry is masked when it is masked in every branch that has a
    mask (branches without one do not mask)."""
    present = [m for m in masks if m is not None]
    return None if not present else functools.reduce(operator.and_, present)


def _concat_masks(masks, shapes, axis: int):
    """Mask of a concatenation along ``axis``: the branch masks, each stretched to its branch's size along
    ``axis`` and broadcast to a common size elsewhere (all False for a branch without a mask)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    ndim = len(shapes[0])
    ax = axis % ndim
    common = [max(m.shape[i] for m in present) for i in range(ndim)]
    parts = []
    for m, s in zip(masks, shapes):
        target = tuple(s[ax] if i == ax else common[i] for i in range(ndim))
        parts.append(jnp.zeros(target, bool) if m is None else jnp.broadcast_to(m, target))
    return jnp.concatenate(parts, axis=ax)


def Identity() -> Layer:
    """The identity map.

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` without parameters that passes inputs and kernels unchanged.
    """

    def init_fn(key, input_shape):
        return input_shape, ()

    return Layer("Identity", init_fn, lambda params, x, **kw: x, lambda s: s, lambda k: k, lambda full: full,
                 masking=masking.MaskRule(), means=_flow.PASS)
