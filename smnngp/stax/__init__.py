"""Layers that give a finite network and its infinite-width NNGP / NTK kernels.

Every constructor returns a `Layer`, a 3-tuple ``(init_fn, apply_fn, kernel_fn)``
with the names and conventions of neural-tangents' ``stax``, so that code
written for it ports by changing the import::

    from smnngp import stax
    init_fn, apply_fn, kernel_fn = stax.serial(
        stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(), stax.Dense(1))

* ``init_fn(key, input_shape) -> (output_shape, params)`` and
  ``apply_fn(params, x)`` are the finite network;
* ``kernel_fn(x1, x2=None, get=None)`` is its infinite-width limit: a `Kernel`
  pytree for ``get=None``, the array for ``get='nngp'`` or ``'ntk'``, and a
  named tuple for ``get=('nngp', 'ntk')``. It is traceable (`jit` it with
  ``static_argnames='get'``) and computes in the dtype of its inputs.

Parameterisations (Jacot et al. 2018; neural-tangents' conventions):

* ``'ntk'``: W ~ N(0, 1), b ~ N(0, 1), output = W_std / sqrt(fan_in) * x W + b_std * b;
* ``'standard'``: W ~ N(0, W_std^2 / fan_in), b ~ N(0, b_std^2), output = x W + b.

Both have the same NNGP; their NTKs differ (the standard one scales with the
finite width, which is why kernels track the finite shapes).

Kernel recursions implemented here (c = cross covariance, v1, v2 variances):

* affine: K' = W_std^2 K + b_std^2;  NTK' = K' + W_std^2 NTK  ('ntk');
* activation phi: K' = E[phi(u) phi(v)], NTK' = NTK * E[phi'(u) phi'(v)] with
  (u, v) ~ N(0, [[v1, c], [c, v2]]); closed forms below, Gauss-Hermite otherwise;
* convolution: K'(i, j) = W_std^2 / |F| sum_{d in F} K(i + d, j + d) + b_std^2;
* average pooling, flattening and global pooling: linear maps of K.

Hyperparameters as a pytree. Every scale a constructor takes (``W_std``,
``b_std`` of `Dense` and `Conv`; the parameters of `ABRelu`, `LeakyRelu`,
`Erf`, `Sin`, `Gaussian`) may be a traced JAX scalar: concrete values are
checked when the layer is built (a clear error names the layer and the
argument), traced ones are used as they are, so that ``kernel_fn`` is
differentiable in them under `jit`. An architecture whose scales are fitted is
therefore written as a builder ``arch(params) -> Layer`` over a pytree of
scales, and `parametric_kernel` turns the builder and starting values into a
`smnngp.kernels.ParametricKernel` (unconstrained ``theta``, ``floor +
exp(theta)`` as the scales, the NNGP as the kernel): the one mechanism by which
`smnngp.hyper` fits the kernel of any architecture (MLP, CNN with pooling,
residual blocks) and `smnngp.variational` trains its kernel.

Layout of the package (one module per family; every public name is re-exported
here, so ``smnngp.stax.Dense`` and ``from smnngp.stax import serial`` are the
import paths to use): `smnngp.stax._core` (the `Layer` type, the public
``kernel_fn``, shared helpers), `linear` (dense layers), `conv` (convolutions),
`pooling`, `shape` (indexing, slicing, resizing, contractions),
`elementwise`, `elementwise_polynomial`, `attention`, `normalization` (LayerNorm, Dropout), `graphs`
(Aggregate), `combinators`, `parametric`, `masking` (`MaskedArray`, `unmask_fn`: inputs masked with
``mask_constant``), `custom` (neural-tangents' decorators for user-written layers: `layer`, `requires`,
`supports_masking`, `Bool`, `Diagonal`). Each module lists its public names
in ``__all__``; this package exports their union.
"""


from smnngp.stax import (
    attention,
    combinators,
    conv,
    custom,
    elementwise,
    elementwise_polynomial,
    graphs,
    linear,
    masking,
    normalization,
    parametric,
    pooling,
    shape,
)
from smnngp.stax._core import Layer, Padding
from smnngp.stax.attention import *  # noqa: F403
from smnngp.stax.combinators import *  # noqa: F403
from smnngp.stax.conv import *  # noqa: F403
from smnngp.stax.custom import *  # noqa: F403
from smnngp.stax.elementwise import *  # noqa: F403
from smnngp.stax.elementwise_polynomial import *  # noqa: F403
from smnngp.stax.graphs import *  # noqa: F403
from smnngp.stax.linear import *  # noqa: F403
from smnngp.stax.masking import *  # noqa: F403
from smnngp.stax.normalization import *  # noqa: F403
from smnngp.stax.parametric import *  # noqa: F403
from smnngp.stax.pooling import *  # noqa: F403
from smnngp.stax.shape import *  # noqa: F403

_FAMILIES = (linear, conv, pooling, shape, elementwise, elementwise_polynomial, attention, normalization, graphs,
             combinators, parametric, masking, custom)
__all__ = ["Layer", "Padding"] + [name for module in _FAMILIES for name in module.__all__]
