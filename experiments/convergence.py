"""Finite networks converge to their infinite-width kernels (NNGP and NTK).

For one architecture spec, draw many finite networks (``init_fn``/``apply_fn``)
at growing widths and compare with ``kernel_fn``: the empirical output
covariance against the NNGP, the output law at one input against the Gaussian
limit (Kolmogorov-Smirnov), and the empirical NTK against the NTK.
"""

from __future__ import annotations

import jax
import numpy as np
from scipy import stats

from experiments import progress
from experiments.report import Report, markdown_table

DESCRIPTION = "finite-vs-infinite width: empirical NNGP/NTK and output law converge to smnngp.stax kernels"


def add_arguments(parser):
    parser.add_argument("--draws", type=int, default=None, help="networks per width (default 4000, quick 1000)")


def _architecture(stax, width):
    return stax.serial(
        stax.Dense(width, W_std=1.5, b_std=0.05), stax.Erf(),
        stax.Dense(width, W_std=1.5, b_std=0.05), stax.Erf(),
        stax.Dense(1, W_std=1.0, b_std=0.0),
    )


def _summary(widths, per_width, ntk_widths, ntk_res, draws) -> str:
    """Describe what the numbers show (computed from them, never assumed)."""
    first, last = per_width[widths[0]], per_width[widths[-1]]
    noise = np.sqrt(2.0 / draws)
    lines = [
        f"- KS statistic of f(x0) against the Gaussian limit: {first['ks_statistic']:.3f} at width {widths[0]} "
        f"(p = {first['ks_pvalue']:.2g}) and {last['ks_statistic']:.3f} at width {widths[-1]} "
        f"(p = {last['ks_pvalue']:.2g}); excess kurtosis {first['excess_kurtosis']:.2f} -> "
        f"{last['excess_kurtosis']:.2f} (0 for a Gaussian, standard error about {np.sqrt(24.0 / draws):.2f}). A "
        "finite readout layer makes f a Gaussian scale mixture, heavier-tailed than its limit.",
        f"- Covariance error: {first['nngp_rel_frobenius']:.3f} at width {widths[0]}, "
        f"{last['nngp_rel_frobenius']:.3f} at width {widths[-1]}; the Monte-Carlo floor with {draws} networks is "
        f"about {noise:.3f}, and the worst entry at width {widths[-1]} is {last['max_abs_z']:.2f} standard errors "
        "from the NNGP.",
        f"- Empirical NTK error: {ntk_res[ntk_widths[0]]['mean_rel_frobenius']:.3f} at width {ntk_widths[0]}, "
        f"{ntk_res[ntk_widths[-1]]['mean_rel_frobenius']:.3f} at width {ntk_widths[-1]} (expected to fall like "
        "1/sqrt(width)).",
    ]
    return "\n".join(lines) + "\n"


def run(args) -> Report:
    jax.config.update("jax_enable_x64", True)  # experiments choose float64; the library never does
    import jax.numpy as jnp

    from smnngp import stax
    from smnngp.empirical import empirical_ntk, sample_outputs

    # quick: the two ends of the width range; each width compiles its own sampler (~10 s of a 2-core CPU)
    widths = [2, 128] if args.quick else [2, 8, 32, 128, 512]
    ntk_widths = [32, 256] if args.quick else [32, 256, 2048]
    draws = args.draws or (1000 if args.quick else 4000)
    key = jax.random.PRNGKey(args.seed)
    x = jnp.asarray(np.random.RandomState(args.seed).normal(size=(4, 3)))
    kernel = _architecture(stax, 1)[2](x, None, ("nngp", "ntk"))
    nngp, ntk = np.asarray(kernel.nngp), np.asarray(kernel.ntk)
    iu = np.triu_indices(4)

    rows, per_width, samples = [], {}, {}
    for i, w in enumerate(widths):
        progress.note(f"NNGP convergence: width {w} ({i + 1}/{len(widths)}), {draws} networks")
        net = _architecture(stax, w)
        f = sample_outputs(net[0], net[1], x, jax.random.fold_in(key, i), draws)[:, :, 0]
        prods = f[:, :, None] * f[:, None, :]
        emp = prods.mean(0)
        se = prods.std(0, ddof=1) / np.sqrt(draws)
        rel = float(np.linalg.norm(emp - nngp) / np.linalg.norm(nngp))
        zmax = float(np.max(np.abs(emp - nngp)[iu] / se[iu]))
        ks = stats.kstest(f[:, 0] / np.sqrt(nngp[0, 0]), "norm")
        kurt = float(stats.kurtosis(f[:, 0]))
        per_width[w] = dict(nngp_rel_frobenius=rel, max_abs_z=zmax, ks_statistic=float(ks.statistic),
                            ks_pvalue=float(ks.pvalue), excess_kurtosis=kurt)
        samples[w] = f[:, 0]
        rows.append([w, draws, rel, zmax, float(ks.statistic), float(ks.pvalue), kurt])

    ntk_rows, ntk_res = [], {}
    for j, w in enumerate(ntk_widths):
        progress.note(f"empirical NTK: width {w} ({j + 1}/{len(ntk_widths)})")
        keys = jax.random.split(jax.random.fold_in(key, 100 + j), 4)
        init_fn, apply_fn, _ = _architecture(stax, w)
        errs = [np.linalg.norm(np.asarray(empirical_ntk(apply_fn, init_fn(k, x.shape)[1], x)) - ntk)
                / np.linalg.norm(ntk) for k in keys]
        ntk_res[w] = dict(mean_rel_frobenius=float(np.mean(errs)), draws=len(errs))
        ntk_rows.append([w, len(errs), float(np.mean(errs))])

    figures = []
    out = args.out
    try:
        import os

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        os.makedirs(out, exist_ok=True)
        fig, axes = plt.subplots(1, len(widths), figsize=(3.2 * len(widths), 2.8), sharey=True)
        sd = np.sqrt(nngp[0, 0])
        grid = np.linspace(-4 * sd, 4 * sd, 200)
        for ax, w in zip(axes, widths):
            ax.hist(samples[w], bins=40, density=True, alpha=0.6, label=f"width {w}")
            ax.plot(grid, stats.norm.pdf(grid, scale=sd), "k", lw=1.5, label="NNGP limit")
            ax.set_title(f"width {w}: KS {per_width[w]['ks_statistic']:.3f}")
            ax.set_xlabel("f(x0)")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, "convergence_histograms.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        figures.append(os.path.basename(path))
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        pass

    md = (
        "Architecture: Dense(w, 1.5, 0.05), Erf, Dense(w, 1.5, 0.05), Erf, Dense(1, 1.0); 4 inputs in R^3, float64.\n\n"
        "## Output covariance and law vs the NNGP limit\n\n"
        + markdown_table(["width", "networks", "rel. Frobenius error of E[f f']", "max |z| (SE units)",
                          "KS statistic f(x0)", "KS p-value", "excess kurtosis f(x0)"], rows)
        + "\n\n## Empirical NTK vs the NTK limit (mean over 4 networks)\n\n"
        + markdown_table(["width", "networks", "rel. Frobenius error"], ntk_rows)
        + "\n\n" + _summary(widths, per_width, ntk_widths, ntk_res, draws)
    )
    results = dict(widths=widths, draws=draws, nngp=nngp, ntk=ntk, per_width=per_width, empirical_ntk=ntk_res)
    return Report(results=results, markdown=md, figures=figures)
