"""One BlackJAX HMC / NUTS driver for any log density over a pytree of parameters (the samplers layer's engine).

In BlackJAX's functional style: :func:`hmc_driver` returns a pair of pure functions,
``state = driver.init(position)`` and ``state, stats = driver.step(key, state)``, with NamedTuple states; the
warm-up (dual-averaging step size, or Stan's windowed step size + diagonal mass matrix,
`samplers.hmc.warmup_adaptation`) lives in the state, so warm-up and sampling are one ``jit``/``vmap``-able
step. :func:`sample` runs many chains of it:

* chains are one ``vmap``, optionally sharded over the local devices (a 1-D ``jax.sharding.Mesh`` on the chain
  axis; every chain's arithmetic is unchanged, so a sharded run equals an unsharded one);
* iterations run in chunks, one compiled ``lax.scan`` per chunk, the same program for warm-up and sampling;
  the key advances once per iteration, so results do not depend on the chunk length;
* thinned draws of the position and of user functions of it are kept inside the compiled chunk;
* the run checkpoints to a file (atomic: temporary file + ``os.replace``) and resumes from it; a checkpoint
  written with other settings is refused;
* the pooled-step option gives every chain the smallest adapted step after warm-up (`samplers.hmc.pool_min_step`);
* a tqdm progress bar (``progress=``).

The host-side pieces are shared with the family samplers (`samplers.mbnn`): :func:`run_chunks` (the chunk loop
with progress, timed checkpoints and a checkpoint on interruption), :func:`save_checkpoint` /
:func:`load_checkpoint`, and the diagnostics :func:`split_rhat`, :func:`ess_bulk`, :func:`ess_tail`,
:func:`chain_diagnostics` (rank-normalised split R-hat, bulk and tail ESS of Vehtari, Gelman, Simpson, Carpenter
and Buerkner 2021, "Rank-normalization, folding, and localization: an improved R-hat", Bayesian Analysis 16(2)),
written on numpy, and :func:`rhat_reference`, what the largest R-hat of many quantities is for independent
draws. :func:`to_inference_data` exports a run to ArviZ.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from samplers.hmc import ADAPTATIONS, Warmup, WarmupState, check_kernel, pool_min_step, transition, warmup_adaptation

__all__ = ["DriverState", "StepStats", "Driver", "hmc_driver", "DriverResult", "sample", "diagnostics",
           "split_rhat", "rhat_reference", "ess", "ess_bulk", "ess_tail", "chain_diagnostics", "phase_summary",
           "run_chunks", "save_checkpoint", "load_checkpoint", "inference_data_dict", "to_inference_data",
           "chain_sharding"]


# ---------------------------------------------------------------------------
# diagnostics (numpy; Vehtari et al. 2021)
# ---------------------------------------------------------------------------

def _as_chains(draws) -> np.ndarray:
    x = np.asarray(draws, dtype=float)
    if x.ndim < 2:
        raise ValueError(f"diagnostics: draws must have shape (chains, draws, ...), got {x.shape}")
    return x.reshape(x.shape[0], x.shape[1], -1)


def _split(x: np.ndarray) -> np.ndarray:
    """(m, n, k) -> (2m, n // 2, k): first and second halves of every chain (the middle draw of an odd chain is
    dropped, as in Stan)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def _rank_normalise(x: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks: ``z = Phi^-1((r - 3/8) / (S + 1/4))`` (Blom 1958; Vehtari et al. 2021,
    eq. 14), ties given their average rank, per trailing entry."""
    from scipy import special, stats

    m, n, k = x.shape
    r = stats.rankdata(x.reshape(m * n, k), method="average", axis=0)
    return special.ndtri((r - 0.375) / (m * n + 0.25)).reshape(m, n, k)


def _rhat_core(x: np.ndarray) -> np.ndarray:
    """Classic R-hat of already-split chains (Gelman et al. 2013, BDA3 eq. 11.4):
    ``sqrt(((n-1)/n W + B/n) / W)``, ``W`` the mean within-chain variance, ``B/n`` the variance of chain means."""
    n = x.shape[1]
    w = x.var(axis=1, ddof=1).mean(axis=0)
    b_over_n = x.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(((n - 1) / n * w + b_over_n) / w)


def _ess_core(x: np.ndarray) -> np.ndarray:
    """ESS of chains ``(m, n, k)`` (Vehtari et al. 2021, section 3.2; Geyer 1992 initial monotone sequence).

    ``rho_t = 1 - (W - mean_m acov_{m,t}) / var+`` with the biased per-chain autocovariances ``acov`` (FFT),
    ``W`` the mean within-chain variance and ``var+ = (n-1)/n W + var(chain means)``; the sums
    ``P_j = rho_{2j} + rho_{2j+1}`` are kept while positive and made non-increasing;
    ``tau = -1 + 2 sum_j P_j + rho_{2J+2}`` (the next even lag when positive), at least ``1 / log10(m n)``;
    ``ESS = m n / tau``. NaN where the draws are constant or contain NaN.
    """
    m, n, k = x.shape
    out = np.full(k, np.nan)
    if n < 2:
        return out
    centred = x - x.mean(axis=1, keepdims=True)
    nfft = 1 << int(math.ceil(math.log2(2 * n)))
    f = np.fft.rfft(centred, n=nfft, axis=1)
    acov = np.fft.irfft(f * np.conj(f), n=nfft, axis=1)[:, :n] / n  # (m, n, k)
    w = acov[:, 0].mean(axis=0) * n / (n - 1)
    var_plus = w * (n - 1) / n
    if m > 1:
        var_plus = var_plus + x.mean(axis=1).var(axis=0, ddof=1)
    mean_acov = acov.mean(axis=0)  # (n, k)
    for j in range(k):
        if not (np.isfinite(var_plus[j]) and w[j] > 0):
            continue
        rho = 1.0 - (w[j] - mean_acov[:, j]) / var_plus[j]
        rho[0] = 1.0
        kept = np.zeros(n)
        kept[:2] = rho[:2]
        even, odd = rho[0], rho[1]
        t = 1
        # initial positive sequence: pairs (rho_{t+1}, rho_{t+2}) while the previous pair's sum is positive
        while t < n - 3 and even + odd > 0:
            even, odd = rho[t + 1], rho[t + 2]
            if even + odd >= 0:
                kept[t + 1], kept[t + 2] = even, odd
            t += 2
        last = t - 2
        if even > 0:
            kept[last + 1] = even
        # initial monotone sequence: each pair sum no larger than the one before
        t = 1
        while t <= last - 2:
            if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
                kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2
            t += 2
        tau = -1.0 + 2.0 * kept[:last + 1].sum() + kept[last + 1:last + 2].sum()
        tau = max(tau, 1.0 / math.log10(m * n))
        out[j] = m * n / tau
    return out


def _per_entry(fn, draws, min_draws=4):
    x = _as_chains(draws)
    shape = np.asarray(draws).shape[2:]
    if x.shape[1] < min_draws:
        out = np.full(x.shape[2], np.nan)
    else:
        bad = ~np.all(np.isfinite(x), axis=(0, 1))
        out = fn(np.where(bad, 0.0, x))
        out = np.where(bad, np.nan, out)
    out = out.reshape(shape)
    return float(out) if out.ndim == 0 else out


def split_rhat(draws):
    """Rank-normalised split R-hat (Vehtari et al. 2021, section 4.2, eqs. 14-16).

    Every chain is split in halves, the pooled draws are rank-normalised and the classic R-hat of the halves
    computed (bulk); the same on the folded draws ``|x - median(x)|`` (tails; the median of the split draws, as
    ArviZ and BlackJAX take it); the larger of the two is returned.

    Args:
        draws: array ``(chains, draws, ...)``; at least 4 draws per chain.

    Returns:
        R-hat per trailing entry (a float for scalar draws); NaN for constant draws, draws containing NaN/inf,
        or fewer than 4 draws per chain. Values above ~1.01 signal chains that have not mixed.
    """
    def fn(x):
        s = _split(x)
        folded = np.abs(s - np.median(s.reshape(-1, s.shape[2]), axis=0))  # median of the split draws
        constant = np.all(s == s[:1, :1], axis=(0, 1))
        r = np.maximum(_rhat_core(_rank_normalise(s)), _rhat_core(_rank_normalise(folded)))
        return np.where(constant, np.nan, r)
    return _per_entry(fn, draws)


def rhat_reference(chains: int, draws: int, entries: int, groups: int = 1, q: float = 0.95, reps: int = 1000,
                   seed: int = 0) -> tuple[float, float]:
    """What the largest R-hat is for exactly independent draws: the yardstick for a max-R-hat threshold.

    A table that reports the largest :func:`split_rhat` over ``entries`` quantities (e.g. the predictions at
    every test point) and over ``groups`` runs (e.g. data splits) exceeds 1 by chance alone, the more so the
    fewer draws per chain: with 4 chains of 20 draws, 31-51 test points and 20 splits the largest R-hat of
    independent draws is about 1.15, so "max R-hat <= 1.1" is a target that even exact sampling almost never
    meets at that size; with 40 draws per chain it is about 1.07.

    The entries are taken as independent of each other, which gives the upper end of the chance level: entries
    that move together (predictions at nearby test points) behave like fewer entries, down to ``entries=1``
    when they move as one (about 1.08 for 20 splits of 4 x 20 draws). A value above the independent-entries
    reference is therefore evidence of chains that disagree whatever the correlation.

    The reference is simulated: ``reps`` runs of ``chains x draws x entries`` independent standard normals (R-hat
    is invariant to the marginal distribution, as it is rank-normalised), the largest R-hat of each; the largest
    over ``groups`` is drawn from those by resampling ``groups`` of them. Deterministic given ``seed``.

    Args:
        chains: chains per run (at least 1).
        draws: kept draws per chain (at least 4).
        entries: quantities per run whose largest R-hat is taken (at least 1).
        groups: runs whose largest R-hat is taken (at least 1).
        q: the upper quantile returned beside the median, in (0, 1).

    Returns:
        ``(median, q-quantile)`` of the largest R-hat over ``entries`` and ``groups`` under independent draws.
    """
    for name, v, low in (("chains", chains, 1), ("draws", draws, 4), ("entries", entries, 1), ("groups", groups, 1),
                         ("reps", reps, 2)):
        if int(v) != v or v < low:
            raise ValueError(f"rhat_reference: {name} must be an integer >= {low}, got {v!r}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"rhat_reference: q must be in (0, 1), got {q!r}")
    return _rhat_reference(int(chains), int(draws), int(entries), int(groups), float(q), int(reps), int(seed))


@functools.lru_cache(maxsize=64)
def _rhat_reference(chains, draws, entries, groups, q, reps, seed):
    rng = np.random.default_rng(seed)
    per_run = np.array([np.nanmax(split_rhat(rng.normal(size=(chains, draws, entries)))) for _ in range(reps)])
    worst = per_run[rng.integers(0, reps, size=(max(reps, 1000), groups))].max(axis=1)
    return float(np.median(worst)), float(np.quantile(worst, q))


def ess(draws):
    """Effective sample size of split chains without rank normalisation (Vehtari et al. 2021, section 3.2).

    Args:
        draws: ``(chains, draws, ...)``.

    Returns:
        ESS per trailing entry (float for scalar draws); NaN for constant draws or fewer than 4 draws per chain.
    """
    return _per_entry(lambda x: _ess_core(_split(x)), draws)


def ess_bulk(draws):
    """Bulk ESS: the ESS of the rank-normalised split chains (Vehtari et al. 2021, section 4.3).

    Args:
        draws: ``(chains, draws, ...)``.

    Returns:
        ESS per trailing entry (float for scalar draws); about ``chains * draws`` for independent draws.
    """
    def fn(x):
        s = _split(x)
        constant = np.all(s == s[:1, :1], axis=(0, 1))
        return np.where(constant, np.nan, _ess_core(_rank_normalise(s)))
    return _per_entry(fn, draws)


def ess_tail(draws, prob: float = 0.9):
    """Tail ESS: the smaller ESS of the split-chain indicators ``I(x <= q_{(1-prob)/2})`` and
    ``I(x <= q_{(1+prob)/2})`` (the 5% and 95% quantiles by default; Vehtari et al. 2021, section 4.3, as Stan,
    BlackJAX and ArviZ 0.x take them). ArviZ 1.x's ``az.ess(method="tail")`` defaults to the 11% and 89% quantiles
    (its ``stats.ci_prob`` of 0.89): pass it ``prob=(0.05, 0.95)`` to compare, or give ``prob=0.78`` here.

    Args:
        draws: ``(chains, draws, ...)``. prob: central probability of the two quantiles.

    Returns:
        ESS per trailing entry (float for scalar draws).
    """
    def fn(x):
        flat = x.reshape(-1, x.shape[2])
        s = _split(x)
        out = []
        for q in ((1 - prob) / 2, (1 + prob) / 2):
            out.append(_ess_core((s <= np.quantile(flat, q, axis=0)).astype(float)))
        return np.minimum(*out)
    return _per_entry(fn, draws)


def chain_diagnostics(draws: dict, keys=None) -> dict:
    """R-hat and ESS of kept draws: the worst over every entry of each named draw.

    Args:
        draws: ``name -> array (chains, draws, ...)`` or a pytree of such arrays (e.g. a position).
        keys: names to diagnose (default all).

    Returns:
        ``{rhat_<name>: max split R-hat, ess_bulk_<name>: min bulk ESS, ess_tail_<name>: min tail ESS}``; NaN
        where undefined (fewer than 4 draws per chain, constant draws).
    """
    out = {}
    for k in (draws if keys is None else keys):
        leaves = [np.asarray(v, float) for v in jax.tree_util.tree_leaves(draws[k])]
        x = np.concatenate([v.reshape(v.shape[0], v.shape[1], -1) for v in leaves], axis=2)
        values = {"rhat": (split_rhat(x), np.nanmax), "ess_bulk": (ess_bulk(x), np.nanmin),
                  "ess_tail": (ess_tail(x), np.nanmin)}
        for name, (v, worst) in values.items():
            v = np.atleast_1d(v)
            out[f"{name}_{k}"] = float(worst(v)) if np.any(np.isfinite(v)) else float("nan")
    return out


def phase_summary(acceptance, divergent, num_warmup: int) -> dict:
    """Mean acceptance and divergence counts of per-iteration traces ``(chains, iterations)``, split at warm-up.

    Args:
        acceptance: the acceptance probabilities ``(chains, iterations)``.
        divergent: the divergence flags ``(chains, iterations)``.
        num_warmup: the number of leading warm-up iterations.

    Returns:
        ``{acceptance, acceptance_warmup, divergences, divergences_warmup}`` (NaN means for empty phases).
    """
    acceptance, divergent = np.asarray(acceptance), np.asarray(divergent)
    post = acceptance[:, num_warmup:]
    return dict(acceptance=float(np.mean(post)) if post.size else float("nan"),
                acceptance_warmup=float(np.mean(acceptance[:, :num_warmup])) if num_warmup else float("nan"),
                divergences=int(np.sum(divergent[:, num_warmup:])),
                divergences_warmup=int(np.sum(divergent[:, :num_warmup])))


# ---------------------------------------------------------------------------
# checkpoints and the chunk loop (shared by every family's sampler)
# ---------------------------------------------------------------------------

def save_checkpoint(path: str, payload: dict) -> None:
    """Pickle ``payload`` to ``path`` atomically: written to ``path + '.tmp'``, then ``os.replace`` (an
    interruption leaves either the old file or the new one, never half of one)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(payload, fh)
    os.replace(tmp, path)


def load_checkpoint(path: str, config: dict, who: str = "sample") -> dict | None:
    """The payload saved at ``path`` (``None`` if there is no file).

    Args:
        path: the checkpoint file (an empty path counts as no file).
        config: the settings of the run that wants to resume; the payload's ``"config"`` must equal it.
        who: the caller's name, used in the error message (default ``"sample"``).

    Returns:
        The saved payload (a dict, as written by :func:`save_checkpoint`), or ``None``.

    Raises:
        ValueError: the checkpoint's ``config`` differs from ``config`` (naming the differing settings).
    """
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        saved = pickle.load(fh)
    if saved.get("config") != config:
        old = saved.get("config") or {}
        diff = sorted(k for k in set(old) | set(config) if old.get(k, "<absent>") != config.get(k, "<absent>"))
        raise ValueError(f"{who}: checkpoint {path} was written with other settings (differing: "
                         f"{', '.join(diff)}); remove it to restart")
    return saved


def run_chunks(advance: Callable[[int, int], int], *, total: int, done: int = 0, seconds: float = 0.0,
               next_stop: Callable[[int], int] | None = None, at_boundary: Callable[[int], None] | None = None,
               save: Callable[[float], None] | None = None, checkpoint_every: float = 60.0,
               progress: bool = False, desc: str | None = None, postfix: Callable[[], dict] | None = None):
    """The host loop of a chunked MCMC run: ``advance`` until ``total`` iterations, with progress and checkpoints.

    Each pass: ``at_boundary(done)`` (e.g. pool the step sizes at the end of warm-up), then
    ``done = advance(done, stop)`` with ``stop = next_stop(done)`` (the next event: a chunk's end, the end of
    warm-up, a kept draw; ``advance`` runs at least one and at most ``stop - done`` iterations), then the
    progress bar, and ``save(seconds)`` every ``checkpoint_every`` seconds. ``save`` also runs when the loop ends
    or is interrupted (``finally``), so the file holds the last completed chunk.

    Args:
        advance: ``(done, stop) -> new done``.
        total: iterations of the whole run.
        done: iterations already done (where a resumed run stands; default 0).
        seconds: wall time already spent (where a resumed run stands; default 0).
        next_stop: ``done -> stop`` (capped at ``total``); ``None``: run to ``total`` in one call.
        at_boundary: ``done -> None`` called before every ``advance``, or ``None``.
        save: ``seconds -> None`` writing a checkpoint, or ``None`` (no checkpoints).
        checkpoint_every: seconds between two timed calls of ``save`` (default 60).
        progress: show a tqdm progress bar.
        desc: the bar's label (``None``: none).
        postfix: ``() -> dict`` shown beside the bar, or ``None``.

    Returns:
        ``(done, seconds)``: iterations done and the run's wall time (resumed runs add up).

    Raises:
        RuntimeError: ``advance`` returned a count that does not move forward or passes ``total``.
    """
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, initial=done, desc=desc, leave=False)
    last_save = time.perf_counter()
    start = time.perf_counter() - seconds
    try:
        while done < total:
            if at_boundary is not None:
                at_boundary(done)
            stop = total if next_stop is None else min(total, next_stop(done))
            new = advance(done, stop)
            if not done < new <= total:
                raise RuntimeError(f"run_chunks: advance went from {done} to {new} (stop {stop}, total {total})")
            done = new
            seconds = time.perf_counter() - start
            if bar is not None:
                bar.update(done - bar.n)
                if postfix is not None:
                    bar.set_postfix(**postfix())
            if save is not None and time.perf_counter() - last_save > checkpoint_every:
                save(seconds)
                last_save = time.perf_counter()
    finally:
        if bar is not None:
            bar.close()
        if save is not None:
            save(seconds)
    return done, seconds


