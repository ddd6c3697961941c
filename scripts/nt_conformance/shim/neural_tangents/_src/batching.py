"""``neural_tangents._src.batching`` as nt's tests import it: the public ``batch`` only.

nt's private helpers (``_serial``, ``_parallel``, ``_jit_or_pmap_broadcast``) are not provided: the tests
that call them are listed as out of scope in docs/neural-tangents.md.
"""

from smnngp.nt import batch  # noqa: F401
