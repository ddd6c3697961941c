"""Elementwise layers beyond the golden fixtures: Monte-Carlo convergence of the finite networks, the NTK as the
derivative of the NNGP map (Price's theorem), exact identities between layers, do_stabilize, signatures as in
neural-tangents 0.6.5, and the errors for bad input."""

import inspect
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import monte_carlo_nngp
from smnngp.kernels import Kernel
from smnngp.stax.elementwise_polynomial import DegreeError


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def _x(n=4, d=3, seed=0, unit=False):
    x = np.random.RandomState(seed).normal(size=(n, d))
    if unit:
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))
    return jnp.asarray(x)


# Activations with a finite network; the second entry is the first Dense's (W_std, b_std).
FINITE = {
    "Abs": (stax.Abs(), (1.2, 0.2)),
    "Abs_stabilized": (stax.Abs(do_stabilize=True), (1.2, 0.2)),
    "Sign": (stax.Sign(), (1.2, 0.2)),
    "Cos": (stax.Cos(1.1, 0.8, 0.4), (1.2, 0.2)),
    "Rbf": (stax.Rbf(0.6), (1.2, 0.2)),
    "Exp": (stax.Exp(0.8, 0.5), (1.0, 0.1)),
    "Gabor": (stax.Gabor(), (1.2, 0.2)),
    "Sigmoid_like": (stax.Sigmoid_like(), (1.2, 0.2)),
    "Monomial2": (stax.Monomial(2), (1.0, 0.2)),
    "RectifiedMonomial2": (stax.RectifiedMonomial(2), (1.0, 0.2)),
    "Polynomial": (stax.Polynomial([0.2, -0.7, 0.4, 0.3]), (1.0, 0.2)),
    "Hermite3": (stax.Hermite(3), (1.0, 0.0)),
    "Elementwise": (stax.Elementwise(jnp.sin, lambda c, v1, v2: jnp.exp(-(v1 + v2) / 2) * jnp.sinh(c),
                                     lambda c, v1, v2: jnp.exp(-(v1 + v2) / 2) * jnp.cosh(c)), (1.2, 0.2)),
}


def test_monte_carlo_nngp_converges_to_the_kernel():
    """One hidden layer: its pre-activations are exactly Gaussian at any width, so the Monte-Carlo mean of
    phi(z_i) phi(z_j) over random first layers is unbiased for E[phi phi]; every activation's estimate must lie
    within 5 standard errors (plus 1e-3 of the scale) of its kernel. One draw of first layers serves all."""
    n_draws, width = 400, 64
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    cases = {False: _x(), True: _x(unit=True)}  # Hermite needs unit-variance pre-activations
    for unit, x in cases.items():
        w_std, b_std = (1.0, 0.0) if unit else (1.2, 0.2)
        w = jax.random.normal(keys[0], (n_draws, x.shape[1], width))
        b = jax.random.normal(keys[1], (n_draws, 1, width))
        z = jnp.einsum("nd,mdw->mnw", x, w) * (w_std / math.sqrt(x.shape[1])) + b_std * b
        for name, (act, _) in FINITE.items():
            if name.startswith("Hermite") != unit:
                continue
            h = act[1]((), z)
            prods = np.asarray(jnp.einsum("mnw,mpw->mnp", h, h)) / width
            est, se = prods.mean(0), prods.std(0, ddof=1) / math.sqrt(n_draws)
            exact = np.asarray(stax.serial(stax.Dense(8, W_std=w_std, b_std=b_std), act)[2](x, None, "nngp"))
            assert np.all(np.abs(est - exact) <= 5 * se + 1e-3 * np.max(np.abs(exact))), (name, est, exact, se)


def test_monte_carlo_nngp_of_a_whole_network():
    """The finite network of `init_fn` / `apply_fn` (Dense, Gabor, Dense) against its kernel."""
    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(64, W_std=1.2, b_std=0.2), stax.Gabor(),
                                               stax.Dense(8, W_std=1.5, b_std=0.1))
    x = _x()
    exact = np.asarray(kernel_fn(x, None, "nngp"))
    est, se = monte_carlo_nngp(init_fn, apply_fn, x, jax.random.PRNGKey(2), n_draws=300, chunk=300)
    assert np.all(np.abs(est - exact) <= 5 * se + 1e-3 * np.max(np.abs(exact)))


# Layers whose E[phi' phi'] is dE[phi phi]/dcov (Price's theorem), ExpNormalized by definition.
PRICE = dict(FINITE, ExpNormalized=(stax.ExpNormalized(0.7, -0.4), None),
             RectifiedMonomial1=(stax.RectifiedMonomial(1), None),
             RectifiedMonomial3=(stax.RectifiedMonomial(3), None),
             Monomial5=(stax.Monomial(5), None), Erf_Elementwise_autodiff=(stax.Elementwise(
                 jnp.tanh, lambda c, v1, v2: jnp.arcsin(2 * c / jnp.sqrt((1 + 2 * v1) * (1 + 2 * v2))) * 2 / np.pi),
                 None))
