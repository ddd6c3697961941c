"""A graph NNGP telling two families of random graphs apart, written against neural-tangents' API.

Task: graphs of ``M`` nodes with the same number of edges, ``M + CHORDS``, from two families: rings with a few
random chords (label +1; every node has degree 2 or a little more) and uniformly random graphs (label -1; some
nodes isolated, some hubs). Nodes carry no attributes (the usual constant feature 1), so only the
connectivity tells the families apart.

The model is a two-layer graph convolutional network of infinite width: ``Aggregate`` sums each node's
neighbours' features, ``h_i <- sum_j A_ij h_j`` (here ``A`` = adjacency + identity, passed at call time as
``pattern``); for the NNGP this maps the kernel as ``K(i, i') <- sum_{j, j'} A_ij A'_{i'j'} K(j, j')``. An
average over nodes, then two erf layers, give one output per graph. Prediction is the NNGP posterior mean
(``nt.predict.gradient_descent_mse_ensemble``, ``t = None``), with the patterns of training and test graphs passed
as ``pattern=(p, p)`` as neural-tangents expects; the same network without ``Aggregate`` (it sees only the
constant features, so its NNGP is constant) is the baseline, at chance level.

With its two imports changed to neural-tangents', the program runs unchanged under neural-tangents 0.6.5, and the
predictions agree (``tests/test_examples_nt.py``).

Run: ``python docs/examples/nt_graph_nngp.py`` (``SMNNGP_FAST=1``: fewer graphs).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
M, CHORDS, D = 12, 3, 1  # nodes, chords added to the ring, feature channels
N_TRAIN, N_TEST = (48, 48) if FAST else (200, 200)
RESULTS = {}


def ring_with_chords(rs):
    edges = sorted({tuple(sorted((i, (i + 1) % M))) for i in range(M)})
    while len(edges) < M + CHORDS:
        new = tuple(sorted(rs.choice(M, 2, replace=False)))
        if new not in edges:
            edges.append(new)
    return edges


def random_graph(rs):
    pairs = [(i, j) for i in range(M) for j in range(i + 1, M)]
    return [pairs[k] for k in rs.choice(len(pairs), M + CHORDS, replace=False)]


def graphs(rs, n):
    """Features (n, M, D), dense patterns (n, M, M) = adjacency + identity, labels (n, 1)."""
    labels = rs.randint(2, size=n)
    patterns = np.zeros((n, M, M))
    for g, label in enumerate(labels):
        for i, j in (ring_with_chords(rs) if label else random_graph(rs)):
            patterns[g, i, j] = patterns[g, j, i] = 1.0
        patterns[g] += np.eye(M)
    x = np.ones((n, M, D))
    return jnp.asarray(x), jnp.asarray(patterns), jnp.asarray(np.where(labels, 1.0, -1.0)[:, None])


rs = np.random.RandomState(0)
x_train, p_train, y_train = graphs(rs, N_TRAIN)
x_test, p_test, y_test = graphs(rs, N_TEST)


def gcn(aggregate):
    def block():
        layers = [stax.Dense(64, W_std=1.5, b_std=0.1), stax.Relu()]
        return layers + ([stax.Aggregate()] if aggregate else [])

    head = [stax.Dense(64, W_std=1.5, b_std=1.0), stax.Erf(), stax.Dense(64, W_std=1.5, b_std=1.0), stax.Erf(),
            stax.Dense(1, W_std=1.5, b_std=1.0)]
    return stax.serial(*block(), *block(), stax.GlobalAvgPool(), *head)


for name, aggregate in (("gcn", True), ("no_graph", False)):
    _, _, kernel_fn = gcn(aggregate)
    train_kw = dict(pattern=(p_train, p_train)) if aggregate else {}
    test_kw = dict(pattern=(p_test, p_test)) if aggregate else {}
    predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train, diag_reg=1e-3, **train_kw)
    mean = np.asarray(predict_fn(x_test=x_test, get="nngp", **test_kw))
    accuracy = float(np.mean(np.sign(mean) == np.asarray(y_test)))
    RESULTS[f"{name}_pred"] = mean
    RESULTS[f"{name}_accuracy"] = accuracy
    print(f"{name:8s} NNGP: test accuracy {accuracy:.3f}")

# The kernel between the first few training graphs directly, with the pattern of each side.
_, _, kernel_fn = gcn(True)
RESULTS["gcn_nngp_block"] = np.asarray(kernel_fn(x_train[:6], x_train[:4], "nngp", pattern=(p_train[:6], p_train[:4])))
