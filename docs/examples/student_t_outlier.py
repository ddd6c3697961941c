"""NNGP against Student-t process on 1-D data with one outlier."""
import jax
import matplotlib.pyplot as plt
import numpy as np

from smnngp import posterior, priors, stax

jax.config.update("jax_enable_x64", True)
_, _, kernel_fn = stax.serial(
    stax.Dense(1, W_std=1.0, b_std=1.0), stax.Relu(),
    stax.Dense(1, W_std=1.0, b_std=1.0), stax.Relu(),
    stax.Dense(1, W_std=1.0))  # readout W_std = 1: the prior carries the scale
rng = np.random.default_rng(0)
x = np.sort(rng.uniform(-3, 3, 30))[:, None]
y = np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=30)
y[np.argmin(np.abs(x[:, 0] - 1.0))] += 4.0  # one gross outlier near x = 1
xs = np.linspace(-4, 4, 200)[:, None]

models = {"NNGP": priors.Delta(1.0),  # readout variance sigma_v^2 = 1
          "Student-t process": priors.InverseGamma(2.0, 1.0)}  # ~ InvGamma(2, 1)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, (name, prior) in zip(axes, models.items()):
    pred = posterior.fit(kernel_fn, x, y, prior, noise=0.01).predict(xs)
    lo, hi = posterior.interval(pred, 0.95)
    ax.fill_between(xs[:, 0], lo, hi, alpha=0.3, label="95% predictive")
    ax.plot(xs[:, 0], pred.mean, label="mean")
    ax.scatter(x[:, 0], y, s=10, c="k", label="data")
    ax.set_title(name)
axes[0].legend(loc="lower left", fontsize=8)
fig.tight_layout()
fig.savefig("student_t_outlier.png", dpi=110)