PRICE.pop("Sign")  # sign' = 0 almost everywhere: its NTK is 0 by convention, not dK/dcov


@pytest.mark.parametrize("name", sorted(PRICE))
def test_ntk_factor_is_derivative_of_nngp_map(name):
    layer = PRICE[name][0]
    rng = np.random.RandomState(3)
    v1 = jnp.asarray(rng.uniform(0.5, 1.5, 4))
    v2 = jnp.asarray(rng.uniform(0.5, 1.5, 3))
    if name.startswith("Hermite"):
        v1, v2 = jnp.ones(4), jnp.ones(3)
    corr = jnp.asarray(rng.uniform(-0.9, 0.9, (4, 3)))
    c = corr * jnp.sqrt(v1[:, None] * v2[None])

    def kmap(c):
        k = Kernel(c, jnp.ones_like(c), v1, v2, shape1=(4, 3), shape2=(3, 3), full=False, is_gaussian=True)
        return layer.kernel_map(k)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, deriv = jax.jvp(lambda c: kmap(c).nngp, (c,), (jnp.ones_like(c),))
        assert rel(kmap(c).ntk, deriv) < 1e-9


def test_identities_between_layers():
    x1, x2 = _x(), _x(3, seed=1)

    def k(act):
        return stax.serial(stax.Dense(4, W_std=1.3, b_std=0.3), act, stax.Dense(2))[2](x1, x2)

    pairs = [(stax.Cos(1.1, 0.8, 0.4), stax.Sin(1.1, 0.8, 0.4 + math.pi / 2)),
             (stax.Rbf(0.6), stax.Sin(math.sqrt(2), math.sqrt(1.2), math.pi / 4)),
             (stax.Sigmoid_like(), stax.Erf(0.5, 1 / 2.4020563531719796, 0.5)),
             (stax.Abs(), stax.ABRelu(-1, 1)),
             (stax.RectifiedMonomial(1), stax.Relu()),
             (stax.Monomial(3), stax.Polynomial([0, 0, 0, 1])),
             (stax.Monomial(1), stax.Polynomial([0, 1]))]
    for a, b in pairs:
        ka, kb = k(a), k(b)
        assert rel(ka.nngp, kb.nngp) < 1e-13 and rel(ka.ntk, kb.ntk) < 1e-13, (a.name, b.name)
        assert rel(ka.cov1, kb.cov1) < 1e-13
    # Monomial(n) diagonal is (2n - 1)!! v^n; RectifiedMonomial(n) half of it; Rbf's is 1.
    v = 1.3**2 * jnp.mean(x1 * x1, axis=1) + 0.3**2
    assert rel(k(stax.Monomial(4)).cov1, 105 * v**4) < 1e-13
    assert rel(k(stax.RectifiedMonomial(3)).cov1, 7.5 * v**3) < 1e-13
    assert rel(k(stax.RectifiedMonomial(0)).cov1, 0.5 * np.ones(4)) < 1e-15
    assert rel(k(stax.Rbf(2.0)).cov1, np.ones(4)) == 0.0


def test_sign_ntk_is_zero_and_diagonal_is_one():
    x1 = _x()
    k = stax.serial(stax.Dense(4, W_std=1.3, b_std=0.3), stax.Sign())[2](x1, x1)
    assert np.all(np.asarray(k.ntk) == 0)
    assert np.allclose(np.diag(np.asarray(k.nngp)), 1.0, atol=1e-12) and np.all(np.asarray(k.cov1) == 1.0)


def test_do_stabilize_keeps_values_and_rescues_deep_float32():
    x = _x()
    for make in (lambda s: stax.Relu(do_stabilize=s), lambda s: stax.Abs(do_stabilize=s),
                 lambda s: stax.LeakyRelu(0.2, do_stabilize=s), lambda s: stax.ABRelu(-0.4, 1.3, do_stabilize=s)):
        ka, kb = (stax.serial(stax.Dense(8, W_std=1.5, b_std=0.1), make(s), stax.Dense(8))[2](x, None) for s in
                  (False, True))
        # The rescaling is by a power of two, so the values agree bit for bit.
        assert np.array_equal(ka.nngp, kb.nngp) and np.array_equal(ka.ntk, kb.ntk)
    # 14 layers of W_std = 10: the variances reach 1e24, their products overflow float32.
    deep = [layer for _ in range(14) for layer in (stax.Dense(8, W_std=10.0), stax.Relu(do_stabilize=True))]
    ref = stax.serial(*[layer for _ in range(14) for layer in (stax.Dense(8, W_std=10.0), stax.Relu())])[2](x, None)
    k32 = stax.serial(*deep)[2](x.astype(jnp.float32), None)
    assert rel(k32.nngp, ref.nngp) < 1e-5 and rel(k32.ntk, ref.ntk) < 1e-5


