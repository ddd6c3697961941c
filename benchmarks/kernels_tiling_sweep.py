"""Sweep the symmetric-tiling constants of `smnngp.stax._core` on the cases of `benchmarks/kernels.py` (ours only).

Usage (from the project root)::

    .venv/bin/python benchmarks/kernels_tiling_sweep.py [--settings 1048576:65536,65536:16384] \
        [--cases mlp4_relu,resnet] [--rounds 2]

A setting ``MIN:TILE`` sets ``_SYMMETRIC_MIN_ENTRIES`` (the smallest input kernel, in entries, that a symmetric
``x2=None`` call computes tile pair by tile pair) and ``_TILE_ENTRIES`` (the entries of one tile pair). Every
(case, setting) runs in a fresh process through `kernels.worker` (same inputs, threads and warm-up as the main
benchmark); each printed time is the best over ``--rounds`` (first call: trace + compile + run; steady: best of 5
later calls). The library's constants are the first default setting.

Check before timing (issue 49): each case also runs once untiled (``MIN`` above every input: the plain ``x2=None``
program, the exact reference of the same run), and every (case, setting)'s kernels from each round are compared
with it (`kernels_compile.kernel_check`: ``max |tiled - untiled| / max |untiled|`` over all entries and off the
diagonal, NNGP and NTK, against `kernels_compile.TOL`). A setting with a wrong answer prints ``WRONG (err ...)``
instead of its times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kernels  # noqa: E402
from _common import wrong_text  # noqa: E402
from kernels_compile import kernel_check  # noqa: E402

DEFAULT_SETTINGS = "1048576:65536,65536:16384,65536:32768,65536:65536,262144:32768"
UNTILED = 2**62  # a MIN no input kernel reaches: the reference runs untiled


def _worker(min_entries: int, tile_entries: int, case: str, inputs: str, out: str) -> None:
    sys.path.insert(0, str(HERE.parent))
    import smnngp.stax._core as core

    core._SYMMETRIC_MIN_ENTRIES, core._TILE_ENTRIES = min_entries, tile_entries
    kernels.worker("ours", case, inputs, out, 5)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help="comma-separated MIN:TILE pairs (entries)")
    parser.add_argument("--cases", default="mlp4_relu,mlp3_erf,resnet,ln_dropout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mn, tl, case, inputs, out = args.worker
        _worker(int(mn), int(tl), case, inputs, out)
        return
    try:
        settings = [tuple(int(v) for v in s.split(":")) for s in args.settings.split(",")]
    except ValueError:
        parser.error(f"--settings: expected MIN:TILE pairs of integers, got {args.settings!r}")
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in kernels.CASES]
    if unknown or args.rounds < 1:
        parser.error(f"unknown cases {unknown} (choose from {','.join(kernels.CASES)}) or --rounds < 1")
    best, checks = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = os.path.join(tmp, "inputs.npz")
        np.savez(inputs, **kernels.make_inputs(cases))

        def run(mn, tl, case):
            out = os.path.join(tmp, "out")
            subprocess.run([sys.executable, __file__, "--worker", str(mn), str(tl), case, inputs, out],
                           check=True, env=kernels.worker_env(), capture_output=True)
            with np.load(out + ".npz") as k:
                return json.loads(Path(out + ".json").read_text()), (k["nngp"], k["ntk"])

        reference = {case: run(UNTILED, settings[0][1], case)[1] for case in cases}
        for r in range(args.rounds):
            for case in cases:
                for mn, tl in settings:
                    info, out = run(mn, tl, case)
                    c = kernel_check(out, reference[case])
                    old = checks.get((case, mn, tl))  # the worst round's check is the row's
                    if old is None or (old["ok"] and not c["ok"]) or \
                            (old["ok"] == c["ok"] and max(c["errors"].values()) > max(old["errors"].values())):
                        checks[(case, mn, tl)] = c
                    first, steady = best.get((case, mn, tl), (np.inf, np.inf))
                    best[(case, mn, tl)] = (min(first, info["first"]), min(steady, min(info["steady"])))
                    print(f"round {r + 1}: {case} {mn}:{tl} done", flush=True)
    print(f"\n{'case':12s} {'min entries':>12s} {'tile entries':>12s} {'first (s)':>10s} {'steady (s)':>11s} "
          f"{'err':>9s} {'err off':>9s}")
    for (case, mn, tl), (first, steady) in sorted(best.items()):
        mn_s, tl_s = f"2^{mn.bit_length() - 1}", f"2^{tl.bit_length() - 1}"
        c = checks[(case, mn, tl)]
        if not c["ok"]:
            print(f"{case:12s} {mn_s:>12s} {tl_s:>12s} {wrong_text(c)}")
            continue
        e = c["errors"]
        print(f"{case:12s} {mn_s:>12s} {tl_s:>12s} {first:10.3f} {steady:11.4f} "
              f"{max(e['nngp'], e['ntk']):9.1e} {max(e['nngp_off_diagonal'], e['ntk_off_diagonal']):9.1e}")
    print("err (off): max |kernel - untiled| / max |untiled| over the NNGP and NTK (off the diagonal), the worst "
          "round's")


if __name__ == "__main__":
    main()
