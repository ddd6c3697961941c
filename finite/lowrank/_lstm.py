"""The LSTM of the PM2.5 experiments (paper G.4.2): `lstm_cell`, `LSTM` (weights sampled once per sequence and
reused across time in a ``lax.scan``, or resampled at every step) and the builder `lstm`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from finite.lowrank._dense import _DENSE, DeterministicDense, dense
from finite.lowrank._meanfield import MeanField, _draw_specs
from finite.lowrank._networks import _layer_options, _Network, _per_layer
from finite.lowrank._stochastic import _as_array, _jit_run
from finite.lowrank._validation import KINDS, _check_choice, _check_int

__all__ = ["LSTM", "lstm", "lstm_cell"]


def lstm_cell(ih, hh, w_ih, w_hh, x_t, carry):
    """One LSTM step ``(h, c) -> (h', c')`` with drawn weights (gates packed ``i, f, g, o``; paper G.4.2).

    ``z = x_t W_ih + b_ih + h W_hh``; ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``; ``h' = sigmoid(o) tanh(c')``.
    ``ih``/``hh`` are the dense specs of ``x_to_gates`` / ``h_to_gates``.

    Args:
        ih: dense layer spec of ``x_to_gates`` (``d_in -> 4H``).
        hh: dense layer spec of ``h_to_gates`` (``H -> 4H``).
        w_ih: drawn weights of ``ih`` (from its ``sample``).
        w_hh: drawn weights of ``hh``.
        x_t: inputs at this time step, shape ``(batch, d_in)``.
        carry: the pair ``(h, c)`` of hidden and cell states, each ``(batch, H)``.

    Returns:
        The new pair ``(h', c')``, each of shape ``(batch, H)``.
    """
    h, c = carry
    z = ih.forward(w_ih, x_t) + hh.forward(w_hh, h)
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return h, c


@dataclasses.dataclass(frozen=True)
class LSTM(_Network):
    """Stacked LSTM with ``x_to_gates`` (``d_in -> 4H``, with bias) and ``h_to_gates`` (``H -> 4H``, no bias) of
    any kind, and a dense head on the top layer's last hidden state (paper Sec. 2.4, G.4.2). Build with
    :func:`lstm`.

    ``resample_per_step=False``: every layer's weights are drawn **once per sequence** (per forward pass, shared
    by the batch; :meth:`sample` with ``key``) outside the ``lax.scan`` and reused at every time step
    (Fortunato et al. 2017, Alg. 2; the input projection of all steps is then one matmul). ``True``: layer
    ``l`` draws fresh gate weights at step ``t`` from ``fold_in(fold_in(key, l + 1), t)`` (for the benchmark);
    the head keeps the once-per-sequence draw. The KL is that of the once-per-sequence draw in both cases (a
    single-sample estimate; with per-step resampling an independent draw). :meth:`step_weights` returns the
    weights used at a step.

    ``params = {"ih": (...), "hh": (...), "head": p}`` (component ``i`` of ``ih + hh + (head,)`` initialised
    with ``fold_in(key, i)``).
    """

    ih: tuple
    hh: tuple
    head: Any
    resample_per_step: bool = False

    def __post_init__(self):
        if len(self.ih) != len(self.hh) or len(self.ih) < 1:
            raise ValueError("LSTM: ih and hh must hold one spec per layer (at least one)")
        hidden = self.hh[0].n_in
        for l, (a, b) in enumerate(zip(self.ih, self.hh)):
            if b.n_in != hidden or b.n_out != 4 * hidden or a.n_out != 4 * hidden:
                raise ValueError(f"LSTM: layer {l} gate projections must map to 4 * hidden = {4 * hidden}")
            if l > 0 and a.n_in != hidden:
                raise ValueError(f"LSTM: layer {l} x_to_gates must take hidden = {hidden} inputs, got {a.n_in}")
        if self.head.n_in != hidden:
            raise ValueError(f"LSTM: head must take hidden = {hidden} inputs, got {self.head.n_in}")

    @property
    def hidden(self) -> int:
        return self.hh[0].n_in

    @property
    def in_dim(self) -> int:
        return self.ih[0].n_in

    @property
    def num_layers(self) -> int:
        return len(self.ih)

    def _specs(self):
        return tuple(self.ih) + tuple(self.hh) + (self.head,)

    def _init_keys(self, key):
        L = self.num_layers
        return ([jax.random.fold_in(key, l) for l in range(L)], [jax.random.fold_in(key, L + l) for l in range(L)],
                jax.random.fold_in(key, 2 * L))

    def _param_list(self, params):
        return tuple(params["ih"]) + tuple(params["hh"]) + (params["head"],)

    def _weight_list(self, weights):
        return list(weights["ih"]) + list(weights["hh"]) + [weights["head"]]

    def _init_impl(self, key, dtype=jnp.float32):
        """``{"ih", "hh", "head"}``; the forget-gate slice of every ``x_to_gates`` bias starts at 1.0."""
        kih, khh, khead = self._init_keys(key)
        H = self.hidden
        ih = []
        for l, s in enumerate(self.ih):
            p = s.init(kih[l], dtype)
            if p.b is not None:
                b = p.b
                if isinstance(b, MeanField):
                    b = MeanField(b.mu.at[H:2 * H].set(1.0), b.rho)
                else:
                    b = b.at[H:2 * H].set(1.0)
                p = p._replace(b=b)
            ih.append(p)
        hh = tuple(s.init(khh[l], dtype) for l, s in enumerate(self.hh))
        return {"ih": tuple(ih), "hh": hh, "head": self.head.init(khead, dtype)}

    def sample(self, params, key):
        """The once-per-sequence draw ``{"ih": (...), "hh": (...), "head": w}`` (one uniform draw)."""
        L = self.num_layers
        w = _draw_specs(self._specs(), self._param_list(params), key)
        return {"ih": tuple(w[:L]), "hh": tuple(w[L:2 * L]), "head": w[2 * L]}

    def _step_draw(self, l, params, key, t):
        k = jax.random.fold_in(jax.random.fold_in(key, l + 1), t)
        return _draw_specs((self.ih[l], self.hh[l]), (params["ih"][l], params["hh"][l]), k)

    def step_weights(self, params, key, t):
        """The gate weights ``{"ih": (...), "hh": (...)}`` used at time step ``t``: the once-per-sequence draw, or
        with ``resample_per_step`` layer ``l``'s draw from ``fold_in(fold_in(key, l + 1), t)``."""
        if not self.resample_per_step:
            w = self.sample(params, key)
            return {"ih": w["ih"], "hh": w["hh"]}
        draws = [self._step_draw(l, params, key, t) for l in range(self.num_layers)]
        return {"ih": tuple(d[0] for d in draws), "hh": tuple(d[1] for d in draws)}

    def _layer_scan(self, l, params, key, seq, w_ih, w_hh):
        ih, hh = self.ih[l], self.hh[l]
        T, B = seq.shape[0], seq.shape[1]
        zeros = jnp.zeros((B, self.hidden), seq.dtype)
        if not self.resample_per_step:
            xg = ih.forward(w_ih, seq)  # (T, B, 4H): one matmul for all steps, the weights being shared

            def body(carry, xg_t):
                h, c = carry
                z = xg_t + hh.forward(w_hh, h)
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            _, hs = lax.scan(body, (zeros, zeros), xg)
            return hs

        def body_rs(carry, inp):
            t, x_t = inp
            wi, wh = self._step_draw(l, params, key, t)
            carry = lstm_cell(ih, hh, wi, wh, x_t, carry)
            return carry, carry[0]

        _, hs = lax.scan(body_rs, (zeros, zeros), (jnp.arange(T), seq))
        return hs

    def _run(self, params, x, key, prior, method, return_sequence=False):
        if not hasattr(x, "ndim") or x.ndim != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"LSTM.apply: x must have shape (batch, time, {self.in_dim}), got "
                             f"{tuple(getattr(x, 'shape', ()))}")
        self._need_key(key, "LSTM.apply")
        L = self.num_layers
        specs, plist = self._specs(), self._param_list(params)
        wl, flat = _draw_specs(specs, plist, key, with_flat=True)
        w = {"ih": tuple(wl[:L]), "hh": tuple(wl[L:2 * L]), "head": wl[2 * L]}
        seq = jnp.swapaxes(x, 0, 1)  # (T, B, d)
        for l in range(L):
            seq = self._layer_scan(l, params, key, seq, w["ih"][l], w["hh"][l])
        out = self.head.forward(w["head"], seq[-1])
        kl = jnp.asarray(self._kl_from(specs, plist, flat, prior, method), out.dtype)
        if return_sequence:
            return (out, jnp.swapaxes(seq, 0, 1)), kl
        return out, kl

    def apply(self, params, x, key=None, return_sequence: bool = False):
        """Head output ``(batch, d_out)`` for ``x`` of shape ``(batch, time, d_in)``; with ``return_sequence``
        also the top layer's hidden states ``(batch, time, H)``."""
        return _jit_run(self, params, _as_array(x), key, None, "mc", (bool(return_sequence),))[0]

    def from_deterministic(self, det_params, key):
        """Warm-start from the deterministic twin's params (SVD for low-rank gate matrices, App. F.9)."""
        kih, khh, khead = self._init_keys(key)
        return {"ih": tuple(s.from_deterministic(p, k) for s, p, k in zip(self.ih, det_params["ih"], kih)),
                "hh": tuple(s.from_deterministic(p, k) for s, p, k in zip(self.hh, det_params["hh"], khh)),
                "head": self.head.from_deterministic(det_params["head"], khead)}

    def deterministic_twin(self) -> LSTM:
        """Same sizes, deterministic layers (Glorot input, orthogonal recurrent; Table 7)."""
        return LSTM(tuple(DeterministicDense(s.n_in, s.n_out) for s in self.ih),
                    tuple(DeterministicDense(s.n_in, s.n_out, bias="none", init_method="orthogonal")
                          for s in self.hh),
                    DeterministicDense(self.head.n_in, self.head.n_out,
                                       bias="none" if self.head.bias == "none" else "deterministic"))


