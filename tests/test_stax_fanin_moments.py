"""Fan-ins of branches with non-zero means and of branches that share a Gaussian (issue 49, part 4).

The references are independent of the code under test: the arc-cosine kernel and the ReLU mean written out here in
numpy, closed-form activations that equal a sum or product of functions of one Gaussian (u + relu(u) is
ABRelu(1, 2), u * u is Monomial(2)), and Gauss-Hermite means at a high degree.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax

W, B = 1.2, 0.2


def _x(n=4, d=3, seed=0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=(n, d)))


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def _arccos_relu(k):
    """E[relu(u) relu(v)] for the covariance matrix k (numpy, closed form of Cho & Saul)."""
    v = np.diag(k)
    r = np.sqrt(np.outer(v, v))
    cos = np.clip(k / r, -1.0, 1.0)
    theta = np.arccos(cos)
    return r * (np.sin(theta) + (np.pi - theta) * cos) / (2 * np.pi)


def _dense(k):
    return W * W * k + B * B


def test_post_activation_residual_carries_the_branch_means():
    """Dense, Relu, FanOut(2), parallel(Identity, serial(Dense, Relu)), FanInSum, Dense: the sum's covariance has
    the cross terms m_a(x) m_b(x') of the two ReLU branches (25 % of the diagonal at W_std 1.2, b_std 0.2); the
    mean-free answer (what the library gave before) is refused by the comparison."""
    x = _x()
    net = stax.serial(stax.Dense(512, W, B), stax.Relu(), stax.FanOut(2),
                      stax.parallel(stax.Identity(), stax.serial(stax.Dense(512, W, B), stax.Relu())),
                      stax.FanInSum(), stax.Dense(1, W, B))
    got = net[2](x, None, "nngp")
    xn = np.asarray(x)
    q0 = _dense(xn @ xn.T / xn.shape[1])
    k_a = _arccos_relu(q0)
    q1 = _dense(k_a)
    k_b = _arccos_relu(q1)
    m_a = np.sqrt(np.diag(q0) / (2 * np.pi))
    m_b = np.sqrt(np.diag(q1) / (2 * np.pi))
    without = _dense(k_a + k_b)
    want = _dense(k_a + k_b + np.outer(m_a, m_b) + np.outer(m_b, m_a))
    assert rel(got, want) < 1e-10
    assert rel(without, want) > 0.1  # the test can tell the two apart


def test_input_residual_pairs_the_data_mean_with_an_activation_mean():
    """An identity branch of the raw inputs beside serial(Dense, Relu): the cross term is the channel average of
    the input times the ReLU mean."""
    x = _x(d=5)
    net = stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(stax.Dense(5, W, B), stax.Relu())),
                      stax.FanInSum())
    got = net[2](x, None, "nngp")
    xn = np.asarray(x)
    q0 = _dense(xn @ xn.T / 5)
    mean_x = xn.mean(axis=1)
    m_b = np.sqrt(np.diag(q0) / (2 * np.pi))
    want = xn @ xn.T / 5 + _arccos_relu(q0) + np.outer(mean_x, m_b) + np.outer(m_b, mean_x)
    assert rel(got, want) < 1e-10


@pytest.mark.parametrize("x2_given", [False, True])
def test_two_functions_of_one_gaussian_sum_to_their_single_function(x2_given):
    """u + relu(u) after one Dense is ABRelu(1, 2): the joint moments of the two branches (quadrature of the pair)
    reproduce the closed form, on the NNGP and the NTK, for k(x, x) and k(x1, x2)."""
    x1, x2 = _x(seed=1), (_x(n=3, seed=2) if x2_given else None)
    shared = stax.serial(stax.Dense(512, W, B), stax.FanOut(2), stax.parallel(stax.Identity(), stax.Relu()),
                         stax.FanInSum(), stax.Dense(1, W, B))
    single = stax.serial(stax.Dense(512, W, B), stax.ABRelu(1.0, 2.0), stax.Dense(1, W, B))
    got = shared[2](x1, x2, ("nngp", "ntk"))
    want = single[2](x1, x2, ("nngp", "ntk"))
    assert rel(got.nngp, want.nngp) < 1e-4
    assert rel(got.ntk, want.ntk) < 1e-4


def test_product_of_two_copies_is_the_square():
    """FanOut(2), parallel(Identity, Identity), FanInProd after a Dense is u^2 (not the product of two independent
    copies' kernels): Monomial(2), exactly (quadrature is exact for polynomials)."""
    x = _x(seed=3)
    prod = stax.serial(stax.Dense(512, W, B), stax.FanOut(2), stax.parallel(stax.Identity(), stax.Identity()),
                       stax.FanInProd(), stax.Dense(1, W, B))
    square = stax.serial(stax.Dense(512, W, B), stax.Monomial(2), stax.Dense(1, W, B))
    got, want = prod[2](x, None, ("nngp", "ntk")), square[2](x, None, ("nngp", "ntk"))
    assert rel(got.nngp, want.nngp) < 1e-10
    assert rel(got.ntk, want.ntk) < 1e-10


def test_relu_and_erf_of_one_preactivation_have_their_closed_form_cross_moment():
    """The issue's second case: parallel(Relu, Erf) on one Dense's output u, summed. Since |u| erf(v) is odd under
    (u, v) -> (-u, -v), E[relu(u) erf(v)] = E[u erf(v)] / 2 = c / sqrt(pi (1 + 2 v_v)) (Stein), and by Price's
    theorem E[relu'(u) erf'(v)] = 1 / sqrt(pi (1 + 2 v_v)); the Relu and Erf kernels come from their own layers."""
    x = _x(seed=4)
    dense = stax.Dense(512, W, B)
    shared = stax.serial(dense, stax.FanOut(2), stax.parallel(stax.Relu(), stax.Erf()), stax.FanInSum(),
                         stax.Dense(1, W, B))
    got = shared[2](x, None, ("nngp", "ntk"))
    h = dense[2](x, None, ("nngp", "ntk"))
    relu = stax.serial(dense, stax.Relu())[2](x, None, ("nngp", "ntk"))
    erf = stax.serial(dense, stax.Erf())[2](x, None, ("nngp", "ntk"))
    c = np.asarray(h.nngp)
    v = np.diag(c)
    root = np.sqrt(np.pi * (1 + 2 * v))
    cross = c / root[None, :] + c / root[:, None]
    cross_dot = 1 / root[None, :] + 1 / root[:, None]
    k_sum = np.asarray(relu.nngp) + np.asarray(erf.nngp) + cross
    ntk_sum = np.asarray(relu.ntk) + np.asarray(erf.ntk) + cross_dot * np.asarray(h.ntk)
    assert rel(got.nngp, _dense(k_sum)) < 1e-10
    assert rel(got.ntk, _dense(k_sum) + W * W * ntk_sum) < 1e-9  # the derivatives' jumps: polar quadrature


def test_repeated_residual_blocks_carry_means_through_the_loop():
    """repeat over a block whose branches end with ReLUs equals the same blocks written out with serial."""
    block = stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), stax.serial(stax.Dense(64, W, B), stax.Relu())),
                        stax.FanInSum())
    head = [stax.Dense(64, W, B), stax.Relu()]
    looped = stax.serial(*head, stax.repeat(block, 3), stax.Dense(1, W, B))
    unrolled = stax.serial(*head, block, block, block, stax.Dense(1, W, B))
    x = _x(seed=5)
    a, b = looped[2](x, None, ("nngp", "ntk")), unrolled[2](x, None, ("nngp", "ntk"))
    assert rel(a.nngp, b.nngp) < 1e-12 and rel(a.ntk, b.ntk) < 1e-12


