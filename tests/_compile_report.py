"""Where the suite's time goes inside JAX, test by test (issue 40): an opt-in pytest plugin.

With ``SMNNGP_TEST_COMPILE_REPORT=DIR`` set, tests/conftest.py registers this plugin. Each pytest process (every xdist
worker) listens to JAX's monitoring events and, per test (setup, call and teardown together), adds up

- ``trace_s``: tracing Python functions to jaxprs (``/jax/core/compile/jaxpr_trace_duration``),
- ``lower_s``: lowering jaxprs to MLIR modules (``.../jaxpr_to_mlir_module_duration``; the persistent compilation
  cache never saves it),
- ``compile_s``: XLA's backend compilation (``.../backend_compile_duration``; cache hits skip it),
- ``hits`` / ``misses``: the persistent compilation cache's answers,
- ``wall_s``: the test's own wall time, and ``contexts``: live MLIR contexts after it;

and writes them to ``DIR/<worker>.json`` when the session ends. ``python tests/_compile_report.py DIR`` prints the
totals per worker and the tests that lower longest. Subprocesses the tests start (experiments, notebooks, the docs
build) are not counted: their time shows in ``wall_s`` only.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_s",
}
COUNTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
FIELDS = ("wall_s", "trace_s", "lower_s", "compile_s", "hits", "misses")


class CompileReport:
    """Per-test sums of JAX's compilation events in this process (see the module docstring)."""

    def __init__(self, directory: str, live_contexts):
        self.directory = directory
        self.live_contexts = live_contexts
        self.tests: dict[str, dict[str, float]] = {}
        self.current: dict[str, float] | None = None
        self.outside = dict.fromkeys(FIELDS, 0.0)  # events between tests (collection, fixtures of other scopes)
        import jax.monitoring as monitoring

        monitoring.register_event_duration_secs_listener(self._on_duration)
        monitoring.register_event_listener(self._on_event)

    def _row(self) -> dict[str, float]:
        return self.current if self.current is not None else self.outside

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        key = EVENTS.get(event)
        if key is not None:
            self._row()[key] += float(duration)

    def _on_event(self, event: str, **kwargs) -> None:
        key = COUNTS.get(event)
        if key is not None:
            self._row()[key] += 1

    # pytest hooks
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = dict.fromkeys(FIELDS, 0.0)
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            self._close(item.nodeid, start)

    def _close(self, nodeid: str, start: float) -> None:
        assert self.current is not None
        self.current["wall_s"] = time.perf_counter() - start
        self.current["contexts"] = self.live_contexts()
        self.tests[nodeid] = self.current
        self.current = None

    def pytest_sessionfinish(self, session):
        if not self.tests:  # xdist's controller runs no test
            return
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"{worker}.json")
        with open(path, "w") as fh:
            json.dump({"worker": worker, "outside_tests": self.outside, "tests": self.tests}, fh, indent=1)


def summarise(directory: str, top: int = 40) -> str:
    """The report's text: totals per worker, then the ``top`` tests by lowering time."""
    names = sorted(f for f in os.listdir(directory) if f.endswith(".json"))
    if not names:
        raise FileNotFoundError(f"no <worker>.json files in {directory!r}: run the suite with "
                                f"SMNNGP_TEST_COMPILE_REPORT={directory} first")
    lines = [f"{'worker':<8} {'tests':>6} " + " ".join(f"{f:>10}" for f in FIELDS)]
    rows = []
    for name in names:
        with open(os.path.join(directory, name)) as fh:
            data = json.load(fh)
        tests = data["tests"]
        totals = {f: sum(t[f] for t in tests.values()) + data["outside_tests"][f] for f in FIELDS}
        lines.append(f"{data['worker']:<8} {len(tests):>6} " + " ".join(f"{totals[f]:>10.0f}" for f in FIELDS))
        rows.extend((t["lower_s"], nodeid, data["worker"], t) for nodeid, t in tests.items())
    rows.sort(key=lambda r: -r[0])
    lines.append("")
    lines.append(f"{'lower_s':>8} {'trace_s':>8} {'wall_s':>8} {'hits':>6} {'miss':>5} {'ctx':>5}  test")
    for lower, nodeid, worker, t in rows[:top]:
        lines.append(f"{lower:>8.1f} {t['trace_s']:>8.1f} {t['wall_s']:>8.1f} {int(t['hits']):>6} "
                     f"{int(t['misses']):>5} {int(t.get('contexts', 0)):>5}  {nodeid} [{worker}]")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python tests/_compile_report.py DIR [TOP]")
    print(summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 40))