# ---------------------------------------------------------------------------
# the driver: init / step
# ---------------------------------------------------------------------------

class DriverState(NamedTuple):
    """Per-chain state: ``hmc`` (BlackJAX ``HMCState``: position, log density, its gradient), ``warmup``
    (`samplers.hmc.WarmupState`: the step size and inverse mass matrix in force, and the adaptation's state),
    ``iteration`` (iterations done)."""

    hmc: Any
    warmup: WarmupState
    iteration: jnp.ndarray


class StepStats(NamedTuple):
    """Per-iteration statistics: acceptance probability, accepted, divergent, leapfrog steps, the step size
    used, and the log density after the iteration.

    Attributes:
        acceptance_rate: the acceptance probability of the transition (NaN reported as 0).
        is_accepted: whether the position moved.
        is_divergent: whether the trajectory diverged.
        num_integration_steps: the leapfrog steps of the trajectory.
        step_size: the step size the transition used.
        logdensity: the log density at the position after the iteration.
    """

    acceptance_rate: jnp.ndarray
    is_accepted: jnp.ndarray
    is_divergent: jnp.ndarray
    num_integration_steps: jnp.ndarray
    step_size: jnp.ndarray
    logdensity: jnp.ndarray


class Driver(NamedTuple):
    """``init(position) -> DriverState``; ``step(key, state) -> (DriverState, StepStats)``; ``warmup`` and the
    settings it was built with (``kernel``, ``num_warmup``)."""

    init: Callable
    step: Callable
    warmup: Warmup
    kernel: str
    num_warmup: int


