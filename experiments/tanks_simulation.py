"""Free-run simulation of the Cascaded Tanks with a sparse Bayesian (group-ARD) NARX network: the sparse-Bayes
paper's Table 3 and Figure 4 (section 5.0.3; notes sections 3.3, 4.2), with Laplace and HMC predictive bands.

Protocol (``honest``, the default; `experiments.tanks`):

* network 3 x 10 (ReLU), lags 19 (39 regressors); Algorithm 1 (`finite.ard.fit_repeats`: all repeats of one
  setting in one compiled program) with ``--rounds`` x ``--epochs`` full-batch Adam steps, cosine-annealed;
* a grid of groupings (``--groups``) and ``lambda`` (``--lams``) is trained on the first ``1024 - validation``
  estimation samples; every repeat chooses its (grouping, lambda, round) by the free-run RMSE on the held-out
  ``validation`` samples; the chosen setting is then refitted on the whole estimation record with the same
  initial weights and stopped at the chosen round;
* our addition: the refitted network fine-tuned on the free-run error of the estimation record
  (`finite.ard.finetune_simulation`, fixed settings, no selection);
* simulated on the test record from its first 19 measured outputs; RMSE over all 1,024 samples (the paper's
  Eq. 17, the first 19 being measured) and over the 1,005 simulated ones;
* baselines on the same protocol: the conventional group lasso (``omega = 1``, magnitude pruning) and the
  unregularised network; the paper's literature rows are printed beside;
* uncertainty: the Laplace posterior of the first repeat's network (`finite.ard.laplace`) and an HMC run of the
  same group-ARD prior with inverse-gamma hyper-priors (`samplers.ard.sample`), each giving a 95 % band of the
  free run, its coverage of the test record and the sampled sparsity.

``--protocol test-selected`` adds the paper's choice: the grid trained on the whole estimation record, each
repeat's setting and round chosen by the test RMSE itself (reported separately; it is not a generalisation
estimate).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from experiments import report, tanks
from experiments.report import Report, markdown_table

DESCRIPTION = "sparse Bayesian NARX network, free-run simulation of the Cascaded Tanks (sparse-Bayes paper Table 3)"
LAG = 19
SINGLE_THREADED_EIGEN = True  # see experiments.__main__._single_threaded_eigen
SIZES = (2 * LAG + 1, 10, 10, 10, 1)


def add_arguments(parser):
    parser.add_argument("--repeats", type=int, default=20, help="repeats (initial weights) per setting (paper 20)")
    parser.add_argument("--lams", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2], help="lambda grid")
    parser.add_argument("--groups", nargs="+", default=["row+column", "shape"], help="group structures to select from")
    parser.add_argument("--rounds", type=int, default=10, help="outer rounds of Algorithm 1 (T_max)")
    parser.add_argument("--epochs", type=int, default=1000, help="full-batch epochs per round")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="Adam learning rate (cosine-annealed)")
    parser.add_argument("--hessian", default="exact", help="Hessian option of finite.ard (exact, gauss-newton, ...)")
    parser.add_argument("--validation", type=int, default=256, help="held-out estimation samples for selection")
    parser.add_argument("--finetune-epochs", type=int, default=100,
                        help="free-run fine-tuning epochs (0: none); 100 was chosen on the validation part "
                             "(scripts/tanks_finetune_study.py)")
    parser.add_argument("--finetune-lr", type=float, default=1e-3, help="fine-tuning learning rate")
    parser.add_argument("--finetune-clip", type=float, default=1.0,
                        help="global-norm clip of the fine-tuning gradient (0: none); the iterate of the lowest "
                             "estimation-record loss is kept")
    parser.add_argument("--protocol", choices=["honest", "test-selected"], default="honest",
                        help="test-selected also runs the paper's selection on the test record (reported apart)")
    parser.add_argument("--laplace-draws", type=int, default=200, help="Laplace posterior draws for the band")
    parser.add_argument("--hmc-chains", type=int, default=2)
    parser.add_argument("--hmc-warmup", type=int, default=300)
    parser.add_argument("--hmc-samples", type=int, default=200)
    parser.add_argument("--no-hmc", action="store_true", help="skip the HMC run")


def _fit_grid(args, data, keys, method, group, lam, evaluate_record, log):
    """One (method, grouping, lambda) setting for every repeat: validation (or test) free-run RMSE per round."""

    from finite import ard

    model = ard.mlp(SIZES)
    u, y = data
    Z, t = ard.narx_regressors(u, y, LAG)
    ue, ye = (np.asarray(a) for a in evaluate_record)

    def evaluate(p):
        s = ard.simulate(model, p, ue, ye, LAG)
        return {"sim": ard.simulation_rmse(s, ye, LAG, include_initial=False),
                "sim_all": ard.simulation_rmse(s, ye, LAG)}

    config = _config(args, method, group)
    t0 = time.perf_counter()
    res = ard.fit_repeats(model, keys, Z, t, config, lam=lam, evaluate=evaluate, vectorize=False,
                          progress=tanks.round_log(log, len(keys)))
    sim = np.asarray(res.metrics["sim"])
    frac = np.asarray([[float(ard.fraction_remaining(tuple(m[r, k] for m in res.state.masks)))
                        for k in range(config.rounds)] for r in range(len(keys))])
    log(f"  {method} {group} lambda={lam:g}: {time.perf_counter() - t0:.0f} s, median best-round RMSE "
        f"{np.nanmedian(np.nanmin(np.where(np.isfinite(sim), sim, np.nan), axis=1)):.3f}")
    return {"sim": sim.tolist(), "sim_all": np.asarray(res.metrics["sim_all"]).tolist(), "frac": frac.tolist(),
            "train_rmse": np.sqrt(np.asarray(res.train_mse)).tolist()}


def _config(args, method, group):
    from finite import ard

    if method == "none":
        return ard.ArdConfig(group="element", penalty="none", rounds=args.rounds, epochs=args.epochs,
                             learning_rate=args.learning_rate)
    return ard.ArdConfig(group=group, penalty="lasso", reweight=(method == "ours"), rounds=args.rounds,
                         epochs=args.epochs, learning_rate=args.learning_rate, hessian=args.hessian)


def _settings(args, method):
    if method == "none":
        return [("none", 0.0)]
    return [(g, lam) for g in args.groups for lam in args.lams]


def _select(grid, settings, repeats):
    """Per repeat: the (setting index, round) with the lowest finite score."""
    choice = []
    for r in range(repeats):
        best = (np.inf, None, None)
        for i, s in enumerate(settings):
            sc = np.asarray(grid[s]["sim"], dtype=float)[r]
            sc = np.where(np.isfinite(sc), sc, np.inf)
            k = int(np.argmin(sc))
            if sc[k] < best[0]:
                best = (float(sc[k]), i, k)
        if best[1] is None:  # every round diverged: take the last round of the first setting
            best = (np.inf, 0, -1)
        choice.append(best)
    return choice


def _refit(args, split, keys, method, settings, choice, log):
    """Refit each repeat's chosen setting on the whole estimation record; fine-tune; simulate the test record."""
    import jax
    import jax.numpy as jnp

    from finite import ard

    model = ard.mlp(SIZES)
    Z, t = ard.narx_regressors(*split.est, LAG)
    ut, yt = (np.asarray(a) for a in split.test)
    ue, ye = (np.asarray(a) for a in split.est)
    out = [None] * len(choice)
    for group in dict.fromkeys(s[0] for s in settings):
        idx = [r for r, c in enumerate(choice) if settings[c[1]][0] == group]
        if not idx:
            continue
        lams = jnp.asarray([settings[choice[r][1]][1] for r in idx])
        res = ard.fit_repeats(model, keys[np.asarray(idx)], Z, t, _config(args, method, group), lam=lams,
                              vectorize=False)
        for j, r in enumerate(idx):
            k = choice[r][2] % args.rounds
            params = jax.tree_util.tree_map(lambda a: a[j, k], res.params)
            state = jax.tree_util.tree_map(lambda a: a[j, k], res.state)
            sim = np.asarray(ard.simulate(model, params, ut, yt, LAG))
            cell = {"setting": list(settings[choice[r][1]]), "round": int(k) % args.rounds,
                    "frac": float(ard.fraction_remaining(state.masks)),
                    "test": float(ard.simulation_rmse(sim, yt, LAG)),
                    "test_excl": float(ard.simulation_rmse(sim, yt, LAG, include_initial=False)),
                    "sim": sim.tolist(), "sigma2": float(state.sigma2)}
            if args.finetune_epochs > 0:
                tuned, losses = ard.finetune_simulation(model, params, state.masks, ue, ye, LAG,
                                                        epochs=args.finetune_epochs, learning_rate=args.finetune_lr,
                                                        clip_norm=args.finetune_clip or None, keep_best=True)
                sim_ft = np.asarray(ard.simulate(model, tuned, ut, yt, LAG))
                cell.update({"test_ft": float(ard.simulation_rmse(sim_ft, yt, LAG)),
                             "test_ft_excl": float(ard.simulation_rmse(sim_ft, yt, LAG, include_initial=False)),
                             "sim_ft": sim_ft.tolist(), "finetune_final_loss": float(losses[-1]),
                             "finetune_best_loss": float(np.nanmin(np.asarray(losses)))})
                params = tuned
            if r == 0:
                cell["params"] = jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), params)
                cell["masks"] = [np.asarray(m).tolist() for m in state.masks]
                cell["upsilon"] = [np.asarray(v).tolist() for v in state.upsilon]
            out[r] = cell
        log(f"  refit {method} {group}: repeats {idx}")
    return out


