"""neural-tangents' predict API (smnngp.nt.predict over smnngp.predict): golden values, closed forms, errors.

Golden fixtures: tests/golden/predict/*.npz, written by tests/golden/generate_predict.py with neural-tangents 0.6.5
from the same case definitions (``CASES``) that this test runs with ``smnngp.nt.predict`` and ``smnngp.stax``.
Every output agrees to 1e-10 relative (to its largest entry) in float64. That holds for the ODE solves (``gd_*``)
too, although the solver is accurate to about its tolerance (1.4e-8) only: both libraries run the same
Dormand-Prince solver (``jax.experimental.ode.odeint``) with the same tolerances on the same equations, so they take
the same steps; the tests against closed forms below bound the solver's own error.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from smnngp import predict, stax
from smnngp.nt import predict as nt_predict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "golden"))
from generate_predict import CASES, OUT_DIR  # noqa: E402

CASE_TOL: dict[str, float] = {}


class _JitStax:
    """smnngp.stax with ``serial``'s kernel_fn jitted (one compilation per shape instead of op-by-op dispatch)."""

    def __getattr__(self, name):
        return getattr(stax, name)

    @staticmethod
    def serial(*layers):
        init_fn, apply_fn, kernel_fn = stax.serial(*layers)
        return init_fn, apply_fn, jax.jit(kernel_fn, static_argnames="get")


def _tol(name):
    return next((v for k, v in CASE_TOL.items() if name.startswith(k)), 1e-10)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_neural_tangents(name):
    path = os.path.join(OUT_DIR, f"{name}.npz")
    gold = np.load(path)
    inputs = {k[4:]: jnp.asarray(gold[k]) for k in gold.files if k.startswith("in__")}
    want = {k[5:]: gold[k] for k in gold.files if k.startswith("out__")}
    got = CASES[name][1](nt_predict, _JitStax(), inputs)
    got = {k: np.asarray(v) for k, v in got.items()}
    assert sorted(got) == sorted(want)
    tol = _tol(name)
    for key in want:
        assert got[key].shape == want[key].shape, key
        scale = max(float(np.max(np.abs(want[key]))), 1e-300)
        np.testing.assert_allclose(got[key], want[key], rtol=tol, atol=tol * scale, err_msg=f"{name}: {key}")


# ---------------------------------------------------------------------------
# Properties against independent computations
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernels():
    rs = np.random.RandomState(3)
    a = rs.normal(size=(8, 10))
    k = a @ a.T / 10 + 0.2 * np.eye(8)
    return dict(kdd=k[:5, :5], ktd=k[5:, :5], ktt=k[5:, 5:], y=rs.normal(size=(5, 2)), f0=rs.normal(size=(5, 2)),
                ft0=rs.normal(size=(3, 2)))


def test_mse_is_the_matrix_exponential(kernels):
    d = kernels
    lr, t = 0.6, 1.7
    fn = predict.gradient_descent_mse(d["kdd"], d["y"], lr)
    train, test = fn(t, d["f0"], d["ft0"], d["ktd"])
    n = d["y"].size
    E = scipy.linalg.expm(-lr * t * d["kdd"] / n)
    np.testing.assert_allclose(train, d["y"] + E @ (d["f0"] - d["y"]), rtol=1e-11, atol=1e-12)
    A = d["ktd"] @ np.linalg.solve(d["kdd"], np.eye(5) - E)
    np.testing.assert_allclose(test, d["ft0"] + A @ (d["y"] - d["f0"]), rtol=1e-11, atol=1e-12)
    # t = inf (array path) agrees with t = None (Cholesky path)
    inf_train, inf_test = fn(np.array([np.inf]), d["f0"], d["ft0"], d["ktd"])
    none_train, none_test = fn(None, d["f0"], d["ft0"], d["ktd"])
    np.testing.assert_allclose(inf_test[0], none_test, rtol=1e-10)
    np.testing.assert_allclose(inf_train[0], none_train, rtol=1e-10, atol=1e-12)


def test_ode_with_mse_loss_matches_the_closed_form(kernels):
    d = kernels
    loss = lambda fx, y: 0.5 * jnp.mean((fx - y) ** 2)  # noqa: E731
    times = np.array([0.3, 1.0, 4.0])
    closed = predict.gradient_descent_mse(d["kdd"], d["y"], 0.9)(times, d["f0"], d["ft0"], d["ktd"])
    ode = predict.gradient_descent(loss, d["kdd"], d["y"], 0.9, rtol=1e-11, atol=1e-11)(times, d["f0"], d["ft0"],
                                                                                          d["ktd"])
    for a, b in zip(ode, closed):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


