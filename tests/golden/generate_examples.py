"""Golden results of the neural-tangents example programs (tests/golden/examples/<name>.npz), from
neural-tangents 0.6.5.

Run in the oracle environment: ``.venv-oracle/bin/python tests/golden/generate_examples.py [name ...]``
(``make_golden.sh`` without arguments runs it, and installs scikit-learn into the oracle environment, which the
digits example needs). For each ``docs/examples/nt_*.py`` it reads the source, replaces its two smnngp import lines
by neural-tangents' (``PORT`` below; each must occur exactly once, and no other import of smnngp may remain, so the
example is proven to be plain neural-tangents code), executes it in fast mode (``SMNNGP_FAST=1``) as ``__main__``
and stores its module-level ``RESULTS`` dict (floats and arrays), one entry per key.

``tests/test_examples_nt.py`` imports ``port_source`` and ``EXAMPLES`` from here (this module imports neither
library).
"""

import ast
import glob
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "examples")
EXAMPLES = {os.path.basename(p)[:-3]: p for p in sorted(glob.glob(os.path.join(REPO, "docs", "examples", "nt_*.py")))}

# smnngp line -> neural-tangents line: the whole port.
PORT = {
    "import smnngp.nt as nt": "import neural_tangents as nt",
    "from smnngp.nt import stax": "from neural_tangents import stax",
}


def port_source(source, name="example"):
    """The example's source with its smnngp imports replaced by neural-tangents' ones.

    Raises:
        ValueError: an import line is missing or repeated, or smnngp is still imported after the replacement.
    """
    lines = source.splitlines()
    for ours, theirs in PORT.items():
        hits = [i for i, line in enumerate(lines) if line.strip() == ours]
        if len(hits) != 1:
            raise ValueError(f"{name}: expected the line {ours!r} exactly once, found it {len(hits)} times")
        lines[hits[0]] = lines[hits[0]].replace(ours, theirs)
    ported = "\n".join(lines) + "\n"
    left = sorted({alias.name for node in ast.walk(ast.parse(ported)) if isinstance(node, ast.Import)
                   for alias in node.names if alias.name.split(".")[0] == "smnngp"}
                  | {node.module for node in ast.walk(ast.parse(ported))
                     if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "smnngp"})
    if left:
        raise ValueError(f"{name}: imports of smnngp besides the two ported lines: {left}")
    return ported


def run_example(path, name):
    """Execute an example (ported) in fast mode and return its ``RESULTS`` as a dict of NumPy arrays."""
    with open(path) as f:
        source = port_source(f.read(), name)
    os.environ["SMNNGP_FAST"] = "1"
    namespace = {"__name__": "__main__", "__file__": path}
    exec(compile(source, path, "exec"), namespace)
    return {k: np.asarray(v) for k, v in namespace["RESULTS"].items()}


def main(wanted):
    os.makedirs(OUT, exist_ok=True)
    unknown = set(wanted) - set(EXAMPLES)
    if unknown:
        raise SystemExit(f"unknown examples {sorted(unknown)}; have {sorted(EXAMPLES)}")
    for name, path in EXAMPLES.items():
        if wanted and name not in wanted:
            continue
        print(f"--- {name}", flush=True)
        results = run_example(path, name)
        np.savez(os.path.join(OUT, f"{name}.npz"), **results)


if __name__ == "__main__":
    main(sys.argv[1:])
