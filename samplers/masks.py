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

from finite.masked import log_mask_prior

__all__ = ["PROPOSALS", "MaskMoveInfo", "mask_move", "log_set_probability", "check_proposals"]

PROPOSALS = ("uniform", "sensitivity", "informed")


class MaskMoveInfo(NamedTuple):
    accepted: jnp.ndarray  # bool
    death: jnp.ndarray  # bool: the move type u
    size: jnp.ndarray  # N
    log_alpha: jnp.ndarray


def check_proposals(birth: str, death: str, n_max: int) -> None:
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
