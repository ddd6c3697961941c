"""Masked BNN vs BNN on four UCI sets (Kong et al. 2023, section 6.2, Tables 1 and 3; notes section 3.3).

Protocol (the authors' settings where the paper is silent, see the notes):

* Boston, Concrete, Energy, Yacht with the 20 public train/test splits of the
  data directory (`experiments.data`); inputs min-max scaled to [0, 1] on the
  *training* rows (the authors fitted the scaler on all rows, which leaks the
  test inputs' range), targets left in original units.
* Two hidden ReLU layers of 1,000 nodes (mBNN: physical width 1,100 with
  1,000 active at the start), Cauchy(0, 1) on every weight and bias,
  ``sigma^2 ~ InvGamma(1, std(y_train))``.
* HMC with 20 leapfrog steps, initial step ``1e-2 / n``, dual averaging
  during 400 burn-in iterations, then 20 draws every 200 iterations (4,400
  iterations per chain); mBNN: ``lambda`` in {0.075, 0.1, 0.125},
  ``N_max = 3``, 10 mask moves per iteration.
* NS-VI baseline (`finite.nsvi`): group normal-Jeffreys MLP of the same width, Adam (lr 0.01, batch 100,
  500 epochs), nodes with log alpha > 3 pruned, 20 predictive draws with a learned noise variance.
* Metrics of the Gaussian-mixture predictive over all kept draws: coverage
  of the 95% interval, RMSE of the mean, NLL, CRPS; active nodes per layer;
  mean +- standard error over splits (std with ddof 1 / sqrt(splits)).

Every (data set, model, split) is a cell saved as JSON under
``OUT/cells/`` as soon as it finishes, and its chains checkpoint while they
run, so an interrupted run resumes where it stopped; ``--aggregate-only``
tabulates what is there.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from experiments import metrics
from experiments.report import Report, markdown_table, write_json_atomic

DESCRIPTION = "masked BNN vs BNN on Boston/Concrete/Energy/Yacht, 20 splits (paper Tables 1 and 3)"

DATASETS = ("boston", "concrete", "energy", "yacht")

# Paper Tables 1 and 3: (coverage, RMSE, NLL, CRPS) as (mean, se), and active nodes (layer 1, layer 2).
PAPER = {
    ("boston", "bnn"): ((0.912, 0.006), (3.411, 0.145), (2.726, 0.087), (1.738, 0.052), (1000, 1000)),
    ("boston", "mbnn-0.075"): ((0.924, None), (2.961, 0.142), (2.547, 0.079), (1.535, 0.057), (102, 44)),
    ("boston", "mbnn-0.1"): ((0.933, 0.007), (2.902, 0.143), (2.472, 0.085), (1.462, 0.055), (29, 12)),
    ("boston", "mbnn-0.125"): ((0.939, None), (2.790, 0.170), (2.381, 0.063), (1.431, 0.061), (11, 5)),
    ("concrete", "bnn"): ((0.908, 0.008), (5.080, 0.178), (3.091, 0.055), (2.658, 0.072), (1000, 1000)),
    ("concrete", "mbnn-0.075"): ((0.916, None), (4.908, 0.127), (3.023, 0.034), (2.626, 0.062), (108, 54)),
    ("concrete", "mbnn-0.1"): ((0.912, 0.009), (4.913, 0.180), (3.027, 0.046), (2.628, 0.087), (35, 17)),
    ("concrete", "mbnn-0.125"): ((0.924, 0.006), (5.002, 0.139), (3.035, 0.035), (2.683, 0.068), (16, 7)),
    ("energy", "bnn"): ((0.945, 0.005), (0.591, 0.017), (0.902, 0.025), (0.322, 0.007), (1000, 1000)),
    ("energy", "mbnn-0.075"): ((0.943, 0.005), (0.473, 0.012), (0.676, 0.030), (0.254, 0.005), (211, 210)),
    ("energy", "mbnn-0.1"): ((0.945, 0.004), (0.474, 0.015), (0.670, 0.034), (0.256, 0.006), (35, 17)),
    ("energy", "mbnn-0.125"): ((0.955, 0.004), (0.510, 0.026), (0.736, 0.047), (0.278, 0.013), (19, 13)),
    ("boston", "nsvi"): ((0.746, 0.010), (3.079, 0.179), (4.242, 0.568), (1.661, 0.069), (13, 21)),
    ("concrete", "nsvi"): ((0.568, 0.011), (5.046, 0.149), (9.713, 0.686), (2.965, 0.088), (30, 19)),
    ("energy", "nsvi"): ((0.913, 0.006), (1.322, 0.117), (1.792, 0.121), (0.720, 0.055), (7, 10)),
    ("yacht", "nsvi"): ((0.932, 0.011), (1.842, 0.096), (1.915, 0.063), (0.969, 0.042), (102, 54)),
    ("yacht", "bnn"): ((0.977, 0.006), (0.675, 0.048), (1.011, 0.056), (0.332, 0.013), (1000, 1000)),
    ("yacht", "mbnn-0.075"): ((0.976, 0.006), (0.604, 0.054), (0.920, 0.084), (0.295, 0.015), (317, 193)),
    ("yacht", "mbnn-0.1"): ((0.953, 0.008), (0.664, 0.044), (0.932, 0.062), (0.318, 0.015), (120, 76)),
    ("yacht", "mbnn-0.125"): ((0.954, 0.011), (0.621, 0.054), (0.966, 0.102), (0.301, 0.023), (42, 26)),
}
METRICS = ("coverage", "rmse", "nll", "crps")

# Sampler settings of one data set that differ from the others, chosen on what the chains themselves show
# (acceptance and divergences after burn-in, R-hat across chains of sigma^2), never on test metrics. An explicit
# --step-scale / --pool-step on the command line applies to every data set instead.
DATASET_SETTINGS = {
    "energy": {"pool_step": "min"},
}


def add_arguments(parser):
    parser.add_argument("--datasets", default=None, help="comma-separated (default: the four; quick: yacht)")
    parser.add_argument("--models", default=None, help="comma-separated from bnn, nsvi, mbnn-LAMBDA, each "
                        "optionally with @WIDTH (e.g. bnn@100: the BNN at width 100, a reduced-scale cell beside the "
                        "paper's full-width numbers) "
                        "(default: bnn,nsvi,mbnn-0.075,mbnn-0.1,mbnn-0.125; quick: bnn,nsvi,mbnn-0.1)")
    parser.add_argument("--splits", type=int, default=None, help="splits per data set (default 20, quick 2)")
    parser.add_argument("--chains", type=int, default=None, help="chains per split (default 4, quick 2)")
    parser.add_argument("--width", type=int, default=None, help="initially active width (default 1000)")
    parser.add_argument("--burnin", type=int, default=None, help="burn-in iterations (default 400)")
    parser.add_argument("--samples", type=int, default=None, help="draws per chain (default 20)")
    parser.add_argument("--thinning", type=int, default=None, help="iterations between draws (default 200)")
    parser.add_argument("--leapfrog", type=int, default=None, help="leapfrog steps per HMC trajectory (default 20)")
    parser.add_argument("--step-scale", type=float, default=None,
                        help="HMC step after burn-in as a fraction of the adapted one (default 0.5; 1 = the authors')")
    parser.add_argument("--pool-step", choices=("chain", "min"), default=None,
                        help="post-burn-in step per chain ('chain') or the smallest over chains ('min'); default "
                             "per data set (energy: min, others: chain)")
    parser.add_argument("--transfer", type=int, default=None, help="merge/split moves per iteration after the "
                        "birth/death moves (default 0: the paper's sampler; cells record it when not 0)")
    parser.add_argument("--aggregate-only", action="store_true", help="only tabulate the finished cells")


def settings(args) -> dict:
    q = args.quick
    s = dict(datasets=("yacht",) if q else DATASETS,
             models=("bnn", "nsvi", "mbnn-0.1") if q else ("bnn", "nsvi", "mbnn-0.075", "mbnn-0.1", "mbnn-0.125"),
             splits=2 if q else 20, chains=2 if q else 4, width=40 if q else 1000, burnin=120 if q else 400,
             samples=5 if q else 20, thinning=4 if q else 200, leapfrog=20, n_mh=10, n_max=3, prior_scale=1.0,
             step_scale=0.5,
             nsvi_epochs=150 if q else 500)
    if args.datasets:
        s["datasets"] = tuple(d.strip() for d in args.datasets.split(",") if d.strip())
    if args.models:
        s["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    for k in ("splits", "chains", "width", "burnin", "samples", "thinning", "leapfrog"):
        if getattr(args, k, None) is not None:
            s[k] = int(getattr(args, k))
    if getattr(args, "step_scale", None) is not None:
        s["step_scale"] = float(args.step_scale)
    if getattr(args, "transfer", None):
        s["n_transfer"] = int(args.transfer)
        if s["n_transfer"] < 0:
            raise ValueError(f"mbnn-uci: --transfer must be >= 0, got {args.transfer}")
    if getattr(args, "pool_step", None) is not None:
        s["pool_step"] = None if args.pool_step == "chain" else args.pool_step
    explicit = {k for k in ("step_scale", "pool_step") if getattr(args, k, None) is not None}
    s["overrides"] = {} if q else {ds: {k: v for k, v in o.items() if k not in explicit}
                                   for ds, o in DATASET_SETTINGS.items()}
    for d in s["datasets"]:
        if d not in DATASETS:
            raise ValueError(f"mbnn-uci: unknown data set {d!r} (choose from {', '.join(DATASETS)})")
    for m in s["models"]:
        _parse_model(m)
    return s


def dataset_settings(s: dict, ds: str, model: str) -> dict:
    """The settings a cell runs with: the global ones, for the samplers (not NS-VI) the data set's entry of
    ``DATASET_SETTINGS``, and the width of a ``MODEL@WIDTH`` name."""
    base, width = _split_width(model)
    out = s if base == "nsvi" else dict(s, **s.get("overrides", {}).get(ds, {}))
    return out if width is None else dict(out, width=width)


def _split_width(name: str):
    """``"bnn@100"`` -> ``("bnn", 100)`` (a reduced-width cell, labelled as such); ``"bnn"`` -> ``("bnn", None)``."""
    base, sep, width = name.partition("@")
    if not sep:
        return name, None
    if not width.isdigit() or int(width) < 1:
        raise ValueError(f"mbnn-uci: a model's width suffix must be a positive integer (e.g. bnn@100), got {name!r}")
    return base, int(width)


def _cfg(s: dict, ds: str, model: str) -> dict:
    """What a finished cell must have been run with (``pool_step`` appears only when set, so cells written
    before the option existed still count)."""
    cfg = {k: v for k, v in dataset_settings(s, ds, model).items()
           if k not in ("datasets", "models", "splits", "overrides")}
    if cfg.get("pool_step") is None:
        cfg.pop("pool_step", None)
    # the sampler's merge/split moves: recorded when used
    if _split_width(model)[0] == "nsvi" or not cfg.get("n_transfer"):
        cfg.pop("n_transfer", None)
    return cfg


def _parse_model(name: str):
    name = _split_width(name)[0]
    if name in ("bnn", "nsvi"):
        return None
    if name.startswith("mbnn-"):
        try:
            lam = float(name[5:])
        except ValueError:
            lam = -1.0
        if lam > 0:
            return lam
    raise ValueError(f"mbnn-uci: model must be 'bnn', 'nsvi' or 'mbnn-LAMBDA' with LAMBDA > 0 (optionally with "
                     f"@WIDTH for a reduced width), got {name!r}")


def build_sampler(model_name: str, x, y, s: dict, birth: str = "uniform", death: str = "sensitivity"):
    """The paper's UCI model and sampler (`samplers.mbnn.uci_sampler`) for ``bnn`` or ``mbnn-LAMBDA`` with the
    settings ``s`` on one training set."""
    from samplers.mbnn import uci_sampler

    return uci_sampler(x, y, _parse_model(model_name), width=s["width"], prior_scale=s["prior_scale"],
                       leapfrog=s["leapfrog"], n_mh=s["n_mh"], n_max=s["n_max"], birth=birth, death=death,
                       step_scale=s.get("step_scale", 0.5), n_transfer=s.get("n_transfer", 0),
                       transfer_kappa=s.get("transfer_kappa", 100.0))


def run_split(data, split: int, model_name: str, s: dict, seed: int, checkpoint=None, progress=True) -> dict:
    """One (data set, model, split) cell: sample, then the metrics in original units."""
    import jax
    import jax.numpy as jnp

    from experiments.data.uci import minmax_split
    from samplers.mbnn import diagnostics, sample

    xtr, ytr, xte, yte = minmax_split(data, split)
    if _split_width(model_name)[0] == "nsvi":
        return _run_nsvi(xtr, ytr, xte, yte, s, seed)
    sampler = build_sampler(model_name, xtr, ytr, s)
    net = sampler.model.net
    xe = jnp.asarray(xte, jnp.float32)
    res = sample(sampler, jax.random.PRNGKey(seed), num_chains=s["chains"], num_burnin=s["burnin"],
                 num_samples=s["samples"], thinning=s["thinning"],
                 functions={"f": lambda p, m, s2, b: net.apply(p, m, xe, b)[:, 0]},
                 checkpoint=checkpoint, progress=progress, chunk=s.get("chunk", 16), pool_step=s.get("pool_step"))
    f = res.draws["f"].reshape(-1, len(yte)).astype(float)
    sig = np.sqrt(res.draws["sigma2"].reshape(-1).astype(float))
    ilo, ihi = metrics.mixture_interval(f, sig)
    return dict(coverage=metrics.coverage(yte, ilo, ihi), rmse=metrics.rmse(yte, f.mean(0)),
                nll=metrics.mixture_nll(yte, f, sig), crps=metrics.mixture_crps(yte, f, sig),
                active=res.draws["active"].reshape(-1, 2).mean(0).tolist(), **_spread(sig, ilo, ihi),
                diagnostics=diagnostics(res, s["burnin"], keys=("sigma2", "f")), seconds=res.seconds,
                n_test=int(len(yte)))


def _spread(sig, ilo, ihi) -> dict:
    """Posterior mean of the noise sd and the mean width of the 95% predictive intervals (original units)."""
    return dict(sigma_mean=float(np.mean(sig)), width_mean=float(np.mean(np.asarray(ihi) - np.asarray(ilo))))


def _run_nsvi(xtr, ytr, xte, yte, s, seed):
    """The NS-VI baseline: group normal-Jeffreys MLP (`finite.nsvi`), Adam lr 0.01, batch 100, 20 predictive draws."""
    import jax

    from finite.nsvi import fit_nsvi, nsvi_active, nsvi_predict

    start = time.perf_counter()
    params = fit_nsvi(jax.random.PRNGKey(seed), xtr, ytr, widths=(s["width"], s["width"]), epochs=s["nsvi_epochs"])
    f, sd = nsvi_predict(params, jax.random.PRNGKey(seed + 1), np.asarray(xte, np.float32), num_samples=20)
    f = np.asarray(f, float)
    sig = np.full(f.shape[0], float(sd))
    ilo, ihi = metrics.mixture_interval(f, sig)
    keep = nsvi_active(params)
    return dict(coverage=metrics.coverage(yte, ilo, ihi), rmse=metrics.rmse(yte, f.mean(0)),
                nll=metrics.mixture_nll(yte, f, sig), crps=metrics.mixture_crps(yte, f, sig),
                active=[float(np.sum(keep[1])), float(np.sum(keep[2]))], **_spread(sig, ilo, ihi),
                diagnostics=dict(hmc_acceptance=float("nan"), rhat_f=float("nan")),
                seconds=time.perf_counter() - start, n_test=int(len(yte)))


def _cell_path(out, ds, model, split):
    return os.path.join(out, "cells", ds, model, f"split{split:02d}.json")


def run(args) -> Report:
    s = settings(args)
    if not args.aggregate_only:
        from tqdm.auto import tqdm

        from experiments.data import load_uci

        for ds in s["datasets"]:
            data = load_uci(ds)
            todo = [(m, k) for m in s["models"] for k in range(min(s["splits"], data.n_splits))
                    if not _finished(_cell_path(args.out, ds, m, k), _cfg(s, ds, m))]
            for m, k in tqdm(todo, desc=ds):
                path = _cell_path(args.out, ds, m, k)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                start = time.perf_counter()
                cell = run_split(data, k, m, dataset_settings(s, ds, m), seed=1000 * args.seed + k,
                                 checkpoint=path + ".chk.pkl")
                cell.update(settings=_cfg(s, ds, m), wall_seconds=time.perf_counter() - start, device=_device())
                write_json_atomic(path, cell)
                if os.path.exists(path + ".chk.pkl"):
                    os.remove(path + ".chk.pkl")
    return _aggregate(args.out, s)


def _finished(path, cfg) -> bool:
    if not os.path.exists(path):
        return False
    with open(path) as fh:
        return json.load(fh).get("settings") == json.loads(json.dumps(cfg))


def _device() -> str:
    """What ran a cell: ``"cpu"`` or the accelerator's name (e.g. ``"NVIDIA H200"``), recorded with its time."""
    import jax

    d = jax.devices()[0]
    return "cpu" if d.platform == "cpu" else str(d.device_kind)


