"""A stand-in package named ``neural_tangents`` for the conformance harness (scripts/nt_conformance.sh).

It re-exports `smnngp.nt`, so that neural-tangents 0.6.5's own test files, run unchanged, exercise smnngp.
Never installed: the harness puts this folder first on ``PYTHONPATH`` for its own pytest run only.
"""

from smnngp.nt import *  # noqa: F401,F403
from smnngp.nt import __all__, __version__, predict, stax  # noqa: F401
