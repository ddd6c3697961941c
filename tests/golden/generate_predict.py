"""Golden fixtures for ``predict`` (tests/golden/predict/<case>.npz), written with neural-tangents 0.6.5.

Run in the oracle environment: ``.venv-oracle/bin/python tests/golden/generate_predict.py`` (``make_golden.sh``
without arguments runs it too). The cases are defined here once, as ``CASES[name] = (make_inputs, run)``:

* ``make_inputs(rng) -> dict`` of NumPy arrays (random PSD kernels, targets, initial outputs, times), made from a
  seed and independent of either library; they are stored in the fixture as ``in__<key>``;
* ``run(predict, stax, inputs) -> dict`` of output arrays, calling a ``predict`` module with neural-tangents' API
  (``neural_tangents.predict`` here, ``smnngp.nt.predict`` in ``tests/test_predict_nt.py``) and, for the ensemble,
  the same MLP built with either library's ``stax``; stored as ``out__<key>``.

This module imports neither library at import time, so the test imports ``CASES`` from it.
"""

import os
import sys

import numpy as np

N, M, C = 5, 3, 3


def _psd(rng, n, shift=0.3):
    a = rng.normal(size=(n, n + 2))
    return a @ a.T / (n + 2) + shift * np.eye(n)


def _joint(rng, n_train, n_test, shift=0.3):
    """A PSD kernel over train + test points: (train-train, test-train, test-test)."""
    k = _psd(rng, n_train + n_test, shift)
    return k[:n_train, :n_train], k[n_train:, :n_train], k[n_train:, n_train:]


def _zip4(k, n1, n2, c):
    """A (n1 c, n2 c) matrix (row = point * c + channel) as the interleaved (n1, n2, c, c) kernel."""
    return k.reshape(n1, c, n2, c).transpose(0, 2, 1, 3)


