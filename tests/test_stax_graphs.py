"""Graph networks (`smnngp.stax.Aggregate`): the two implementations against each other and against explicit
sums, the finite network's Monte-Carlo NNGP against the kernel, invariances, layouts and errors.

The golden comparison with neural-tangents is tests/test_golden.py -k graph_ (tests/golden/cases_graphs.py).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.empirical import monte_carlo_nngp

jax.config.update("jax_enable_x64", True)

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def edges(seed, n_graphs, node_shape, n_edges, n_pad=0):
    """Random arcs (N, E, K, 2) with a repeated arc and, in odd graphs, ``n_pad`` padding rows (-1)."""
    rng = np.random.RandomState(seed)
    e = np.stack([rng.randint(0, s, size=(n_graphs, n_edges, 2)) for s in node_shape], axis=2)
    e[:, 1] = e[:, 0]
    if n_pad:
        e[1::2, -n_pad:] = -1
    return e


def dense_of(e, node_shape):
    """Arc counts (N, *nodes, *nodes) of edge lists, padding dropped (a loop over arcs: the reference)."""
    out = np.zeros((e.shape[0],) + tuple(node_shape) * 2)
    for g in range(e.shape[0]):
        for arc in e[g]:
            if (arc >= 0).all():
                out[(g,) + tuple(arc[:, 0]) + tuple(arc[:, 1])] += 1.0
    return out


def gcn(width=8, param="ntk", **agg):
    return stax.serial(
        stax.Dense(width, W_std=1.5, b_std=0.2, parameterization=param), stax.Aggregate(**agg), stax.Relu(),
        stax.Dense(width, W_std=1.3, b_std=0.1, parameterization=param), stax.Aggregate(**agg),
        stax.GlobalAvgPool(), stax.Dense(1 if width == 8 else width, W_std=1.1, b_std=0.05,
                                         parameterization=param))


def open_net(**agg):
    return stax.serial(stax.Dense(8, W_std=1.5, b_std=0.2), stax.Aggregate(**agg), stax.Erf(),
                       stax.Dense(8, W_std=1.3, b_std=0.1), stax.Aggregate(**agg))


def jk(layer, get=None):
    """The layer's kernel_fn under one `jit`, patterns as traced arguments (one compilation per shape)."""
    return jax.jit(lambda x1, x2, p: layer[2](x1, x2, get, pattern=p))


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


# ---------------------------------------------------------------------------------------------------------------
# The two implementations, and explicit sums
# ---------------------------------------------------------------------------------------------------------------


def test_golden_twins_agree():
    """neural-tangents itself gives the same kernels for the dense and sparse forms of the same graphs."""
    for dense, sparse in [("graph_gcn_dense", "graph_gcn_sparse"), ("graph_grid_both_dense", "graph_grid_both_sparse"),
                          ("graph_open_covs_dense", "graph_open_covs_sparse")]:
        a, b = np.load(os.path.join(GOLDEN, dense + ".npz")), np.load(os.path.join(GOLDEN, sparse + ".npz"))
        assert rel(b["nngp"], a["nngp"]) < 1e-13 and rel(b["ntk"], a["ntk"]) < 1e-13


@pytest.mark.parametrize("node_shape,agg", [((6,), {}), ((4, 3), {"aggregate_axis": (2, 1)})])
def test_dense_and_sparse_kernels_agree(node_shape, agg):
    """Same graphs, both formats: NNGP, NTK and both covariances equal to rounding (float64)."""
    x_shape = node_shape
    x1 = np.random.RandomState(0).normal(size=(3,) + x_shape + (2,))
    x2 = np.random.RandomState(1).normal(size=(2,) + x_shape + (2,))
    e1, e2 = edges(2, 3, node_shape, 11, 3), edges(3, 2, node_shape, 11, 3)
    kd = jk(open_net(**agg))(x1, x2, (dense_of(e1, node_shape), dense_of(e2, node_shape)))
    ks = jk(open_net(implementation="SPARSE", **agg))(x1, x2, (e1, e2))
    for f in ("nngp", "ntk", "cov1", "cov2"):
        assert rel(getattr(ks, f), getattr(kd, f)) < 1e-13, f
    assert kd.nngp.shape == (3, 2) + tuple(s for n in x_shape for s in (n, n))


