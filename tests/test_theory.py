"""experiments.theory: the quick run end to end, and the finite-width readout closed form against gradient descent."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import theory
from experiments.__main__ import main
from smnngp import stax


def test_quick_run_writes_ks_per_cell(tmp_path):
    assert main(["theory", "--quick", "--out", str(tmp_path), "--seed", "0"]) == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    res = payload["results"]
    cells = res["cells"]
    widths = res["widths"]
    assert payload["config"]["quick"] is True and widths == [64, 256]
    for c in cells:
        assert math.isfinite(c["ks"]) and 0 < c["ks"] < 1 and 0 <= c["p"] <= 1, c
    main_a = {"init": 2.0, "readout": 2.0, "full": 1.0}  # the paper's a = b per theorem
    main_cells = {(c["mode"], c["width"]): c for c in cells if c["arch"] == "mlp" and c["a"] == main_a[c["mode"]]}
    assert set(main_cells) == {(m, w) for m in ("init", "readout", "full") for w in widths}
    # Thm 3.1: at initialisation a finite network's output given its hidden weights is exactly a scaled t, and the
    # scale Kbar_n(x*, x*) concentrates fast: the samples pass KS and the Rao-Blackwellised distance is tiny.
    init = main_cells[("init", widths[-1])]
    assert init["p"] > 1e-3
    assert init["rb_ks"] < 0.01
    # Thm 3.2: the readout-trained law approaches its limit (slowly: the NNGP Gram is ill-conditioned)
    assert main_cells[("readout", 256)]["rb_ks"] < main_cells[("readout", 64)]["rb_ks"]
    # the limits come from smnngp.predict; init's scale is sqrt(Kbar(x*, x*)), the same for every a
    assert init["limit"]["loc"] == 0.0 and init["limit"]["df"] == 4.0
    full = main_cells[("full", 256)]
    assert full["limit"]["df"] == 2.0 and full["residual_median"] < 1e-2 and full["diverged"] == 0
    assert res["trend"]["init"]["ks"] == [main_cells[("init", w)]["ks"] for w in widths]
    md = (tmp_path / "results.md").read_text()
    assert "W_std = 2.828" in md and "| mode | width |" in md
    for fig in payload["figures"]:
        assert (tmp_path / fig).stat().st_size > 1000
    assert len(list((tmp_path / "cells").glob("*.npz"))) == 4  # 2 network sets + 2 full-training cells


def test_cells_are_reused_only_with_the_same_settings(tmp_path):
    cells = theory._Cells(str(tmp_path), dict(seed=0), fresh=False)
    first, _ = cells.get("c", dict(n=3), lambda: dict(v=np.arange(3.0)))

    def fail():
        raise AssertionError("recomputed a saved cell")

    again, loaded = cells.get("c", dict(n=3), fail)
    assert loaded and np.array_equal(again["v"], first["v"])
    _, loaded = cells.get("c", dict(n=4), lambda: dict(v=np.zeros(4)))
    assert not loaded
    _, loaded = theory._Cells(str(tmp_path), dict(seed=1), fresh=False).get("c", dict(n=4), lambda: dict(v=np.ones(4)))
    assert not loaded


def test_readout_closed_form_matches_gradient_descent():
    """Train only the readout of a tiny net by explicit GD; it converges to `readout_limit`."""
    width = 32
    rs = np.random.RandomState(0)  # 3-D inputs and a milder scale than the experiment's: a Gram GD can solve
    x, x_te = rs.normal(size=(5, 3)), rs.normal(size=(1, 3))
    y = rs.normal(size=(5, 1))
    hidden, full = theory.network(stax, "mlp", width, 1.5)
    _, params = full[0](jax.random.PRNGKey(4), x.shape)
    x_all = jnp.asarray(np.concatenate([x, x_te]))
    phi = hidden[1](params[0], x_all) / math.sqrt(width)
    phi_tr, phi_te = phi[:5], phi[5:]
    sigma_v = 1.3
    v0 = params[1][0][:, 0]

    def f(v, xx_phi):
        return sigma_v * xx_phi @ v

    def loss(v):
        return 0.5 * jnp.mean((f(v, phi_tr) - y[:, 0]) ** 2)

    gram = sigma_v**2 * np.asarray(phi_tr @ phi_tr.T)
    lam = np.linalg.eigvalsh(gram)
    lr = 5.0 / lam[-1]
    steps = int(40 * lam[-1] / lam[0])
    assert steps < 200_000, lam
    opt = optax.sgd(lr)

    @jax.jit
    def train(v):
        def body(_, carry):
            v, state = carry
            updates, state = opt.update(jax.grad(loss)(v), state, v)
            return optax.apply_updates(v, updates), state

        return jax.lax.fori_loop(0, steps, body, (v, opt.init(v)))[0]

    v = train(v0)
    assert float(jnp.max(jnp.abs(f(v, phi_tr) - y[:, 0]))) < 1e-8  # converged
    closed = theory.readout_limit(phi_tr, phi_te, v0, jnp.asarray(y[:, 0]), sigma_v)
    np.testing.assert_allclose(np.asarray(f(v, phi_te)), np.asarray(closed), atol=1e-7)
    # and the formula is not trivially the GD start: training moved the test output
    assert abs(float(f(v0, phi_te)[0]) - float(closed[0])) > 1e-3
