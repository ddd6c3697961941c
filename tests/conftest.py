"""Test configuration: float64 is enabled for the tests (the library never flips it itself)."""

import os
import sys

# The default suite is bound by XLA's compilation more than by running what it compiles: thousands of small
# programs, each compiled once. LLVM at -O1 compiles them about as fast as at -O0 (tests/test_golden.py +
# test_montecarlo.py with -n 2: 79 s at -O1, 83 s at -O0; test_golden + test_lowrank took 300 s at the default
# level, 190 s at -O0) and its code runs nearly as fast as at the default -O3 (the quick experiments, alone:
# mbnn-cnn 25 s at -O1, 26 s at -O3, 144 s at -O0; quickstart 22 / 25 / 36 s; svtp 22 / 29 / 23 s); floating-point
# semantics are the same at every level (no fast-math). Set before JAX creates its CPU backend; subprocesses
# (experiments, notebooks, multi-process tests) inherit it. Benchmarks and experiments run outside pytest at XLA's
# default level; SMNNGP_TEST_XLA_DEFAULT=1 runs the tests there too.
SUITE_XLA_FLAG = "--xla_backend_optimization_level=1"
if os.environ.get("SMNNGP_TEST_XLA_DEFAULT") != "1" and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SUITE_XLA_FLAG).strip()

# Under 'raise' an operation between arrays of different ranks (`(3, 5) + (5,)`) is an error, as in neural-tangents'
# own tests: the library broadcasts explicitly. The variable is read when JAX is imported, so every subprocess the
# tests start (experiments, notebook kernels, multi-process tests, the docs build, benchmarks) runs under it too.
os.environ["JAX_NUMPY_RANK_PROMOTION"] = "raise"

# XLA's persistent compilation cache (issue 40): every compiled program, however quick to compile, is kept on disk
# under $SMNNGP_TEST_COMPILATION_CACHE_DIR (default ~/.cache/smnngp/jax-tests), shared by the xdist workers, the
# subprocesses the tests start and later runs; SMNNGP_TEST_COMPILATION_CACHE=0 switches it off. The key holds JAX's
# version, the backend and the XLA flags, so runs on other Pythons or JAX versions keep apart (about 190 MB per JAX
# version). Measured on these 2 cores at 27b295c (`python -m pytest -n 2`, 1,791 tests): 33 min 19 s with an empty
# cache (it fills), 12 min 28 s with a full one. The environment carries it to the subprocesses (read when they
# import JAX); this process may have imported JAX already (a plugin), so it is switched on below as well. The
# benchmarks' workers drop it.
TEST_CACHE = None
if os.environ.get("SMNNGP_TEST_COMPILATION_CACHE", "1") != "0":
    TEST_CACHE = os.environ.get("SMNNGP_TEST_COMPILATION_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "smnngp", "jax-tests")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = TEST_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")  # implicit rank promotion is an error (see above)
if TEST_CACHE is not None:
    from smnngp._compilation_cache import enable_compilation_cache

    enable_compilation_cache(TEST_CACHE, min_compile_time_secs=0.0)

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


# Every program a worker compiles stays alive in JAX's in-memory caches for as long as the function it was jitted
# from, and with it the MLIR context it was lowered in. Live contexts make every later lowering slower (measured on
# these cores, jax 0.10.2: 2,000 distinct small programs lowered in 17 s with their contexts freed, in 79 s with
# 2,000 kept alive and in 284 s with 4,000): over the default suite a worker accumulates thousands, and the lowering
# to MLIR (never served by the persistent cache) grew to 705 s and 926 s of the two workers' time, the suite to
# 28 to 36 minutes (issue 40). After each test whose worker holds more than MAX_LIVE_CONTEXTS contexts, the caches
# that keep them alive are released (below). Whole suite on these idle cores, warm cache: clearing all of JAX's
# caches past 1,000 contexts 22 min 47 s, past 250 16 min 21 s, past 100 13 min 53 s; releasing only the
# Python-level caches past 100 10 min 10 s, past 30 (the default) 9 min 59 s (RESULTS.md, "Test suite time").
# Compiled code also holds memory mappings of its own: past the kernel's limit per process (vm.max_map_count, 65,530
# by default) LLVM's JIT fails with "Cannot allocate memory" and the worker crashes (CI's run at 0ae3aa9), so the
# caches are cleared as well after a test module whose worker holds more than MAX_MAPPINGS mappings.
MAX_LIVE_CONTEXTS = int(os.environ.get("SMNNGP_TEST_MAX_LIVE_CONTEXTS", "30"))
MAX_MAPPINGS = 20_000


