"""User-written layers with their own infinite-width kernels, written against neural-tangents' API.

Three layers a researcher might add, each with ``init_fn``, ``apply_fn`` and a ``kernel_fn`` on the `Kernel`,
declared with neural-tangents' decorators (``stax.layer``, ``stax.requires``, ``stax.supports_masking``):

* ``Square``: phi(u) = u^2. For centred Gaussian (u, v) with variances v1, v2 and covariance c,
  E[u^2 v^2] = v1 v2 + 2 c^2 (Isserlis) and E[phi'(u) phi'(v)] = 4 c; it treats each position alone, so
  same-position covariances suffice (``Diagonal()``);
* ``ScaledDense``: a bias-free dense layer over the channel axis in the NTK parameterisation, with masking (a
  position is masked when all its channels are);
* ``MeanOverPositions``: averages a sequence over its positions; it needs the covariances of every pair of
  positions (``Diagonal(input=Bool.NO, output=Bool.YES)``), so the layers before it track them.

Networks mixing them with built-in layers on short sequences (N x L x C), including variable-length sequences padded
with a mask constant; their NNGP and NTK are the program's results. With its two imports changed to
neural-tangents', the program runs unchanged under neural-tangents 0.6.5 and gives the same kernels
(``tests/test_examples_nt.py``).

Run: ``python docs/examples/nt_custom_layer.py`` (``SMNNGP_FAST=1``: fewer sequences).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
N1, N2, L, C = (6, 4, 5, 3) if FAST else (24, 16, 8, 3)
PAD = -7.0  # the mask constant of padded positions
RESULTS = {}


def _position_variances(k):
    """Per-position variances of x1 and x2: (N1, L) and (N2, L), or (N1,) and (N2,) without positions."""
    def own(cov):
        return cov if k.diagonal_spatial or cov.ndim == 1 else jnp.diagonal(cov, axis1=1, axis2=2)
    v1 = own(k.cov1)
    return v1, (v1 if k.cov2 is None else own(k.cov2))


def _pair(v1, v2, nngp):
    """(v1 at the first point/position, v2 at the second), broadcast against ``nngp``'s layout."""
    if nngp.ndim == 2:                       # (N1, N2)
        return v1[:, None], v2[None, :]
    if nngp.ndim == 3:                       # (N1, N2, L): same positions
        return v1[:, None, :], v2[None, :, :]
    return v1[:, None, :, None], v2[None, :, None, :]   # (N1, N2, L, L')


def _own_pair(v, cov):
    """The same for a batch diagonal ``cov`` ((N,), (N, L) or (N, L, L'))."""
    if cov.ndim == 3:
        return v[:, :, None], v[:, None, :]
    return v, v


@stax.layer
@stax.supports_masking(remask_kernel=False)
def Square():
    def init_fn(rng, input_shape):
        return input_shape, ()

    def apply_fn(params, inputs, **kwargs):
        return inputs ** 2

    @stax.requires(diagonal_spatial=stax.Diagonal())
    def kernel_fn(k, **kwargs):
        v1, v2 = _position_variances(k)
        a, b = _pair(v1, v2, k.nngp)
        nngp = a * b + 2 * k.nngp ** 2
        ntk = None if k.ntk is None else k.ntk * 4 * k.nngp
        cov1 = _own_pair(v1, k.cov1)[0] * _own_pair(v1, k.cov1)[1] + 2 * k.cov1 ** 2
        cov2 = None if k.cov2 is None else _own_pair(v2, k.cov2)[0] * _own_pair(v2, k.cov2)[1] + 2 * k.cov2 ** 2
        return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2, is_gaussian=False)

    return init_fn, apply_fn, kernel_fn


