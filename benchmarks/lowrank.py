"""Training-step time of the low-rank Bayesian networks (`finite.lowrank`) against their full-rank and deterministic
twins and against bayesian-torch 0.5, side by side in one run (singular-BNN issue, section 4).

Usage (from the project root)::

    .venv/bin/python benchmarks/lowrank.py [--rounds 3] [--quick] [--skip-torch]

bayesian-torch comes with the ``bench`` extra. Its declared dependencies pull a CUDA build of PyTorch from PyPI;
on a CPU machine install the CPU wheel first (``pip install torch --index-url
https://download.pytorch.org/whl/cpu``), then ``pip install -e ".[bench]"``. Only
``bayesian_torch.layers.LinearReparameterization`` is used.

Problem: the paper's MNIST MLP 784-1200-1200-10 (ReLU), batch 128, float32, random inputs and labels (the step
time does not depend on the data), one weight draw per step shared by the batch, softmax cross-entropy plus
KL / N with N = 50,000, Adam(1e-3). One *step* = forward, loss, gradient and Adam update, as one compiled call
(JAX: one ``jit``; PyTorch: eager, as bayesian-torch is used). Each model runs ``n`` steps after a warm-up and
the time per step is the best of ``--rounds`` (PyTorch and XLA each use all cores).

* ours: deterministic; full-rank mean-field BBB (Gaussian factors, N(0, 1) prior, closed-form KL, as
  bayesian-torch's layers); low-rank (hidden rank 25, output rank 10; the same prior and KL).
  **Targets: low-rank >= 5x faster than full-rank BBB, and within 2x of the deterministic network.**
* bayesian-torch: the same BBB network of ``LinearReparameterization`` layers (prior N(0, 1), posterior
  ``mu ~ N(0, 0.1)``, ``rho = -3``). **Targets: our BBB <= 1.0x bayesian-torch's, our low-rank <= 0.2x.**
* LSTM (the PM2.5 model: 2 layers, H = 64, 24 steps, 15 features, batch 64, ranks 14 / 20): weights drawn once per
  sequence against fresh weights at every time step.

Check before timing (issue 49): every model of ours is checked before it is timed: its compiled step, from the
initial weights with the first step's key, against the same step run op by op (``jax.disable_jit``: no XLA
fusion or reordering; the exact reference of this run): the loss, its gradient and the updated weights, each as
``max |step - ref| / max |ref|`` per array (the largest over the arrays) against ``TOL`` (float32 rounding). A row
above it prints ``WRONG (err ...)`` in place of its time, and every ratio involving it too. bayesian-torch's row is
checked to be the same network (its draws are its own, so its step has no reference): loaded with our BBB
network's initial means and ``rho``, with every ``rho`` set to -100 (standard deviations of 4e-44: the weights are
their means whatever is drawn), its cross-entropy against ours; and its KL at the initial parameters against the
closed form in float64 (``TORCH_TOL``). bayesian-torch 0.5's ``kl_div`` returns the *mean* of the elementwise KL
over each weight and bias tensor, where ours (and Bayes by Backprop) sums it: at the same parameters its KL term is
2.7e-6 of ours (1/376,000) on the MNIST network, so the objectives differ in that term's weight (not in the step's
cost); the check compares each with its own closed form (``kl_ours`` the sum, ``kl_torch`` the per-tensor mean).
When bayesian-torch is not installed (``--skip-torch``) the torch rows are absent and
our rows are still checked.

Prints a table and writes ``benchmarks/results/lowrank.json`` (``--quick``: smaller sizes, targets not judged).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import check, ratio_text, scale_relative_error, tree_scale_relative_error, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "lowrank.json"
RESULTS_QUICK = ROOT / "benchmarks" / "results" / "lowrank-quick.json"
N_TRAIN, BATCH, LR = 50_000, 128, 1e-3
# stated tolerances (float32): compiled step against the op-by-op step, relative to each array's scale
# (weights: Adam's first step moves each weight by about lr * sign(g), so a gradient entry near 0 whose sign
# rounds the other way moves it by 2 lr: 5e-3 of the weights' scale allows that, not a wrong gradient)
TOL = {"loss": 1e-5, "gradient": 1e-3, "params": 5e-3}
# bayesian-torch's objective against ours at the same parameters (float32 sums over 4.8 million weights)
TORCH_TOL = {"kl_ours": 1e-5, "kl_torch": 1e-5, "cross_entropy": 1e-5}


def _best_per_step(step, n: int, rounds: int) -> float:
    step(n)  # warm-up: compilation (JAX) or allocator and kernel selection (PyTorch)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        step(n)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def _training_steps(loss_fn, params, opt, key):
    """``run(n)``: n jitted Adam steps on ``loss_fn(params, key_t)`` with a fresh key per step, continuing from
    the previous call (returns when the last step is done); ``run.check()``: the check of the compiled step
    against the same step op by op (module docstring), from the initial weights with the first step's key."""
    import jax
    import optax

    def step_impl(p, s, k):
        loss, g = jax.value_and_grad(loss_fn)(p, k)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss, g

    compiled = jax.jit(step_impl)

    def step(p, s, k):
        return compiled(p, s, k)[:3]

    state = {"p": params, "s": opt.init(params), "i": 0}

    def check_step():
        args = (params, opt.init(params), jax.random.fold_in(key, 1))
        out = jax.block_until_ready(compiled(*args))
        with jax.disable_jit():
            ref = jax.block_until_ready(step_impl(*args))
        errors = {"loss": scale_relative_error(out[2], ref[2]), "gradient": tree_scale_relative_error(out[3], ref[3]),
                  "params": tree_scale_relative_error(out[0], ref[0])}
        return check(errors, TOL, "the same step op by op (jax.disable_jit), same weights and key")

    def run(n):
        p, s = state["p"], state["s"]
        for _ in range(n):
            state["i"] += 1
            p, s, loss = step(p, s, jax.random.fold_in(key, state["i"]))
        jax.block_until_ready(loss)
        state["p"], state["s"] = p, s

    run.check = check_step
    return run


