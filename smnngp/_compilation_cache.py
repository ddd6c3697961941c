"""XLA's persistent compilation cache: the one place that switches it on (experiments' long runs, the test suite)."""

from __future__ import annotations

import os

__all__ = ["enable_compilation_cache"]


def enable_compilation_cache(where: str, min_compile_time_secs: float = 1.0) -> str:
    """Keep the programs JAX compiles from now on in the directory ``where`` (created if missing).

    Programs that took at least ``min_compile_time_secs`` to compile are written (``0`` keeps every one); a later
    process with the same program, JAX version, backend and XLA flags loads it instead of compiling it again.

    Args:
        where: the cache directory.
        min_compile_time_secs: the least compile time worth a file, non-negative.

    Returns:
        ``where``.

    Raises:
        ValueError: if ``min_compile_time_secs`` is negative or not finite.
    """
    if not min_compile_time_secs >= 0 or min_compile_time_secs == float("inf"):
        raise ValueError(f"enable_compilation_cache: min_compile_time_secs must be a non-negative number, got "
                         f"{min_compile_time_secs!r}")
    import jax

    os.makedirs(where, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return where
