"""Masked ResNet-18, batch-norm state in the SGLD sampler, augmentation, CIFAR-10 parsing, SGLD checkpoints."""

from __future__ import annotations

import io
import pickle
import tarfile
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from finite.masked import categorical_loglik, cauchy_log_prior, masked_cnn
from finite.masked_resnet import masked_resnet18
from samplers.msgld import MSGLDState, msgld_epoch, random_crop_flip


@pytest.fixture(scope="module")
def tiny():
    net = masked_resnet18(width=1 / 16)  # physical (5, 10, 20, 40), active (4, 8, 16, 32)
    params, masks = net.init(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (6, 32, 32, 3))
    return net, params, masks, x


def test_full_resnet18_size_matches_the_standard_network():
    # The standard CIFAR ResNet-18 (all masks on, no 5/4 expansion): 11,173,962 parameters and 0.556 G
    # multiply-accumulates per 32 x 32 image (the figures thop and torchvision give for this network).
    net = masked_resnet18(expand=1.0, active_fraction=1.0)
    params, masks = jax.eval_shape(net.init, jax.random.PRNGKey(0))  # shapes only: no 11M random draws
    assert len(masks) == 17 and net.widths[:5] == (64, 64, 64, 64, 64) and net.widths[-1] == 512
    macs, n_params = net.flops_and_capacity([np.ones(w) for w in net.widths])
    assert n_params == sum(p.size for p in jax.tree_util.tree_leaves(params)) == 11_173_962
    assert macs == 555_422_720
    # the authors' spec: 5/4 physical widths, 4/5 of them active; its initial active network is the standard one
    paper = masked_resnet18()
    assert paper.channels == (80, 160, 320, 640) and paper.active == (64, 128, 256, 512)
    initial = [np.arange(w) < a for w, a in zip(paper.widths, paper._initial_active())]
    assert paper.flops_and_capacity(initial) == (macs, n_params)


def test_masks_act_on_their_channels(tiny):
    # With batch statistics, a channel whose convolution weights are zero normalises to its BN shift (0 at
    # init) and so outputs relu(0) = 0: exactly what masking it does. Checked for the stem and a block's conv1.
    net, params, masks, x = tiny
    j = 2
    m = list(masks)
    m[0] = m[0].at[j].set(0.0)
    zeroed = dict(params, stem=params["stem"].at[..., j].set(0.0))
    np.testing.assert_allclose(net.apply(params, tuple(m), x), net.apply(zeroed, masks, x), rtol=1e-5, atol=1e-5)
    m = list(masks)
    m[5] = m[5].at[j].set(0.0)  # block 3 (stage 2, first block): after its conv1
    blocks = list(params["blocks"])
    blocks[2] = dict(blocks[2], conv1=blocks[2]["conv1"].at[..., j].set(0.0))
    zeroed = dict(params, blocks=tuple(blocks))
    np.testing.assert_allclose(net.apply(params, tuple(m), x), net.apply(zeroed, masks, x), rtol=1e-5, atol=1e-5)
    # and masking changes the output (the mask is not ignored)
    assert not np.allclose(net.apply(params, tuple(m), x), net.apply(params, masks, x), atol=1e-4)


def test_running_statistics_converge_to_the_batch_statistics(tiny):
    net, params, masks, x = tiny
    state = net.init_state(params)
    step = jax.jit(lambda s: net.apply_train(params, s, masks, x)[1])
    for _ in range(250):  # 0.9^250 ~ 4e-12 of the initial statistics remain
        state = step(state)
    batch_mode = net.apply(params, masks, x)
    eval_mode = net.apply(params, masks, x, state)
    # the running variance is the unbiased one (n / (n - 1), n >= 6 * 4 * 4 = 96 here)
    np.testing.assert_allclose(eval_mode, batch_mode, rtol=0.05, atol=0.05)
    with pytest.raises(ValueError, match="17 masks"):
        net.apply(params, masks[:3], x)
    with pytest.raises(ValueError, match="inputs of shape"):
        net.apply(params, masks, x[:, :16])


def test_prior_covers_weights_but_not_batch_norm(tiny):
    net, params, masks, _ = tiny
    leaves = [params["stem"], *params["head"]] + [b[k] for b in params["blocks"]
                                                  for k in ("conv1", "conv2", "short") if k in b]
    expected = sum(stats.cauchy(0, 0.1).logpdf(np.asarray(w, float)).sum() for w in leaves)
    np.testing.assert_allclose(float(net.log_prior(params, 0.1)), expected, rtol=1e-5)
    moved = dict(params, stem_bn=(params["stem_bn"][0] + 3.0, params["stem_bn"][1] - 2.0))
    assert float(net.log_prior(moved, 0.1)) == float(net.log_prior(params, 0.1))


def test_sgld_at_zero_temperature_is_gradient_ascent_on_the_posterior():
    net = masked_cnn((4, 4, 1), (3, 5), (2, 4), out_dim=3)
    params, masks = net.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (20, 4, 4, 1))
    y = jax.random.randint(jax.random.PRNGKey(2), (20,), 0, 3)
    epoch = jax.jit(partial(msgld_epoch, net=net, batch_size=20, prior_scale=0.5, lam=0.1, t_mh=1000,
                            temperature=0.0))
    new, acc = epoch(jax.random.PRNGKey(3), MSGLDState(params, masks), x=x, y=y, step_sizes=jnp.array([1e-3]))
    grad = jax.grad(lambda p: cauchy_log_prior(p, 0.5) + categorical_loglik(net.apply(p, masks, x), y))(params)
    expected = jax.tree_util.tree_map(lambda p, g: p + 1e-3 * g, params, grad)
    for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(acc) == 0 and all(np.array_equal(a, b) for a, b in zip(new.masks, masks))