def ours_mlp_step(sizes, kind: str, ranks):
    """``run(n)`` doing n training steps of our MLP of ``kind`` on random data (returns when they are done)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from finite import lowrank

    model = lowrank.mlp(sizes, kind, rank=ranks if kind == "lowrank" else None, activation="relu")
    key = jax.random.PRNGKey(0)
    params = model.init(key, jnp.float32)
    opt = optax.adam(LR)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(size=(BATCH, sizes[0])), jnp.float32)
    y = jnp.asarray(rng.integers(0, sizes[-1], BATCH))
    prior = lowrank.GaussianPrior(1.0)
    bayes = kind != "deterministic"

    def loss_fn(p, k):
        if bayes:
            logits, kl = model.apply_and_kl(p, x, k, prior=prior, method="exact")
        else:
            logits, kl = model.apply(p, x), 0.0
        ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))
        return ce + kl / N_TRAIN

    return _training_steps(loss_fn, params, opt, key), model.num_params()


def torch_bbb_step(sizes):
    """``run(n)``: n training steps of a bayesian-torch ``LinearReparameterization`` MLP (eager PyTorch)."""
    import numpy as np
    import torch
    from bayesian_torch.layers import LinearReparameterization

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([LinearReparameterization(a, b, prior_mean=0.0, prior_variance=1.0,
                                                           posterior_mu_init=0.0, posterior_rho_init=-3.0)
                                  for a, b in zip(sizes[:-1], sizes[1:])])
    opt = torch.optim.Adam(layers.parameters(), lr=LR)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.uniform(size=(BATCH, sizes[0])), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, sizes[-1], BATCH))

    def forward(net):
        """(logits, summed KL terms) of one draw of ``net``'s weights on ``x``."""
        h, kl = x, 0.0
        for i, layer in enumerate(net):
            h, k = layer(h)
            kl = kl + k
            if i < len(net) - 1:
                h = torch.relu(h)
        return h, kl

    def run(n):
        for _ in range(n):
            h, kl = forward(layers)
            loss = torch.nn.functional.cross_entropy(h, y) + kl / N_TRAIN
            opt.zero_grad()
            loss.backward()
            opt.step()

    def check_objective():
        """bayesian-torch's KL and (at rho = -100) cross-entropy against ours, from our BBB initial parameters."""
        import jax
        import jax.numpy as jnp

        from finite import lowrank

        model = lowrank.mlp(sizes, "bbb", activation="relu")
        params = model.init(jax.random.PRNGKey(0), jnp.float32)
        xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        prior = lowrank.GaussianPrior(1.0)

        def ours(p):
            logits, kl = model.apply_and_kl(p, xj, jax.random.PRNGKey(1), prior=prior, method="exact")
            ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yj[:, None], axis=1))
            return float(ce), float(kl)

        def theirs(p):
            probe = [LinearReparameterization(a, b, prior_mean=0.0, prior_variance=1.0)
                     for a, b in zip(sizes[:-1], sizes[1:])]
            with torch.no_grad():
                for layer, lp in zip(probe, p):
                    layer.mu_weight.copy_(torch.tensor(np.asarray(lp.W.mu).T))
                    layer.rho_weight.copy_(torch.tensor(np.asarray(lp.W.rho).T))
                    layer.mu_bias.copy_(torch.tensor(np.asarray(lp.b.mu)))
                    layer.rho_bias.copy_(torch.tensor(np.asarray(lp.b.rho)))
                h, kl = forward(probe)
                return float(torch.nn.functional.cross_entropy(h, y)), float(kl)

        def closed_form(p):
            """(sum, sum of per-tensor means) of KL(N(mu, softplus(rho)^2) || N(0, 1)), elementwise, float64."""
            total, means = 0.0, 0.0
            for lp in p:
                for mf in (lp.W, lp.b):
                    mu, rho = np.asarray(mf.mu, np.float64), np.asarray(mf.rho, np.float64)
                    sd = np.log1p(np.exp(rho))
                    kl = -np.log(sd) + (sd**2 + mu**2) / 2 - 0.5
                    total, means = total + kl.sum(), means + kl.mean()
            return total, means

        _, kl_ours = ours(params)
        _, kl_theirs = theirs(params)
        kl_sum, kl_means = closed_form(params)
        sharp = [type(lp)(W=lp.W._replace(rho=jnp.full_like(lp.W.rho, -100.0)),
                          b=lp.b._replace(rho=jnp.full_like(lp.b.rho, -100.0))) for lp in params]
        ce_ours, _ = ours(sharp)
        ce_theirs, _ = theirs(sharp)
        errors = {"kl_ours": abs(kl_ours - kl_sum) / kl_sum, "kl_torch": abs(kl_theirs - kl_means) / kl_means,
                  "cross_entropy": abs(ce_theirs - ce_ours) / abs(ce_ours)}
        out = check(errors, TORCH_TOL, "the closed-form KL (sum for ours, per-tensor mean for bayesian-torch) and our "
                    "cross-entropy at the same parameters")
        out["kl_ratio_torch_over_ours"] = kl_theirs / kl_ours
        return out

    run.check = check_objective
    count = sum(p.numel() for p in layers.parameters())
    return run, count