def _band(sims, y, lag):
    """95 % band of the free runs that stayed finite (a draw whose free run diverges is dropped and counted)."""
    from experiments import metrics

    ok = np.all(np.isfinite(sims), axis=1) & np.all(np.abs(sims) < 1e6, axis=1)
    out = {"diverged": int(np.sum(~ok)), "draws_total": int(sims.shape[0])}
    if not np.any(ok):
        return {**out, "coverage": float("nan"), "mpiw": float("nan"), "rmse_of_mean": float("nan"),
                "rmse_per_draw_median": float("nan"), "lo": np.full(y.size, np.nan).tolist(),
                "hi": np.full(y.size, np.nan).tolist()}
    s = sims[ok]
    lo, hi = np.percentile(s, [2.5, 97.5], axis=0)
    return {**out, "coverage": metrics.coverage(y[lag:], lo[lag:], hi[lag:]), "mpiw": metrics.mpiw(lo[lag:], hi[lag:]),
            "rmse_of_mean": float(np.sqrt(np.mean((s.mean(0) - y)[lag:] ** 2))),
            "rmse_per_draw_median": float(np.median(np.sqrt(np.mean((s - y)[:, lag:] ** 2, axis=1)))),
            "lo": lo.tolist(), "hi": hi.tolist()}