def test_random_crop_flip_returns_shifted_or_mirrored_windows():
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 6, 5, 2))
    out = np.asarray(random_crop_flip(jax.random.PRNGKey(1), x, pad=2, fill=jnp.array([7.0, -7.0])))
    assert out.shape == x.shape
    padded = np.stack([np.pad(np.asarray(x[..., c]), ((0, 0), (2, 2), (2, 2)), constant_values=v)
                       for c, v in enumerate((7.0, -7.0))], -1)
    flipped_any = shifted_any = False
    for i in range(16):
        windows = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (False, True)
                   if np.array_equal(out[i], (lambda w: w[:, ::-1] if f else w)(padded[i, dy:dy + 6, dx:dx + 5]))]
        assert windows, f"image {i} is not a window of its padded input"
        flipped_any |= any(f for _, _, f in windows)
        shifted_any |= any((dy, dx) != (2, 2) for dy, dx, _ in windows)
    assert flipped_any and shifted_any


def test_cifar10_parser_reads_the_python_archive_layout(tmp_path):
    from experiments.data import DataError, _parse_cifar10

    def batch(n, label0):
        data = np.zeros((n, 3, 32, 32), np.uint8)
        data[:, 0], data[:, 1], data[:, 2] = 10, 20, 30  # channel-major rows: R, G, B planes
        data[:, 0, 0, 1] = np.arange(n)  # one marked pixel: row 0, column 1, red
        return pickle.dumps({b"data": data.reshape(n, -1), b"labels": [(label0 + i) % 10 for i in range(n)]})

    path = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            blob = batch(4, 3)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    d = _parse_cifar10(path)
    assert d.x_train.shape == (20, 32, 32, 3) and d.x_test.shape == (4, 32, 32, 3) and d.x_train.dtype == np.uint8
    np.testing.assert_array_equal(d.x_test[0, 5, 5], [10, 20, 30])
    np.testing.assert_array_equal(d.x_test[:, 0, 1, 0], np.arange(4))
    np.testing.assert_array_equal(d.y_test, [3, 4, 5, 6])
    broken = tmp_path / "broken.tar.gz"
    with tarfile.open(broken, "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match="data_batch_1 of the CIFAR-10 archive is malformed"):
        _parse_cifar10(broken)
    short = tmp_path / "short.tar.gz"
    with tarfile.open(short, "w:gz") as tar:
        blob = batch(4, 0)
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(DataError, match="data_batch_2 missing"):
        _parse_cifar10(short)


def test_sgld_run_resumes_after_interruption(tmp_path):
    from experiments.mbnn_cnn import sgld_run

    rng = np.random.default_rng(0)
    x = rng.normal(size=(260, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 3, 260)
    net = masked_cnn((4, 4, 1), (6, 8), (4, 6), out_dim=3)
    s = dict(burnin=2, samples=2, thin=1, step=1e-3, batch=50, lam=0.1, prior_scale=0.5, t_mh=2, n_mh=1,
             temperature=1.0)
    run = partial(sgld_run, s=s, xtr=x[:200], ytr=y[:200], xte=x[200:], yte=y[200:], progress=False)
    straight = run(net)

    base = type(net)

    class Interrupted(base):  # the same network, interrupted at its first kept draw
        calls = 0

        def flops_and_capacity(self, masks):
            type(self).calls += 1
            if type(self).calls == 2:  # call 1 is the reference size at the start
                raise KeyboardInterrupt
            return base.flops_and_capacity(self, masks)

    ck = tmp_path / "ck.pkl"
    with pytest.raises(KeyboardInterrupt):
        run(Interrupted(*net), checkpoint=str(ck))
    assert pickle.loads(ck.read_bytes())["epoch"] == 2  # both burn-in epochs were saved
    resumed = run(net, checkpoint=str(ck))
    assert resumed["accuracy"] == straight["accuracy"] and resumed["nll"] == pytest.approx(straight["nll"], 1e-6)
    assert resumed["active_trace"] == straight["active_trace"]


def test_resnet_sgld_epoch_updates_weights_statistics_and_keeps_masks_valid(tiny):
    net, params, masks, _ = tiny
    x = jax.random.normal(jax.random.PRNGKey(5), (40, 32, 32, 3))
    y = jax.random.randint(jax.random.PRNGKey(6), (40,), 0, 10)
    state = MSGLDState(params, masks, net.init_state(params))
    new, _ = jax.jit(partial(msgld_epoch, net=net, batch_size=20, prior_scale=0.1, lam=0.05, t_mh=1, n_mh=1,
                             temperature=1 / 40, augment=random_crop_flip))(
        jax.random.PRNGKey(7), state, x=x, y=y, step_sizes=jnp.full(2, 1e-3))
    assert all(float(m.sum()) >= 1 for m in new.masks)
    assert not np.allclose(new.net_state[0][0], 0.0) and not np.allclose(new.net_state[0][1], 1.0)
    assert not np.allclose(new.params["stem"], params["stem"])
    assert np.all(np.isfinite(np.asarray(net.apply(new.params, new.masks, x, new.net_state))))
