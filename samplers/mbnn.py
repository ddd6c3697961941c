"""The masked-BNN sampler (Kong et al. 2023, Algorithm 2; notes sections 2.1-2.3), in BlackJAX's style.

One iteration, for the state ``(theta, M, sigma^2)``:

1. the weights given ``M, sigma^2``, in two blocks. Given the masks,
   ``theta`` splits into the *effective* weights ``theta_E`` (biases of
   active nodes and weights between active nodes, input and output) and the
   rest ``theta_I``, which do not touch the likelihood; the conditional
   factorises as ``p(theta_E | M, D) prod Cauchy(theta_I)``.

   * ``theta_E``: one HMC trajectory (BlackJAX ``hmc`` with a fixed number
     of leapfrog steps, or ``nuts``) targeting
     ``log Cauchy(theta_E) + log p(y | theta_E, M, sigma^2)``, run on dense
     blocks of the active nodes (``finite.masked.gather_effective``), so
     its cost follows the active width, not the physical one. During
     burn-in the step size follows BlackJAX's dual averaging (target
     acceptance 0.7, the authors' ``gamma = 0.2, t0 = 10, kappa = 0.75``);
     after it the averaged step size, times ``step_scale`` (default 0.5;
     the authors used 1), is frozen: dual averaging settles at the
     leapfrog stability limit of the burn-in posterior, and at that step
     the UCI chains stop moving soon after burn-in.
   * ``theta_I``: every ``refresh_every`` iterations, a per-coordinate
     HMC trajectory under the Cauchy prior with the same step size and
     length (one fused elementwise pass over all weights).

   The authors ran one HMC trajectory on all of ``theta``; there the
   ineffective coordinates also move under the prior alone, but every
   leapfrog step touches all ~1.2 million weights. Both are valid kernels
   for the same conditional; the blocked one costs O(active) per leapfrog.
2. ``n_mh`` birth/death moves of the masks (`samplers.masks`), with
   ``theta`` and ``sigma^2`` fixed; then ``n_transfer`` (default 0) merge/split
   moves (`samplers.masks.transfer_move`), which change a mask entry and one
   row of outgoing weights together;
3. a Gibbs draw ``sigma^2 ~ InvGamma(a + n/2, b + SSE/2)`` (regression).

Every piece leaves the joint posterior invariant, so the composition does.
The BNN baseline is the same sampler with all nodes on and no mask moves.

``sampler.init(key)`` and ``sampler.step(key, state, adapt=..., buckets=...)``
are pure; ``adapt`` and ``buckets`` are static (see ``finite.masked`` for
the compaction). ``sample(...)`` runs many chains (one ``vmap``), keeps
thinned draws of user-chosen functions of the state, records traces and
diagnostics, and checkpoints so that an interrupted run resumes. Its host
loop, checkpoints, pooled step and R-hat / ESS are the generic driver's
(`samplers.driver.run_chunks`, ``save_checkpoint`` / ``load_checkpoint``,
`samplers.hmc.pool_min_step`, `samplers.driver.chain_diagnostics`); only the
iteration itself, whose target changes between trajectories, is its own.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from finite.masked import (
    MaskedMLP,
    apply_effective,
    bucket_sizes,
    categorical_loglik,
    cauchy_log_prior,
    effective_index,
    effective_validity,
    gather_effective,
    gaussian_loglik,
    gibbs_sigma2,
    ineffective_masks,
    mask_prior_strength,
    masked_mlp,
    scatter_effective,
)
from samplers.driver import chain_diagnostics, load_checkpoint, phase_summary, run_chunks, save_checkpoint
from samplers.hmc import hmc_step, step_size_adaptation
from samplers.hmc import pool_min_step as pool_min_da
from samplers.masks import check_proposals, mask_move, transfer_move

__all__ = ["MaskedBNN", "MBNNState", "MBNNInfo", "MBNNSampler", "mbnn_sampler", "uci_sampler", "sample", "SampleResult",
           "diagnostics", "COMPACT_MIN_WIDTH"]

COMPACT_MIN_WIDTH = 128  # `sample(compact=None)` compacts networks whose widest hidden layer has this many nodes


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedBNN:
    """Posterior of a masked MLP on one data set: ``net``, data ``x`` (``(n, in_dim)`` inputs) and ``y``, and priors.

    likelihood: ``"gaussian"`` (``y`` of shape ``(n,)`` or ``(n, 1)``) or
    ``"categorical"`` (integer labels ``(n,)``, ``net.out_dim`` classes).
    prior_scale: Cauchy scale of every weight and bias. lam: mask prior
    ``lambda`` (``None``: no masks, the BNN). sigma2_prior: ``(a, b)`` of the
    inverse gamma prior on the noise variance.
    """

    net: MaskedMLP
    x: Any
    y: Any
    likelihood: str = "gaussian"
    prior_scale: float = 1.0
    lam: float | None = 0.1
    sigma2_prior: tuple = (1.0, 1.0)

    def __post_init__(self):
        x, y = np.asarray(self.x), np.asarray(self.y)
        if self.likelihood not in ("gaussian", "categorical"):
            raise ValueError(f"MaskedBNN: likelihood must be 'gaussian' or 'categorical', got {self.likelihood!r}")
        if x.ndim != 2 or x.shape[1] != self.net.in_dim:
            raise ValueError(f"MaskedBNN: x must have shape (n, {self.net.in_dim}), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("MaskedBNN: x contains NaN or inf")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"MaskedBNN: x has {x.shape[0]} rows but y has {y.shape[0]}")
        if self.likelihood == "gaussian":
            if self.net.out_dim != 1 or y.size != x.shape[0]:
                raise ValueError("MaskedBNN: the Gaussian likelihood needs out_dim = 1 and one target per row")
            if not np.all(np.isfinite(y)):
                raise ValueError("MaskedBNN: y contains NaN or inf")
        else:
            if y.ndim != 1 or not np.all((y >= 0) & (y < self.net.out_dim) & (y == np.round(y))):
                raise ValueError(f"MaskedBNN: categorical labels must be integers in [0, {self.net.out_dim})")
        if not self.prior_scale > 0:
            raise ValueError(f"MaskedBNN: prior_scale must be > 0, got {self.prior_scale}")
        a, b = self.sigma2_prior
        if not (a > 0 and b > 0):
            raise ValueError(f"MaskedBNN: sigma2_prior (a, b) must be positive, got {self.sigma2_prior}")
        if self.lam is not None:
            mask_prior_strength(self.lam, x.shape[0])  # validates lam
        if self.lam is None and self.net.active != self.net.widths:
            raise ValueError("MaskedBNN: without a mask prior (lam=None, the BNN) every node must be active")
        object.__setattr__(self, "x", jnp.asarray(x, jnp.float32) if x.dtype != np.float64 else jnp.asarray(x))
        dtype = self.x.dtype
        object.__setattr__(self, "y", jnp.asarray(y, dtype).reshape(-1) if self.likelihood == "gaussian"
                           else jnp.asarray(y, jnp.int32))

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def masked(self) -> bool:
        return self.lam is not None

    @property
    def c(self) -> float:
        return mask_prior_strength(self.lam, self.n) if self.masked else 0.0

    def loglik(self, params, masks, sigma2, buckets=None, data=None):
        """``(log p(y | theta, M, sigma^2), SSE)`` (SSE is 0 for classification); ``data`` overrides ``(x, y)``."""
        x = self.x if data is None else data[0]
        return self.loglik_from_output(self.net.apply(params, masks, x, buckets), sigma2, data)

    def loglik_from_output(self, f, sigma2, data=None):
        y = self.y if data is None else data[1]
        if self.likelihood == "gaussian":
            return gaussian_loglik(f[:, 0], y, sigma2)
        return categorical_loglik(f, y), jnp.zeros((), f.dtype)

    def log_prior_theta(self, params):
        return cauchy_log_prior(params, self.prior_scale)


class MBNNState(NamedTuple):
    """One chain's state.

    Attributes:
        params: the weights ``((W_1, b_1), ..., (W_{L+1}, b_{L+1}))``, effective and ineffective.
        masks: tuple of 0/1 node masks, one per hidden layer.
        sigma2: the noise variance (regression).
        da: BlackJAX dual-averaging state of the HMC step size.
        iteration: iterations done.
    """

    params: Any
    masks: tuple
    sigma2: jnp.ndarray
    da: Any  # blackjax DualAveragingAdaptationState
    iteration: jnp.ndarray


class MBNNInfo(NamedTuple):
    """What one iteration did (`sample` stacks these into its ``traces``).

    Attributes:
        hmc_acceptance, hmc_accepted, divergent, step_size: the weight trajectory's acceptance probability,
            whether it was accepted, whether it diverged, and its step size.
        mask_accepted, births, deaths: accepted birth/death moves, and how many of them were births / deaths.
        active: ``(L,)`` active nodes per hidden layer after the iteration.
        sigma2, loglik: the noise variance and the log-likelihood after the iteration.
        overflow: a mask outgrew the compacted blocks; the iteration is void and recomputed.
        merges, splits: accepted merge / split moves (`samplers.masks.transfer_move`).
    """

    hmc_acceptance: jnp.ndarray
    hmc_accepted: jnp.ndarray
    divergent: jnp.ndarray
    step_size: jnp.ndarray
    mask_accepted: jnp.ndarray  # accepted moves this iteration
    births: jnp.ndarray  # accepted births
    deaths: jnp.ndarray  # accepted deaths
    active: jnp.ndarray  # (L,) active nodes after the iteration
    sigma2: jnp.ndarray
    loglik: jnp.ndarray
    overflow: jnp.ndarray  # bool: a mask during the moves outgrew the compacted blocks; the iteration is void
    merges: Any = None  # accepted merge moves (`samplers.masks.transfer_move`); None in checkpoints written before
    splits: Any = None  # accepted split moves


_STEP_CACHE: OrderedDict = OrderedDict()
_STEP_CACHE_SIZE = 16  # compiled programs kept; more exhausts XLA:CPU's code memory in long sessions


def _cache_get(key):
    fn = _STEP_CACHE.get(key)
    if fn is not None:
        _STEP_CACHE.move_to_end(key)
    return fn


def _cache_put(key, fn):
    _STEP_CACHE[key] = fn
    while len(_STEP_CACHE) > _STEP_CACHE_SIZE:
        _STEP_CACHE.popitem(last=False)


@dataclasses.dataclass(frozen=True, eq=False)
class MBNNSampler:
    """``init(key, params=None, masks=None)`` and ``step(key, state, adapt, buckets)``; see the module docstring.

    Build it with `mbnn_sampler`, which validates the settings; its fields are that function's arguments:
    model, num_integration_steps, step_size, n_mh, n_max, birth, death, authors_guard, theta_kernel,
    target_accept, da_gamma, da_t0, da_kappa, sigma2_init, refresh_every, step_scale, n_transfer and
    transfer_kappa.
    """

    model: MaskedBNN
    num_integration_steps: int
    step_size: float
    n_mh: int
    n_max: int
    birth: str
    death: str
    authors_guard: bool
    theta_kernel: str
    target_accept: float
    da_gamma: float
    da_t0: float
    da_kappa: float
    sigma2_init: float
    refresh_every: int
    step_scale: float
    n_transfer: int = 0
    transfer_kappa: float = 100.0

    @property
    def slack(self) -> int:
        """Nodes one iteration's mask moves can add to a layer (the headroom a bucket needs)."""
        return self.n_mh * self.n_max + self.n_transfer if self.model.masked else 0

    def _da(self):
        return step_size_adaptation(self.target_accept, gamma=self.da_gamma, t0=self.da_t0, kappa=self.da_kappa)

    def init(self, key, params=None, masks=None) -> MBNNState:
        net = self.model.net
        p0, m0 = net.init(key, self.model.x.dtype)
        params = p0 if params is None else params
        masks = m0 if masks is None else masks
        da_init = self._da().init
        dtype = self.model.x.dtype
        return MBNNState(params, tuple(masks), jnp.asarray(self.sigma2_init, dtype),
                         da_init(jnp.asarray(self.step_size, dtype)), jnp.zeros((), jnp.int32))

    def data(self):
        """The traced inputs of ``step``: ``(x, y, b)`` with ``b`` the inverse-gamma scale of ``sigma^2``."""
        m = self.model
        return (m.x, m.y, jnp.asarray(m.sigma2_prior[1], m.x.dtype))

    def _static_key(self):
        m = self.model
        return (m.net, m.likelihood, m.prior_scale, m.lam, m.n, tuple(m.x.shape), str(m.x.dtype), m.sigma2_prior[0],
                self.num_integration_steps, self.n_mh, self.n_max, self.birth, self.death, self.authors_guard,
                self.theta_kernel, self.target_accept, self.da_gamma, self.da_t0, self.da_kappa, self.refresh_every,
                self.step_scale, self.n_transfer, self.transfer_kappa)

    def step(self, key, state: MBNNState, adapt=False, buckets=None, refresh: bool = True,
             reference: bool = False, data=None):
        """One iteration. ``adapt`` (burn-in step-size adaptation) may be traced; static: ``buckets``
        (compaction), ``refresh`` (update the ineffective weights this iteration), ``reference`` (evaluate the
        likelihood at full width from the scattered parameters: the slow path the compacted one is tested
        against)."""
        model = self.model
        data = self.data() if data is None else data
        xy = data[:2]
        k_hmc, k_mask, k_sigma, k_ref = jax.random.split(key, 4)
        dtype = state.sigma2.dtype
        index = effective_index(state.masks, buckets)
        validity = effective_validity(index, dtype)
        prior = dist.Cauchy(jnp.zeros((), dtype), model.prior_scale)

        def logdensity(theta_e):
            lp = sum(jnp.sum(v * prior.log_prob(t)) for v, t in
                     zip(jax.tree_util.tree_leaves(validity), jax.tree_util.tree_leaves(theta_e)))
            if reference:
                f = model.net.apply(scatter_effective(state.params, theta_e, index), state.masks, xy[0])
            else:
                f = apply_effective(theta_e, state.masks, index, xy[0])
            return lp + model.loglik_from_output(f, state.sigma2, xy)[0]

        theta_e, da, eps, hinfo = hmc_step(k_hmc, gather_effective(state.params, index), logdensity, state.da,
                                           self._da(), adapt=adapt, num_integration_steps=self.num_integration_steps,
                                           kernel=self.theta_kernel, sampling_scale=self.step_scale)
        params = scatter_effective(state.params, theta_e, index)
        if refresh:
            params = self.refresh(k_ref, params, state.masks, eps)

        masks = state.masks
        n_acc = births = deaths = jnp.zeros((), jnp.int32)
        # the blocks must hold every mask the iteration evaluates: the current one (HMC), each proposal
        # (at most n_max more nodes than the state it starts from) and the final one; else the iteration is
        # void and `sample` recomputes it with larger blocks
        capacity = jnp.asarray([model.net.widths[i] if buckets is None or buckets[i] is None else buckets[i]
                                for i in range(len(masks))], jnp.int32)

        def counts(ms):
            return jnp.stack([jnp.sum(m) for m in ms]).astype(jnp.int32)

        overflow = jnp.any(counts(masks) > capacity)
        # gradient-weighted births need d l / d m_j at inactive nodes: only the full-width pass has them
        mbuckets = None if self.birth != "uniform" else buckets
        ll_moves = None  # the log-likelihood at the masks the birth/death moves end on
        if model.masked and self.n_mh > 0:

            def value_and_grad(ms):
                return jax.value_and_grad(lambda m: model.loglik(params, m, state.sigma2, mbuckets, xy)[0])(ms)

            ll, grads = value_and_grad(masks)

            def one_move(carry, k):
                ms, ll, gs, na, nb, nd, ov = carry
                if mbuckets is not None:
                    ov = ov | jnp.any(counts(ms) + self.n_max > capacity)
                ms, ll, gs, info = mask_move(k, ms, ll, gs, value_and_grad, c=model.c, n_max=self.n_max,
                                             birth=self.birth, death=self.death, authors_guard=self.authors_guard)
                a = info.accepted.astype(jnp.int32)
                return (ms, ll, gs, na + a, nb + a * (~info.death), nd + a * info.death, ov), None

            (masks, ll_moves, _, n_acc, births, deaths, overflow), _ = jax.lax.scan(
                one_move, (masks, ll, grads, n_acc, births, deaths, overflow), jax.random.split(k_mask, self.n_mh))
            overflow = overflow | jnp.any(counts(masks) > capacity)

        merges = splits = jnp.zeros((), jnp.int32)
        if model.masked and self.n_transfer > 0:
            def value(p, ms):
                return model.loglik(p, ms, state.sigma2, buckets, xy)[0]

            def one_transfer(carry, k):
                prm, ms, ll, nm, ns, ov = carry
                if buckets is not None:
                    ov = ov | jnp.any(counts(ms) + 1 > capacity)
                prm, ms, ll, tinfo = transfer_move(k, prm, ms, ll, value, c=model.c, prior_scale=model.prior_scale,
                                                   kappa=self.transfer_kappa, x=xy[0], buckets=buckets)
                a = tinfo.accepted.astype(jnp.int32)
                return (prm, ms, ll, nm + a * (~tinfo.split), ns + a * tinfo.split, ov), None

            (params, masks, _, merges, splits, overflow), _ = jax.lax.scan(
                one_transfer, (params, masks, value(params, masks) if ll_moves is None else ll_moves, merges,
                               splits, overflow),
                jax.random.split(jax.random.fold_in(k_mask, 1), self.n_transfer))
            overflow = overflow | jnp.any(counts(masks) > capacity)

        ll, sse = model.loglik(params, masks, state.sigma2, buckets, xy)
        sigma2 = state.sigma2
        if model.likelihood == "gaussian":
            sigma2 = gibbs_sigma2(k_sigma, sse, model.n, model.sigma2_prior[0], data[2]).astype(sigma2.dtype)
        active = jnp.stack([jnp.sum(m) for m in masks]).astype(jnp.int32)
        info = MBNNInfo(hmc_acceptance=hinfo.acceptance_rate, hmc_accepted=hinfo.is_accepted,
                        divergent=hinfo.is_divergent,
                        step_size=eps, mask_accepted=n_acc, births=births, deaths=deaths, active=active,
                        sigma2=sigma2, loglik=ll, overflow=overflow, merges=merges, splits=splits)
        return MBNNState(params, masks, sigma2, da, state.iteration + 1), info

    def refresh(self, key, params, masks, eps):
        """Move the ineffective weights (those no active path uses) under their Cauchy prior."""
        if not self.model.masked:
            return params
        dtype = jax.tree_util.tree_leaves(params)[0].dtype
        return _cauchy_coordinate_hmc(key, params, ineffective_masks(masks, dtype), eps, self.num_integration_steps,
                                      self.model.prior_scale)

    def step_chains(self, keys, states, adapt, buckets, refresh: bool = True, reference: bool = False):
        """``vmap`` of ``step`` over a leading chain axis (one compiled program per ``buckets``/``reference``).

        ``refresh`` runs the ineffective-weight update as a separate program after the step (same law as
        ``step(..., refresh=True)`` with another key), so it adds no variant to compile.
        """
        sig = (buckets, reference)
        fn = _cache_get((self._static_key(), "step", sig))
        if fn is None:  # shared by samplers that differ only in data (e.g. the splits of one data set)
            fn = jax.jit(jax.vmap(lambda k, s, a, d: self.step(k, s, a, buckets, False, reference, data=d),
                                  in_axes=(0, 0, None, None)))
            _cache_put((self._static_key(), "step", sig), fn)
        states, info = fn(keys, states, jnp.asarray(bool(adapt)), self.data())
        if refresh and self.model.masked:
            rf = _cache_get((self._static_key(), "refresh"))
            if rf is None:
                rf = jax.jit(self._refresh_chains)
                _cache_put((self._static_key(), "refresh"), rf)
            states = rf(keys, states, info.step_size)
        return states, info

    def _refresh_chains(self, keys, states, step_size):
        """The ineffective-weight update of every chain, keyed by ``fold_in(key, 1)`` of the step's keys."""
        return jax.vmap(lambda k, s, e: s._replace(params=self.refresh(jax.random.fold_in(k, 1), s.params, s.masks,
                                                                        e)))(keys, states, step_size)

    def chunk_chains(self, key, states, start: int, n_valid: int, num_burnin: int, buckets, length: int):
        """Up to ``n_valid`` (<= ``length``) iterations of all chains in one compiled ``lax.scan``.

        Iteration ``t = start + i`` uses the keys, adaptation flag (``t < num_burnin``) and refresh schedule
        that ``sample``'s one-iteration path would, so both give the same chain. An iteration whose masks
        outgrow ``buckets`` (``info.overflow``) is void: it and the rest of the chunk are not committed.
        Returns ``(key, states, infos, committed)``: the key and states after the committed iterations (a
        prefix), the per-iteration infos stacked on a leading axis, and the commit flags.
        """
        fn = _cache_get((self._static_key(), "chunk", buckets, length))
        if fn is None:
            fn = jax.jit(lambda *a: self._chunk(*a, buckets=buckets, length=length))
            _cache_put((self._static_key(), "chunk", buckets, length), fn)
        return fn(key, states, jnp.asarray(start, jnp.int32), jnp.asarray(n_valid, jnp.int32),
                  jnp.asarray(num_burnin, jnp.int32), self.data())

    def _chunk(self, key, states, start, n_valid, num_burnin, data, *, buckets, length):
        num_chains = jax.tree_util.tree_leaves(states)[0].shape[0]
        step = jax.vmap(lambda k, s, a: self.step(k, s, a, buckets, False, False, data=data), in_axes=(0, 0, None))

        def body(carry, i):
            key, states, stopped = carry
            t = start + i

            def run(_):
                next_key, k_step = jax.random.split(key)
                keys = jax.random.split(k_step, num_chains)
                new, info = step(keys, states, t < num_burnin)
                if self.model.masked:
                    new = jax.lax.cond(t % self.refresh_every == 0, lambda n: self._refresh_chains(keys, n,
                                                                                                 info.step_size),
                                       lambda n: n, new)
                return next_key, new, info

            shapes = jax.eval_shape(run, None)

            def skip(_):
                return key, states, jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes[2])

            go = (i < n_valid) & ~stopped
            next_key, new, info = jax.lax.cond(go, run, skip, None)
            commit = go & ~jnp.any(info.overflow)
            key = jnp.where(commit, next_key, key)
            states = jax.tree_util.tree_map(lambda a, b: jnp.where(commit, a, b), new, states)
            return (key, states, stopped | (go & ~commit)), (info, commit)

        (key, states, _), (infos, committed) = jax.lax.scan(body, (key, states, jnp.zeros((), bool)),
                                                            jnp.arange(length))
        return key, states, infos, committed