def _seconds_by_device(cells) -> tuple[dict[str, float], dict[str, int]]:
    """Mean time per split of a row's cells on each device that ran them, and how many splits each ran
    (``"cpu"`` first, then accelerators by name); cells written before devices were recorded ran on this CPU.
    Times on different devices are never averaged together: an H100 split is ~10x faster than one on this CPU."""
    by: dict[str, list[float]] = {}
    for c in cells:
        by.setdefault(c.get("device", "cpu"), []).append(_cell_seconds(c))
    order = sorted(by, key=lambda d: (d != "cpu", d))
    return {d: float(np.mean(by[d])) for d in order}, {d: len(by[d]) for d in order}


def _format_seconds(by_device: dict[str, float], counts: dict[str, int] | None = None) -> str:
    """The table's 's / split' entry: CPU seconds bare, accelerator seconds with the device named, several
    devices separated by '; ' (with each device's number of splits when ``counts`` is given)."""
    parts = []
    for d, sec in by_device.items():
        label = ([] if d == "cpu" and len(by_device) == 1 else [d if d != "cpu" else "CPU"]) + (
            [f"{counts[d]} split{'s' if counts[d] != 1 else ''}"] if counts and len(by_device) > 1 else [])
        parts.append(f"{sec:.0f}" + (f" ({', '.join(label)})" if label else ""))
    return "; ".join(parts)