LAPLACE_BANDS = {"network": "joint over all layers, one-step Gauss-Newton",
                 "layer": "per layer (the paper's Eq. 22), Gauss-Newton blocks drawn independently",
                 "simulation": "joint, Gauss-Newton of the free-run (output-error) likelihood"}


def _uncertainty(args, split, first, log):
    """Laplace bands of repeat 0's network on the test record (:data:`LAPLACE_BANDS`): the joint posterior of all
    layers under the one-step likelihood, the paper's per-layer posteriors (Eq. 22) drawn independently, and the
    joint posterior under the free-run likelihood of the estimation record (`finite.ard.laplace_simulation`, the
    likelihood the fine-tuned network was last trained on)."""
    import jax
    import jax.numpy as jnp

    from experiments import metrics
    from finite import ard

    model = ard.mlp(SIZES)
    params = tuple(ard.Layer(jnp.asarray(p[0]), jnp.asarray(p[1])) for p in first["params"])
    masks = tuple(jnp.asarray(m) for m in first["masks"])
    state = ard.ArdState((), tuple(jnp.asarray(v) for v in first["upsilon"]), masks, jnp.asarray(first["sigma2"]))
    Z, t = ard.narx_regressors(*split.est, LAG)
    ue, ye = (jnp.asarray(a) for a in split.est)
    ut, yt = (jnp.asarray(a) for a in split.test)
    cells = {}
    y = np.asarray(yt)
    sigma2_sim = float(jnp.mean((ard.simulate(model, params, ue, ye, LAG)[LAG:] - ye[LAG:]) ** 2))
    for structure in LAPLACE_BANDS:
        if structure == "simulation":
            post, noise = ard.laplace_simulation(model, params, state, ue, ye, LAG, sigma2=sigma2_sim), sigma2_sim
        else:
            post = ard.laplace(model, params, state, Z, t, hessian="gauss-newton", structure=structure)
            noise = float(state.sigma2)
        draws = ard.sample_laplace(jax.random.PRNGKey(args.seed + 7), post, args.laplace_draws)
        sims = np.asarray(jax.vmap(lambda p: ard.simulate(model, p, ut, yt, LAG))(draws))
        c = {**_band(sims, y, LAG), "draws": args.laplace_draws}
        # the linearised (GLM) predictive of the free run, with the noise variance of the posterior's likelihood
        mean, sd = (np.asarray(a) for a in ard.linearised_predictive(post, lambda p: ard.simulate(model, p, ut, yt,
                                                                                                   LAG)))
        half = 1.96 * np.sqrt(sd ** 2 + noise)
        lo, hi = mean - half, mean + half
        c["linearised"] = {"coverage": metrics.coverage(y[LAG:], lo[LAG:], hi[LAG:]),
                           "mpiw": metrics.mpiw(lo[LAG:], hi[LAG:]), "noise_var": noise,
                           "param_sd_mean": float(np.mean(sd[LAG:])), "lo": lo.tolist(), "hi": hi.tolist()}
        cells[structure] = c
        log(f"  Laplace ({structure}): sampled: {c['diverged']} of {c['draws_total']} free runs diverged, 95 % band "
            f"covers {c['coverage']:.3f} of the test record, mean width {c['mpiw']:.3f}; linearised: covers "
            f"{c['linearised']['coverage']:.3f}, mean width {c['linearised']['mpiw']:.3f}")
    main = cells["simulation"]
    return {**main, "lo": main["linearised"]["lo"], "hi": main["linearised"]["hi"],
            "bands": {k: {**_strip(v), "linearised": _strip(v["linearised"])} for k, v in cells.items()}}


