"""The benchmark scripts run: each at a tiny size, from the repository root, in a subprocess.

They print timings, which tests do not check (timings belong to the benchmarks); what is asserted is that a
script still runs against the library as it is now and prints the figures it promises. Why: a benchmark that
reaches into the library's internals (``benchmarks/dense_memory_plan.py`` calls `posterior._dense_factor`) broke
silently when a static argument was added there, and was found broken only when it was next needed. The scripts
whose anchors live outside the test environment (neural-tangents' oracle environment, GPyTorch, GPJax,
bayesian-torch) run here without them: they time smnngp alone then, or are left to their ``--quick`` modes.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_benchmark(script, *args, timeout=300, expect_ok=True):
    """The script's stdout (``expect_ok``: it must exit 0), or, with ``expect_ok=False``, the finished process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", SMNNGP_ORACLE_VENV=os.path.join(ROOT, "no-oracle-here"))
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, f"benchmarks/{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_dense_memory_plan_prints_each_plan_in_matrices():
    out = run_benchmark("dense_memory_plan.py", "--n", "256", "--block", "64")
    plans = [line for line in out.splitlines() if "N^2" in line]
    assert len(plans) == 3, out  # the library's choice, one call, blocked
    for line in plans:
        total = float(line.split("=")[1].split("N^2")[0])
        assert 1.0 <= total < 4.0, line  # the factor itself is one matrix


def test_kernels_compile_times_the_phases_of_a_first_call():
    out = run_benchmark("kernels_compile.py", "--cases", "mlp3_erf", "--steady", "2")
    row = next(line for line in out.splitlines() if line.startswith("MLP-3 Erf"))
    numbers = row.split()[-7:]  # trace, lower, compile, 1st run, best, median, HLO ops
    assert all(float(v) > 0 for v in numbers), row


def test_kernels_compile_nt_program_says_what_it_needs():
    proc = run_benchmark("kernels_compile.py", "--cases", "mlp3_erf", "--nt-program", expect_ok=False)
    assert proc.returncode != 0 and "no oracle environment" in proc.stderr


def test_kernels_benchmark_times_smnngp_alone_without_the_oracle(tmp_path):
    results = tmp_path / "kernels.json"
    out = run_benchmark("kernels.py", "--cases", "mlp3_erf", "--rounds", "1", "--repeats", "1",
                        "--results", str(results))
    assert "Timing smnngp only" in out and results.exists()


def test_matfree_product_agrees_with_the_dense_product():
    out = run_benchmark("matfree_product.py", "--n", "300", "--columns", "3", "--tile", "128", "--repeats", "1")
    rows = [line for line in out.splitlines() if "per product" in line]
    assert len(rows) == 2, out  # RBF and the ReLU NNGP
    for row in rows:
        assert float(row.rsplit(" ", 1)[1]) < 1e-10, row
