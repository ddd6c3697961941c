"""Masked Bayesian neural networks (Kong et al., ICML 2023; notes ``000_masked_bnn.md`` section 1).

A masked MLP is a dense ReLU network whose hidden layer ``l`` carries a binary
node mask ``m_l``; the masked activation is ``rho_m(x) = m * max(x, 0)``
(paper section 3.1). The masks are a reparameterisation of the width: a
network with ``|m_l|_0 = s_l`` computes exactly what a dense network of widths
``s_l`` computes.

Parameters are a pytree: ``params = ((W_1, b_1), ..., (W_{L+1}, b_{L+1}))``
with ``W_l`` of shape ``(fan_in, fan_out)`` (the ``smnngp.stax.Dense`` layout,
standard parameterisation: the layer computes ``x @ W + b``), and
``masks = (m_1, ..., m_L)`` float arrays of 0/1 of the physical widths.

**Compaction.** Once masks are sparse the work of a forward pass is in the
active nodes only. ``apply(..., buckets=(B_1, ..., B_L))`` gathers the active
rows/columns of every weight matrix into dense blocks of static size ``B_l``
(padded; the pads contribute exactly zero), so XLA compiles one program per
bucket tuple and a sampler that rounds ``B_l`` up to powers of two compiles a
handful. The value and the gradients with respect to the parameters and to the
*active* mask entries equal the full-width computation; the gradient with
respect to an *inactive* mask entry (which only gradient-informed birth
proposals need) is only available at full width (``buckets=None``).

**Priors** (paper section 3.3): the mask prior
``log Pi(m_l) = -c s_l^2 - log C(p_l, s_l)`` with ``c = (lambda ln n)^5`` and
``s_l >= 1``; iid ``Cauchy(0, scale)`` on every weight and bias (active or
not); ``sigma^2 ~ InvGamma(a, b)`` for regression, updated by its conjugate
Gibbs draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln

from smnngp import stax
from smnngp._axes import lead

__all__ = [
    "MaskedMLP",
    "masked_mlp",
    "masked_relu",
    "mask_prior_strength",
    "log_mask_prior",
    "cauchy_log_prior",
    "gaussian_loglik",
    "categorical_loglik",
    "gibbs_sigma2",
    "active_counts",
    "EffectiveIndex",
    "effective_index",
    "gather_effective",
    "scatter_effective",
    "apply_effective",
    "node_activations",
    "effective_validity",
    "ineffective_masks",
    "bucket_sizes",
    "MaskedCNN",
    "masked_cnn",
]


def masked_relu(x, m):
    """``rho_m(x) = m * max(x, 0)`` with the mask broadcast over the last (node/channel) axis.

    Args:
        x: pre-activations ``(..., p)``, the last axis the nodes (or channels).
        m: the 0/1 mask ``(p,)`` of that layer.

    Returns:
        The masked activations, ``m * max(x, 0)``, of the shape of ``x``.
    """
    return lead(m, jnp.ndim(x)) * jnp.maximum(x, 0.0)


def _affine(h, W, b):
    """``h @ W + b`` with the bias broadcast over the batch axes of ``h`` explicitly."""
    out = h @ W
    return out + lead(b, out.ndim)


class MaskedMLP(NamedTuple):
    """Static description of a masked MLP (hashable: safe as a ``jit`` static argument).

    Attributes:
        in_dim: input features.
        widths: physical hidden widths ``p_l``.
        active: initially active nodes per layer (the first ``active[l]`` nodes).
        out_dim: outputs (1 for regression, classes for classification).
        W_std: weight scale of the initialisation (``smnngp.stax.Dense``, standard parameterisation): every
            weight is drawn from ``N(0, W_std^2 / fan_in)``.
        b_std: bias scale of the initialisation: every bias is drawn from ``N(0, b_std^2 / fan_in)``.
    """

    in_dim: int
    widths: tuple
    active: tuple
    out_dim: int
    W_std: float
    b_std: float

    @property
    def num_layers(self) -> int:
        return len(self.widths)

    def init(self, key, dtype=jnp.float32):
        """Draw ``(params, masks)``: weights from ``stax.Dense`` (standard parameterisation) and the initial masks.

        The default scales ``W_std = b_std = 1/sqrt(3)`` give every weight the
        variance ``1 / (3 fan_in)`` of PyTorch's default (uniform) initialisation
        that the authors started their chains from; biases get ``b_std^2 / fan_in``.
        """
        keys = jax.random.split(key, self.num_layers + 1)
        dims = (self.in_dim,) + tuple(self.widths) + (self.out_dim,)
        params = []
        for k, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            init_fn = stax.Dense(fan_out, W_std=self.W_std, b_std=1.0, parameterization="standard")[0]
            _, (W, b) = init_fn(keys[k], (1, fan_in))
            # Dense draws its bias at neural-tangents' shape (1, fan_out); this network keeps biases as vectors.
            b = jnp.reshape(b, (fan_out,))
            params.append((W.astype(dtype), (b * (self.b_std / math.sqrt(fan_in))).astype(dtype)))
        masks = tuple((jnp.arange(p) < a).astype(dtype) for p, a in zip(self.widths, self.active))
        return tuple(params), masks

    def apply(self, params, masks, x, buckets=None):
        """Network output ``f(x)`` of shape ``(n, out_dim)``; ``buckets`` selects the compacted computation."""
        return _forward(params, masks, x, buckets)

    def check(self, params, masks, x=None):
        """Raise ``ValueError`` naming the first array whose shape or values do not fit this network."""
        dims = (self.in_dim,) + tuple(self.widths) + (self.out_dim,)
        if len(params) != self.num_layers + 1:
            raise ValueError(f"MaskedMLP: expected {self.num_layers + 1} (W, b) pairs, got {len(params)}")
        for k, ((W, b), fi, fo) in enumerate(zip(params, dims[:-1], dims[1:])):
            if tuple(W.shape) != (fi, fo) or tuple(b.shape) != (fo,):
                raise ValueError(f"MaskedMLP: layer {k + 1} has W {W.shape}, b {b.shape}; "
                                 f"expected ({fi}, {fo}), ({fo},)")
        if len(masks) != self.num_layers:
            raise ValueError(f"MaskedMLP: expected {self.num_layers} masks, got {len(masks)}")
        for k, (m, p) in enumerate(zip(masks, self.widths)):
            m = np.asarray(m)
            if m.shape != (p,):
                raise ValueError(f"MaskedMLP: mask {k + 1} has shape {m.shape}, expected ({p},)")
            if not np.all((m == 0) | (m == 1)):
                raise ValueError(f"MaskedMLP: mask {k + 1} must hold only 0 and 1")
            if m.sum() < 1:
                raise ValueError(f"MaskedMLP: mask {k + 1} has no active node (the prior requires s_l >= 1)")
        if x is not None:
            x = np.asarray(x)
            if x.ndim != 2 or x.shape[1] != self.in_dim:
                raise ValueError(f"MaskedMLP: inputs must have shape (n, {self.in_dim}), got {x.shape}")
            if not np.all(np.isfinite(x)):
                raise ValueError("MaskedMLP: inputs contain NaN or inf")


def masked_mlp(in_dim: int, widths: Sequence[int] = (1100, 1100), active: Sequence[int] | None = None,
               out_dim: int = 1, W_std: float = 1 / math.sqrt(3), b_std: float = 1 / math.sqrt(3)) -> MaskedMLP:
    """A masked ReLU MLP spec. ``active`` defaults to ``widths`` (all nodes on; the BNN).

    The authors used physical widths 1100 with the first 1000 active
    (``masked_mlp(d, (1100, 1100), (1000, 1000))``).

    Args:
        in_dim: input features (positive).
        widths: physical hidden widths ``p_l`` (positive), one per hidden layer.
        active: initially active nodes per layer, ``1 <= active[l] <= widths[l]``; ``None`` means all.
        out_dim: outputs (positive): 1 for regression, the number of classes for classification.
        W_std: weight scale of the initialisation (> 0; see :class:`MaskedMLP`).
        b_std: bias scale of the initialisation (>= 0; see :class:`MaskedMLP`).

    Returns:
        The :class:`MaskedMLP`.

    Raises:
        ValueError: a non-positive ``in_dim``, ``out_dim`` or width, an ``active`` count out of range or of the
            wrong length, or a bad ``W_std`` / ``b_std``.
    """
    widths = tuple(int(w) for w in widths)
    active = widths if active is None else tuple(int(a) for a in active)
    if int(in_dim) < 1 or int(out_dim) < 1:
        raise ValueError(f"masked_mlp: in_dim and out_dim must be positive, got {in_dim}, {out_dim}")
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"masked_mlp: widths must be positive integers, got {widths}")
    if len(active) != len(widths) or any(not 1 <= a <= w for a, w in zip(active, widths)):
        raise ValueError(f"masked_mlp: active must give 1 <= active_l <= width_l per layer, got {active} for {widths}")
    if not (W_std > 0 and b_std >= 0):
        raise ValueError(f"masked_mlp: W_std must be > 0 and b_std >= 0, got {W_std}, {b_std}")
    return MaskedMLP(int(in_dim), widths, active, int(out_dim), float(W_std), float(b_std))


def _forward(params, masks, x, buckets=None):
    """Full-width (``buckets=None``) or compacted forward pass; see the module docstring."""
    if buckets is not None and len(buckets) != len(masks):
        raise ValueError(f"apply: {len(buckets)} buckets for {len(masks)} masked layers")
    h = x
    prev_idx = None  # active indices of the previous layer when it was compacted
    for l, ((W, b), m) in enumerate(zip(params[:-1], masks)):
        p = m.shape[0]
        B = None if buckets is None else buckets[l]
        if B is None or B >= p:
            Wl = W if prev_idx is None else W[prev_idx]
            h = masked_relu(_affine(h, Wl, b), m)
            prev_idx = None
        else:
            on = jax.lax.stop_gradient(m) > 0.5
            idx = jnp.nonzero(on, size=B, fill_value=0)[0]
            valid = jnp.arange(B) < jnp.sum(on)
            Wl = W[:, idx] if prev_idx is None else W[prev_idx[:, None], idx[None, :]]
            h = masked_relu(_affine(h, Wl, b[idx]), jnp.where(valid, m[idx], 0.0))
            prev_idx = idx
    W, b = params[-1]
    return _affine(h, W if prev_idx is None else W[prev_idx], b)


def node_activations(params, masks, x, buckets=None):
    """Per hidden layer ``l``, the ReLU outputs ``max(h_{l-1} W_l + b_l, 0)`` of *all* ``p_l`` nodes, before the mask.

    ``h_{l-1}`` is the masked output of the layer below (``x`` for the first layer), so the result for layer ``l``
    depends on the weights and biases of layers ``1..l`` and on the masks of the layers *below* ``l`` only, not on
    ``m_l``. With ``buckets`` the layer below is compacted to its active nodes (``buckets[l-1]`` must hold them), so
    layer ``l`` costs ``n x B_{l-1} x p_l``; the values equal the full-width ones.

    Args:
        params: the parameters ``((W_1, b_1), ..., (W_{L+1}, b_{L+1}))``.
        masks: the node masks ``(m_1, ..., m_L)``, each ``(p_l,)``.
        x: inputs ``(n, in_dim)``.
        buckets: ``None`` (full width) or one block size per hidden layer (``None`` entries run at full width),
            as in ``MaskedMLP.apply``.

    Returns:
        A list with, per hidden layer, the activations ``(n, p_l)``.

    Raises:
        ValueError: ``buckets`` does not have one entry per masked layer.
    """
    if buckets is not None and len(buckets) != len(masks):
        raise ValueError(f"node_activations: {len(buckets)} buckets for {len(masks)} masked layers")
    out, h, prev_idx = [], x, None
    for l, ((W, b), m) in enumerate(zip(params[:-1], masks)):
        a = jnp.maximum(_affine(h, W if prev_idx is None else W[prev_idx], b), 0.0)
        out.append(a)
        B = None if buckets is None else buckets[l]
        if B is None or B >= m.shape[0]:
            h, prev_idx = a * lead(m, a.ndim), None
        else:
            on = jax.lax.stop_gradient(m) > 0.5
            idx = jnp.nonzero(on, size=B, fill_value=0)[0]
            h, prev_idx = a[:, idx] * jnp.where(jnp.arange(B) < jnp.sum(on), m[idx], 0.0)[None, :], idx
    return out


class EffectiveIndex(NamedTuple):
    """Per hidden layer: ``idx`` (B_l,) the active nodes first, then pads, and ``valid`` (B_l,) marking real ones.

    Pads point at an inactive node (or node 0 when none is inactive, which
    only happens when ``B_l`` equals the count), so that writing a block back
    with its pads restored never races with a real entry.
    """

    idx: tuple
    valid: tuple


def effective_index(masks, buckets=None) -> EffectiveIndex:
    """Indices of the active nodes, padded to ``buckets[l]`` (``None``: the physical width).

    Args:
        masks: the node masks, each a 0/1 array ``(p_l,)``.
        buckets: ``None`` or one block size ``B_l`` per hidden layer (``None`` entries: the physical width;
            sizes above ``p_l`` are cut to ``p_l``).

    Returns:
        An :class:`EffectiveIndex` with, per hidden layer, ``idx`` (integer, ``(B_l,)``) and ``valid`` (boolean,
        ``(B_l,)``).
    """
    idxs, valids = [], []
    for l, m in enumerate(masks):
        p = m.shape[0]
        B = p if buckets is None or buckets[l] is None else min(int(buckets[l]), p)
        on = jax.lax.stop_gradient(m) > 0.5
        pad = jnp.argmin(on)  # first inactive node (0 when all are active)
        idxs.append(jnp.nonzero(on, size=B, fill_value=pad)[0])
        valids.append(jnp.arange(B) < jnp.sum(on))
    return EffectiveIndex(tuple(idxs), tuple(valids))


def _block_index(index: EffectiveIndex, n_layers: int):
    """``(rows, cols, row_valid, col_valid)`` per layer; ``None`` means all rows/cols (input or output side)."""
    out = []
    for k in range(n_layers + 1):
        rows = None if k == 0 else index.idx[k - 1]
        cols = None if k == n_layers else index.idx[k]
        rv = None if k == 0 else index.valid[k - 1]
        cv = None if k == n_layers else index.valid[k]
        out.append((rows, cols, rv, cv))
    return out


def _take(W, rows, cols):
    if rows is not None and cols is not None:
        return W[rows[:, None], cols[None, :]]
    if rows is not None:
        return W[rows]
    return W if cols is None else W[:, cols]


def gather_effective(params, index: EffectiveIndex):
    """The effective parameters ``theta_E``: weights and biases between active nodes, as dense blocks.

    Args:
        params: the full parameters ``((W_1, b_1), ..., (W_{L+1}, b_{L+1}))``.
        index: the :class:`EffectiveIndex` of the masks (:func:`effective_index`).

    Returns:
        A tuple of ``(W, b)`` blocks, one per layer: the rows of the indexed nodes of the layer below (all input
        rows for the first layer) and the columns of the indexed nodes of the layer (all outputs for the last),
        e.g. ``(B_{l-1}, B_l)`` and ``(B_l,)`` between two hidden layers; pad positions hold the stored values of
        the node they point at.
    """
    blocks = []
    for (W, b), (rows, cols, _, _) in zip(params, _block_index(index, len(index.idx))):
        blocks.append((_take(W, rows, cols), b if cols is None else b[cols]))
    return tuple(blocks)


def effective_validity(index: EffectiveIndex, dtype=jnp.float32):
    """0/1 arrays shaped like ``theta_E``: 1 for real entries, 0 for pads (excluded from the prior).

    Args:
        index: the :class:`EffectiveIndex` the blocks were gathered with.
        dtype: the floating dtype of the arrays (default float32).

    Returns:
        A tuple of ``(weight validity, bias validity)`` per layer, broadcastable against the blocks of
        :func:`gather_effective` (axes of size 1 where every entry is real: the input rows of the first layer,
        the output columns and the bias of the last).
    """
    out = []
    for _, _, rv, cv in _block_index(index, len(index.idx)):
        r = None if rv is None else rv.astype(dtype)
        c = None if cv is None else cv.astype(dtype)
        if r is not None and c is not None:
            wv = r[:, None] * c[None, :]
        elif r is not None:
            wv = r[:, None]
        else:
            wv = jnp.ones((1, 1), dtype) if c is None else c[None, :]
        out.append((wv, jnp.ones((1,), dtype) if c is None else c))
    return tuple(out)


def scatter_effective(params, theta_e, index: EffectiveIndex):
    """Write ``theta_E`` back into the full parameters (pads keep the stored values).

    Args:
        params: the full parameters ``((W_1, b_1), ..., (W_{L+1}, b_{L+1}))`` to write into.
        theta_e: the blocks, shaped as returned by :func:`gather_effective`.
        index: the :class:`EffectiveIndex` the blocks were gathered with.

    Returns:
        The full parameters (a tuple of ``(W, b)``) with the real entries of ``theta_e`` written in.
    """
    out = []
    validity = effective_validity(index, params[0][0].dtype)
    for (W, b), (We, be), (wv, bv), (rows, cols, _, _) in zip(params, theta_e, validity,
                                                               _block_index(index, len(index.idx))):
        We = jnp.where(wv > 0, We, _take(W, rows, cols))
        if rows is not None and cols is not None:
            W = W.at[rows[:, None], cols[None, :]].set(We)
        elif rows is not None:
            W = W.at[rows].set(We)
        elif cols is not None:
            W = W.at[:, cols].set(We)
        else:
            W = We
        if cols is not None:
            b = b.at[cols].set(jnp.where(bv > 0, be, b[cols]))
        else:
            b = be
        out.append((W, b))
    return tuple(out)


def apply_effective(theta_e, masks, index: EffectiveIndex, x):
    """The network output from ``theta_E`` alone (equal to ``apply`` on the full parameters).

    Args:
        theta_e: the effective parameters from :func:`gather_effective`.
        masks: the full node masks, each ``(p_l,)``.
        index: the :class:`EffectiveIndex` the blocks were gathered with.
        x: inputs ``(n, in_dim)``.

    Returns:
        The network output ``(n, out_dim)``.
    """
    h = x
    for (W, b), m, idx, valid in zip(theta_e[:-1], masks, index.idx, index.valid):
        h = masked_relu(_affine(h, W, b), jnp.where(valid, m[idx], 0.0))
    W, b = theta_e[-1]
    return _affine(h, W, b)


def ineffective_masks(masks, dtype=jnp.float32):
    """0/1 arrays shaped like the parameters: 1 where an entry does not touch the likelihood.

    Args:
        masks: the node masks, each a 0/1 array ``(p_l,)``.
        dtype: the floating dtype of the arrays (default float32).

    Returns:
        A tuple of ``(weight mask, bias mask)`` per layer, broadcastable against ``(W_l, b_l)``: a weight is
        ineffective when the node it leaves or the node it enters is inactive, a bias when its node is; the
        output layer's bias is always effective (its mask is ``zeros((1,))``).

    Raises:
        ValueError: ``masks`` is empty (a network with no hidden layer).
    """
    act = [None] + [m.astype(dtype) for m in masks] + [None]
    out = []
    for k in range(len(masks) + 1):
        r, c = act[k], act[k + 1]
        if r is None and c is None:
            raise ValueError("ineffective_masks: a network with no hidden layer has no masks")
        if r is None:
            wm = jnp.broadcast_to(1.0 - c[None, :], (1, c.shape[0]))
        elif c is None:
            wm = (1.0 - r)[:, None]
        else:
            wm = 1.0 - r[:, None] * c[None, :]
        out.append((wm, jnp.zeros((1,), dtype) if c is None else 1.0 - c))
    return tuple(out)


def active_counts(masks) -> tuple:
    """Active nodes per layer, as Python ints (host side; concrete masks only).

    Args:
        masks: the node masks, each a 0/1 array ``(p_l,)``.

    Returns:
        A tuple with the number of active nodes of each layer.
    """
    return tuple(int(np.asarray(m).sum()) for m in masks)


def bucket_sizes(counts, widths, slack: int = 0, minimum: int = 16) -> tuple | None:
    """Power-of-two block sizes ``>= count + slack`` per layer; ``None`` where full width is as cheap.

    Returns ``None`` (full width everywhere) when every layer would need its
    whole physical width, else a tuple with ``None`` entries for layers that run
    at full width. ``counts`` may be per-chain arrays: the maximum is used.

    Args:
        counts: the active nodes per layer (ints, or per-chain arrays).
        widths: the physical widths ``p_l``.
        slack: room added to every count before rounding up (default 0).
        minimum: the smallest block size (default 16).
    """
    out = []
    for c, p in zip(counts, widths):
        need = int(np.max(c)) + int(slack)
        B = max(int(minimum), 1 << max(need - 1, 0).bit_length())
        out.append(None if B >= p else B)
    return None if all(b is None for b in out) else tuple(out)


# ---------------------------------------------------------------------------
# priors and likelihoods
# ---------------------------------------------------------------------------

def mask_prior_strength(lam: float, n: int) -> float:
    """``c = (lambda ln n)^5`` (paper eq. 4; natural log as in the authors' code).

    Args:
        lam: the paper's ``lambda`` (> 0).
        n: the training-set size (>= 2).

    Returns:
        ``c`` as a float.

    Raises:
        ValueError: ``lam <= 0`` or ``n < 2``.
    """
    if not lam > 0:
        raise ValueError(f"mask prior: lambda must be > 0, got {lam}")
    if int(n) < 2:
        raise ValueError(f"mask prior: n (training size) must be >= 2, got {n}")
    return float((lam * math.log(n)) ** 5)


def log_mask_prior(masks, c: float):
    """``sum_l [-c s_l^2 - log C(p_l, s_l)]`` (paper eqs. 4-5, up to a constant); ``-inf`` if some ``s_l = 0``.

    Args:
        masks: the node masks, each a 0/1 array ``(p_l,)``.
        c: the prior strength (:func:`mask_prior_strength`).

    Returns:
        The log mask prior, a scalar.
    """
    total = 0.0
    for m in masks:
        p = m.shape[0]
        s = jnp.sum(m)
        log_binom = gammaln(p + 1.0) - gammaln(s + 1.0) - gammaln(p - s + 1.0)
        total = total + jnp.where(s >= 1, -c * s**2 - log_binom, -jnp.inf)
    return total


def cauchy_log_prior(params, scale: float):
    """Sum of ``log Cauchy(theta; 0, scale)`` over every weight and bias (paper eq. 6).

    Args:
        params: a pytree of parameter arrays (every leaf counts, active or not).
        scale: the Cauchy scale (> 0).

    Returns:
        The log prior, a scalar.
    """
    prior = dist.Cauchy(0.0, scale)
    return sum(jnp.sum(prior.log_prob(x)) for x in jax.tree_util.tree_leaves(params))


def gaussian_loglik(f, y, sigma2):
    """``sum_i log N(y_i; f_i, sigma^2)`` and the residual sum of squares.

    Args:
        f: the network outputs, reshaped to the shape of ``y`` (e.g. ``(n, 1)`` for ``(n,)`` targets).
        y: the targets.
        sigma2: the noise variance ``sigma^2``.

    Returns:
        ``(log-likelihood, SSE)``, two scalars.
    """
    f = f.reshape(y.shape)
    sse = jnp.sum((y - f) ** 2)
    n = y.size
    return -0.5 * n * jnp.log(2 * jnp.pi * sigma2) - 0.5 * sse / sigma2, sse


def categorical_loglik(logits, y):
    """``sum_i log softmax(logits_i)[y_i]`` for integer labels ``y``.

    Args:
        logits: the network outputs ``(n, classes)``.
        y: the class labels ``(n,)`` (cast to int32).

    Returns:
        The log-likelihood, a scalar.
    """
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=-1))


def gibbs_sigma2(key, sse, n: int, a: float, b: float):
    """Conjugate draw ``sigma^2 | rest ~ InvGamma(a + n/2, b + SSE/2)`` (the authors' ``sigma_update`` with a = 1).

    Args:
        key: PRNG key.
        sse: the residual sum of squares ``SSE`` (from :func:`gaussian_loglik`).
        n: the number of observations.
        a: the shape of the inverse-gamma prior on ``sigma^2``.
        b: the scale of the inverse-gamma prior on ``sigma^2``.

    Returns:
        The drawn ``sigma^2``.
    """
    return dist.InverseGamma(a + 0.5 * n, b + 0.5 * sse).sample(key)


# ---------------------------------------------------------------------------
# masked CNN: one mask per channel
# ---------------------------------------------------------------------------

class MaskedCNN(NamedTuple):
    """Static description of a masked CNN: 3x3 'SAME' convolutions (``smnngp.stax.Conv``, standard
    parameterisation), each followed by a channel-masked ReLU, then a flattened dense readout (small images
    such as 8 x 8 digits keep their spatial layout; a ResNet would pool first).

    Attributes:
        in_shape: ``(H, W, C)``.
        channels: physical channels per conv layer.
        active: initially active channels (the first ``active[l]`` of each layer).
        out_dim: outputs of the dense readout (the number of classes).
    """

    in_shape: tuple
    channels: tuple
    active: tuple
    out_dim: int

    @property
    def widths(self) -> tuple:
        return self.channels

    def _layers(self):
        convs = [stax.Conv(c, (3, 3), padding="SAME", W_std=math.sqrt(2.0), b_std=0.0, parameterization="standard")
                 for c in self.channels]
        return convs, stax.Dense(self.out_dim, W_std=1.0, b_std=0.0, parameterization="standard")

    @property
    def _flat(self) -> int:
        return self.in_shape[0] * self.in_shape[1] * self.channels[-1]

    def init(self, key, dtype=jnp.float32):
        convs, dense = self._layers()
        keys = jax.random.split(key, len(convs) + 1)
        shape = (1,) + tuple(self.in_shape)
        params = []
        for k, layer in zip(keys[:-1], convs):
            shape, (W, b) = layer[0](k, shape)
            params.append((W.astype(dtype), jnp.zeros(W.shape[-1], dtype)))
        _, (W, b) = dense[0](keys[-1], (1, self._flat))
        params.append((W.astype(dtype), jnp.zeros(self.out_dim, dtype)))
        masks = tuple((jnp.arange(p) < a).astype(dtype) for p, a in zip(self.channels, self.active))
        return tuple(params), masks

    def apply(self, params, masks, x, buckets=None):
        convs, dense = self._layers()
        h = x
        for layer, p, m in zip(convs, params[:-1], masks):
            h = masked_relu(layer[1](p, h), m)
        return dense[1](params[-1], h.reshape(h.shape[0], -1))

    def flops_and_capacity(self, masks):
        """(multiply-accumulates per example, parameters) of the network made of the active channels only."""
        H, W, C = self.in_shape
        c_prev, macs, params = C, 0.0, 0.0
        for m in masks:
            c = float(np.asarray(m).sum())
            macs += H * W * 9 * c_prev * c
            params += 9 * c_prev * c + c
            c_prev = c
        macs += H * W * c_prev * self.out_dim
        params += H * W * c_prev * self.out_dim + self.out_dim
        return macs, params


def masked_cnn(in_shape, channels=(40, 80), active=None, out_dim: int = 10) -> MaskedCNN:
    """A masked CNN spec; ``active`` defaults to 4/5 of ``channels`` (the authors' ResNet-18 start).

    Args:
        in_shape: the image shape ``(H, W, C)``.
        channels: physical channels per conv layer.
        active: initially active channels per layer, ``1 <= active[l] <= channels[l]``; ``None``: 4/5 of
            ``channels`` (at least 1).
        out_dim: outputs of the dense readout (the number of classes).

    Returns:
        The :class:`MaskedCNN`.

    Raises:
        ValueError: ``in_shape`` is not three-dimensional, or an ``active`` count is out of range or of the wrong
            length.
    """
    channels = tuple(int(c) for c in channels)
    active = tuple(max(1, (4 * c) // 5) for c in channels) if active is None else tuple(int(a) for a in active)
    if len(tuple(in_shape)) != 3:
        raise ValueError(f"masked_cnn: in_shape must be (H, W, C), got {in_shape}")
    if len(active) != len(channels) or any(not 1 <= a <= c for a, c in zip(active, channels)):
        raise ValueError(f"masked_cnn: need 1 <= active_l <= channels_l, got {active} for {channels}")
    return MaskedCNN(tuple(int(s) for s in in_shape), channels, active, int(out_dim))
