"""Attention layers: `GlobalSelfAttention` (finite network, NNGP and NTK).

Notation (one input point x with P spatial positions, flattened row-major, and C channels; positions i, j, k, l):

* Sigma(i, j) = x_i . x_j / C, the per-channel covariance the kernel carries (``cov1``; ``nngp`` between two
  points); Theta the input NTK;
* R(i, j) = decay(sum_a |i_a - j_a|^p), the covariance of the random positional embeddings (the identity when
  ``pos_emb_decay_fn`` is None);
* S = w_in Sigma + w_pe R, the covariance of the key/query inputs (inputs with positional embeddings added or
  concatenated): w_in = 1, w_pe = W_pos_emb_std^2 for ``'SUM'``; w_in = C / (C + C_pe),
  w_pe = W_pos_emb_std^2 C_pe / (C + C_pe) for ``'CONCAT'``;
* V, the covariance of the value inputs: S when ``val_pos_emb``, Sigma otherwise.

Infinite attention (Hron, Bahri, Sohl-Dickstein, Novak 2020, arXiv:2006.10540), in the limit of infinitely many
heads, key/query and value channels:

* ``linear_scaling=True`` (logits scaled by 1 / (C n_chan_key), key and query weights tied): the logits converge
  to the constant QK S(i, j), QK = W_query_std W_key_std, so the attention weights are the deterministic
  A(i, j) = phi(QK S(i, .))_j (phi = softmax over j, identity, |.| or relu). The output is Gaussian with

      K'(x, x')(i, j) = OV^2 sum_{k, l} A(i, k) V(x, x')(k, l) A'(j, l) + b_std^2,   OV = W_out_std W_value_std,
      Theta'(i, j)    = OV^2 sum_{k, l} A(i, k) [Theta_V + 2 V](k, l) A'(j, l) + b_std^2

  (the factor 2: the value and output weights; the tied key weights' contribution vanishes with n_chan_key;
  Theta_V = w_in Theta + w_pe R when ``val_pos_emb``, Theta otherwise);
* ``linear_scaling=False`` (logits scaled by 1 / (C sqrt(n_chan_key)), independent keys and queries): the
  logits are Gaussian, with E[G(i, k) G'(j, l)] = QK^2 S(i, j) S(k, l); a closed form exists for the identity
  mechanism only:

      K'(i, j)     = (QK OV)^2 <S, V> S(i, j) + b_std^2,   <S, V> = sum_{k, l} S(k, l) V(k, l),
      Theta'(i, j) = (QK OV)^2 [(<Theta_S, V> + <S, Theta_V>) S(i, j) + <S, V> (Theta_S(i, j) + 4 S(i, j))]
                     + b_std^2,

  Theta_S = w_in Theta + w_pe R; the 4 counts the query, key, value and output weights.

Under ``parameterization='standard'`` each weight is drawn with variance std^2 / fan_in and used unscaled; the
NNGP is unchanged and each parameter's NTK term is multiplied by fan_in / std^2 (the positional embeddings' by
1 / W_pos_emb_std^2, the bias's term becomes 1), as in `Dense`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from smnngp._axes import lead
from smnngp.kernels import Kernel
from smnngp.stax import _flow, masking
from smnngp.stax._core import Layer, _check_parameterization, _fmt, _single_shape, _std_value
from smnngp.stax.linear import _bias

__all__ = ["GlobalSelfAttention", "AttentionMechanism", "PositionalEmbedding"]

class AttentionMechanism(enum.Enum):
    """The attention nonlinearity of `GlobalSelfAttention`; a member or its name (any case) may be passed."""

    SOFTMAX = "SOFTMAX"
    IDENTITY = "IDENTITY"
    ABS = "ABS"
    RELU = "RELU"


class PositionalEmbedding(enum.Enum):
    """How `GlobalSelfAttention` adds positional embeddings: none, summed to the inputs, or concatenated."""

    NONE = "NONE"
    SUM = "SUM"
    CONCAT = "CONCAT"


_MECHANISMS = tuple(m.value for m in AttentionMechanism)
_POS_EMBS = tuple(m.value for m in PositionalEmbedding)
_HIGHEST = lax.Precision.HIGHEST
_NEG_INF = -1e20  # a finite stand-in for -inf: a row whose every key is masked stays a valid softmax


def _mechanism_fn(mechanism: str):
    """The map from logits (..., P_query, P_key) to attention weights."""
    if mechanism == "SOFTMAX":
        return lambda g: jax.nn.softmax(g, axis=-1)
    if mechanism == "IDENTITY":
        return lambda g: g
    if mechanism == "ABS":
        return jnp.abs
    return lambda g: jnp.maximum(g, 0)


def _check_scale(value, name: str, layer: str, positive: bool, allow_none: bool = False):
    """A scale as a Python float (or unchanged when traced); raises naming the layer and argument."""
    if value is None and allow_none:
        return None
    if isinstance(value, jax.core.Tracer):
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{layer}: {name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        raise ValueError(f"{layer}: {name} must be {'positive' if positive else 'non-negative'} and finite, "
                         f"got {value!r}")
    return _std_value(v)


def _check_count(value, name: str, layer: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _pos_emb_cov(spatial, p_norm, decay_fn, dtype):
    """R(i, j) = decay_fn(sum_a |i_a - j_a|^p) over flattened positions, (P, P); the identity for no decay_fn."""
    size = math.prod(spatial)
    if decay_fn is None:
        return jnp.eye(size, dtype=dtype)
    coords = np.indices(spatial).reshape(len(spatial), -1).T.astype(np.float64)  # (P, S)
    dist = (np.abs(coords[:, None, :] - coords[None, :, :]) ** p_norm).sum(-1)
    return jnp.asarray(decay_fn(jnp.asarray(dist, dtype)), dtype)


def _to_pairs(mat, batch_ndim: int, spatial):
    """(batch..., H, H', W, W', ...) -> (batch..., P, P'): interleaved position pairs to flat positions."""
    nd = len(spatial)
    if nd == 1:
        return mat
    lead = list(range(batch_ndim))
    firsts = [batch_ndim + 2 * a for a in range(nd)]
    mat = jnp.transpose(mat, lead + firsts + [f + 1 for f in firsts])
    size = math.prod(spatial)
    return mat.reshape(mat.shape[:batch_ndim] + (size, size))


def _from_pairs(mat, batch_ndim: int, spatial):
    """Inverse of `_to_pairs`: (batch..., P, P') -> (batch..., H, H', W, W', ...)."""
    nd = len(spatial)
    if nd == 1:
        return mat
    mat = mat.reshape(mat.shape[:batch_ndim] + tuple(spatial) * 2)
    order = [ax for a in range(nd) for ax in (batch_ndim + a, batch_ndim + nd + a)]
    return jnp.transpose(mat, list(range(batch_ndim)) + order)


def _sandwich(A1, M, A2):
    """out[a, b, i, j] = sum_{k, l} A1[a, i, k] M[a, b, k, l] A2[b, j, l] as two batched products."""
    t = jnp.einsum("aik,abkl->abil", A1, M, precision=_HIGHEST)
    return jnp.einsum("abil,bjl->abij", t, A2, precision=_HIGHEST)


def _sandwich_diag(A, M):
    """out[a, i, j] = sum_{k, l} A[a, i, k] M[a, k, l] A[a, j, l] (one point with itself)."""
    t = jnp.matmul(A, M, precision=_HIGHEST)
    return jnp.matmul(t, jnp.swapaxes(A, -1, -2), precision=_HIGHEST)


def GlobalSelfAttention(
    n_chan_out: int,
    n_chan_key: int,
    n_chan_val: int,
    n_heads: int,
    linear_scaling: bool = True,
    W_key_std: float = 1.0,
    W_value_std: float = 1.0,
    W_query_std: float = 1.0,
    W_out_std: float = 1.0,
    b_std: float | None = None,
    attention_mechanism: str = "SOFTMAX",
    pos_emb_type: str = "NONE",
    pos_emb_p_norm: float = 2,
    pos_emb_decay_fn: Callable | None = None,
    n_chan_pos_emb: int | None = None,
    W_pos_emb_std: float = 1.0,
    val_pos_emb: bool = False,
    batch_axis: int = 0,
    channel_axis: int = -1,
    parameterization: str = "ntk",
) -> Layer:
    """Multi-head scaled dot-product self-attention over all spatial positions (see the module docstring).

    Finite network, per head h with its own key (query) and value weights:
    ``head_h(x) = phi(c Q_h(x) K_h(x)^T) V_h(x)``, where keys/queries see the inputs with positional
    embeddings added (``'SUM'``) or appended as channels (``'CONCAT'``) and values see them only when
    ``val_pos_emb``; ``c = QK / (C n_chan_key)`` with queries equal to keys when ``linear_scaling``, and
    ``c = QK / (C sqrt(n_chan_key))`` with independent queries otherwise; the output is
    ``concat_h head_h(x) W_out * OV / sqrt(n_heads n_chan_val C_val) + b_std b``. A ``mask`` keyword of
    ``apply_fn`` (True = masked, the inputs' shape) drops masked positions as keys.

    Kernels: the linear-scaling closed form for every mechanism; the closed form of ``linear_scaling=False`` for
    ``'IDENTITY'`` only (the module docstring states both).

    Args:
        n_chan_out: output channels.
        n_chan_key: key/query channels per head.
        n_chan_val: value channels per head.
        n_heads: number of heads.
        linear_scaling: True for 1 / n_chan_key logit scaling with tied key/query weights, False for
            1 / sqrt(n_chan_key) with independent ones.
        W_key_std: key weight scale (the kernels depend on W_query_std * W_key_std).
        W_value_std: value weight scale (the kernels depend on W_out_std * W_value_std).
        W_query_std: query weight scale.
        W_out_std: output weight scale.
        b_std: output bias scale; ``None`` means no bias.
        attention_mechanism: ``'SOFTMAX'``, ``'IDENTITY'``, ``'ABS'`` or ``'RELU'`` (case-insensitive).
        pos_emb_type: ``'NONE'``, ``'SUM'`` or ``'CONCAT'`` (case-insensitive).
        pos_emb_p_norm: p of the distance sum_a |i_a - j_a|^p between positions given to ``pos_emb_decay_fn``.
        pos_emb_decay_fn: map from that distance to the embeddings' covariance (it must give a positive definite
            matrix); ``None`` means independent embeddings at each position.
        n_chan_pos_emb: channels of the embeddings (``'CONCAT'``); ``None`` means as many as the inputs.
        W_pos_emb_std: scale of the embeddings.
        val_pos_emb: whether values also see the positional embeddings.
        batch_axis: batch axis of the finite inputs.
        channel_axis: channel axis of the finite inputs.
        parameterization: ``'ntk'`` (default, neural-tangents' only one) or ``'standard'`` (an smnngp addition).

    Returns:
        `Layer` ``(init_fn, apply_fn, kernel_fn)`` mapping inputs with at least one spatial axis to the same
        shape with ``n_chan_out`` channels; parameters ``(W_query or None, W_key, W_value, W_out, b, pos_emb)``
        with shapes (n_heads, C_k, n_chan_key), (n_heads, C_k, n_chan_key), (n_heads, C_v, n_chan_val),
        (n_heads n_chan_val, n_chan_out), broadcastable (n_chan_out,) or None, and the inputs' shape with batch
        size 1 and C_pe channels (or None). Its ``kernel_fn`` needs all position pairs of its input kernel.

    Raises:
        ValueError: for a non-positive size, an unknown mechanism, embedding or parameterization, a negative or
            non-finite scale, inputs without a spatial axis, ``'SUM'`` with ``n_chan_pos_emb`` different from the
            input channels, or a mask of the wrong shape.
        TypeError: if a scale is not a number.
        NotImplementedError: from ``kernel_fn`` when ``linear_scaling=False`` and the mechanism is not
            ``'IDENTITY'`` (no closed form).
    """
    layer = f"GlobalSelfAttention({n_chan_out}, {n_chan_key}, {n_chan_val}, {n_heads})"
    n_chan_out = _check_count(n_chan_out, "n_chan_out", layer)
    n_chan_key = _check_count(n_chan_key, "n_chan_key", layer)
    n_chan_val = _check_count(n_chan_val, "n_chan_val", layer)
    n_heads = _check_count(n_heads, "n_heads", layer)
    n_chan_pos_emb = _check_count(n_chan_pos_emb, "n_chan_pos_emb", layer, allow_none=True)
    mechanism = str(getattr(attention_mechanism, "name", attention_mechanism)).upper()
    if mechanism not in _MECHANISMS:
        raise ValueError(f"{layer}: attention_mechanism must be one of {_MECHANISMS}, got {attention_mechanism!r}")
    pos_emb = str(getattr(pos_emb_type, "name", pos_emb_type)).upper()
    if pos_emb not in _POS_EMBS:
        raise ValueError(f"{layer}: pos_emb_type must be one of {_POS_EMBS}, got {pos_emb_type!r}")
    _check_parameterization(parameterization, layer)
    if pos_emb_decay_fn is not None and not callable(pos_emb_decay_fn):
        raise TypeError(f"{layer}: pos_emb_decay_fn must be callable or None, got {type(pos_emb_decay_fn).__name__}")
    p_norm = _check_scale(pos_emb_p_norm, "pos_emb_p_norm", layer, positive=True)
    W_key_std = _check_scale(W_key_std, "W_key_std", layer, positive=True)
    W_query_std = _check_scale(W_query_std, "W_query_std", layer, positive=True)
    W_value_std = _check_scale(W_value_std, "W_value_std", layer, positive=True)
    W_out_std = _check_scale(W_out_std, "W_out_std", layer, positive=True)
    W_pe_std = _check_scale(W_pos_emb_std, "W_pos_emb_std", layer, positive=True)
    b_std = _check_scale(b_std, "b_std", layer, positive=False, allow_none=True)
    linear_scaling = bool(linear_scaling)
    val_pos_emb = bool(val_pos_emb) and pos_emb != "NONE"
    standard = parameterization == "standard"
    QK = W_query_std * W_key_std
    OV = W_out_std * W_value_std
    attend = _mechanism_fn(mechanism)
    layout = (int(batch_axis), int(channel_axis))
    layer_full = (f"{layer} [{mechanism}, linear_scaling={linear_scaling}, pos_emb={pos_emb}, "
                  f"b_std={_fmt(b_std)}]")

    def axes(ndim):
        b, c = layout[0] % ndim, layout[1] % ndim
        if b == c:
            raise ValueError(f"{layer}: batch_axis and channel_axis are both axis {b}")
        return b, c

    def channel_sizes(c_in):
        """(channels of key/query inputs, channels of value inputs, embedding channels)."""
        c_pe = 0 if pos_emb == "NONE" else (c_in if n_chan_pos_emb is None else n_chan_pos_emb)
        c_key = c_in + (c_pe if pos_emb == "CONCAT" else 0)
        c_val = c_key if val_pos_emb else c_in
        return c_key, c_val, c_pe

    def shape_fn(shape):
        shape = _single_shape(shape, layer)
        if len(shape) < 3:
            raise ValueError(
                f"{layer}: attends over spatial positions, so its input needs a batch axis, at least one spatial "
                f"axis and a channel axis; got shape {shape}"
            )
        _, c = axes(len(shape))
        if pos_emb == "SUM" and n_chan_pos_emb not in (None, shape[c]):
            raise ValueError(f"{layer}: 'SUM' positional embeddings need n_chan_pos_emb = the input channels "
                             f"({shape[c]}) or None, got {n_chan_pos_emb}")
        return shape[:c] + (n_chan_out,) + shape[c + 1:]

    # -- the finite network -------------------------------------------------

    def init_fn(key, input_shape):
        input_shape = tuple(input_shape)
        out_shape = shape_fn(input_shape)
        b_ax, c_ax = axes(len(input_shape))
        c_key, c_val, c_pe = channel_sizes(input_shape[c_ax])
        k_q, k_k, k_v, k_o, k_b, k_pe = jax.random.split(key, 6)
        normal = jax.random.normal
        W_key = normal(k_k, (n_heads, c_key, n_chan_key))
        W_query = None if linear_scaling else normal(k_q, (n_heads, c_key, n_chan_key))
        W_val = normal(k_v, (n_heads, c_val, n_chan_val))
        W_out = normal(k_o, (n_heads * n_chan_val, n_chan_out))
        b = None
        if b_std is not None:
            b_shape = [1] * len(input_shape)
            b_shape[c_ax] = n_chan_out
            b = normal(k_b, tuple(b_shape))
        pe = None
        if pos_emb != "NONE":
            pe_shape = list(input_shape)
            pe_shape[b_ax], pe_shape[c_ax] = 1, c_pe
            pe = normal(k_pe, tuple(pe_shape))
        if standard:  # the scales move into the parameters
            W_key = W_key * (W_key_std / math.sqrt(c_key))
            W_query = None if W_query is None else W_query * (W_query_std / math.sqrt(c_key))
            W_val = W_val * (W_value_std / math.sqrt(c_val))
            W_out = W_out * (W_out_std / math.sqrt(n_heads * n_chan_val))
            b = None if b is None else b * b_std
            pe = None if pe is None else pe * W_pe_std
        return out_shape, (W_query, W_key, W_val, W_out, b, pe)

    def apply_fn(params, x, mask=None, **kwargs):
        W_query, W_key, W_val, W_out, b, pe = params
        if x.ndim < 3:
            raise ValueError(f"{layer}: input of shape {tuple(x.shape)} has no spatial axis")
        b_ax, c_ax = axes(x.ndim)
        xc = jnp.moveaxis(x, (b_ax, c_ax), (0, -1))
        n, spatial, c_in = xc.shape[0], xc.shape[1:-1], xc.shape[-1]
        size = math.prod(spatial)
        c_key, c_val, c_pe = channel_sizes(c_in)
        if W_key.shape[1] != c_key:
            raise ValueError(f"{layer}: input has {c_in} channels but the key weights expect "
                             f"{W_key.shape[1]} key input channels")
        key_mask = None
        if mask is not None:
            if jnp.ndim(mask) != x.ndim:
                raise ValueError(f"{layer}: mask of shape {tuple(mask.shape)} does not match the input "
                                 f"{tuple(x.shape)}: it needs the input's rank")
            m = jnp.all(jnp.moveaxis(mask, (b_ax, c_ax), (0, -1)), axis=-1)  # (N, spatial...)
            key_mask = m.reshape(n, 1, size)
        x_val = xc
        x_key = xc
        if pe is not None:
            pe_c = jnp.moveaxis(pe, (b_ax, c_ax), (0, -1)).astype(x.dtype)  # (1, spatial..., C_pe)
            if pos_emb_decay_fn is not None:  # correlate the independent draws: pe <- L pe, L L^T = R
                L = jnp.linalg.cholesky(_pos_emb_cov(spatial, p_norm, pos_emb_decay_fn, x.dtype))
                pe_c = jnp.matmul(L, pe_c.reshape(size, c_pe), precision=_HIGHEST).reshape(pe_c.shape)
            if mask is not None:
                pe_c = jnp.where(jnp.moveaxis(mask, (b_ax, c_ax), (0, -1)), 0, pe_c)
            if not standard:
                pe_c = pe_c * W_pe_std
            if pos_emb == "SUM":
                x_key = xc + pe_c
            else:
                x_key = jnp.concatenate([xc, jnp.broadcast_to(pe_c, xc.shape[:-1] + (c_pe,))], axis=-1)
            if val_pos_emb:
                x_val = x_key
        x_key = x_key.reshape(n, size, c_key)
        x_val = x_val.reshape(n, size, c_val)
        dt = x.dtype
        keys = jnp.einsum("npc,hcd->hnpd", x_key, W_key.astype(dt), precision=_HIGHEST)
        queries = keys if linear_scaling else jnp.einsum("npc,hcd->hnpd", x_key, W_query.astype(dt),
                                                         precision=_HIGHEST)
        values = jnp.einsum("npc,hcd->hnpd", x_val, W_val.astype(dt), precision=_HIGHEST)
        logits = jnp.einsum("hnpd,hnqd->hnpq", queries, keys, precision=_HIGHEST)
        root = n_chan_key if linear_scaling else math.sqrt(n_chan_key)
        if standard:
            scale = (W_query_std / W_key_std if linear_scaling else 1.0) / root
        else:
            scale = QK / (c_key * root)
        logits = logits * scale
        if key_mask is not None:
            fill = _NEG_INF if mechanism == "SOFTMAX" else 0
            logits = jnp.where(key_mask[None], jnp.asarray(fill, dt), logits)
        heads = jnp.einsum("hnpq,hnqd->npdh", attend(logits), values, precision=_HIGHEST)  # channel d * n_heads + h
        heads = heads.reshape(n, size, n_heads * n_chan_val)
        out = jnp.matmul(heads, W_out.astype(dt), precision=_HIGHEST)
        if not standard:
            out = out * (OV / math.sqrt(n_heads * n_chan_val * c_val))
        out = out.reshape((n,) + tuple(spatial) + (n_chan_out,))
        out = jnp.moveaxis(out, (0, -1), (b_ax, c_ax))
        if b is not None:
            b_shape = [1] * x.ndim
            b_shape[c_ax] = n_chan_out
            b = _bias(b, tuple(b_shape), layer).astype(dt)
            out = out + (b if standard else b_std * b)
        return out

    # -- the kernel ---------------------------------------------------------

    def kernel_map(k: Kernel, **kwargs) -> Kernel:
        if k.spatial_ndim == 0:
            raise ValueError(f"{layer}: attends over spatial positions, but its input activations have shape "
                             f"{k.shape1} with no spatial axis")
        if not k.full:
            raise ValueError(f"{layer}: needs the covariances of all pairs of positions (a full Kernel), got "
                             f"same-position covariances only")
        if not linear_scaling and mechanism != "IDENTITY":
            raise NotImplementedError(f"{layer_full}: no closed-form kernel for logits scaled by "
                                      f"1/sqrt(n_chan_key) with {mechanism} attention; use linear_scaling=True or "
                                      f"attention_mechanism='IDENTITY'")
        spatial = k.shape1[1:-1]
        c_in = k.shape1[-1]
        c_key, c_val, c_pe = channel_sizes(c_in)
        if pos_emb == "SUM" and c_pe != c_in:
            raise ValueError(f"{layer}: 'SUM' positional embeddings need n_chan_pos_emb = the input channels "
                             f"({c_in}) or None, got {n_chan_pos_emb}")
        dt = k.nngp.dtype
        pair = lambda m, nb: _to_pairs(m, nb, spatial)  # noqa: E731
        nngp, cov1 = pair(k.nngp, 2), pair(k.cov1, 1)
        cov2 = None if k.cov2 is None else pair(k.cov2, 1)
        ntk = k.ntk
        if ntk is not None and ntk.ndim:
            ntk = pair(ntk, 2)

        # Mixing weights of inputs and embeddings in the key/query (and value) covariance.
        R = None
        w_in, w_pe = 1.0, 0.0
        if pos_emb != "NONE":
            R = _pos_emb_cov(spatial, p_norm, pos_emb_decay_fn, dt)
            w_pe = W_pe_std**2
            if pos_emb == "CONCAT":
                w_in, w_pe = c_in / c_key, w_pe * c_pe / c_key
        # NTK weight of the embeddings' own gradient (standard: the embeddings carry their scale).
        w_pe_ntk = w_pe / W_pe_std**2 if standard else w_pe

        def mix(mat, weight_pe=w_pe):
            return mat if R is None else w_in * mat + weight_pe * lead(R, mat.ndim)

        S11, S12 = mix(cov1), mix(nngp)
        S22 = None if cov2 is None else mix(cov2)
        V11, V12, V22 = (S11, S12, S22) if val_pos_emb else (cov1, nngp, cov2)
        b_var = 0.0 if b_std is None else b_std**2
        if standard:
            ntk_bias = 0.0 if b_std is None else 1.0
            w_out_term = n_heads * n_chan_val * W_value_std**2
            w_val_term = c_val * W_out_std**2
        else:
            ntk_bias, w_out_term, w_val_term = b_var, OV**2, OV**2
        theta_in = None
        if ntk is not None:
            theta_in = mix(ntk, w_pe_ntk)  # NTK of the key/query inputs (broadcastable, may be a scalar)

        if linear_scaling:
            L11, L22 = S11, S22
            if masking.has_masks(k):  # masked keys get logit -inf (softmax) or 0 (other mechanisms)
                fill = jnp.asarray(_NEG_INF if mechanism == "SOFTMAX" else 0.0, dt)
                m1, m2 = (None if m is None else jnp.all(m, axis=-1) for m in (k.mask1, k.mask2))
                m2 = m1 if m2 is None and k.cov2 is None else m2
                if m1 is not None:
                    L11 = jnp.where(m1.reshape(m1.shape[0], 1, -1), fill, S11)
                if m2 is not None and S22 is not None:
                    L22 = jnp.where(m2.reshape(m2.shape[0], 1, -1), fill, S22)
            A1 = attend(QK * L11)
            A2 = A1 if S22 is None else attend(QK * L22)
            out_nngp = OV**2 * _sandwich(A1, V12, A2) + b_var
            out_cov1 = OV**2 * _sandwich_diag(A1, V11) + b_var
            out_cov2 = None if S22 is None else OV**2 * _sandwich_diag(A2, V22) + b_var
            out_ntk = None
            if ntk is not None:
                theta_v = theta_in if val_pos_emb else ntk
                base = (w_out_term + w_val_term) * _sandwich(A1, V12, A2) + ntk_bias
                if jnp.ndim(theta_v) == 0:  # no layer below has parameters: Theta_V = 0
                    out_ntk = base
                else:
                    theta_v = jnp.broadcast_to(theta_v, nngp.shape)
                    out_ntk = base + OV**2 * _sandwich(A1, theta_v, A2)
        else:  # identity attention with 1/sqrt(n_chan_key) logits
            std2 = (QK * OV) ** 2
            d12 = jnp.sum(S12 * V12, axis=(-2, -1), keepdims=True)
            out_nngp = std2 * d12 * S12 + b_var
            out_cov1 = std2 * jnp.sum(S11 * V11, axis=(-2, -1), keepdims=True) * S11 + b_var
            out_cov2 = None
            if S22 is not None:
                out_cov2 = std2 * jnp.sum(S22 * V22, axis=(-2, -1), keepdims=True) * S22 + b_var
            out_ntk = None
            if ntk is not None:
                theta_s = jnp.broadcast_to(theta_in, nngp.shape)
                theta_v = theta_s if val_pos_emb else jnp.broadcast_to(ntk, nngp.shape)
                d_theta = (jnp.sum(theta_s * V12, axis=(-2, -1), keepdims=True)
                           + jnp.sum(S12 * theta_v, axis=(-2, -1), keepdims=True))
                if standard:
                    weights = (n_heads * n_chan_val / W_out_std**2 + c_val / W_value_std**2
                               + c_key / W_query_std**2 + c_key / W_key_std**2)
                else:
                    weights = 4.0
                out_ntk = std2 * (d_theta * S12 + d12 * (theta_s + weights * S12)) + ntk_bias

        unpair = lambda m, nb: _from_pairs(m, nb, spatial)  # noqa: E731
        return k.replace(
            nngp=unpair(out_nngp.astype(dt), 2),
            ntk=None if out_ntk is None else unpair(jnp.asarray(out_ntk, dt), 2),
            cov1=unpair(out_cov1.astype(dt), 1),
            cov2=None if out_cov2 is None else unpair(out_cov2.astype(dt), 1),
            shape1=k.shape1[:-1] + (n_chan_out,),
            shape2=k.shape2[:-1] + (n_chan_out,),
            is_gaussian=True,
        )

    rule = masking.MaskRule(lambda m, shape: masking.reduce_channels(m), remask=True, wants_mask=True)
    return Layer(layer, init_fn, apply_fn, shape_fn, kernel_map, lambda full: True, layout=layout, masking=rule,
                 means=_flow.FRESH)