def hmc_driver(logdensity_fn: Callable, *, kernel: str = "nuts", adaptation: str = "window",
               num_warmup: int = 1000, step_size: float = 1.0, inverse_mass_matrix=None,
               target_accept: float = 0.8, num_integration_steps: int = 20, max_num_doublings: int = 10,
               step_scale: float = 1.0, da_gamma: float = 0.05, da_t0: float = 10.0,
               da_kappa: float = 0.75) -> Driver:
    """HMC or NUTS with warm-up for a fixed log density over a pytree: a pair of pure, ``jit``/``vmap``-able functions.

    Iteration ``t`` (``state.iteration``) takes one BlackJAX transition (`samplers.hmc.transition`) with the step
    size and diagonal inverse mass matrix in the state; for ``t < num_warmup`` the warm-up adaptation then
    updates them (`samplers.hmc.warmup_adaptation`), and after iteration ``num_warmup - 1`` they are frozen at
    the adapted values (``step_scale`` times the averaged dual-averaging step), so the sampling phase is a fixed
    kernel leaving the target invariant.

    Args:
        logdensity_fn: ``position -> scalar`` log density (unnormalised).
        kernel: ``'nuts'`` (Hoffman and Gelman 2014; at most ``2**max_num_doublings`` leapfrog steps) or ``'hmc'``
            (``num_integration_steps`` leapfrog steps; Neal 2011).
        adaptation: ``'window'`` (Stan's windowed step size + diagonal mass matrix), ``'dual_averaging'`` (step
            size only) or ``'none'``.
        num_warmup: warm-up iterations.
        step_size: initial step.
        inverse_mass_matrix: initial diagonal ``(d,)`` (default ones).
        target_accept: the dual averaging's target mean acceptance (BlackJAX's default).
        num_integration_steps: leapfrog steps per trajectory of the ``'hmc'`` kernel.
        max_num_doublings: the ``'nuts'`` kernel's trajectories have at most ``2**max_num_doublings`` leapfrog
            steps.
        step_scale: factor, in ``(0, 1]``, on the averaged dual-averaging step frozen after warm-up.
        da_gamma: the dual averaging's ``gamma`` (BlackJAX's default).
        da_t0: the dual averaging's ``t0`` (BlackJAX's default).
        da_kappa: the dual averaging's ``kappa`` (BlackJAX's default).

    Returns:
        :class:`Driver`.

    Raises:
        ValueError: unknown ``kernel`` or ``adaptation``, or a bad setting (named).
    """
    check_kernel(kernel, "hmc_driver")
    if adaptation not in ADAPTATIONS:
        raise ValueError(f"hmc_driver: adaptation must be one of {ADAPTATIONS}, got {adaptation!r}")
    if int(num_warmup) < 0:
        raise ValueError(f"hmc_driver: num_warmup must be >= 0, got {num_warmup}")
    if not step_size > 0:
        raise ValueError(f"hmc_driver: step_size must be > 0, got {step_size}")
    if not 0 < target_accept < 1:
        raise ValueError(f"hmc_driver: target_accept must be in (0, 1), got {target_accept}")
    if int(num_integration_steps) < 1:
        raise ValueError(f"hmc_driver: num_integration_steps must be >= 1, got {num_integration_steps}")
    if int(max_num_doublings) < 1:
        raise ValueError(f"hmc_driver: max_num_doublings must be >= 1, got {max_num_doublings}")
    if not 0 < step_scale <= 1:
        raise ValueError(f"hmc_driver: step_scale must be in (0, 1], got {step_scale}")
    num_warmup = int(num_warmup)
    warmup = warmup_adaptation(adaptation, num_warmup, target_accept=target_accept, gamma=da_gamma, t0=da_t0,
                               kappa=da_kappa, step_scale=step_scale)

    def init(position) -> DriverState:
        from blackjax.mcmc import hmc

        flat, _ = ravel_pytree(position)
        imm = inverse_mass_matrix
        if imm is not None:
            imm = jnp.asarray(imm, flat.dtype)
            if imm.shape != flat.shape:
                raise ValueError(f"hmc_driver: inverse_mass_matrix must have shape {flat.shape} (the position's "
                                 f"size), got {imm.shape}")
        return DriverState(hmc.init(position, logdensity_fn), warmup.init(position, step_size, imm),
                           jnp.zeros((), jnp.int32))

    def step(key, state: DriverState):
        t = state.iteration
        w = state.warmup
        new, info = transition(key, state.hmc, logdensity_fn, w.step_size, w.inverse_mass_matrix, kernel=kernel,
                               num_integration_steps=int(num_integration_steps),
                               max_num_doublings=int(max_num_doublings))
        if num_warmup > 0:
            adapted = warmup.update(w, jnp.minimum(t, num_warmup - 1), new.position, info.acceptance_rate)
            w = jax.tree_util.tree_map(lambda a, b: jnp.where(t < num_warmup, a, b), adapted, w)
        stats = StepStats(info.acceptance_rate, info.is_accepted, info.is_divergent, info.num_integration_steps,
                          state.warmup.step_size, new.logdensity)
        return DriverState(new, w, t + 1), stats

    return Driver(init, step, warmup, kernel, num_warmup)