def _duration(seconds: float) -> str:
    """``'1.2 h'`` from an hour up, ``'14 min'`` below."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _unfinished_note(ds: str, model: str, done: int, splits: int, by_device: dict[str, float]) -> str:
    """One line of the report's list of unfinished (data set, model) cells, with why and what remains: the time
    the remaining splits take on each device at that device's measured seconds per split."""
    name, width = _split_width(model)
    head = f"- {ds} / {model}: {done} of {splits} splits finished"
    rest = splits - done
    if name == "bnn" and width is None:
        ran = "".join(f" ({d}, {sec:.0f} s per split)" for d, sec in by_device.items() if d != "cpu")
        return (head + ran + "; the BNN at the paper's width is a GPU-scale job (about 100 PFLOP for the four sets), "
                "not run on this CPU: the remaining splits need an accelerator (`bash scripts/run_bnn_gpu.sh`, or "
                "`--models bnn` with the `cuda` extra), and a reduced-width cell (`--models bnn@100`) stands beside it")
    if not by_device:
        return head + "; not run yet for lack of CPU time (`python -m experiments mbnn-uci` runs it; cells resume)"
    est = [f"about {_duration(rest * sec)} " + ("of CPU at this cell's" if d == "cpu" else f"on one {d} at its")
           + f" measured {sec:.0f} s per split" for d, sec in by_device.items()]
    how = ("" if set(by_device) == {"cpu"} else
           f"; on an accelerator: `DATASETS={ds} MODELS={model} SPLITS={splits} bash scripts/run_bnn_gpu.sh SECONDS`")
    return head + f"; the remaining {rest} take " + ", or ".join(est) + " (cells resume" + how + ")"


