"""Masked networks by stochastic-gradient Langevin dynamics with mini-batch mask moves (Kong et al. 2023,
section 5 and Appendix C.2; notes sections 2.1-2.2): the image-scale variant of the masked-BNN sampler.

Every mini-batch step is one SGLD step for the weights (BlackJAX's overdamped Langevin update, the one its
``sgld`` kernel applies), with the gradient estimator ``grad log prior + (n / B) sum_batch grad log p(y_i |
x_i, theta, M)`` taken over the batch as a whole (batch norm needs the batch; for networks without it this
equals BlackJAX's per-point estimator); every ``t_mh`` steps, ``n_mh``
birth/death moves (`samplers.masks`) use the current mini-batch's log-likelihood scaled by ``n / B`` (as the
authors did: such moves are not exact for the full posterior; the paper's remedy, MHBT, is not implemented).
``temperature`` scales the injected noise as in BlackJAX (1 = the posterior; the authors' image runs used
noise ``1/sqrt(n)``, i.e. temperature ``1/n``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from finite.masked import categorical_loglik, cauchy_log_prior, mask_prior_strength
from samplers.masks import check_proposals, mask_move

__all__ = ["MSGLDState", "msgld_epoch", "random_crop_flip"]


def random_crop_flip(key, xb, pad: int = 4, fill=0.0):
    """The standard CIFAR augmentation on an NHWC batch: pad each image by ``pad`` pixels with ``fill`` (a
    scalar or one value per channel), crop a random window of the original size, flip horizontally with
    probability 1/2 (independently per image).

    Args:
        key: PRNG key of the crop offsets and the flips.
        xb: the image batch ``(n, H, W, C)``.
        pad: the padding in pixels on every side (default 4); offsets run over ``0 .. 2 * pad``.
        fill: the padding value, a scalar or ``(C,)`` (default 0).

    Returns:
        The augmented batch, of the shape and dtype of ``xb``.
    """
    n, h, w, c = xb.shape
    fill = jnp.broadcast_to(jnp.asarray(fill, xb.dtype), (c,))
    padded = jnp.broadcast_to(fill, (n, h + 2 * pad, w + 2 * pad, c))
    padded = padded.at[:, pad:pad + h, pad:pad + w, :].set(xb)
    k_off, k_flip = jax.random.split(key)
    offsets = jax.random.randint(k_off, (n, 2), 0, 2 * pad + 1)
    flips = jax.random.bernoulli(k_flip, 0.5, (n,))

    def one(img, off, flip):
        crop = jax.lax.dynamic_slice(img, (off[0], off[1], 0), (h, w, c))
        return jnp.where(flip, crop[:, ::-1], crop)

    return jax.vmap(one)(padded, offsets, flips)


class MSGLDState(NamedTuple):
    """``params`` and ``masks`` of the chain; ``net_state`` the network's non-parameter state (the running
    batch-norm statistics of `finite.masked_resnet.MaskedResNet18`; None for stateless networks)."""

    params: Any
    masks: tuple
    net_state: Any = None


def msgld_epoch(key, state: MSGLDState, net, x, y, *, batch_size: int, step_sizes, prior_scale: float,
                lam: float, t_mh: int = 10, n_mh: int = 1, n_max: int = 3, temperature: float = 1.0,
                birth: str = "uniform", death: str = "sensitivity", augment=None):
    """One pass over ``(x, y)`` (classification) in shuffled mini-batches; ``step_sizes`` holds one per batch.

    The prior is ``net.log_prior(params, prior_scale)`` when the network defines one (the ResNet leaves
    batch-norm parameters without a prior), else Cauchy(0, prior_scale) on every parameter. With a
    ``state.net_state`` the gradient comes from ``net.apply_train`` (batch statistics), which also returns the
    updated state; mask moves use training-mode batch statistics too. ``augment(key, xb)`` (optional, e.g.
    `random_crop_flip`) transforms each mini-batch before use. Returns the new state and the number of
    accepted mask moves. Written to be wrapped in ``jax.jit`` with ``net``, ``batch_size`` and the integer
    settings static.

    Args:
        key: PRNG key of the epoch (the shuffle, the SGLD noise, the mask moves and ``augment``).
        state: the chain's :class:`MSGLDState`.
        net: the masked network: ``net.apply(params, masks, x) -> logits``, optionally ``net.log_prior`` and,
            for a stateful network, ``net.apply_train(params, net_state, masks, x) -> (logits, net_state)``.
        x: training inputs ``(n, ...)`` (cast to the parameters' dtype).
        y: integer class labels ``(n,)``.
        batch_size: the mini-batch size ``B``; the epoch takes ``n // B`` steps (the remainder of the shuffled
            data is left out).
        step_sizes: the SGLD step sizes, one per mini-batch step ``(n // B,)``.
        prior_scale: the Cauchy prior scale (or the scale handed to ``net.log_prior``).
        lam: the mask prior's ``lambda``; the prior strength is ``c = (lam ln n)^5``.
        t_mh: the steps between two rounds of mask moves (the moves follow steps ``t_mh - 1``, ``2 t_mh - 1``,
            ...; default 10).
        n_mh: birth/death moves per round (default 1).
        n_max: the most nodes one move flips, 1 to 5 (default 3).
        temperature: the scale of the injected noise (1 = the posterior).
        birth: the birth selection proposal, one of ``samplers.masks.PROPOSALS``.
        death: the death selection proposal, one of ``samplers.masks.PROPOSALS``.
        augment: optional ``(key, xb) -> xb`` applied to every mini-batch.

    Returns:
        ``(MSGLDState, accepted)``: the state after the epoch and the number of accepted mask moves (an int32
        scalar).

    Raises:
        ValueError: fewer than ``batch_size`` training points, or an unknown proposal or ``n_max`` out of range.
    """
    from blackjax.sgmcmc import diffusions

    check_proposals(birth, death, n_max)
    dtype = jax.tree_util.tree_leaves(state.params)[0].dtype
    x = jnp.asarray(x, dtype)  # the chain's dtype is the parameters' (inputs in another precision would change it)
    step_sizes = jnp.asarray(step_sizes, dtype)
    n = x.shape[0]
    nb = n // batch_size
    if nb < 1:
        raise ValueError(f"msgld_epoch: {n} training points cannot fill one batch of {batch_size}")
    c = mask_prior_strength(lam, n)
    scale = n / batch_size
    stateful = state.net_state is not None
    integrator = diffusions.overdamped_langevin()  # BlackJAX's SGLD update: theta + eps grad + sqrt(2 eps T) xi
    k_perm, k_steps = jax.random.split(key)
    order = jax.random.permutation(k_perm, n)[: nb * batch_size].reshape(nb, batch_size)

    def log_prior(p):
        if hasattr(net, "log_prior"):
            return net.log_prior(p, prior_scale)
        return cauchy_log_prior(p, prior_scale)

    def log_post_estimate(p, masks, ns, xb, yb):
        """log prior + (n / B) * mini-batch log-likelihood, and the network state after this batch."""
        if stateful:
            logits, ns = net.apply_train(p, ns, masks, xb)
        else:
            logits = net.apply(p, masks, xb)
        return log_prior(p) + scale * categorical_loglik(logits, yb), ns

    def body(carry, inp):
        params, masks, ns, accepted = carry
        idx, k, eps, t = inp
        xb, yb = x[idx], y[idx]
        k, k_aug = jax.random.split(k)
        if augment is not None:
            xb = augment(k_aug, xb)
        grad, ns = jax.grad(log_post_estimate, has_aux=True)(params, masks, ns, xb, yb)
        k_sgld, k_mask = jax.random.split(k)
        new = integrator(k_sgld, params, grad, eps, temperature)
        # BlackJAX's noise comes in the default float type; keep the chain in the parameters' dtype
        params = jax.tree_util.tree_map(lambda a, b: a.astype(b.dtype), new, params)

        def moves(ms):
            def vg(mm):
                return jax.value_and_grad(lambda m: scale * categorical_loglik(net.apply(params, m, xb), yb))(mm)

            ll, g = vg(ms)

            def one(carry, kk):
                mm, ll, g, a = carry
                mm, ll, g, info = mask_move(kk, mm, ll, g, vg, c=c, n_max=n_max, birth=birth, death=death)
                return (mm, ll, g, a + info.accepted.astype(jnp.int32)), None

            (ms, _, _, a), _ = jax.lax.scan(one, (ms, ll, g, jnp.zeros((), jnp.int32)),
                                            jax.random.split(k_mask, n_mh))
            return ms, a

        masks, a = jax.lax.cond((t + 1) % t_mh == 0, moves, lambda ms: (ms, jnp.zeros((), jnp.int32)), masks)
        return (params, masks, ns, accepted + a), None

    steps = jnp.arange(nb)
    (params, masks, ns, accepted), _ = jax.lax.scan(
        body, (state.params, state.masks, state.net_state, jnp.zeros((), jnp.int32)),
        (order, jax.random.split(k_steps, nb), step_sizes, steps))
    return MSGLDState(params, masks, ns), accepted
