"""The kernel of a whole image set: Myrtle NNGP / NTK, kernel regression on it, and what it costs.

Protocol (issue 50; the Myrtle kernels of Shankar et al., "Neural Kernels Without Tangents", ICML 2020):

* Kernels: `smnngp.models.myrtle` of depth 5, 7 or 10 (``--depths``), NNGP and NTK (``--kernels``), computed tile
  by tile by `smnngp.kernels.batched_kernel_fn` straight into ``.npy`` files under ``OUT/kernels`` (resumable:
  an interrupted run computes only the tiles it had not finished; a store of another network or other inputs is
  refused). ``K(train, train)`` needs only its upper-triangle tiles; ``K(test, train)`` all of them. The tile size
  is ``--batch-size``, or by default the largest power of two whose compiled tile fits in ``--tile-memory-gb``.
* Data: CIFAR-10 cannot be downloaded on the machines this project runs on, so the accuracy is measured on
  scikit-learn's digits (1,347 training and 450 test images of 8 x 8), zero-padded (centred) to ``--image-size``
  (32 by default: 32 x 32 x 1, which the Myrtle networks pool down to one position; at size S the network ends
  with log2(S) - 2 poolings, so that one position is left). These are digits, not CIFAR-10, and are reported as
  such. The timing rows use CIFAR-shaped inputs (32 x 32 x 3, standard normal pixels): pairs per second do not
  depend on the pixel values.
* Regression: one-hot targets minus 0.1 (zero mean over the classes), the converged predictor of
  `smnngp.predict.gradient_descent_mse` (``t = None``: kernel ridge regression) with ``diag_reg`` (relative to the
  mean diagonal) chosen from ``--regs`` by accuracy on a validation tenth of the training images
  (class-stratified; its kernel blocks are sub-blocks of ``K(train, train)``, so choosing costs no kernel
  evaluation; ties go to the larger value); the test images are used once, at the end. Accuracy is the argmax of
  the predicted mean.
* Cost: pairs per second from the store's manifest (`smnngp.kernels.tile_store_info`: every pair counted once,
  ``N (N + 1) / 2`` for ``K(train, train)`` and ``N_test N`` for ``K(test, train)``, over the compute seconds of
  every session that computed tiles, so a resumed kernel's rate is that of all its tiles, not of this run's
  remainder), with this run's wall time beside it, on the device named in ``results.json``. The timing rows time
  ``K(x, x)`` of ``--timing-images`` CIFAR-shaped images and project the full CIFAR-10 kernel (60,000 images,
  1.8e9 pairs) at its steady rate (the groups of tiles that compiled nothing; the rate with compilation beside
  it).
* ``--float32`` computes the tiles from float32 inputs (the engine computes in its inputs' dtype) and stores them
  in float64 files; regression is in float64 either way.

``--quick``: the Myrtle-5 NNGP of 200 training and 100 test digits at their own 8 x 8 (no padding; the network ends
with one pooling), and a timing row of 8 CIFAR-shaped 32 x 32 x 3 images: about a minute on a CPU.
``--timing-only`` runs the timing rows alone (a long resumable ``K(x, x)``: rerun the same command after a kill).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from experiments import progress
from experiments.report import Report, cell, markdown_table

DESCRIPTION = "Myrtle-5/7/10 NNGP/NTK of a whole image set, tile by tile and resumable; kernel regression on it"

REGS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
CIFAR10_IMAGES = 60_000


def add_arguments(parser):
    parser.add_argument("--depths", type=int, nargs="+", default=None, help="Myrtle depths (default 5 7 10; quick 5)")
    parser.add_argument("--kernels", nargs="+", default=None, choices=("nngp", "ntk"),
                        help="kernels (default both; quick nngp)")
    parser.add_argument("--n-train", type=int, default=None, help="training images (default all 1,347; quick 200)")
    parser.add_argument("--n-test", type=int, default=None, help="test images (default all 450; quick 100)")
    parser.add_argument("--image-size", type=int, default=None, choices=(8, 16, 32),
                        help="digits zero-padded to this size (default 32; quick 8, the digits' own)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="images per tile (default: the largest power of two that fits --tile-memory-gb)")
    parser.add_argument("--tile-memory-gb", type=float, default=2.0,
                        help="memory per tile when --batch-size is not given (default 2)")
    parser.add_argument("--regs", type=float, nargs="+", default=list(REGS),
                        help="diag_reg values tried on the validation tenth (relative to the mean diagonal)")
    parser.add_argument("--float32", action="store_true",
                        help="compute the tiles in float32 (stored in float64); default float64")
    parser.add_argument("--timing-images", type=int, default=None,
                        help="CIFAR-shaped images of the timing rows (default 80; quick 8; 0 skips them)")
    parser.add_argument("--timing-only", action="store_true",
                        help="only the timing rows (no digits, no regression): e.g. a long resumable K(x, x)")


def _settings(args) -> dict:
    quick = args.quick
    return {
        "depths": args.depths or ([5] if quick else [5, 7, 10]),
        "kernels": args.kernels or (["nngp"] if quick else ["nngp", "ntk"]),
        "n_train": args.n_train or (200 if quick else None),
        "n_test": args.n_test or (100 if quick else None),
        "image_size": args.image_size or (8 if quick else 32),
        "batch_size": args.batch_size,
        "tile_memory_gb": args.tile_memory_gb,
        "regs": list(args.regs),
        "dtype": "float32" if args.float32 else "float64",
        "timing_images": (8 if quick else 80) if args.timing_images is None else args.timing_images,
        "timing_kernels": ["nngp"] if quick else args.kernels or ["nngp", "ntk"],
        "timing_only": args.timing_only,
    }


def _digits(n_train, n_test, size, seed):
    """Digits zero-padded (centred) to ``size`` x ``size`` x 1, the first ``n_train`` / ``n_test`` of a seeded
    stratified subset (all of them when None)."""
    from experiments.data.images import load_images, stratified_split

    data = load_images("digits", np.float64)

    def pad(x):
        lo = (size - x.shape[1]) // 2
        out = np.zeros((x.shape[0], size, size, x.shape[3]), np.float64)
        out[:, lo : lo + x.shape[1], lo : lo + x.shape[2], :] = x
        return out

    def subset(x, y, n, salt):
        if n is None or n >= len(y):
            return x, y
        keep, _ = stratified_split(y, len(y) - n, seed + salt)
        return x[keep], y[keep]

    xtr, ytr = subset(data.x_train, data.y_train, n_train, 0)
    xte, yte = subset(data.x_test, data.y_test, n_test, 1)
    return pad(xtr), ytr, pad(xte), yte, data.num_classes


def _network(depth, size):
    """Myrtle-``depth`` with as many poolings at the end as leave one position of a ``size`` x ``size`` image."""
    from smnngp import models

    return models.myrtle(depth, pools_at_end=int(math.log2(size)) - 2)[2]


def _kernel(kernel_fn, x1, x2, name, path, s):
    """``(array, info)``: ``name`` of ``kernel_fn`` on the images, tile by tile into ``path`` (resumed there), and the
    store's `tile_store_info` with this run's wall seconds (``run_seconds``)."""
    from smnngp import kernels

    fn = kernels.batched_kernel_fn(kernel_fn, s["batch_size"], path=path, out_dtype=np.float64,
                                   max_memory_bytes=int(s["tile_memory_gb"] * 2**30),
                                   progress=not progress.is_quiet())
    cast = (lambda a: a.astype(np.float32)) if s["dtype"] == "float32" else (lambda a: a)
    start = time.perf_counter()
    k = np.asarray(fn(cast(x1), None if x2 is None else cast(x2), name))
    info = kernels.tile_store_info(path)
    return k, {"run_seconds": time.perf_counter() - start, "compute_seconds": info["compute_seconds"],
               "pairs": info["pairs_total"], "pairs_per_s": info["pairs_per_second"],
               "steady_pairs_per_s": info["steady_pairs_per_second"],
               "batch_size": info["fingerprint"]["batch_size"], "sessions": len(info["sessions"])}


def _regress(k_tt, k_st, y_fit, classes, reg):
    """Predicted means at the ``k_st`` rows: converged gradient flow (kernel ridge regression) on one-hot - 0.1."""
    from smnngp import predict

    targets = np.eye(classes)[y_fit] - 0.1
    fn = predict.gradient_descent_mse(k_tt, targets, diag_reg=reg)
    return np.asarray(fn(None, 0.0, 0.0, k_st)[1])


def _timing(s, seed, out) -> list[dict]:
    """``K(x, x)`` of CIFAR-shaped images per network and kernel, with the projection to the CIFAR-10 kernel at the
    steady rate (the groups of tiles that compiled nothing)."""
    import jax

    n = s["timing_images"]
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (n, 32, 32, 3)), np.float64)
    rows = []
    for depth in s["depths"]:
        kernel_fn = _network(depth, 32)
        for name in s["timing_kernels"]:
            path = os.path.join(out, "kernels", f"timing-myrtle{depth}-{name}-{s['dtype']}-{n}-seed{seed}")
            progress.note(f"dataset-kernel: timing Myrtle-{depth} {name}: K(x, x) of {n} CIFAR-shaped images")
            _, info = _kernel(kernel_fn, x, None, name, path, s)
            rate = info["steady_pairs_per_s"] or info["pairs_per_s"]
            rows.append({"depth": depth, "kernel": name, "images": n, **info,
                         "cifar10_full_days": CIFAR10_IMAGES * (CIFAR10_IMAGES + 1) / 2 / rate / 86_400})
    return rows


def run(args) -> Report:
    import jax

    jax.config.update("jax_enable_x64", True)
    from experiments.data.images import stratified_split

    s = _settings(args)
    out = args.out
    if s["timing_only"]:
        if not s["timing_images"]:
            raise ValueError("dataset-kernel: --timing-only needs --timing-images above 0")
        timing = _timing(s, args.seed, out)
        return Report(results={"settings": s, "timing": timing}, markdown=_timing_markdown(s, timing))
    size = s["image_size"]
    xtr, ytr, xte, yte, classes = _digits(s["n_train"], s["n_test"], size, args.seed)
    fit, val = stratified_split(ytr, max(classes, len(ytr) // 10), args.seed + 2)
    rows, results = [], {"settings": s, "n_train": len(ytr), "n_test": len(yte), "cells": {}}
    for depth in s["depths"]:
        kernel_fn = _network(depth, size)
        for name in s["kernels"]:
            tag = f"myrtle{depth}-{name}-{size}px-{s['dtype']}-n{len(ytr)}-{len(yte)}-seed{args.seed}"
            progress.note(f"dataset-kernel: {tag}: K(train, train) of {len(ytr)} images")
            k_tt, i_tt = _kernel(kernel_fn, xtr, None, name, os.path.join(out, "kernels", f"{tag}-train"), s)
            progress.note(f"dataset-kernel: {tag}: K(test, train) of {len(yte)} x {len(ytr)}")
            k_st, i_st = _kernel(kernel_fn, xte, xtr, name, os.path.join(out, "kernels", f"{tag}-test"), s)

            def compute(k_tt=k_tt, k_st=k_st):
                val_acc = {}
                for reg in s["regs"]:
                    mean = _regress(k_tt[np.ix_(fit, fit)], k_tt[np.ix_(val, fit)], ytr[fit], classes, reg)
                    val_acc[reg] = float(np.mean(np.argmax(mean, 1) == ytr[val]))
                best = max(s["regs"], key=lambda r: (val_acc[r], r))  # ties: the larger (smoother) regulariser
                mean = _regress(k_tt, k_st, ytr, classes, best)
                return {"val_accuracy": {str(k): v for k, v in val_acc.items()}, "diag_reg": best,
                        "test_accuracy": float(np.mean(np.argmax(mean, 1) == yte))}

            c = cell(os.path.join(out, "cells", f"{tag}.json"), {"tag": tag, "regs": s["regs"]}, compute)
            c.update(train_kernel=i_tt, test_kernel=i_st)
            results["cells"][tag] = c
            rows.append([f"Myrtle-{depth}", name, s["dtype"], f"{100 * c['test_accuracy']:.1f}",
                         f"{c['diag_reg']:g}", f"{i_tt['compute_seconds']:.1f}", f"{i_tt['pairs_per_s']:.1f}",
                         f"{i_st['compute_seconds']:.1f}", f"{i_st['pairs_per_s']:.1f}",
                         f"{i_tt['run_seconds'] + i_st['run_seconds']:.1f}"])
    padded = f"zero-padded to {size} x {size} x 1" if size > 8 else "at their own 8 x 8 x 1 (not padded)"
    md = [f"scikit-learn's digits {padded}, not CIFAR-10 (it cannot be downloaded here): {len(ytr)} training, "
          f"{len(yte)} test images; kernel regression on one-hot targets, diag_reg chosen on a validation tenth of "
          "the training images. Compute seconds and pairs/s are the kernel stores' (every session that computed "
          "tiles, compilation included); the last column is this run's wall time (a kernel resumed or read back "
          "from disk takes less).\n",
          markdown_table(["network", "kernel", "tile dtype", "test accuracy %", "diag_reg", "K(train, train) s",
                          "pairs/s", "K(test, train) s", "pairs/s", "this run s"], rows)]
    if s["timing_images"]:
        timing = _timing(s, args.seed, out)
        results["timing"] = timing
        md += ["", _timing_markdown(s, timing)]
    return Report(results=results, markdown="\n".join(md))


def _timing_markdown(s, timing) -> str:
    """The timing rows as a paragraph and a table."""
    pairs = CIFAR10_IMAGES * (CIFAR10_IMAGES + 1) / 2
    head = (f"CIFAR-shaped inputs (32 x 32 x 3, standard normal pixels), K(x, x) of {s['timing_images']} images, "
            f"and the projection to the full CIFAR-10 kernel ({CIFAR10_IMAGES:,} images, {pairs:.2g} pairs) at the "
            "steady rate (compilation left out) on this device:\n")
    rows = [[f"Myrtle-{t['depth']}", t["kernel"], s["dtype"], t["batch_size"], f"{t['compute_seconds']:.1f}",
             f"{t['pairs_per_s']:.3g}", f"{(t['steady_pairs_per_s'] or t['pairs_per_s']):.3g}",
             f"{t['cifar10_full_days']:.3g}"] for t in timing]
    return head + "\n" + markdown_table(["network", "kernel", "tile dtype", "images per tile", "seconds", "pairs/s",
                                         "steady pairs/s", "CIFAR-10 kernel (days)"], rows)
