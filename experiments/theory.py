"""Finite networks against their scale-mixture limits (paper Sec. 4.1, Figs 1 cols 3-5, 2, 3; notes 3.1).

Networks: 3 hidden Erf layers of width n in NTK parameterisation
(``Dense(n, W_std, b_std)``), then the readout ``Dense(1, W_std=sigma_v)``
written as ``sigma_v * Dense(1, W_std=1)`` (the multiplier form under which the
NTK is ``sigma_v^2`` times that of the ``W_std=1`` network, notes 1.5), with
``sigma_v^2 ~ InvGamma(a, b)`` drawn once per network. Data: 5 points
``x ~ U[-pi, pi]``, ``y = sin x + 0.1 eps`` (fixed data seed), one test input
``x* = 0.08``. Three regimes, each against its limit ``t(2a, loc, sqrt(b/a var))``:

* ``init`` (Thm 3.1): the output at initialisation; loc 0, var ``Kbar(x*, x*)``;
* ``readout`` (Thm 3.2): readout-only gradient flow run to convergence, computed
  in closed form per network (notes 1.5):
  ``f* = k*X Kn^{-1} Y + sigma_v (phi* v0 - k*X Kn^{-1} Phi v0)`` with the
  features' Gram ``Kn`` (:func:`readout_limit`); limit from
  `smnngp.predict` with ``get='nngp'`` at ``t = inf``;
* ``full`` (Thm 3.3): full-batch gradient descent of all layers (optax SGD with
  heavy-ball momentum, learning rate from each network's NTK top eigenvalue,
  :func:`full_training`) until ``max |f(X) - Y| < tol``; limit from
  ``get='ntk'`` at ``t = inf``. A few networks are retrained by plain gradient
  descent to measure how much the optimiser changes the trained outputs.

Beyond the paper's visual check: a Kolmogorov-Smirnov test per (regime, width),
and, for ``init`` and ``readout``, the KS distance of the Rao-Blackwellised
finite-width law. Given a network's hidden weights its output is exactly
``t(2a, m_i, sqrt(b/a) s_i)``; the average of these CDFs over networks estimates
the finite-width CDF with far less noise than the empirical CDF, so its sup
distance to the limit shows the convergence in width that a 1,000-sample KS
test cannot resolve.

Work is saved per cell into ``--out/cells`` (``.npz`` with the settings that
produced it); a rerun with the same settings skips finished cells.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import zlib

import numpy as np
from scipy import stats

from experiments.report import Report, markdown_table

DESCRIPTION = "finite nets vs their scale-mixture limits (Figs 1-3): init / readout / full GD, KS per width"

DATA_SEED = 1  # 5 training points whose NTK is well conditioned (kappa ~ 2e2; seed 0 gives 2e3: 2 points 0.03 apart)
X_TEST = 0.08  # the repo's test index 20 of linspace(-pi, pi, 40)
B_STD = 0.05
DEPTH = 3
LR_FACTOR = 1.0  # learning rate = LR_FACTOR * N / lambda_max(empirical NTK at init)
MOMENTUM = 0.9


def add_arguments(parser):
    parser.add_argument("--widths", type=str, default=None, help="comma-separated widths (default 64,...,1024)")
    parser.add_argument("--networks", type=int, default=None, help="networks per width, init/readout (default 2000)")
    parser.add_argument("--train-networks", type=int, default=None,
                        help="networks per width for full training (default 200)")
    parser.add_argument("--w-std", type=float, default=math.sqrt(8.0),
                        help="hidden W_std (default sqrt(8): weight variance 8/fan_in, the paper's; the repo used 8)")
    parser.add_argument("--max-steps", type=int, default=None, help="GD step cap for full training (default 6000)")
    parser.add_argument("--tol", type=float, default=1e-3, help="full training stops when max|f(X) - Y| < tol")
    parser.add_argument("--fresh", action="store_true", help="recompute cells even if saved ones match")


# ---------------------------------------------------------------------------
# Architectures and data
# ---------------------------------------------------------------------------


def mlp_hidden(stax, width, w_std, b_std=B_STD, depth=DEPTH):
    layers = []
    for _ in range(depth):
        layers += [stax.Dense(width, W_std=w_std, b_std=b_std), stax.Erf()]
    return stax.serial(*layers)


def resnet_hidden(stax, width, w_std, b_std=B_STD, blocks=2):
    """Dense -> blocks of [Erf -> Dense] + identity -> Erf (the authors' dense ResNet kernel, notes 3.1)."""
    layers = [stax.Dense(width, W_std=w_std, b_std=b_std)]
    for _ in range(blocks):
        branch = stax.serial(stax.Erf(), stax.Dense(width, W_std=w_std, b_std=b_std))
        layers += [stax.FanOut(2), stax.parallel(branch, stax.Identity()), stax.FanInSum()]
    layers.append(stax.Erf())
    return stax.serial(*layers)


def network(stax, arch, width, w_std):
    """(hidden, full): ``full = serial(hidden, Dense(1, W_std=1))``; sigma_v multiplies the output."""
    hidden = (mlp_hidden if arch == "mlp" else resnet_hidden)(stax, width, w_std)
    return hidden, stax.serial(hidden, stax.Dense(1, W_std=1.0))


def make_data(seed=DATA_SEED):
    rs = np.random.RandomState(seed)
    x = rs.uniform(-np.pi, np.pi, size=(5, 1))
    y = np.sin(x) + 0.1 * rs.normal(size=(5, 1))
    return x, y, np.array([[X_TEST]])


# ---------------------------------------------------------------------------
# Finite networks
# ---------------------------------------------------------------------------


def readout_limit(phi_tr, phi_te, v0, y, sigma_v=1.0):
    """t -> inf output of readout-only gradient flow on MSE for one finite network (notes 1.5).

    ``f(x) = sigma_v * phi(x) . v`` with features ``phi`` (already divided by
    sqrt(width)) and trainable readout ``v`` starting at ``v0``. Gradient flow
    moves ``v`` in the row space of ``Phi_tr`` until the training outputs equal
    ``y``: ``f* = k*X Kn^{-1} y + sigma_v (phi* v0 - k*X Kn^{-1} Phi_tr v0)``
    with ``Kn = Phi_tr Phi_tr^T``, ``k*X = phi* Phi_tr^T`` (sigma_v^2 cancels).
    Works on stacked networks (leading axes).
    """
    import jax.numpy as jnp

    gram = phi_tr @ jnp.swapaxes(phi_tr, -1, -2)
    cross = phi_te @ jnp.swapaxes(phi_tr, -1, -2)
    A = jnp.swapaxes(jnp.linalg.solve(gram, jnp.swapaxes(cross, -1, -2)), -1, -2)  # k*X Kn^{-1}
    f0_tr, f0_te = phi_tr @ v0, phi_te @ v0
    return A @ y + sigma_v * (f0_te - A @ f0_tr)


def _network_quantities(hidden, width, x_all, n_train, y, keys, chunk):
    """Per network: output at x* (W_std=1 readout), the readout-limit mean and standardised fluctuation, and the
    conditional scales given the hidden weights (for the Rao-Blackwellised CDF)."""
    import jax
    import jax.numpy as jnp

    init_h, apply_h, _ = hidden
    width_shape = x_all.shape

    def gen(k):
        kh, kv = jax.random.split(k)
        _, p = init_h(kh, width_shape)
        return p, jax.random.normal(kv, (width,))

    gen_batch = jax.jit(jax.vmap(gen))

    @jax.jit
    def quantities(params, v0):
        def one(p, v):
            p = jax.tree.map(lambda a: a.astype(jnp.float64), p)
            phi = apply_h(p, x_all) / jnp.sqrt(v.shape[0])
            v = v.astype(jnp.float64)
            tr, te = phi[:n_train], phi[n_train:]
            g = te @ v  # output at x* with sigma_v = 1
            gram = tr @ tr.T
            cross = te @ tr.T
            A = jnp.linalg.solve(gram, cross.T).T
            m = A @ y  # readout limit, deterministic part
            r = g - A @ (tr @ v)  # readout limit, part multiplied by sigma_v
            s_init2 = jnp.sum(te * te, axis=-1)
            s_ro2 = s_init2 - jnp.sum(A * cross, axis=-1)
            return jnp.stack([g[0], m[0, 0], r[0], s_init2[0], s_ro2[0]])

        return jax.vmap(one)(params, v0)

    out = []
    for i in range(0, keys.shape[0], chunk):
        with jax.enable_x64(False):  # traced in float32: its Gaussians are ~3x cheaper; the forward pass is float64
            params, v0 = gen_batch(keys[i:i + chunk])
        out.append(np.asarray(quantities(params, v0)))
    return np.concatenate(out)


def full_training(full, x, y, x_te, keys, sigma2, *, chunk, block, max_steps, tol, lr_factor=1.0, momentum=0.9):
    """Full-batch gradient descent (optax SGD) of all layers for stacked networks with readout multiplier sigma_v.

    Float32. Loss ``0.5 * mean((f(X) - Y)^2)``; learning rate per network
    ``lr_factor * N / lambda_max(empirical NTK at init)`` (the inverse top
    eigenvalue of the Gauss-Newton loss Hessian J^T J / N, times lr_factor);
    sigma_v^2 scales the NTK, so this also scales the rate by 1/sigma_v^2 and
    every network trains at the same speed. Heavy-ball momentum (``momentum``;
    None for plain GD) shortens the slow modes from ~kappa to ~sqrt(kappa)
    steps; for the linearised network every such first-order method moves the
    parameters in the row space of the Jacobian and converges to the same
    interpolant as gradient flow, so the t -> inf limit (Thm 3.3) is unchanged.
    Stops after the first block of ``block`` steps at which every finite
    network of the chunk has ``max|f(X) - Y| < tol``, or at ``max_steps``.
    Returns f(x*), final residuals (NaN for a diverged network), steps, learning rates.
    """
    import jax
    import jax.numpy as jnp
    import optax

    init_fn, apply_fn, _ = full
    n = y.size

    with jax.enable_x64(False):
        xf, yf, xtf = (jnp.asarray(a, jnp.float32) for a in (x, y, x_te))

        def f(p, s, xx):
            return s * apply_fn(p, xx)[:, 0]

        def loss(p, s):
            return 0.5 * jnp.mean((f(p, s, xf) - yf[:, 0]) ** 2)

        def one_init(key, s):
            _, p = init_fn(key, xf.shape)
            jac = jax.jacrev(lambda q: f(q, s, xf))(p)
            ntk = sum(leaf.reshape(n, -1) @ leaf.reshape(n, -1).T for leaf in jax.tree.leaves(jac))
            lam_max = jnp.linalg.eigvalsh(ntk)[-1]
            return p, lr_factor * n / lam_max

        def gd_block(p, s, lr):
            opt = optax.sgd(lr, momentum=momentum)
            state = opt.init(p)

            def body(carry, _):
                p, state = carry
                updates, state = opt.update(jax.grad(loss)(p, s), state, p)
                return (optax.apply_updates(p, updates), state), None

            (p, _), _ = jax.lax.scan(body, (p, state), None, length=block)
            return p

        def residual(p, s):
            return jnp.max(jnp.abs(f(p, s, xf) - yf[:, 0]))

        @jax.jit
        def train(keys, s):
            p, lr = jax.vmap(one_init)(keys, s)
            res0 = jax.vmap(residual)(p, s)

            def cond(c):
                _, k, res = c
                worst = jnp.max(jnp.where(jnp.isfinite(res), res, 0.0))  # a diverged network cannot converge
                return (k < max_steps) & (worst >= tol)

            def body(c):
                p, k, _ = c
                p = jax.vmap(gd_block)(p, s, lr)
                return p, k + block, jax.vmap(residual)(p, s)

            p, steps, res = jax.lax.while_loop(cond, body, (p, jnp.int32(0), res0))
            f_te = jax.vmap(lambda q, si: f(q, si, xtf)[0])(p, s)
            return f_te, res, steps, lr

        outs = []
        for i in range(0, keys.shape[0], chunk):
            s = jnp.sqrt(jnp.asarray(sigma2[i:i + chunk], jnp.float32))
            f_te, res, steps, lr = train(keys[i:i + chunk], s)
            outs.append((np.asarray(f_te, np.float64), np.asarray(res, np.float64),
                         np.full(len(f_te), int(steps)), np.asarray(lr, np.float64)))
    return tuple(np.concatenate(c) for c in zip(*outs))


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def student_t_limit(mean, var, a, b):
    """Limit law t(2a, mean, sqrt(b/a var)) as scipy, through smnngp.predict.predictive_marginals."""
    from smnngp import predict, priors

    law = predict.predictive_marginals(np.array([mean]), np.array([[var]]), priors.InverseGamma(a, b))
    return stats.t(df=float(np.ravel(law.df)[0]), loc=float(np.ravel(law.loc)[0]), scale=float(np.ravel(law.scale)[0]))


def rao_blackwell_ks(loc, scale, limit, df):
    """sup_u |mean_i T_df((u - loc_i) / scale_i) - F_limit(u)| and its Monte-Carlo standard error at the sup."""
    u = limit.ppf(np.linspace(5e-4, 1 - 5e-4, 801))
    cdfs = stats.t.cdf((u[None, :] - loc[:, None]) / scale[:, None], df)
    diff = np.abs(cdfs.mean(0) - limit.cdf(u))
    j = int(np.argmax(diff))
    return float(diff[j]), float(cdfs[:, j].std(ddof=1) / np.sqrt(len(loc)))


def _spearman(x, y):
    if len(x) < 3:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


# ---------------------------------------------------------------------------
# Cells with checkpoints
# ---------------------------------------------------------------------------


def _cell_key(key, name):
    import jax

    return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


class _Cells:
    def __init__(self, out, settings, fresh):
        self.dir = os.path.join(out, "cells")
        os.makedirs(self.dir, exist_ok=True)
        self.settings = settings
        self.fresh = fresh
        self.seconds = {}  # compute time of every cell used, as first computed

    def get(self, name, spec, compute):
        """Load cell ``name`` if saved with the same settings and ``spec``, else compute and save it."""
        tag = json.dumps({"settings": self.settings, "spec": spec}, sort_keys=True)
        path = os.path.join(self.dir, name + ".npz")
        if not self.fresh and os.path.exists(path):
            with np.load(path) as z:
                if str(z["_tag"]) == tag:
                    data = {k: z[k] for k in z.files if k != "_tag"}
                    self.seconds[name] = float(data["seconds"])
                    return data, True
        start = time.perf_counter()
        data = compute()
        data["seconds"] = np.asarray(time.perf_counter() - start)
        tmp = path + ".tmp.npz"
        np.savez(tmp, _tag=np.asarray(tag), **data)
        os.replace(tmp, path)
        self.seconds[name] = float(data["seconds"])
        return data, False


# ---------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------


def _progress(total, desc):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=2.0, leave=False)