def _cauchy_coordinate_hmc(key, params, where, eps, num_steps: int, scale: float):
    """Per-coordinate HMC under the Cauchy prior for the entries with ``where == 1`` (the ineffective weights).

    Given the masks these entries do not touch the likelihood, so their
    conditional is the product of Cauchy priors and every coordinate can be
    moved by its own one-dimensional HMC trajectory and accept/reject. The
    leapfrog is unrolled so XLA fuses it into one elementwise pass.
    """
    leaves, tree = jax.tree_util.tree_flatten(params)
    wl = jax.tree_util.tree_leaves(where)
    keys = jax.random.split(key, 2 * len(leaves))
    out = []
    for i, (th, w) in enumerate(zip(leaves, wl)):
        def grad(t):
            return -2.0 * t / (scale * scale + t * t)

        def energy(t, r):
            return jnp.log1p((t / scale) ** 2) + 0.5 * r * r

        r0 = jax.random.normal(keys[2 * i], th.shape, th.dtype)
        q, r = th, r0 + 0.5 * eps * grad(th)
        for k in range(num_steps):
            q = q + eps * r
            r = r + (eps if k < num_steps - 1 else 0.5 * eps) * grad(q)
        log_u = jnp.log(jax.random.uniform(keys[2 * i + 1], th.shape, th.dtype))
        accept = (log_u < energy(th, r0) - energy(q, r)) & (w > 0)
        out.append(jnp.where(accept, q, th))
    return jax.tree_util.tree_unflatten(tree, out)


