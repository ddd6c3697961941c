"""finite.ard: NARX regressors, groupings, Hessians against jax.hessian, the hyperparameter updates against a
direct differentiation of the evidence's concave part, pruning, Laplace, simulation, and samplers.ard's HMC
against the closed-form posterior of an ARD linear model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from finite import ard


def _data(n=40, d=5, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, d))
    y = np.sin(Z[:, 0]) + 0.3 * Z[:, 1] + 0.05 * rng.standard_normal(n)
    return jnp.asarray(Z), jnp.asarray(y)


def test_narx_regressors_layout():
    u = np.arange(10.0)
    y = 100 + np.arange(10.0)
    Z, t = ard.narx_regressors(u, y, 2, 3)
    # t = 3: [u(1), u(2), u(3), y(0), y(1), y(2)], target y(3)
    np.testing.assert_array_equal(Z[0], [1, 2, 3, 100, 101, 102])
    np.testing.assert_array_equal(Z[-1], [7, 8, 9, 106, 107, 108])
    np.testing.assert_array_equal(t, y[3:])
    assert Z.shape == (7, 2 + 1 + 3)
    with pytest.raises(ValueError, match="lags"):
        ard.narx_regressors(u, y, -1)
    with pytest.raises(ValueError, match="equal length"):
        ard.narx_regressors(u, y[:5], 2)
    with pytest.raises(ValueError, match="too short"):
        ard.narx_regressors(u[:3], y[:3], 3)


def test_groupings_cover_every_weight_once():
    for group, n_groups in (("element", [12]), ("row", [3]), ("column", [4]), ("row+column", [3, 4]),
                            ("shape", [4])):
        gs = ard.groupings((3, 4), group, block=(2, 2))
        assert [g.num for g in gs] == n_groups
        for g in gs:
            assert g.ids.shape == (3, 4)
            assert set(np.unique(g.ids)) == set(range(g.num))
    rows = ard.groupings((3, 4), "row")[0].ids
    assert (rows[1] == 1).all()
    blocks = ard.groupings((3, 4), "shape", block=(2, 2))[0].ids
    np.testing.assert_array_equal(blocks, [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3]])
    with pytest.raises(ValueError, match="unknown group"):
        ard.groupings((3, 4), "diagonal")


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "relu"])
def test_hessian_options_against_jax_hessian(activation):
    Z, y = _data()
    model = ard.mlp((5, 4, 3, 1), activation)
    params = model.init(jax.random.PRNGKey(1), jnp.float64)
    w = jnp.asarray(np.random.default_rng(2).uniform(0.5, 1.5, y.shape))
    exact = ard.autodiff_layer_hessians(model, params, Z, y, w, 0.3)  # jax.hessian, the independent check
    recursion = ard.layer_hessians(model, params, Z, y, w, 0.3, "exact")
    diag = ard.layer_hessians(model, params, Z, y, w, 0.3, "diagonal")
    gn = ard.layer_hessians(model, params, Z, y, w, 0.3, "gauss-newton")
    for l, (n_in, n_out) in enumerate(model.shapes):
        # the recursion of Eq. 21 summed over samples is the exact block, and its diagonal the exact diagonal
        np.testing.assert_allclose(recursion[l], exact[l], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(diag[l], jnp.diag(exact[l]).reshape(n_in, n_out), rtol=1e-9, atol=1e-12)
        # the Gauss-Newton block is PSD
        assert float(jnp.linalg.eigvalsh(gn[l])[0]) > -1e-9
    # the output layer is linear: exact = Gauss-Newton there, for every activation
    np.testing.assert_allclose(gn[-1], exact[-1], rtol=1e-10, atol=1e-12)
    if activation == "relu":  # f'' = 0: Gauss-Newton is the exact Hessian in every layer
        for a, b in zip(gn, exact):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    else:  # the D^l term matters in a hidden layer
        assert float(jnp.max(jnp.abs(gn[0] - exact[0]))) > 1e-6


def test_kfac_is_exact_for_one_sample():
    Z, y = _data(n=1)
    model = ard.mlp((5, 4, 3, 1), "tanh")
    params = model.init(jax.random.PRNGKey(3), jnp.float64)
    w = jnp.ones(1)
    exact = ard.autodiff_layer_hessians(model, params, Z, y, w, 1.0)
    kfac = ard.layer_hessians(model, params, Z, y, w, 1.0, "kfac")
    for a, b in zip(kfac, exact):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def _concave_gradient(W_layer, omega_prev, H, groupings):
    """alpha_g = d/dUpsilon_g [log|Upsilon| + log|Upsilon^{-1} + H|] at Upsilon_g = ||W_g|| / omega_g, by autodiff
    of the log-determinants (Eq. 34), for the per-weight variance 1 / sum_k 1/Upsilon^k."""
    ups = []
    for g, om in zip(groupings, omega_prev):
        norms = jnp.sqrt(jax.ops.segment_sum(W_layer.ravel() ** 2, jnp.asarray(g.ids.ravel()), num_segments=g.num))
        ups.append(norms / om)

    def v(groups):
        prec = sum(1.0 / gv[jnp.asarray(g.ids.ravel())] for gv, g in zip(groups, groupings))
        return -jnp.sum(jnp.log(prec)) + jnp.linalg.slogdet(jnp.diag(prec) + H)[1]
    return jax.grad(v)(ups)


@pytest.mark.parametrize("group", ["element", "row", "column", "row+column", "shape"])
def test_hyper_update_matches_the_derivative_of_the_evidence(group):
    rng = np.random.default_rng(4)
    model = ard.mlp((4, 3, 1))
    params = tuple(ard.Layer(jnp.asarray(rng.standard_normal(s)), jnp.zeros(s[1])) for s in model.shapes)
    config = ard.ArdConfig(group=group, block=(2, 2), hessian="exact")
    state = ard.init_state(model, config, jnp.float64)
    state = state._replace(omega=tuple(tuple(jnp.asarray(rng.uniform(0.5, 2.0, o.shape)) for o in om)
                                       for om in state.omega))
    Hs = []
    for (a, b) in model.shapes:
        X = rng.standard_normal((a * b, a * b + 2))
        Hs.append(jnp.asarray(X @ X.T / (a * b)))
    new = ard.hyper_update(params, state, tuple(Hs), model, config)
    for l, shape in enumerate(model.shapes):
        gs = ard.groupings(shape, group, (2, 2))
        alpha = _concave_gradient(params[l].W, state.omega[l], Hs[l], gs)
        for k in range(len(gs)):
            np.testing.assert_allclose(new.omega[l][k], np.sqrt(np.abs(alpha[k])), rtol=1e-7)
        # the new per-weight variance: Upsilon_g = ||W_g|| / omega_g(t), combined over the groupings
        expect = 0
        for g, om in zip(gs, state.omega[l]):
            norms = np.sqrt(np.bincount(g.ids.ravel(), np.asarray(params[l].W).ravel() ** 2, g.num))
            expect = expect + 1.0 / (norms / np.asarray(om))[g.ids]
        np.testing.assert_allclose(new.upsilon[l], 1.0 / expect, rtol=1e-10)
    # element-wise grouping: Eq. 12 exactly, alpha = 1/upsilon - C/upsilon^2 with C = diag((Upsilon^-1 + H)^-1)
    if group == "element":
        u = np.asarray(new.upsilon[0]).ravel()
        C = np.diag(np.linalg.inv(np.diag(1 / u) + np.asarray(Hs[0])))
        np.testing.assert_allclose(np.asarray(new.omega[0][0]) ** 2, np.abs(1 / u - C / u ** 2), rtol=1e-6)


def test_diagonal_hessian_update_equals_dense_update_with_a_diagonal_block():
    rng = np.random.default_rng(5)
    model = ard.mlp((3, 2, 1))
    params = tuple(ard.Layer(jnp.asarray(rng.standard_normal(s)), jnp.zeros(s[1])) for s in model.shapes)
    diag_h = tuple(jnp.asarray(rng.uniform(0.1, 3.0, s)) for s in model.shapes)
    for group in ("element", "row+column"):
        c_d = ard.ArdConfig(group=group, hessian="diagonal")
        c_e = ard.ArdConfig(group=group, hessian="exact")
        st = ard.init_state(model, c_d, jnp.float64)
        a = ard.hyper_update(params, st, diag_h, model, c_d)
        b = ard.hyper_update(params, st, tuple(jnp.diag(h.ravel()) for h in diag_h), model, c_e)
        for x, z in zip(jax.tree_util.tree_leaves(a.omega), jax.tree_util.tree_leaves(b.omega)):
            np.testing.assert_allclose(x, z, rtol=1e-9)


def test_algorithm1_prunes_monotonically_and_never_revives():
    Z, y = _data(n=60, d=6)
    model = ard.mlp((6, 8, 1))
    config = ard.ArdConfig(group="row+column", rounds=4, epochs=150, learning_rate=1e-2, kappa_upsilon=1e-3,
                           kappa_w=1e-3)
    res = ard.fit(model, jax.random.PRNGKey(0), Z, y, config, lam=3e-2)
    kept = [np.asarray(m) for m in res.state.masks]
    for m in kept:
        assert np.all(np.diff(m, axis=0) <= 0)  # masks only lose entries, round after round
    for W, m in zip((p.W for p in res.params), kept):
        assert np.all(np.asarray(W)[m == 0] == 0)
    frac = [float(ard.fraction_remaining(tuple(m[r] for m in kept))) for r in range(config.rounds)]
    assert frac[-1] < 1.0, "nothing was pruned on a data set where four of six inputs are noise"
    # the irrelevant regressors 2..5 lose their whole rows before the relevant ones 0 and 1
    first = kept[0][-1]
    assert first[:2].sum() >= first[2:].sum() / 2
    # the objective decreases within the first round
    assert float(res.loss[0, -1]) < float(res.loss[0, 0])


@pytest.mark.parametrize("hessian", ["diagonal", "exact"])
def test_fit_repeats_equals_fit(hessian):
    Z, y = _data(n=30, d=4)
    model = ard.mlp((4, 5, 1))
    config = ard.ArdConfig(group="column", rounds=2, epochs=40, hessian=hessian)
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    lams = jnp.asarray([1e-3, 1e-2, 1e-1])
    many = ard.fit_repeats(model, keys, Z, y, config, lam=lams)
    for r in range(3):
        one = ard.fit(model, keys[r], Z, y, config, lam=float(lams[r]))
        np.testing.assert_allclose(many.train_mse[r], one.train_mse, rtol=1e-8)
        np.testing.assert_allclose(many.params[0].W[r], one.params[0].W, rtol=1e-7, atol=1e-12)


def test_sample_weights_select_a_subset():
    Z, y = _data(n=30, d=4)
    model = ard.mlp((4, 5, 1))
    config = ard.ArdConfig(group="row", rounds=2, epochs=30)
    w = jnp.asarray((np.arange(30) < 18).astype(float))
    a = ard.fit(model, jax.random.PRNGKey(0), Z, y, config, weights=w)
    b = ard.fit(model, jax.random.PRNGKey(0), Z[:18], y[:18], config)
    np.testing.assert_allclose(a.train_mse, b.train_mse, rtol=1e-7)


def test_config_and_data_errors():
    model = ard.mlp((11, 100, 100, 1))
    with pytest.raises(ValueError, match="dense_limit"):
        ard.ArdConfig(hessian="exact").check(model)
    ard.ArdConfig(hessian="diagonal").check(model)
    with pytest.raises(ValueError, match="unknown group"):
        ard.ArdConfig(group="rows").check()
    with pytest.raises(ValueError, match="unknown hessian"):
        ard.ArdConfig(hessian="fisher").check()
    with pytest.raises(ValueError, match="learning_rate"):
        ard.ArdConfig(learning_rate=-1.0).check()
    with pytest.raises(ValueError, match="activation"):
        ard.mlp((3, 1), "gelu")
    with pytest.raises(ValueError, match="output width"):
        ard.mlp((3, 2))
    small = ard.mlp((3, 2, 1))
    Z = jnp.ones((5, 3))
    with pytest.raises(ValueError, match="Z must have shape"):
        ard.fit(small, jax.random.PRNGKey(0), jnp.ones((5, 4)), jnp.ones(5), ard.ArdConfig(epochs=2, rounds=1))
    with pytest.raises(ValueError, match="finite"):
        ard.fit(small, jax.random.PRNGKey(0), Z.at[0, 0].set(jnp.nan), jnp.ones(5), ard.ArdConfig(epochs=2, rounds=1))


def test_laplace_covariance_is_the_inverse_of_hessian_plus_prior_precision():
    Z, y = _data(n=25, d=3)
    model = ard.mlp((3, 2, 1), "tanh")
    params = model.init(jax.random.PRNGKey(0), jnp.float64)
    config = ard.ArdConfig(group="element")
    rng = np.random.default_rng(0)
    state = ard.init_state(model, config, jnp.float64)
    ups = tuple(jnp.asarray(rng.uniform(0.2, 2.0, s)) for s in model.shapes)
    masks = (jnp.ones((3, 2)).at[1, 0].set(0.0), jnp.ones((2, 1)))
    state = state._replace(upsilon=ups, masks=masks, sigma2=jnp.asarray(0.5))
    post = ard.laplace(model, params, state, Z, y, hessian="gauss-newton")
    H = ard.layer_hessians(model, params, Z, y, jnp.ones(25), 0.5, "gauss-newton")
    for F, Hl, u, m in zip(post.factors, H, ups, masks):
        keep = np.asarray(m).ravel() > 0
        cov = np.asarray(F @ F.T)
        direct = np.linalg.inv(np.asarray(Hl)[np.ix_(keep, keep)] + np.diag(1 / np.asarray(u).ravel()[keep]))
        np.testing.assert_allclose(cov[np.ix_(keep, keep)], direct, rtol=1e-8, atol=1e-12)
        assert np.all(cov[~keep] == 0)
    draws = ard.sample_laplace(jax.random.PRNGKey(1), post, 4000)
    assert np.all(np.asarray(draws[0].W)[:, 1, 0] == 0)  # a pruned weight stays pruned in every draw
    emp = np.cov(np.asarray(draws[1].W).reshape(4000, -1).T)
    np.testing.assert_allclose(emp, np.asarray(post.factors[1] @ post.factors[1].T), atol=0.1 * np.max(emp))


def test_network_laplace_is_the_inverse_of_the_gauss_newton_matrix_plus_prior_precision():
    """The joint posterior against the Hessian of the loss of the network *linearised* at the trained weights
    (``jax.linearize``; that Hessian is exactly the Gauss-Newton matrix), an independent route."""
    Z, y = _data(n=30, d=3)
    model = ard.mlp((3, 4, 2, 1), "tanh")
    params = model.init(jax.random.PRNGKey(2), jnp.float64)
    rng = np.random.default_rng(1)
    state = ard.init_state(model, ard.ArdConfig(group="element"), jnp.float64)
    ups = tuple(jnp.asarray(rng.uniform(0.2, 2.0, s)) for s in model.shapes)
    masks = (jnp.ones((3, 4)).at[2, 1].set(0.0), jnp.ones((4, 2)).at[0, 0].set(0.0), jnp.ones((2, 1)))
    w = jnp.asarray(rng.uniform(0.5, 1.5, 30))
    state = state._replace(upsilon=ups, masks=masks, sigma2=jnp.asarray(0.3))
    post = ard.laplace(model, params, state, Z, y, weights=w, hessian="gauss-newton", structure="network")
    assert post.structure == "network" and len(post.factors) == 1
    # a pytree of arrays only: jit takes it, and draws equal the eager ones
    jitted = jax.jit(ard.sample_laplace, static_argnums=2)(jax.random.PRNGKey(9), post, 5)
    eager = ard.sample_laplace(jax.random.PRNGKey(9), post, 5)
    np.testing.assert_allclose(jitted[1].W, eager[1].W, rtol=1e-10)

    sizes = [a * b for a, b in model.shapes]
    flat = jnp.concatenate([p.W.ravel() for p in params])

    def net(vec):
        parts = jnp.split(vec, np.cumsum(sizes)[:-1])
        return model.apply(tuple(ard.Layer(v.reshape(p.W.shape), p.b) for v, p in zip(parts, params)), Z)

    f0, lin = jax.linearize(net, flat)
    G = jax.hessian(lambda v: 0.5 * jnp.sum(w * (f0 + lin(v - flat) - y) ** 2) / 0.3)(flat)
    keep = np.concatenate([np.asarray(m).ravel() for m in masks]) > 0
    prior = np.concatenate([np.asarray(u).ravel() for u in ups])
    direct = np.linalg.inv(np.asarray(G)[np.ix_(keep, keep)] + np.diag(1 / prior[keep]))
    cov = np.asarray(post.factors[0] @ post.factors[0].T)
    np.testing.assert_allclose(cov[np.ix_(keep, keep)], direct, rtol=1e-8, atol=1e-12)
    assert np.all(cov[~keep] == 0)
    # cross-layer covariance is present (the per-layer posterior sets it to zero)
    assert np.max(np.abs(cov[:12, 12:20])) > 1e-3
    draws = ard.sample_laplace(jax.random.PRNGKey(3), post, 3000)
    assert np.all(np.asarray(draws[0].W)[:, 2, 1] == 0) and np.all(np.asarray(draws[1].W)[:, 0, 0] == 0)
    emp = np.cov(np.concatenate([np.asarray(d.W).reshape(3000, -1) for d in draws], axis=1).T)
    np.testing.assert_allclose(emp, cov, atol=0.1 * np.max(np.abs(cov)))
    with pytest.raises(ValueError, match="gauss-newton"):
        ard.laplace(model, params, state, Z, y, hessian="exact", structure="network")
    with pytest.raises(ValueError, match="structure"):
        ard.laplace(model, params, state, Z, y, structure="joint")


def test_simulation_laplace_is_the_gauss_newton_posterior_of_the_free_run():
    rng = np.random.default_rng(4)
    T = 40
    u, y = rng.uniform(-1, 1, T), 0.3 * rng.standard_normal(T)
    model = ard.mlp((2 + 1 + 2, 3, 1), "tanh")
    params = model.init(jax.random.PRNGKey(5), jnp.float64)
    state = ard.init_state(model, ard.ArdConfig(group="element"), jnp.float64)
    masks = (jnp.ones((5, 3)).at[4, 2].set(0.0), jnp.ones((3, 1)))
    ups = tuple(jnp.asarray(rng.uniform(0.2, 2.0, s)) for s in model.shapes)
    state = state._replace(upsilon=ups, masks=masks)
    post = ard.laplace_simulation(model, params, state, u, y, 2)
    sim = ard.simulate(model, params, u, y, 2)
    sigma2 = float(jnp.mean((sim[2:] - y[2:]) ** 2))
    flat = jnp.concatenate([p.W.ravel() for p in params])

    def free_run(vec):
        W1, W2 = vec[:15].reshape(5, 3), vec[15:].reshape(3, 1)
        return ard.simulate(model, (ard.Layer(W1, params[0].b), ard.Layer(W2, params[1].b)), u, y, 2)[2:]

    f0, lin = jax.linearize(free_run, flat)
    G = jax.hessian(lambda v: 0.5 * jnp.sum((f0 + lin(v - flat) - y[2:]) ** 2) / sigma2)(flat)
    keep = np.concatenate([np.asarray(m).ravel() for m in masks]) > 0
    prior = np.concatenate([np.asarray(v).ravel() for v in ups])
    direct = np.linalg.inv(np.asarray(G)[np.ix_(keep, keep)] + np.diag(1 / prior[keep]))
    cov = np.asarray(post.factors[0] @ post.factors[0].T)
    np.testing.assert_allclose(cov[np.ix_(keep, keep)], direct, rtol=1e-8, atol=1e-12)
    assert np.all(cov[~keep] == 0) and post.structure == "network"
    with pytest.raises(ValueError, match="sigma2"):
        ard.laplace_simulation(model, params, state, u, y, 2, sigma2=-1.0)


@pytest.mark.parametrize("structure,hessian", [("network", "gauss-newton"), ("layer", "exact"), ("layer", "diagonal")])
def test_linearised_predictive_of_a_linear_model_is_exact(structure, hessian):
    # a one-layer network is linear in its weights: the linearised predictive is the exact Gaussian predictive
    rng = np.random.default_rng(7)
    Z = jnp.asarray(rng.standard_normal((20, 3)))
    y = jnp.asarray(rng.standard_normal(20))
    model = ard.mlp((3, 1))
    params = model.init(jax.random.PRNGKey(0), jnp.float64)
    state = ard.init_state(model, ard.ArdConfig(group="element"), jnp.float64)
    state = state._replace(upsilon=(jnp.asarray([[0.5], [2.0], [0.1]]),), masks=(jnp.asarray([[1.0], [1.0], [0.0]]),),
                           sigma2=jnp.asarray(0.4))
    post = ard.laplace(model, params, state, Z, y, hessian=hessian, structure=structure)
    Xn = jnp.asarray(rng.standard_normal((7, 3)))
    mean, std = ard.linearised_predictive(post, lambda p: model.apply(p, Xn))
    F = post.factors[0]
    cov = np.asarray(F @ F.T) if F.shape != (3, 1) else np.diag(np.asarray(F).ravel() ** 2)
    np.testing.assert_allclose(std, np.sqrt(np.einsum("ti,ij,tj->t", np.asarray(Xn), cov, np.asarray(Xn))),
                               rtol=1e-10)
    np.testing.assert_allclose(mean, model.apply(params, Xn))
    draws = ard.sample_laplace(jax.random.PRNGKey(2), post, 4000)
    mc = np.asarray(jax.vmap(lambda p: model.apply(p, Xn))(draws)).std(axis=0)
    np.testing.assert_allclose(mc, std, rtol=0.08)


def test_simulator_reproduces_the_one_step_predictor_and_a_linear_recursion():
    rng = np.random.default_rng(0)
    u, y = rng.standard_normal(50), rng.standard_normal(50)
    model = ard.mlp((2 + 1 + 3, 6, 1), "tanh")
    params = model.init(jax.random.PRNGKey(0), jnp.float64)
    Z, _ = ard.narx_regressors(u, y, 2, 3)
    one_step = ard.simulate(model, params, u, y, 2, 3, feedback="measured")
    np.testing.assert_allclose(one_step[3:], model.apply(params, Z), rtol=1e-12)
    np.testing.assert_array_equal(one_step[:3], y[:3])
    # free run of a linear model y(t) = 0.3 u(t-1) + 0.5 u(t) + 0.8 y(t-1) - 0.1 y(t-2) + 0.2
    lin = ard.mlp((2 + 1 + 2, 1))
    W = jnp.asarray([[0.0], [0.3], [0.5], [-0.1], [0.8]])
    p = (ard.Layer(W, jnp.asarray([0.2])),)
    sim = np.asarray(ard.simulate(lin, p, u, y, 2, 2))
    ref = list(y[:2])
    for t in range(2, 50):
        ref.append(0.3 * u[t - 1] + 0.5 * u[t] + 0.8 * ref[t - 1] - 0.1 * ref[t - 2] + 0.2)
    np.testing.assert_allclose(sim, ref, rtol=1e-10)
    rm = ard.simulation_rmse(sim, y, 2)
    rm_after = ard.simulation_rmse(sim, y, 2, include_initial=False)
    np.testing.assert_allclose(float(rm) ** 2 * 50, float(rm_after) ** 2 * 48, rtol=1e-10)


def test_finetuning_on_simulation_error_lowers_it_and_keeps_pruned_weights():
    rng = np.random.default_rng(1)
    T = 120
    u = rng.uniform(-1, 1, T)
    y = np.zeros(T)
    for t in range(1, T):
        y[t] = 0.7 * y[t - 1] + np.tanh(u[t]) + 0.01 * rng.standard_normal()
    model = ard.mlp((1 + 1 + 1, 5, 1), "tanh")
    params = model.init(jax.random.PRNGKey(0), jnp.float64)
    masks = (jnp.ones((3, 5)).at[0, 0].set(0.0), jnp.ones((5, 1)))
    params = tuple(ard.Layer(p.W * m, p.b) for p, m in zip(params, masks))
    before = float(ard.simulation_rmse(ard.simulate(model, params, u, y, 1), y, 1))
    tuned, losses = ard.finetune_simulation(model, params, masks, u, y, 1, epochs=200, learning_rate=1e-2)
    after = float(ard.simulation_rmse(ard.simulate(model, tuned, u, y, 1), y, 1))
    assert after < 0.5 * before
    assert float(tuned[0].W[0, 0]) == 0.0
    # keep_best returns the iterate of the lowest loss seen: its simulation MSE is min(losses)
    mse = float(jnp.mean((ard.simulate(model, tuned, u, y, 1)[1:] - y[1:]) ** 2))
    np.testing.assert_allclose(mse, float(jnp.min(losses)), rtol=1e-10)
    # a step far too large: without clipping and keep_best the run ends worse than it started, with them never
    wild, wl = ard.finetune_simulation(model, params, masks, u, y, 1, epochs=60, learning_rate=3.0, clip_norm=None,
                                       keep_best=False)
    safe, sl = ard.finetune_simulation(model, params, masks, u, y, 1, epochs=60, learning_rate=3.0)
    start = float(jnp.mean((ard.simulate(model, params, u, y, 1)[1:] - y[1:]) ** 2))
    end_safe = float(jnp.mean((ard.simulate(model, safe, u, y, 1)[1:] - y[1:]) ** 2))
    end_wild = float(jnp.mean((ard.simulate(model, wild, u, y, 1)[1:] - y[1:]) ** 2))
    assert end_safe <= start and not end_wild <= start, (start, end_safe, end_wild)
    with pytest.raises(ValueError, match="clip_norm"):
        ard.finetune_simulation(model, params, masks, u, y, 1, epochs=2, clip_norm=-1.0)


def test_hmc_of_an_ard_linear_model_matches_its_closed_form():
    from samplers import ard as sard

    rng = np.random.default_rng(0)
    n, d = 30, 3
    Z = rng.standard_normal((n, d))
    y = Z @ np.array([1.0, -0.5, 0.0]) + 0.3 + 0.4 * rng.standard_normal(n)
    sigma2, bias_var = 0.16, 2.0
    variances = np.array([[0.5], [2.0], [0.01]])
    model = ard.mlp((d, 1))
    res = sard.sample(model, Z, y, jax.random.PRNGKey(0), sigma2=sigma2, bias_var=bias_var,
                      fixed_variances=(variances,), num_chains=4, num_warmup=400, num_samples=1000,
                      progress=False, keep_position=False)
    # closed form: theta = (W, b) ~ N(mu, S), S = (X^T X / sigma2 + diag(1/prior))^-1, mu = S X^T y / sigma2
    X = np.column_stack([Z, np.ones(n)])
    P = X.T @ X / sigma2 + np.diag(np.concatenate([1 / variances.ravel(), [1 / bias_var]]))
    S = np.linalg.inv(P)
    mu = S @ X.T @ y / sigma2
    W = np.asarray(res.draws["params"][0].W).reshape(-1, d)
    b = np.asarray(res.draws["params"][0].b).reshape(-1, 1)
    draws = np.column_stack([W, b])
    sd = np.sqrt(np.diag(S))
    # 4000 draws; the Monte-Carlo error of a mean is sd / sqrt(ESS) with ESS > 800 on this easy target
    assert np.all(np.abs(draws.mean(0) - mu) < 5 * sd / np.sqrt(800)), (draws.mean(0), mu, sd)
    np.testing.assert_allclose(draws.std(0), sd, rtol=0.12)
    diag = sard.summarise(res)
    assert diag["diagnostics"]["rhat_params"] < 1.05


def test_indefinite_blocks_are_shifted_to_psd_and_updates_stay_finite():
    rng = np.random.default_rng(6)
    A = rng.standard_normal((6, 6))
    H = jnp.asarray(A + A.T)
    assert float(jnp.linalg.eigvalsh(H)[0]) < 0
    shifted = ard._gershgorin_psd(H)
    assert float(jnp.linalg.eigvalsh(shifted)[0]) >= -1e-12
    np.testing.assert_allclose(shifted - H, np.eye(6) * float(shifted[0, 0] - H[0, 0]))
    # a tanh network's exact Hessian can be indefinite; Algorithm 1's updates stay finite and positive
    Z, y = _data(n=50, d=4)
    model = ard.mlp((4, 6, 1), "tanh")
    res = ard.fit(model, jax.random.PRNGKey(0), Z, y, ard.ArdConfig(group="element", rounds=3, epochs=60,
                                                                     hessian="exact"), lam=1e-2)
    for leaf in jax.tree_util.tree_leaves(res.state.omega) + jax.tree_util.tree_leaves(res.state.upsilon):
        assert np.all(np.isfinite(np.asarray(leaf))) and np.all(np.asarray(leaf) > 0)


@pytest.mark.parametrize("group", ["element", "row", "column", "row+column", "shape"])
def test_group_sum_fast_paths_equal_a_scatter(group):
    X = jnp.asarray(np.random.default_rng(8).standard_normal((5, 7)))
    for g in ard.groupings((5, 7), group, block=(2, 3)):
        ref = jax.ops.segment_sum(X.ravel(), jnp.asarray(g.ids.ravel()), num_segments=g.num)
        np.testing.assert_allclose(ard.group_sum(X, g), ref, rtol=1e-12)


def test_round_by_round_equals_the_fused_program():
    Z, y = _data(n=30, d=4)
    model = ard.mlp((4, 5, 1))
    config = ard.ArdConfig(group="row+column", rounds=3, epochs=25, hessian="exact")
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    seen = []
    a = ard.fit_repeats(model, keys, Z, y, config, lam=1e-2)
    b = ard.fit_repeats(model, keys, Z, y, config, lam=1e-2, fused=False, progress=lambda t, r: seen.append(t))
    c = ard.fit_repeats(model, keys, Z, y, config, lam=1e-2, vectorize=False)
    assert seen == [0, 1, 2]
    for x, z, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), jax.tree_util.tree_leaves(c)):
        np.testing.assert_allclose(x, z, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(x, v, rtol=1e-9, atol=1e-12)


def _dead_unit_network(d=4, h=6, dead=2):
    """A ReLU network 4 -> 6 -> 6 -> 1 whose first-layer unit ``dead`` is inactive on every sample (bias -50)."""
    model = ard.mlp((d, h, h, 1))
    params = model.init(jax.random.PRNGKey(3), jnp.float64)
    p0 = params[0]
    params = (ard.Layer(p0.W, p0.b.at[dead].set(-50.0)),) + tuple(params[1:])
    return model, params


@pytest.mark.parametrize("kind", ["exact", "gauss-newton", "diagonal"])
def test_dead_relu_weights_have_zero_curvature_and_pruning_them_keeps_the_output(kind):
    Z, y = _data(n=50, d=4)
    model, params = _dead_unit_network()
    dead = [np.asarray(d) for d in ard.dead_weights(model, params, Z)]
    # independently, from the forward pass: a unit is dead when its pre-activation is <= 0 on every sample
    _, hs, _ = model.forward(params, Z)
    expected = [np.zeros(s, bool) for s in model.shapes]
    for l, h in enumerate(hs[:-1]):
        off = np.all(np.asarray(h) <= 0, axis=0)
        expected[l][:, off] = True
        expected[l + 1][off, :] = True
    assert expected[0][:, 2].all()  # the unit switched off by construction is among them
    assert all(np.array_equal(d, e) for d, e in zip(dead, expected)), dead
    # every flagged weight has exactly zero curvature in the data term
    H = ard.layer_hessians(model, params, Z, y, jnp.ones(50), 0.1, kind)
    for Hl, d, shape in zip(H, dead, model.shapes):
        diag = np.asarray(Hl if Hl.shape == shape else jnp.diagonal(Hl).reshape(shape))
        assert np.all(diag[d] == 0)
    # removing them changes no output, on the training inputs or elsewhere
    pruned = tuple(ard.Layer(p.W * (1 - d), p.b) for p, d in zip(params, dead))
    Zn = jnp.asarray(np.random.default_rng(1).standard_normal((20, 4)))
    np.testing.assert_allclose(model.apply(pruned, Z), model.apply(params, Z), rtol=1e-12)
    assert np.asarray(model.apply(pruned, Zn)).shape == (20,)
    # a unit alive only on a sample of weight 0 counts as dead
    w = np.ones(50)
    assert not ard.dead_weights(model, params, Z, w)[0][:, 0].any()
    alive = np.asarray(hs[0][:, 0]) > 0
    w[alive] = 0.0
    assert ard.dead_weights(model, params, Z, w)[0][:, 0].all()
    assert not np.asarray(ard.dead_weights(ard.mlp((4, 6, 1), "tanh"), model.init(jax.random.PRNGKey(0)), Z)[0]).any()


def test_algorithm1_prunes_a_dead_unit_and_keeps_variances_bounded():
    Z, y = _data(n=60, d=4)
    model, params = _dead_unit_network()
    base = dict(group="row+column", rounds=2, epochs=50, learning_rate=1e-3, hessian="exact")
    on = ard.fit(model, None, Z, y, ard.ArdConfig(**base), lam=1e-3, params=params)
    off = ard.fit(model, None, Z, y, ard.ArdConfig(**base, prune_dead=False), lam=1e-3, params=params)
    m_on, m_off = (np.asarray(r.state.masks[0][0]) for r in (on, off))
    assert np.all(m_on[:, 2] == 0) and np.all(np.asarray(on.state.masks[1][0])[2, :] == 0)
    assert np.all(m_off[:, 2] == 1)  # without the rule the dead unit's weights stay (the test can fail)
    # the zero-curvature weights are what sends the variances up without the rule
    kept_ups = max(float(np.max(np.asarray(u[-1]) * np.asarray(m[-1])))
                   for u, m in zip(on.state.upsilon, on.state.masks))
    off_ups = max(float(np.max(np.asarray(u[-1]) * np.asarray(m[-1])))
                  for u, m in zip(off.state.upsilon, off.state.masks))
    assert kept_ups < 1e3 < off_ups, (kept_ups, off_ups)


@pytest.mark.parametrize("group", ["element", "row+column", "column"])
def test_hmc_start_maps_back_to_the_given_network(group):
    model = ard.mlp((3, 4, 1))
    params = model.init(jax.random.PRNGKey(1), jnp.float64)
    pos = ard.init_position(jax.random.PRNGKey(0), model, group, params=params)
    back, ups = ard.position_to_params(pos, model, group)
    for p, q in zip(params, back):
        np.testing.assert_allclose(q.W, p.W, rtol=1e-12)
        np.testing.assert_allclose(q.b, p.b)
    fixed = (jnp.full((3, 4), 0.3), jnp.full((4, 1), 2.0))
    pos = ard.init_position(jax.random.PRNGKey(0), model, group, fixed_variances=fixed, params=params)
    back, _ = ard.position_to_params(pos, model, group, fixed_variances=fixed)
    for p, q in zip(params, back):
        np.testing.assert_allclose(q.W, p.W, rtol=1e-12)


def test_hmc_summary_counts_masked_weights_as_pruned():
    from samplers import ard as sard

    Z, y = _data(n=30, d=3)
    model = ard.mlp((3, 2, 1))
    masks = (jnp.ones((3, 2)).at[:, 1].set(0.0), jnp.ones((2, 1)).at[1, 0].set(0.0))
    res = sard.sample(model, Z, y, jax.random.PRNGKey(0), sigma2=0.1, group="element", masks=masks, num_chains=1,
                      num_warmup=20, num_samples=10, progress=False, keep_position=False)
    ups = res.draws["upsilon"]
    assert np.all(np.asarray(ups[0])[..., :, 1] == 0) and np.all(np.asarray(ups[1])[..., 1, 0] == 0)
    summary = sard.summarise(res, threshold=1e-12)
    assert summary["fraction_remaining"] <= 4 / 8  # at most the 4 unmasked of the 8 weights
    assert summary["fraction_remaining"] > 0
