"""Time the masked-BNN sampler: full width against compacted, and one UCI split end to end.

Usage (from the project root)::

    .venv/bin/python benchmarks/masked.py [--reps 5] [--no-split] [--chains 1] [--quick]

Cases (Boston-sized problem: n = 455 training rows, 13 inputs; physical
widths (1100, 1100); one chain; float32; 20 leapfrog steps, 10 mask moves,
one Gibbs draw per iteration; the step compiled before timing):

* ``full``: one post-burn-in iteration with 1,000 active nodes per layer
  (no compaction possible: the work of the authors' full-width sampler);
* ``full_sparse``: the same iteration at the paper's typical sparsity
  (30 and 15 active nodes, as the paper's Boston (29, 12)) but computed at
  full width (``compact=False``);
* ``compact``: the same sparse state with compaction (power-of-two buckets).

Ratio printed: ``full_sparse / compact`` (target >= 10) and ``full / compact``.
Then the narrow case behind ``sample(compact=None)``'s threshold (``COMPACT_MIN_WIDTH``): a whole width-40
run with the ``mbnn-uci --quick`` schedule (2 chains, 120 burn-in iterations, 5 draws every 4), wall time
with compilation, compacted against full width (``--narrow-only`` runs just this case).
Then, unless ``--no-split``, the wall time of one Boston split end to end
with the paper's schedule (mBNN lambda = 0.1: 400 burn-in iterations, 20 draws
every 200, 4,400 iterations; the first split compiles, the second reuses the
programs as the experiment's later splits do), and the projection to the
section-4 protocol (4 data sets x 20 splits; BNN from the ``full`` iteration
time). Writes ``benchmarks/results/masked.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _iteration_time(sampler, state, buckets, reps):
    import jax

    keys = jax.random.split(jax.random.PRNGKey(1), 1)
    jax.block_until_ready(sampler.step_chains(keys, state, False, buckets, False))  # compile
    best = float("inf")
    for r in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(sampler.step_chains(jax.random.split(jax.random.PRNGKey(10 + r), 1), state, False,
                                                  buckets, False))
        best = min(best, time.perf_counter() - t)
    return best


def _narrow_run_seconds(x, y):
    """Wall seconds, compilation included, of a width-40 run compacted and at full width (same draws)."""
    import jax
    import numpy as np

    from finite.masked import masked_mlp
    from samplers.mbnn import MaskedBNN, mbnn_sampler, sample

    net = masked_mlp(x.shape[1], (44, 44), (40, 40))
    model = MaskedBNN(net, x, y, prior_scale=1.0, lam=0.1, sigma2_prior=(1.0, float(np.std(y))))
    out = {}
    for name, compact in (("narrow_compact", True), ("narrow_full", False)):
        t = time.perf_counter()
        res = sample(mbnn_sampler(model), jax.random.PRNGKey(3), num_chains=2, num_burnin=120, num_samples=5,
                     thinning=4, compact=compact, progress=False)
        jax.block_until_ready(res.draws["sigma2"])
        out[name] = time.perf_counter() - t
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-split", action="store_true", help="skip the end-to-end UCI split")
    ap.add_argument("--quick", action="store_true", help="smoke test: widths (220, 220), no split")
    ap.add_argument("--narrow-only", action="store_true", help="only the width-40 compacted / full-width case")
    ap.add_argument("--chunk", type=int, default=16,
                    help="iterations per compiled program in the end-to-end split (1 = one call per iteration)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from experiments.report import git_commit
    from finite.masked import bucket_sizes, masked_mlp
    from samplers.mbnn import MaskedBNN, mbnn_sampler

    phys, act = (220, 200) if args.quick else (1100, 1000)
    rng = np.random.default_rng(0)
    n, d = 455, 13
    x = rng.uniform(0, 1, (n, d))
    y = 5 * np.sin(x @ rng.normal(size=d)) + rng.normal(size=n)
    if args.narrow_only:
        narrow = _narrow_run_seconds(x, y)
        _print_narrow(narrow)
        out = dict(commit=git_commit(str(ROOT)), machine=platform.machine(), cpus=os.cpu_count(),
                   jax=jax.__version__, n=n, seconds=narrow)
        _write(out, "masked-narrow.json")
        return
    net = masked_mlp(d, (phys, phys), (act, act))
    model = MaskedBNN(net, x, y, prior_scale=1.0, lam=0.1, sigma2_prior=(1.0, float(np.std(y))))
    sampler = mbnn_sampler(model)
    state = jax.vmap(sampler.init)(jax.random.split(jax.random.PRNGKey(0), 1))
    sparse = state._replace(masks=tuple((jnp.arange(phys) < a).astype(jnp.float32)[None] for a in (30, 15)))
    times = {
        "full": _iteration_time(sampler, state, None, max(2, args.reps // 2)),
        "full_sparse": _iteration_time(sampler, sparse, None, max(2, args.reps // 2)),
    }
    buckets = bucket_sizes((30, 15), net.widths, slack=sampler.slack)
    times["compact"] = _iteration_time(sampler, sparse, buckets, args.reps)
    out = dict(commit=git_commit(str(ROOT)), machine=platform.machine(), cpus=os.cpu_count(), jax=jax.__version__,
               widths=[phys, phys], n=n, buckets=list(buckets or []), seconds=times,
               ratio_full_sparse_over_compact=times["full_sparse"] / times["compact"],
               ratio_full_over_compact=times["full"] / times["compact"])
    print(f"iteration, 1000 active, full width : {times['full'] * 1e3:8.1f} ms")
    print(f"iteration, 30/15 active, full width: {times['full_sparse'] * 1e3:8.1f} ms")
    print(f"iteration, 30/15 active, compacted : {times['compact'] * 1e3:8.1f} ms (buckets {buckets})")
    print(f"ratio full-width / compacted at the same sparsity: {out['ratio_full_sparse_over_compact']:.1f}x "
          f"(target >= 10)")
    print(f"ratio dense (1000 active) / compacted sparse     : {out['ratio_full_over_compact']:.1f}x")
    if not args.quick:
        times.update(_narrow_run_seconds(x, y))
        _print_narrow(times)
    if not (args.no_split or args.quick):
        from experiments import mbnn_uci
        from experiments.data import load_uci

        s = dict(width=1000, chains=1, burnin=400, samples=20, thinning=200, leapfrog=20, n_mh=10, n_max=3,
                 prior_scale=1.0, chunk=args.chunk)
        boston = load_uci("boston")
        t = time.perf_counter()
        cell = mbnn_uci.run_split(boston, 0, "mbnn-0.1", s, seed=0, progress=False)
        first_s = time.perf_counter() - t
        t = time.perf_counter()  # the next split reuses the compiled programs, as the experiment's later splits do
        mbnn_uci.run_split(boston, 1, "mbnn-0.1", s, seed=1, progress=False)
        split_s = time.perf_counter() - t
        proj_mbnn = first_s + split_s * 79
        proj_bnn = times["full"] * 4400 * 80
        out.update(chunk=args.chunk, first_split_seconds=first_s, split_seconds=split_s,
                   split_metrics={k: cell[k] for k in ("rmse", "nll", "crps", "coverage")},
                   split_active=cell["active"], projected_mbnn_protocol_hours=proj_mbnn / 3600,
                   projected_bnn_protocol_hours=proj_bnn / 3600)
        print(f"one Boston split, mBNN lambda 0.1, 4,400 iterations, 1 chain, chunk {args.chunk}: {first_s:.0f} s "
              f"with compilation, "
              f"{split_s:.0f} s for the next split (active {cell['active'][0]:.0f}/{cell['active'][1]:.0f}, "
              f"RMSE {cell['rmse']:.2f})")
        print(f"projected section-4 protocol, 80 splits, one chain: mBNN {proj_mbnn / 3600:.1f} h per lambda, "
              f"BNN {proj_bnn / 3600:.1f} h (target: both within 3 h)")
    name = "masked.json" if args.chunk == 16 else f"masked-chunk{args.chunk}.json"
    name = "masked-quick.json" if args.quick else name
    _write(out, name)


def _print_narrow(times):
    print(f"width-40 run with compilation, compacted : {times['narrow_compact']:6.1f} s")
    print(f"width-40 run with compilation, full width: {times['narrow_full']:6.1f} s "
          f"(compacted / full width {times['narrow_compact'] / times['narrow_full']:.1f}x: why sample(compact=None) "
          f"keeps narrow networks at full width)")


def _write(out, name):
    path = ROOT / "benchmarks" / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
