"""The suite runs under ``jax_numpy_rank_promotion='raise'`` (tests/conftest.py), in this process and in the ones it
starts: an operation between arrays of different ranks is an error, so the library has to broadcast explicitly, as
neural-tangents' own tests demand. These tests fail if the flag is dropped from conftest or stops reaching
subprocesses."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flag_is_raise_in_the_test_process():
    assert jax.config.jax_numpy_rank_promotion == "raise"
    with pytest.raises(ValueError, match="jax_numpy_rank_promotion=.raise."):
        jnp.ones(3) + jnp.ones((2, 3))
    # the explicit spelling is what the library writes instead
    assert (jnp.ones(3)[None, :] + jnp.ones((2, 3))).shape == (2, 3)


def test_flag_reaches_subprocesses():
    """Experiments, notebook kernels and multi-process tests are started with this process's environment."""
    assert os.environ.get("JAX_NUMPY_RANK_PROMOTION") == "raise"
    code = ("import jax, jax.numpy as jnp\n"
            "print(jax.config.jax_numpy_rank_promotion)\n"
            "try:\n"
            "    jnp.ones(3) * jnp.ones((2, 3))\n"
            "    print('promoted')\n"
            "except ValueError:\n"
            "    print('raised')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["raise", "raised"], run.stdout + run.stderr[-2000:]