def test_exp_normalized_is_homogeneous_and_has_no_finite_network():
    init_fn, apply_fn, kernel_fn = stax.serial(stax.Dense(4, W_std=1.3), stax.ExpNormalized(1.5, -0.5),
                                               stax.Dense(2, W_std=1.1))
    x1, x2 = _x(), _x(3, seed=1)
    k, ks = kernel_fn(x1, x2), kernel_fn(3 * x1, 3 * x2)
    assert rel(ks.nngp, 9 * k.nngp) < 1e-13 and rel(ks.ntk, 9 * k.ntk) < 1e-13
    _, params = init_fn(jax.random.PRNGKey(0), x1.shape)
    with pytest.raises(NotImplementedError, match="ExpNormalized"):
        apply_fn(params, x1)


def test_hermite_requires_unit_variance():
    layer = stax.serial(stax.Dense(4, W_std=1.0, b_std=0.0), stax.Hermite(3))
    k = layer[2](_x(unit=True), None)  # concrete unit variances: no error, no warning needed
    assert np.all(np.isfinite(np.asarray(k.nngp)))
    with pytest.raises(ValueError, match=r"Hermite\(3\).*unit variance"):
        layer[2](2 * _x(unit=True), None)
    with pytest.warns(UserWarning, match="unit variance"):
        jax.jit(lambda x: layer[2](x, None, "nngp"))(_x(unit=True))


# neural-tangents 0.6.5's signatures (names, order, defaults).
NT_SIGNATURES = {
    "Abs": [("do_stabilize", False)], "Relu": [("do_stabilize", False)],
    "ABRelu": [("a", None), ("b", None), ("do_stabilize", False)],
    "LeakyRelu": [("alpha", None), ("do_stabilize", False)], "Sign": [], "Gabor": [], "Sigmoid_like": [],
    "Exp": [("a", 1), ("b", 1)], "Cos": [("a", 1.0), ("b", 1.0), ("c", 0.0)], "Rbf": [("gamma", 1.0)],
    "ExpNormalized": [("gamma", 1), ("shift", -1), ("do_clip", False)], "Hermite": [("degree", None)],
    "Monomial": [("degree", None)], "RectifiedMonomial": [("degree", None)], "Polynomial": [("coef", None)],
    "Elementwise": [("fn", None), ("nngp_fn", None), ("d_nngp_fn", None)],
}


@pytest.mark.parametrize("name", sorted(NT_SIGNATURES))
def test_signatures_match_neural_tangents(name):
    params = inspect.signature(getattr(stax, name)).parameters.values()
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == NT_SIGNATURES[name]


def test_errors_name_the_layer():
    for make, kind, match in [
        (lambda: stax.Monomial(-1), DegreeError, "Monomial: degree"),
        (lambda: stax.Hermite(1.5), DegreeError, "Hermite: degree"),
        (lambda: stax.RectifiedMonomial(True), DegreeError, "RectifiedMonomial: degree"),
        (lambda: stax.Polynomial([[1.0, 2.0]]), ValueError, "Polynomial: coef"),
        (lambda: stax.Polynomial([1.0, np.inf]), ValueError, "Polynomial: coef"),
        (lambda: stax.Polynomial("ab"), TypeError, "Polynomial: coef"),
        (lambda: stax.Rbf(-1.0), ValueError, "Rbf: gamma"),
        (lambda: stax.Exp(a="x"), TypeError, "Exp: a"),
        (lambda: stax.Cos(c=np.nan), ValueError, "Cos: c"),
        (lambda: stax.Relu(do_stabilize="yes"), TypeError, "Relu: do_stabilize"),
        (lambda: stax.ExpNormalized(do_clip=1), TypeError, "ExpNormalized: do_clip"),
        (lambda: stax.Elementwise(), ValueError, "Elementwise: neither fn"),
        (lambda: stax.Elementwise(fn=3), TypeError, "Elementwise: fn"),
    ]:
        with pytest.raises(kind, match=match):
            make()
    assert issubclass(DegreeError, NotImplementedError)  # as neural-tangents raises for a negative degree
    x = _x()
    only_fn = stax.serial(stax.Dense(4), stax.Elementwise(fn=jnp.sin))
    with pytest.raises(NotImplementedError, match=r"Elementwise\(sin\).*nngp_fn"):
        only_fn[2](x, None)
    only_kernel = stax.Elementwise(nngp_fn=lambda c, v1, v2: c)
    with pytest.raises(NotImplementedError, match="apply_fn"):
        only_kernel[1]((), x)
    with pytest.raises(ValueError, match="Gabor: the input to an activation must be Gaussian"):
        stax.serial(stax.Dense(4), stax.Relu(), stax.LayerNorm(), stax.Gabor())[2](x, None)


