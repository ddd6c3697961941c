"""The pre-norm Transformer encoder of the SST-2 experiments (paper G.5): `EncoderBlock` (multi-head attention
and FFN), `Transformer` (embedding, positions, blocks, CLS pooling, head) and the builder `transformer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from finite.lowrank._dense import _DENSE, DeterministicDense, dense
from finite.lowrank._embedding import _EMBED, DeterministicEmbedding, _check_tokens, embedding
from finite.lowrank._meanfield import _draw_specs
from finite.lowrank._networks import _activation, _layer_options, _Network
from finite.lowrank._stochastic import _as_array, _jit_encode
from finite.lowrank._validation import KINDS, _check_choice, _check_int, _float_dtype
from smnngp._axes import lead

__all__ = ["EncoderBlock", "Transformer", "transformer"]


def _layer_norm(x, scale, bias, eps: float):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * lead(scale, x.ndim) + lead(bias, x.ndim)


def sinusoidal_positions(length: int, dim: int, dtype=jnp.float32):
    """Fixed sinusoidal positional encodings ``(length, dim)`` (Vaswani et al. 2017); no parameters."""
    pos = np.arange(length)[:, None]
    i = np.arange(dim)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / dim)
    return jnp.asarray(np.where(i % 2 == 0, np.sin(angle), np.cos(angle)), dtype)


@dataclasses.dataclass(frozen=True)
class EncoderBlock:
    """One pre-norm encoder block: ``h = x + O(MHA(LN1(x)))``, ``h = h + FF2(act(FF1(LN2(h))))``.

    ``q, k, v, o`` (``d -> d``) and ``ff1`` (``d -> d_ff``), ``ff2`` (``d_ff -> d``) are dense specs of any kind;
    the LayerNorms are deterministic (``2 d`` parameters each).

    Attributes:
        q: dense spec of the query projection (``d -> d``).
        k: dense spec of the key projection (``d -> d``).
        v: dense spec of the value projection (``d -> d``).
        o: dense spec of the attention output projection (``d -> d``).
        ff1: dense spec of the first feed-forward layer (``d -> d_ff``).
        ff2: dense spec of the second feed-forward layer (``d_ff -> d``).
        num_heads: number of attention heads (must divide ``d``; checked by :class:`Transformer`).
        activation: the feed-forward activation, a callable (GELU by default).
    """

    q: Any
    k: Any
    v: Any
    o: Any
    ff1: Any
    ff2: Any
    num_heads: int
    activation: Callable = jax.nn.gelu

    NAMES = ("q", "k", "v", "o", "ff1", "ff2")

    @property
    def d_model(self) -> int:
        return self.q.n_in

    def specs(self):
        return tuple(getattr(self, n) for n in self.NAMES)


@dataclasses.dataclass(frozen=True)
class Transformer(_Network):
    """Pre-norm Transformer encoder classifier (paper Sec. 2.4, 4.4, G.5.2): embedding (+ fixed sinusoidal
    positions, or none), ``num_layers`` :class:`EncoderBlock`, CLS pooling (position 0), dense head. Build with
    :func:`transformer`.

    ``apply(params, tokens, key)`` takes integer ``tokens (batch, length)``; positions equal to ``pad_id`` are
    masked out as attention keys (``None``: no masking). ``encode`` returns the hidden states before pooling.
    Draws: the embedding's rows with ``fold_in(key, 0)`` (only the looked-up rows, :class:`LowRankEmbedding`),
    every other layer from one uniform draw with ``fold_in(key, 1)``.

    Attributes:
        embed: the embedding spec (any of the four embedding kinds), ``vocab x d_model``.
        blocks: tuple of :class:`EncoderBlock`, each of width ``d_model``.
        head: dense spec of the classifier head (``d_model -> num_classes``).
        max_len: the longest token sequence ``apply`` accepts.
        positional: ``"sinusoidal"`` (fixed encodings added to the embeddings) or ``"none"``.
        pad_id: token id masked out as attention key, or ``None``.
        ln_eps: the epsilon of every LayerNorm.

    Raises:
        ValueError: on construction, if ``positional`` is unknown, a block's width differs from the embedding's,
            ``d_model`` is not divisible by a block's ``num_heads``, or the head does not take ``d_model`` inputs.
    """

    embed: Any
    blocks: tuple
    head: Any
    max_len: int = 64
    positional: str = "sinusoidal"
    pad_id: int | None = None
    ln_eps: float = 1e-6

    def __post_init__(self):
        d = self.embed.dim
        _check_choice(self.positional, ("sinusoidal", "none"), "positional", "Transformer")
        for i, b in enumerate(self.blocks):
            if b.d_model != d:
                raise ValueError(f"Transformer: block {i} has d_model {b.d_model}, the embedding {d}")
            if d % b.num_heads:
                raise ValueError(f"Transformer: d_model {d} is not divisible by num_heads {b.num_heads}")
        if self.head.n_in != d:
            raise ValueError(f"Transformer: head must take d_model = {d} inputs, got {self.head.n_in}")

    @property
    def d_model(self) -> int:
        return self.embed.dim

    def _specs(self):
        out = [self.embed]
        for b in self.blocks:
            out.extend(b.specs())
        out.append(self.head)
        return tuple(out)

    def _keys(self, key):
        n = len(self._specs())
        return [jax.random.fold_in(key, i) for i in range(n)]

    def _draw_keys(self, key):
        return (None, None) if key is None else (jax.random.fold_in(key, 0), jax.random.fold_in(key, 1))

    def sample(self, params, key):
        """One draw ``{"embed": full-table draw, "blocks": ({"q": w, ...}, ...), "head": w}`` (the table's rows equal
        what ``apply`` looks up with the same key)."""
        k_emb, k_rest = self._draw_keys(key)
        rest = self._draw_rest(params, k_rest)
        return {"embed": self.embed.sample(params["embed"], k_emb), "blocks": rest[0], "head": rest[1]}

    def _dense_specs(self):
        return tuple(s for b in self.blocks for s in b.specs()) + (self.head,)

    def _dense_params(self, params):
        return [bp[n] for bp in params["blocks"] for n in EncoderBlock.NAMES] + [params["head"]]

    def _dense_key(self, key):
        return self._draw_keys(key)[1]

    def _extra_kl(self, params, key, prior, method):
        if prior is None or self.embed.kind == "deterministic":
            return 0.0
        return self.embed._kl_impl(params["embed"], prior, self._draw_keys(key)[0], method)

    def _draw_rest(self, params, key, with_flat=False):
        w, flat = _draw_specs(self._dense_specs(), self._dense_params(params), key, with_flat=True)
        blocks = tuple(dict(zip(EncoderBlock.NAMES, w[6 * i:6 * i + 6])) for i in range(len(self.blocks)))
        return (blocks, w[-1], flat) if with_flat else (blocks, w[-1])

    def _weight_list(self, weights):
        out = [weights["embed"]]
        for bw in weights["blocks"]:
            out.extend(bw[n] for n in EncoderBlock.NAMES)
        out.append(weights["head"])
        return out

    def _param_list(self, params):
        out = [params["embed"]]
        for bp in params["blocks"]:
            out.extend(bp[n] for n in EncoderBlock.NAMES)
        out.append(params["head"])
        return tuple(out)

    def _extra_params(self) -> int:
        return 4 * self.d_model * len(self.blocks)  # two LayerNorms (scale, bias) per block

    def _init_impl(self, key, dtype=jnp.float32):
        """``{"embed", "blocks": ({"q", ..., "ff2", "ln1", "ln2"}, ...), "head"}``."""
        dtype = _float_dtype(dtype)
        keys = self._keys(key)
        d = self.d_model
        blocks, j = [], 1
        for b in self.blocks:
            bp = {}
            for n, s in zip(EncoderBlock.NAMES, b.specs()):
                bp[n] = s.init(keys[j], dtype)
                j += 1
            bp["ln1"] = (jnp.ones((d,), dtype), jnp.zeros((d,), dtype))
            bp["ln2"] = (jnp.ones((d,), dtype), jnp.zeros((d,), dtype))
            blocks.append(bp)
        return {"embed": self.embed.init(keys[0], dtype), "blocks": tuple(blocks),
                "head": self.head.init(keys[-1], dtype)}

    def _attention(self, block, w, x, mask):
        B, L, d = x.shape
        H = block.num_heads
        q = block.q.forward(w["q"], x).reshape(B, L, H, d // H)
        k = block.k.forward(w["k"], x).reshape(B, L, H, d // H)
        v = block.v.forward(w["v"], x).reshape(B, L, H, d // H)
        scores = jnp.einsum("blhd,bmhd->bhlm", q, k) / jnp.sqrt(jnp.asarray(d // H, x.dtype))
        if mask is not None:
            scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
        attn = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhlm,bmhd->blhd", attn, v).reshape(B, L, d)
        return block.o.forward(w["o"], out)

    def _encode(self, params, tokens, key, prior, method):
        _check_tokens(tokens, self.embed.vocab, "Transformer.apply")
        if tokens.ndim != 2:
            raise ValueError(f"Transformer.apply: tokens must have shape (batch, length), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"Transformer.apply: tokens have length {tokens.shape[1]} > max_len {self.max_len}")
        self._need_key(key, "Transformer.apply")
        k_emb, k_rest = self._draw_keys(key)
        dtype = jax.tree.leaves(params["head"])[0].dtype
        x = self.embed.lookup(params["embed"], tokens, k_emb).astype(dtype)
        wblocks, whead, flat = self._draw_rest(params, k_rest, with_flat=True)
        kl = jnp.asarray(self._kl_from(self._dense_specs(), self._dense_params(params), flat, prior, method)
                         + self._extra_kl(params, key, prior, method), dtype)
        if self.positional == "sinusoidal":
            x = x + sinusoidal_positions(tokens.shape[1], self.d_model, dtype)[None]
        mask = None if self.pad_id is None else tokens != self.pad_id
        for b, bp, w in zip(self.blocks, params["blocks"], wblocks):
            x = x + self._attention(b, w, _layer_norm(x, *bp["ln1"], self.ln_eps), mask)
            h = _layer_norm(x, *bp["ln2"], self.ln_eps)
            x = x + b.ff2.forward(w["ff2"], b.activation(b.ff1.forward(w["ff1"], h)))
        return x, kl, whead

    def encode(self, params, tokens, key=None):
        """Hidden states ``(batch, length, d_model)`` before pooling (permutation-equivariant in the positions
        when ``positional="none"`` and ``pad_id=None``)."""
        return _jit_encode(self, params, _as_array(tokens), key)

    def _run(self, params, tokens, key, prior, method):
        x, kl, wh = self._encode(params, tokens, key, prior, method)
        return self.head.forward(wh, x[:, 0]), kl  # CLS pooling

    def from_deterministic(self, det_params, key):
        """Warm start from the deterministic twin (SVD init of every low-rank matrix and the embedding, App. F.9;
        LayerNorms copied)."""
        keys = self._keys(key)
        blocks, j = [], 1
        for b, dbp in zip(self.blocks, det_params["blocks"]):
            bp = {}
            for n, s in zip(EncoderBlock.NAMES, b.specs()):
                bp[n] = s.from_deterministic(dbp[n], keys[j])
                j += 1
            bp["ln1"], bp["ln2"] = dbp["ln1"], dbp["ln2"]
            blocks.append(bp)
        return {"embed": self.embed.from_deterministic(det_params["embed"], keys[0]), "blocks": tuple(blocks),
                "head": self.head.from_deterministic(det_params["head"], keys[-1])}

    def deterministic_twin(self) -> Transformer:
        """Same sizes, deterministic layers and embedding."""
        def det(s):
            return DeterministicDense(s.n_in, s.n_out, bias="none" if s.bias == "none" else "deterministic")

        blocks = tuple(EncoderBlock(*(det(s) for s in b.specs()), num_heads=b.num_heads, activation=b.activation)
                       for b in self.blocks)
        return Transformer(DeterministicEmbedding(self.embed.vocab, self.embed.dim), blocks, det(self.head),
                           self.max_len, self.positional, self.pad_id, self.ln_eps)


def transformer(vocab_size: int = 30522, d_model: int = 256, num_layers: int = 4, num_heads: int = 4,
                d_ff: int = 512, max_len: int = 64, num_classes: int = 2, kind: str = "lowrank", *,
                rank: int | None = 16, embed_rank: int | None = None, embed_kind: str | None = None,
                head_kind: str | None = None, head_rank: int | None = None, bias: str | None = None,
                activation="gelu", positional: str = "sinusoidal", pad_id: int | None = None,
                overcomplete: bool = False, family: str = "gaussian", **options) -> Transformer:
    """A :class:`Transformer`; defaults are the paper's SST-2 encoder (Sec. 4.4, G.5.2: ``d_model = 256``, 4
    layers, 4 heads, ``d_ff = 512``, length 64, 2 classes, rank 16, BERT vocabulary 30,522).

    Args:
      vocab_size: vocabulary size of the embedding.
      d_model: model width (embedding dimension).
      num_layers: number of encoder blocks.
      num_heads: attention heads per block (must divide ``d_model``).
      d_ff: hidden width of the feed-forward layers.
      max_len: the longest token sequence accepted.
      num_classes: outputs of the head.
      kind: kind of Q, K, V, O, FF1, FF2 (and by default of the embedding and the head).
      rank: their rank when low-rank.
      embed_rank: the embedding's rank when low-rank (default ``rank``; Table 8 prints ``r_e = 10`` but its
        1.47M count needs 16, notes 4.7).
      embed_kind: override the embedding's kind (default ``kind``).
      head_kind: override the head's kind (default ``kind``).
      head_rank: the head's rank when low-rank (default ``min(rank, d_model, num_classes)``; the 1.47M count
        needs 16, i.e. ``overcomplete=True``).
      bias: bias kind of all dense layers (default per kind; Table 8: Bayesian ``b: mu = 0, rho = -5`` for the
        low-rank model).
      activation: FFN activation (the paper leaves it open; GELU by default).
      positional: ``"sinusoidal"`` (parameter-free) or ``"none"``.
      pad_id: token id masked as attention key (``None``: no masking).
      overcomplete: allow low-rank matrices whose rank exceeds their smaller dimension.
      family: ``"gaussian"`` or ``"laplace"`` for the stochastic layers.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`Transformer` spec.

    Raises:
      ValueError: if a size is not a positive integer, ``d_model`` is not divisible by ``num_heads``, a kind or
        the activation name is unknown, ``rank`` is ``None`` while a layer is low-rank, or a layer rejects its
        settings (e.g. a rank above a matrix's smaller dimension without ``overcomplete``).
    """
    where = "transformer"
    for name, v in (("vocab_size", vocab_size), ("d_model", d_model), ("num_layers", num_layers),
                    ("num_heads", num_heads), ("d_ff", d_ff), ("max_len", max_len), ("num_classes", num_classes)):
        _check_int(v, name, where)
    if d_model % num_heads:
        raise ValueError(f"{where}: d_model {d_model} must be divisible by num_heads {num_heads}")
    _check_choice(kind, KINDS, "kind", where)
    embed_kind = kind if embed_kind is None else _check_choice(embed_kind, KINDS, "embed_kind", where)
    head_kind = kind if head_kind is None else _check_choice(head_kind, KINDS, "head_kind", where)
    act = _activation(activation, where)
    if "lowrank" in (kind, embed_kind, head_kind) and rank is None:
        raise ValueError(f"{where}: rank is required for low-rank layers")
    r = rank if kind == "lowrank" else None
    opts = _layer_options(_DENSE[kind], dict(options, family=family, overcomplete=overcomplete))

    def lin(n_in, n_out):
        return dense(kind, n_in, n_out, rank=r, bias=bias, **opts)

    blocks = tuple(EncoderBlock(lin(d_model, d_model), lin(d_model, d_model), lin(d_model, d_model),
                                lin(d_model, d_model), lin(d_model, d_ff), lin(d_ff, d_model), num_heads, act)
                   for _ in range(num_layers))
    e_rank = (rank if embed_rank is None else embed_rank) if embed_kind == "lowrank" else None
    eopts = {k: v for k, v in dict(options, family=family, overcomplete=overcomplete).items()
             if k in {f.name for f in dataclasses.fields(_EMBED[embed_kind])}}
    emb = embedding(embed_kind, vocab_size, d_model, rank=e_rank, **eopts)
    h_rank = None
    if head_kind == "lowrank":
        h_rank = min(rank, d_model, num_classes) if head_rank is None else head_rank
    hopts = _layer_options(_DENSE[head_kind], dict(options, family=family, overcomplete=overcomplete))
    head = dense(head_kind, d_model, num_classes, rank=h_rank, bias=bias, **hopts)
    return Transformer(emb, blocks, head, int(max_len), positional, pad_id)
