"""Masked networks by stochastic-gradient Langevin dynamics with mini-batch mask moves (Kong et al. 2023,
section 5 and Appendix C.2; notes sections 2.1-2.2): the image-scale variant of the masked-BNN sampler.

Every mini-batch step is one BlackJAX ``sgld`` step for the weights, with the gradient estimator
``grad log prior + (n / B) sum_batch grad log p(y_i | x_i, theta, M)``; every ``t_mh`` steps, ``n_mh``
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

__all__ = ["MSGLDState", "msgld_epoch"]


class MSGLDState(NamedTuple):
    params: Any
    masks: tuple


def msgld_epoch(key, state: MSGLDState, net, x, y, *, batch_size: int, step_sizes, prior_scale: float,
                lam: float, t_mh: int = 10, n_mh: int = 1, n_max: int = 3, temperature: float = 1.0,
                birth: str = "uniform", death: str = "sensitivity"):
    """One pass over ``(x, y)`` (classification) in shuffled mini-batches; ``step_sizes`` holds one per batch.

    Returns the new state and the number of accepted mask moves. Written to be wrapped in ``jax.jit`` with
    ``net``, ``batch_size`` and the integer settings static.
    """
    from blackjax.sgmcmc import gradients, sgld

    check_proposals(birth, death, n_max)
    dtype = jax.tree_util.tree_leaves(state.params)[0].dtype
    x = jnp.asarray(x, dtype)  # the chain's dtype is the parameters' (inputs in another precision would change it)
    step_sizes = jnp.asarray(step_sizes, dtype)
    n = x.shape[0]
    nb = n // batch_size
    c = mask_prior_strength(lam, n)
    kernel = sgld.build_kernel()
    k_perm, k_steps = jax.random.split(key)
    order = jax.random.permutation(k_perm, n)[: nb * batch_size].reshape(nb, batch_size)

    def body(carry, inp):
        params, masks, accepted = carry
        idx, k, eps, t = inp
        xb, yb = x[idx], y[idx]

        def loglik_point(p, point):
            xi, yi = point
            return categorical_loglik(net.apply(p, masks, xi[None]), yi[None])

        est = gradients.grad_estimator(lambda p: cauchy_log_prior(p, prior_scale), loglik_point, n)
        k_sgld, k_mask = jax.random.split(k)
        new = kernel(k_sgld, params, est, (xb, yb), eps, temperature)
        # BlackJAX's noise comes in the default float type; keep the chain in the parameters' dtype
        params = jax.tree_util.tree_map(lambda a, b: a.astype(b.dtype), new, params)

        def moves(ms):
            def vg(mm):
                return jax.value_and_grad(lambda m: (n / batch_size) * categorical_loglik(
                    net.apply(params, m, xb), yb))(mm)

            ll, g = vg(ms)

            def one(carry, kk):
                mm, ll, g, a = carry
                mm, ll, g, info = mask_move(kk, mm, ll, g, vg, c=c, n_max=n_max, birth=birth, death=death)
                return (mm, ll, g, a + info.accepted.astype(jnp.int32)), None

            (ms, _, _, a), _ = jax.lax.scan(one, (ms, ll, g, jnp.zeros((), jnp.int32)),
                                            jax.random.split(k_mask, n_mh))
            return ms, a

        masks, a = jax.lax.cond((t + 1) % t_mh == 0, moves, lambda ms: (ms, jnp.zeros((), jnp.int32)), masks)
        return (params, masks, accepted + a), None

    steps = jnp.arange(nb)
    (params, masks, accepted), _ = jax.lax.scan(
        body, (state.params, state.masks, jnp.zeros((), jnp.int32)),
        (order, jax.random.split(k_steps, nb), step_sizes, steps))
    return MSGLDState(params, masks), accepted
