"""neural-tangents 0.6.5's public API with its names and signatures, over smnngp.

Porting a program written for neural-tangents is one line::

    # import neural_tangents as nt
    # from neural_tangents import stax
    import smnngp.nt as nt
    from smnngp.nt import stax

    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(512), stax.Relu(), stax.Dense(1))
    predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train)
    ntk_fn = nt.empirical_ntk_fn(apply_fn)

This package is a namespace, never a second implementation: ``nt.stax`` is
`smnngp.stax`, the empirical functions are `smnngp.empirical`'s, and where
neural-tangents' signature differs from smnngp's on purpose there is a thin
adapter over smnngp's function (``nt.batch`` over
`smnngp.kernels.batched_kernel_fn`, ``nt.predict`` over `smnngp.predict`,
whose ``gradient_descent_mse_ensemble`` keeps neural-tangents'
``compute_cov=False`` default here). `docs/neural-tangents.md` lists every name
and each deliberate difference.
"""

from smnngp import stax
from smnngp.empirical import (
    NtkImplementation,
    empirical_kernel_fn,
    empirical_nngp_fn,
    empirical_ntk_fn,
    empirical_ntk_vp_fn,
    linearize,
    monte_carlo_kernel_fn,
    taylor_expand,
)
from smnngp.kernels import Kernel
from smnngp.nt import predict
from smnngp.nt._batching import batch

__version__ = "0.6.5"  # the neural-tangents API this namespace follows

__all__ = [
    "stax",
    "predict",
    "batch",
    "empirical_kernel_fn",
    "empirical_nngp_fn",
    "empirical_ntk_fn",
    "empirical_ntk_vp_fn",
    "linearize",
    "taylor_expand",
    "NtkImplementation",
    "monte_carlo_kernel_fn",
    "Kernel",
]
