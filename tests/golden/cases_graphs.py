"""Golden cases of graph networks (`Aggregate`), dense and sparse patterns of the same graphs.

See golden_io.py for the format; this file imports neither library. Every graph and its features are
drawn from a fixed seed per case family (not from the case name), so that a ``_dense`` case and its
``_sparse`` twin aggregate over the same graphs and must give the same kernel
(tests/test_stax_graphs.py checks that on the fixtures).
"""

import numpy as np

GCN_IN = ((3, 5, 2), (2, 5, 2))
GRID_IN = ((3, 4, 3, 2), (2, 4, 3, 2))


def edge_lists(seed, n_graphs, node_shape, n_edges, n_pad):
    """(n_graphs, n_edges, K, 2) integer arcs (tail, head) with repeats; the last ``n_pad`` rows of odd graphs
    are padding (all coordinates -1)."""
    rng = np.random.RandomState(seed)
    k = len(node_shape)
    e = np.stack([rng.randint(0, s, size=(n_graphs, n_edges, 2)) for s in node_shape], axis=2)
    e[:, 1] = e[:, 0]  # a repeated arc (weight 2)
    e[1::2, n_edges - n_pad:] = -1
    assert e.shape == (n_graphs, n_edges, k, 2)
    return e


def to_dense_counts(edges, node_shape):
    """The dense adjacency (N, *nodes, *nodes) of edge lists: arc counts, padding dropped."""
    n = edges.shape[0]
    dense = np.zeros((n,) + tuple(node_shape) * 2)
    for g in range(n):
        for arc in edges[g]:
            if (arc >= 0).all():
                dense[(g,) + tuple(arc[:, 0]) + tuple(arc[:, 1])] += 1.0
    return dense


def graph_inputs(seed, node_shape, n_edges, n_pad, sparse, squeeze=False, same=False):
    """An ``inputs`` hook: normal features and the patterns of two batches of graphs (x2 may be None)."""

    def inputs(rng, shapes):
        rng = np.random.RandomState(1000 + seed)  # the twin cases share their features too
        s1, s2 = shapes
        x1 = rng.normal(size=s1)
        x2 = None if s2 is None else rng.normal(size=s2)
        e1 = edge_lists(seed, s1[0], node_shape, n_edges, n_pad)
        e2 = e1 if s2 is None else edge_lists(seed + 1, s2[0], node_shape, n_edges, n_pad)
        if sparse:
            p1, p2 = (e[:, :, 0, :] if squeeze else e for e in (e1, e2))
        else:
            p1, p2 = to_dense_counts(e1, node_shape), to_dense_counts(e2, node_shape)
        if same:
            p2 = p1
        return x1, x2, {"pattern": (p1, p2)}

    return inputs


def none_inputs(rng, shapes):
    s1, s2 = shapes
    return rng.normal(size=s1), None if s2 is None else rng.normal(size=s2), {"pattern": (None, None)}


def build_cases(stax, jnp):
    S = stax

    def gcn(parameterization="ntk", **agg):
        return S.serial(
            S.Dense(8, W_std=1.5, b_std=0.2, parameterization=parameterization), S.Aggregate(**agg), S.Relu(),
            S.Dense(8, W_std=1.3, b_std=0.1, parameterization=parameterization), S.Aggregate(**agg),
            S.GlobalAvgPool(), S.Dense(1, W_std=1.1, b_std=0.05, parameterization=parameterization))

    def gcn_open(**agg):  # no pooling: the output keeps all pairs of nodes, and its covariances are compared
        return S.serial(S.Dense(8, W_std=1.5, b_std=0.2), S.Aggregate(**agg), S.Erf(),
                        S.Dense(8, W_std=1.3, b_std=0.1), S.Aggregate(**agg))

    def sym(p):  # a to_dense decoder: the undirected graph of a directed one
        return p + jnp.swapaxes(p, 1, 2)

    cases = {}
    for param in ("ntk", "standard"):
        tag = "" if param == "ntk" else "_standard"
        cases[f"graph_gcn{tag}_dense"] = (gcn(param), GCN_IN, {"inputs": graph_inputs(7, (5,), 9, 3, False)})
        cases[f"graph_gcn{tag}_sparse"] = (gcn(param, implementation="SPARSE"), GCN_IN,
                                           {"inputs": graph_inputs(7, (5,), 9, 3, True, squeeze=True)})
    cases["graph_gcn_x2none_dense"] = (gcn(), (GCN_IN[0], None),
                                       {"inputs": graph_inputs(11, (5,), 8, 2, False, same=True)})
    cases["graph_gcn_x2none_sparse"] = (gcn(implementation="SPARSE"), (GCN_IN[0], None),
                                        {"inputs": graph_inputs(11, (5,), 8, 2, True, same=True)})
    cases["graph_gcn_pattern_none"] = (gcn(), GCN_IN, {"inputs": none_inputs})
    cases["graph_gcn_to_dense"] = (gcn(to_dense=sym), GCN_IN, {"inputs": graph_inputs(13, (5,), 6, 1, False)})
    cases["graph_open_covs_dense"] = (gcn_open(), GCN_IN, {"covs": True, "inputs": graph_inputs(17, (5,), 7, 2, False)})
    cases["graph_open_covs_sparse"] = (gcn_open(implementation="SPARSE"), GCN_IN,
                                       {"covs": True, "inputs": graph_inputs(17, (5,), 7, 2, True)})
    # Two spatial axes: the nodes are the (4 x 3) grid positions, or the 4 rows / 3 columns alone.
    cases["graph_grid_both_dense"] = (gcn(), GRID_IN, {"inputs": graph_inputs(19, (4, 3), 10, 3, False)})
    cases["graph_grid_both_sparse"] = (gcn(implementation="SPARSE", aggregate_axis=(1, 2)), GRID_IN,
                                       {"inputs": graph_inputs(19, (4, 3), 10, 3, True)})
    cases["graph_grid_rows_dense"] = (gcn_open(aggregate_axis=1), GRID_IN,
                                      {"inputs": graph_inputs(23, (4,), 6, 2, False)})
    cases["graph_grid_cols_sparse"] = (gcn_open(aggregate_axis=-2, implementation="SPARSE"), GRID_IN,
                                       {"covs": True, "inputs": graph_inputs(29, (3,), 5, 1, True)})
    cases["graph_grid_cols_dense"] = (gcn_open(aggregate_axis=2), GRID_IN,
                                      {"covs": True, "inputs": graph_inputs(29, (3,), 5, 1, False)})
    return cases
