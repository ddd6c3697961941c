"""Differential kernel tester (issue 49, part 1): generated networks, two engines, Monte Carlo.

For each network drawn from the grammar in tests/_kernel_grammar.py (Dense, activations, residual FanOut /
parallel / FanInSum / FanInProd / FanInConcat blocks, LayerNorm, a Dense(1) read-out):

1. where `smnngp.stax` and `smnngp.traced` (on the same network written in plain JAX) both accept it, their NNGP and
   NTK agree to 1e-8 relative to the largest entry (1e-3 where either side may integrate by quadrature:
   paired functions of one Gaussian, chained activations, or traced reporting ElementwiseNumerical);
2. every accepted NNGP agrees with Monte Carlo of its own finite network (stax's init_fn / apply_fn, or traced's
   where stax refuses) entrywise within 5 standard errors (estimated from the per-draw kernels) plus 2 % of the
   largest diagonal entry (finite-width bias);
3. a refusal is a ValueError / NotImplementedError / TracedError with a message; any other exception fails.

This is the fast CI profile (a few derandomised Hypothesis examples and fixed combinator networks, width 256,
200 draws of 32 read-out channels: about 35 s on 2 cores with an empty compilation cache, 25 s with a warm one);
`python scripts/kernel_audit.py --networks N --seed S` is the long run. The z-test's power: an error of about 20 %
of the kernel or more is caught; quadrature gaps (1e-3) are caught only by the stax-vs-traced comparison.
"""

from __future__ import annotations

import random

import pytest

hypothesis = pytest.importorskip("hypothesis")
import _kernel_grammar as g  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

X = g.inputs()
FAST = dict(width=256, draws=200)
PROFILE = settings(max_examples=4, derandomize=True, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))


@st.composite
def networks(draw, **kw):
    return g.draw_spec(g.Chooser(draw=draw), **kw)


@st.composite
def mlps(draw):
    return g.draw_mlp(g.Chooser(draw=draw))


def _check(spec):
    rec = g.audit_one(spec, X, seed=0, **FAST)
    print(rec["spec"], "| stax", rec["stax_status"], "| traced", rec["traced_status"])  # shown with -s
    assert not g.failures(rec), (rec["spec"], g.failures(rec))
    return rec


@PROFILE
@given(networks(max_blocks=3))
def test_generated_networks_agree_or_are_refused_clearly(spec):
    _check(spec)


@settings(PROFILE, max_examples=2)
@given(mlps())
def test_closed_form_mlps_agree_across_engines_and_with_monte_carlo(spec):
    rec = _check(spec)
    assert rec["stax_status"] == rec["traced_status"] == "accepted", rec
    assert not rec["diff"]["quadrature"] and rec["diff"]["nngp_rel"] <= 1e-8


# Hypothesis' few derandomised examples favour short chains; these cover the combinators on every run.
FIXED = {
    "sum-relu-relu": (("dense", 1.3, 0.1), ("res", "sum", ("act", ("relu",)), ("act", ("relu",))), ("dense", 1.0, 0.0)),
    "resnet-block": (("dense", 1.2, 0.1), ("res", "sum", ("id",), ("dense_act", 1.5, 0.2, ("relu",))),
                     ("dense", 1.0, 0.0)),
    "prod-erf-sin": (("dense", 1.0, 0.0), ("res", "prod", ("dense_act", 1.4, 0.1, ("erf",)),
                                            ("dense_act", 0.9, 0.0, ("sin",))), ("dense", 1.0, 0.1)),
    "concat-relu-gelu": (("dense", 1.0, 0.2), ("res", "concat", ("dense_act", 1.4, 0.1, ("relu",)),
                                                ("dense_act", 1.1, 0.0, ("gelu",))), ("dense", 1.0, 0.0)),
    "relu-layernorm": (("dense", 1.5, 0.3), ("act", ("relu",)), ("layernorm",), ("dense", 1.0, 0.0)),
    # found by scripts/kernel_audit.py --networks 100 --seed 0 (networks 89 and 75), see the marks below
    "prod-id-sin-gelu": (("dense", 1.652, 0.0), ("dense", 0.724, 0.434), ("res", "prod", ("id",), ("act", ("sin",))),
                         ("act", ("gelu",)), ("dense", 0.835, 0.329)),
    # scripts/kernel_audit.py --seed 1, network 21 (see below)
    "ln-sum-abrelu-abs": (("dense", 1.233, 0.0), ("layernorm",),
                          ("res", "sum", ("dense_act", 0.625, 0.0, ("abrelu", 0.345, 1.319)),
                           ("dense_act", 1.265, 0.079, ("abs",))), ("dense", 1.805, 0.255)),
}


