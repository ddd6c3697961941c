"""Dense and the convolutions (Conv, ConvTranspose, ConvLocal): layouts, width multipliers, N-d, finite networks.

Golden values against neural-tangents are in tests/golden/cases_linear.py (run by test_golden.py). Here:

* exact checks: a single affine layer's empirical NTK (at any width, with one draw of the parameters) equals
  its infinite-width NTK, since the Jacobian of an affine layer does not depend on the parameters; this pins
  the finite network's scaling (``s``, fan-in, transposed and unshared filters) to the kernel's;
* Monte-Carlo: the NNGP of single affine layers (exact in expectation at any width) agrees with the average
  over random draws within 5 standard errors;
* invariances: a layout given by ``dimension_numbers`` / axes gives the kernel of the canonical layout on
  transposed inputs; ConvLocal keeps only same-position covariances;
* errors name the layer and the wrong argument.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import empirical_ntk, monte_carlo_nngp, sample_outputs

jax.config.update("jax_enable_x64", True)

RNG = np.random.RandomState(0)


def _x(*shape):
    return jnp.asarray(RNG.normal(size=shape))


def _k(layer, x, get=None, **kw):
    """``kernel_fn(x, None, get, **kw)`` compiled as one program (eager evaluation compiles every primitive)."""
    return jax.jit(lambda a: layer[2](a, None, get, **kw))(x)


def _close(a, b, tol=1e-10):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    assert np.max(np.abs(a - b)) <= tol * max(1.0, np.max(np.abs(b)))


def _batch_last(layer):
    """A (C, N) -> (C', N) layer as a network with batch-first outputs (what the empirical helpers expect)."""
    init_fn, apply_fn, kernel_fn = layer
    return init_fn, lambda p, x: apply_fn(p, x).T, kernel_fn


AFFINE = [
    ("dense_standard_s", stax.Dense(6, 1.3, 0.2, parameterization="standard", s=(2, 3)), (4, 5)),
    ("dense_axes", _batch_last(stax.Dense(6, 1.3, 0.2, batch_axis=1, channel_axis=0)), (5, 4)),
    ("conv3d_standard_s", stax.serial(stax.Conv(3, (2, 1, 2), strides=(1, 2, 1), padding="SAME", W_std=1.2,
                                                b_std=0.3, parameterization="standard", s=(2, 2)), stax.Flatten()),
     (3, 3, 4, 3, 2)),
    ("conv_nchw", stax.serial(stax.Conv(3, (3, 2), padding="CIRCULAR", W_std=1.4, b_std=0.1,
                                        dimension_numbers=("NCHW", "OIHW", "NCHW")), stax.Flatten()), (3, 2, 4, 5)),
    ("convT1d_circular", stax.serial(stax.ConvTranspose(3, (3,), strides=(2,), padding="CIRCULAR", W_std=1.3,
                                                        b_std=0.2), stax.Flatten()), (3, 5, 2)),
    ("convT2d_valid_standard", stax.serial(stax.ConvTranspose(3, (2, 3), strides=(2, 1), W_std=1.3, b_std=0.2,
                                                              parameterization="standard"), stax.Flatten()),
     (3, 3, 4, 2)),
    ("convlocal2d_same", stax.serial(stax.ConvLocal(3, (3, 2), strides=(1, 2), padding="SAME", W_std=1.3,
                                                    b_std=0.2), stax.Flatten()), (3, 4, 5, 2)),
]


@pytest.mark.parametrize("name,net,shape", AFFINE, ids=[a[0] for a in AFFINE])
def test_affine_layer_empirical_ntk_is_exact(name, net, shape):
    init_fn, apply_fn, kernel_fn = net
    x = _x(*shape)
    _, params = init_fn(jax.random.PRNGKey(1), x.shape)
    if name == "dense_axes":  # the empirical NTK takes batch-first inputs
        x = x.T
        apply_fn = (lambda f: lambda p, z: f(p, z.T))(apply_fn)
        _close(empirical_ntk(apply_fn, params, x), kernel_fn(x.T, None, "ntk"), 1e-9)
        return
    emp = jax.jit(empirical_ntk, static_argnums=0)(apply_fn, params, x)
    _close(emp, _k((init_fn, apply_fn, kernel_fn), x, "ntk"), 1e-9)


MC_CASES = [AFFINE[0], AFFINE[4]]  # ConvLocal's finite net is pinned by the exact NTK test


@pytest.mark.parametrize("name,net,shape", MC_CASES, ids=[a[0] for a in MC_CASES])
def test_affine_layer_monte_carlo_nngp(name, net, shape):
    init_fn, apply_fn, kernel_fn = net
    x = _x(*shape)
    est, se = monte_carlo_nngp(init_fn, apply_fn, x, jax.random.PRNGKey(2), n_draws=256)
    k = np.asarray(_k(net, x, "nngp"))
    assert np.all(np.abs(est - k) <= 5 * se + 1e-3 * np.max(np.abs(k))), (est, k, se)


def test_convT_circular_monte_carlo_same_positions():
    """Same-position variances of a CIRCULAR transpose need the cross-position terms folding brings together."""
    net = stax.ConvTranspose(16, (3,), strides=(2,), padding="CIRCULAR", W_std=1.3)
    x = _x(2, 5, 2)
    init_fn, apply_fn, kernel_fn = net
    f = sample_outputs(init_fn, apply_fn, x, jax.random.PRNGKey(3), n_draws=256)
    draws = np.einsum("mnhc,mnhc->mnh", f, f) / f.shape[-1]
    est, se = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(len(draws))
    k = np.asarray(_k(net, x, "nngp", diagonal_spatial=True))
    k = np.stack([k[i, i] for i in range(len(x))])
    assert np.all(np.abs(est - k) <= 5 * se + 1e-6), (est, k)


def test_layouts_give_the_canonical_kernel():
    x = _x(2, 5, 4, 2)
    ref = _k(stax.serial(stax.Conv(4, (3, 2), strides=(2, 1), padding="SAME", W_std=1.3, b_std=0.1), stax.Relu(),
                      stax.Conv(4, (2, 2), W_std=1.2)), x)
    nchw = ("NCHW", "OIHW", "NCHW")
    alt = _k(stax.serial(stax.Conv(4, (3, 2), strides=(2, 1), padding="SAME", W_std=1.3, b_std=0.1,
                                dimension_numbers=nchw), stax.Relu(),
                      stax.Conv(4, (2, 2), W_std=1.2, dimension_numbers=nchw)), jnp.transpose(x, (0, 3, 1, 2)))
    _close(alt.nngp, ref.nngp)
    _close(alt.ntk, ref.ntk)
    # filter_shape and strides follow rhs_spec's spatial order.
    whio = _k(stax.Conv(4, (2, 3), strides=(1, 2), padding="SAME", W_std=1.3,
                     dimension_numbers=("NHWC", "WHIO", "NHWC")), x)
    hwio = _k(stax.Conv(4, (3, 2), strides=(2, 1), padding="SAME", W_std=1.3), x)
    _close(whio.nngp, hwio.nngp)
    # out_spec reorders the spatial axes of the kernel as it reorders the finite output.
    k_out = _k(stax.Conv(4, (3, 2), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NWHC")), x, "nngp")
    k_ref = _k(stax.Conv(4, (3, 2), padding="SAME"), x, "nngp")
    _close(k_out, jnp.transpose(k_ref, (0, 1, 4, 5, 2, 3)))
    xd = _x(4, 5)
    _close(_k(stax.Dense(3, 1.2, 0.1, batch_axis=1, channel_axis=0), xd.T, "ntk"),
           _k(stax.Dense(3, 1.2, 0.1), xd, "ntk"))


@pytest.mark.parametrize("layer,shape", [
    (stax.Conv(4, (3, 2, 2), strides=(1, 2, 1), padding="SAME", dimension_numbers=("NCDHW", "OIDHW", "NCDHW")),
     (1, 2, 3, 4, 3)),
    (stax.ConvTranspose(4, (2, 3), strides=(2, 1), dimension_numbers=("NCHW", "OIHW", "NHWC")), (2, 3, 4, 5)),
    (stax.ConvTranspose(4, (3,), strides=(2,), padding="CIRCULAR"), (2, 5, 3)),
    (stax.ConvLocal(4, (3, 2), strides=(1, 2), padding="CIRCULAR", b_std=0.1,
                    dimension_numbers=("NCHW", "HWIO", "NCHW")), (2, 3, 4, 5)),
    (stax.Conv(3, (2, 2), parameterization="standard", s=(1, 3), dimension_numbers=("NHWC", "OIHW", "NCHW")),
     (2, 4, 5, 3)),
], ids=["conv3d_ncdhw", "convT_nchw_to_nhwc", "convT_circular", "convlocal_nchw", "conv_standard_s"])
def test_finite_shapes_agree(layer, shape):
    init_fn, apply_fn, kernel_fn = layer
    out_shape, params = init_fn(jax.random.PRNGKey(0), shape)
    out = jax.jit(apply_fn)(params, jnp.ones(shape))
    assert out.shape == out_shape
    k = _k(layer, jnp.ones(shape))
    n_spatial = len(shape) - 2
    assert k.nngp.shape[2:] == tuple(n for n in k.shape1[1:-1] for _ in range(2))
    assert len(k.shape1) == n_spatial + 2 and sorted(k.shape1) == sorted(out_shape)


def test_standard_width_multiplier_sets_finite_width():
    out_shape, (W, b) = stax.Dense(4, b_std=0.1, parameterization="standard", s=(2, 3))[0](jax.random.PRNGKey(0),
                                                                                            (5, 6))
    assert out_shape == (5, 12) and W.shape == (6, 12) and b.shape == (1, 12)
    out_shape, _ = stax.Dense(4, s=(2, 3))[0](jax.random.PRNGKey(0), (5, 6))
    assert out_shape == (5, 4)


def test_convlocal_has_no_cross_position_covariance():
    x = _x(3, 5, 4, 2)
    k = _k(stax.ConvLocal(4, (3, 2), padding="SAME", W_std=1.3, b_std=0.2), x)
    kc = _k(stax.Conv(4, (3, 2), padding="SAME", W_std=1.3, b_std=0.2), x)
    eye = np.einsum("ab,cd->abcd", np.eye(5), np.eye(4))  # (H, H', W, W')
    _close(np.asarray(k.nngp) * (1 - eye), np.zeros(k.nngp.shape))
    _close(np.asarray(k.nngp) * eye, np.asarray(kc.nngp) * eye)


@pytest.mark.parametrize("make", [
    lambda w, b: stax.ConvTranspose(3, (3,), strides=(2,), padding="CIRCULAR", W_std=w, b_std=b),
    lambda w, b: stax.ConvLocal(3, (2,), padding="SAME", W_std=w, b_std=b, parameterization="standard"),
], ids=["convT", "convlocal"])
def test_traced_scales_give_gradients(make):
    x = _x(2, 4, 2)

    def total(w, b):
        k = stax.serial(make(w, b), stax.Relu(), stax.Flatten())[2](x, None, ("nngp", "ntk"))
        return jnp.sum(k.nngp) + jnp.sum(k.ntk)

    g = jax.jit(jax.grad(total, argnums=(0, 1)))(1.3, 0.2)
    total = jax.jit(total)
    eps = 1e-6
    fd = ((total(1.3 + eps, 0.2) - total(1.3 - eps, 0.2)) / (2 * eps),
          (total(1.3, 0.2 + eps) - total(1.3, 0.2 - eps)) / (2 * eps))
    np.testing.assert_allclose(np.array(g), np.array(fd), rtol=1e-5)


def test_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"Dense\(4\): s must be a pair"):
        stax.Dense(4, s=(0, 1))
    with pytest.raises(ValueError, match=r"Dense\(4\): batch_axis and channel_axis must differ"):
        stax.Dense(4, batch_axis=1, channel_axis=-1)[0](jax.random.PRNGKey(0), (3, 2))
    with pytest.raises(ValueError, match=r"Conv\(4, \(3, 3\)\): dimension_numbers lhs_spec 'NCH'"):
        stax.Conv(4, (3, 3), dimension_numbers=("NCH", "OIHW", "NCHW"))
    with pytest.raises(ValueError, match=r"ConvTranspose\(4, \(3, 3\)\).*same spatial letters"):
        stax.ConvTranspose(4, (3, 3), dimension_numbers=("NCHW", "OIHD", "NCHW"))
    with pytest.raises(ValueError, match=r"ConvLocal\(4, \(3,\)\): strides must be 1"):
        stax.ConvLocal(4, (3,), strides=(1, 1))
    with pytest.raises(ValueError, match=r"ConvLocal: filter_shape must be a sequence of positive integers"):
        stax.ConvLocal(4, (2.5,))
    with pytest.raises(ValueError, match=r"ConvTranspose\(4, \(3,\)\): a 1-D convolution needs inputs of rank 3"):
        stax.ConvTranspose(4, (3,))[2](np.ones((2, 3, 3, 1)), None, "nngp")
    with pytest.raises(ValueError, match=r"Conv\(4, \(2, 2, 2\)\): VALID padding"):
        stax.Conv(4, (2, 2, 2))[2](np.ones((2, 1, 3, 3, 1)), None, "nngp")
    with pytest.raises(ValueError, match=r"ConvLocal\(4, \(3,\)\): s must be a pair"):
        stax.ConvLocal(4, (3,), s=(1, 2, 3))


@pytest.mark.parametrize("conv", [stax.Conv, stax.ConvTranspose, stax.ConvLocal])
def test_zero_dimensional_convolution_is_dense(conv):
    # An empty filter_shape convolves (batch, channels) inputs over no spatial axis: Dense's affine map (as nt).
    x1 = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    x2 = jax.random.normal(jax.random.PRNGKey(1), (2, 5))
    _, _, k_conv = stax.serial(conv(7, (), W_std=1.3, b_std=0.2), stax.Relu(), conv(2, (), W_std=0.9))
    _, _, k_dense = stax.serial(stax.Dense(7, W_std=1.3, b_std=0.2), stax.Relu(), stax.Dense(2, W_std=0.9))
    for x in (None, x2):
        a, b = k_conv(x1, x, ("nngp", "ntk")), k_dense(x1, x, ("nngp", "ntk"))
        np.testing.assert_allclose(a.nngp, b.nngp, rtol=1e-13)
        np.testing.assert_allclose(a.ntk, b.ntk, rtol=1e-13)
    init, apply, _ = conv(7, (), b_std=0.2)
    _, params = init(jax.random.PRNGKey(2), x1.shape)
    assert apply(params, x1).shape == (3, 7)
