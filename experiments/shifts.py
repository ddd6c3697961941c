"""Data-set shifts for the classification experiments (scale-mixture paper Sec. 4.4-4.5; notes Sec. 3.4-3.5).

Image shifts corrupt a test image array in the manner of MNIST-C (Mu & Gilmer 2019) and CIFAR-10-C
(Hendrycks & Dietterich 2019), written here with numpy/scipy.ndimage; the parameters are this project's,
not a copy of either benchmark's. Every image shift

* takes ``x`` of shape ``(N, H, W, C)`` with values in [0, 1] (any float dtype; the result has the same
  shape and dtype, and stays in [0, 1]),
* takes a severity 1..5, and is deterministic given ``seed`` (one `numpy.random.Generator` per call),
* draws its random pattern independently of the severity (the same seed gives the same noise field, flake
  positions, line shapes at every severity) so that the damage grows with the severity for the same draw,
* scales its spatial sizes with the image: lengths below are in pixels of a 28-pixel image (MNIST) and are
  multiplied by ``min(H, W) / 28``.

=================  ===============================================================================
``shot-noise``     Poisson photon noise: ``Poisson(lam * x) / lam``, ``lam`` = 60, 25, 12, 5, 3.
``impulse-noise``  salt and pepper: each value independently becomes 0 or 1 (equally likely) with
                   probability 0.03, 0.06, 0.09, 0.17, 0.27.
``glass-blur``     Gaussian blur (sigma 0.4 .. 1.2 px), then ``iterations`` (1, 2, 2, 3, 3) rounds in
                   which every pixel is read, by bilinear interpolation, at an offset drawn uniformly from
                   ``[-delta, delta]^2`` with ``delta`` = 1, 1, 2, 2, 3 px (a local resampling, where MNIST-C
                   swaps pixel pairs; sub-pixel offsets keep it gradual on 8-pixel images), then the blur
                   again.
``occlusion``      one grey (0.5) square per image, side 0.15, 0.3, 0.45, 0.6, 0.75 of the shorter image
                   side (rounded; at least 1 px), uniformly placed inside the image.
``zigzag``         1..5 white zigzag lines, 1 px wide, each through a random point at a random angle with
                   random amplitude (0.08..0.15 of the side) and period (0.2..0.35 of the side); the
                   point lies in the central half of the image, so every line crosses it.
``fog``            a smooth random haze ``F`` in [0, 1] (two octaves of Gaussian-filtered white noise):
                   ``(x + a F) / (1 + a)``, ``a`` = 0.25, 0.5, 0.75, 1, 1.5.
``snow``           whitening ``(1 - w) x + w max(x, 1.5 g + 0.5)`` with ``g`` the grey level, ``w`` = 0.1
                   .. 0.3, plus flakes: a Bernoulli(0.03 .. 0.12) pattern of brightness U(0.6, 1) smeared
                   into streaks of 2..6 px along one of four directions per image (added, then clipped).
=================  ===============================================================================

Training-set shifts (the paper's Table 3 variants; tested on the original test set):

* ``remove_classes(x, y, classes=OOD_CLASSES)`` -- out of distribution: classes {1, 4, 8} removed from the
  training set (the authors' choice, notes Sec. 3.4).
* ``imbalance(x, y, rate=0.5, ...)`` -- class ``c`` keeps ``n_c = max(1, floor(n_min exp(rate (c - C + 1))))``
  images, ``n_min`` being the smallest original class count: counts proportional to ``exp(0.5 c)``, the
  largest class keeping the smallest class's original count (notes Sec. 3.5).
* ``noisy_labels(y, rate, ...)`` -- ``round(rate N)`` positions drawn without replacement get a label drawn
  uniformly from all ``C`` classes, so the new label may equal the old (the paper's wording); the expected
  fraction of changed labels is ``rate (1 - 1/C)``. The paper says 50%, the authors' code uses 0.1.

``IMAGE_SHIFTS`` maps each image shift's name to its function ``f(x, severity, rng)``; ``apply_shift(name, x,
severity, seed)`` validates and applies one. ``TRAIN_SHIFTS`` names the training-set shifts, applied by
``shift_train_set(name, x, y, seed, ...)``; ``SHIFTS`` lists every name.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
from scipy import ndimage

__all__ = [
    "IMAGE_SHIFTS",
    "NOISY_LABEL_RATE",
    "OOD_CLASSES",
    "SEVERITIES",
    "SHIFTS",
    "TRAIN_SHIFTS",
    "apply_shift",
    "fog",
    "glass_blur",
    "imbalance",
    "impulse_noise",
    "noisy_labels",
    "occlusion",
    "remove_classes",
    "shift_train_set",
    "shot_noise",
    "snow",
    "zigzag",
]

SEVERITIES = (1, 2, 3, 4, 5)
OOD_CLASSES = (1, 4, 8)
IMBALANCE_RATE = 0.5
NOISY_LABEL_RATE = 0.5
REFERENCE_SIDE = 28  # spatial parameters are given for a 28-pixel image

SHOT_LAMBDA = (60.0, 25.0, 12.0, 5.0, 3.0)
IMPULSE_AMOUNT = (0.03, 0.06, 0.09, 0.17, 0.27)
GLASS = ((0.4, 1, 1), (0.6, 1, 2), (0.8, 2, 2), (1.0, 2, 3), (1.2, 3, 3))  # (sigma, delta, iterations)
OCCLUSION_SIDE = (0.15, 0.3, 0.45, 0.6, 0.75)
OCCLUSION_FILL = 0.5
ZIGZAG_LINES = (1, 2, 3, 4, 5)
FOG_STRENGTH = (0.25, 0.5, 0.75, 1.0, 1.5)
SNOW = ((0.03, 2, 0.1), (0.05, 3, 0.15), (0.07, 4, 0.2), (0.09, 5, 0.25), (0.12, 6, 0.3))  # density, length, w


def _scale(x: np.ndarray) -> float:
    return min(x.shape[1], x.shape[2]) / REFERENCE_SIDE


def _spatial_filter(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian filter over the two image axes only (none across images or channels)."""
    return ndimage.gaussian_filter(x, sigma=(0.0, sigma, sigma, 0.0), mode="nearest")