@pytest.mark.parametrize("impl", ["DENSE", "SPARSE"])
def test_symmetric_kernel_reads_its_covariances_off_the_nngp(impl):
    """x2=None: each point's full covariance with itself (cov1, node pairs) is the batch diagonal of the NNGP,
    exactly (Aggregate and Relu read it off the new NNGP), and equals what the same network gives with x2=x
    (where both sides' covariances are mapped on their own) to rounding."""
    node_shape = (5,)
    x = np.random.RandomState(10).normal(size=(4,) + node_shape + (3,))
    e = edges(11, 4, node_shape, 9, 2)
    p = e if impl == "SPARSE" else dense_of(e, node_shape)
    net = stax.serial(stax.Dense(8, W_std=1.5, b_std=0.2), stax.Aggregate(implementation=impl), stax.Relu(),
                      stax.Dense(8, W_std=1.3, b_std=0.1), stax.Aggregate(implementation=impl), stax.Relu())
    ks = jk(net)(x, None, (p, p))
    kx = jk(net)(x, x, (p, p))
    diag = np.asarray(ks.nngp)[np.arange(4), np.arange(4)]
    assert ks.cov2 is None and ks.cov1.shape == (4, 5, 5)
    np.testing.assert_array_equal(ks.cov1, diag)
    assert rel(ks.cov1, kx.cov1) < 1e-13 and rel(kx.cov2, kx.cov1) < 1e-13
    assert rel(ks.nngp, kx.nngp) < 1e-13 and rel(ks.ntk, kx.ntk) < 1e-13


def test_apply_fn_is_the_sum_over_predecessors():
    """y[n, j] = sum over arcs (i -> j) of x[n, i], checked by a loop over arcs, for both implementations."""
    x = np.random.RandomState(4).normal(size=(3, 4, 3, 5))
    e = edges(5, 3, (4, 3), 9, 2)
    expect = np.zeros_like(x)
    for g in range(3):
        for arc in e[g]:
            if (arc >= 0).all():
                expect[g, arc[0, 1], arc[1, 1]] += x[g, arc[0, 0], arc[1, 0]]
    dense = stax.Aggregate()[1]((), x, pattern=dense_of(e, (4, 3)))
    sparse = stax.Aggregate(implementation="SPARSE")[1]((), x, pattern=e)
    np.testing.assert_allclose(dense, expect, atol=1e-12)
    np.testing.assert_allclose(sparse, expect, atol=1e-12)
    assert stax.Aggregate()[1]((), x) is x  # pattern=None: identity adjacency


