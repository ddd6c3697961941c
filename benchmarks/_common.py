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


def time_first_and_steady(fn, *args, repeats: int):
    """``(output, first, steady)``: the first call of ``fn(*args)`` (trace + compile + run for a jitted ``fn``) and
    ``repeats`` further calls, each timed in seconds up to ``jax.block_until_ready``."""
    import time

    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    steady = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        steady.append(time.perf_counter() - start)
    return out, first, steady


def write_results(path: Path, payload: dict) -> Path:
    """Write ``{"quick": ..., machine(), **payload}`` as JSON to ``path`` (folders made) and say where."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**machine(), **payload}, indent=1))
    print(f"\nwrote {path.resolve().relative_to(ROOT)}")
    return path