# ---------------------------------------------------------------------------
# many chains, chunked, checkpointed
# ---------------------------------------------------------------------------

class DriverResult(NamedTuple):
    """A run of :func:`sample`.

    draws: ``name -> (chains, num_samples, ...)`` numpy arrays (``'position'``: the position pytree with those
    leading axes). stats: `StepStats` field -> ``(chains, iterations)`` for every iteration, warm-up included.
    state: final `DriverState` (numpy). num_warmup, thinning, iterations: the run's layout (kept draw ``k`` is
    the state after iteration ``num_warmup + (k + 1) * thinning - 1``). seconds: wall time (resumed runs add
    up). devices: devices the chains were sharded over (1 = not sharded).
    """

    draws: dict
    stats: dict
    state: DriverState
    num_warmup: int
    thinning: int
    iterations: int
    seconds: float
    devices: int


def chain_sharding(num_chains: int, shard):
    """The ``NamedSharding`` that splits a leading chain axis over the local devices, or ``None``.

    Args:
        num_chains: the number of chains (the length of the leading axis).
        shard: ``None``: shard when there are several local devices and they divide ``num_chains``; ``True``:
            shard (an error if they do not divide it); ``False``: do not.

    Returns:
        A ``jax.sharding.NamedSharding`` over a 1-D mesh of the local devices (axis ``"chains"``), or ``None``
        when the chains are not sharded.

    Raises:
        ValueError: ``shard=True`` and the device count does not divide ``num_chains``.
    """
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.local_devices()
    if shard is False or (shard is None and (len(devices) < 2 or num_chains % len(devices))):
        return None
    if num_chains % len(devices):
        raise ValueError(f"sample: num_chains ({num_chains}) must be a multiple of the {len(devices)} local devices "
                         "to shard the chains (or pass shard=False)")
    return NamedSharding(Mesh(np.asarray(devices), ("chains",)), PartitionSpec("chains"))


