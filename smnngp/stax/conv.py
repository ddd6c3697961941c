"""Convolutions: `Conv`, `ConvTranspose` and `ConvLocal` over any number of spatial dimensions.

All three share neural-tangents' signature ``(out_chan, filter_shape, strides=None, padding='VALID',
W_std=1.0, b_std=None, dimension_numbers=None, parameterization='ntk', s=(1, 1))``. The finite network
works in the layout ``dimension_numbers = (lhs_spec, rhs_spec, out_spec)`` names (as
`jax.lax.conv_general_dilated`: ``'N'``/``'C'`` batch and channels of the activations, ``'I'``/``'O'``
input and output channels of the filter, any other letter a spatial dimension; ``filter_shape`` and
``strides`` follow the order of the spatial letters in ``rhs_spec``); the kernels are held in the canonical
layout (batch first, channels last, spatial axes in the order of ``lhs_spec``) and their spatial axes are
reordered after the layer when ``out_spec`` orders them differently.

Kernel maps, per spatial dimension, with F the filter window, |F| its size, s the stride, p the low padding
and K the input covariance of positions (i, j) (both points' positions shifted together):

* `Conv` (shared weights): K'(i, j) = W_std^2 / |F| sum_{d in F} K(s i + d - p, s j + d - p) + b_std^2,
  zero outside the input for 'SAME' / 'VALID', wrapped around for 'CIRCULAR';
* `ConvTranspose`: the same sum over the input dilated by s (s - 1 zeros between positions) and padded as
  `jax.lax.conv_transpose` pads it, with stride 1; 'CIRCULAR' folds the 'VALID' output back periodically
  onto the 'SAME' output size, K' = P K_valid P^T with P the 0/1 folding matrix of each dimension;
* `ConvLocal` (unshared weights and biases): the weights of different output positions are independent,
  so K'(i, j) = 0 for i != j and K'(i, i) is the `Conv` formula on same-position entries only.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import (
    _PADDINGS,
    Layer,
    _check_parameterization,
    _check_std,
    _diag_window_sum,
    _out_sizes,
    _pad_axes,
    _single_shape,
    _spatial_diagonal,
    _spatial_pads,
    _std_value,
    _window_sum,
    padding_name,
)
from smnngp.stax.linear import _affine_scale, _bias, _check_s, _unpack_params

__all__ = ["Conv", "ConvTranspose", "ConvLocal"]

_DEFAULT_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


# ---------------------------------------------------------------------------
# Arguments shared by the three convolutions
# ---------------------------------------------------------------------------


class _Spec:
    """Parsed, validated arguments of a convolution (static Python values only)."""

    def __init__(self, kind, out_chan, filter_shape, strides, padding, dimension_numbers, parameterization, s):
        self.kind = kind
        try:
            filter_shape = tuple(filter_shape)
        except TypeError:
            raise ValueError(f"{kind}: filter_shape must be a sequence of positive integers, got "
                             f"{filter_shape!r}") from None
        # An empty filter_shape is a 0-D convolution of (batch, channels) inputs: the affine map of `Dense`.
        if not all(isinstance(f, (int, np.integer)) and not isinstance(f, bool) for f in filter_shape):
            raise ValueError(f"{kind}: filter_shape must be a sequence of positive integers, got "
                             f"{filter_shape!r}")
        self.filter_shape = tuple(int(f) for f in filter_shape)
        nd = self.nd = len(self.filter_shape)
        self.name = f"{kind}({out_chan}, {self.filter_shape})"
        if any(f < 1 for f in self.filter_shape):
            raise ValueError(f"{self.name}: filter sizes must be positive, got {self.filter_shape}")
        if not isinstance(out_chan, (int, np.integer)) or isinstance(out_chan, bool) or out_chan < 1:
            raise ValueError(f"{kind}: out_chan must be a positive integer, got {out_chan!r}")
        strides = (1,) * nd if strides is None else tuple(strides)
        if len(strides) != nd or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in strides):
            raise ValueError(f"{self.name}: strides must be {nd} positive integers (one per filter dimension), "
                             f"got {strides}")
        self.strides = tuple(int(v) for v in strides)
        self.padding = padding_name(padding)
        if self.padding not in _PADDINGS:
            raise ValueError(f"{self.name}: padding must be one of {_PADDINGS}, got {padding!r}")
        self.circular = self.padding == "CIRCULAR"
        if isinstance(parameterization, str):
            parameterization = parameterization.lower()
        _check_parameterization(parameterization, self.name)
        self.standard = parameterization == "standard"
        self.s_in, s_out = _check_s(s, self.name)
        self.width = int(out_chan) * (s_out if self.standard else 1)
        self._parse_dimension_numbers(dimension_numbers)

    def _parse_dimension_numbers(self, dimension_numbers):
        nd = self.nd
        if dimension_numbers is None:
            sp = _DEFAULT_SPATIAL.get(nd) or "".join(c for c in string.ascii_uppercase if c not in "NCIO")[:nd]
            dimension_numbers = ("N" + sp + "C", sp + "IO", "N" + sp + "C")
        try:
            lhs, rhs, out = (str(d) for d in dimension_numbers)
            if len(tuple(dimension_numbers)) != 3:
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError(f"{self.name}: dimension_numbers must be three strings (lhs_spec, rhs_spec, "
                             f"out_spec), got {dimension_numbers!r}") from None
        for label, spec, special in (("lhs_spec", lhs, "NC"), ("rhs_spec", rhs, "IO"), ("out_spec", out, "NC")):
            if len(spec) != nd + 2 or len(set(spec)) != len(spec) or not set(special) <= set(spec):
                raise ValueError(
                    f"{self.name}: dimension_numbers {label} {spec!r} must name {nd + 2} distinct axes, among "
                    f"them '{special[0]}' and '{special[1]}' and {nd} spatial ones (one per filter dimension)")
        self.in_sp = [c for c in lhs if c not in "NC"]
        r_sp = [c for c in rhs if c not in "IO"]
        self.out_sp = [c for c in out if c not in "NC"]
        if set(self.in_sp) != set(r_sp) or set(self.in_sp) != set(self.out_sp):
            raise ValueError(f"{self.name}: dimension_numbers {(lhs, rhs, out)} must use the same spatial letters "
                             f"in lhs_spec, rhs_spec and out_spec")
        self.dn = (lhs, rhs, out)
        self.r_sp = r_sp
        # filter_shape and strides follow rhs_spec (as in lax); the kernel works in lhs order.
        self.f_in = tuple(self.filter_shape[r_sp.index(c)] for c in self.in_sp)
        self.st_in = tuple(self.strides[r_sp.index(c)] for c in self.in_sp)
        self.perm_out = tuple(self.in_sp.index(c) for c in self.out_sp)
        self.layout = None if (lhs[0], lhs[-1]) == ("N", "C") else (lhs.index("N"), lhs.index("C"))
        self.filter_size = math.prod(self.filter_shape)

    # -- shapes -------------------------------------------------------------
    def check_input(self, shape):
        shape = _single_shape(shape, self.name)
        if len(shape) != self.nd + 2:
            raise ValueError(
                f"{self.name}: a {self.nd}-D convolution needs inputs of rank {self.nd + 2} (batch, {self.nd} "
                f"spatial, channels), got shape {shape}"
            )
        return shape

    def out_sizes(self, sizes):
        """Output spatial sizes (lhs order) for input sizes (lhs order)."""
        if self.kind == "ConvTranspose":
            out = []
            for n, (lo, hi), k, st in zip(sizes, self.transpose_pads(), self.f_in, self.st_in):
                length = (n - 1) * st + 1 + lo + hi - k + 1
                if self.circular:
                    length = n * st
                out.append(length)
            return tuple(out)
        if self.padding == "VALID" and any(n < f for n, f in zip(sizes, self.f_in)):
            raise ValueError(f"{self.name}: VALID padding needs spatial size >= filter, got spatial sizes "
                             f"{tuple(sizes)} for filter {self.f_in}")
        return _out_sizes(sizes, self.f_in, self.st_in, self.padding)

    def transpose_pads(self, padding=None):
        """(lo, hi) of `jax.lax.conv_transpose` per dimension (lhs order); 'CIRCULAR' pads as 'VALID'."""
        padding = padding or ("VALID" if self.circular else self.padding)
        pads = []
        for k, st in zip(self.f_in, self.st_in):
            if padding == "SAME":
                total = k + st - 2
                lo = k - 1 if st > k - 1 else -(-total // 2)
            else:
                total = k + st - 2 + max(k - st, 0)
                lo = k - 1
            pads.append((lo, total - lo))
        return pads

    def user_shape_fn(self, shape):
        """Finite output shape in out_spec layout from the input shape in lhs_spec layout."""
        shape = self.check_input(shape)
        lhs, _, out = self.dn
        sizes = self.out_sizes([shape[lhs.index(c)] for c in self.in_sp])
        dims = {"N": shape[lhs.index("N")], "C": self.width}
        dims.update({c: n for c, n in zip(self.in_sp, sizes)})
        return tuple(int(dims[c]) for c in out)

    def canonical_shape_fn(self, shape):
        """Canonical output shape (batch, out_spec spatial order, channels) from a canonical input shape."""
        if len(shape) != self.nd + 2:
            raise ValueError(f"{self.name}: input activations have shape {tuple(shape)}; need {self.nd} spatial "
                             f"dimensions")
        sizes = self.out_sizes(shape[1:-1])
        return (shape[0],) + tuple(sizes[p] for p in self.perm_out) + (self.width,)

    def fold_matrices(self, sizes):
        """CIRCULAR `ConvTranspose`: the 0/1 matrices (n_out, n_valid) folding the 'VALID' output periodically.

        Output position q of size n collects the 'VALID' positions c + q + m n, |m| <= M, inside [0, L):
        c = (L - n) // 2 centres the 'SAME' output in the 'VALID' one and M = ceil(L / n) // 2 (the wrap of
        neural-tangents' CIRCULAR transpose convolution).
        """
        mats = []
        for n_in, (lo, hi), k, st in zip(sizes, self.transpose_pads(), self.f_in, self.st_in):
            n, length = n_in * st, (n_in - 1) * st + 1 + lo + hi - k + 1
            c, m_max = (length - n) // 2, (-(-length // n)) // 2
            P = np.zeros((n, length))
            for q in range(n):
                for m in range(-m_max, m_max + 1):
                    p = c + q + m * n
                    if 0 <= p < length:
                        P[q, p] = 1.0
            mats.append(P)
        return mats


def _apply_matrix(x, axis, P):
    """Contract axis ``axis`` of ``x`` with the columns of ``P``: x'[.., q, ..] = sum_p P[q, p] x[.., p, ..]."""
    return jnp.moveaxis(jnp.tensordot(x, jnp.asarray(P, x.dtype), ((axis,), (1,))), -1, axis)


