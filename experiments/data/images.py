"""Image classification sets: scikit-learn's bundled digits (no download) and, through the registry, MNIST,
Fashion-MNIST, KMNIST, EMNIST-letters, CIFAR-10 and SVHN.

``load_images(name, dtype=np.float32) -> ImageData(name, x_train, y_train, x_test, y_test, num_classes)`` for
every name in `IMAGE_NAMES`: images ``(n, H, W, C)`` in [0, 1] (raw intensities divided by their maximum, 16
for digits and 255 for the others), labels int64 in ``0..num_classes-1``. ``available_image_sets()`` lists
the names that load without a download (digits always; the others when their files are in
``$SMNNGP_DATA_DIR`` or the cache), so that an experiment can use a paper data set whenever it is present.

=================  ==========  ============  =======  ==================================================
name               train       test          shape    files (SHA-256 in sha256sums.txt)
=================  ==========  ============  =======  ==================================================
``digits``         1,347       450           8x8x1    bundled with scikit-learn (UCI optical digits)
``mnist``          60,000      10,000        28x28x1  IDX, gzip: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``
``fashion-mnist``  60,000      10,000        28x28x1  same layout as MNIST
``kmnist``         60,000      10,000        28x28x1  same layout as MNIST
``emnist-letters`` EMNIST's    EMNIST's      28x28x1  NIST's ``gzip.zip`` (562 MB, cached whole): its
                   letters     letters                ``emnist-letters-*`` IDX members
``cifar10``        50,000      10,000        32x32x3  ``cifar-10-python.tar.gz`` (170 MB)
``svhn``           73,257      26,032        32x32x3  ``train_32x32.mat``, ``test_32x32.mat`` (SVHN format 2)
=================  ==========  ============  =======  ==================================================

Conventions, where the sources differ from one another:

* **digits** has no published split. It is split once, stratified by class, into 1,347 training and 450
  test images by `stratified_split` with ``n_test=450, seed=0`` (each class gives its share of the 450 by
  largest remainders, drawn with ``np.random.default_rng(0)``); both parts keep the original row order.
* **EMNIST-letters** labels are 1..26 in the files; here they are 0..25 (a = 0), ``num_classes=26``. The
  EMNIST images are stored transposed relative to MNIST; they are transposed back so that letters stand
  upright (a swap of the two image axes).
* **SVHN** labels digit 0 as 10 in the ``.mat`` files; here it is 0. The ``extra`` split is not registered.
* **MNIST** is fetched from the CVDF mirror that TensorFlow Datasets uses (the same bytes as LeCun's site).

``load(name)`` (the registry's generic loader) returns the uint8 arrays instead: `CIFAR10` for ``cifar10``
(unchanged), `RawImages` for the other registered sets.
"""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from experiments.data.registry import (
    DataError,
    Dataset,
    data_file,
    fetch_file,
    is_available,
    load,
    register,
    single_file_dataset,
)

IMAGE_NAMES: tuple[str, ...] = ("digits", "mnist", "fashion-mnist", "kmnist", "emnist-letters", "cifar10", "svhn")
NUM_CLASSES: MappingProxyType[str, int] = MappingProxyType(
    {"digits": 10, "mnist": 10, "fashion-mnist": 10, "kmnist": 10, "emnist-letters": 26, "cifar10": 10, "svhn": 10}
)
DIGITS_TEST_SIZE = 450
DIGITS_SPLIT_SEED = 0


class ImageData(NamedTuple):
    """An image classification set: ``x_*`` float ``(n, H, W, C)`` in [0, 1], ``y_*`` int64 in
    ``0..num_classes-1``."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int


class RawImages(NamedTuple):
    """The images of a registered set as stored: ``uint8`` ``(n, H, W, C)``, labels ``int64``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


