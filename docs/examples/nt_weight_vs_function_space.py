"""Training a wide network in weight space, its linearisation, and the function-space solution, written against
neural-tangents' API.

Three ways to train the same randomly initialised network ``f(theta, x)`` on ``L(theta) = mean((f - y)^2) / 2`` by
full-batch gradient descent with learning rate ``lr``:

1. weight space: ``theta_{k+1} = theta_k - lr grad L(theta_k)`` on the network itself (``jax.grad``);
2. the linearised network ``f_lin(theta, x) = f(theta_0, x) + J(x) (theta - theta_0)`` (``nt.linearize``), trained by
   the same steps;
3. function space: the gradient flow of the linearised network in closed form (``nt.predict.gradient_descent_mse``)
   on the empirical NTK ``Theta_0 = J J^T`` at initialisation (``nt.empirical_ntk_fn``),

       f_t(x) = f_0(x) - Theta_0(x, X) Theta_0^{-1} (I - exp(-lr Theta_0 t / |y|)) (f_0(X) - y),

   evaluated at ``t = steps`` with ``learning_rate=lr`` (the flow time is ``lr * steps``).

As the width ``n`` grows, the network stays ever closer to its linearisation during training (the Jacobian moves
by ``O(1/sqrt(n))``), so trajectories 1 and 2 converge (``weight_vs_linear`` shrinks). Trajectories 2 and 3 differ
only by the time discretisation of gradient descent (``(1 - lr lam / |y|)^k`` against ``exp(-lr lam k / |y|)`` per
eigenvalue ``lam``), whatever the width: ``linear_vs_function`` is a floor of a few 1e-3 (``lr`` is a fiftieth of
the largest stable one), which ``weight_vs_function`` approaches as the width grows. The numbers printed are
relative RMS differences over all recorded steps, train and test points, averaged over ``SEEDS`` initialisations.

With its two imports changed to neural-tangents', the program runs unchanged under neural-tangents 0.6.5
(``tests/test_examples_nt.py`` compares the two).

Run: ``python docs/examples/nt_weight_vs_function_space.py`` (``SMNNGP_FAST=1``: three widths, fewer steps).
"""

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

import smnngp.nt as nt
from smnngp.nt import stax

jax.config.update("jax_enable_x64", True)
FAST = os.environ.get("SMNNGP_FAST") == "1"
WIDTHS = (64, 256, 1024) if FAST else (64, 256, 1024, 4096)
RECORD = np.array([0, 25, 100, 400] if FAST else [0, 25, 100, 400, 1600])  # steps at which outputs are kept
SEEDS = 2 if FAST else 4  # initialisations per width; the differences printed are their means
RESULTS = {}

rs = np.random.RandomState(1)
x_train = jnp.asarray(rs.uniform(-1.0, 1.0, size=(16, 2)))
x_test = jnp.asarray(rs.uniform(-1.0, 1.0, size=(32, 2)))


def target(x):
    return jnp.sin(3.0 * x[:, :1]) * jnp.cos(2.0 * x[:, 1:])


y_train, y_test = target(x_train), target(x_test)


def network(width):
    return stax.serial(
        stax.Dense(width, W_std=1.5, b_std=0.1), stax.Erf(),
        stax.Dense(width, W_std=1.5, b_std=0.1), stax.Erf(),
        stax.Dense(1, W_std=1.5, b_std=0.1))


# One learning rate for every width, from the infinite-width NTK: a fiftieth of the largest stable one.
kernel_fn = network(1)[2]
lr = float(nt.predict.max_learning_rate(kernel_fn(x_train, None, "ntk"))) / 50.0
RESULTS["learning_rate"] = lr
print(f"learning rate {lr:.4f}, steps recorded {RECORD.tolist()}")


@partial(jax.jit, static_argnums=0)
def train_steps(f, params, n, x, y, *args):
    """``n`` steps of full-batch gradient descent on ``mean((f(params, x, *args) - y)^2) / 2`` over ``params``.
    The data are arguments, not constants of the compiled loop (XLA would fold ``x W`` at compile time)."""

    def loss(p):
        return 0.5 * jnp.mean((f(p, x, *args) - y) ** 2)

    def step(_, p):
        return tree_util.tree_map(lambda w, g: w - lr * g, p, jax.grad(loss)(p))

    return jax.lax.fori_loop(0, n, step, params)


def gradient_descent(f, params, *args):
    """Outputs of ``f(params, x, *args)`` on train and test points at the steps ``RECORD`` of gradient descent."""
    train, test, done = [], [], 0
    for k in RECORD:
        params = train_steps(f, params, k - done, x_train, y_train, *args) if k > done else params
        done = k
        train.append(f(params, x_train, *args))
        test.append(f(params, x_test, *args))
    return jnp.stack(train), jnp.stack(test)


def rel_rms(a, b):
    return float(jnp.sqrt(jnp.mean((a - b) ** 2) / jnp.mean(b**2)))


for width in WIDTHS:
    init_fn, apply_fn, _ = network(width)
    apply_fn = jax.jit(apply_fn)
    # The linearisation around params_0, with params_0 an argument so that one compilation serves every seed.
    linear_fn = jax.jit(lambda p, x, p0: nt.linearize(apply_fn, p0)(p, x))
    ntk_fn = jax.jit(nt.empirical_ntk_fn(apply_fn, vmap_axes=0))
    errors = {"weight_vs_linear": [], "weight_vs_function": [], "linear_vs_function": []}
    mse = []
    for seed in range(SEEDS):
        _, params = init_fn(jax.random.PRNGKey(seed), x_train.shape)

        weight = gradient_descent(apply_fn, params)
        linear = gradient_descent(linear_fn, params, params)

        predict_fn = nt.predict.gradient_descent_mse(ntk_fn(x_train, None, params), y_train, learning_rate=lr)
        function = predict_fn(RECORD, apply_fn(params, x_train), apply_fn(params, x_test),
                              ntk_fn(x_test, x_train, params))

        both = [jnp.concatenate(t, axis=1) for t in (weight, linear, function)]
        errors["weight_vs_linear"].append(rel_rms(both[0], both[1]))
        errors["weight_vs_function"].append(rel_rms(both[0], both[2]))
        errors["linear_vs_function"].append(rel_rms(both[1], both[2]))
        mse.append(float(jnp.mean((weight[1][-1] - y_test) ** 2)))
    for key, values in errors.items():
        RESULTS.setdefault(key, []).append(np.mean(values))
    RESULTS.setdefault("test_mse_weight", []).append(np.mean(mse))
    print(f"width {width:5d}: " + ", ".join(f"{k} {RESULTS[k][-1]:.2e}" for k in errors)
          + f", final test MSE {RESULTS['test_mse_weight'][-1]:.4f}  (means over {SEEDS} initialisations)")

RESULTS = {k: np.asarray(v) for k, v in RESULTS.items()}
RESULTS["widths"] = np.asarray(WIDTHS)
