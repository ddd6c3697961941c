"""NS-VI baseline (group normal-Jeffreys MLP): KL terms against closed forms, pruning of irrelevant inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from finite.nsvi import K1, fit_nsvi, nsvi_active, nsvi_init, nsvi_kl, nsvi_predict


def test_weight_kl_matches_gaussian_kl_and_z_kl_is_monotone():
    p = nsvi_init(jax.random.PRNGKey(0), 3, (4,), 1, jnp.float64)
    # z part at fixed log alpha; weight part is sum KL(N(m, s^2) || N(0, 1))
    base = float(nsvi_kl(p))
    m = np.concatenate([np.asarray(w).ravel() for w in p.w_mu])
    s2 = np.concatenate([np.exp(np.asarray(w)).ravel() for w in p.w_log_s2])
    weight_kl = np.sum(0.5 * (-np.log(s2) + s2 + m**2 - 1))
    la = np.concatenate([np.asarray(a) for a in p.z_log_alpha])
    z_kl = -np.sum(K1 * (1 / (1 + np.exp(-(1.87320 + 1.48695 * la)))) - 0.5 * np.log1p(np.exp(-la)) - K1)
    assert base == pytest.approx(weight_kl + z_kl, rel=1e-10)
    # numerical check of one weight term against scipy's entropy-based KL
    x = np.linspace(-8, 8, 20001)
    q, pr = stats.norm(0.3, 0.5), stats.norm(0, 1)
    kl_num = np.trapezoid(q.pdf(x) * (q.logpdf(x) - pr.logpdf(x)), x)
    assert 0.5 * (-np.log(0.25) + 0.25 + 0.09 - 1) == pytest.approx(kl_num, rel=1e-6)
    # the z prior favours noisy scales: the KL falls as log alpha grows
    kls = [float(nsvi_kl(p._replace(z_log_alpha=tuple(jnp.full_like(a, v) for a in p.z_log_alpha))))
           for v in (-4.0, 0.0, 4.0)]
    assert kls[0] > kls[1] > kls[2]


def test_irrelevant_inputs_are_pruned_and_fit_is_good():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (300, 6))
    y = 2.0 * x[:, 0] - x[:, 1] + 0.1 * rng.normal(size=300)
    p = fit_nsvi(jax.random.PRNGKey(0), x, y, widths=(16,), epochs=400, batch_size=100)
    la = np.asarray(p.z_log_alpha[0])
    assert la[:2].max() < la[2:].min(), la  # the two relevant inputs keep the lowest noise-to-signal ratio
    keep = nsvi_active(p)
    assert bool(keep[0][0]) and bool(keep[0][1])
    f, sd = nsvi_predict(p, jax.random.PRNGKey(1), jnp.asarray(x[:50], jnp.float32))
    assert np.sqrt(np.mean((np.asarray(f).mean(0) - y[:50]) ** 2)) < 0.3
    with pytest.raises(ValueError, match="NaN"):
        fit_nsvi(jax.random.PRNGKey(0), np.full((5, 2), np.nan), np.zeros(5))