def _to_host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _chunk_program(driver: Driver, extract: Callable, num_chains: int, thinning: int, length: int,
                   sharding):
    """``(key, states, start, n_valid) -> (key, states, stats, kept, n_kept)``: iterations ``start ..
    start + n_valid - 1`` (``n_valid <= length``) of every chain in one ``lax.scan`` of ``length`` steps (the rest
    skipped), keeping ``extract(position)`` after every iteration ``t >= num_warmup`` with
    ``(t + 1 - num_warmup) % thinning == 0`` in a buffer of ``ceil(length / thinning)`` slots."""
    num_warmup = driver.num_warmup
    slots = -(-length // thinning)
    step = jax.vmap(driver.step)
    chains_axis1 = None
    if sharding is not None:
        from jax.sharding import NamedSharding, PartitionSpec
        chains_axis1 = NamedSharding(sharding.mesh, PartitionSpec(None, "chains"))

    def constrain(tree, s):
        return tree if s is None else jax.lax.with_sharding_constraint(tree, s)

    def program(key, states, start, n_valid):
        kept_shape = jax.eval_shape(jax.vmap(extract), states.hmc.position)
        buf = jax.tree_util.tree_map(lambda s: jnp.zeros((slots,) + s.shape, s.dtype), kept_shape)
        buf = constrain(buf, chains_axis1)
        stats_shape = jax.eval_shape(step, jax.random.split(key, num_chains), states)[1]

        def body(carry, i):
            t = start + i

            def go(c):
                key, states, buf, n_kept = c
                key, k_step = jax.random.split(key)
                states, stats = step(jax.random.split(k_step, num_chains), states)
                states = constrain(states, sharding)
                keep = (t >= num_warmup) & ((t + 1 - num_warmup) % thinning == 0)

                def write(b):
                    out = jax.vmap(extract)(states.hmc.position)
                    return jax.tree_util.tree_map(lambda bb, o: jax.lax.dynamic_update_index_in_dim(bb, o, n_kept, 0),
                                                  b, out)

                buf = jax.lax.cond(keep, write, lambda b: b, buf)
                return (key, states, buf, n_kept + keep.astype(jnp.int32)), stats

            def skip(c):
                return c, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), stats_shape)

            return jax.lax.cond(i < n_valid, go, skip, carry)

        (key, states, buf, n_kept), stats = jax.lax.scan(body, (key, states, buf, jnp.zeros((), jnp.int32)),
                                                          jnp.arange(length))
        return key, states, stats, buf, n_kept

    return jax.jit(program)


