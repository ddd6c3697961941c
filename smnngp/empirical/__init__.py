"""Finite-width (empirical) kernels: neural-tangents 0.6.5's empirical and Monte-Carlo API, and smnngp's helpers.

* `empirical_nngp_fn`, `empirical_ntk_fn`, `empirical_kernel_fn`, `empirical_ntk_vp_fn`, `NtkImplementation`
  (Jacobian contraction, NTK-vector products, structured derivatives, AUTO), `linearize`, `taylor_expand`:
  `smnngp.empirical._kernels` and `smnngp.empirical._structured`, over the per-call setup both share
  (`smnngp.empirical._setup`: the sides' keyword arguments, output shapes and vmap axes);
* `monte_carlo_kernel_fn`: `smnngp.empirical._monte_carlo`;
* `sample_outputs`, `monte_carlo_nngp`, `empirical_ntk`: smnngp's own convergence helpers
  (`smnngp.empirical._sampling`).
"""

from smnngp.empirical._kernels import (
    DEFAULT_NTK_IMPLEMENTATION,
    NtkImplementation,
    empirical_kernel_fn,
    empirical_nngp_fn,
    empirical_ntk_fn,
    empirical_ntk_vp_fn,
    linearize,
    taylor_expand,
)
from smnngp.empirical._monte_carlo import monte_carlo_kernel_fn
from smnngp.empirical._sampling import empirical_ntk, monte_carlo_nngp, sample_outputs

__all__ = [
    "NtkImplementation",
    "DEFAULT_NTK_IMPLEMENTATION",
    "empirical_nngp_fn",
    "empirical_ntk_fn",
    "empirical_kernel_fn",
    "empirical_ntk_vp_fn",
    "linearize",
    "taylor_expand",
    "monte_carlo_kernel_fn",
    "sample_outputs",
    "monte_carlo_nngp",
    "empirical_ntk",
]