def flatten(prefix, value, out):
    """Outputs as a flat dict: named tuples / ODE states by field, tuples by index, None dropped."""
    if value is None:
        return out
    if hasattr(value, "_fields"):
        for f in value._fields:
            flatten(f"{prefix}.{f}", getattr(value, f), out)
    elif hasattr(value, "fx_train") and hasattr(value, "qx_test"):
        for f in ("fx_train", "fx_test", "qx_train", "qx_test"):
            flatten(f"{prefix}.{f}", getattr(value, f), out)
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            flatten(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = np.asarray(value)
    return out


# ---------------------------------------------------------------------------
# gradient_descent_mse
# ---------------------------------------------------------------------------


def _mse_inputs(trace_none=False):
    def make(rng):
        if trace_none:
            kdd, ktd, _ = _joint(rng, N * C, M * C)
            kdd, ktd = _zip4(kdd, N, N, C), _zip4(ktd, M, N, C)
        else:
            kdd, ktd, _ = _joint(rng, N, M)
        return dict(kdd=kdd, ktd=ktd, y=rng.normal(size=(N, C)), f0=0.3 * rng.normal(size=(N, C)),
                    ft0=0.3 * rng.normal(size=(M, C)), t=np.array([[0.0, 0.5], [3.0, 40.0]]))
    return make


def _mse_run(lr=1.0, diag_reg=0.0, absolute=False, trace_axes=(-1,)):
    def run(predict, stax, d):
        fn = predict.gradient_descent_mse(d["kdd"], d["y"], lr, diag_reg, absolute, trace_axes)
        out = {}
        flatten("t_arr", fn(d["t"], d["f0"], d["ft0"], d["ktd"]), out)
        flatten("t_scalar", fn(2.5, d["f0"], d["ft0"], d["ktd"]), out)
        flatten("t_none", fn(None, d["f0"], d["ft0"], d["ktd"]), out)
        flatten("train_only", fn(d["t"]), out)
        flatten("test_only", fn(1.5, None, d["ft0"], d["ktd"]), out)
        flatten("test_only_inf", fn(None, None, d["ft0"], d["ktd"]), out)
        return out
    return run


# ---------------------------------------------------------------------------
# gradient_descent (ODE)
# ---------------------------------------------------------------------------


def _xent(fx, y):
    import jax

    return -(jax.nn.log_softmax(fx) * y).mean()


def _mse_loss(fx, y):
    return 0.5 * ((fx - y) ** 2).mean()


def _gd_inputs(onehot, trace_none=False):
    def make(rng):
        if trace_none:
            kdd, ktd, _ = _joint(rng, N * C, M * C)
            kdd, ktd = _zip4(kdd, N, N, C), _zip4(ktd, M, N, C)
        else:
            kdd, ktd, _ = _joint(rng, N, M)
        y = np.eye(C)[rng.randint(C, size=N)] if onehot else rng.normal(size=(N, C))
        return dict(kdd=kdd, ktd=ktd, y=y, f0=0.3 * rng.normal(size=(N, C)), ft0=0.3 * rng.normal(size=(M, C)),
                    t=np.array([0.0, 0.5, 2.0, 6.0]))
    return make


def _gd_run(loss, lr=1.0, momentum=None, trace_axes=(-1,), more=False):
    """Each layout of the ODE state compiles the solver once: the extra calls (``more``) are made in one case."""
    def run(predict, stax, d):
        fn = predict.gradient_descent(loss, d["kdd"], d["y"], lr, momentum, trace_axes)
        out = {}
        flatten("both", fn(d["t"], d["f0"], d["ft0"], d["ktd"]), out)
        if more:
            flatten("scalar_train", fn(1.5, d["f0"]), out)
            flatten("test_only", fn(d["t"][1:], None, d["ft0"], d["ktd"]), out)
        if momentum is not None:
            state = predict.ODEState(d["f0"], d["ft0"], 0.1 * d["f0"], None)
            flatten("state", fn(d["t"][1:], state, None, d["ktd"]), out)
        return out
    return run


# ---------------------------------------------------------------------------
# gp_inference
# ---------------------------------------------------------------------------


def _gp_inputs(trace_none=False):
    def make(rng):
        n, m = (N * C, M * C) if trace_none else (N, M)
        kdd, ktd, ktt = _joint(rng, n, m)
        tdd, ttd, ttt = _joint(rng, n, m, shift=0.5)
        if trace_none:
            kdd, ktd, ktt = _zip4(kdd, N, N, C), _zip4(ktd, M, N, C), _zip4(ktt, M, M, C)
            tdd, ttd, ttt = _zip4(tdd, N, N, C), _zip4(ttd, M, N, C), _zip4(ttt, M, M, C)
        return dict(kdd=kdd, ktd=ktd, ktt=ktt, tdd=tdd, ttd=ttd, ttt=ttt, y=rng.normal(size=(N, C)))
    return make


def _gp_run(diag_reg=0.0, absolute=False, trace_axes=(-1,)):
    def run(predict, stax, d):
        import collections

        K = collections.namedtuple("Kernel", "nngp ntk")
        k_dd, k_td, k_tt = K(d["kdd"], d["tdd"]), K(d["ktd"], d["ttd"]), K(d["ktt"], d["ttt"])
        fn = predict.gp_inference(k_dd, d["y"], diag_reg, absolute, trace_axes)
        out = {}
        flatten("all_cov", fn(None, k_td, k_tt), out)
        flatten("ntkgp_cov", fn("ntkgp", k_td, k_tt), out)
        flatten("nngp_mean", fn("nngp", k_td), out)
        flatten("tuple_mean", fn(("ntk", "ntkgp"), k_td), out)
        flatten("train", fn(None, None, True), out)
        flatten("array", predict.gp_inference(d["kdd"], d["y"], diag_reg, absolute, trace_axes)(
            "nngp", d["ktd"], d["ktt"]), out)
        return out
    return run


# ---------------------------------------------------------------------------
# gradient_descent_mse_ensemble (the same MLP in either library's stax)
# ---------------------------------------------------------------------------


def _ens_inputs(c=2):
    def make(rng):
        y = rng.normal(size=(N, c)) if c else rng.normal(size=(N,))
        return dict(x=rng.normal(size=(N, 4)), xt=rng.normal(size=(M, 4)), y=y,
                    t=np.array([0.0, 0.7, 5.0, np.inf]))
    return make


def _mlp(stax):
    return stax.serial(stax.Dense(16, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(1, W_std=1.2, b_std=0.05))[2]


def _ens_run(lr=1.0, diag_reg=0.0, absolute=False, trace_axes=(-1,)):
    def run(predict, stax, d):
        fn = predict.gradient_descent_mse_ensemble(_mlp(stax), d["x"], d["y"], lr, diag_reg, absolute, trace_axes)
        out = {}
        flatten("test_cov", fn(d["t"], d["xt"], None, True), out)
        flatten("test_mean", fn(d["t"], d["xt"]), out)
        flatten("test_inf_cov", fn(None, d["xt"], None, True), out)
        flatten("test_ntk_mean", fn(2.0, d["xt"], "ntk"), out)
        flatten("train_cov", fn(d["t"][:3], None, ("ntk", "nngp"), True), out)
        flatten("train_inf_cov", fn(None, None, "nngp", True), out)
        return out
    return run


# ---------------------------------------------------------------------------
# max_learning_rate
# ---------------------------------------------------------------------------


def _mlr_inputs(rng):
    k, _, _ = _joint(rng, N * C, 1)
    return dict(k=k[:N, :N], k4=_zip4(k, N, N, C))


def _mlr_run(predict, stax, d):
    return {"plain": np.asarray(predict.max_learning_rate(d["k"])),
            "size": np.asarray(predict.max_learning_rate(d["k"], 15)),
            "momentum": np.asarray(predict.max_learning_rate(d["k"], 15, 0.9)),
            "eps": np.asarray(predict.max_learning_rate(d["k"], None, 0.5, 1e-3)),
            "zipped": np.asarray(predict.max_learning_rate(d["k4"], None, 0.3))}


CASES = {
    "mse_basic": (_mse_inputs(), _mse_run(lr=0.7)),
    "mse_diag_reg": (_mse_inputs(), _mse_run(diag_reg=0.05)),
    "mse_diag_reg_absolute": (_mse_inputs(), _mse_run(lr=2.0, diag_reg=0.1, absolute=True)),
    "mse_trace_none": (_mse_inputs(trace_none=True), _mse_run(lr=0.5, diag_reg=0.01, trace_axes=())),
    "gd_mse": (_gd_inputs(False), _gd_run(_mse_loss, lr=0.8)),
    "gd_xent": (_gd_inputs(True), _gd_run(_xent, lr=2.0, more=True)),
    "gd_xent_momentum": (_gd_inputs(True), _gd_run(_xent, lr=0.5, momentum=0.9)),
    "gd_mse_trace_none": (_gd_inputs(False, trace_none=True), _gd_run(_mse_loss, lr=1.0, trace_axes=())),
    "gp_basic": (_gp_inputs(), _gp_run()),
    "gp_diag_reg": (_gp_inputs(), _gp_run(diag_reg=0.05)),
    "gp_trace_none": (_gp_inputs(trace_none=True), _gp_run(diag_reg=0.02, absolute=True, trace_axes=())),
    "ens_mlp": (_ens_inputs(), _ens_run(lr=0.9)),
    "ens_mlp_diag_reg": (_ens_inputs(), _ens_run(diag_reg=0.1)),
    "ens_mlp_trace_none_1d": (_ens_inputs(c=0), _ens_run(lr=1.5, diag_reg=0.01, absolute=True, trace_axes=())),
    "max_learning_rate": (_mlr_inputs, _mlr_run),
}

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "predict")


def case_rng(name):
    return np.random.RandomState(sum(ord(ch) * (i + 1) for i, ch in enumerate(name)) % (2**31))


def main(wanted):
    import jax

    jax.config.update("jax_enable_x64", True)
    from neural_tangents import predict, stax

    os.makedirs(OUT_DIR, exist_ok=True)
    for name, (make, run) in CASES.items():
        if wanted and name not in wanted:
            continue
        inputs = make(case_rng(name))
        outputs = run(predict, stax, {k: jax.numpy.asarray(v) for k, v in inputs.items()})
        arrays = {f"in__{k}": np.asarray(v) for k, v in inputs.items()}
        arrays.update({f"out__{k}": np.asarray(v) for k, v in outputs.items()})
        np.savez(os.path.join(OUT_DIR, f"{name}.npz"), **arrays)
        print(f"{name}: {len(outputs)} outputs")
    import neural_tangents

    print(f"wrote predict fixtures to {OUT_DIR} with neural-tangents {neural_tangents.__version__}")


if __name__ == "__main__":
    main(sys.argv[1:])