def _shifted(a: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``a`` (N, H, W) moved by (dy, dx) pixels, zero-filled (no wrap-around)."""
    out = np.zeros_like(a)
    H, W = a.shape[1:3]
    if abs(dy) >= H or abs(dx) >= W:
        return out
    ys, yd = (slice(0, H - dy), slice(dy, H)) if dy >= 0 else (slice(-dy, H), slice(0, H + dy))
    xs, xd = (slice(0, W - dx), slice(dx, W)) if dx >= 0 else (slice(-dx, W), slice(0, W + dx))
    out[:, yd, xd] = a[:, ys, xs]
    return out


# --------------------------------------------------------------------------------------------------------------
# image shifts: f(x float64 (N, H, W, C) in [0, 1], severity 1..5, rng) -> float64, clipped by apply_shift


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    lam = SHOT_LAMBDA[severity - 1]
    return rng.poisson(x * lam) / lam


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    amount = IMPULSE_AMOUNT[severity - 1]
    u = rng.random(x.shape)
    # The same draw at every severity: the hit set grows with `amount`, half salt and half pepper.
    return np.where(u < amount / 2, 1.0, np.where(u < amount, 0.0, x))


def _resample(x: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """``x`` (N, H, W, C) read at (row + dy, col + dx) by bilinear interpolation, coordinates clamped to the
    image (so sub-pixel displacements of small images stay meaningful)."""
    N, H, W = x.shape[:3]
    r = np.clip(np.arange(H)[None, :, None] + dy, 0, H - 1)
    c = np.clip(np.arange(W)[None, None, :] + dx, 0, W - 1)
    r0 = np.clip(np.floor(r).astype(np.int64), 0, max(H - 2, 0))
    c0 = np.clip(np.floor(c).astype(np.int64), 0, max(W - 2, 0))
    r1, c1 = np.minimum(r0 + 1, H - 1), np.minimum(c0 + 1, W - 1)
    fr, fc = (r - r0)[..., None], (c - c0)[..., None]
    n = np.arange(N)[:, None, None]
    top = x[n, r0, c0] * (1 - fc) + x[n, r0, c1] * fc
    bottom = x[n, r1, c0] * (1 - fc) + x[n, r1, c1] * fc
    return top * (1 - fr) + bottom * fr


def glass_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    sigma, delta, iterations = GLASS[severity - 1]
    s = _scale(x)
    N, H, W = x.shape[:3]
    out = _spatial_filter(x, sigma * s)
    # One draw of unit offsets for the most iterations, scaled by this severity's radius: a lower severity's
    # displacements are a prefix, and a shrunken copy, of a higher one's.
    u = rng.uniform(-1.0, 1.0, (GLASS[-1][2], 2, N, H, W))
    for it in range(iterations):
        out = _resample(out, u[it, 0] * delta * s, u[it, 1] * delta * s)
    return _spatial_filter(out, sigma * s)


def occlusion(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    N, H, W = x.shape[:3]
    side = max(1, round(OCCLUSION_SIDE[severity - 1] * min(H, W)))
    u = rng.random((N, 2))
    top = np.floor(u[:, 0] * (H - side + 1)).astype(np.int64)
    left = np.floor(u[:, 1] * (W - side + 1)).astype(np.int64)
    rows, cols = np.arange(H)[None, :, None], np.arange(W)[None, None, :]
    inside = ((rows >= top[:, None, None]) & (rows < top[:, None, None] + side)) & (
        (cols >= left[:, None, None]) & (cols < left[:, None, None] + side)
    )
    return np.where(inside[..., None], OCCLUSION_FILL, x)


def zigzag(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    N, H, W = x.shape[:3]
    side = min(H, W)
    K = ZIGZAG_LINES[-1]
    # All five lines are drawn at every severity; severity s keeps the first s of them.
    centre = (0.25 + 0.5 * rng.random((N, K, 2))) * np.array([H - 1, W - 1])  # central half: lines cross
    angle = rng.random((N, K)) * math.pi
    amplitude = rng.uniform(0.08, 0.15, (N, K)) * side
    period = rng.uniform(0.2, 0.35, (N, K)) * side
    lines = ZIGZAG_LINES[severity - 1]
    half = 0.5 * math.hypot(H, W) + 0.15 * side
    # Sample the curve finely enough that consecutive points are under half a pixel apart along it.
    steepest = 1.0 + 4.0 * 0.15 / 0.2
    t = np.arange(-half, half, 0.5 / steepest)
    mask = np.zeros((N, H, W), bool)
    for start in range(0, N, 1024):  # bounds the (images, lines, points) temporaries
        sl = slice(start, start + 1024)
        c, a, amp, per = centre[sl, :lines], angle[sl, :lines], amplitude[sl, :lines], period[sl, :lines]
        phase = t[None, None, :] / per[..., None]
        offset = amp[..., None] * (4.0 * np.abs(phase - np.floor(phase + 0.5)) - 1.0)  # triangle wave in [-a, a]
        sin, cos = np.sin(a)[..., None], np.cos(a)[..., None]
        yy = np.rint(c[..., 0:1] + t * sin + offset * cos).astype(np.int64)
        xx = np.rint(c[..., 1:2] + t * cos - offset * sin).astype(np.int64)
        ok = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
        img = np.broadcast_to(np.arange(start, start + c.shape[0])[:, None, None], yy.shape)
        mask[img[ok], yy[ok], xx[ok]] = True
    return np.where(mask[..., None], 1.0, x)


def fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    N, H, W = x.shape[:3]
    side = min(H, W)
    noise = rng.standard_normal((2, N, H, W))
    field = ndimage.gaussian_filter(noise[0], (0, side / 4, side / 4), mode="wrap")
    field += 0.5 * ndimage.gaussian_filter(noise[1], (0, side / 8, side / 8), mode="wrap")
    lo = field.min(axis=(1, 2), keepdims=True)
    span = np.maximum(field.max(axis=(1, 2), keepdims=True) - lo, 1e-12)
    haze = ((field - lo) / span)[..., None]
    a = FOG_STRENGTH[severity - 1]
    return (x + a * haze) / (1.0 + a)


_STREAK_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def snow(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    N = x.shape[0]
    density, length, w = SNOW[severity - 1]
    length = max(1, round(length * _scale(x)))
    u = rng.random((N,) + x.shape[1:3])
    brightness = rng.uniform(0.6, 1.0, u.shape)
    direction = rng.integers(0, len(_STREAK_DIRECTIONS), N)
    flakes = np.where(u < density, brightness, 0.0)
    streaks = np.zeros_like(flakes)
    for d, (dy, dx) in enumerate(_STREAK_DIRECTIONS):
        pick = direction == d
        if pick.any():
            # A streak is the flake dilated along its direction (a max, so it keeps the flake's brightness).
            streaks[pick] = np.max([_shifted(flakes[pick], k * dy, k * dx) for k in range(length)], axis=0)
    grey = x.mean(axis=-1, keepdims=True)
    whitened = (1.0 - w) * x + w * np.maximum(x, 1.5 * grey + 0.5)
    return whitened + streaks[..., None]


IMAGE_SHIFTS: Mapping[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = MappingProxyType(
    {
        "shot-noise": shot_noise,
        "impulse-noise": impulse_noise,
        "glass-blur": glass_blur,
        "occlusion": occlusion,
        "zigzag": zigzag,
        "fog": fog,
        "snow": snow,
    }
)
TRAIN_SHIFTS: tuple[str, ...] = ("ood", "imbalance", "noisy-labels")
SHIFTS: tuple[str, ...] = tuple(IMAGE_SHIFTS) + TRAIN_SHIFTS


def _severity(severity) -> int:
    try:
        s = operator.index(severity)
    except TypeError:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}") from None
    if s not in SEVERITIES:
        raise ValueError(f"severity must be an integer in 1..5, got {s}")
    return s


def _images(x, who: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"{who}: x must be an image array of shape (N, H, W, C), got shape {x.shape}")
    if x.dtype.kind != "f":
        raise ValueError(f"{who}: x must be floating point with values in [0, 1], got dtype {x.dtype}")
    if x.size and not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise ValueError(f"{who}: x must have values in [0, 1], got range [{np.nanmin(x)}, {np.nanmax(x)}]")
    return x


def apply_shift(name: str, x, severity: int, seed: int = 0) -> np.ndarray:
    """Image shift ``name`` (a key of `IMAGE_SHIFTS`) at ``severity`` (1..5) applied to ``x`` (N, H, W, C) in
    [0, 1]; deterministic given ``seed``. Returns a new array of ``x``'s shape and dtype, in [0, 1]."""
    if name not in IMAGE_SHIFTS:
        if name in TRAIN_SHIFTS:
            raise ValueError(f"shift {name!r} changes the training set, not images: use shift_train_set")
        raise ValueError(f"unknown shift {name!r}; image shifts: {', '.join(IMAGE_SHIFTS)}")
    severity = _severity(severity)
    x = _images(x, f"apply_shift({name!r})")
    rng = np.random.default_rng(seed)
    out = IMAGE_SHIFTS[name](x.astype(np.float64), severity, rng)
    return np.clip(out, 0.0, 1.0).astype(x.dtype)


# --------------------------------------------------------------------------------------------------------------
# training-set shifts


def _labels(y, n: int | None, who: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ValueError(f"{who}: y must be a 1-d integer label array, got {y.dtype} of shape {y.shape}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{who}: x has {n} rows but y has {y.shape[0]} labels")
    if y.size and y.min() < 0:
        raise ValueError(f"{who}: labels must be >= 0, got {y.min()}")
    return y


def _num_classes(y: np.ndarray, num_classes: int | None, who: str) -> int:
    C = int(y.max()) + 1 if num_classes is None else operator.index(num_classes)
    if C < 1 or (y.size and y.max() >= C):
        raise ValueError(f"{who}: num_classes={C} does not cover labels up to {y.max() if y.size else None}")
    return C


def remove_classes(x, y, classes=OOD_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` without the rows whose label is in ``classes`` (order kept)."""
    x = np.asarray(x)
    y = _labels(y, x.shape[0], "remove_classes")
    keep = ~np.isin(y, np.asarray(classes, dtype=np.int64))
    return x[keep], y[keep]


def imbalance(x, y, rate: float = IMBALANCE_RATE, num_classes: int | None = None, seed: int = 0):
    """``(x, y)`` subsampled so that class ``c`` keeps ``max(1, floor(n_min exp(rate (c - C + 1))))`` rows (see
    the module docstring); which rows are kept is drawn with ``np.random.default_rng(seed)``; order kept."""
    x = np.asarray(x)
    y = _labels(y, x.shape[0], "imbalance")
    C = _num_classes(y, num_classes, "imbalance")
    counts = np.bincount(y, minlength=C)
    if counts.min() == 0:
        raise ValueError(f"imbalance: classes {np.flatnonzero(counts == 0).tolist()} have no rows")
    if not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"imbalance: rate must be finite and >= 0, got {rate}")
    target = np.maximum(1, np.floor(counts.min() * np.exp(rate * (np.arange(C) - (C - 1))))).astype(np.int64)
    rng = np.random.default_rng(seed)
    keep = np.concatenate([rng.permutation(np.flatnonzero(y == c))[: target[c]] for c in range(C)])
    keep.sort()
    return x[keep], y[keep]


def noisy_labels(y, rate: float, num_classes: int | None = None, seed: int = 0) -> np.ndarray:
    """A copy of ``y`` in which ``round(rate * N)`` positions (drawn without replacement) get a label drawn
    uniformly from ``0..num_classes-1`` (possibly the old one); int64."""
    y = _labels(y, None, "noisy_labels")
    C = _num_classes(y, num_classes, "noisy_labels")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"noisy_labels: rate must be in [0, 1], got {rate}")
    rng = np.random.default_rng(seed)
    out = y.astype(np.int64)
    k = int(round(rate * y.size))
    where = rng.choice(y.size, size=k, replace=False)
    out[where] = rng.integers(0, C, size=k)
    return out


def shift_train_set(
    name: str,
    x,
    y,
    seed: int = 0,
    num_classes: int | None = None,
    noise_rate: float = NOISY_LABEL_RATE,
    classes=OOD_CLASSES,
) -> tuple[np.ndarray, np.ndarray]:
    """Training-set shift ``name`` (one of `TRAIN_SHIFTS`) applied to ``(x, y)``: ``"ood"`` removes
    ``classes``, ``"imbalance"`` subsamples at rate 0.5, ``"noisy-labels"`` corrupts ``noise_rate`` of the
    labels. Returns the new ``(x, y)``."""
    if name == "ood":
        return remove_classes(x, y, classes)
    if name == "imbalance":
        return imbalance(x, y, IMBALANCE_RATE, num_classes, seed)
    if name == "noisy-labels":
        x = np.asarray(x)
        _labels(y, x.shape[0], "shift_train_set")
        return x, noisy_labels(y, noise_rate, num_classes, seed)
    if name in IMAGE_SHIFTS:
        raise ValueError(f"shift {name!r} corrupts images: use apply_shift on the test images")
    raise ValueError(f"unknown training-set shift {name!r}; training-set shifts: {', '.join(TRAIN_SHIFTS)}")