@stax.layer
@stax.supports_masking(remask_kernel=True)
def ScaledDense(out_dim, W_std=1.0):
    def init_fn(rng, input_shape):
        return input_shape[:-1] + (out_dim,), jax.random.normal(rng, (input_shape[-1], out_dim))

    def apply_fn(params, inputs, mask=None, **kwargs):
        return W_std / np.sqrt(inputs.shape[-1]) * inputs @ params

    def mask_fn(mask, input_shape):
        return jnp.all(mask, axis=-1, keepdims=True)

    @stax.requires(diagonal_spatial=stax.Diagonal())
    def kernel_fn(k, **kwargs):
        nngp = W_std ** 2 * k.nngp
        ntk = None if k.ntk is None else nngp + W_std ** 2 * k.ntk
        cov2 = None if k.cov2 is None else W_std ** 2 * k.cov2
        return k.replace(nngp=nngp, ntk=ntk, cov1=W_std ** 2 * k.cov1, cov2=cov2, is_gaussian=True)

    return init_fn, apply_fn, kernel_fn, mask_fn


@stax.layer
def MeanOverPositions():
    def init_fn(rng, input_shape):
        return (input_shape[0], input_shape[-1]), ()

    def apply_fn(params, inputs, **kwargs):
        return jnp.mean(inputs, axis=1)

    @stax.requires(diagonal_spatial=stax.Diagonal(input=stax.Bool.NO, output=stax.Bool.YES))
    def kernel_fn(k, **kwargs):
        ntk = k.ntk if k.ntk is None or k.ntk.ndim == 0 else jnp.mean(k.ntk, axis=(2, 3))
        cov2 = None if k.cov2 is None else jnp.mean(k.cov2, axis=(1, 2))
        return k.replace(nngp=jnp.mean(k.nngp, axis=(2, 3)), ntk=ntk, cov1=jnp.mean(k.cov1, axis=(1, 2)),
                         cov2=cov2, is_gaussian=False, channel_axis=1)  # (N, L, C) -> (N, C)

    return init_fn, apply_fn, kernel_fn


rs = np.random.RandomState(0)
x1 = jnp.asarray(rs.normal(size=(N1, L, C)))
x2 = jnp.asarray(rs.normal(size=(N2, L, C)))

# Same-position covariances suffice: built-in convolutions around the custom activation, then flattening.
_, _, local_fn = stax.serial(
    stax.Conv(32, (3,), padding="SAME", W_std=1.3, b_std=0.2), Square(),
    ScaledDense(32, W_std=0.7), stax.Relu(), stax.Flatten(), stax.Dense(1, W_std=1.1))
local = local_fn(x1, x2, get=("nngp", "ntk"))
RESULTS["local_nngp"], RESULTS["local_ntk"] = local.nngp, local.ntk
RESULTS["local_nngp_self"] = local_fn(x1, None, get="nngp")
RESULTS["conv_square_full"] = stax.serial(
    stax.Conv(8, (3,), padding="SAME", W_std=1.3, b_std=0.2), Square())[2](x1, x2, get="nngp")

# Averaging over positions: every pair of positions is tracked through Square and ScaledDense.
_, _, pooled_fn = stax.serial(
    stax.Conv(32, (2,), padding="CIRCULAR", W_std=1.2, b_std=0.1), Square(), ScaledDense(32, W_std=0.8),
    stax.Erf(), MeanOverPositions(), stax.Dense(1))
pooled = pooled_fn(x1, x2, get=("nngp", "ntk"))
RESULTS["pooled_nngp"], RESULTS["pooled_ntk"] = pooled.nngp, pooled.ntk

# Variable-length sequences: the last positions of some sequences padded with PAD in every channel.
lengths1, lengths2 = rs.randint(2, L + 1, size=N1), rs.randint(2, L + 1, size=N2)
xm1 = jnp.where(jnp.arange(L)[None, :, None] < lengths1[:, None, None], x1, PAD)
xm2 = jnp.where(jnp.arange(L)[None, :, None] < lengths2[:, None, None], x2, PAD)
_, _, masked_fn = stax.serial(
    ScaledDense(32, W_std=1.4), Square(), stax.Dense(32, W_std=0.9, b_std=0.1), stax.Relu(),
    stax.GlobalAvgPool(), stax.Dense(1))
masked = masked_fn(xm1, xm2, get=("nngp", "ntk"), mask_constant=PAD)
RESULTS["masked_nngp"], RESULTS["masked_ntk"] = masked.nngp, masked.ntk

for key, value in RESULTS.items():
    print(f"{key:18s} shape {tuple(value.shape)}  mean {float(jnp.mean(value)):+.6f}")
print(f"nt namespace {nt.__name__}: custom layers compose with built-in ones")
