"""An infinite-width fully connected network classifying scikit-learn's 8x8 digits, written against
neural-tangents' API.

The program is neural-tangents code: with its two imports changed to ``import neural_tangents as nt`` and
``from neural_tangents import stax`` it runs unchanged under neural-tangents 0.6.5, and gives the same numbers
(``tests/test_examples_nt.py`` checks them against ``tests/golden/examples/nt_fcn_images.npz``).

The network is a three-layer erf/ReLU MLP with ten outputs. Trained on the mean squared error by gradient
descent at infinite width, its test outputs at time ``t`` are Gaussian with mean

    mu(t) = K_td K_dd^{-1} (I - exp(-lr K_dd t / |y|)) y

(``K`` the NTK for full training, the NNGP for training the readout only); ``t = None`` is ``t -> infinity``, the
kernel regression ``K_td K_dd^{-1} y``. ``nt.predict.gradient_descent_mse_ensemble`` evaluates it in the
eigenbasis of ``K_dd``. Accuracy is the arg-max of the ten outputs; MSE is against the centred one-hot targets.

Run: ``python docs/examples/nt_fcn_images.py`` (``SMNNGP_FAST=1``: fewer points, a few seconds).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
N_TRAIN, N_TEST = (100, 100) if FAST else (400, 400)
T_FINITE = 300.0  # training time in units of 1 / learning_rate
RESULTS = {}


def digits(n_train, n_test):
    """Flattened 8x8 images, each standardised (zero mean, unit variance over its 64 pixels); one-hot targets
    shifted to zero mean over the classes (-0.1 / 0.9), as is usual for MSE classification."""
    x, labels = load_digits(return_X_y=True)
    perm = np.random.RandomState(0).permutation(len(labels))[: n_train + n_test]
    x, labels = x[perm].astype(np.float64), labels[perm]
    x = (x - x.mean(axis=1, keepdims=True)) / x.std(axis=1, keepdims=True)
    y = np.eye(10)[labels] - 0.1
    return (jnp.asarray(x[:n_train]), jnp.asarray(y[:n_train]), labels[:n_train],
            jnp.asarray(x[n_train:]), jnp.asarray(y[n_train:]), labels[n_train:])


x_train, y_train, labels_train, x_test, y_test, labels_test = digits(N_TRAIN, N_TEST)

init_fn, apply_fn, kernel_fn = stax.serial(
    stax.Dense(512, W_std=1.5, b_std=0.05), stax.Erf(),
    stax.Dense(512, W_std=1.5, b_std=0.05), stax.Relu(),
    stax.Dense(10, W_std=1.5, b_std=0.05))
# Tiles of 50 x 50 points; the kernel is the same as one call on all points.
kernel_fn = nt.batch(kernel_fn, batch_size=50, store_on_device=False)

predict_fn = nt.predict.gradient_descent_mse_ensemble(kernel_fn, x_train, y_train, diag_reg=1e-4)

for t_name, t in (("t_inf", None), ("t_finite", T_FINITE)):
    mean = predict_fn(t=t, x_test=x_test, get=("nngp", "ntk"))
    for kind in ("nngp", "ntk"):
        pred = np.asarray(getattr(mean, kind))
        acc = float(np.mean(pred.argmax(axis=1) == labels_test))
        mse = float(np.mean((pred - np.asarray(y_test)) ** 2))
        RESULTS[f"{kind}_{t_name}_pred"] = pred
        RESULTS[f"{kind}_{t_name}_accuracy"] = acc
        RESULTS[f"{kind}_{t_name}_mse"] = mse
        print(f"{kind.upper():4s} t={'inf' if t is None else t:>6}: test accuracy {acc:.3f}, test MSE {mse:.4f}")

# The posterior of the NNGP (Bayesian inference with the readout trained to convergence): mean and covariance.
nngp_gaussian = predict_fn(t=None, x_test=x_test, get="nngp", compute_cov=True)
RESULTS["nngp_t_inf_std"] = np.sqrt(np.diag(np.asarray(nngp_gaussian.covariance)))
print(f"NNGP posterior std on the test points: mean {RESULTS['nngp_t_inf_std'].mean():.4f}")