def _live_mlir_contexts() -> int:
    """MLIR contexts alive in this process (0 where the bindings do not count them)."""
    try:
        from jax.extend.mlir import ir

        return int(ir.Context._get_live_count())
    except (ImportError, AttributeError):
        return 0


# What keeps a compiled program's context alive on jax 0.10 is its jaxpr, held by JAX's Python-level caches (traced
# signatures, lowerings); the executable itself lives on in the jitted function's C++ dispatch cache, which holds no
# context. Clearing only the Python-level caches (`jax._src.util.clear_all_caches`, the first half of
# `jax.clear_caches()`) frees the contexts while every jitted function keeps its compiled program for the signatures
# it has seen (300 jitted functions called again: 0.16 s after it, 10.6 s after `jax.clear_caches()`, which drops
# the dispatch caches too, so that each is traced, lowered and read back from the persistent cache again).
# SMNNGP_TEST_RELEASE=all clears everything, as does the fallback where JAX no longer has that function.
RELEASE = os.environ.get("SMNNGP_TEST_RELEASE", "python")
if RELEASE not in ("python", "all"):
    raise ValueError(f"SMNNGP_TEST_RELEASE={RELEASE!r}: expected 'python' or 'all'")


def _release_lowering_contexts() -> None:
    """Free the MLIR contexts compiled programs hold (see above)."""
    if RELEASE == "python":
        try:
            from jax._src import util

            util.clear_all_caches()
            return
        except (ImportError, AttributeError):
            pass
    jax.clear_caches()


def pytest_runtest_teardown(item, nextitem):
    if MAX_LIVE_CONTEXTS > 0 and _live_mlir_contexts() > MAX_LIVE_CONTEXTS:
        _release_lowering_contexts()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    if _mapped_regions() > MAX_MAPPINGS:
        jax.clear_caches()


# Tests that read a registered data set are marked `@pytest.mark.needs_data("yacht", ...)`. Before such a test runs,
# each set is looked up as the registry does ($SMNNGP_DATA_DIR, the cache, a download); one that cannot be had
# skips the test with a one-line reason (shown by `-rs`, in the default options), or fails it when
# SMNNGP_REQUIRE_DATA=1 (.ci/run, which has ../shared/data). tests/_testdata.py holds the guard and the stand-ins.
def pytest_configure(config):
    # SMNNGP_TEST_COMPILE_REPORT=DIR: per-test tracing, lowering and compilation seconds (tests/_compile_report.py)
    report_dir = os.environ.get("SMNNGP_TEST_COMPILE_REPORT")
    if report_dir:
        from _compile_report import CompileReport

        config.pluginmanager.register(CompileReport(os.path.abspath(report_dir), _live_mlir_contexts),
                                      "smnngp-compile-report")
    config.addinivalue_line(
        "markers",
        "needs_data(*names): reads the named registered data sets; skipped when they cannot be had (not in "
        "$SMNNGP_DATA_DIR nor the cache, download failing), failed instead under SMNNGP_REQUIRE_DATA=1",
    )


def pytest_runtest_setup(item):
    names = [name for mark in item.iter_markers("needs_data") for name in mark.args]
    if names:
        import _testdata

        _testdata.require(dict.fromkeys(names))
