"""Record the masked sampler's fixed-seed regression (``tests/regression/mbnn_sample_regression.npz``).

The golden comes from the sampler as it stood before it was rebuilt on ``samplers.driver`` (commit 3f4bd5a), so the
test checks that the rebuild changed no draw. Draws of a chain depend on XLA's floating-point rounding, and a NUTS
tree or an MH decision can flip when a JAX release changes the last bits; after a JAX upgrade, regenerate from the
old commit under the new JAX:

    git worktree add /tmp/mbnn-3f4bd5a 3f4bd5a
    python tests/regression/make_mbnn_sample_regression.py --source /tmp/mbnn-3f4bd5a

``--source`` is the checkout whose ``samplers.mbnn`` runs (default: this one, which must give the same file).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def runs(sample, mbnn_sampler, MaskedBNN, masked_mlp):
    """The two recorded runs, keyed "a" and "c": their draws, traces and final states as flat numpy arrays."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = rng.uniform(-4, 4, (10, 1))
    y = x[:, 0] ** 3 / 10 + rng.normal(size=10)
    model = MaskedBNN(masked_mlp(1, (12, 12), (8, 8)), x, y, prior_scale=0.5, lam=0.3, sigma2_prior=(1.0, 1.0))
    xt = jnp.linspace(-4, 4, 3)[:, None]
    fns = {"f": lambda p, m, s2, b: model.net.apply(p, m, xt, b)[:, 0]}
    results = {
        "a": sample(mbnn_sampler(model, num_integration_steps=3, step_size=1e-2, n_mh=3), jax.random.PRNGKey(5),
                    num_chains=2, num_burnin=24, num_samples=3, thinning=3, chunk=5, pool_step="min", functions=fns,
                    progress=False),
        "c": sample(mbnn_sampler(model, theta_kernel="nuts", step_size=1e-2, n_mh=2), jax.random.PRNGKey(2),
                    num_chains=2, num_burnin=6, num_samples=2, thinning=2, chunk=1, compact=False, progress=False,
                    restart_adaptation=False),
    }
    out = {}
    for name, res in results.items():
        out.update({f"{name}/draws/{k}": np.asarray(v) for k, v in res.draws.items()})
        out.update({f"{name}/traces/{k}": np.asarray(v) for k, v in res.traces.items()})
        out.update({f"{name}/state/{i}": np.asarray(v)
                    for i, v in enumerate(jax.tree_util.tree_leaves(res.state))})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=os.path.dirname(os.path.dirname(HERE)),
                        help="checkout whose samplers.mbnn produces the golden (default: this repository)")
    parser.add_argument("--out", default=os.path.join(HERE, "mbnn_sample_regression.npz"))
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.source, "samplers")):
        parser.error(f"--source {args.source!r} has no samplers/ package")
    sys.path.insert(0, os.path.abspath(args.source))
    import jax

    jax.config.update("jax_enable_x64", True)
    from finite.masked import masked_mlp
    from samplers.mbnn import MaskedBNN, mbnn_sampler, sample

    got = runs(sample, mbnn_sampler, MaskedBNN, masked_mlp)
    got = {k: v for k, v in got.items() if not k.endswith(("/traces/merges", "/traces/splits"))}
    got["jax_version"] = np.asarray(jax.__version__)  # the rounding the draws were recorded under
    np.savez(args.out, **got)
    print(f"wrote {len(got)} arrays to {args.out} (jax {jax.__version__}, source {args.source})")


if __name__ == "__main__":
    main()
