"""What the benchmark scripts share: the machine description stored with every result and the results writer."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """The platform, Python, JAX and CPU count a timing was taken on (ratios are only comparable on one)."""
    import jax

    return {"machine": platform.platform(), "python": platform.python_version(), "jax": jax.__version__,
            "cpu_count": os.cpu_count()}


def worker_setup(library: str):
    """Start a timing worker: float64 on, no persistent compilation cache (a first call must compile), and the
    library's modules ``(stax, empirical)``: smnngp's (``library="ours"``, from this checkout) or neural-tangents'
    (``"nt"``, in its pinned oracle environment; ``empirical`` is then the top-level ``neural_tangents``)."""
    import sys
    import warnings

    import jax

    jax.config.update("jax_enable_x64", True)
    try:
        jax.config.update("jax_enable_compilation_cache", False)
    except (AttributeError, KeyError, ValueError):
        pass
    if library == "ours":
        sys.path.insert(0, str(ROOT))
        from smnngp import empirical, stax

        return stax, empirical
    warnings.filterwarnings("ignore")
    import neural_tangents
    from neural_tangents import stax

    return stax, neural_tangents


def time_first_and_steady(fn, *args, repeats: int):
    """``(output, first, steady)``: the first call of ``fn(*args)`` (trace + compile + run for a jitted ``fn``) and
    ``repeats`` further calls, each timed in seconds up to ``jax.block_until_ready``.

    As `timeit` does, Python's garbage collector is off while the calls are timed (after one full collection before
    the first): a full collection walks every live object of the process (JAX's included) and took about 0.06 s
    here when one happened to fall inside a trace, a pause that depends on the heap, not on the library being timed.
    """
    import gc
    import time

    import jax

    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        first = time.perf_counter() - start
        steady = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            steady.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return out, first, steady


def write_results(path: Path, payload: dict) -> Path:
    """Write ``{"quick": ..., machine(), **payload}`` as JSON to ``path`` (folders made) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**machine(), **payload}, indent=1))
    where = path.resolve()
    print(f"\nwrote {where.relative_to(ROOT) if where.is_relative_to(ROOT) else where}")
    return path


# ---------------------------------------------------------------------------
# Checking before timing (issue 49): every row's answer against the exact reference of the same run
# ---------------------------------------------------------------------------


def pointwise_relative_error(fast, exact) -> float:
    """``max_i |fast_i - exact_i| / |exact_i|``: the error of a positive quantity (variances, kernel diagonals)."""
    import numpy as np

    fast, exact = np.asarray(fast, float), np.asarray(exact, float)
    return float(np.max(np.abs(fast - exact) / np.maximum(np.abs(exact), 1e-300)))


def scale_relative_error(fast, exact) -> float:
    """``max |fast - exact| / max |exact|``: the error of a quantity that crosses zero (means, kernels, gradients),
    relative to its scale; for a scalar, its relative error. Non-finite entries of ``fast`` give ``inf``."""
    import numpy as np

    fast, exact = np.asarray(fast, float), np.asarray(exact, float)
    if fast.shape != exact.shape or not np.all(np.isfinite(fast)):
        return float("inf")
    return float(np.max(np.abs(fast - exact), initial=0.0) / max(float(np.max(np.abs(exact), initial=0.0)), 1e-300))


def tree_scale_relative_error(fast, exact) -> float:
    """The largest `scale_relative_error` over the leaves of two pytrees of the same structure."""
    import jax

    a, b = jax.tree_util.tree_leaves(fast), jax.tree_util.tree_leaves(exact)
    if len(a) != len(b):
        return float("inf")
    return max((scale_relative_error(x, y) for x, y in zip(a, b)), default=0.0)


def check(errors: dict, tolerances: dict, reference: str) -> dict:
    """A row's verdict: ``{"reference", "errors", "tolerances", "ok"}``, ``ok`` when every error is within its
    stated tolerance (a NaN error is not). ``reference`` says what the errors are measured against."""
    errors = {k: float(v) for k, v in errors.items()}
    ok = all(errors[k] <= tolerances[k] for k in errors)  # NaN <= tol is False
    return {"reference": reference, "errors": errors, "tolerances": {k: tolerances[k] for k in errors}, "ok": ok}


def wrong_text(*checks) -> str:
    """``WRONG (err name 1.2e-03 > tol 1e-06, ...)`` for the failed outputs of the given checks (None skipped)."""
    bad = [f"{k} {v:.1e} > tol {c['tolerances'][k]:.0e}" for c in checks if c and not c["ok"]
           for k, v in c["errors"].items() if not v <= c["tolerances"][k]]
    return "WRONG (err " + ", ".join(bad) + ")"


def ratio_text(ratio, *checks, fmt: str = "{:.2f}x") -> str:
    """The ratio formatted, or `wrong_text` when any of the rows it compares has a wrong answer: the timing of a
    wrong answer is no comparison."""
    if any(c is not None and not c["ok"] for c in checks):
        return wrong_text(*checks)
    return fmt.format(ratio)


def check_text(c) -> str:
    """``err name 1.2e-16 (tol 1e-10), ...`` of one check, ``ok`` or ``WRONG``."""
    return ", ".join(f"{k} {v:.1e} (tol {c['tolerances'][k]:.0e})" for k, v in c["errors"].items()) + \
        ("  ok" if c["ok"] else "  WRONG")