def lstm(d_in: int, hidden: int, d_out: int = 1, num_layers: int = 2, kind: str = "lowrank", *,
         rank_ih=None, rank_hh=None, head_kind: str | None = None, head_rank: int | None = 1,
         resample_per_step: bool = False, bias: str | None = None, family: str = "gaussian",
         **options) -> LSTM:
    """An :class:`LSTM` of ``num_layers`` layers of width ``hidden`` and a dense head ``hidden -> d_out``.

    Args:
      d_in: number of input features per time step.
      hidden: hidden width ``H`` of every layer.
      d_out: number of outputs of the head.
      num_layers: number of stacked LSTM layers.
      kind: kind of every gate projection.
      rank_ih: rank of the input-to-gates projections when ``kind="lowrank"``, an int or one per layer (the
        paper's Beijing model: 14).
      rank_hh: rank of the hidden-to-gates projections when ``kind="lowrank"``, an int or one per layer (the
        paper's Beijing model: 20).
      head_kind: the head's kind (default ``kind``).
      head_rank: the head's rank when ``head_kind`` is ``"lowrank"`` (default 1, "low-rank output head uses
        rank = 1", Table 7).
      bias: bias kind of ``x_to_gates`` and the head (``h_to_gates`` has none); default per kind.
      resample_per_step: see :class:`LSTM`.
      family: ``"gaussian"`` or ``"laplace"`` for the stochastic layers.
      options: further layer fields (``eta``, ``rho_range``, ...), applied to the layers whose class has them.

    Returns:
      The :class:`LSTM` spec. Gate projections are Glorot-initialised (orthogonal recurrent matrices for the
      deterministic kind); ``"bbb"`` layers keep their class default.

    Raises:
      ValueError: if a size is not a positive integer, a kind is unknown, ``kind="lowrank"`` lacks
        ``rank_ih`` or ``rank_hh``, a per-layer rank sequence has the wrong length, or a layer rejects its
        settings.
    """
    where = "lstm"
    d_in = _check_int(d_in, "d_in", where)
    hidden = _check_int(hidden, "hidden", where)
    d_out = _check_int(d_out, "d_out", where)
    num_layers = _check_int(num_layers, "num_layers", where)
    _check_choice(kind, KINDS, "kind", where)
    head_kind = kind if head_kind is None else head_kind
    _check_choice(head_kind, KINDS, "head_kind", where)
    r_ih = _per_layer(rank_ih, num_layers, "rank_ih", where)
    r_hh = _per_layer(rank_hh, num_layers, "rank_hh", where)
    ih, hh = [], []
    for l in range(num_layers):
        n_in = d_in if l == 0 else hidden
        if kind == "lowrank" and (r_ih[l] is None or r_hh[l] is None):
            raise ValueError(f"{where}: rank_ih and rank_hh are required for kind='lowrank'")
        r1, r2 = (r_ih[l], r_hh[l]) if kind == "lowrank" else (None, None)
        opts = _layer_options(_DENSE[kind], dict(options, family=family))
        init_ih = "glorot" if kind in ("deterministic", "lowrank", "rank1") else None
        init_hh = "orthogonal" if kind == "deterministic" else init_ih
        ih.append(dense(kind, n_in, 4 * hidden, rank=r1, bias=bias, init=init_ih, **opts))
        hh.append(dense(kind, hidden, 4 * hidden, rank=r2, bias="none", init=init_hh, **opts))
    hopts = _layer_options(_DENSE[head_kind], dict(options, family=family))
    head = dense(head_kind, hidden, d_out, rank=head_rank if head_kind == "lowrank" else None, bias=bias,
                 init="glorot" if head_kind in ("deterministic", "lowrank", "rank1") else None, **hopts)
    return LSTM(tuple(ih), tuple(hh), head, bool(resample_per_step))
