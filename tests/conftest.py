"""Test configuration: float64 is enabled for the tests (the library never flips it itself)."""

import os
import sys

# The default suite is bound by XLA's compilation, not by running what it compiles: thousands of small programs,
# each compiled once. LLVM at -O0 compiles them 2-4x faster (the suite: ~35% less time, measured on
# tests/test_golden.py + test_lowrank.py, 300 s -> 190 s with -n 2; the whole suite 58 min here against CI's 73 min
# before); floating-point semantics are the same
# (no fast-math at any level). Set before JAX creates its CPU backend; subprocesses (experiments, notebooks,
# multi-process tests) inherit it. Benchmarks and experiments run outside pytest at XLA's default level;
# SMNNGP_TEST_XLA_DEFAULT=1 runs the tests there too.
if os.environ.get("SMNNGP_TEST_XLA_DEFAULT") != "1" and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _mapped_regions() -> int:
    """Memory mappings of this process (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/maps") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


# Every jit compilation keeps its machine code in memory mappings of its own until the executable is freed. One
# pytest-xdist worker compiles tens of thousands of programs over the default suite; past the kernel's limit on
# mappings per process (vm.max_map_count, 65,530 by default) LLVM's JIT fails with "Cannot allocate memory" and the
# worker crashes (CI's run at 0ae3aa9, after 70 minutes; a worker here held ~11,000 mappings after 10 minutes).
# After each test module whose worker holds more than MAX_MAPPINGS mappings, JAX's caches are cleared, which frees
# the executables no test still holds.
MAX_MAPPINGS = 20_000


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    if _mapped_regions() > MAX_MAPPINGS:
        jax.clear_caches()