def test_traced_scales_are_differentiable():
    x = _x()

    def nngp_sum(p):
        net = stax.serial(stax.Dense(4, W_std=1.2), stax.Rbf(p[0]), stax.Dense(4), stax.Exp(p[1], p[2]),
                          stax.Dense(2), stax.ExpNormalized(p[3], -0.5), stax.Dense(1))
        return jnp.sum(net[2](x, None, "nngp"))

    g = jax.jit(jax.grad(nngp_sum))(jnp.array([0.5, 0.8, 0.3, 1.2]))
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g) != 0)


def test_full_spatial_covariances_are_the_batch_diagonal():
    """With x2 = None, cov1 (all position pairs) is the batch diagonal of nngp after every layer, Sign included
    (neural-tangents 0.6.5 sets Sign's off-diagonal position pairs of cov1 to 1)."""
    x = jnp.asarray(np.random.RandomState(4).normal(size=(3, 4, 2)))
    for act in (stax.Sign(), stax.Gabor(), stax.RectifiedMonomial(2), stax.Polynomial([0.1, 1.0, 0.3])):
        k = stax.serial(stax.Conv(4, (3,), padding="SAME", W_std=1.3, b_std=0.2), act)[2](x, None)
        assert k.cov1.shape == (3, 4, 4)
        diag = jnp.moveaxis(jnp.diagonal(k.nngp, axis1=0, axis2=1), -1, 0)
        assert rel(k.cov1, diag) < 1e-13, act.name


def test_private_atan2_is_within_3_ulps_of_numpy_with_ieee_signed_zeros():
    # `_atan2` replaces XLA:CPU's scalar library call in the arc-cosine and erf kernels; numpy's arctan2 is the
    # C library's, correctly rounded to within an ulp.
    from smnngp.stax.elementwise import _atan2

    rng = np.random.default_rng(0)
    size = 100_000
    y = rng.standard_normal(size) * 10.0 ** rng.integers(-6, 6, size)
    x = rng.standard_normal(size) * 10.0 ** rng.integers(-6, 6, size)
    zeros_y = np.array([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, 1e-300, -1e-300])
    zeros_x = np.array([0.0, 0.0, -0.0, -0.0, 0.0, -0.0, -1.0, -1.0])
    y, x = np.concatenate([y, zeros_y]), np.concatenate([x, zeros_x])
    for x_arg, nonneg in ((x, False), (np.abs(x), True)):
        ref = np.arctan2(y, x_arg)
        got = np.asarray(jax.jit(lambda a, b, n=nonneg: _atan2(a, b, n))(y, x_arg))
        ulps = np.abs(got - ref) / np.spacing(np.maximum(np.abs(ref), np.finfo(np.float64).tiny))
        assert ulps.max() <= 3.0, (nonneg, ulps.max())
        np.testing.assert_array_equal(np.signbit(got), np.signbit(ref))


@pytest.mark.parametrize("name", ["Relu", "Abs", "Erf", "RectifiedMonomial"])
def test_compiled_kernel_grows_linearly_with_depth(name):
    # Each layer's output must be a function of arrays the layer itself computed: when it was a cheap expression
    # of the previous layer's output (the arc-cosine kernels' `dot * c`, a sign select after atan2's division),
    # XLA recomputed the whole chain inside every consumer and a depth-L network compiled O(L^2) code (from 4 to
    # 8 ReLU layers the optimised program grew by 1.46x twice the growth from 2 to 4; linear growth is 1.0x).
    act = {"Relu": stax.Relu, "Abs": stax.Abs, "Erf": stax.Erf, "RectifiedMonomial": lambda: stax.RectifiedMonomial(2)}
    x = jnp.ones((64, 5), jnp.float64)
    sizes = []
    for depth in (2, 4, 8):
        net = stax.serial(*[layer for _ in range(depth) for layer in (stax.Dense(8, 1.3, 0.1), act[name]())],
                          stax.Dense(1))
        text = jax.jit(lambda a, f=net[2]: f(a, None, ("nngp", "ntk"))).lower(x).compile().as_text()
        sizes.append(sum(" = " in line for line in text.splitlines()))
    growth = (sizes[2] - sizes[1]) / (2 * (sizes[1] - sizes[0]))
    assert growth <= 1.08, f"{name}: optimised HLO sizes {sizes} at depths 2, 4, 8 (growth {growth:.2f}x linear)"
