"""Finite networks written in plain JAX converge to the kernel `smnngp.traced` reads off their program.

Three models with no closed-form stax spelling of their whole kernel path: an MLP with tanh (every activation
by quadrature), an Elman RNN with tanh in ``lax.scan`` (one weight reused at every step: the Tensor Programs
pairing) and a softmax self-attention block. For each, networks drawn by the returned ``init_fn`` at growing
widths are compared with ``kernel_fn``: the empirical output covariance over many networks against the NNGP
(its error should sit at the Monte-Carlo floor, entries within a few standard errors), and the empirical NTK of
single networks against the NTK (its error should fall like ``1/sqrt(width)``, the fitted log-log slope near
-0.5, until it meets the quadrature's own error: ``--quadrature-degree`` sets the nodes).
"""

from __future__ import annotations

import jax
import numpy as np

from experiments import progress
from experiments.report import Report, markdown_table

DESCRIPTION = ("finite-vs-infinite width for models written in plain JAX (tanh MLP, tanh RNN in lax.scan, "
               "attention): empirical NNGP/NTK converge to smnngp.traced kernels")

MODELS = ("mlp_tanh", "rnn_tanh", "attention")


def add_arguments(parser):
    parser.add_argument("--draws", type=int, default=None,
                        help="networks per width for the NNGP (default 2000, quick 300)")
    parser.add_argument("--ntk-draws", type=int, default=None,
                        help="networks per width for the empirical NTK (default 8, quick 3)")
    parser.add_argument("--widths", default=None,
                        help="comma-separated widths (default 64,256,1024,4096; quick 16,128)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--quadrature-degree", type=int, default=32,
                        help="Gauss-Hermite nodes per axis for activations without a closed form (default 32, the "
                             "library's)")


def _model(name: str, width: int):
    """``(apply_fn, params, priors, x, label)`` of one model at one width (params: shapes only, zeros)."""
    import jax.numpy as jnp

    from smnngp import traced

    z = jnp.zeros
    rng = np.random.RandomState(0)
    if name == "mlp_tanh":
        def apply(p, x):
            h = jnp.tanh(x @ p["W0"] + p["b0"][None, :])
            h = jnp.tanh(h @ p["W1"] + p["b1"][None, :])
            return h @ p["W2"]

        params = {"W0": z((3, width)), "b0": z((width,)), "W1": z((width, width)), "b1": z((width,)),
                  "W2": z((width, 1))}
        priors = {"W*": traced.Weight(1.5), "b*": traced.Bias(0.1)}
        x = rng.normal(size=(4, 3))
        label = "MLP: Dense-tanh-Dense-tanh-Dense (tanh by quadrature), 4 points in R^3"
    elif name == "rnn_tanh":
        def apply(p, x):
            def step(h, x_t):
                return jnp.tanh(h @ p["W"] + x_t @ p["U"] + p["b"][None, :]), None

            h0 = jnp.zeros((x.shape[0], p["W"].shape[0]), x.dtype)
            h, _ = jax.lax.scan(step, h0, jnp.swapaxes(x, 0, 1))
            return h @ p["V"]

        params = {"W": z((width, width)), "U": z((3, width)), "b": z((width,)), "V": z((width, 1))}
        priors = {"W": traced.Weight(1.0), "U": traced.Weight(1.0), "V": traced.Weight(1.0), "b": traced.Bias(0.1)}
        x = rng.normal(size=(4, 4, 3))
        label = "Elman RNN, tanh, 4 steps in lax.scan (W reused at every step), 4 sequences of 4 x 3"
    elif name == "attention":
        def apply(p, x):
            h = x @ p["W0"]
            k, v = h @ p["Wk"], h @ p["Wv"]
            a = jax.nn.softmax(0.5 * jnp.einsum("btd,bsd->bts", k, k) / k.shape[-1], axis=-1)
            o = jax.nn.relu(h + jnp.einsum("bts,bsd->btd", a, v) @ p["Wo"])
            return jnp.mean(o, axis=1) @ p["W1"]

        params = {"W0": z((3, width)), "Wk": z((width, width)), "Wv": z((width, width)), "Wo": z((width, width)),
                  "W1": z((width, 1))}
        priors = {"*": traced.Weight(1.0)}
        x = rng.normal(size=(3, 4, 3))
        label = "softmax self-attention (queries tied to keys, 1/width scores), residual, ReLU, mean, 3 x 4 x 3"
    else:
        raise ValueError(f"traced-convergence: unknown model {name!r}; models: {', '.join(MODELS)}")
    return apply, params, priors, jnp.asarray(x), label


def _slope(widths, errors) -> float:
    """Least-squares slope of log(error) against log(width)."""
    return float(np.polyfit(np.log(np.asarray(widths, float)), np.log(np.asarray(errors, float)), 1)[0])