# Found by this tester and fixed since (issue 49): stax's FanInSum paired relu(h) + relu(h) by 32-node Gauss-Hermite
# quadrature, 4.4e-3 off on the NTK against the closed form ABRelu(0, 2) (now polar quadrature split at the kinks:
# 1e-14); stax applied Gelu's Gaussian closed form to h sin(h) after FanInProd(Identity, Sin), NNGP[0, 0] 0.458
# against 0.712 (now the chain gelu(h sin h) integrated over h). Both networks stay in FIXED as regressions.
# traced's kernel of LayerNorm after a chain it integrated by quadrature (|sin h|, a function with a mean) was off:
# NNGP[0, 1] 0.131 against 0.213 (4e6 Gaussian draws); with Abs (closed form) the same LN was right. The centring
# was right; its numbers were not: 32-node Gauss-Hermite put E|sin u| at 0.645 against 0.628 (a kink at 0), and the
# centred covariance E[phi phi'] - m m' (0.2035 - 0.2012) keeps 1 % of each term. The same network showed traced's
# 32-node Gauss-Hermite of gelu(h sin h): NNGP[0, 0] 0.7077, NTK[0, 0] 4.090, where stax's polar rule gave
# 0.71203 / 3.7926 and 64 x 128 polar nodes 0.71202 / 3.7957. Both fixed since: traced integrates every function
# without a closed form by stax's polar / split rules (LN NNGP[0, 1] 0.2157 at the default nodes, 0.2141 at
# quadrature_degree=256; the exact value, from one-dimensional adaptive quadrature, is 0.2143). The networks stay as
# regressions: "prod-id-sin-gelu" in FIXED, "sin-abs" below.
# Seed 1, network 21 of scripts/kernel_audit.py (LayerNorm, then a residual sum of ABRelu and Abs of two layers):
# traced's cross term of the two branches (two different activations) was 32-node Gauss-Hermite, 5.4e-3 off the
# reference where stax was within 2.5e-4; and `mean(h ** 2)` in the LayerNorm, computed exactly as a second moment,
# was reported as a quadrature activation, which loosened this comparison to 1e-3. Now 1e-15, compared at 1e-8.
MARKS: dict = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS[n]) if n in MARKS else n for n in sorted(FIXED)])
def test_fixed_combinator_networks(name):
    _check(FIXED[name])


@pytest.mark.parametrize("chain", [
    pytest.param((("sin",), ("abs",)), id="sin-abs"),
    pytest.param((("abs",),), id="abs"),
    pytest.param((("relu",),), id="relu"),
])
def test_layernorm_after_an_activation_against_gaussian_draws(chain):
    """Dense > chain > LayerNorm > Dense: the exact NNGP is an integral over the first layer's Gaussian
    pre-activations, estimated here from 1e6 draws of them (standard error under 1e-3); this oracle is sharper than
    Monte Carlo of the finite network, which missed the sin-abs gap at width 256 and 200 draws (3.2 se)."""
    import numpy as np

    w1, b1, w2, b2 = 1.182, 0.313, 1.497, 0.374
    spec = (("dense", w1, b1),) + tuple(("act", a) for a in chain) + (("layernorm",), ("dense", w2, b2))
    x = np.asarray(X)
    cov = w1 ** 2 * x @ x.T / x.shape[1] + b1 ** 2
    u = np.random.default_rng(0).standard_normal((1_000_000, x.shape[0])) @ np.linalg.cholesky(cov).T
    for a in chain:
        u = np.asarray(g.ACTS[a[0]][1](*a[1:])(u))
    c = np.cov(u, rowvar=False)
    want = w2 ** 2 * c / np.sqrt(np.outer(np.diag(c), np.diag(c))) + b2 ** 2
    status, val = g.traced_kernel(spec, X)
    assert status == "accepted", val
    np.testing.assert_allclose(val[0], want, atol=0.01)


def test_refusal_is_clear():
    # an activation after a layer normalisation of ReLUs: not Gaussian, and no function of one Gaussian (the
    # normalisation depends on the point); stax refuses it with a message
    spec = (("dense", 1.0, 0.1), ("act", ("relu",)), ("layernorm",), ("act", ("erf",)), ("dense", 1.0, 0.0))
    status, msg = g.stax_kernel(spec, X)
    assert status == "refused" and "Gaussian" in msg, msg


def test_z_check_flags_a_wrong_kernel():
    spec = (("dense", 1.5, 0.2), ("act", ("relu",)), ("dense", 1.0, 0.0))
    status, (nngp, _) = g.stax_kernel(spec, X)
    samples = g.mc_stax(spec, X, width=128, draws=200, seed=3)
    assert g.z_check(nngp, samples)[0]
    assert not g.z_check(1.2 * nngp, samples)[0]   # a 20 % error is caught


def test_fixed_seed_grammar_is_reproducible():
    a = g.draw_spec(g.Chooser(random.Random(7)))
    b = g.draw_spec(g.Chooser(random.Random(7)))
    assert a == b and g.describe(a)


def test_empirical_ntk_of_a_generated_mlp():
    """The NTK against the mean empirical NTK of the finite network (no per-draw error bars: 5 % of the largest
    entry; the finite-width NTK concentrates, its spread at width 256 and 16 draws is about 1 %)."""
    import jax

    from smnngp.empirical import monte_carlo_kernel_fn

    spec = g.draw_mlp(g.Chooser(random.Random(11)))
    status, (_, ntk) = g.stax_kernel(spec, X)
    assert status == "accepted"
    init_fn, apply_fn, _ = g.to_stax(spec, width=256)
    mc = monte_carlo_kernel_fn(init_fn, apply_fn, jax.random.PRNGKey(5), 16, implementation=2)
    emp = mc(X, None, "ntk")
    assert g.rel_err(emp, ntk) < 0.05, (g.describe(spec), g.rel_err(emp, ntk))
