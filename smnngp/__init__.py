"""smnngp: infinite-width kernels (NNGP / NTK) and their scale mixtures, in JAX.

The layer library `smnngp.stax` builds a finite network and its infinite-width
kernel from one spec; `smnngp.kernels` holds the `Kernel` pytree and evaluates
kernels at scale (tiles, devices, diagonals).
"""

from smnngp import kernels, stax
from smnngp.kernels import Kernel, batched_kernel_fn, diagonal

__version__ = "0.1.0"
__all__ = ["stax", "kernels", "Kernel", "batched_kernel_fn", "diagonal", "__version__"]
