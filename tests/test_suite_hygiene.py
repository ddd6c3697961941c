"""The test workers free the MLIR contexts compiled programs hold before they slow every later lowering (issue 40).

tests/conftest.py counts the MLIR contexts alive in the worker after each test and, past ``MAX_LIVE_CONTEXTS``,
clears JAX's Python-level caches (the jitted functions keep their compiled programs). These tests fail if the count
stops seeing MLIR contexts (a JAX release renaming the binding would make the policy a silent no-op and the suite
about twice as slow), if the hook stops freeing the contexts compiled programs hold, or if it makes the jitted
functions trace again.
"""

from __future__ import annotations

import gc

import conftest
import jax
import jax.numpy as jnp


def _compile_fresh_programs(n: int, traces: list | None = None) -> list:
    """``n`` jitted functions, each called once; each appends its index to ``traces`` when it is traced."""
    def make(k):
        def f(x):
            if traces is not None:
                traces.append(k)
            return jnp.sin(x) * (k + 0.5)
        return jax.jit(f)

    fns = [make(k) for k in range(n)]
    for f in fns:
        f(jnp.ones(3)).block_until_ready()
    return fns


def test_live_context_count_sees_a_new_context():
    from jax.extend.mlir import ir

    before = conftest._live_mlir_contexts()
    ctx = ir.Context()
    assert conftest._live_mlir_contexts() == before + 1, "the live-context count does not see MLIR contexts"
    del ctx


def test_teardown_hook_bounds_the_contexts_compiled_programs_hold(monkeypatch):
    """On jax 0.10 each compiled program holds its context (the count rises by five here and the hook frees them);
    on jax 0.12 compiled programs no longer hold one, and the bound holds without clearing anything."""
    gc.collect()
    baseline = conftest._live_mlir_contexts()
    traces: list = []
    fns = _compile_fresh_programs(5, traces)
    assert traces == [0, 1, 2, 3, 4]
    held = conftest._live_mlir_contexts()
    monkeypatch.setattr(conftest, "MAX_LIVE_CONTEXTS", held + 10)
    conftest.pytest_runtest_teardown(None, None)  # under the threshold: nothing is cleared
    assert conftest._live_mlir_contexts() == held
    monkeypatch.setattr(conftest, "MAX_LIVE_CONTEXTS", baseline + 1)  # (0 would switch the policy off)
    conftest.pytest_runtest_teardown(None, None)
    gc.collect()
    assert conftest._live_mlir_contexts() <= baseline + 1, (
        f"{conftest._live_mlir_contexts()} MLIR contexts alive after the hook, {baseline} before compiling")
    # the jitted functions still work afterwards; the default release keeps their compiled programs (no new trace)
    assert float(fns[2](jnp.ones(3))[0]) == float(jnp.sin(1.0) * 2.5)
    assert float(fns[4](jnp.ones(3))[0]) == float(jnp.sin(1.0) * 4.5)
    if conftest.RELEASE == "python":
        assert traces == [0, 1, 2, 3, 4], f"jitted functions traced again after the release: {traces[5:]}"
    # a new signature is traced and compiled as usual
    assert fns[1](jnp.ones(4)).shape == (4,) and traces[-1] == 1