def _hmc(args, split, first, group, tag, log):
    import jax
    import jax.numpy as jnp

    from finite import ard
    from samplers import ard as sard

    model = ard.mlp(SIZES)
    params = tuple(ard.Layer(jnp.asarray(p[0]), jnp.asarray(p[1])) for p in first["params"])
    Z, t = ard.narx_regressors(*split.est, LAG)
    ut, yt = (jnp.asarray(a) for a in split.test)
    sigma2 = float(first["sigma2"])
    os.makedirs(os.path.join(args.out, "cells"), exist_ok=True)
    ckpt = os.path.join(args.out, "cells", f"seed{args.seed}_hmc_c{args.hmc_chains}_w{args.hmc_warmup}"
                                           f"_s{args.hmc_samples}_{group}_{tag}.ckpt")
    res = sard.sample(model, Z, t, jax.random.PRNGKey(args.seed + 11), sigma2=sigma2, group=group,
                      init_params=params, functions={"sim": lambda p: ard.simulate(model, p, ut, yt, LAG)},
                      keep_position=False, num_chains=args.hmc_chains, num_warmup=args.hmc_warmup,
                      num_samples=args.hmc_samples, chunk=25, checkpoint=ckpt, progress=not args.quiet)
    sims = np.asarray(res.draws["sim"]).reshape(-1, int(np.asarray(yt).shape[0]))
    summary = sard.summarise(res)
    diag = {k: v for k, v in summary["diagnostics"].items() if np.isscalar(v)}
    cell = {**_band(sims, np.asarray(yt), LAG), "fraction_remaining": summary["fraction_remaining"],
            "diagnostics": diag, "seconds": res.seconds, "sigma2": sigma2, "group": group}
    log(f"  HMC: band coverage {cell['coverage']:.3f}, RMSE of the mean free run {cell['rmse_of_mean']:.3f}, "
        f"{res.seconds:.0f} s")
    return cell