def test_convolutional_residual_means_in_both_spatial_layouts():
    """Means at every position: the same-position kernel of a conv residual network is the diagonal of its
    all-pairs kernel."""
    x = jnp.asarray(np.random.RandomState(6).normal(size=(3, 5, 4, 2)))
    net = stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=W, b_std=B), stax.Relu(), stax.FanOut(2),
                      stax.parallel(stax.Identity(), stax.serial(stax.Conv(8, (3, 3), padding="SAME", W_std=W,
                                                                           b_std=B), stax.Relu())),
                      stax.FanInSum())
    diag = net[2](x, None, "nngp", diagonal_spatial=True)
    full = net[2](x, None, "nngp")
    from_full = jnp.einsum("abhhww->abhw", full)
    assert rel(diag, from_full) < 1e-12
    # the cross term at each position: m_a(x, p) m_b(x', p) + m_b(x, p) m_a(x', p), m = sqrt(q(x, p) / 2 pi)
    conv = stax.Conv(8, (3, 3), padding="SAME", W_std=W, b_std=B)
    pre_a = stax.serial(conv)
    pre_b = stax.serial(conv, stax.Relu(), conv)
    branch_a = stax.serial(conv, stax.Relu())
    branch_b = stax.serial(conv, stax.Relu(), conv, stax.Relu())

    def k(net_):
        return net_[2](x, None, "nngp", diagonal_spatial=True)

    m_a = jnp.sqrt(jnp.einsum("aahw->ahw", k(pre_a)) / (2 * math.pi))
    m_b = jnp.sqrt(jnp.einsum("aahw->ahw", k(pre_b)) / (2 * math.pi))
    want = (k(branch_a) + k(branch_b) + m_a[:, None] * m_b[None, :] + m_b[:, None] * m_a[None, :])
    assert rel(diag, want) < 1e-10