def _initial_positions(initial_position, key, num_chains):
    if callable(initial_position):
        key, k_init = jax.random.split(key)
        return jax.vmap(initial_position)(jax.random.split(k_init, num_chains)), key
    leaves = jax.tree_util.tree_leaves(initial_position)
    if not leaves:
        raise ValueError("sample: initial_position is an empty pytree")
    for leaf in leaves:
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != num_chains:
            raise ValueError(f"sample: initial_position must hold one position per chain (a leading axis of "
                             f"num_chains = {num_chains}) or be a callable key -> position; got a leaf of shape "
                             f"{jnp.shape(leaf)}")
    return jax.tree_util.tree_map(jnp.asarray, initial_position), key


def _leaf_names(tree, prefix: str) -> list[str]:
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = []
    for path, _ in paths:
        parts = []
        for p in path:
            for attr in ("key", "idx", "name"):
                if hasattr(p, attr):
                    parts.append(str(getattr(p, attr)))
                    break
        names.append(".".join(parts) if parts else prefix)
    return names


def sample(logdensity_fn: Callable, key, initial_position, *, num_chains: int = 4, num_warmup: int = 1000,
           num_samples: int = 1000, thinning: int = 1, kernel: str = "nuts", adaptation: str = "window",
           step_size: float = 1.0, inverse_mass_matrix=None, target_accept: float = 0.8,
           num_integration_steps: int = 20, max_num_doublings: int = 10, step_scale: float = 1.0,
           pool_step: str | None = None, functions: dict[str, Callable] | None = None, keep_position: bool = True,
           chunk: int = 100, checkpoint: str | None = None, checkpoint_every: float = 60.0, progress: bool = True,
           shard=None) -> DriverResult:
    """Run ``num_chains`` chains of :func:`hmc_driver`: warm-up, then ``num_samples`` draws every ``thinning``
    iterations.

    Args:
        logdensity_fn: ``position -> scalar`` log density.
        key: PRNG key; iteration ``t`` uses ``key_t, k = split(key_{t-1})`` and the chains ``split(k, num_chains)``.
        initial_position: one position per chain (a pytree whose leaves have a leading axis ``num_chains``) or a
            callable ``key -> position`` (called per chain with keys split from ``key``).
        num_chains: chains (``vmap``; sharded over local devices per ``shard``, see :func:`chain_sharding`).
        num_warmup: warm-up iterations (see :func:`hmc_driver`).
        num_samples: kept draws per chain.
        thinning: iterations per kept draw after warm-up.
        kernel: ``'nuts'`` or ``'hmc'`` (see :func:`hmc_driver`).
        adaptation: ``'window'``, ``'dual_averaging'`` or ``'none'`` (see :func:`hmc_driver`).
        step_size: initial step (see :func:`hmc_driver`).
        inverse_mass_matrix: initial diagonal inverse mass matrix (see :func:`hmc_driver`).
        target_accept: the dual averaging's target mean acceptance (see :func:`hmc_driver`).
        num_integration_steps: leapfrog steps per trajectory of the ``'hmc'`` kernel (see :func:`hmc_driver`).
        max_num_doublings: the ``'nuts'`` kernel's tree-doubling limit (see :func:`hmc_driver`).
        step_scale: factor on the adapted step after warm-up (see :func:`hmc_driver`).
        pool_step: ``None``: each chain keeps its adapted step; ``'min'``: after warm-up every chain takes the
            smallest adapted step (`samplers.hmc.pool_min_step`). The mass matrices stay per chain.
        functions: ``name -> fn(position)`` evaluated at every kept draw (inside the compiled chunk); the
            position itself is kept as ``'position'`` unless ``keep_position=False``.
        keep_position: keep the position at every kept draw (as ``'position'``).
        chunk: iterations per compiled program (a ``lax.scan``); results do not depend on it.
        checkpoint: file path; the run is saved there every ``checkpoint_every`` seconds, at the end, and on
            interruption, and a run started with the same path and settings resumes from it (the log density is
            not compared: resuming with another target is the caller's error).
        checkpoint_every: seconds between two timed saves of ``checkpoint`` (default 60).
        progress: show a tqdm bar.
        shard: shard the chains over the local devices: ``None`` (when possible), ``True`` or ``False`` (see
            :func:`chain_sharding`).

    Returns:
        :class:`DriverResult`.

    Raises:
        ValueError: a bad argument (named): ``num_chains < 1``, unknown ``kernel``/``adaptation``/``pool_step``,
            a log density that is not a scalar, a NaN or infinite log density (or gradient) at an initial
            position, a checkpoint written with other settings.
        FloatingPointError: a chain's log density became NaN.
    """
    if int(num_chains) < 1:
        raise ValueError(f"sample: num_chains must be >= 1, got {num_chains}")
    check_kernel(kernel, "sample")
    if adaptation not in ADAPTATIONS:
        raise ValueError(f"sample: adaptation must be one of {ADAPTATIONS}, got {adaptation!r}")
    if pool_step not in (None, "min"):
        raise ValueError(f"sample: pool_step must be None or 'min', got {pool_step!r}")
    for name, value, low in (("num_warmup", num_warmup, 0), ("num_samples", num_samples, 1),
                             ("thinning", thinning, 1), ("chunk", chunk, 1)):
        if int(value) < low:
            raise ValueError(f"sample: {name} must be >= {low}, got {value}")
    functions = dict(functions or {})
    if "position" in functions:
        raise ValueError("sample: functions may not be named 'position' (the kept position)")
    if not keep_position and not functions:
        raise ValueError("sample: nothing to keep (keep_position=False and no functions)")
    num_chains, num_warmup, num_samples, thinning, chunk = map(int, (num_chains, num_warmup, num_samples, thinning,
                                                                    chunk))
    driver = hmc_driver(logdensity_fn, kernel=kernel, adaptation=adaptation, num_warmup=num_warmup,
                        step_size=step_size, inverse_mass_matrix=inverse_mass_matrix, target_accept=target_accept,
                        num_integration_steps=num_integration_steps, max_num_doublings=max_num_doublings,
                        step_scale=step_scale)
    total = num_warmup + num_samples * thinning
    key = jnp.asarray(key)
    positions, key = _initial_positions(initial_position, key, num_chains)
    one = jax.tree_util.tree_map(lambda x: x[0], positions)
    out = jax.eval_shape(logdensity_fn, one)
    if not hasattr(out, "shape") or out.shape != ():
        raise ValueError(f"sample: logdensity_fn must return a scalar, got "
                         f"{getattr(out, 'shape', type(out).__name__)}")

    def extract(position):
        kept = {k: f(position) for k, f in functions.items()}
        if keep_position:
            kept["position"] = position
        return kept

    config = dict(num_chains=num_chains, num_warmup=num_warmup, num_samples=num_samples, thinning=thinning,
                  kernel=kernel, adaptation=adaptation, step_size=float(step_size),
                  inverse_mass_matrix=None if inverse_mass_matrix is None else
                  np.asarray(inverse_mass_matrix).tolist(), target_accept=float(target_accept),
                  num_integration_steps=int(num_integration_steps), max_num_doublings=int(max_num_doublings),
                  step_scale=float(step_scale), pool_step=pool_step, functions=tuple(sorted(functions)),
                  keep_position=bool(keep_position),
                  position=str(jax.tree_util.tree_structure(one)) + str([(x.shape, str(x.dtype)) for x in
                                                                         jax.tree_util.tree_leaves(one)]))
    sharding = chain_sharding(num_chains, shard)
    saved = load_checkpoint(checkpoint, config, "sample") if checkpoint else None
    if saved is not None:
        states = jax.tree_util.tree_map(jnp.asarray, saved["state"])
        key, done, seconds = jnp.asarray(saved["key"]), saved["done"], saved["seconds"]
        kept, traces = saved["draws"], saved["stats"]
    else:
        states = jax.jit(jax.vmap(driver.init))(positions)
        bad = ~np.isfinite(np.asarray(states.hmc.logdensity))
        if bad.any():
            raise ValueError(f"sample: the log density is NaN or infinite at initial_position of chains "
                             f"{np.flatnonzero(bad).tolist()}")
        grads = jax.vmap(lambda g: ravel_pytree(g)[0])(states.hmc.logdensity_grad)
        bad = ~np.all(np.isfinite(np.asarray(grads)), axis=1)
        if bad.any():
            raise ValueError(f"sample: the gradient of the log density is NaN or infinite at initial_position of "
                             f"chains {np.flatnonzero(bad).tolist()}")
        done, seconds, kept, traces = 0, 0.0, [], []
    if sharding is not None:
        states = jax.device_put(states, sharding)
    program = _chunk_program(driver, extract, num_chains, thinning, chunk, sharding)
    run = {"states": states, "key": key, "done": done}

    def at_boundary(done):
        if pool_step == "min" and done == num_warmup > 0:  # idempotent: a resume at this point is safe
            s = run["states"]
            run["states"] = s._replace(warmup=s.warmup._replace(step_size=pool_min_step(s.warmup.step_size)))

    def next_stop(done):
        return min(done + chunk, num_warmup if done < num_warmup else total)

    def advance(done, stop):
        key, states, stats, buf, n_kept = program(run["key"], run["states"], jnp.asarray(done, jnp.int32),
                                                  jnp.asarray(stop - done, jnp.int32))
        stats = _to_host(jax.tree_util.tree_map(lambda a: a[:stop - done], stats))
        n_kept = int(n_kept)
        if not np.all(np.isfinite(stats.logdensity)):
            rows, chains = np.nonzero(~np.isfinite(stats.logdensity))
            raise FloatingPointError(f"sample: non-finite log density at iteration {done + int(rows[0])} "
                                     f"(chains {sorted(set(chains.tolist()))})")
        traces.append(stats)
        if n_kept:
            kept.append(_to_host(jax.tree_util.tree_map(lambda a: a[:n_kept], buf)))
        run.update(states=states, key=key, done=stop)
        return stop

    def save(seconds):
        if checkpoint:
            save_checkpoint(checkpoint, dict(config=config, state=_to_host(run["states"]), key=np.asarray(run["key"]),
                                             done=run["done"], seconds=seconds, draws=kept, stats=traces))

    def postfix():
        last = traces[-1]
        return dict(acc=f"{float(np.mean(last.acceptance_rate)):.2f}",
                    eps=f"{float(np.mean(last.step_size[-1])):.2g}",
                    div=int(sum(int(np.sum(t.is_divergent)) for t in traces)))

    done, seconds = run_chunks(advance, total=total, done=done, seconds=seconds, next_stop=next_stop,
                               at_boundary=at_boundary, save=save if checkpoint else None,
                               checkpoint_every=checkpoint_every, progress=progress, desc=kernel.upper(),
                               postfix=postfix)
    draws = jax.tree_util.tree_map(lambda *a: np.swapaxes(np.concatenate(a, axis=0), 0, 1), *kept)
    stats = {f: np.swapaxes(np.concatenate([getattr(t, f) for t in traces], axis=0), 0, 1)
             for f in StepStats._fields}
    return DriverResult(draws, stats, _to_host(run["states"]), num_warmup, thinning, done, seconds,
                        1 if sharding is None else len(sharding.mesh.devices.flat))


