"""Empirical-kernel fixtures from neural-tangents 0.6.5 (run in the oracle environment by make_golden.sh).

Writes tests/golden/empirical/<network>_<setting>.npz with the inputs, nt's NNGP and its NTK by each of
implementations 1, 2, 3; linearize / taylor_expand values; and a Monte-Carlo kernel with a fixed key.
"""

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import neural_tangents as nt  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import empirical_cases as C  # noqa: E402

OUT = os.path.join(HERE, "empirical")


def main():
    os.makedirs(OUT, exist_ok=True)
    for net, (f, params, s1, s2) in C.networks().items():
        params = jax.tree_util.tree_map(jnp.asarray, params)
        for suffix, ta, da, va, with_x2 in C.SETTINGS:
            name = f"{net}_{suffix}"
            x1, x2 = C.inputs(name, s1, s2)
            x2 = x2 if with_x2 else None
            out = {"x1": x1}
            if x2 is not None:
                out["x2"] = x2
            out["nngp"] = np.asarray(nt.empirical_nngp_fn(f, ta, da)(x1, x2, params))
            for impl in (1, 2, 3):
                out[f"ntk_{impl}"] = np.asarray(nt.empirical_ntk_fn(f, ta, da, va, impl)(x1, x2, params))
            np.savez(os.path.join(OUT, f"{name}.npz"), **out)
        # Taylor expansions around params, evaluated at perturbed params.
        x1, _ = C.inputs(f"{net}_taylor", s1, s2)
        p2 = jax.tree_util.tree_map(lambda a: a + 0.1 * jnp.cos(jnp.arange(a.size).reshape(a.shape)), params)
        out = {"x1": x1, "lin": np.asarray(nt.linearize(f, params)(p2, x1))}
        for d in (0, 2, 3):
            out[f"taylor_{d}"] = np.asarray(nt.taylor_expand(f, params, d)(p2, x1))
        np.savez(os.path.join(OUT, f"{net}_taylor.npz"), **out)
    x1, x2 = C.inputs("mc", (4, 3), (3, 3))
    out = {"x1": x1, "x2": x2}
    for impl in (1, 2):
        kfn = nt.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(7), 5, implementation=impl)
        k = kfn(x1, x2, ("nngp", "ntk"))
        out[f"nngp_{impl}"], out[f"ntk_{impl}"] = np.asarray(k.nngp), np.asarray(k.ntk)
    gen = nt.monte_carlo_kernel_fn(C.mc_init_fn, C.mc_apply_fn, jax.random.PRNGKey(7), [1, 3], vmap_axes=0)
    for n, k in zip([1, 3], gen(x1, None, "ntk")):
        out[f"gen_ntk_{n}"] = np.asarray(k)
    np.savez(os.path.join(OUT, "mc.npz"), **out)
    print(f"wrote {len(os.listdir(OUT))} fixtures to {OUT}")


if __name__ == "__main__":
    main()
