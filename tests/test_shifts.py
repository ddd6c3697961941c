"""experiments.shifts: image shifts (determinism, shape, range, damage growing with severity, each shift's own
signature) and training-set shifts (OOD classes, imbalance counts, label-noise rate), on digits and on larger
synthetic images. No download."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import ndimage

from experiments import shifts
from experiments.data import load_images

SEVERITIES = range(1, 6)


@pytest.fixture(scope="module")
def digits():
    return load_images("digits")


@pytest.fixture(scope="module")
def batches(digits):
    """Three image kinds: 8x8 digits, digits enlarged to 28x28 (MNIST-sized), smooth 32x32 colour images."""
    x28 = np.clip(ndimage.zoom(digits.x_test[:150], (1, 3.5, 3.5, 1), order=1), 0, 1).astype(np.float32)
    colour = ndimage.gaussian_filter(np.random.default_rng(0).random((60, 32, 32, 3)), (0, 2, 2, 0))
    colour = (colour - colour.min()) / (colour.max() - colour.min())
    return {"digits": digits.x_test, "28px": x28, "colour": colour}


@pytest.mark.parametrize("name", list(shifts.IMAGE_SHIFTS))
def test_image_shift_contract(name, batches):
    for kind, x in batches.items():
        before = x.copy()
        out = [shifts.apply_shift(name, x, s, seed=3) for s in SEVERITIES]
        np.testing.assert_array_equal(x, before)  # the input is not modified
        for y in out:
            assert y.shape == x.shape and y.dtype == x.dtype
            assert np.isfinite(y).all() and y.min() >= 0.0 and y.max() <= 1.0
        np.testing.assert_array_equal(shifts.apply_shift(name, x, 4, seed=3), out[3])  # deterministic
        assert not np.array_equal(shifts.apply_shift(name, x, 4, seed=4), out[3])  # and the seed matters
        change = [float(np.abs(y.astype(np.float64) - x).mean()) for y in out]
        assert change[0] > 0 and all(np.diff(change) > 0), f"{name} on {kind}: mean |change| {change}"


def test_shot_noise_is_clipped_poisson():
    """Each value is min(Poisson(lam x) / lam, 1): sample mean and variance against the exact moments of that
    law, within 5 standard errors."""
    from scipy import stats

    x = np.full((200, 10, 10, 1), 0.3)
    for severity, lam in zip(SEVERITIES, shifts.SHOT_LAMBDA):
        y = shifts.apply_shift("shot-noise", x, severity, seed=0)
        counts = np.round(y * lam)
        np.testing.assert_allclose(y * lam, counts, atol=1e-9)  # multiples of 1 / lam
        k = np.arange(200)
        v, p = np.minimum(k / lam, 1.0), stats.poisson.pmf(k, 0.3 * lam)
        mean = np.sum(p * v)
        var = np.sum(p * (v - mean) ** 2)
        m4 = np.sum(p * (v - mean) ** 4)
        assert abs(y.mean() - mean) < 5 * math.sqrt(var / y.size)
        assert abs(y.var() - var) < 5 * math.sqrt((m4 - var**2) / y.size)
        if severity == 1:
            assert abs(mean - 0.3) < 1e-6  # clipping is negligible at lam = 60: unbiased


def test_impulse_noise_hits_the_stated_fraction_half_salt_half_pepper():
    x = np.full((100, 20, 20, 3), 0.4)
    for severity, amount in zip(SEVERITIES, shifts.IMPULSE_AMOUNT):
        y = shifts.apply_shift("impulse-noise", x, severity, seed=1)
        assert set(np.unique(y)) <= {0.0, 0.4, 1.0}
        sd = math.sqrt(amount * (1 - amount) / y.size)
        assert abs(np.mean(y != 0.4) - amount) < 5 * sd
        assert abs(np.mean(y == 1.0) - amount / 2) < 5 * sd


def test_occlusion_is_one_grey_square_of_the_stated_side():
    x = np.zeros((50, 28, 28, 1))
    for severity, frac in zip(SEVERITIES, shifts.OCCLUSION_SIDE):
        side = round(frac * 28)
        y = shifts.apply_shift("occlusion", x, severity, seed=2)[..., 0]
        for img in y:
            rows, cols = np.nonzero(img)
            assert np.all(img[rows, cols] == 0.5) and rows.size == side * side
            assert rows.max() - rows.min() + 1 == side and cols.max() - cols.min() + 1 == side


def test_zigzag_lines_are_white_and_nested_across_severities():
    x = np.zeros((40, 28, 28, 1))
    masks = [shifts.apply_shift("zigzag", x, s, seed=5)[..., 0] for s in SEVERITIES]
    for lo, hi in zip(masks, masks[1:]):
        assert set(np.unique(hi)) == {0.0, 1.0}
        assert np.all(hi >= lo) and hi.sum() > lo.sum()  # severity s draws the first s of the same five lines
    assert masks[0].sum(axis=(1, 2)).min() >= 14  # through the central half: at least 7 px each way


def test_fog_is_a_blend_with_one_smooth_haze():
    x = np.random.default_rng(0).random((10, 28, 28, 3))
    a = shifts.FOG_STRENGTH
    haze = [shifts.apply_shift("fog", x, s, seed=6) * (1 + a[s - 1]) - x for s in SEVERITIES]
    field = haze[0] / a[0]
    for s in SEVERITIES:
        np.testing.assert_allclose(haze[s - 1] / a[s - 1], field, atol=1e-9)  # the same field at every severity
    assert field.min() >= -1e-9 and field.max() <= 1 + 1e-9
    np.testing.assert_allclose(field[..., 0], field[..., 2], atol=1e-12)  # grey
    assert np.abs(np.diff(field, axis=1)).mean() < 0.2 * np.abs(np.diff(x, axis=1)).mean()  # smooth, not white


def test_snow_only_brightens():
    x = np.random.default_rng(1).random((20, 28, 28, 3))
    prev = x
    for s in SEVERITIES:
        y = shifts.apply_shift("snow", x, s, seed=7)
        assert np.all(y >= prev - 1e-12)
        prev = y


def test_image_shift_errors(digits):
    x = digits.x_test[:5]
    with pytest.raises(ValueError, match="unknown shift 'blurr'.*shot-noise.*snow"):
        shifts.apply_shift("blurr", x, 1)
    with pytest.raises(ValueError, match="'ood' changes the training set.*shift_train_set"):
        shifts.apply_shift("ood", x, 1)
    for bad in (0, 6, -1, 2.5, "3"):
        with pytest.raises(ValueError, match="severity must be an integer in 1..5"):
            shifts.apply_shift("fog", x, bad)
    with pytest.raises(ValueError, match=r"x must be an image array of shape \(N, H, W, C\), got shape \(5, 8, 8\)"):
        shifts.apply_shift("fog", x[..., 0], 1)
    with pytest.raises(ValueError, match=r"values in \[0, 1\]"):
        shifts.apply_shift("fog", x * 2, 1)
    with pytest.raises(ValueError, match="dtype uint8"):
        shifts.apply_shift("fog", (x * 255).astype(np.uint8), 1)
    with pytest.raises(ValueError, match="corrupts images"):
        shifts.shift_train_set("fog", x, digits.y_test[:5])
    with pytest.raises(ValueError, match="unknown training-set shift 'oodd'"):
        shifts.shift_train_set("oodd", x, digits.y_test[:5])
    assert set(shifts.SHIFTS) == set(shifts.IMAGE_SHIFTS) | {"ood", "imbalance", "noisy-labels"}


# ---------------------------------------------------------------------------------------------------------------
# training-set shifts


def test_ood_removes_exactly_classes_1_4_8(digits):
    x, y = shifts.shift_train_set("ood", digits.x_train, digits.y_train)
    assert set(np.unique(y)) == set(range(10)) - {1, 4, 8}
    keep = ~np.isin(digits.y_train, [1, 4, 8])
    assert len(y) == keep.sum()
    np.testing.assert_array_equal(x, digits.x_train[keep])
    np.testing.assert_array_equal(y, digits.y_train[keep])
    x2, y2 = shifts.remove_classes(digits.x_train, digits.y_train, [0])
    assert 0 not in y2 and len(y2) == np.sum(digits.y_train != 0)


def test_imbalance_counts(digits):
    x, y = shifts.shift_train_set("imbalance", digits.x_train, digits.y_train, seed=0)
    original = np.bincount(digits.y_train)
    n_min = original.min()
    expected = [max(1, math.floor(n_min * math.exp(0.5 * c) / math.exp(0.5 * 9))) for c in range(10)]
    np.testing.assert_array_equal(np.bincount(y, minlength=10), expected)
    assert expected[9] == n_min and expected[0] == 1  # the largest class keeps the smallest's original count
    # the kept rows are rows of the original set, with their images
    rows = {img.tobytes(): label for img, label in zip(digits.x_train, digits.y_train)}
    assert all(rows[img.tobytes()] == label for img, label in zip(x, y))
    x_again, y_again = shifts.imbalance(digits.x_train, digits.y_train, seed=0)
    np.testing.assert_array_equal(x_again, x)
    assert not np.array_equal(shifts.imbalance(digits.x_train, digits.y_train, seed=1)[0], x)
    # with a milder rate, consecutive counts keep the ratio exp(rate) up to the floor
    _, y = shifts.imbalance(digits.x_train, digits.y_train, rate=0.1)
    counts = np.bincount(y)
    np.testing.assert_array_equal(counts, np.floor(n_min * np.exp(0.1 * (np.arange(10) - 9))).astype(int))
    with pytest.raises(ValueError, match=r"classes \[3\] have no rows"):
        shifts.imbalance(digits.x_train, np.where(digits.y_train == 3, 2, digits.y_train), num_classes=10)


def test_noisy_label_rate():
    """Tolerance: 4.5 binomial standard deviations (a false alarm about once in 150,000 runs)."""
    n, C = 20000, 10
    y = np.zeros(n, np.int64)
    for rate in (0.1, 0.5):
        noisy = shifts.noisy_labels(y, rate, num_classes=C, seed=11)
        k = round(rate * n)
        # k positions redrawn uniformly: each class c != 0 gets Binomial(k, 1/C) of them
        counts = np.bincount(noisy, minlength=C)
        sd = math.sqrt(k * (1 / C) * (1 - 1 / C))
        assert np.all(np.abs(counts[1:] - k / C) < 4.5 * sd), counts
        changed = np.mean(noisy != y)
        assert abs(changed - rate * (1 - 1 / C)) < 4.5 * math.sqrt(k * 0.1 * 0.9) / n
        assert counts[0] >= n - k  # only the k drawn positions can change
    np.testing.assert_array_equal(shifts.noisy_labels(y, 0.5, C, seed=11), shifts.noisy_labels(y, 0.5, C, seed=11))
    np.testing.assert_array_equal(shifts.noisy_labels(np.arange(50) % C, 0.0, seed=3), np.arange(50) % C)
    x, y2 = shifts.shift_train_set("noisy-labels", np.zeros((n, 2, 2, 1)), y, seed=11, num_classes=C)
    assert abs(np.mean(y2 != 0) - 0.5 * 0.9) < 0.02  # the default rate is the paper's 50%
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="rate must be in"):
            shifts.noisy_labels(y, bad, C)
    with pytest.raises(ValueError, match="num_classes=3 does not cover labels up to 5"):
        shifts.noisy_labels(np.array([0, 5]), 0.5, num_classes=3)
    with pytest.raises(ValueError, match="x has 3 rows but y has 2 labels"):
        shifts.remove_classes(np.zeros((3, 2, 2, 1)), np.array([0, 1]))