def diagnostics(result: DriverResult, keys=None) -> dict:
    """Acceptance, divergences, step sizes, leapfrog steps, and R-hat / bulk and tail ESS of the kept draws.

    Args:
        result: a :class:`DriverResult`.
        keys: names of ``result.draws`` to diagnose (default all).

    Returns:
        `phase_summary` (``acceptance``, ``acceptance_warmup``, ``divergences``, ``divergences_warmup``) plus
        ``step_size`` (mean over chains of the final step), ``num_integration_steps`` (mean leapfrog steps after
        warm-up), ``chains``, ``draws``, and `chain_diagnostics` (``rhat_<name>``, ``ess_bulk_<name>``,
        ``ess_tail_<name>``; the worst entry of each).
    """
    st = result.stats
    out = phase_summary(st["acceptance_rate"], st["is_divergent"], result.num_warmup)
    post = st["num_integration_steps"][:, result.num_warmup:]
    out.update(step_size=float(np.mean(np.asarray(result.state.warmup.step_size))),
               num_integration_steps=float(np.mean(post)) if post.size else float("nan"),
               chains=int(st["acceptance_rate"].shape[0]),
               draws=int(jax.tree_util.tree_leaves(result.draws)[0].shape[1]))
    out.update(chain_diagnostics(result.draws, keys))
    return out


