"""Test configuration: float64 is enabled for the tests (the library never flips it itself)."""

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