def _dilate_pad(x, axes, stride, pad):
    """Insert ``stride - 1`` zeros between entries along ``axes`` and pad them with ``pad = (lo, hi)`` zeros."""
    config = [(0, 0, 0)] * x.ndim
    for ax in axes:
        config[ax] = (pad[0], pad[1], stride - 1)
    return lax.pad(x, np.zeros((), x.dtype), config)


def _embed_diagonal(mat, batch_ndim: int):
    """(batch..., H, W, ...) -> (batch..., H, H', W, W', ...): zero except where every pair of positions agrees."""
    sizes = mat.shape[batch_ndim:]
    out = mat.reshape(mat.shape[:batch_ndim] + tuple(v for n in sizes for v in (n, 1)))
    for i, n in enumerate(sizes):
        shape = [1] * out.ndim
        shape[batch_ndim + 2 * i] = shape[batch_ndim + 2 * i + 1] = n
        out = out * jnp.eye(n, dtype=mat.dtype).reshape(shape)
    return out


def _permute_spatial(mat, batch_ndim: int, perm, full: bool):
    """Reorder the spatial dimensions of a covariance (pairs of axes when ``full``) by ``perm``."""
    if mat is None or mat.ndim <= batch_ndim:
        return mat
    head = list(range(batch_ndim))
    if full:
        rest = [batch_ndim + 2 * p + e for p in perm for e in (0, 1)]
    else:
        rest = [batch_ndim + p for p in perm]
    return jnp.transpose(mat, head + rest)


