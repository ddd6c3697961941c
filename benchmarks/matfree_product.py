"""Time one matrix-free kernel product ``(K + s I) V`` of `smnngp.matfree.KernelOperator`.

Usage (from the project root)::

    python benchmarks/matfree_product.py [--n 3000] [--columns 17] [--tile 512] [--repeats 5]

float64, ``d = 8`` standard-normal inputs, V with ``--columns`` columns (a CG step of the matrix-free posterior
solves for the targets and 16 probes at once: 17), tiles of ``--tile`` rows. Kernels: an RBF ``ParametricKernel``
and the NNGP of a 4-layer ReLU MLP (a stax ``kernel_fn``). Prints the best of ``--repeats`` compiled calls and the
largest deviation from the dense product ``K @ V``. Run it at two commits to compare the product itself (the
symmetric tile pass of c060f62 against b0aa58f's row-by-row pass is in RESULTS §1d).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--columns", type=int, default=17)
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from smnngp import kernels, matfree, posterior, stax

    rng = np.random.default_rng(0)
    x, v = rng.normal(size=(args.n, 8)), rng.normal(size=(args.n, args.columns))
    layers = [layer for _ in range(4) for layer in (stax.Dense(64, W_std=1.4, b_std=0.1), stax.Relu())]
    mlp = posterior.as_kernel_callable(stax.serial(*layers, stax.Dense(1))[2])
    for name, kernel in (("RBF", kernels.rbf(2.0, 1.0)), ("ReLU NNGP, 4 layers", mlp)):
        op = matfree.KernelOperator(kernel, x, 0.01, tile_size=args.tile)
        out = np.asarray(op.matmul(v))
        dense = np.asarray(kernel(jnp.asarray(x), None)) @ v + 0.01 * v
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            op.matmul(v).block_until_ready()
            times.append(time.perf_counter() - start)
        print(f"{name:<22} N = {args.n}, {args.columns} columns: {min(times):.4f} s per product, "
              f"max |error| vs dense {np.max(np.abs(out - dense)):.2e}")


if __name__ == "__main__":
    main()
