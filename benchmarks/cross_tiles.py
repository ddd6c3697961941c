"""Myrtle-5's ``kernel_fn(x1, x2)`` tiled pair by pair at several tile sizes, against the untiled call (issue 50).

    python benchmarks/cross_tiles.py [--images 10] [--size 32] [--sides 0 1 2 5]

An (x1, x2) kernel of at least 2^20 entries is computed tile pair by tile pair (`smnngp.stax._core._cross_kernel_map`,
tiles of ``_CROSS_TILE_ENTRIES`` entries). Each side ``s`` (images per tile; 0 = untiled, the reference) is timed on
``x1`` and ``x2`` of ``--images`` CIFAR-shaped images each (NumPy inputs, float64), NNGP alone and with the NTK,
steady call (the best of two after the first), and checked first against the untiled kernel of the same run (1e-12
relative to its scale); a wrong answer prints no time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import check, check_text, scale_relative_error, write_results  # noqa: E402

TOL = 1e-12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--sides", type=int, nargs="+", default=[0, 1, 2, 5])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    from smnngp.models import myrtle
    from smnngp.stax import _core

    per_pair = (args.size * args.size) ** 2  # position pairs of one image pair (the kernel keeps all of them)
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((args.images, args.size, args.size, 3)) for _ in range(2))
    rows, reference = [], {}
    for side in [0] + [s for s in args.sides if s != 0]:
        if side == 0:
            _core._CROSS_TILES = False
        else:
            _core._CROSS_TILES = True
            _core._CROSS_TILE_ENTRIES = side * side * per_pair
        _, _, kernel_fn = myrtle(5)   # a fresh function: nothing compiled at another setting is reused
        fn = jax.jit(kernel_fn, static_argnames="get")
        for get in ("nngp", ("nngp", "ntk")):
            out = jax.block_until_ready(fn(x1, x2, get=get))
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(x1, x2, get=get))
                times.append(time.perf_counter() - t0)
            values = [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]
            name = "nngp" if get == "nngp" else "nngp+ntk"
            if side == 0:
                reference[name] = values
            errors = {f"k{i}": scale_relative_error(v, r) for i, (v, r) in enumerate(zip(values, reference[name]))}
            verdict = check(errors, {k: TOL for k in errors}, "the untiled kernel of this run")
            label = "untiled" if side == 0 else f"{side} images per tile"
            shown = f"{min(times):7.2f} s" if verdict["ok"] else "  (no time)"
            print(f"{label:<20} {name:<9} {shown}  {check_text(verdict)}", flush=True)
            rows.append({"side": side, "get": name, "steady_s": min(times), "check": verdict})
    if args.out:
        write_results(args.out, {"images": args.images, "size": args.size, "rows": rows})


if __name__ == "__main__":
    main()
