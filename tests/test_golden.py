"""Kernels against fixtures written by neural-tangents 0.6.5 (scripts/make_golden.sh).

Error measure: max_ij |ours_ij - golden_ij| / max_ij |golden_ij|, for both the
NNGP and the NTK; float64 must agree to 1e-9 and float32 to 1e-4 unless a case
states its own tolerance (quadrature layers; see tests/golden/golden_io.py).
The cases are every ``build_cases`` of tests/golden/cases*.py.
"""

import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax

HERE = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, HERE)
from golden_io import all_cases, load_kwargs, unpack_case  # noqa: E402

CASES = all_cases(stax, jnp)


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def test_fixture_set_is_complete():
    on_disk = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(HERE, "*.npz"))}
    assert on_disk == set(CASES), "regenerate fixtures with scripts/make_golden.sh"
    assert len(CASES) >= 24


# Every case in float64; float32 on every fourth case (in name order, so each family is sampled): a float32 run
# checks dtype handling and the conditioning of the closed forms, which do not differ between neighbouring cases,
# and halving the compilations keeps the default suite within its time budget. `-m slow` runs float32 everywhere.
_F32_SAMPLE = set(sorted(CASES)[::4])
PARAMS = [pytest.param(name, precision, marks=() if precision == "f64" or name in _F32_SAMPLE else pytest.mark.slow)
          for name in sorted(CASES) for precision in ("f64", "f32")]


@pytest.mark.parametrize("name,precision", PARAMS)
def test_matches_neural_tangents(name, precision):
    layer, _, opts = unpack_case(CASES[name])
    dtype = np.float64 if precision == "f64" else np.float32
    tol = opts.get("tol", (1e-9, 1e-4))[0 if precision == "f64" else 1]
    if precision == "f32" and opts.get("f32", True) is False:
        pytest.skip("float32 comparison switched off for this case (see its opts)")
    gold = np.load(os.path.join(HERE, f"{name}.npz"))
    x1 = jnp.asarray(gold["x1"], dtype)
    x2 = jnp.asarray(gold["x2"], dtype) if "x2" in gold else None
    kwargs = load_kwargs(gold, opts)
    static = {k: v for k, v in kwargs.items() if k in opts.get("kwargs", {})}
    arrays = {k: v for k, v in kwargs.items() if k not in static}
    arrays = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype) if np.issubdtype(a.dtype, np.floating)
                                    else jnp.asarray(a), arrays)
    get = None if opts.get("covs") else ("nngp", "ntk")
    kernel_fn = jax.jit(lambda a, b, kw: layer[2](a, b, get, **static, **kw))
    k = kernel_fn(x1, x2, arrays)
    for cov in ("cov1", "cov2"):
        if cov in gold:
            assert getattr(k, cov).shape == gold[cov].shape
            assert rel_err(getattr(k, cov), gold[cov]) <= tol
    assert k.nngp.dtype == dtype and k.ntk.dtype == dtype
    assert k.nngp.shape == gold["nngp"].shape
    assert rel_err(k.nngp, gold["nngp"]) <= tol
    assert rel_err(k.ntk, gold["ntk"]) <= tol


def test_get_variants_agree():
    layer, _ = CASES["cnn2d_same_relu_flatten"]
    gold = np.load(os.path.join(HERE, "cnn2d_same_relu_flatten.npz"))
    x1, x2 = jnp.asarray(gold["x1"]), jnp.asarray(gold["x2"])
    kfn = layer[2]
    full = kfn(x1, x2)
    assert rel_err(full.nngp, gold["nngp"]) < 1e-12
    assert rel_err(kfn(x1, x2, "nngp"), gold["nngp"]) < 1e-12
    assert rel_err(kfn(x1, x2, "ntk"), gold["ntk"]) < 1e-12
    assert rel_err(kfn(x1, x2, ("ntk",)).ntk, gold["ntk"]) < 1e-12


def test_get_order_is_respected_everywhere():
    from smnngp.kernels import batched_kernel_fn, diagonal

    layer, _ = CASES["mlp_erf_ntk"]
    gold = np.load(os.path.join(HERE, "mlp_erf_ntk.npz"))
    x1 = jnp.asarray(gold["x1"])
    k = layer[2](x1, jnp.asarray(gold["x2"]), ("ntk", "nngp"))
    assert k._fields == ("ntk", "nngp") and rel_err(k.ntk, gold["ntk"]) < 1e-12
    tiled = batched_kernel_fn(layer[2], batch_size=3)(gold["x1"], gold["x2"], ("ntk", "nngp"))
    assert tiled._fields == ("ntk", "nngp") and rel_err(tiled.nngp, gold["nngp"]) < 1e-12
    d = diagonal(layer[2], x1, ("ntk", "nngp"))
    assert d._fields == ("ntk", "nngp") and d.nngp.shape == (x1.shape[0],)