def run(args) -> Report:
    import jax

    jax.config.update("jax_enable_x64", True)  # the dense Hessian updates work with variances over 20 decades
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if args.quick:
        args.repeats, args.lams, args.groups, args.rounds, args.epochs = 2, [1e-3], ["row+column"], 2, 40
        args.finetune_epochs, args.laplace_draws = 5, 4
        args.hmc_chains, args.hmc_warmup, args.hmc_samples = 1, 10, 5
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    split = tanks.split(args.validation, LAG)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.repeats)
    cells_dir = os.path.join(args.out, "cells")
    base = {k: getattr(args, k) for k in ("repeats", "rounds", "epochs", "learning_rate", "hessian", "validation",
                                          "seed", "quick")}
    methods = ("ours", "conventional", "none")
    results, protocols = {}, ["honest"] + (["test-selected"] if args.protocol == "test-selected" else [])
    for protocol in protocols:
        train, record = (split.train, split.val) if protocol == "honest" else (split.est, split.test)
        for method in methods:
            settings = _settings(args, method)
            grid = {}
            for group, lam in settings:
                name = f"seed{args.seed}_{protocol}_{method}_{group}_lam{lam:g}.json"
                log(f"{protocol}: {method} {group} lambda={lam:g}")
                grid[(group, lam)] = report.cell(
                    os.path.join(cells_dir, name), {**base, "group": group, "lam": lam, "protocol": protocol},
                    lambda g=group, lm=lam, m=method: _fit_grid(args, train, keys, m, g, lm, record, log), log=log)
            choice = _select(grid, settings, args.repeats)
            if protocol == "honest":
                name = f"seed{args.seed}_refit_{method}.json"
                conf = {**base, "settings": settings, "choice": choice, "finetune_epochs": args.finetune_epochs,
                        "finetune_lr": args.finetune_lr, "finetune_clip": args.finetune_clip, "keep_best": True}
                refit = report.cell(os.path.join(cells_dir, name), conf,
                                    lambda m=method, s=settings, c=choice: {"repeats": _refit(args, split, keys, m, s,
                                                                                                c, log)}, log=log)
                results[(protocol, method)] = refit["repeats"]
            else:
                results[(protocol, method)] = [
                    {"test": float(np.asarray(grid[settings[c[1]]]["sim_all"])[r, c[2]]),
                     "test_excl": float(c[0]), "frac": float(np.asarray(grid[settings[c[1]]]["frac"])[r, c[2]]),
                     "setting": list(settings[c[1]]), "round": c[2]} for r, c in enumerate(choice)]
    first = results[("honest", "ours")][0]
    # the bands are those of repeat 0's network: a digest of what each uses keys its cell (and HMC's checkpoint)
    digest = hashlib.sha1(json.dumps([first["params"], first["masks"], first["sigma2"]]).encode()).hexdigest()
    prior = hashlib.sha1(json.dumps(first["upsilon"]).encode()).hexdigest()
    unc = report.cell(os.path.join(cells_dir, f"seed{args.seed}_laplace.json"),
                      {**base, "draws": args.laplace_draws, "setting": first["setting"], "round": first["round"],
                       "structures": list(LAPLACE_BANDS), "start": digest[:12], "prior": prior[:12]},
                      lambda: _uncertainty(args, split, first, log), log=log)
    hmc = None
    if not args.no_hmc:
        hconf = {**base, "chains": args.hmc_chains, "warmup": args.hmc_warmup, "samples": args.hmc_samples,
                 "setting": first["setting"], "round": first["round"], "start": digest[:12]}
        hmc = report.cell(os.path.join(cells_dir, f"seed{args.seed}_hmc.json"), hconf,
                          lambda: _hmc(args, split, first, first["setting"][0], digest[:12], log), log=log)
    unc = _nan_scalars(unc)
    hmc = _nan_scalars(hmc) if hmc else None
    figures = [_figure_simulation(args, split, results, unc, hmc), _figure_sparsity(args, first)]
    summary = _summary(args, results, np.asarray(split.test[1]))
    return Report(results={"summary": summary, "laplace": _strip(unc), "hmc": _strip(hmc) if hmc else None,
                           "per_repeat": {f"{p}/{m}": [_strip(c) for c in v] for (p, m), v in results.items()}},
                  markdown=_markdown(args, summary, unc, hmc), figures=figures)


def _nan_scalars(cell):
    """Stored cells hold ``null`` for NaN (`experiments.report.jsonable`): back to NaN for formatting."""
    return {k: (float("nan") if v is None else v) for k, v in cell.items()}


def _strip(cell):
    return {k: v for k, v in cell.items() if k not in ("sim", "sim_ft", "params", "masks", "upsilon", "lo", "hi")}


