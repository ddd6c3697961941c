"""The one helper the experiment tests share: run ``python -m experiments ...`` from the repository root."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_experiment(*args, timeout=900) -> subprocess.CompletedProcess:
    """``python -m experiments *args`` in a subprocess (matplotlib headless); returns the finished process."""
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)