class CIFAR10(NamedTuple):
    """CIFAR-10 (Krizhevsky 2009): 50,000 training and 10,000 test 32 x 32 colour images, ``uint8`` of shape
    ``(n, 32, 32, 3)`` (NHWC), labels ``int64`` in 0..9."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _parse_cifar10(path: Path) -> CIFAR10:
    """The python-version archive: five training batches and one test batch, each a pickled dict with
    ``data`` (10,000 x 3,072 uint8, channel-major rows) and ``labels``. (Unpickling is safe here: the archive's
    SHA-256 was verified before parsing.)"""
    import pickle
    import tarfile

    def batch(tar, name):
        member = f"cifar-10-batches-py/{name}"
        try:
            fh = tar.extractfile(member)
        except KeyError:
            raise DataError(f"{path}: member {member} missing from the CIFAR-10 archive") from None
        try:
            d = pickle.load(fh, encoding="bytes")
            x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            labels = np.asarray(d[b"labels"], np.int64)
        except (EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as err:
            raise DataError(f"{path}: member {member} of the CIFAR-10 archive is malformed ({err!r})") from err
        if len(labels) != len(x):
            raise DataError(f"{path}: member {member} has {len(x)} images but {len(labels)} labels")
        return x, labels

    with tarfile.open(path, "r:gz") as tar:
        parts = [batch(tar, f"data_batch_{i}") for i in range(1, 6)]
        x_test, y_test = batch(tar, "test_batch")
    return CIFAR10(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_test, y_test)


# --------------------------------------------------------------------------------------------------------------
# IDX (MNIST family, EMNIST)

# IDX type codes (LeCun's format description): the third magic byte; data are big-endian.
_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(raw: bytes, origin: str = "IDX data") -> np.ndarray:
    """One IDX file's bytes -> array of its declared shape and type (native byte order).

    Layout: two zero bytes, a type code, the number of dimensions ``k``, ``k`` big-endian int32 sizes, then
    the values in C order. A wrong magic, an unknown type or a size that disagrees with the header raises
    `DataError` naming ``origin``.
    """
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{origin}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'})")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_TYPES:
        raise DataError(f"{origin}: unknown IDX type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{origin}: truncated IDX header ({len(raw)} bytes for {ndim} dimensions)")
    shape = tuple(int(s) for s in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    dtype = _IDX_TYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{origin}: IDX header declares shape {shape} ({expected} bytes), found {len(raw) - header}")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _parse_idx_gz(path: Path) -> np.ndarray:
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: not a readable gzip file ({err})") from err
    return parse_idx(raw, str(path))


def _images_and_labels(images: np.ndarray, labels: np.ndarray, origin: str) -> tuple[np.ndarray, np.ndarray]:
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"{origin}: expected uint8 images of shape (n, H, W), got {images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise DataError(f"{origin}: {images.shape[0]} images but labels of shape {labels.shape}")
    return images[..., None], labels.astype(np.int64)


def _load_idx_set(ds: Dataset) -> RawImages:
    """MNIST layout: ``{train,t10k}-images-idx3-ubyte.gz`` and ``{train,t10k}-labels-idx1-ubyte.gz``."""

    def part(prefix):
        images, labels = (ds.files[f"{prefix}-{kind}-ubyte.gz"] for kind in ("images-idx3", "labels-idx1"))
        return _images_and_labels(
            images.parser(fetch_file(images)), labels.parser(fetch_file(labels)), f"{ds.name} {prefix}"
        )

    return RawImages(*part("train"), *part("t10k"))


def _parse_emnist_letters(path: Path) -> RawImages:
    """The ``emnist-letters-{train,test}-{images-idx3,labels-idx1}-ubyte.gz`` members of NIST's gzip.zip.

    Labels 1..26 become 0..25; each image is transposed (EMNIST stores them column-major)."""
    try:
        with zipfile.ZipFile(path) as zf:
            by_name = {PurePosixPath(n).name: n for n in zf.namelist()}

            def member(name):
                if name not in by_name:
                    raise DataError(f"{path}: member {name} missing from the EMNIST archive")
                with zf.open(by_name[name]) as fh:
                    try:
                        raw = gzip.decompress(fh.read())
                    except (OSError, EOFError) as err:
                        raise DataError(f"{path}: member {name} is not valid gzip ({err})") from err
                return parse_idx(raw, f"{path}:{name}")

            parts = []
            for split in ("train", "test"):
                images = member(f"emnist-letters-{split}-images-idx3-ubyte.gz")
                labels = member(f"emnist-letters-{split}-labels-idx1-ubyte.gz")
                x, y = _images_and_labels(images, labels, f"{path} letters {split}")
                if y.size and (y.min() < 1 or y.max() > 26):
                    raise DataError(f"{path}: EMNIST letters {split} labels outside 1..26 ({y.min()}..{y.max()})")
                parts += [np.ascontiguousarray(x.transpose(0, 2, 1, 3)), y - 1]
    except zipfile.BadZipFile as err:
        raise DataError(f"{path}: not a valid zip archive ({err})") from err
    return RawImages(*parts)


# --------------------------------------------------------------------------------------------------------------
# SVHN


def _parse_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN format-2 ``.mat``: ``X`` uint8 (32, 32, 3, n), ``y`` (n, 1) in 1..10 (10 is the digit 0)
    -> images (n, 32, 32, 3), labels int64 0..9."""
    import scipy.io

    try:
        mat = scipy.io.loadmat(path)
    except (ValueError, OSError, TypeError) as err:
        raise DataError(f"{path}: not a readable MATLAB file ({err})") from err
    if "X" not in mat or "y" not in mat:
        raise DataError(f"{path}: expected variables X and y, found {sorted(k for k in mat if not k.startswith('__'))}")
    X, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if X.ndim != 4 or X.shape[2] != 3 or X.shape[3] != y.size:
        raise DataError(f"{path}: X has shape {X.shape}, expected (H, W, 3, n) with n = {y.size} labels")
    if y.size and (y.min() < 1 or y.max() > 10 or np.any(y != np.round(y))):
        raise DataError(f"{path}: labels outside 1..10")
    return np.ascontiguousarray(X.transpose(3, 0, 1, 2).astype(np.uint8)), y.astype(np.int64) % 10


_SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")


def _load_svhn(ds: Dataset) -> RawImages:
    train, test = (ds.files[n] for n in _SVHN_FILES)
    return RawImages(*train.parser(fetch_file(train)), *test.parser(fetch_file(test)))


