"""pytest plugin of the conformance harness, loaded (``-p nt_conformance_plugin``) in both runs: neural-tangents
0.6.5's tests on nt itself (its pinned environment) and on smnngp.nt (through ../shim).

It changes the environment, never a test file:
- absl's flags are marked parsed, as ``absltest.main()`` would do, so that nt's test helpers can read
  ``--nt_num_generated_cases`` (default 4: each parameterised test runs nt's fixed sample of its cases);
- ``jax.tree_map``, which nt's test files import and which jax removed in 0.6, is put back as
  ``jax.tree_util.tree_map`` on a jax that lacks it (on nt's own jax 0.4.23 it exists and is left alone);
- ``jax_threefry_partitionable`` is set to False, the random bits nt's jax produced (jax 0.5 changed the
  default): nt's tests draw their inputs, and their Monte-Carlo checks their networks, from these bits, and
  with them smnngp's ``init_fn`` gives nt's parameters bit for bit, so a statistical comparison inside a
  test sees the very samples it saw under nt.
"""

import jax
from absl import flags

if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree_util.tree_map
jax.config.update("jax_threefry_partitionable", False)


def pytest_configure(config):
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