def mbnn_sampler(model: MaskedBNN, *, num_integration_steps: int = 20, step_size: float | None = None,
                 n_mh: int = 10, n_max: int = 3, birth: str = "uniform", death: str = "sensitivity",
                 authors_guard: bool = False, theta_kernel: str = "hmc", target_accept: float = 0.7,
                 da_gamma: float = 0.2, da_t0: float = 10.0, da_kappa: float = 0.75,
                 sigma2_init: float = 1.0, refresh_every: int = 10, step_scale: float = 0.5, n_transfer: int = 0,
                 transfer_kappa: float = 100.0) -> MBNNSampler:
    """Build the sampler. ``step_size`` defaults to the authors' ``1e-2 / n`` (UCI).

    Why ``step_scale`` defaults to 0.5: dual averaging settles at the leapfrog stability limit of the burn-in
    posterior (the acceptance curve is a cliff there: targets 0.7 and 0.9 give the same step), and the posterior
    keeps sharpening after burn-in; at the full adapted step the UCI chains stop moving within ~1,000 iterations
    (yacht: acceptance 0.7 -> 0.0, divergent trajectories almost every iteration, R-hat 2.6), at half of it they
    keep acceptance 0.8-0.95.

    Args:
        model: the `MaskedBNN` posterior to sample.
        num_integration_steps: leapfrog steps per HMC trajectory (the NUTS kernel ignores it).
        step_size: the initial HMC step (``None``: ``1e-2 / n``).
        n_mh: birth/death moves per iteration.
        n_max: the most nodes one birth/death move flips.
        birth: the selection proposal of birth moves (`samplers.masks.PROPOSALS`).
        death: the selection proposal of death moves (`samplers.masks.PROPOSALS`).
        authors_guard: the authors' non-exact layer guard (`samplers.masks`).
        theta_kernel: ``"hmc"`` or ``"nuts"`` for the effective weights.
        target_accept: the dual-averaging target (mean acceptance) of the burn-in step size.
        da_gamma: the dual-averaging constant ``gamma`` of the burn-in step size.
        da_t0: the dual-averaging constant ``t0`` of the burn-in step size.
        da_kappa: the dual-averaging constant ``kappa`` of the burn-in step size.
        sigma2_init: the initial noise variance.
        refresh_every: iterations between updates of the ineffective weights (see the module docstring).
        step_scale: after burn-in the HMC step is this fraction of the dual-averaging result, in ``(0, 1]``
            (1 = the authors'; why 0.5 above).
        n_transfer: merge/split moves per iteration after the birth/death moves (`samplers.masks.transfer_move`: a
            node switched off with its outgoing weights handed to the most similar node, and the inverse); 0, the
            default, is the paper's sampler.
        transfer_kappa: how sharply the merge/split partner is chosen by activation similarity (``>= 0``).

    Returns:
        An `MBNNSampler`.

    Raises:
        ValueError: naming the first setting out of range or unknown.
    """
    if int(refresh_every) < 1:
        raise ValueError(f"mbnn_sampler: refresh_every must be >= 1, got {refresh_every}")
    check_proposals(birth, death, n_max)
    if theta_kernel not in ("hmc", "nuts"):
        raise ValueError(f"mbnn_sampler: theta_kernel must be 'hmc' or 'nuts', got {theta_kernel!r}")
    if int(num_integration_steps) < 1:
        raise ValueError(f"mbnn_sampler: num_integration_steps must be >= 1, got {num_integration_steps}")
    if int(n_mh) < 0:
        raise ValueError(f"mbnn_sampler: n_mh must be >= 0, got {n_mh}")
    if int(n_transfer) < 0:
        raise ValueError(f"mbnn_sampler: n_transfer must be >= 0, got {n_transfer}")
    if not transfer_kappa >= 0:
        raise ValueError(f"mbnn_sampler: transfer_kappa must be >= 0, got {transfer_kappa}")
    step_size = 1e-2 / model.n if step_size is None else float(step_size)
    if not step_size > 0:
        raise ValueError(f"mbnn_sampler: step_size must be > 0, got {step_size}")
    if not 0 < target_accept < 1:
        raise ValueError(f"mbnn_sampler: target_accept must be in (0, 1), got {target_accept}")
    if not sigma2_init > 0:
        raise ValueError(f"mbnn_sampler: sigma2_init must be > 0, got {sigma2_init}")
    if not 0 < step_scale <= 1:
        raise ValueError(f"mbnn_sampler: step_scale must be in (0, 1], got {step_scale}")
    return MBNNSampler(model, int(num_integration_steps), step_size, int(n_mh) if model.masked else 0, int(n_max),
                       birth, death, bool(authors_guard), theta_kernel, float(target_accept), float(da_gamma),
                       float(da_t0), float(da_kappa), float(sigma2_init), int(refresh_every), float(step_scale),
                       int(n_transfer) if model.masked else 0, float(transfer_kappa))


