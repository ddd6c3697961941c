"""Birth/death Metropolis-Hastings moves on node masks (Kong et al. 2023, Algorithm 1; notes section 2.4).

One move, with the network weights and noise fixed:

1. ``u ~ Bernoulli(1/2)``: birth (``u = 0``, switch inactive nodes on) or
   death (``u = 1``, switch active nodes off); ``N ~ U{1, ..., N_max}``.
2. Selection weights over the eligible entries ``{j : m_j = u}`` of the mask
   concatenated over all layers, from one of the proposals of the paper's
   ablation (section 6.5), chosen independently for births and deaths:

   * ``"uniform"``      (13)  ``Q_j propto 1``
   * ``"sensitivity"``  (14)  ``Q_j propto exp(-|d l / d m_j| / 2)``
   * ``"informed"``     (15)  ``Q_j propto exp((1 - 2u) (d l / d m_j) / 2)``
     (the first-order, locally balanced proposal of Grathwohl et al. 2021)

   where ``l`` is the log-likelihood and ``d l / d m_j`` its derivative with
   respect to a relaxed (continuous) mask at the current binary mask. The
   paper's choice is uniform births and sensitivity deaths.
3. ``N`` entries are drawn by successive sampling without replacement (done
   here with the Gumbel top-k trick, which has exactly that law); the
   probability of the unordered set sums over all ``N!`` orderings.
4. The move is accepted with probability
   ``min(1, pi(M*) Q*_{1-u}(S) / (pi(M) Q_u(S)))`` where ``Q*`` are the
   reverse move's weights evaluated at the proposed mask (so a death
   proposal's reverse needs the gradient at ``M*``), and ``pi`` is the
   likelihood times the mask prior. A proposal that leaves a layer with no
   active node has prior probability zero and is rejected.

**Merge/split moves** (`transfer_move`, beyond the paper; masked-BNN mixing issue): a death that keeps the
function. ReLU is positively homogeneous, so a node ``j`` whose activations are (nearly) ``k`` times those of
node ``i`` of the same layer can be switched off and its outgoing weights added, times ``k``, to node ``i``'s,
changing the network output by ``v_j (h_j - k h_i)`` only. The move is deterministic given its choices and has
an exact inverse (the split), so it is an MH move on the joint ``(theta, M)``:

1. split or merge with probability 1/2 each, a hidden layer ``l`` uniformly;
2. ``j`` uniformly among the active nodes of layer ``l`` (merge) or the inactive ones (split);
3. ``i`` among the active nodes other than ``j`` with probability ``propto exp(kappa s_ij)``, ``s_ij`` the cosine
   of the ReLU activations of nodes ``i`` and ``j`` on the training inputs (before the mask, as in
   `finite.masked.node_activations`), and ``k_ij = <h_i, h_j> / |h_i|^2`` (0 when ``h_i = 0``);
4. merge: ``m_j <- 0`` and ``W_{l+1}[i, :] <- W_{l+1}[i, :] + k_ij W_{l+1}[j, :]``;
   split: ``m_j <- 1`` and ``W_{l+1}[i, :] <- W_{l+1}[i, :] - k_ij W_{l+1}[j, :]``.

The activations of layer ``l`` depend only on the weights into layers ``1..l`` and the masks below ``l``, none
of which the move changes, so ``s_ij`` and ``k_ij`` are the same before and after it; the node ``j`` keeps its
(now ineffective, or once more effective) weights. Hence a merge at ``x`` with ``(l, i, j)`` and the split at
``x'`` with the same ``(l, i, j)`` are each other's inverse, and the map ``(w_i, w_j) -> (w_i +- k w_j, w_j)`` on
the rows has Jacobian 1. The candidate set for ``i`` is the active set without ``j`` in both states, so the
factor ``exp(kappa s_ij) / sum`` cancels, and with ``A``/``D`` the active/inactive counts of layer ``l`` at ``x``

    merge:  log alpha = Delta log p(y | theta, M) + Delta log Pi(M) + Delta log Cauchy(W_{l+1}[i, :])
                        + log |A| - log(|D| + 1)
    split:  the same with + log |D| - log(|A| + 1),

where ``Delta log Pi(M)`` is the mask prior and the Cauchy term covers the one row that changes (every weight
carries the Cauchy prior, effective or not). A merge needs ``|A| >= 2`` and a split ``|D| >= 1``.

``authors_guard=True`` reproduces a rule of the authors' code that is not in
the paper: after acceptance, each flip is applied only while its layer has
more than ``2 N_max`` active nodes. It breaks detailed balance (the chain no
longer targets the posterior) and is offered only to reproduce their numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from finite.masked import effective_index, log_mask_prior

__all__ = ["PROPOSALS", "MaskMoveInfo", "mask_move", "log_set_probability", "check_proposals", "TransferInfo",
           "transfer_move", "transfer_log_proposal"]

PROPOSALS = ("uniform", "sensitivity", "informed")


class MaskMoveInfo(NamedTuple):
    """What one birth/death move did.

    Attributes:
        accepted: bool, whether the proposal was accepted.
        death: bool, the move type ``u`` (True: death, False: birth).
        size: the number ``N`` of mask entries proposed to flip.
        log_alpha: the log acceptance ratio (``-inf`` for an impossible proposal).
    """

    accepted: jnp.ndarray  # bool
    death: jnp.ndarray  # bool: the move type u
    size: jnp.ndarray  # N
    log_alpha: jnp.ndarray


def check_proposals(birth: str, death: str, n_max: int) -> None:
    """Raise ``ValueError`` naming the bad setting unless ``birth`` and ``death`` are in ``PROPOSALS`` and
    ``1 <= n_max <= 5`` (the most nodes one move flips)."""
    for name, kind in (("birth", birth), ("death", death)):
        if kind not in PROPOSALS:
            raise ValueError(f"mask moves: {name} proposal must be one of {PROPOSALS}, got {kind!r}")
    if not 1 <= int(n_max) <= 5:
        raise ValueError(f"mask moves: n_max must be in 1..5 (the set probability sums n_max! orderings), got {n_max}")


def _log_weights(kind: str, grad, move_type):
    if kind == "uniform":
        return jnp.zeros_like(grad)
    if kind == "sensitivity":
        return -0.5 * jnp.abs(grad)
    return 0.5 * (1.0 - 2.0 * move_type) * grad  # "informed"


def _selection_logq(flat, grad, move_type, birth: str, death: str):
    """Normalised log selection probabilities over ``{j : m_j = move_type}`` (``-inf`` elsewhere)."""
    logw = jnp.where(move_type == 1, _log_weights(death, grad, move_type), _log_weights(birth, grad, move_type))
    logw = jnp.where(flat == move_type, logw, -jnp.inf)
    return logw - jax.scipy.special.logsumexp(logw)


def log_set_probability(logq, idx, size, n_max: int):
    """``log Multi_(N, Q)(S)`` for ``S = idx[:size]``: successive sampling without replacement, all orderings summed.

    ``logq`` are normalised log-probabilities; the mass left after removing a
    prefix is summed directly over the remaining entries (not as ``1 - sum``,
    which loses precision when the chosen entries hold almost all the mass).

    Args:
        logq: ``(P,)`` normalised log selection probabilities (``-inf`` for ineligible entries).
        idx: ``(n_max,)`` the drawn entries in draw order; only the first ``size`` count.
        size: the set size ``N`` (``1 <= size <= n_max``; may be traced).
        n_max: the largest set size (static; the sum runs over ``n_max!`` orderings).

    Returns:
        The log-probability (a scalar) of drawing the unordered set ``idx[:size]``.
    """
    subsets = [t for r in range(n_max) for t in itertools.combinations(range(n_max), r)]
    rest = {}
    for t in subsets:
        removed = jnp.zeros(logq.shape, bool).at[idx[np.asarray(t)]].set(True) if t else jnp.zeros(logq.shape, bool)
        rest[t] = jax.scipy.special.logsumexp(jnp.where(removed, -jnp.inf, logq))
    sel = logq[idx]
    per_size = []
    for n in range(1, n_max + 1):
        terms = []
        for perm in itertools.permutations(range(n)):
            terms.append(sum(sel[perm[k]] - rest[tuple(sorted(perm[:k]))] for k in range(n)))
        per_size.append(jax.scipy.special.logsumexp(jnp.stack(terms)))
    return jnp.stack(per_size)[size - 1]


def _split(flat, sizes):
    return tuple(jnp.split(flat, np.cumsum(sizes)[:-1]))


def mask_move(key, masks, loglik, grads, value_and_grad: Callable, *, c: float, n_max: int = 3,
              birth: str = "uniform", death: str = "sensitivity", authors_guard: bool = False):
    """One birth/death MH move (Algorithm 1). Returns ``(masks, loglik, grads, MaskMoveInfo)``.

    ``loglik``/``grads`` are the log-likelihood and its mask gradient (a tuple
    like ``masks``) at the current state; ``value_and_grad(masks)`` evaluates
    them at another mask with everything else fixed. ``c`` is the mask prior
    strength ``(lambda ln n)^5``.

    Args:
        key: a JAX PRNG key.
        masks: tuple of ``(p_l,)`` 0/1 float arrays, one per hidden layer.
        loglik: the log-likelihood at ``masks``.
        grads: the gradient of the log-likelihood with respect to the masks at ``masks`` (a tuple like ``masks``).
        value_and_grad: ``masks -> (loglik, grads)`` with the weights and noise fixed.
        c: mask prior strength.
        n_max: the most entries one move flips (``N ~ U{1..n_max}``).
        birth: the selection proposal of a birth move (a node switched on), from ``PROPOSALS``.
        death: the selection proposal of a death move (a node switched off), from ``PROPOSALS``.
        authors_guard: apply the authors' rule described in the module docstring (not exact).

    Returns:
        ``(masks, loglik, grads, MaskMoveInfo)`` after the move (unchanged when rejected).
    """
    sizes = [int(m.shape[0]) for m in masks]
    layer_of = jnp.asarray(np.repeat(np.arange(len(sizes)), sizes))
    flat = jnp.concatenate(masks)
    gflat = jnp.concatenate(grads)
    k_u, k_n, k_g, k_a = jax.random.split(key, 4)
    move = jax.random.bernoulli(k_u, 0.5).astype(flat.dtype)  # 1 = death
    size = jax.random.randint(k_n, (), 1, n_max + 1)

    logq = _selection_logq(flat, gflat, move, birth, death)
    gumbel = jax.random.gumbel(k_g, flat.shape, dtype=logq.dtype)
    _, idx = jax.lax.top_k(logq + gumbel, n_max)  # successive sampling without replacement, in draw order
    chosen = jnp.arange(n_max) < size
    enough = jnp.sum(flat == move) >= size
    flip = jnp.zeros(flat.shape, bool).at[idx].set(chosen)
    prop = jnp.where(flip, 1.0 - flat, flat)
    prop_masks = _split(prop, sizes)

    ll_new, g_new = value_and_grad(prop_masks)
    g_new_flat = jnp.concatenate(g_new)
    logq_rev = _selection_logq(prop, g_new_flat, 1.0 - move, birth, death)
    log_alpha = (ll_new - loglik + log_mask_prior(prop_masks, c) - log_mask_prior(masks, c)
                 + log_set_probability(logq_rev, idx, size, n_max) - log_set_probability(logq, idx, size, n_max))
    log_alpha = jnp.where(enough & ~jnp.isnan(log_alpha), log_alpha, -jnp.inf)
    accept = jnp.log(jax.random.uniform(k_a, dtype=logq.dtype)) < log_alpha

    if authors_guard:
        def apply_flip(k, m):
            j = idx[k]
            layer_count = jnp.sum(jnp.where(layer_of == layer_of[j], m, 0.0))
            ok = chosen[k] & (layer_count > 2 * n_max)
            return m.at[j].set(jnp.where(ok, 1.0 - m[j], m[j]))

        guarded = jax.lax.fori_loop(0, n_max, apply_flip, flat)
        same = jnp.all(guarded == prop)
        final = jnp.where(accept, guarded, flat)

        def recompute(_):
            v, g = value_and_grad(_split(final, sizes))
            return v, jnp.concatenate(g)

        ll_out, g_out = jax.lax.cond(accept & ~same, recompute,
                                     lambda _: (jnp.where(accept, ll_new, loglik),
                                                jnp.where(accept, g_new_flat, gflat)),
                                     None)
    else:
        final = jnp.where(accept, prop, flat)
        ll_out = jnp.where(accept, ll_new, loglik)
        g_out = jnp.where(accept, g_new_flat, gflat)
    info = MaskMoveInfo(accepted=accept, death=move == 1, size=size, log_alpha=log_alpha)
    return _split(final, sizes), ll_out, _split(g_out, sizes), info


class TransferInfo(NamedTuple):
    """What one merge/split move did.

    Attributes:
        accepted: bool, whether the proposal was accepted.
        split: bool, True for a split (node ``j`` switched on), False for a merge (switched off).
        layer: the hidden layer of the move (0-based).
        i: the partner node, whose outgoing row receives (merge) or gives back (split) ``k_ij`` times ``j``'s.
        j: the node switched off (merge) or on (split).
        log_alpha: the log acceptance ratio (``-inf`` for an impossible proposal).
    """

    accepted: jnp.ndarray  # bool
    split: jnp.ndarray  # bool: split (a birth) or merge (a death)
    layer: jnp.ndarray
    i: jnp.ndarray  # the node that receives (merge) or gives back (split) node j's outgoing weights
    j: jnp.ndarray  # the node switched off (merge) or on (split)
    log_alpha: jnp.ndarray


def _similarity(H, h):
    """Cosine of ``h`` with every column of ``H`` (0 where either is zero) and ``<H_i, h> / |H_i|^2`` (0 where
    ``H_i`` is zero): the similarity and the transfer scale of step 3."""
    dots = H.T @ h
    sq = jnp.sum(H * H, axis=0)
    norm_h = jnp.sqrt(jnp.sum(h * h))
    pos = (sq > 0) & (norm_h > 0)
    cos = jnp.where(pos, dots / jnp.where(pos, jnp.sqrt(sq) * norm_h, 1.0), 0.0)
    scale = jnp.where(sq > 0, dots / jnp.where(sq > 0, sq, 1.0), 0.0)
    return cos, scale


def transfer_log_proposal(acts, masks, split: bool, layer: int, j: int, i: int, kappa: float):
    """``log`` of the probability that `transfer_move` at this state chooses ``(split, layer, j, i)`` (steps 1-3),
    with ``acts`` the full-width activations of `finite.masked.node_activations`.

    Written from the definition over all nodes (the move itself works on the compacted active set), so tests can
    check the move's acceptance ratio and its choices against it.

    Args:
        acts: per hidden layer the ``(n, p_l)`` activations before the mask.
        masks: the masks of the state.
        split: the move type of the choice: ``True`` for a split (node ``j`` switched on), ``False`` for a merge
            (switched off).
        layer: the 0-based hidden layer of the choice.
        j: the switched node.
        i: the partner node.
        kappa: the partner sharpness.

    Returns:
        The log-probability (a float; ``-inf`` for a choice the move cannot make).
    """
    on = np.asarray(masks[layer]) > 0.5
    eligible = ~on if split else on
    if not eligible[j] or not on[i] or i == j:
        return -np.inf
    H = np.asarray(acts[layer], float)
    cos = np.asarray(_similarity(H, H[:, j])[0])
    cand = on & (np.arange(on.size) != j)
    logits = kappa * cos[cand]
    log_norm = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
    return float(np.log(0.5) - np.log(len(masks)) - np.log(eligible.sum()) + kappa * cos[i] - log_norm)


def transfer_move(key, params, masks, loglik, value, *, c: float, prior_scale: float, kappa: float = 100.0,
                  x, buckets=None):
    """One merge/split MH move (module docstring). Returns ``(params, masks, loglik, TransferInfo)``.

    ``loglik`` is the log-likelihood at the current state, ``value(params, masks)`` evaluates it elsewhere
    (everything else fixed) and ``x`` are the training inputs. With ``buckets`` (see `finite.masked`; each must
    hold its layer's active nodes plus one) the activations are computed for the active nodes and ``j`` only,
    on the compacted layer below: ``n x B_{l-1} x (B_l + 1)`` per layer instead of ``n x p_{l-1} x p_l``. The
    choices, ratio and result equal the full-width ones.

    Args:
        key: a JAX PRNG key.
        params: the current weights ``((W_1, b_1), ...)`` of a `finite.masked.MaskedMLP`.
        masks: the current masks of the `finite.masked.MaskedMLP`.
        loglik: the log-likelihood at ``(params, masks)``.
        value: ``(params, masks) -> loglik`` with the noise fixed.
        c: mask prior strength ``(lambda ln n)^5``.
        prior_scale: the Cauchy scale of every weight.
        kappa: the partner sharpness (0: the partner uniformly among the active nodes).
        x: ``(n, d)`` training inputs.
        buckets: optional static block sizes per hidden layer (``None``: full width).

    Returns:
        ``(params, masks, loglik, TransferInfo)`` after the move (unchanged when rejected).
    """
    n_layers = len(masks)
    k_t, k_l, k_j, k_i, k_a = jax.random.split(key, 5)
    split = jax.random.bernoulli(k_t, 0.5)
    layer = jax.random.randint(k_l, (), 0, n_layers)
    dtype = loglik.dtype
    index = effective_index(masks, buckets)
    props, h, prev = [], x, None
    for l, m in enumerate(masks):
        p = m.shape[0]
        on = m > 0.5
        n_on = jnp.sum(on).astype(dtype)
        n_off = p - n_on
        eligible = jnp.where(split, ~on, on)
        j = jnp.argmax(jnp.where(eligible, jax.random.gumbel(jax.random.fold_in(k_j, l), (p,), dtype), -jnp.inf))
        idx, valid = index.idx[l], index.valid[l]
        W, b = params[l]
        cols = jnp.concatenate([idx, j[None]])
        A = jnp.maximum(h @ (W if prev is None else W[prev])[:, cols] + b[cols][None, :], 0.0)  # (n, B_l + 1)
        h, prev = A[:, :-1] * jnp.where(valid, m[idx], 0.0)[None, :], idx  # masked, compacted input of layer l + 1
        cos, scale = _similarity(A[:, :-1], A[:, -1])
        logits = jnp.where(valid & (idx != j), kappa * cos, -jnp.inf)
        gumbel = jax.random.gumbel(jax.random.fold_in(k_i, l), (p,), dtype)[idx]  # the full-width draw's entries
        t = jnp.argmax(logits + gumbel)
        i = idx[t]
        W_out, _ = params[l + 1]
        row = W_out[i] + jnp.where(split, -1.0, 1.0).astype(dtype) * scale[t] * W_out[j]
        d_prior = jnp.sum(_cauchy_logpdf(row, prior_scale) - _cauchy_logpdf(W_out[i], prior_scale))
        ok = jnp.where(split, (n_off >= 1) & (n_on >= 1), n_on >= 2)

        def safe_log(v):
            return jnp.log(jnp.maximum(v, 1.0))  # only read where ok

        log_ratio = jnp.where(split, safe_log(n_off) - safe_log(n_on + 1), safe_log(n_on) - safe_log(n_off + 1))
        props.append((W_out.at[i].set(row), m.at[j].set(jnp.where(split, 1.0, 0.0).astype(m.dtype)),
                      d_prior + log_ratio, ok, i, j))
    new_params = tuple(params[:1]) + tuple(
        (jnp.where(layer == q - 1, props[q - 1][0], W), b) for q, (W, b) in enumerate(params) if q >= 1)
    new_masks = tuple(jnp.where(layer == l, props[l][1], m) for l, m in enumerate(masks))

    def pick(k):
        return jnp.stack([pr[k] for pr in props])[layer]

    ll_new = value(new_params, new_masks)
    log_alpha = (ll_new - loglik + log_mask_prior(new_masks, c) - log_mask_prior(masks, c) + pick(2))
    log_alpha = jnp.where(pick(3) & ~jnp.isnan(log_alpha), log_alpha, -jnp.inf)
    accept = jnp.log(jax.random.uniform(k_a, dtype=dtype)) < log_alpha
    out_params = jax.tree_util.tree_map(lambda a, b: jnp.where(accept, a, b), new_params, params)
    out_masks = tuple(jnp.where(accept, a, b) for a, b in zip(new_masks, masks))
    info = TransferInfo(accepted=accept, split=split, layer=layer, i=pick(4), j=pick(5), log_alpha=log_alpha)
    return out_params, out_masks, jnp.where(accept, ll_new, loglik), info


def _cauchy_logpdf(v, scale: float):
    return -jnp.log(jnp.pi * scale) - jnp.log1p((v / scale) ** 2)