def test_momentum_ode_is_the_damped_oscillator(kernels):
    """With the MSE, heavy-ball flow in the eigenbasis is u'' = -(lam / n) u - ((1 - m) / sqrt(eta)) u' (s time)."""
    d = kernels
    lr, m, t = 0.5, 0.6, 2.0
    loss = lambda fx, y: 0.5 * jnp.mean((fx - y) ** 2)  # noqa: E731
    fx = predict.gradient_descent(loss, d["kdd"], d["y"], lr, m, rtol=1e-11, atol=1e-11)(t, d["f0"])
    lam, U = np.linalg.eigh(d["kdd"])
    n, gamma, s = d["y"].size, (1 - m) / np.sqrt(lr), np.sqrt(lr) * t
    u0 = U.T @ (d["f0"] - d["y"])
    out = np.empty_like(u0)
    for i, w2 in enumerate(lam / n):  # u(0) = u0, u'(0) = 0
        M = np.array([[0.0, 1.0], [-w2, -gamma]])
        out[i] = (scipy.linalg.expm(M * s) @ np.stack([u0[i], np.zeros_like(u0[i])]))[0]
    np.testing.assert_allclose(fx, d["y"] + U @ out, rtol=1e-9, atol=1e-10)


def test_gp_inference_is_gp_conditioning_and_matches_the_ensemble(kernels):
    d = kernels
    reg = 0.05
    fn = predict.gp_inference(d["kdd"], d["y"], diag_reg=reg)
    g = fn("nngp", d["ktd"], d["ktt"])
    kreg = d["kdd"] + reg * np.mean(np.diag(d["kdd"])) * np.eye(5)
    np.testing.assert_allclose(g.mean, d["ktd"] @ np.linalg.solve(kreg, d["y"]), rtol=1e-11)
    np.testing.assert_allclose(g.covariance, d["ktt"] - d["ktd"] @ np.linalg.solve(kreg, d["ktd"].T), rtol=1e-10,
                               atol=1e-12)
    # an smnngp Kernel-like object (nngp and ntk) works, and 'ntk' at t = inf is the ensemble's law
    _, _, kernel_fn = _JitStax.serial(stax.Dense(8, W_std=1.4, b_std=0.1), stax.Relu(), stax.Dense(1))
    rs = np.random.RandomState(1)
    x, xt, y = rs.normal(size=(4, 3)), rs.normal(size=(2, 3)), rs.normal(size=(4, 2))
    kdd, ktd, ktt = kernel_fn(x, None), kernel_fn(xt, x), kernel_fn(xt, None)
    gp = predict.gp_inference(kdd, y)("ntk", ktd, ktt)
    ens = predict.gradient_descent_mse_ensemble(kernel_fn, x, y)(None, xt, "ntk")
    np.testing.assert_allclose(gp.mean, ens.mean, rtol=1e-10)
    np.testing.assert_allclose(gp.covariance, ens.covariance, rtol=1e-10, atol=1e-12)


def test_ensemble_trace_axes_and_kernel_keywords():
    """trace_axes=() on 1-D targets is the default one-output law; kernel keywords reach kernel_fn."""
    _, _, kernel_fn = _JitStax.serial(stax.Dense(8, W_std=1.4, b_std=0.1), stax.Relu(), stax.Dense(1))
    seen = []

    def kf(x1, x2, get, **kw):
        seen.append(kw)
        return kernel_fn(x1, x2, get)

    rs = np.random.RandomState(2)
    x, xt, y = rs.normal(size=(4, 3)), rs.normal(size=(3, 3)), rs.normal(size=(4,))
    a = predict.gradient_descent_mse_ensemble(kernel_fn, x, y)(1.0, xt, "ntk")
    b = predict.gradient_descent_mse_ensemble(kf, x, y, trace_axes=(), flag=1)(1.0, xt, "ntk", flag=1)
    np.testing.assert_allclose(b.mean, a.mean, rtol=1e-12)
    np.testing.assert_allclose(b.covariance, a.covariance, rtol=1e-12)
    assert seen and all(kw == {"flag": 1} for kw in seen)
    with pytest.raises(ValueError, match="keyword 'flag'"):
        predict.gradient_descent_mse_ensemble(kf, x, y, flag=1)(1.0, xt, "ntk", flag=2)


def test_trace_axes_may_include_the_batch_axis_and_every_axis():
    """As in neural-tangents: tracing y's batch axis leaves a kernel over the other axes (the law of the transposed
    problem), tracing every axis a scalar kernel acting on each entry alone, and a repeated axis counts once."""
    rs = np.random.RandomState(5)
    a = rs.normal(size=(3, 6))
    kc = a @ a.T / 6 + 0.1 * np.eye(3)  # a kernel over the C = 3 outputs
    y, f0 = rs.normal(size=(4, 3)), rs.normal(size=(4, 3))
    got = predict.gradient_descent_mse(kc, y, trace_axes=(0,))(2.0, f0)
    want = predict.gradient_descent_mse(kc, y.T, trace_axes=(-1,))(2.0, f0.T).T
    np.testing.assert_allclose(got, want, rtol=1e-12)
    again = predict.gradient_descent_mse(kc, y, trace_axes=(0, 0, -2))(2.0, f0)
    np.testing.assert_allclose(again, got, rtol=1e-12)
    k = 0.7
    got = predict.gradient_descent_mse(np.asarray(k), y, trace_axes=(0, 1))(2.0, f0)
    np.testing.assert_allclose(got, y + np.exp(-2.0 * k / y.size) * (f0 - y), rtol=1e-12)