# --------------------------------------------------------------------------------------------------------------
# digits, the uniform loader


def stratified_split(labels, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices, sorted int64, with ``n_test`` test rows shared among the classes in proportion
    to their counts (largest remainders, ties to the smaller class label); within each class the test rows are
    the first of ``rng.permutation`` of its indices, ``rng = np.random.default_rng(seed)``, classes in
    ascending order."""
    labels = np.asarray(labels).reshape(-1)
    if not 0 <= n_test <= labels.size:
        raise ValueError(f"stratified_split: n_test must be in 0..{labels.size}, got {n_test}")
    classes, counts = np.unique(labels, return_counts=True)
    quota = n_test * counts / labels.size
    take = np.floor(quota).astype(np.int64)
    short = n_test - int(take.sum())
    take[np.argsort(-(quota - take), kind="stable")[:short]] += 1
    rng = np.random.default_rng(seed)
    test = [np.flatnonzero(labels == c)[rng.permutation(n)[:k]] for c, n, k in zip(classes, counts, take)]
    test = np.sort(np.concatenate(test)).astype(np.int64)
    return np.setdiff1d(np.arange(labels.size), test).astype(np.int64), test


def _digits(dtype) -> ImageData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(dtype)[..., None]
    y = bunch.target.astype(np.int64)
    train, test = stratified_split(y, DIGITS_TEST_SIZE, DIGITS_SPLIT_SEED)
    return ImageData("digits", x[train], y[train], x[test], y[test], 10)


def load_images(name: str, dtype=np.float32) -> ImageData:
    """Image set ``name`` (one of `IMAGE_NAMES`) with its train/test split, pixels in [0, 1] as ``dtype``.

    Every set but ``digits`` goes through the registry (``$SMNNGP_DATA_DIR``, the cache, or a verified
    download); see the module docstring for the splits and label conventions."""
    if name not in IMAGE_NAMES:
        raise ValueError(f"unknown image set {name!r}; known image sets: {', '.join(IMAGE_NAMES)}")
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"load_images: dtype must be a floating type, got {dtype}")
    if name == "digits":
        return _digits(dtype)
    raw = load(name)
    num_classes = NUM_CLASSES[name]
    for part, labels in (("train", raw.y_train), ("test", raw.y_test)):
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise DataError(f"{name}: {part} labels outside 0..{num_classes - 1}")
    scale = dtype.type(1.0 / 255.0)
    return ImageData(
        name,
        raw.x_train.astype(dtype) * scale,
        np.asarray(raw.y_train, np.int64),
        raw.x_test.astype(dtype) * scale,
        np.asarray(raw.y_test, np.int64),
        num_classes,
    )


def available_image_sets() -> tuple[str, ...]:
    """The names in `IMAGE_NAMES` that `load_images` serves without downloading anything."""
    return tuple(n for n in IMAGE_NAMES if n == "digits" or is_available(n))


# --------------------------------------------------------------------------------------------------------------
# registration

_IDX_FILES = tuple(f"{split}-{kind}-ubyte.gz" for split in ("train", "t10k") for kind in ("images-idx3", "labels-idx1"))


def _idx_dataset(name: str, folder: str, source: str, description: str) -> Dataset:
    files = {fn: data_file(f"{folder}/{fn}", source, fn, _parse_idx_gz) for fn in _IDX_FILES}
    return Dataset(name, description, MappingProxyType(files), _load_idx_set)


register(
    _idx_dataset("mnist", "mnist", "mnist", "MNIST (LeCun et al. 1998): 60,000 train / 10,000 test 28 x 28 digits"),
    _idx_dataset(
        "fashion-mnist",
        "fashion_mnist",
        "fashion_mnist",
        "Fashion-MNIST (Xiao et al. 2017): 60,000 train / 10,000 test 28 x 28 clothing images, 10 classes",
    ),
    _idx_dataset(
        "kmnist",
        "kmnist",
        "kmnist",
        "Kuzushiji-MNIST (Clanuwat et al. 2018): 60,000 train / 10,000 test 28 x 28 cursive kana, 10 classes",
    ),
    single_file_dataset(
        "emnist-letters",
        "EMNIST letters (Cohen et al. 2017), 26 classes, from NIST's gzip.zip of all EMNIST splits (562 MB)",
        data_file("emnist/gzip.zip", "emnist", "gzip.zip", _parse_emnist_letters),
    ),
    single_file_dataset(
        "cifar10",
        "CIFAR-10, python version (Krizhevsky 2009): 50,000 train / 10,000 test 32 x 32 images, 10 classes",
        data_file("cifar10/cifar-10-python.tar.gz", "cifar", "cifar-10-python.tar.gz", _parse_cifar10),
    ),
    Dataset(
        "svhn",
        "SVHN cropped digits (Netzer et al. 2011): 73,257 train / 26,032 test 32 x 32 images, 10 classes",
        MappingProxyType({fn: data_file(f"svhn/{fn}", "svhn", fn, _parse_svhn) for fn in _SVHN_FILES}),
        _load_svhn,
    ),
)
