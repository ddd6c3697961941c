"""The neural-tangents example programs (docs/examples/nt_*.py) give neural-tangents 0.6.5's numbers.

Each example is written against neural-tangents' API; its only smnngp-specific lines are ``import smnngp.nt as nt``
and ``from smnngp.nt import stax``. ``tests/golden/generate_examples.py`` swapped those two lines for
neural-tangents' imports, ran it in the oracle environment (jax 0.4.23 + neural-tangents 0.6.5) in fast mode and
stored its ``RESULTS`` in ``tests/golden/examples/<name>.npz``. Here each example runs in fast mode with smnngp, in
a subprocess (it enables float64 globally), and its ``RESULTS`` are compared with the golden file:

* deterministic quantities (infinite-width kernels, kernel predictions, accuracies, MSEs, the learning rate taken
  from the infinite-width NTK) to 1e-8 relative, entrywise or relative to the array's largest entry (kernel
  solves with a small ``diag_reg`` leave round-off of ~1e-9 of the largest prediction on the smallest ones);
* quantities of random finite networks (``nt_weight_vs_function_space``: trajectory differences;
  ``nt_resnet_empirical_ntk``: errors of empirical / Monte-Carlo kernels) cannot match draw for draw: jax's random
  streams changed between jax 0.4.23 and today's (``jax_threefry_partitionable`` is on by default now), so the same
  ``PRNGKey`` gives other weights. For those the conclusion is compared: the error shrinks from the narrowest to
  the widest network in both libraries (``"shrinks"`` below), and the geometric mean of ours over the widths is
  within a factor ``RANDOM_FACTOR`` of neural-tangents' (per width, a handful of draws scatter by more than that:
  e.g. the 4-sample Monte-Carlo NTK of the ResNet at width 16 has error 0.68 here, 0.14 in nt's run).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "examples"
sys.path.insert(0, str(REPO / "tests" / "golden"))
from generate_examples import EXAMPLES, port_source  # noqa: E402

RTOL = 1e-8
RANDOM_FACTOR = 3.0

# example -> {key: kind} for the random keys ("shrinks": decreases from first to last width; "floor": width-free,
# compared by the factor only); every other key is deterministic.
RANDOM = {
    "nt_weight_vs_function_space": {"weight_vs_linear": "shrinks", "weight_vs_function": "floor",
                                    "linear_vs_function": "floor", "test_mse_weight": None},
    "nt_resnet_empirical_ntk": {"err_ntk_single": "shrinks", "err_ntk_mc": "floor", "err_nngp_mc": "floor"},
}

RUNNER = """
import runpy, sys
import numpy as np
ns = runpy.run_path(sys.argv[1], run_name="__main__")
np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in ns["RESULTS"].items()})
"""


def run_example(name, tmp_path):
    out = tmp_path / f"{name}.npz"
    env = dict(os.environ, SMNNGP_FAST="1", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-c", RUNNER, EXAMPLES[name], str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


# The three examples that train or sample finite networks take 1-3 minutes each even in fast mode on 2 cores: they
# run with `pytest -m slow` (with the paper-scale runs); the two pure-kernel examples stay in the default suite.
SLOW_EXAMPLES = {"nt_resnet_empirical_ntk", "nt_weight_vs_function_space", "nt_graph_nngp"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES else n
                                  for n in sorted(EXAMPLES)])
def test_example_matches_neural_tangents(name, tmp_path):
    golden_path = GOLDEN / f"{name}.npz"
    assert golden_path.exists(), f"no golden file for {name}: run bash scripts/make_golden.sh"
    with np.load(golden_path) as f:
        golden = {k: f[k] for k in f.files}
    ours = run_example(name, tmp_path)
    assert set(ours) == set(golden), f"{name}: RESULTS keys differ: {sorted(set(ours) ^ set(golden))}"
    random = RANDOM.get(name, {})
    for key, want in golden.items():
        got = ours[key]
        assert got.shape == want.shape, f"{name}.{key}: shape {got.shape} != nt's {want.shape}"
        if key in random:
            kind = random[key]
            if kind is None:
                continue
            ratio = float(np.exp(np.mean(np.log(got)) - np.mean(np.log(want))))  # of the geometric means
            assert 1.0 / RANDOM_FACTOR <= ratio <= RANDOM_FACTOR, (
                f"{name}.{key}: ours {got} not within a factor {RANDOM_FACTOR} of nt's {want} (geometric means)")
            if kind == "shrinks":
                assert got[-1] < got[0] and want[-1] < want[0], f"{name}.{key}: no shrinking with width: {got}, {want}"
        else:
            # Relative to the array's largest entry: a kernel solve (diag_reg 1e-4) leaves round-off of ~1e-9 of
            # the largest prediction on the small ones, which differs between any two float64 solvers.
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.max(np.abs(want))),
                                       err_msg=f"{name}.{key}")


def test_examples_port_by_their_imports_only():
    """Each example names smnngp only in its two import lines, which the port replaces."""
    assert len(EXAMPLES) == 6
    for name, path in EXAMPLES.items():
        ported = port_source(Path(path).read_text(), name)
        assert "import neural_tangents as nt" in ported and "from neural_tangents import stax" in ported
        with pytest.raises(ValueError, match="exactly once"):
            port_source(Path(path).read_text().replace("from smnngp.nt import stax", "from smnngp import stax"), name)