@pytest.mark.parametrize("layer", [stax.Relu(), stax.LeakyRelu(0.2), stax.Abs(), stax.ABRelu(-0.3, 1.7),
                                   stax.Erf(0.7, 1.3, 0.2), stax.Gelu(), stax.Sin(1.1, 0.8, 0.4), stax.Cos(0.9, 1.2),
                                   stax.Rbf(0.6), stax.Exp(0.8, 0.5), stax.Gabor(), stax.Gaussian(1.3, -0.7),
                                   stax.Sign(), stax.Monomial(3), stax.RectifiedMonomial(0),
                                   stax.RectifiedMonomial(3), stax.Polynomial([0.5, -1.0, 0.25])],
                         ids=lambda l: l.name)
def test_activation_means_against_quadrature(layer):
    """E[phi(u)] of each activation (closed form, or the default quadrature) against the trapezoid rule on a fine
    grid of phi itself times the Gaussian density (second order at a kink: 1e-8 at this spacing)."""
    v = np.asarray([0.05, 0.7, 1.0, 2.3])
    z = np.linspace(-14.0, 14.0, 280_000)  # no node at 0, where a step function jumps
    density = np.exp(-z * z / 2) / np.sqrt(2 * np.pi)
    want = [np.trapezoid(np.asarray(layer.activation(jnp.asarray(np.sqrt(vi) * z))) * density, z) for vi in v]
    got = np.asarray(layer.mean(jnp.asarray(v)))
    assert np.max(np.abs(got - np.asarray(want))) < 1e-7 * (1 + np.max(np.abs(want)))


def test_dependent_branches_that_are_no_function_of_one_gaussian_are_refused():
    """A ReLU beside a layer normalisation of the same pre-activations: dependent, and not both chains of
    activations; refused with the way out rather than computed as if independent."""
    net = stax.serial(stax.Dense(16, W, B), stax.FanOut(2), stax.parallel(stax.Relu(), stax.LayerNorm()),
                      stax.FanInSum())
    with pytest.raises(NotImplementedError, match="same activations.*smnngp.traced"):
        net[2](_x(), None, "nngp")


def test_two_data_branches_are_refused():
    """Two raw inputs summed: the cross term needs the data's channels, not their averages."""
    net = stax.serial(stax.parallel(stax.Identity(), stax.Identity()), stax.FanInSum())
    with pytest.raises(NotImplementedError, match="input data"):
        net[2]([_x(seed=7), _x(seed=8)], None, "nngp")


def test_an_unknown_mean_beside_a_nonzero_one_is_refused():
    """A user layer whose output mean smnngp cannot know, summed with a ReLU branch: refused, naming the layer."""

    @stax.layer
    def Shift():
        def init_fn(key, shape):
            return shape, ()

        def apply_fn(params, x, **kw):
            return x + 1.0

        def kernel_fn(k, **kw):
            return k.replace(nngp=k.nngp + 1.0, cov1=k.cov1 + 1.0, cov2=None if k.cov2 is None else k.cov2 + 1.0)

        return init_fn, apply_fn, kernel_fn

    net = stax.serial(stax.Dense(16, W, B), stax.Relu(), stax.FanOut(2),
                      stax.parallel(stax.serial(stax.Dense(16, W, B), Shift()),
                                    stax.serial(stax.Dense(16, W, B), stax.Relu())), stax.FanInSum())
    with pytest.raises(NotImplementedError, match="unknown mean"):
        net[2](_x(), None, "nngp")


def test_zero_mean_branches_are_unchanged():
    """A pre-activation ResNet block (both branches end with Dense or carry a zero-mean input) has no cross
    terms: its kernel is the sum of the branch kernels, as before."""
    x = _x(seed=9)
    body = stax.serial(stax.Relu(), stax.Dense(32, W, B))
    net = stax.serial(stax.Dense(32, W, B), stax.FanOut(2), stax.parallel(body, stax.Identity()), stax.FanInSum())
    got = net[2](x, None, "nngp")
    k0 = stax.Dense(32, W, B)[2](x, None, "nngp")
    k_body = stax.serial(stax.Dense(32, W, B), body)[2](x, None, "nngp")
    assert rel(got, k0 + k_body) < 1e-12
    assert math.isfinite(float(jnp.sum(got)))


