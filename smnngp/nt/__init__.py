"""neural-tangents 0.6.5's public API with its names and signatures, over smnngp.

Porting a program written for neural-tangents is one line::

    # import neural_tangents as nt
    import smnngp.nt as nt

    init_fn, apply_fn, kernel_fn = nt.stax.serial(nt.stax.Dense(512), nt.stax.Relu(), nt.stax.Dense(1))

This package is a namespace, never a second implementation: every name is
smnngp's own function (``nt.stax`` is `smnngp.stax`), or, where
neural-tangents' signature differs from smnngp's on purpose, a thin adapter
over it (``nt.batch``, ``nt.predict``). `docs/neural-tangents.md` lists every
name and each deliberate difference.
"""

from smnngp import stax
from smnngp.kernels import Kernel
from smnngp.nt._batching import batch

__all__ = ["stax", "Kernel", "batch"]
