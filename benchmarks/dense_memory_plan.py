"""XLA's memory plan of the dense exact-posterior path, in N x N matrices, on this machine's device.

Usage (from the project root)::

    python benchmarks/dense_memory_plan.py [--n 40000] [--dtype float64] [--block 0] [--tile 0] [--dump DIR]

Compiles (does not run) the dense path's build + factorisation, `smnngp.posterior._dense_factor` (the kernel
written tile by tile into one buffer, its diagonal set, the Cholesky factor in place), for an RBF kernel on
``d = 8`` inputs, once with the block the library picks on this device (`linalg.cholesky_block_size`) and once with
``--block`` (0: about N / 16, the blocked in-place program), and prints, for each, the output and temporary bytes of
XLA's buffer assignment over ``N^2 x itemsize`` and the compile time. The anchor is the one-call factorisation of
the same buffer (``block = N``). ``--tile`` sets the kernel's tile rows (0: the library's, `matfree.dense_tile_size`;
the test's sizes are ``--n 2048 --block 128 --tile 128``). Compiling at large N needs no memory for the matrices
themselves (a GPU's GEMM autotuner does allocate scratch buffers). ``--dump DIR`` writes XLA's buffer assignments and
optimised HLO there (to find which instruction holds a copy: a ``copy`` of an N x N value, or a second N x N
allocation in ``*memory-usage-report.txt``). CPU figures, jaxlib 0.10 and 0.12 alike: 1.18 N^2 for the blocked
program at N = 2,048-8,192 (1.22 at 10,000; the trailing update in a loop of tiles; the unrolled update before
it planned 1.36 on jaxlib 0.10 and 3.02 on 0.12), 2-3 for the one call (3 when the kernel is built in several
tiles); H100 (N = 40,000 float64): 3.0 for both (`docs/scaling.md`, before the loop of tiles).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--block", type=int, default=0, help="the compared block (0: about N / 16)")
    parser.add_argument("--tile", type=int, default=0, help="kernel tile rows (0: the library's)")
    parser.add_argument("--dump", type=Path, default=None, help="directory for XLA's buffer assignments")
    args = parser.parse_args()
    if args.n < 2:
        parser.error(f"--n must be at least 2, got {args.n}")
    if args.tile < 0 or args.block < 0:
        parser.error(f"--tile and --block must be >= 0 (0: the default), got {args.tile}, {args.block}")
    if args.dump is not None:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_dump_to={args.dump} --xla_dump_hlo_as_text").strip()
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", args.dtype == "float64")
    from smnngp import kernels, linalg, matfree, posterior

    n, dtype = args.n, jnp.dtype(args.dtype)
    device = jax.local_devices()[0]
    fn, params = matfree._split_kernel(kernels.rbf(2.0, 1.0))
    x = jax.ShapeDtypeStruct((n, 8), dtype)
    diag = jax.ShapeDtypeStruct((n,), dtype)
    tile = min(args.tile, n) or matfree.dense_tile_size(n)
    blocked = args.block or max(1, -(-n // 16 // 256) * 256 if n >= 4096 else -(-n // 16))
    unit = n * n * dtype.itemsize
    print(f"{device.device_kind} ({device.platform}), N = {n:,}, {dtype.name}, kernel tiles of {tile} rows; "
          f"one matrix = {unit / 2**30:.2f} GiB", flush=True)
    for label, block in (("library's choice", linalg.cholesky_block_size(n)), ("one call", n),
                         ("blocked", blocked)):
        start = time.perf_counter()
        with jax.default_matmul_precision("highest"):
            compiled = posterior._dense_factor.__wrapped__.lower(fn, tile, block, dtype, params, x, diag).compile()
        plan = compiled.memory_analysis()
        out, temp = plan.output_size_in_bytes / unit, plan.temp_size_in_bytes / unit
        print(f"  {label:<17} block {block:>7}: output {out:.2f} + temporaries {temp:.2f} = {out + temp:.2f} N^2 "
              f"(compiled in {time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