def test_ensemble_with_the_batch_axis_traced():
    from smnngp.empirical import empirical_kernel_fn

    init_fn, apply_fn, _ = stax.serial(stax.Dense(6, W_std=1.3), stax.Relu(), stax.Dense(3))
    rs = np.random.RandomState(6)
    x, xt, y = rs.normal(size=(4, 2)), rs.normal(size=(4, 2)), rs.normal(size=(4, 3))
    _, params = init_fn(jax.random.PRNGKey(0), x.shape)
    kf = empirical_kernel_fn(apply_fn, trace_axes=(0,))
    k_dd, k_td = kf(x, None, "ntk", params), kf(xt, x, "ntk", params)
    assert k_dd.shape == (3, 3)
    fn = nt_predict.gradient_descent_mse_ensemble(kf, x, y, diag_reg=1e-3, trace_axes=(0,), params=params)
    got = fn(None, xt, "ntk", params=params)
    zeros = np.zeros_like(y)
    _, want = predict.gradient_descent_mse(k_dd, y, diag_reg=1e-3, trace_axes=(0,))(None, zeros, zeros, k_td)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    with pytest.raises(ValueError, match="as many points as x_train"):
        fn(None, xt[:2], "ntk", params=params)


def test_max_learning_rate_momentum_and_divergence(kernels):
    k = kernels["kdd"]
    lam = np.linalg.eigvalsh(k)[-1]
    assert predict.max_learning_rate(k, 10, momentum=0.5) == pytest.approx(2 * 1.5 * 10 / (lam + 1e-12), rel=1e-12)
    # just below the plain bound, discrete GD on the MSE contracts; just above, it diverges
    eta = predict.max_learning_rate(k, 5)
    for factor, grows in ((0.98, False), (1.02, True)):
        r = np.ones(5)
        step = np.eye(5) - factor * eta * k / 5
        for _ in range(400):
            r = step @ r
        assert (np.linalg.norm(r) > 1.0) == grows
    with pytest.raises(ValueError, match="no positive eigenvalue"):
        predict.max_learning_rate(-np.eye(3))


def test_nt_signatures():
    import inspect

    sig = inspect.signature(nt_predict.gradient_descent_mse_ensemble)
    assert list(sig.parameters)[:7] == ["kernel_fn", "x_train", "y_train", "learning_rate", "diag_reg",
                                        "diag_reg_absolute_scale", "trace_axes"]
    assert list(inspect.signature(nt_predict.gradient_descent).parameters) == [
        "loss", "k_train_train", "y_train", "learning_rate", "momentum", "trace_axes"]
    assert list(inspect.signature(nt_predict.max_learning_rate).parameters) == [
        "ntk_train_train", "y_train_size", "momentum", "eps"]
    assert list(inspect.signature(nt_predict.gp_inference).parameters) == [
        "k_train_train", "y_train", "diag_reg", "diag_reg_absolute_scale", "trace_axes"]


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(kernels):
    d = kernels
    with pytest.raises(ValueError, match=r"gradient_descent_mse: k_train_train has shape \(5, 4\)"):
        predict.gradient_descent_mse(d["kdd"][:, :4], d["y"])
    with pytest.raises(ValueError, match="gradient_descent_mse: trace axis 2 is out of range"):
        predict.gradient_descent_mse(d["kdd"], d["y"], trace_axes=(2,))
    fn = predict.gradient_descent_mse(d["kdd"], d["y"])
    with pytest.raises(ValueError, match="gradient_descent_mse: test-set predictions .* need k_test_train"):
        fn(1.0, d["f0"], d["ft0"])
    with pytest.raises(ValueError, match="both None"):
        fn(1.0, None, None)
    with pytest.raises(ValueError, match="k_test_train has shape"):
        fn(1.0, d["f0"], d["ft0"], d["ktd"][:, :4])
    loss = lambda fx, y: jnp.mean((fx - y) ** 2)  # noqa: E731
    with pytest.raises(ValueError, match="gradient_descent: momentum must be in"):
        predict.gradient_descent(loss, d["kdd"], d["y"], momentum=1.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        predict.gradient_descent(loss, d["kdd"], d["y"])(np.array([1.0, 0.5]), d["f0"])
    with pytest.raises(ValueError, match="momentum variables but momentum is None"):
        predict.gradient_descent(loss, d["kdd"], d["y"])(1.0, predict.ODEState(d["f0"], None, d["f0"]))
    gp = predict.gp_inference(d["kdd"], d["y"])
    with pytest.raises(ValueError, match="gp_inference: the 'ntk' covariance needs the NNGP"):
        gp("ntk", d["ktd"], d["ktt"])
    with pytest.raises(ValueError, match="gp_inference: unknown get 'foo'"):
        gp("foo", d["ktd"])
    with pytest.raises(ValueError, match="max_learning_rate: momentum must be non-negative"):
        predict.max_learning_rate(d["kdd"], momentum=-0.1)


def test_ode_state_is_a_pytree():
    s = predict.ODEState(jnp.ones(2), None, jnp.zeros(2))
    leaves = jax.tree_util.tree_leaves(s)
    assert len(leaves) == 2
    assert s.replace(fx_test=jnp.ones(1)).fx_test.shape == (1,)