def _dblquad(f, g, c, v1, v2):
    """E[f(u) g(v)] for centred (u, v) with variances v1, v2 and covariance c by adaptive quadrature (scipy), the
    plane cut into quadrants at 0 (where the kinks are)."""
    from scipy import integrate

    cov = np.array([[v1, c], [c, v2]])
    inv, det = np.linalg.inv(cov), np.linalg.det(cov)

    def integrand(v, u):
        q = inv[0, 0] * u * u + 2 * inv[0, 1] * u * v + inv[1, 1] * v * v
        return f(u) * g(v) * math.exp(-q / 2) / (2 * math.pi * math.sqrt(det))

    a, b = 12 * math.sqrt(v1), 12 * math.sqrt(v2)
    return sum(integrate.dblquad(integrand, u0, u1, v0, v1_, epsabs=1e-13, epsrel=1e-11)[0]
               for u0, u1 in ((-a, 0.0), (0.0, a)) for v0, v1_ in ((-b, 0.0), (0.0, b)))


def test_an_activation_after_activations_is_the_chain_integrated_over_one_gaussian():
    """Erf after Relu (which neural-tangents refuses) equals E[erf(relu(u)) erf(relu(v))] by adaptive quadrature;
    Relu after Relu is Relu and Relu after Abs is Abs (NNGP and NTK), exactly."""
    x = _x(seed=10)
    dense = stax.Dense(512, W, B)
    got = stax.serial(dense, stax.Relu(), stax.Erf())[2](x, None, "nngp")
    h = np.asarray(dense[2](x, None, "nngp"))

    def chi(t):
        return math.erf(max(t, 0.0))

    for i, j in ((0, 1), (2, 3), (1, 1)):
        want = _dblquad(chi, chi, h[i, j], h[i, i], h[j, j]) if i != j else _dblquad_diag(chi, h[i, i])
        assert abs(float(got[i, j]) - want) < 1e-9
    for outer, inner in ((stax.Relu(), stax.Relu()), (stax.Relu(), stax.Abs())):
        twice = stax.serial(dense, inner, outer, stax.Dense(1, W, B))[2](x, None, ("nngp", "ntk"))
        once = stax.serial(dense, inner, stax.Dense(1, W, B))[2](x, None, ("nngp", "ntk"))
        assert rel(twice.nngp, once.nngp) < 1e-12 and rel(twice.ntk, once.ntk) < 1e-9


def _dblquad_diag(f, v):
    from scipy import integrate

    a = 12 * math.sqrt(v)
    dens = lambda u: f(u) ** 2 * math.exp(-u * u / (2 * v)) / math.sqrt(2 * math.pi * v)  # noqa: E731
    return integrate.quad(dens, -a, 0.0, epsabs=1e-14)[0] + integrate.quad(dens, 0.0, a, epsabs=1e-14)[0]


def test_an_activation_of_a_product_of_functions_of_one_gaussian():
    """Gelu after FanInProd(Identity, Sin): gelu(u sin u), a chain; against adaptive quadrature of it (an
    oscillating integrand: the polar rule's default 16 x 48 nodes per arc give 1e-6 relative here)."""
    x = _x(seed=11)
    dense = stax.Dense(64, W, B)
    net = stax.serial(dense, stax.FanOut(2), stax.parallel(stax.Identity(), stax.Sin()), stax.FanInProd(),
                      stax.Gelu())
    got = net[2](x, None, "nngp")
    h = np.asarray(dense[2](x, None, "nngp"))

    def chi(t):
        return 0.5 * t * math.sin(t) * (1 + math.erf(t * math.sin(t) / math.sqrt(2)))

    want = _dblquad(chi, chi, h[0, 2], h[0, 0], h[2, 2])
    assert abs(float(got[0, 2]) - want) < 2e-6 * abs(want)


def test_layer_norm_after_relu_centres_by_the_means():
    """LayerNorm after Relu (which neural-tangents refuses): (K - m m') / sqrt((q - m^2)(q' - m'^2)) over the
    channels, with the arc-cosine kernel and the ReLU mean in numpy; after the raw inputs, the kernel of the
    normalised inputs themselves."""
    x = _x(d=6, seed=12)
    net = stax.serial(stax.Dense(512, W, B), stax.Relu(), stax.LayerNorm())
    got = net[2](x, None, "nngp")
    xn = np.asarray(x)
    q0 = _dense(xn @ xn.T / 6)
    k = _arccos_relu(q0)
    m = np.sqrt(np.diag(q0) / (2 * np.pi))
    centred = k - np.outer(m, m)
    sd = np.sqrt(np.diag(centred) + 1e-12)
    assert rel(got, centred / np.outer(sd, sd)) < 1e-10
    raw = stax.LayerNorm()[2](x, None, "nngp")
    z = (xn - xn.mean(1, keepdims=True)) / np.sqrt(xn.var(1, keepdims=True) + 1e-12)
    assert rel(raw, z @ z.T / 6) < 1e-10