def run(args) -> Report:
    jax.config.update("jax_enable_x64", True)  # experiments choose float64; the library never does

    from smnngp import traced
    from smnngp.empirical import empirical_ntk, sample_outputs

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            raise ValueError(f"traced-convergence: unknown model {m!r}; models: {', '.join(MODELS)}")
    if args.widths:
        widths = [int(w) for w in args.widths.split(",")]
    else:
        widths = [16, 128] if args.quick else [64, 256, 1024, 4096]
    if len(widths) < 2 or any(w < 1 for w in widths):
        raise ValueError(f"traced-convergence: give at least two positive widths, got {widths}")
    draws = args.draws or (300 if args.quick else 2000)
    ntk_draws = args.ntk_draws or (3 if args.quick else 8)
    key = jax.random.PRNGKey(args.seed)

    results, md = {}, []
    for mi, name in enumerate(models):
        per_width, rows = {}, []
        label = None
        for wi, w in enumerate(widths):
            apply, params, priors, x, label = _model(name, w)
            init_fn, apply_fn, kernel_fn = traced.infinite_width(apply, params, priors=priors,
                                                                 quadrature_degree=args.quadrature_degree)
            exact = kernel_fn(x, None, ("nngp", "ntk"))
            nngp, ntk = np.asarray(exact.nngp), np.asarray(exact.ntk)
            progress.note(f"{name}: width {w} ({wi + 1}/{len(widths)}), {draws} networks for the NNGP")
            k = jax.random.fold_in(jax.random.fold_in(key, mi), wi)
            f = sample_outputs(init_fn, apply_fn, x, k, draws, chunk=min(draws, max(1, 2**25 // (w * w))))[:, :, 0]
            prods = f[:, :, None] * f[:, None, :]
            emp = prods.mean(0)
            se = prods.std(0, ddof=1) / np.sqrt(draws)
            iu = np.triu_indices(len(x))
            nngp_err = float(np.linalg.norm(emp - nngp) / np.linalg.norm(nngp))
            floor = float(np.linalg.norm(se) / np.linalg.norm(nngp))
            zmax = float(np.max(np.abs(emp - nngp)[iu] / se[iu]))
            progress.note(f"{name}: width {w}, empirical NTK of {ntk_draws} networks")
            ntk_errs = []
            for j in range(ntk_draws):
                _, p = init_fn(jax.random.fold_in(k, 10_000 + j), x.shape)
                emp_ntk = np.asarray(empirical_ntk(apply_fn, p, x))
                ntk_errs.append(float(np.linalg.norm(emp_ntk - ntk) / np.linalg.norm(ntk)))
            per_width[w] = dict(nngp_rel_frobenius=nngp_err, monte_carlo_floor=floor, max_abs_z=zmax,
                                ntk_mean_rel_frobenius=float(np.mean(ntk_errs)), ntk_draws=ntk_draws, draws=draws)
            rows.append([w, draws, nngp_err, floor, zmax, ntk_draws, float(np.mean(ntk_errs))])
        slope = _slope(widths, [per_width[w]["ntk_mean_rel_frobenius"] for w in widths])
        results[name] = dict(label=label, per_width=per_width, ntk_loglog_slope=slope,
                             activations=[how for _, how in kernel_fn.activations(x.shape)])
        first, last = per_width[widths[0]], per_width[widths[-1]]
        md.append(
            f"## {name}\n\n{label}. Activations read as: {', '.join(sorted(set(results[name]['activations'])))}.\n\n"
            + markdown_table(["width", "networks (NNGP)", "rel. Frobenius error of E[f f']", "Monte-Carlo floor",
                              "max |z| (SE units)", "networks (NTK)", "mean rel. error of the empirical NTK"], rows)
            + f"\n\n- NNGP: error {first['nngp_rel_frobenius']:.3f} at width {widths[0]}, "
            f"{last['nngp_rel_frobenius']:.3f} at width {widths[-1]}, against a Monte-Carlo floor of "
            f"{last['monte_carlo_floor']:.3f} with {draws} networks; the worst entry at width {widths[-1]} is "
            f"{last['max_abs_z']:.2f} standard errors from the traced NNGP.\n"
            f"- NTK: error {first['ntk_mean_rel_frobenius']:.3f} at width {widths[0]}, "
            f"{last['ntk_mean_rel_frobenius']:.3f} at width {widths[-1]}; log-log slope against the width "
            f"{slope:.2f} (-0.5 is the Monte-Carlo rate 1/sqrt(width)).\n")
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    header = (f"Models written in plain JAX, kernels from `smnngp.traced.infinite_width` (quadrature: "
              f"{args.quadrature_degree} nodes per axis), float64, on {devices}.\n\n")
    return Report(results=dict(widths=widths, models=results, device=devices,
                               quadrature_degree=args.quadrature_degree), markdown=header + "\n".join(md))