def _summary(args, results, y_test) -> dict:
    out = {}
    for (protocol, method), reps in results.items():
        row = {"test": tanks.mean_std_best([c["test"] for c in reps]),
               "test_excl": tanks.mean_std_best([c["test_excl"] for c in reps]),
               "frac": float(np.mean([c["frac"] for c in reps]))}
        if "test_ft" in reps[0]:
            row["test_ft"] = tanks.mean_std_best([c["test_ft"] for c in reps])
            row["test_ft_excl"] = tanks.mean_std_best([c["test_ft_excl"] for c in reps])
            # the repeats' fine-tuned free runs averaged (an ensemble; not a row of the paper's table)
            mean_run = np.mean([c["sim_ft"] for c in reps], axis=0)
            row["ensemble_ft"] = float(np.sqrt(np.mean((mean_run - y_test) ** 2)))
        out[f"{protocol}/{method}"] = row
    return out


def _markdown(args, summary, unc, hmc) -> str:
    hmc = _nan_scalars(hmc) if hmc else hmc  # a band of only diverged free runs has no coverage
    names = {"ours": "Sparse Bayesian (Algorithm 1)", "conventional": "Conventional group lasso",
             "none": "No regularisation"}

    def fmt(s):
        return f"{s['best']:.3f}", f"{s['mean']:.3f} ± {s['std']:.3f}"

    rows = []
    for key, s in summary.items():
        protocol, method = key.split("/")
        label = names[method] + ("" if protocol == "honest" else " [test-selected, paper's protocol]")
        b, m = fmt(s["test"])
        be, me = fmt(s["test_excl"])
        rows.append([label + " (one-step trained)", b, m, be, me, f"{100 * s['frac']:.1f}%"])
        if "test_ft" in s:
            b, m = fmt(s["test_ft"])
            be, me = fmt(s["test_ft_excl"])
            rows.append([label + " + free-run fine-tuning (ours)", b, m, be, me, f"{100 * s['frac']:.1f}%"])
            rows.append([label + " + fine-tuning, mean of the repeats' free runs (ensemble)",
                         f"{s['ensemble_ft']:.3f}", "", "", "", ""])
    for name, v in tanks.PAPER_TABLE3:
        mean = (f"{tanks.PAPER_DNN_MEAN_STD[0]:.3f} ± {tanks.PAPER_DNN_MEAN_STD[1]:.3f}" if "DNN without" in name
                else "")
        rows.append([f"paper: {name}", f"{v:.3f}", mean, "", "", ""])
    md = [f"# Cascaded Tanks, free-run simulation (sparse-Bayes paper Table 3), seed {args.seed}", ""]
    if args.quick:
        md += ["**Quick mode**: a smoke run, not the paper's setting.", ""]
    md += [f"Network 3 x 10 ReLU, lags {LAG}; {args.repeats} repeats; Algorithm 1 with {args.rounds} rounds x "
           f"{args.epochs} epochs, Hessian `{args.hessian}`; groupings {', '.join(args.groups)}; lambda in "
           f"{', '.join(f'{v:g}' for v in args.lams)}. Honest protocol: grouping, lambda and round chosen per repeat "
           f"on the last {args.validation} estimation samples, then refitted on the whole estimation record. RMSE on "
           "the test record (the benchmark's validation record) over all 1,024 samples (paper's Eq. 17) and over the "
           f"{1024 - LAG} simulated ones.", "",
           markdown_table(["model", "best RMSE", "mean ± std RMSE", "best (simulated part)", "mean ± std "
                           "(simulated part)", "weights kept"], rows), ""]
    rows = []
    for key, label in LAPLACE_BANDS.items():
        b = _nan_scalars(unc["bands"][key])
        lin = _nan_scalars(b["linearised"])
        rows.append([f"Laplace, {label}", f"{100 * b['coverage']:.1f} %", f"{b['mpiw']:.3f}",
                     f"{b['rmse_of_mean']:.3f}", f"{b['diverged']} of {b['draws_total']}",
                     f"{100 * lin['coverage']:.1f} %", f"{lin['mpiw']:.3f}"])
    if hmc:
        rows.append(["HMC (NUTS) of the group-ARD posterior", f"{100 * hmc['coverage']:.1f} %", f"{hmc['mpiw']:.3f}",
                     f"{hmc['rmse_of_mean']:.3f}", f"{hmc['diverged']} of {hmc['draws_total']}", "", ""])
    md += [f"Predictive bands of repeat 0's network on the test record's simulated part. Sampled: {unc['draws']} "
           "weight draws, each free-run (one beyond 1e6 counts as diverged and is left out of its band). "
           "Linearised: the free run linearised in the weights at the trained network "
           "(`finite.ard.linearised_predictive`), 95 % Gaussian band with the noise variance of the posterior's "
           "likelihood (one-step MSE, or the free-run MSE of the estimation record).", "",
           markdown_table(["posterior", "sampled: coverage", "sampled: mean width", "sampled: RMSE of the mean run",
                           "sampled: diverged", "linearised: coverage", "linearised: mean width"], rows)]
    if hmc:
        d = _nan_scalars(hmc["diagnostics"])  # e.g. R-hat of a run too short for it
        md += ["", f"HMC (NUTS, {args.hmc_chains} chains x {args.hmc_samples} draws after {args.hmc_warmup} warm-up, "
               f"group-ARD `{hmc['group']}` with InvGamma(1, 0.01) hyper-priors, {hmc['seconds']:.0f} s): 95 % band "
               f"covers {100 * hmc['coverage']:.1f} % (mean width {hmc['mpiw']:.3f}); RMSE of the mean free run "
               f"{hmc['rmse_of_mean']:.3f}, median per draw {hmc['rmse_per_draw_median']:.3f} ({hmc['diverged']} of "
               f"{hmc['draws_total']} free runs diverged); weights with posterior-"
               f"median variance >= 1e-4: {100 * hmc['fraction_remaining']:.1f} %; acceptance "
               f"{d.get('acceptance', float('nan')):.2f}, divergences {d.get('divergences', 'n/a')}, max R-hat of the "
               f"weights {d.get('rhat_params', float('nan')):.2f}."]
    return "\n".join(md)