def _cell_seconds(cell) -> float:
    """A cell's time: the wall time of the process that finished it, or, for a cell resumed from a checkpoint,
    the sampling time summed over every run (``seconds``), whichever is larger."""
    return float(max(cell["wall_seconds"], cell.get("seconds", 0.0)))


def _rhat_yardstick(cells) -> tuple[float, float]:
    """Median and 95% quantile of the table's max R-hat for independent draws of the cells' size; NaN for cells
    without HMC draws or written before cells recorded their number of test points."""
    hmc = [c for c in cells if np.isfinite(c["diagnostics"].get("rhat_f", float("nan")))]
    if not hmc or any("n_test" not in c for c in hmc):
        return float("nan"), float("nan")
    from samplers.driver import rhat_reference

    cfg = hmc[0]["settings"]
    return rhat_reference(cfg["chains"], cfg["samples"], max(c["n_test"] for c in hmc), groups=len(hmc))


def _not_mixed(e) -> bool:
    """HMC stalled, or the max R-hat above 1.1 and above what independent draws of the same size give 1 in 20."""
    limit = 1.1 if not np.isfinite(e.get("rhat_f_iid_q95", float("nan"))) else max(1.1, e["rhat_f_iid_q95"])
    return bool(e["hmc_acceptance"] < 0.2 or e["rhat_f_max"] > limit)