# ---------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------


def _conv_layer(kind, out_chan, filter_shape, strides, padding, W_std, b_std, dimension_numbers,
                parameterization, s) -> Layer:
    spec = _Spec(kind, out_chan, filter_shape, strides, padding, dimension_numbers, parameterization, s)
    layer, nd = spec.name, spec.nd
    _check_std(W_std, "W_std", layer, allow_none=False)
    _check_std(b_std, "b_std", layer, allow_none=True)
    W_std = _std_value(W_std)
    b_std = None if b_std is None else _std_value(b_std)
    affine = _affine_scale(W_std, b_std)
    lhs, rhs, out_spec = spec.dn
    transpose, local = kind == "ConvTranspose", kind == "ConvLocal"
    identity_perm = spec.perm_out == tuple(range(nd))

    # -- finite network ---------------------------------------------------
    def bias_shape(out_shape):
        # neural-tangents' shapes: for Conv / ConvTranspose 1 on every axis of out_spec but 'C'; for ConvLocal
        # 1 on the batch axis only (a bias per output position and channel).
        if local:
            return tuple(1 if c == "N" else int(out_shape[i]) for i, c in enumerate(out_spec))
        return tuple(spec.width if c == "C" else 1 for c in out_spec)

    def init_fn(key, input_shape):
        # neural-tangents' draws (jax.example_libraries.stax.GeneralConv for Conv / ConvTranspose, its own for
        # ConvLocal): W from the first and b from the second key of split(key), N(0, 1) at their final shapes;
        # 'standard' then rescales them (W by W_std / sqrt(fan_in / s_in), b by b_std).
        input_shape = tuple(input_shape)
        out_shape = spec.user_shape_fn(input_shape)
        c_in = input_shape[lhs.index("C")]
        if local:
            dims = {"O": spec.width, "I": c_in * spec.filter_size}
            dims.update({c: out_shape[out_spec.index(c)] for c in spec.r_sp})
        else:
            dims = {"O": spec.width, "I": c_in}
            dims.update(zip(spec.r_sp, spec.filter_shape))
        kw, kb = jax.random.split(key)
        W = jax.random.normal(kw, tuple(dims[c] for c in rhs))
        b = None if b_std is None else jax.random.normal(kb, bias_shape(out_shape))
        if spec.standard:
            W = W * (W_std / (c_in * spec.filter_size / spec.s_in) ** 0.5)
            b = None if b is None else b * b_std
        return out_shape, (W, b)

    def apply_fn(params, x, **kwargs):
        W, b = _unpack_params(params, layer)
        if x.ndim != nd + 2:
            raise ValueError(f"{layer}: input of rank {nd + 2} expected, got shape {x.shape}")
        c_in = x.shape[lhs.index("C")]
        if jnp.ndim(W) != nd + 2:
            raise ValueError(f"{layer}: W has shape {jnp.shape(W)}, expected rank {nd + 2} (rhs spec {rhs})")
        w_in = W.shape[rhs.index("I")]
        if (w_in // spec.filter_size if local else w_in) != c_in:
            raise ValueError(f"{layer}: input has {c_in} channels but W expects "
                             f"{w_in // spec.filter_size if local else w_in}")
        prec = lax.Precision.HIGHEST
        W = W.astype(x.dtype)
        if transpose:
            out = lax.conv_transpose(x, W, spec.strides, "VALID" if spec.circular else spec.padding,
                                     dimension_numbers=spec.dn, precision=prec)
            if spec.circular:
                sizes = [x.shape[lhs.index(c)] for c in spec.in_sp]
                for c, P in zip(spec.in_sp, spec.fold_matrices(sizes)):
                    out = _apply_matrix(out, out_spec.index(c), P)
        else:
            if spec.circular:
                axes = [lhs.index(c) for c in spec.r_sp]
                pads = _spatial_pads([x.shape[a] for a in axes], spec.filter_shape, spec.strides, "SAME")
                x = _pad_axes(x, axes, pads, True)
            pad = "VALID" if spec.circular else spec.padding
            if local:
                out = lax.conv_general_dilated_local(x, W, spec.strides, pad, spec.filter_shape,
                                                     dimension_numbers=spec.dn, precision=prec)
            else:
                out = lax.conv_general_dilated(x, W, spec.strides, pad, dimension_numbers=spec.dn, precision=prec)
        fan_in = c_in * spec.filter_size
        b = _bias(b, bias_shape(out.shape), layer)
        if spec.standard:
            if spec.s_in != 1:
                out = out * (1.0 / math.sqrt(spec.s_in))
            return out if b is None else out + b.astype(x.dtype)
        out = out * (W_std / math.sqrt(fan_in))
        return out if b is None else out + b_std * b.astype(x.dtype)

    # -- kernel -------------------------------------------------------------
    def moments(sizes, full: bool):
        """``op(mat, batch_ndim)``: the unscaled map (1 / |F|) sum_{d in F} of the layer, in lhs order."""
        if transpose:
            pads = spec.transpose_pads()
            folds = spec.fold_matrices(sizes) if spec.circular else None
            valid = [(n - 1) * st + 1 + lo + hi - k + 1 for n, (lo, hi), k, st in zip(sizes, pads, spec.f_in,
                                                                                   spec.st_in)]
        else:
            pads = _spatial_pads(sizes, spec.f_in, spec.st_in, "SAME" if spec.circular else spec.padding)
            outs = _out_sizes(sizes, spec.f_in, spec.st_in, spec.padding)

        def op(mat, batch_ndim):
            if mat is None or mat.ndim == 0:
                return mat
            if transpose and full:
                for i in range(nd):
                    a = batch_ndim + 2 * i
                    mat = _dilate_pad(mat, (a, a + 1), spec.st_in[i], pads[i])
                    mat = _diag_window_sum(mat, a, a + 1, spec.f_in[i], 1, (0, 0), False, valid[i])
                    if folds is not None:
                        mat = _apply_matrix(_apply_matrix(mat, a, folds[i]), a + 1, folds[i])
            elif transpose:
                dims = (1,) * batch_ndim + spec.f_in
                mat = lax.reduce_window(mat, np.zeros((), mat.dtype), lax.add, dims, (1,) * mat.ndim,
                                        [(0, 0)] * batch_ndim + list(pads),
                                        base_dilation=(1,) * batch_ndim + spec.st_in)
            elif full:
                for i in range(nd):
                    a = batch_ndim + 2 * i
                    mat = _diag_window_sum(mat, a, a + 1, spec.f_in[i], spec.st_in[i], pads[i], spec.circular,
                                           outs[i])
            else:
                axes = tuple(range(batch_ndim, batch_ndim + nd))
                mat = _window_sum(mat, axes, spec.f_in, spec.st_in, pads, spec.circular)
            return mat * (1.0 / spec.filter_size)

        return op

    def kernel_map(k: Kernel) -> Kernel:
        if k.spatial_ndim != nd:
            raise ValueError(f"{layer}: input activations have shape {k.shape1}; need {nd} spatial dimensions")
        embed = local and k.full
        if embed:  # unshared weights: only same-position covariances survive; compute on them, embed at the end
            diag = _spatial_diagonal
            k = k.replace(nngp=diag(k.nngp, 2), cov1=diag(k.cov1, 1),
                          cov2=None if k.cov2 is None else diag(k.cov2, 1),
                          ntk=k.ntk if k.ntk is None or k.ntk.ndim == 0 else diag(k.ntk, 2), full=False)
        op = moments(k.shape1[1:-1], k.full)
        conv_nngp = op(k.nngp, 2)
        nngp = affine(conv_nngp)
        ntk = k.ntk
        if ntk is not None:
            conv_ntk = op(ntk, 2)
            if spec.standard:
                fan_in = k.shape1[-1] * spec.filter_size / spec.s_in
                ntk = fan_in * conv_nngp + W_std**2 * conv_ntk
                if b_std is not None:
                    ntk = ntk + 1.0
            else:
                ntk = nngp + W_std**2 * conv_ntk
        cov1, cov2 = affine(op(k.cov1, 1)), affine(op(k.cov2, 1))
        full = k.full
        if embed:
            nngp, cov1 = _embed_diagonal(nngp, 2), _embed_diagonal(cov1, 1)
            cov2 = None if cov2 is None else _embed_diagonal(cov2, 1)
            ntk = None if ntk is None else _embed_diagonal(ntk, 2)
            full = True
        if not identity_perm:
            perm = spec.perm_out
            nngp, cov1 = _permute_spatial(nngp, 2, perm, full), _permute_spatial(cov1, 1, perm, full)
            cov2, ntk = _permute_spatial(cov2, 1, perm, full), _permute_spatial(ntk, 2, perm, full)
        return k.replace(
            nngp=nngp,
            ntk=ntk,
            cov1=cov1,
            cov2=cov2,
            shape1=spec.canonical_shape_fn(k.shape1),
            shape2=spec.canonical_shape_fn(k.shape2),
            full=full,
            is_gaussian=True,
        )

    if transpose and spec.circular:
        # Folding sums several 'VALID' positions into one, so even same-position outputs need the
        # covariances of pairs of different positions.
        def needs_full(full):
            return True
    else:
        def needs_full(full):
            return full

    def mask_fn(mask, shape):
        """An output position is masked when every channel of its window's centre pixel is."""
        mask = masking.reduce_channels(mask)
        spatial = shape[1:-1]
        pad_type = "SAME" if spec.circular else spec.padding
        pads = _spatial_pads(spatial, spec.f_in, spec.st_in, pad_type)
        out = _out_sizes(spatial, spec.f_in, spec.st_in, pad_type)
        mask = masking.window_center_mask(mask, spec.f_in, spec.st_in, pads, out, spec.circular)
        if not identity_perm:
            mask = jnp.transpose(mask, (0, *[1 + p for p in spec.perm_out], nd + 1))
        return mask

    # Transposed convolutions reject masks (their output pixels gather several input windows).
    rule = None if transpose else masking.MaskRule(
        mask_fn, remask=True, out_layout=(out_spec.index("N"), out_spec.index("C")))
    return Layer(layer, init_fn, apply_fn, spec.user_shape_fn, kernel_map, needs_full, layout=spec.layout,
                 masking=rule, means=_flow.FRESH)


# ---------------------------------------------------------------------------
# Public constructors
# ---------------------------------------------------------------------------

_ARGS_DOC = """
    Args:
        out_chan: number of output channels (a positive int); the finite width is ``s[1] * out_chan`` under
            ``'standard'``.
        filter_shape: spatial size of the filter, one positive int per spatial dimension (any number of them),
            in the order of the spatial letters of ``rhs_spec``.
        strides: stride per spatial dimension (same order), positive ints; ``None`` means 1 everywhere.
        padding: ``'VALID'`` (default), ``'SAME'`` or ``'CIRCULAR'`` (periodic), case-insensitive.
        W_std: weight standard deviation, positive (may be traced).
        b_std: bias standard deviation, non-negative (may be traced); ``None`` means no bias.
        dimension_numbers: ``(lhs_spec, rhs_spec, out_spec)`` strings as in `jax.lax.conv_general_dilated`
            (e.g. ``('NCHW', 'OIHW', 'NCHW')``); ``None`` means channels last, ``('NHWC', 'HWIO', 'NHWC')``
            in 2-D and its analogue in other dimensions.
        parameterization: ``'ntk'`` (default) or ``'standard'``.
        s: ``(s_in, s_out)``, positive integer width multipliers of the standard parameterisation
            (see `Dense`).
"""

_RAISES_DOC = """
    Raises:
        ValueError: if ``filter_shape`` is empty or not positive, ``out_chan`` is not a positive integer,
            ``strides`` does not match ``filter_shape``, ``padding``, ``parameterization``, ``s`` or
            ``dimension_numbers`` is invalid, or a concrete scale is out of range; the built layer raises
            ValueError naming itself for inputs of the wrong rank or too small for 'VALID'.
        TypeError: if ``W_std`` or ``b_std`` is not a number.
"""


def Conv(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    W_std: float = 1.0,
    b_std: float | None = None,
    dimension_numbers: tuple[str, str, str] | None = None,
    parameterization: str = "ntk",
    s: tuple[int, int] = (1, 1),
) -> Layer:
    """Convolution with shared weights over any number of spatial dimensions (`jax.lax.conv_general_dilated`).

    Finite network (C input channels, fan-in C |F|): ``'ntk'``: W, b ~ N(0, 1),
    z = W_std / sqrt(C |F|) * conv(x, W) + b_std * b; ``'standard'``: W ~ N(0, W_std^2 s_in / (C |F|)),
    b ~ N(0, b_std^2), z = conv(x, W) / sqrt(s_in) + b with ``s_out * out_chan`` channels.

    Kernels: K' = W_std^2 A(K) + b_std^2 with A(K)(i, j) = (1 / |F|) sum_{d in F} K(s i + d - p, s j + d - p)
    (see the module docstring); NTK ``'ntk'``: Theta' = K' + W_std^2 A(Theta); ``'standard'``:
    Theta' = (C |F| / s_in) A(K) + W_std^2 A(Theta) + [1 if a bias].
    {args}
    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping inputs in ``lhs_spec`` layout to outputs in
        ``out_spec`` layout; its parameters are ``(W, b)`` with ``W`` in ``rhs_spec`` layout and ``b`` of
        neural-tangents' shape, one axis per letter of ``out_spec``, all 1 except ``'C'`` (the width), or
        ``None``. With the same key the draws are neural-tangents' (``W`` from the first and ``b`` from the second
        key of ``jax.random.split(key)``), bit for bit under ``jax_threefry_partitionable=False``; so are
        `ConvTranspose`'s and `ConvLocal`'s, except that neural-tangents' `ConvLocal` ignores ``s[1]``.
    {raises}"""
    return _conv_layer("Conv", out_chan, filter_shape, strides, padding, W_std, b_std, dimension_numbers,
                       parameterization, s)


def ConvTranspose(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    W_std: float = 1.0,
    b_std: float | None = None,
    dimension_numbers: tuple[str, str, str] | None = None,
    parameterization: str = "ntk",
    s: tuple[int, int] = (1, 1),
) -> Layer:
    """Transposed convolution (`jax.lax.conv_transpose`, kernel not flipped) over any number of spatial dims.

    Finite network as `Conv` with conv replaced by the transposed convolution: the input is dilated by the
    stride (s - 1 zeros between positions), padded as `jax.lax.conv_transpose` pads 'SAME' or 'VALID', and
    convolved with stride 1; the output has n s positions ('SAME', 'CIRCULAR') or n s + max(k - s, 0)
    ('VALID') per dimension of n inputs and filter size k. 'CIRCULAR' computes the 'VALID' output and folds
    it periodically onto n s positions. The fan-in is C |F| as for `Conv`.

    Kernels: K' = W_std^2 A(K) + b_std^2 with A(K)(i, j) = (1 / |F|) sum_{d in F} K_dil(i + d, j + d),
    K_dil the input covariance dilated and padded on both positions; 'CIRCULAR': A = P A_valid P^T with P
    the folding matrix of each dimension. The NTK follows as for `Conv`.
    {args}
    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)``; parameters ``(W, b)`` with ``W`` in ``rhs_spec`` layout
        (``'I'`` the input channels) and ``b`` shaped as for `Conv`.
    {raises}"""
    return _conv_layer("ConvTranspose", out_chan, filter_shape, strides, padding, W_std, b_std, dimension_numbers,
                       parameterization, s)


def ConvLocal(
    out_chan: int,
    filter_shape: Sequence[int],
    strides: Sequence[int] | None = None,
    padding: str = "VALID",
    W_std: float = 1.0,
    b_std: float | None = None,
    dimension_numbers: tuple[str, str, str] | None = None,
    parameterization: str = "ntk",
    s: tuple[int, int] = (1, 1),
) -> Layer:
    """Locally connected layer: a convolution with separate weights and biases at every output position.

    Finite network as `Conv` with `jax.lax.conv_general_dilated_local` (a filter of C |F| inputs per output
    position and channel) and a bias per output position and channel.

    Kernels: the weights of two different output positions are independent, so
    K'(i, j) = [i = j] (W_std^2 A(K)(i, i) + b_std^2), A as for `Conv` restricted to same-position entries
    K(i + d, i + d); the NTK likewise, Theta'(i, j) = [i = j] (K'(i, i) + W_std^2 A(Theta)(i, i)) under
    ``'ntk'``. Pooling after it therefore sees no covariance between positions.
    {args}
    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)``; parameters ``(W, b)`` with ``W`` in ``rhs_spec`` layout
        whose spatial axes are the output positions and whose ``'I'`` axis has C |F| entries, and ``b`` of the
        output's shape with a 1 for the batch axis, or ``None``; neural-tangents' shapes and draws, except
        under ``'standard'`` with ``s[1] > 1``, where neural-tangents 0.6.5 ignores ``s[1]`` (its layer has
        ``out_chan`` channels, against its documentation) and this one has ``s[1] * out_chan``.
    {raises}"""
    return _conv_layer("ConvLocal", out_chan, filter_shape, strides, padding, W_std, b_std, dimension_numbers,
                       parameterization, s)


for _fn in (Conv, ConvTranspose, ConvLocal):
    _fn.__doc__ = _fn.__doc__.replace("{args}", _ARGS_DOC).replace("{raises}", _RAISES_DOC)
del _fn