def _figure_simulation(args, split, results, unc, hmc) -> str:
    import matplotlib.pyplot as plt

    y = np.asarray(split.test[1]) + split.offset[1]
    tt = np.arange(y.size) * split.ts
    first = results[("honest", "ours")][0]
    sim = np.asarray(first.get("sim_ft", first["sim"])) + split.offset[1]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    lo, hi = (np.asarray(unc[k], dtype=float) + split.offset[1] for k in ("lo", "hi"))
    ax.fill_between(tt, lo, hi, color="C0", alpha=0.25, label="Laplace (free-run likelihood, linearised) 95 % band")
    if hmc:
        ax.plot(tt, np.asarray(hmc["lo"], dtype=float) + split.offset[1], "C2", lw=0.6, label="HMC 95 % band")
        ax.plot(tt, np.asarray(hmc["hi"], dtype=float) + split.offset[1], "C2", lw=0.6)
    ax.plot(tt, y, "C3", lw=1.2, label="measured")
    ax.plot(tt, sim, "C0", lw=1.2, label=f"simulated (RMSE {first.get('test_ft', first['test']):.3f})")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("lower tank level (V)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    name = "tanks_simulation.png"
    fig.savefig(os.path.join(args.out, name), dpi=110)
    plt.close(fig)
    return name


def _figure_sparsity(args, first) -> str:
    import matplotlib.pyplot as plt

    Ws = [np.asarray(p[0]) * np.asarray(m) for p, m in zip(first["params"], first["masks"])]
    fig, axes = plt.subplots(1, len(Ws), figsize=(2.6 * len(Ws), 3.2))
    for i, (ax, W) in enumerate(zip(axes, Ws)):
        ax.imshow(np.abs(W), aspect="auto", cmap="Greys", interpolation="nearest")
        ax.set_title(f"|W{i + 1}| {W.shape[0]}x{W.shape[1]}, kept {np.mean(W != 0):.0%}", fontsize=8)
        ax.set_xlabel("output node")
        ax.set_ylabel("input node")
    fig.tight_layout()
    name = "tanks_sparsity.png"
    fig.savefig(os.path.join(args.out, name), dpi=110)
    plt.close(fig)
    return name