def test_kernel_is_a_transform_by_the_adjacency():
    """One layer on the input kernel: K'[a, b] = A1[a]^T K[a, b] A2[b] with K the inputs' second moments."""
    x1 = np.random.RandomState(6).normal(size=(2, 5, 3))
    x2 = np.random.RandomState(7).normal(size=(3, 5, 3))
    a1, a2 = np.random.RandomState(8).rand(2, 5, 5), np.random.RandomState(9).rand(3, 5, 5)
    k = stax.serial(stax.Dense(4, W_std=1.0), stax.Aggregate())[2](x1, x2, pattern=(a1, a2))
    base = np.einsum("aic,bjc->abij", x1, x2) / 3
    np.testing.assert_allclose(k.nngp, np.einsum("aij,abik,bkl->abjl", a1, base, a2), rtol=1e-12)
    np.testing.assert_allclose(k.cov1, np.einsum("aij,aik,akl->ajl", a1, np.einsum("aic,akc->aik", x1, x1) / 3, a1),
                               rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Finite networks converge to the kernel
# ---------------------------------------------------------------------------------------------------------------


def test_monte_carlo_nngp_approaches_the_kernel():
    """Wide GCN (width 256, 100 draws, each pooled over 256 output channels), finite network aggregating with
    the SPARSE edge lists, kernel from the DENSE adjacency: |MC - K| <= 4 standard errors + 2% of max|K|
    (the O(1/width) finite-width bias)."""
    x = np.random.RandomState(10).normal(size=(4, 6, 3))
    e = edges(11, 4, (6,), 10, 2)
    init_fn, apply_fn, _ = gcn(width=256, implementation="SPARSE")
    k = np.asarray(jk(gcn(width=256), "nngp")(x, None, (dense_of(e, (6,)),) * 2))
    est, se = monte_carlo_nngp(init_fn, functools.partial(apply_fn, pattern=jnp.asarray(e)), x,
                               jax.random.PRNGKey(0), n_draws=100, chunk=50)
    assert np.all(np.abs(est - k) <= 4 * se + 0.02 * np.abs(k).max()), (est, k, se)


# ---------------------------------------------------------------------------------------------------------------
# Invariances and conventions
# ---------------------------------------------------------------------------------------------------------------


def test_relabelling_nodes_permutes_the_kernel():
    """Permuting node labels of features and graphs permutes the node axes of the kernel (and leaves a pooled
    kernel unchanged)."""
    x1, x2 = np.random.RandomState(12).normal(size=(3, 5, 2)), np.random.RandomState(13).normal(size=(2, 5, 2))
    a1, a2 = np.random.RandomState(14).rand(3, 5, 5), np.random.RandomState(15).rand(2, 5, 5)
    perm = np.array([3, 0, 4, 1, 2])
    relabelled = (x1[:, perm], x2[:, perm], (a1[:, perm][:, :, perm], a2[:, perm][:, :, perm]))
    o = jk(open_net(), "nngp")
    np.testing.assert_allclose(o(*relabelled), np.asarray(o(x1, x2, (a1, a2)))[:, :, perm][:, :, :, perm], rtol=1e-12)
    g = jk(gcn(), "ntk")
    np.testing.assert_allclose(g(*relabelled), g(x1, x2, (a1, a2)), rtol=1e-12)


def test_identity_pattern_and_none_agree():
    """pattern=None and (None, None) are the identity adjacency; so is an explicit identity matrix."""
    x = np.random.RandomState(16).normal(size=(3, 5, 2))
    eye = np.broadcast_to(np.eye(5), (3, 5, 5))
    loops = np.stack([np.arange(5)] * 2, -1)[None].repeat(3, 0)  # (3, 5, 2): the arcs i -> i
    ref = gcn()[2](x, None, ("nngp", "ntk"))
    assert gcn()[2](x, None, "nngp", pattern=(None, None)).shape == (3, 3)
    kd, ks = jk(gcn(), ("nngp", "ntk")), jk(gcn(implementation="SPARSE"), ("nngp", "ntk"))
    for k in (kd(x, None, (None, None)), kd(x, None, (eye, eye)), ks(x, None, (loops, loops))):
        np.testing.assert_allclose(k.nngp, ref.nngp, rtol=1e-12)
        np.testing.assert_allclose(k.ntk, ref.ntk, rtol=1e-12)


def test_layout_batch_and_channel_axes():
    """Channels on axis 1 (NCH) give the kernel and the outputs of the default NHC layout."""
    x = np.random.RandomState(17).normal(size=(3, 6, 4))  # N, H, C
    a = np.random.RandomState(18).rand(3, 6, 6)
    nch = stax.Aggregate(aggregate_axis=2, batch_axis=0, channel_axis=1)
    np.testing.assert_allclose(nch[1]((), np.swapaxes(x, 1, 2), pattern=a),
                               np.swapaxes(stax.Aggregate()[1]((), x, pattern=a), 1, 2), rtol=1e-12)
    k_nch = nch[2](np.swapaxes(x, 1, 2), None, "nngp", pattern=(a, a))
    np.testing.assert_allclose(k_nch, stax.Aggregate()[2](x, None, "nngp", pattern=(a, a)), rtol=1e-12)
    e = edges(19, 3, (6,), 7, 1)
    sp = stax.Aggregate(aggregate_axis=-1, batch_axis=0, channel_axis=1,
                        implementation=stax.AggregateImplementation.SPARSE)
    np.testing.assert_allclose(sp[1]((), np.swapaxes(x, 1, 2), pattern=e),
                               np.swapaxes(stax.Aggregate()[1]((), x, pattern=dense_of(e, (6,))), 1, 2), rtol=1e-12)


def test_jit_with_traced_patterns_float32():
    """Patterns as traced arguments of a jitted kernel_fn; float32 follows the inputs' dtype."""
    x = np.random.RandomState(20).normal(size=(3, 5, 2)).astype(np.float32)
    e = edges(21, 3, (5,), 8, 2)
    kf = jax.jit(lambda x, p: gcn(implementation="sparse")[2](x, None, "nngp", pattern=(p, p)))
    kd = jax.jit(lambda x, p: gcn()[2](x, None, "nngp", pattern=(p, p)))
    ks, kdn = kf(x, jnp.asarray(e)), kd(x, jnp.asarray(dense_of(e, (5,)), jnp.float32))
    assert ks.dtype == jnp.float32
    assert rel(ks, kdn) < 1e-5


# ---------------------------------------------------------------------------------------------------------------
# Errors name the layer
# ---------------------------------------------------------------------------------------------------------------


def test_errors_name_the_layer():
    x = np.random.RandomState(22).normal(size=(3, 5, 2))
    a = np.random.RandomState(23).rand(3, 5, 5)
    e = edges(24, 3, (5,), 4)
    with pytest.raises(ValueError, match="Aggregate.*implementation"):
        stax.Aggregate(implementation="CSR")
    with pytest.raises(ValueError, match=r"Aggregate.*pattern must have shape \(3, 5, 5\)"):
        stax.Aggregate()[1]((), x, pattern=a[:, :4])
    with pytest.raises(ValueError, match=r"Aggregate.*pattern2 must have shape \(3, 5, 5\)"):
        stax.Aggregate()[2](x, None, pattern=(a, a[:2]))
    bad = e.copy()
    bad[1, 2, 0, 1] = 5
    with pytest.raises(ValueError, match="Aggregate.*edge 2 of graph 1.*head coordinate 5.*outside 0..4"):
        stax.Aggregate(implementation="SPARSE")[2](x, None, pattern=(bad, bad))
    with pytest.raises(ValueError, match="Aggregate.*integer edge list"):
        stax.Aggregate(implementation="SPARSE")[1]((), x, pattern=e.astype(float))
    with pytest.raises(ValueError, match=r"Aggregate.*\(batch=3, n_edges, 1, 2\)"):
        stax.Aggregate(implementation="SPARSE")[1]((), x, pattern=e[:2])
    with pytest.raises(ValueError, match="Aggregate.*aggregate_axis -1 is the channel axis"):
        stax.Aggregate(aggregate_axis=-1)[2](x, None, pattern=(a, a))
    with pytest.raises(ValueError, match="Aggregate.*aggregate_axis 0 is the batch axis"):
        stax.Aggregate(aggregate_axis=0)[0](jax.random.PRNGKey(0), x.shape)
    with pytest.raises(ValueError, match="Aggregate.*aggregate_axis 3 is out of range"):
        stax.Aggregate(aggregate_axis=3)[1]((), x)
    with pytest.raises(NotImplementedError, match="Aggregate.*exactly one of pattern1, pattern2"):
        stax.Aggregate()[2](x, None, pattern=(a, None))
    with pytest.raises(ValueError, match=r"Aggregate.*pattern=\(pattern1, pattern2\)"):
        stax.Aggregate()[2](x, None, pattern=a)
    with pytest.raises(ValueError, match="Aggregate.*no node axes"):
        stax.serial(stax.Dense(3), stax.Aggregate())[2](x[:, 0], None, pattern=(a, a))