# ---------------------------------------------------------------------------
# running many chains
# ---------------------------------------------------------------------------

def uci_sampler(x, y, lam: float | None, *, width: int, prior_scale: float, leapfrog: int, n_mh: int, n_max: int,
                birth: str = "uniform", death: str = "sensitivity", step_scale: float = 0.5, n_transfer: int = 0,
                transfer_kappa: float = 100.0) -> MBNNSampler:
    """The masked-BNN paper's UCI regression model and sampler (Kong et al. 2023, section 4) on one training set.

    ``lam=None``: the BNN, a two-layer ReLU MLP of ``(width, width)`` nodes, all active. ``lam > 0``: the mBNN, with
    ``round(1.1 width)`` physical nodes per layer of which ``width`` start active, and mask prior strength ``lam``.
    Cauchy(``prior_scale``) weights, ``sigma^2 ~ InverseGamma(1, std(y))``; ``leapfrog`` integration steps and
    ``n_mh`` mask moves (at most ``n_max`` nodes each) per iteration, the given birth and death proposals.

    Args:
        x: training inputs ``(n, d)`` (the paper scales them to [0, 1]).
        y: training targets ``(n,)``.
        lam: the mask prior strength, or ``None`` for the plain BNN.
        width: nodes per hidden layer (active ones for the mBNN).
        prior_scale: scale of the Cauchy prior on every weight and bias.
        leapfrog: leapfrog steps per HMC trajectory.
        n_mh: mask moves per iteration.
        n_max: most nodes born or killed by one move.
        birth: the birth proposal (see `samplers.masks`).
        death: the death proposal.
        step_scale: the HMC step-size scale of `mbnn_sampler`.
        n_transfer: merge/split moves per iteration (0: the paper's sampler).
        transfer_kappa: their concentration.

    Returns:
        The `MBNNSampler`.
    """
    w, d = int(width), np.shape(x)[1]
    net = masked_mlp(d, (w, w)) if lam is None else masked_mlp(d, (int(round(1.1 * w)),) * 2, (w, w))
    model = MaskedBNN(net, x, y, prior_scale=prior_scale, lam=lam, sigma2_prior=(1.0, float(np.std(y, ddof=1))))
    return mbnn_sampler(model, num_integration_steps=leapfrog, n_mh=n_mh, n_max=n_max, birth=birth, death=death,
                        step_scale=step_scale, n_transfer=n_transfer, transfer_kappa=transfer_kappa)