def ours_lstm_step(resample: bool, batch: int = 64, T: int = 24):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from finite import lowrank

    model = lowrank.lstm(15, 64, 1, 2, "lowrank", rank_ih=14, rank_hh=20, resample_per_step=resample)
    key = jax.random.PRNGKey(1)
    params = model.init(key, jnp.float32)
    opt = optax.adam(LR)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, T, 15)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((batch, 1)), jnp.float32)

    def loss_fn(p, k):
        out, kl = model.apply_and_kl(p, x, k)
        return jnp.mean((out - y) ** 2) + kl / 29_213

    return _training_steps(loss_fn, params, opt, key)


def _time_text(row: dict, unit: bool = True) -> str:
    """The row's time per step in ms, or ``WRONG (err ...)`` when its check failed."""
    c = row.get("check")
    if c is not None and not c["ok"]:
        return ratio_text(None, c)
    return f"{1e3 * row['step_s']:.2f}" + (" ms/step" if unit else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke test: a small network, targets not judged")
    ap.add_argument("--skip-torch", action="store_true", help="leave out bayesian-torch")
    args = ap.parse_args(argv)
    sizes = (64, 100, 100, 10) if args.quick else (784, 1200, 1200, 10)
    ranks = (10, 10, 5) if args.quick else (25, 25, 10)
    n = 5 if args.quick else 30
    rounds = 1 if args.quick else args.rounds
    res: dict = {}
    for kind in ("deterministic", "bbb", "lowrank"):
        run, count = ours_mlp_step(sizes, kind, ranks)
        c = run.check()
        res[f"ours_{kind}"] = {"step_s": _best_per_step(run, n, rounds), "params": count, "check": c}
        print(f"ours {kind}: {_time_text(res[f'ours_{kind}'])}, {count:,} parameters", flush=True)
    if not args.skip_torch:
        import torch

        run, count = torch_bbb_step(sizes)
        c = run.check()
        res["torch_bbb"] = {"step_s": _best_per_step(run, n, rounds), "params": count, "check": c,
                            "torch": torch.__version__, "threads": torch.get_num_threads()}
        print(f"bayesian-torch BBB: {_time_text(res['torch_bbb'])}, {count:,} parameters", flush=True)
    for resample in (False, True):
        name = "lstm_resample_per_step" if resample else "lstm_once_per_sequence"
        run = ours_lstm_step(resample, 16 if args.quick else 64)
        c = run.check()
        res[name] = {"step_s": _best_per_step(run, n, rounds), "check": c}
        print(f"{name}: {_time_text(res[name])}", flush=True)

    t = {k: v["step_s"] for k, v in res.items()}
    ck = {k: v.get("check") for k, v in res.items()}
    ratios = {
        "bbb_over_lowrank": (t["ours_bbb"] / t["ours_lowrank"], ">= 5", t["ours_bbb"] / t["ours_lowrank"] >= 5),
        "lowrank_over_deterministic": (t["ours_lowrank"] / t["ours_deterministic"], "<= 2",
                                       t["ours_lowrank"] / t["ours_deterministic"] <= 2),
    }
    if "torch_bbb" in t:
        ratios["ours_bbb_over_torch_bbb"] = (t["ours_bbb"] / t["torch_bbb"], "<= 1.0",
                                             t["ours_bbb"] / t["torch_bbb"] <= 1)
        ratios["ours_lowrank_over_torch_bbb"] = (t["ours_lowrank"] / t["torch_bbb"], "<= 0.2",
                                                 t["ours_lowrank"] / t["torch_bbb"] <= 0.2)
    ratios["lstm_resample_over_once"] = (t["lstm_resample_per_step"] / t["lstm_once_per_sequence"], "", None)
    rows_of = {"bbb_over_lowrank": ("ours_bbb", "ours_lowrank"),
               "lowrank_over_deterministic": ("ours_lowrank", "ours_deterministic"),
               "ours_bbb_over_torch_bbb": ("ours_bbb", "torch_bbb"),
               "ours_lowrank_over_torch_bbb": ("ours_lowrank", "torch_bbb"),
               "lstm_resample_over_once": ("lstm_resample_per_step", "lstm_once_per_sequence")}
    print("\n| model | ms/step | parameters | check: errors (tolerances): loss, gradient, weights; torch: our KL, "
          "its KL, cross-entropy |\n|---|---|---|---|")
    for k, v in res.items():
        c = v.get("check")
        cell = "not checked" if c is None else ", ".join(f"{e:.1e}" for e in c["errors"].values()) + \
            f" ({', '.join(f'{x:.0e}' for x in c['tolerances'].values())})"
        print(f"| {k} | {_time_text(v, unit=False)} | {v.get('params', '')} | {cell} |")
    print("\n| ratio | value | target |\n|---|---|---|")
    judged = {}
    for k, (v, target, ok) in ratios.items():
        checks = [ck.get(r) for r in rows_of[k]]
        right = all(c is None or c["ok"] for c in checks)
        mark = "" if args.quick or ok is None or not right else (" ✓" if ok else " ✗")
        print(f"| {k} | {ratio_text(v, *checks, fmt='{:.3f}')} | {target}{mark} |")
        judged[k] = {"value": v if right else None, "target": target, "met": ok if right else None}
    write_results(RESULTS_QUICK if args.quick else RESULTS,
                  {"quick": args.quick, "sizes": sizes, "ranks": ranks, "batch": BATCH, "tolerances": TOL,
                   "results": res, "ratios": judged})
    return 0


if __name__ == "__main__":
    sys.exit(main())
