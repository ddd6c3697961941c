"""Finite ensembles with a fixed or inverse-gamma last-layer scale (finite.ensembles; notes 002 section 3.5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from finite import ensembles as E
from smnngp import stax


def _toy(n=30, side=5, classes=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, side, side, 1)).astype(dtype)
    y = rng.integers(0, classes, n)
    return x, y


# float64 on the CPU (CI) meets tight tolerances; on a GPU, XLA's float64 convolutions and reductions run in another
# order (and its default convolution precision differs), which moves results by up to ~3e-8 relative (seen on an
# H100): comparisons of two computation orders take the GPU tolerance there.
ON_CPU = jax.default_backend() == "cpu"


def _order_tol(rtol, atol):
    """(rtol, atol) for comparing two orders of the same float64 computation on this backend."""
    return (rtol, atol) if ON_CPU else (max(rtol, 1e-6), max(atol, 1e-8))


def _allclose_trees(a, b, rtol, atol):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)


def test_vmapped_training_equals_each_member_alone_and_resumes_exactly():
    net = E.cnn(depth=2, channels=3, num_classes=3)
    x, y = _toy()
    ens = E.init_ensemble(jax.random.PRNGKey(0), net, (-1, 5, 5, 1), 3, scale="inverse_gamma")
    assert ens.params[0][0].dtype == jnp.float64 and ens.scales.shape == (3,)
    key = jax.random.PRNGKey(1)
    # batch 8 over 30 points: 3 steps per epoch, remainder dropped
    trained, info = E.train_ensemble(key, net, ens, x, y, epochs=3, batch_size=8, progress=False)
    assert info.losses.shape == (3, 3) and info.epochs_done == 3
    # members start and end apart (independent initialisations)
    w_last = np.asarray(trained.params[-1][0])
    assert not np.allclose(w_last[0], w_last[1])
    keys = jax.random.split(key, 3)
    for i in range(3):
        alone, info_i = E.train_ensemble(keys[i:i + 1], net, E.select_members(ens, i), x, y, epochs=3,
                                         batch_size=8, progress=False)
        _allclose_trees(alone, E.select_members(trained, i), *_order_tol(1e-9, 1e-12))
        np.testing.assert_allclose(info_i.losses[:, 0], info.losses[:, i], rtol=_order_tol(1e-10, 0.0)[0])
    # training decreased every member's loss on this learnable-by-memorising problem
    assert np.all(info.losses[-1] < info.losses[0])
    # interrupted after 2 epochs and resumed for 1 = 3 epochs straight
    part, info2 = E.train_ensemble(key, net, ens, x, y, epochs=2, batch_size=8, progress=False)
    resumed, info3 = E.train_ensemble(key, net, part, x, y, epochs=1, batch_size=8, progress=False,
                                      opt_state=info2.opt_state, start_epoch=info2.epochs_done)
    _allclose_trees(resumed, trained, rtol=1e-10, atol=1e-13)
    # the epoch as one lax.scan equals the loop over the compiled step (the default on CPU, used above)
    other, info_s = E.train_ensemble(key, net, ens, x, y, epochs=3, batch_size=8, progress=False,
                                     scan=jax.default_backend() == "cpu")
    _allclose_trees(other, trained, *_order_tol(1e-9, 1e-12))
    np.testing.assert_allclose(info_s.losses, info.losses, rtol=_order_tol(1e-10, 0.0)[0])


def test_member_scale_is_the_readout_W_std_at_init_and_in_training():
    """sigma_v * f(theta, x) equals the network with Dense(C, W_std=sigma_v), and trains identically (NTK param)."""
    x, y = _toy(n=24, seed=1)
    net = E.cnn(depth=1, channels=4, num_classes=3)
    ens = E.init_ensemble(jax.random.PRNGKey(2), net, x.shape, 5, scale="inverse_gamma")
    logits = E.ensemble_logits(net, ens, x)
    for i, s in enumerate(np.asarray(ens.scales)):
        ref_apply = E.cnn(depth=1, channels=4, num_classes=3, readout_W_std=float(s))[1]
        p_i = jax.tree.map(lambda leaf: leaf[i], ens.params)
        rtol, atol = _order_tol(1e-12, 1e-14)
        np.testing.assert_allclose(np.asarray(logits[i]), np.asarray(ref_apply(p_i, jnp.asarray(x))),
                                   rtol=rtol, atol=atol)
    # training: scale multiplier 2.5 on a W_std=1 readout == fixed scale 1 on a W_std=2.5 readout
    s = 2.5
    net_s = E.cnn(depth=1, channels=4, num_classes=3, readout_W_std=s)
    ens_a = E.init_ensemble(jax.random.PRNGKey(3), net, x.shape, 1, scale="fixed", sigma_v=s)
    ens_b = E.init_ensemble(jax.random.PRNGKey(3), net_s, x.shape, 1, scale="fixed")
    _allclose_trees(ens_a.params, ens_b.params, rtol=0, atol=0)
    ta, _ = E.train_ensemble(jax.random.PRNGKey(4), net, ens_a, x, y, epochs=3, batch_size=6, progress=False)
    tb, _ = E.train_ensemble(jax.random.PRNGKey(4), net_s, ens_b, x, y, epochs=3, batch_size=6, progress=False)
    _allclose_trees(ta.params, tb.params, *_order_tol(1e-9, 1e-12))
    np.testing.assert_allclose(np.asarray(E.ensemble_logits(net, ta, x)), np.asarray(E.ensemble_logits(net_s, tb, x)),
                               rtol=1e-9, atol=1e-12)


def test_inverse_gamma_scales_follow_the_prior():
    """KS test of the members' sigma_v^2 against InvGamma(a, b), K = 4000 members.

    With a fixed key the test is deterministic; its power: the KS critical value at level 1e-3 for n = 4000 is
    about 0.031, while the sup distance between InvGamma(3, 1.5) and the default InvGamma(2, 2) is about 0.2, so
    a mix-up of the parameters (or drawing sigma_v instead of sigma_v^2) is rejected.
    """
    net = stax.serial(stax.Flatten(), stax.Dense(3))
    k = 4000
    ens = E.init_ensemble(jax.random.PRNGKey(5), net, (-1, 2), k, scale="inverse_gamma", a=3.0, b=1.5)
    var = np.asarray(ens.scales) ** 2
    assert stats.kstest(var, stats.invgamma(3.0, scale=1.5).cdf).pvalue > 1e-3
    assert stats.kstest(var, stats.invgamma(2.0, scale=2.0).cdf).pvalue < 1e-6
    assert stats.kstest(np.asarray(ens.scales), stats.invgamma(3.0, scale=1.5).cdf).pvalue < 1e-6
    default = E.init_ensemble(jax.random.PRNGKey(6), net, (-1, 2), k, scale="inverse_gamma")
    assert stats.kstest(np.asarray(default.scales) ** 2, stats.invgamma(2.0, scale=2.0).cdf).pvalue > 1e-3
    # the output of member k is its scale times an unscaled output: the spread of logits / sigma_v does not
    # depend on sigma_v (correlation of |f| with sigma_v near 0, of |logits| with sigma_v clearly positive)
    x = jnp.ones((1, 2))
    logits = np.asarray(E.ensemble_logits(net, ens, x))[:, 0, 0]
    sv = np.asarray(ens.scales)
    assert abs(stats.spearmanr(np.abs(logits / sv), sv).statistic) < 0.06  # 3.8 standard errors at K = 4000
    assert stats.spearmanr(np.abs(logits), sv).statistic > 0.2
    # any positive law of sigma_v^2 (here Burr XII, KS-tested like the inverse gamma); not a signed one
    from smnngp.priors import BurrXII

    burr = E.init_ensemble(jax.random.PRNGKey(9), net, (-1, 2), k, scale=BurrXII(2.0, 1.5))
    assert stats.kstest(np.asarray(burr.scales) ** 2, stats.burr12(2.0, 1.5).cdf).pvalue > 1e-3
    import numpyro.distributions as dist

    with pytest.raises(ValueError, match="scale"):
        E.init_ensemble(jax.random.PRNGKey(9), net, (-1, 2), 3, scale=dist.Normal(0.0, 1.0))
    fixed = E.init_ensemble(jax.random.PRNGKey(5), net, (-1, 2), 4, scale="fixed", sigma_v=0.7)
    np.testing.assert_array_equal(np.asarray(fixed.scales), np.full(4, 0.7, dtype=fixed.scales.dtype))


def test_combine_probs_and_logits():
    x, y = _toy(n=20, seed=2)
    net = E.cnn(depth=1, channels=3, num_classes=3)
    ens = E.init_ensemble(jax.random.PRNGKey(7), net, x.shape, 4, scale="inverse_gamma", a=1.0, b=1.0)
    logits = np.asarray(E.ensemble_logits(net, ens, x))
    members = np.exp(logits - logits.max(-1, keepdims=True))
    members /= members.sum(-1, keepdims=True)
    probs, mem = E.predict(net, ens, x, return_members=True)
    np.testing.assert_allclose(np.asarray(mem), members, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(probs), members.mean(0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(E.member_probabilities(net, ens, x)), members, rtol=1e-12)
    avg = logits.mean(0)
    by_logits = np.exp(avg - avg.max(-1, keepdims=True))
    by_logits /= by_logits.sum(-1, keepdims=True)
    p_logits = np.asarray(E.predict(net, ens, x, combine="logits"))
    np.testing.assert_allclose(p_logits, by_logits, rtol=1e-12)
    assert np.abs(p_logits - np.asarray(probs)).max() > 1e-3  # the two rules really differ here
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-12)
    # chunked evaluation (last chunk padded) equals one pass
    np.testing.assert_allclose(np.asarray(E.predict(net, ens, x, batch_size=7)), np.asarray(probs), rtol=1e-12)


def test_tiny_ensemble_learns_digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(d.target))
    x = (d.images[idx] / 16.0).astype(np.float32)[..., None]
    y = d.target[idx]
    xtr, ytr, xte, yte = x[:600], y[:600], x[1000:1400], y[1000:1400]
    net = E.cnn(depth=2, channels=8, num_classes=10)
    # the random-scale ensemble (the fixed scale runs the same code, with the scales of the tests above)
    ens, info = E.fit_ensemble(jax.random.PRNGKey(8), net, xtr, ytr, num_members=3, scale="inverse_gamma",
                               epochs=15, batch_size=50, learning_rate=1e-2, progress=False)
    assert ens.scales.dtype == jnp.float32 and len(set(np.asarray(ens.scales).tolist())) == 3
    probs, members = E.predict(net, ens, xte, return_members=True)
    acc = float(np.mean(np.argmax(np.asarray(probs), -1) == yte))
    member_acc = np.mean(np.argmax(np.asarray(members), -1) == yte[None], axis=1)
    nll = -np.mean(np.log(np.asarray(probs)[np.arange(len(yte)), yte]))
    assert acc > 0.9, (acc, member_acc)  # 0.95 measured
    assert member_acc.min() > 0.85, member_acc  # 0.94-0.955 measured
    assert nll < 0.35, nll  # 0.16 measured
    assert np.all(info.losses[-1] < info.losses[0] / 5)


def test_bad_input_is_named():
    net = E.cnn(depth=1, channels=2, num_classes=3)
    x, y = _toy(n=10)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="num_members"):
        E.init_ensemble(key, net, x.shape, 0)
    with pytest.raises(ValueError, match="scale"):
        E.init_ensemble(key, net, x.shape, 2, scale="gaussian")
    for a, b, bad in ((0.0, 2.0, "a"), (-1.0, 2.0, "a"), (2.0, 0.0, "b"), (2.0, float("nan"), "b")):
        with pytest.raises(ValueError, match=rf"\b{bad} must be positive"):
            E.init_ensemble(key, net, x.shape, 2, scale="inverse_gamma", a=a, b=b)
    with pytest.raises(ValueError, match="sigma_v"):
        E.init_ensemble(key, net, x.shape, 2, scale="fixed", sigma_v=0.0)
    ens = E.init_ensemble(key, net, x.shape, 2)
    with pytest.raises(ValueError, match="combine"):
        E.predict(net, ens, x, combine="mean")
    for bad_y in (np.where(np.arange(10) == 3, 3, y), np.where(np.arange(10) == 0, -1, y)):
        with pytest.raises(ValueError, match=r"y must lie in 0\.\.2"):
            E.train_ensemble(key, net, ens, x, bad_y, epochs=1, progress=False)
    with pytest.raises(ValueError, match="y must be a vector of 10"):
        E.train_ensemble(key, net, ens, x, y[:5], epochs=1, progress=False)
    x_nan = x.copy()
    x_nan[2, 1, 1, 0] = np.nan
    with pytest.raises(ValueError, match="x has 1 non-finite"):
        E.train_ensemble(key, net, ens, x_nan, y, epochs=1, progress=False)
    with pytest.raises(ValueError, match="x has 1 non-finite"):
        E.predict(net, ens, x_nan)
    with pytest.raises(ValueError, match="learning_rate"):
        E.train_ensemble(key, net, ens, x, y, epochs=1, learning_rate=-1.0, progress=False)
    with pytest.raises(ValueError, match="num_members"):
        E.fit_ensemble(key, net, x, y, num_members=0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="key holds 3 member keys for 2"):
        E.train_ensemble(jax.random.split(key, 3), net, ens, x, y, epochs=1, progress=False)
