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