class SampleResult(NamedTuple):
    """What `sample` returns.

    Attributes:
        draws: name -> array ``(chains, num_samples, ...)`` of the kept draws (``sigma2``, ``active`` and the
            user's functions).
        traces: `MBNNInfo` field -> array ``(chains, iterations, ...)``.
        state: the final `MBNNState` of every chain (stacked).
        seconds: sampling wall time (resumed runs add up).
        iterations: iterations run.
    """

    draws: dict  # name -> array (chains, num_samples, ...)
    traces: dict  # MBNNInfo field -> array (chains, iterations, ...)
    state: MBNNState  # final state
    seconds: float  # sampling wall time (this process; resumed runs add up)
    iterations: int


def _to_host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def sample(sampler: MBNNSampler, key, *, num_chains: int = 4, num_burnin: int = 400, num_samples: int = 20,
           thinning: int = 200, functions: dict[str, Callable] | None = None, compact: bool | None = None,
           checkpoint: str | None = None, checkpoint_every: float = 60.0, progress: bool = True,
           init_state: MBNNState | None = None, restart_adaptation: bool = True, chunk: int = 16,
           pool_step: str | None = None) -> SampleResult:
    """Run ``num_chains`` chains: burn-in (step size adapted), then ``num_samples`` draws every ``thinning`` iterations.

    functions: ``name -> fn(params, masks, sigma2, buckets)`` evaluated per chain at every kept draw (e.g. test
    predictions); their outputs are stacked into ``draws[name]``, with ``sigma2`` and ``active`` always kept.
    compact: run the compacted computation with power-of-two buckets (results equal the full-width run).
        ``None`` (default): compact when the widest hidden layer has at least `COMPACT_MIN_WIDTH` nodes. Each
        bucket is its own compiled program (about 10 s each on a CPU core), which a narrow network does not earn
        back: a width-40 run of the ``mbnn-uci --quick`` schedule takes 19.6 s compacted and 1.4 s at full width
        on a 2-core CPU (``python benchmarks/masked.py --narrow-only``), while at width 1,000 compaction is what
        makes the sampler affordable (``python benchmarks/masked.py``).
    restart_adaptation: restart the step-size dual averaging halfway through burn-in from the current step
    (a second adaptation window, as Stan's windowed adaptation does); ``False`` is the authors' single window.
    checkpoint: a file path; the run state is saved there every ``checkpoint_every`` seconds and at the end, and
    a run started with the same path resumes from it.
    chunk: iterations per compiled program (a ``lax.scan``; 1 = one program call and host round trip per
    iteration). Chunked blocks leave headroom for one mask move (``n_max`` nodes) instead of a whole
    iteration's ``n_mh * n_max``; an iteration whose masks outgrow them is recomputed with full headroom, so
    the chain is the same as with ``chunk=1`` (same keys; equal up to floating-point summation order).
    pool_step: ``None`` (default): each chain keeps its own adapted step size. ``"min"``: at the end of burn-in
    every chain takes the smallest of the chains' adapted step sizes (cross-chain adaptation, frozen before the
    first kept iteration, so the sampling phase is a fixed kernel). A chain that is still far from the posterior
    bulk when burn-in ends adapts to its flatter surroundings; its larger step then becomes unstable as it
    descends, and the chain stops moving (Energy, RESULTS.md section 2).

    Args:
        sampler: an `MBNNSampler` (from `mbnn_sampler`).
        key: a JAX PRNG key.
        num_chains: the number of chains.
        num_burnin: adapted burn-in iterations.
        num_samples: kept draws per chain.
        thinning: iterations between kept draws.
        progress: show a tqdm bar.
        init_state: stacked states to start from instead of fresh draws (e.g. a previous run's ``state``).

    Returns:
        A `SampleResult`.

    Raises:
        ValueError: bad counts or ``pool_step``, or a checkpoint written with other settings.
        FloatingPointError: a chain's log-likelihood became non-finite.
    """
    if pool_step not in (None, "min"):
        raise ValueError(f"sample: pool_step must be None or 'min', got {pool_step!r}")
    if num_chains < 1 or num_burnin < 0 or num_samples < 1 or thinning < 1 or chunk < 1:
        raise ValueError("sample: need num_chains >= 1, num_burnin >= 0, num_samples >= 1, thinning >= 1, chunk >= 1")
    functions = dict(functions or {})
    total = num_burnin + num_samples * thinning
    widths = sampler.model.net.widths
    if compact is None:
        compact = max(widths) >= COMPACT_MIN_WIDTH
    config = _config(sampler, num_chains, num_burnin, num_samples, thinning, sorted(functions), pool_step)
    done, seconds = 0, 0.0
    draws = {k: [] for k in ["sigma2", "active", *functions]}
    traces: list = []
    saved = load_checkpoint(checkpoint, config, "sample") if checkpoint else None
    if saved is not None:
        states, key, done, seconds, draws, traces = (jax.tree_util.tree_map(jnp.asarray, saved["state"]),
                                                     jnp.asarray(saved["key"]), saved["done"], saved["seconds"],
                                                     saved["draws"], saved["traces"])
        traces = [t if t.merges is not None else t._replace(merges=np.zeros_like(t.births),
                                                            splits=np.zeros_like(t.births)) for t in traces]
    elif init_state is not None:
        states = init_state
    else:
        key, k_init = jax.random.split(key)
        states = jax.vmap(sampler.init)(jax.random.split(k_init, num_chains))

    evals = {}

    def evaluate(states, buckets):
        fn = evals.get(buckets)
        if fn is None:
            def one(s):
                out = {k: f(s.params, s.masks, s.sigma2, buckets) for k, f in functions.items()}
                out["sigma2"] = s.sigma2
                out["active"] = jnp.stack([jnp.sum(m) for m in s.masks]).astype(jnp.int32)
                return out
            fn = evals[buckets] = jax.jit(jax.vmap(one))
        return fn(states)

    def save(seconds):
        save_checkpoint(checkpoint, dict(config=config, state=_to_host(states), key=np.asarray(key), done=done,
                                         seconds=seconds, draws=draws, traces=traces))

    restart_at = num_burnin // 2 if restart_adaptation and num_burnin >= 20 else None
    small_slack = sampler.n_max if sampler.model.masked else 0

    def counts_now():
        return np.asarray(jnp.stack([m.sum(-1) for m in states.masks], -1)).max(0)  # (L,) max over chains

    def record(info):
        nonlocal done
        if not np.all(np.isfinite(info.loglik)):
            raise FloatingPointError(f"sample: non-finite log-likelihood at iteration {done} "
                                     f"(chains {np.flatnonzero(~np.isfinite(info.loglik)).tolist()})")
        traces.append(info)
        done += 1

    def at_boundary(at):
        nonlocal states
        if restart_at is not None and at == restart_at:
            # second adaptation window: the target sharpens as the chain leaves its start (sigma^2 falls,
            # masks prune), and step sizes averaged over that transient are too large afterwards
            da_init = sampler._da().init
            states = states._replace(da=jax.vmap(lambda d: da_init(jnp.exp(d.log_step_size)))(states.da))
        if pool_step == "min" and at == num_burnin > 0:  # idempotent, so a resume at this point is safe
            states = pool_min_step(states)

    def next_stop(at):
        # the next event (adaptation restart, end of burn-in, kept draw, end) closes the chunk
        next_draw = num_burnin + thinning * ((max(at - num_burnin, 0)) // thinning + 1)
        return min(total, next_draw, restart_at if restart_at is not None and restart_at > at else total,
                   num_burnin if at < num_burnin else total)

    def advance(at, stop):
        nonlocal states, key
        n_valid = min(chunk, stop - at)
        counts = counts_now()
        redo = False
        # fresh power-of-two blocks every call: a count wandering across a boundary switches between
        # programs already compiled (the step cache), it does not recompile
        if chunk > 1:
            buckets = bucket_sizes(counts, widths, slack=small_slack) if compact else None
            key, states, infos, committed = sampler.chunk_chains(key, states, at, n_valid, num_burnin, buckets, chunk)
            infos, committed = _to_host(infos), np.asarray(committed)
            for j in range(int(committed.sum())):
                record(jax.tree_util.tree_map(lambda a, j=j: a[j], infos))
            redo = committed.sum() < n_valid
            if redo:
                counts = counts_now()
        if chunk == 1 or redo:  # one iteration with headroom for all of its mask moves
            buckets = bucket_sizes(counts, widths, slack=sampler.slack) if compact else None
            next_key, k_step = jax.random.split(key)
            states, info = sampler.step_chains(jax.random.split(k_step, num_chains), states, done < num_burnin,
                                               buckets, done % sampler.refresh_every == 0)
            key = next_key  # advanced only with the state, so a checkpoint pairs them
            record(_to_host(info))
        if done > num_burnin and (done - num_burnin) % thinning == 0 and len(draws["sigma2"]) < (
                done - num_burnin) // thinning:
            eval_buckets = bucket_sizes(counts_now(), widths) if compact else None
            out = _to_host(evaluate(states, eval_buckets))
            for k, v in out.items():
                draws[k].append(v)
        return done

    def postfix():
        last = traces[-1]
        return dict(active=tuple(int(a) for a in last.active.mean(0)), acc=f"{last.hmc_acceptance.mean():.2f}",
                    eps=f"{last.step_size.mean():.1e}")

    # also on interruption the checkpoint is written: the saved state is the last completed iteration
    done, seconds = run_chunks(advance, total=total, done=done, seconds=seconds, next_stop=next_stop,
                               at_boundary=at_boundary, save=save if checkpoint else None,
                               checkpoint_every=checkpoint_every, progress=progress,
                               desc="mBNN" if sampler.model.masked else "BNN", postfix=postfix)
    stacked_draws = {k: np.stack(v, axis=1) for k, v in draws.items()}
    stacked_traces = {f: np.stack([getattr(t, f) for t in traces], axis=1) for f in MBNNInfo._fields}
    return SampleResult(stacked_draws, stacked_traces, states, seconds, done)


def pool_min_step(states: MBNNState) -> MBNNState:
    """Chains stacked on a leading axis, each given the smallest of their adapted (averaged) step sizes
    (`samplers.hmc.pool_min_step` on the dual-averaging states)."""
    return states._replace(da=pool_min_da(states.da))


def _config(sampler, num_chains, num_burnin, num_samples, thinning, function_names, pool_step=None):
    s = sampler
    extra = {} if pool_step is None else {"pool_step": pool_step}  # absent by default: older checkpoints resume
    if s.n_transfer:
        extra.update(n_transfer=s.n_transfer, transfer_kappa=s.transfer_kappa)
    return dict(**extra, net=tuple(s.model.net), n=s.model.n, lik=s.model.likelihood, scale=s.model.prior_scale,
                lam=s.model.lam, sigma2_prior=tuple(s.model.sigma2_prior), K=s.num_integration_steps,
                eps=s.step_size, n_mh=s.n_mh, n_max=s.n_max, birth=s.birth, death=s.death, guard=s.authors_guard,
                kernel=s.theta_kernel, refresh=s.refresh_every, step_scale=s.step_scale, chains=num_chains,
                burnin=num_burnin, samples=num_samples, thinning=thinning, functions=tuple(function_names))


def diagnostics(result: SampleResult, num_burnin: int, keys=("sigma2",)) -> dict:
    """Acceptance rates, step size, divergences, mask moves, and R-hat / ESS of the kept draws named in ``keys``.

    ``result`` is a `SampleResult`; the first ``num_burnin`` iterations of its traces are the burn-in.

    R-hat is the rank-normalised split R-hat and ESS the bulk ESS (``ess_<key>``; the tail ESS is
    ``ess_tail_<key>``) of Vehtari et al. (2021), from `samplers.driver.chain_diagnostics`. For an array-valued
    draw (e.g. test predictions) the worst R-hat (max) and ESS (min) over its entries are reported. They need
    >= 4 draws per chain; otherwise they are NaN.

    Returns:
        ``hmc_acceptance``, ``hmc_acceptance_burnin``, ``step_size``, ``divergences``, ``divergences_burnin``,
        ``mask_acceptance`` (accepted birth/death moves per iteration), ``merges``, ``splits`` (per iteration),
        ``final_active``, ``chains``, ``iterations``, and
        ``rhat_<key>``, ``ess_<key>``, ``ess_bulk_<key>``, ``ess_tail_<key>`` per key.
    """
    tr = result.traces
    phases = phase_summary(tr["hmc_acceptance"], tr["divergent"], num_burnin)
    out = dict(
        hmc_acceptance=phases["acceptance"],
        hmc_acceptance_burnin=phases["acceptance_warmup"],
        step_size=float(np.mean(tr["step_size"][:, -1])),
        divergences=phases["divergences"],
        divergences_burnin=phases["divergences_warmup"],
        mask_acceptance=float(np.mean(tr["mask_accepted"])),  # accepted moves per iteration
        merges=float(np.mean(tr["merges"])),  # accepted merge / split moves per iteration
        splits=float(np.mean(tr["splits"])),
        final_active=np.mean(tr["active"][:, -1], axis=0).tolist(),
        chains=int(tr["active"].shape[0]),
        iterations=int(result.iterations),
    )
    chains = chain_diagnostics(result.draws, keys)
    for k in keys:
        out[f"rhat_{k}"] = chains[f"rhat_{k}"]
        out[f"ess_{k}"] = out[f"ess_bulk_{k}"] = chains[f"ess_bulk_{k}"]
        out[f"ess_tail_{k}"] = chains[f"ess_tail_{k}"]
    return out
