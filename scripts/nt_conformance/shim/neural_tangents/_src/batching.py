"""``neural_tangents._src.batching`` as nt's tests import it: the public ``batch``.

nt's private helpers ``_serial``, ``_parallel`` and ``_jit_or_pmap_broadcast`` are not reimplemented: the
tests that call them are listed as out of scope in docs/neural-tangents.md. They exist here only as named
stand-ins that raise when called, because one test of the public ``batch``
(``testAnalyticKernelComposeAutomatic``) compares its batching function with ``batching._parallel`` by
identity before using it.
"""

from smnngp.nt import batch  # noqa: F401


def _private(name):
    def stand_in(*args, **kwargs):
        raise NotImplementedError(f"neural_tangents._src.batching.{name} is a private helper of neural-tangents, "
                                  f"not provided by smnngp.nt (use the public batch)")

    stand_in.__name__ = name
    return stand_in


_serial = _private("_serial")
_parallel = _private("_parallel")
_jit_or_pmap_broadcast = _private("_jit_or_pmap_broadcast")
