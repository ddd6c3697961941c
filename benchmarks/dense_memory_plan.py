"""XLA's memory plan of the dense exact-posterior path, in N x N matrices, on this machine's device.

Usage (from the project root)::

    python benchmarks/dense_memory_plan.py [--n 40000] [--dtype float64] [--block 0] [--dump DIR]

Compiles (does not run) the dense path's build + factorisation, `smnngp.posterior._dense_factor` (the kernel
written tile by tile into one buffer, its diagonal set, the Cholesky factor in place), for an RBF kernel on
``d = 8`` inputs, once with the block the library picks on this device (`linalg.cholesky_block_size`) and once with
``--block`` (0: about N / 16, the blocked in-place program), and prints, for each, the output and temporary bytes of
XLA's buffer assignment over ``N^2 x itemsize`` and the compile time. The anchor is the one-call factorisation of
the same buffer (``block = N``). Compiling at large N needs no memory for the matrices themselves (a GPU's GEMM
autotuner does allocate scratch buffers). ``--dump DIR`` writes XLA's buffer assignments there (to find which
instruction holds a copy). CPU figures: 1.6-1.7 N^2 for the blocked program, 2-3 for the one call (3 when the
kernel is built in several tiles);
H100 (N = 40,000 float64): 3.0 for both (`docs/scaling.md`).
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
    parser.add_argument("--dump", type=Path, default=None, help="directory for XLA's buffer assignments")
    args = parser.parse_args()
    if args.n < 2:
        parser.error(f"--n must be at least 2, got {args.n}")
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
    tile = matfree.dense_tile_size(n)
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