def _aggregate(out, s) -> Report:
    rows, summary, unfinished = [], {}, []
    for ds in s["datasets"]:
        for m in s["models"]:
            cfg, cells = _cfg(s, ds, m), []
            for k in range(s["splits"]):
                p = _cell_path(out, ds, m, k)
                if _finished(p, cfg):
                    with open(p) as fh:
                        cells.append(json.load(fh))
            by_device, counts = _seconds_by_device(cells)
            if len(cells) < s["splits"]:
                unfinished.append(_unfinished_note(ds, m, len(cells), s["splits"], by_device))
            if not cells:
                continue
            entry = {"splits": len(cells)}
            row = [ds, m, len(cells)]
            paper = PAPER.get((ds, _split_width(m)[0]))
            for i, key in enumerate(METRICS):
                ours = metrics.mean_se([c[key] for c in cells])
                entry[key] = ours
                cell = metrics.format_mean_se(*ours, digits=3)
                if paper is not None:
                    pm, pse = paper[i]
                    if key == "coverage":  # best = closest to 0.95
                        mark = metrics.compare_marker((abs(ours[0] - 0.95), ours[1]), (abs(pm - 0.95), pse or 0.0))
                    else:
                        mark = metrics.compare_marker(ours, (pm, pse or 0.0))
                    cell += f" ({pm:.3f}){' ' + mark if mark else ''}"
                row.append(cell)
            act = np.mean([c["active"] for c in cells], axis=0)
            entry["active"] = act.tolist()
            entry["seconds_per_split_by_device"] = by_device
            entry["splits_by_device"] = counts
            spread = [c for c in cells if "sigma_mean" in c]  # cells of older runs lack the two fields
            for key in ("sigma_mean", "width_mean"):
                entry[key] = float(np.mean([c[key] for c in spread])) if spread else float("nan")
            rh = [c["diagnostics"]["rhat_f"] for c in cells]
            entry["rhat_f_max"] = float(np.nanmax(rh)) if np.any(np.isfinite(rh)) else float("nan")
            entry["hmc_acceptance"] = float(np.mean([c["diagnostics"]["hmc_acceptance"] for c in cells]))
            entry["rhat_f_iid"], entry["rhat_f_iid_q95"] = _rhat_yardstick(cells)
            row += [f"({act[0]:.0f}, {act[1]:.0f})" + (f" ({paper[4][0]}, {paper[4][1]})" if paper else ""),
                    (f"{entry['sigma_mean']:.3g} / {entry['width_mean']:.3g}"
                     + (f" ({len(spread)} of {len(cells)})" if len(spread) < len(cells) else "")) if spread else "-",
                    f"{entry['hmc_acceptance']:.2f}",
                    f"{entry['rhat_f_max']:.2f}" + (f" ({entry['rhat_f_iid']:.2f})"
                                                     if np.isfinite(entry["rhat_f_iid"]) else ""),
                    _format_seconds(by_device, counts)]
            rows.append(row)
            summary.setdefault(ds, {})[m] = entry
    head = ["data set", "model", "splits", "coverage (paper)", "RMSE (paper)", "NLL (paper)", "CRPS (paper)",
            "active nodes (paper)", "sigma / 95% width", "HMC acc", "max R-hat f (iid)", "s / split"]
    md = ["# Masked BNN on UCI regression (paper Tables 1 and 3)", "",
          markdown_table(head, rows) if rows else "_no finished cells yet_", "",
          "Each cell: our mean ± standard error over splits, the paper's mean in parentheses; '+' / '-' where we "
          "are better / worse beyond both error bars (coverage: closer to 0.95 is better; the paper gives no "
          "standard error for some coverage cells, counted as 0). 'sigma / 95% width': posterior mean of the noise "
          "sd and mean width of the 95% predictive intervals, in the target's units (the paper reports neither). "
          "A model named MODEL@W ran at width W (a reduced scale); the paper's numbers beside it are those of its "
          "full-width model. 's / split': wall seconds on this 2-core CPU, or on the accelerator named beside it "
          "(summed over the runs of a cell resumed from its checkpoint); a row whose splits ran on several devices "
          "gives each device's mean and number of splits. "
          "'max R-hat f (iid)': the largest split R-hat of the test predictions over test points and splits; in "
          "parentheses the median of the same largest R-hat for exactly independent draws of the same size "
          "(chains, draws, test points, splits; samplers.driver.rhat_reference), taking the test points as "
          "independent: the upper end of what exact sampling shows (correlated test points give less), and above "
          "1.1 at 20 draws per chain.",
          f"Settings: {s['chains']} chains per split, width {s['width']} (mBNN physical "
          f"{int(round(1.1 * s['width']))}), burn-in {s['burnin']}, {s['samples']} draws every {s['thinning']} "
          f"iterations, {s['leapfrog']} leapfrog steps (after burn-in at {s['step_scale']} x the adapted step), "
          f"{s['n_mh']} mask moves per iteration"
          + (f" then {s['n_transfer']} merge/split moves (samplers.masks.transfer_move)" if s.get("n_transfer")
             else " (the paper's birth/death sampler; no merge/split moves)") + ", Cauchy(0, "
          f"{s['prior_scale']}), sigma^2 ~ InvGamma(1, std(y_train)); inputs min-max scaled on the training rows; "
          + ("post-burn-in step: the smallest adapted step over the chains" if s.get("pool_step") else
             "post-burn-in step: each chain its own adapted step")
          + "".join(f"; {ds}: " + ", ".join(f"{k} = {v}" for k, v in s["overrides"][ds].items())
                    for ds in s["datasets"] if s.get("overrides", {}).get(ds)) + "."]
    stuck = [f"{ds}/{m} (HMC acceptance {e['hmc_acceptance']:.2f}, max R-hat {e['rhat_f_max']:.2f})"
             for ds, per in summary.items() for m, e in per.items()
             if _split_width(m)[0] != "nsvi" and _not_mixed(e)]
    if stuck:
        md += ["", "**Mixing warning**: the chains of " + ", ".join(stuck) + " did not mix after burn-in "
               "(acceptance below 0.2, or max R-hat above 1.1 and above the 95% quantile of its value for "
               "independent draws of the same size): chains that disagree are not yet sampling one posterior, "
               "so the intervals above are not those of a converged posterior."]
    if unfinished:
        md += ["", "**Not finished** (each listed cell is missing from the table above or has fewer splits):",
               *unfinished]
    return Report(results=dict(settings=s, summary=summary, unfinished=unfinished), markdown="\n".join(md))