# ---------------------------------------------------------------------------
# ArviZ
# ---------------------------------------------------------------------------

def inference_data_dict(result: DriverResult) -> dict:
    """The groups of an ArviZ ``InferenceData`` as plain arrays (what :func:`to_inference_data` hands to ArviZ).

    Returns:
        ``{'posterior': {var: (chains, draws, ...)}, 'sample_stats': {lp, acceptance_rate, diverging, step_size,
        n_steps: (chains, draws)}}``. Position leaves are named by their pytree path (``'w'``, ``'layers.0.W'``;
        ``'position'`` for a bare array), functions by their names; the statistics are those of the kept
        iterations (ArviZ's names; every iteration's are in ``result.stats``).
    """
    posterior = {}
    for name, value in result.draws.items():
        leaves = jax.tree_util.tree_leaves(value)
        names = _leaf_names(value, name) if name == "position" else (
            [name] if len(leaves) == 1 else [f"{name}.{n}" for n in _leaf_names(value, name)])
        for n, leaf in zip(names, leaves):
            if n in posterior:
                raise ValueError(f"inference_data_dict: two draws are named {n!r}")
            posterior[n] = np.asarray(leaf)
    num = jax.tree_util.tree_leaves(result.draws)[0].shape[1]
    idx = result.num_warmup + result.thinning * np.arange(1, num + 1) - 1
    st = result.stats
    sample_stats = dict(lp=st["logdensity"][:, idx], acceptance_rate=st["acceptance_rate"][:, idx],
                        diverging=np.asarray(st["is_divergent"][:, idx], bool), step_size=st["step_size"][:, idx],
                        n_steps=st["num_integration_steps"][:, idx])
    return {"posterior": posterior, "sample_stats": sample_stats}


def to_inference_data(result: DriverResult):
    """Export a run to ArviZ: ``posterior`` (the kept draws) and ``sample_stats`` (see :func:`inference_data_dict`).

    Args:
        result: a :class:`DriverResult`.

    Returns:
        ArviZ's ``InferenceData`` (ArviZ 0.x) or ``DataTree`` (ArviZ >= 1.0), with dimensions ``chain, draw``.

    Raises:
        ImportError: ArviZ is not installed (``pip install arviz``).
    """
    try:
        import arviz as az
    except ImportError as err:
        raise ImportError("to_inference_data needs the 'arviz' package, which is not installed: "
                          "pip install arviz") from err
    groups = inference_data_dict(result)
    if int(str(az.__version__).split(".")[0]) >= 1:
        return az.from_dict(groups)
    return az.from_dict(posterior=groups["posterior"], sample_stats=groups["sample_stats"])