def run(args) -> Report:
    import jax

    jax.config.update("jax_enable_x64", True)  # limits and closed forms in float64; full training is float32
    from smnngp import predict, priors, stax

    quick = args.quick
    widths = ([int(w) for w in args.widths.split(",")] if args.widths else
              ([64, 256] if quick else [64, 128, 256, 512, 1024]))
    n_nets = args.networks or (200 if quick else 1000)
    n_train_nets = args.train_networks or (16 if quick else 200)
    n_sweep_nets = max(n_train_nets // 2, 1)  # extra a values of the Fig. 2 sweep under full training
    max_steps = args.max_steps or (1500 if quick else 2000)
    w_std, tol = float(args.w_std), float(args.tol)
    sweep_width = widths[-1] if quick else (512 if 512 in widths else widths[-1])
    sweep_as = [1.0, 4.0] if quick else [1.0, 2.0, 4.0, 8.0]
    a_init, a_full, a_res = 2.0, 1.0, 4.0
    res_width = sweep_width
    block = 100

    x, y, x_te = make_data()
    x_all = np.concatenate([x, x_te])
    settings = dict(seed=args.seed, data_seed=DATA_SEED, w_std=w_std, b_std=B_STD, depth=DEPTH, x_test=X_TEST)
    cells = _Cells(args.out, settings, getattr(args, "fresh", False))
    key = jax.random.PRNGKey(args.seed)

    # -- limits --------------------------------------------------------------------------------------------
    limits = {}
    for arch in ("mlp", "resnet"):
        kernel_fn = jax.jit(network(stax, arch, 1, w_std)[1][2], static_argnames="get")
        ens = predict.gradient_descent_mse_ensemble(kernel_fn, x, y)(None, x_te, ("nngp", "ntk"))
        k_train = kernel_fn(x, None, ("nngp", "ntk"))
        limits[arch] = dict(
            init=(0.0, float(kernel_fn(x_te, None, "nngp")[0, 0])),
            readout=(float(ens.nngp.mean[0, 0]), float(ens.nngp.covariance[0, 0])),
            full=(float(ens.ntk.mean[0, 0]), float(ens.ntk.covariance[0, 0])),
            ntk_eigenvalues=np.linalg.eigvalsh(np.asarray(k_train.ntk)).tolist(),
            nngp_eigenvalues=np.linalg.eigvalsh(np.asarray(k_train.nngp)).tolist(),
        )

    rows = []  # one dict per (mode, arch, width, a)
    samples = {}

    def add_row(mode, arch, width, a, draws, extra):
        mean, var = limits[arch][mode]
        lim = student_t_limit(mean, var, a, a)
        ks = stats.kstest(draws, lim.cdf)
        rows.append(dict(mode=mode, arch=arch, width=width, a=a, b=a, n_networks=len(draws), ks=float(ks.statistic),
                         p=float(ks.pvalue), limit=dict(df=2 * a, loc=mean, scale=math.sqrt(var)), **extra))
        samples[(mode, arch, width, a)] = draws

    # -- init and readout: the same networks, sigma_v drawn per prior --------------------------------------
    init_cells = [("mlp", w) for w in widths] + ([("resnet", res_width)] if not quick else [])
    bar = _progress(len(init_cells), "init/readout")
    for arch, width in init_cells:
        name = f"nets_{arch}_w{width}"
        chunk = max(8, min(250, (2**22) // (width * width)))

        def compute(arch=arch, width=width, name=name, chunk=chunk):
            hidden, _ = network(stax, arch, width, w_std)
            keys = jax.random.split(_cell_key(key, name), n_nets)
            return dict(q=_network_quantities(hidden, width, x_all, len(x), y, keys, chunk))

        data, _ = cells.get(name, dict(n=n_nets, weights="float32"), compute)
        q = data["q"]
        g, m, r, s_init, s_ro = q[:, 0], q[:, 1], q[:, 2], np.sqrt(q[:, 3]), np.sqrt(np.maximum(q[:, 4], 0.0))
        a_list = [a_res] if arch == "resnet" else ([a_init] + (sweep_as if width == sweep_width else []))
        for a in dict.fromkeys(a_list):
            sig2 = np.asarray(priors.InverseGamma(a, a).sample(_cell_key(key, f"sigma_{name}_a{a}"), (n_nets,)))
            sv = np.sqrt(sig2)
            for mode, draws, loc, scale in (("init", sv * g, np.zeros_like(g), s_init),
                                            ("readout", m + sv * r, m, s_ro)):
                # given its hidden weights a network's output is t(2a, loc, sqrt(b/a) scale) exactly (b = a here)
                lim = student_t_limit(*limits[arch][mode], a, a)
                rb, rb_se = rao_blackwell_ks(loc, math.sqrt(a / a) * scale, lim, 2 * a)
                add_row(mode, arch, width, a, draws, dict(rb_ks=rb, rb_se=rb_se, seconds=float(data["seconds"])))
        bar.update()
    bar.close()

    # -- full training ---------------------------------------------------------------------------------------
    full_cells = [("mlp", w, a_full) for w in widths[:-1]]  # the widest, slowest cell last: partial runs stay useful
    full_cells += [("mlp", sweep_width, a) for a in sweep_as if a != a_full] if not quick else []
    full_cells += [("resnet", res_width, a_res)] if not quick else []
    full_cells += [("mlp", widths[-1], a_full)]
    check_width = sweep_width
    n_check = 0 if quick else min(8, n_train_nets)
    bar = _progress(len(full_cells) + (n_check > 0), "full training")

    def train_cell(arch, width, a, n_total, n_use, momentum, cap):
        """The first n_use of the n_total networks of cell (arch, width, a): keys and sigma_v^2 depend on the cell."""
        base = f"full_{arch}_w{width}_a{a:g}"
        _, full = network(stax, arch, width, w_std)
        keys = jax.random.split(_cell_key(key, base), n_total)[:n_use]
        sig2 = np.asarray(priors.InverseGamma(a, a).sample(_cell_key(key, "sigma_" + base), (n_total,)))[:n_use]
        chunk = max(4, min(32, (2**20) // (width * width)))  # small chunks: each stops when its networks converge
        f_te, res, steps, lr = full_training(full, x, y, x_te, keys, sig2, chunk=chunk, block=block, max_steps=cap,
                                             tol=tol, lr_factor=LR_FACTOR, momentum=momentum)
        return dict(f_te=f_te, residual=res, steps=steps, lr=lr, sigma2=sig2)

    full_data = {}
    for arch, width, a in full_cells:
        name = f"full_{arch}_w{width}_a{a:g}"
        n_here = n_train_nets if (arch != "mlp" or a == a_full) else n_sweep_nets
        spec = dict(n=n_here, max_steps=max_steps, tol=tol, block=block, lr_factor=LR_FACTOR, momentum=MOMENTUM)
        data, _ = cells.get(name, spec, lambda arch=arch, width=width, a=a, n=n_here:
                            train_cell(arch, width, a, n, n, MOMENTUM, max_steps))
        full_data[(arch, width, a)] = data
        res, ok = data["residual"], np.isfinite(data["residual"])
        add_row("full", arch, width, a, data["f_te"][ok],
                dict(residual_max=float(np.max(res[ok])), residual_median=float(np.median(res[ok])),
                     steps_max=int(np.max(data["steps"])), steps_median=float(np.median(data["steps"])),
                     converged=float(np.mean(res < tol)), diverged=int(np.sum(~ok)), seconds=float(data["seconds"])))
        bar.update()

    # Does the optimiser matter? Retrain the first networks of the widest cell by plain gradient descent.
    optimiser_check = None
    if n_check:
        cap = 3 * max_steps
        spec = dict(n=n_train_nets, n_use=n_check, max_steps=cap, tol=tol, block=block, lr_factor=LR_FACTOR)
        plain, _ = cells.get(f"plaingd_mlp_w{check_width}_a{a_full:g}", spec,
                             lambda: train_cell("mlp", check_width, a_full, n_train_nets, n_check, None, cap))
        diff = np.abs(plain["f_te"] - full_data[("mlp", check_width, a_full)]["f_te"][:n_check])
        rel = diff / np.sqrt(plain["sigma2"])  # in units of sigma_v, the factor of the limit's scale
        optimiser_check = dict(width=check_width, a=a_full, networks=n_check,
                               plain_gd_steps_max=int(plain["steps"].max()),
                               plain_gd_residual_max=float(np.nanmax(plain["residual"])),
                               max_abs_diff=float(np.nanmax(diff)), median_abs_diff=float(np.nanmedian(diff)),
                               median_abs_diff_over_sigma=float(np.nanmedian(rel)),
                               max_abs_diff_over_sigma=float(np.nanmax(rel)),
                               limit_scale=math.sqrt(limits["mlp"]["full"][1]), seconds=float(plain["seconds"]))
        bar.update()
    bar.close()

    figures = _figures(args.out, rows, samples, limits, widths, sweep_width, sweep_as, a_init, a_full, a_res,
                       res_width, quick)
    md = _markdown(rows, limits, widths, sweep_width, sweep_as, a_init, a_full, a_res, res_width, n_nets,
                   n_train_nets, w_std, tol, max_steps, figures, quick, optimiser_check, sum(cells.seconds.values()))
    results = dict(widths=widths, data=dict(x_train=x[:, 0], y_train=y[:, 0], x_test=X_TEST, data_seed=DATA_SEED),
                   init_scales=dict(W_std=w_std, b_std=B_STD, parameterization="ntk", readout="sigma_v * Dense(1, 1)"),
                   limits={k: {m: list(v) if isinstance(v, tuple) else v for m, v in d.items()}
                           for k, d in limits.items()},
                   cells=rows, trend=_trend(rows, widths, a_init, a_full), optimiser_check=optimiser_check,
                   cell_seconds=cells.seconds)
    return Report(results=results, markdown=md, figures=figures)

# ---------------------------------------------------------------------------
# Summaries, figures, markdown
# ---------------------------------------------------------------------------


def _main_rows(rows, mode, a):
    return sorted((r for r in rows if r["mode"] == mode and r["arch"] == "mlp" and r["a"] == a),
                  key=lambda r: r["width"])


def _trend(rows, widths, a_init, a_full):
    out = {}
    for mode, a in (("init", a_init), ("readout", a_init), ("full", a_full)):
        rs = _main_rows(rows, mode, a)
        w = [r["width"] for r in rs]
        ks = [r["ks"] for r in rs]
        entry = dict(widths=w, ks=ks, p=[r["p"] for r in rs], spearman_ks_width=_spearman(w, ks),
                     ks_smallest_width=ks[0] if ks else None, ks_largest_width=ks[-1] if ks else None)
        if rs and "rb_ks" in rs[0]:
            rb = np.array([r["rb_ks"] for r in rs])
            entry["rb_ks"] = rb.tolist()
            entry["rb_se"] = [r["rb_se"] for r in rs]
            ok = rb > 0
            if ok.sum() >= 2:
                entry["rb_loglog_slope"] = float(np.polyfit(np.log(np.array(w)[ok]), np.log(rb[ok]), 1)[0])
        out[mode] = entry
    return out


def _hist(ax, draws, lim, title):
    lo, hi = lim.ppf(0.005), lim.ppf(0.995)
    bins = np.linspace(lo, hi, int(np.clip(2 * np.sqrt(len(draws)), 10, 50)) + 1)
    inside = draws[(draws >= lo) & (draws <= hi)]
    # weights make the bars' area the fraction of ALL draws in each bin, comparable with the limit density
    ax.hist(inside, bins=bins, weights=np.full(len(inside), 1.0 / (len(draws) * (bins[1] - bins[0]))), alpha=0.55,
            color="C0", label=f"{len(draws)} networks")
    u = np.linspace(lo, hi, 400)
    ax.plot(u, lim.pdf(u), "k", lw=1.5, label="limit t")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("f(x*)")


def _figures(out, rows, samples, limits, widths, sweep_width, sweep_as, a_init, a_full, a_res, res_width, quick):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    figures = []
    by_key = {(r["mode"], r["arch"], r["width"], r["a"]): r for r in rows}
    modes = (("init", "Thm 3.1: initialisation"), ("readout", "Thm 3.2: readout trained"),
             ("full", "Thm 3.3: all layers trained"))

    def panel(ax, mode, arch, width, a, label):
        k = (mode, arch, width, a)
        if k not in samples:
            ax.set_axis_off()
            ax.set_title(f"{label}: not run", fontsize=9)
            return
        r = by_key[k]
        lim = student_t_limit(*limits[arch][mode], a, a)
        _hist(ax, samples[k], lim, f"{label}\nwidth {width}, a=b={a:g}: KS {r['ks']:.3f} (p={r['p']:.2g})")

    def save(fig, name):
        fig.tight_layout()
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        figures.append(name)

    top = widths[-1]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, (mode, label), a in zip(axes, modes, (a_init, a_init, a_full)):
        panel(ax, mode, "mlp", top, a, label)
    axes[0].legend(fontsize=7)
    save(fig, "theory_fig1_histograms.png")

    fig, axes = plt.subplots(3, len(sweep_as), figsize=(3.2 * len(sweep_as), 8.4), squeeze=False)
    for i, (mode, label) in enumerate(modes):
        for j, a in enumerate(sweep_as):
            panel(axes[i, j], mode, "mlp", sweep_width, a, label)
    save(fig, "theory_fig2_alpha_sweep.png")

    if any(k[1] == "resnet" for k in samples):
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for ax, (mode, label) in zip(axes, modes):
            panel(ax, mode, "resnet", res_width, a_res, "ResNet, " + label)
        save(fig, "theory_fig3_resnet.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for mode, a, c in (("init", a_init, "C0"), ("readout", a_init, "C1"), ("full", a_full, "C2")):
        rs = _main_rows(rows, mode, a)
        w = [r["width"] for r in rs]
        axes[0].plot(w, [r["ks"] for r in rs], "o-", color=c, label=f"{mode} (n={rs[0]['n_networks']})")
        crit = 1.358 / np.sqrt(rs[0]["n_networks"])
        axes[0].axhline(crit, color=c, ls=":", lw=1)
        if "rb_ks" in rs[0]:
            axes[1].errorbar(w, [r["rb_ks"] for r in rs], yerr=[r["rb_se"] for r in rs], fmt="o-", color=c,
                             label=mode)
    for ax, title in zip(axes, ("KS statistic of the samples (dotted: 5% critical value)",
                                "KS distance of the Rao-Blackwellised finite-width law")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    save(fig, "theory_ks_vs_width.png")
    return figures


def _num(v):
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _fmt_row(r, tol):
    rb = f"{r['rb_ks']:.4f} ± {r['rb_se']:.4f}" if "rb_ks" in r else ""
    res = f"{r['residual_max']:.1e} ({100 * r['converged']:.0f}% < tol)" if "residual_max" in r else ""
    steps = f"{r['steps_median']:.0f} / {r['steps_max']}" if "steps_max" in r else ""
    return [r["mode"], r["width"], f"{r['a']:g}", r["n_networks"], f"{r['ks']:.4f}", f"{r['p']:.3g}", rb, res, steps,
            f"{r['seconds']:.0f}"]


_HEAD = ["mode", "width", "a = b", "networks", "KS", "p", "RB-KS ± se", "max train residual", "GD steps median / max",
         "cell s"]


def _markdown(rows, limits, widths, sweep_width, sweep_as, a_init, a_full, a_res, res_width, n_nets, n_train_nets,
              w_std, tol, max_steps, figures, quick, optimiser_check=None, cell_seconds=0.0):
    x, y, _ = make_data()
    lim = limits["mlp"]
    eig = np.array(lim["ntk_eigenvalues"])
    lines = [
        "Finite networks against their scale-mixture limits (paper Sec. 4.1, Figs 1-3), with a KS test per width.",
        "",
        "## Setup",
        "",
        f"- Network: {DEPTH} hidden Erf layers, `Dense(n, W_std={w_std:.4g}, b_std={B_STD})` in NTK "
        f"parameterisation (weights N(0,1) scaled by W_std/sqrt(fan_in): weight variance {w_std**2:.3g}/fan_in; "
        f"bias variance {B_STD}^2), then the readout `sigma_v * Dense(1, W_std=1)` with "
        "sigma_v^2 ~ InvGamma(a, b) drawn once per network (the multiplier form, NTK = sigma_v^2 x NTK(W_std=1)).",
        "- Initialisation scales: the paper states weight variance 8/n and bias variance 0.05^2/n; we use "
        f"W_std = {w_std:.4g} (variance {w_std**2:.3g}/n) and b_std = {B_STD} (variance {B_STD**2:g}, "
        "neural-tangents' convention, no 1/n). The authors' repo used W_std = 8 (variance 64/n), b_std = 0.05 "
        "(run with `--w-std 8` for that setting).",
        f"- Data: x = {np.round(x[:, 0], 3).tolist()}, y = sin x + 0.1 N(0,1) = {np.round(y[:, 0], 3).tolist()} "
        f"(data seed {DATA_SEED}); test input x* = {X_TEST}. Train NTK (W_std=1 readout) eigenvalues "
        f"{np.round(eig, 3).tolist()} (condition number {eig[-1] / eig[0]:.0f}).",
        f"- Limits (t(2a, loc, sqrt(b/a) sd)): init loc 0, sd {math.sqrt(lim['init'][1]):.4f}; readout (NNGP, t=inf) "
        f"loc {lim['readout'][0]:.4f}, sd {math.sqrt(lim['readout'][1]):.4f}; full (NTK, t=inf, Theta') loc "
        f"{lim['full'][0]:.4f}, sd {math.sqrt(lim['full'][1]):.4f}; all from `smnngp.predict` with the kernel of "
        "the W_std=1-readout network, diag_reg = 0.",
        f"- Init and readout: {n_nets} networks per width, the same networks for both regimes (readout: the "
        "closed-form t -> inf solution of readout-only gradient flow per network). "
        f"Full training: {n_train_nets} networks per width ({max(n_train_nets // 2, 1)} for the extra a values of "
        "the sweep), float32, full-batch gradient descent of all layers with optax `sgd(lr, momentum="
        f"{MOMENTUM})` on 0.5 mean (f - y)^2, per-network lr = {LR_FACTOR} N / lambda_max(empirical NTK at init) "
        "(which scales as 1/sigma_v^2), in blocks of 100 steps until every network of a chunk has "
        f"max|f(X) - Y| < {tol:g} (cap {max_steps} steps). Heavy-ball momentum is our choice for the budget: "
        "for the linearised network it converges to the same interpolant as gradient flow, so the t = inf "
        "limit is unchanged. Plain GD (the paper's repo: lr 1e-3, 10k steps) would need ~10x more steps.",
        "- KS: `scipy.stats.kstest` of the outputs at x* against the limit CDF. RB-KS: sup-distance between the "
        "average over networks of each network's exact conditional law given its hidden weights, "
        "t(2a, m_i, sqrt(b/a) s_i), and the limit (a low-noise estimate of the true finite-width KS distance; "
        "se = Monte-Carlo standard error at the sup).",
        "",
        "## KS per regime and width (MLP)",
        "",
    ]
    regimes = (("init", a_init), ("readout", a_init), ("full", a_full))
    main = [r for mode, a in regimes for r in _main_rows(rows, mode, a)]
    lines.append(markdown_table(_HEAD, [_fmt_row(r, tol) for r in main]))
    lines += ["", "## Does the distance fall with width?", ""]
    trend = _trend(rows, widths, a_init, a_full)
    for mode, t in trend.items():
        crit = 1.358 / math.sqrt(_main_rows(rows, mode, a_init if mode != "full" else a_full)[0]["n_networks"])
        s = (f"- {mode}: KS {t['ks_smallest_width']:.4f} at width {widths[0]} -> {t['ks_largest_width']:.4f} at "
             f"width {widths[-1]} (Spearman rank correlation with width {_num(t['spearman_ks_width'])}; 5% critical "
             f"value {crit:.3f}; smallest p-value {min(t['p']):.2g})")
        if "rb_ks" in t:
            s += (f"; RB-KS {t['rb_ks'][0]:.4f} -> {t['rb_ks'][-1]:.4f}"
                  + (f", log-log slope {t['rb_loglog_slope']:.2f}" if "rb_loglog_slope" in t else ""))
        lines.append(s + ".")
    lines.append(
        "- Reading: sample KS statistics below the critical value are indistinguishable from the limit at this "
        "number of networks; the RB-KS column resolves the remaining finite-width distance.")
    sweep = sorted((r for r in rows if r["arch"] == "mlp" and r["width"] == sweep_width and r["a"] in sweep_as),
                   key=lambda r: (r["mode"], r["a"]))
    lines += ["", f"## Prior hyperparameter sweep a = b in {[f'{a:g}' for a in sweep_as]} at width {sweep_width} "
              "(Fig. 2)", "", markdown_table(_HEAD, [_fmt_row(r, tol) for r in sweep])]
    res = [r for r in rows if r["arch"] == "resnet"]
    if res:
        lines += ["", f"## Dense ResNet (Fig. 3), width {res_width}, a = b = {a_res:g}", "",
                  "Dense -> 2 x [Erf -> Dense] + identity -> Erf -> readout; same scales.", "",
                  markdown_table(_HEAD, [_fmt_row(r, tol) for r in sorted(res, key=lambda r: r["mode"])])]
    if optimiser_check:
        oc = optimiser_check
        lines += ["", "## Does the optimiser matter?", "",
                  f"The first {oc['networks']} networks of the width-{oc['width']} full-training cell retrained by "
                  f"plain gradient descent (no momentum, same learning rate, up to {oc['plain_gd_steps_max']} steps, "
                  f"max train residual {oc['plain_gd_residual_max']:.1e}): |f(x*) difference| median "
                  f"{oc['median_abs_diff']:.3g}, max {oc['max_abs_diff']:.3g}; divided by each network's sigma_v: "
                  f"median {oc['median_abs_diff_over_sigma']:.3g}, max {oc['max_abs_diff_over_sigma']:.3g}, against "
                  f"the limit's scale sqrt(Theta') = {oc['limit_scale']:.3f} (times sigma_v). In the lazy "
                  "(infinite-width) regime the two optimisers reach the same interpolant; the difference measures "
                  "how far these networks still are from it."]
    lines += ["", "## Figures", ""] + [f"- `{f}`" for f in figures]
    lines += ["", f"Compute time of all cells (as first computed, summed over resumed runs): {cell_seconds:.0f} s; the "
              "header's wall time is that of the last (possibly resumed) invocation."]
    if quick:
        lines += ["", "(--quick: few widths and networks, no ResNet, a reduced sweep.)"]
    return "\n".join(lines) + "\n"
