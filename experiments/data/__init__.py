"""The project's one data registry: named data sets, their files, checksums, download cache and loaders.

The package is the registry core plus one module per family; this module re-exports their public names, so
``from experiments.data import load_uci, fetch, ...`` is all a caller needs, and importing it registers every
data set (no command line involved).

* `experiments.data.registry` -- `DataFile`, `Dataset`, the checksum table ``sha256sums.txt`` (read with
  `importlib.resources`), lookup order ``$SMNNGP_DATA_DIR`` -> cache -> verified download, the errors and
  environment variables (documented there).
* `experiments.data.uci` -- the UCI regression sets, `load_uci`, `uci_split`, `Standardizer`.
* `experiments.data.timeseries` -- Cascaded Tanks, PM2.5 (Beijing, Guangzhou).
* `experiments.data.images` -- digits (bundled with scikit-learn), MNIST, Fashion-MNIST, KMNIST,
  EMNIST-letters, CIFAR-10, SVHN; `load_images`.

Registry API: ``DATASET_NAMES``, ``get_dataset(name) -> Dataset``, ``fetch(name, filename) -> Path`` (a
verified local path), ``read(name, filename)`` (one parsed file), ``load(name)`` (the whole set, as its family
builds it), ``is_available(name)`` (present locally, no download needed), ``available(name)`` (present or downloadable
now; False, not an error, when the download fails). ``python -m experiments.data
[NAME...]`` fetches and verifies every file of the named (default: all, several GB with the image sets) sets.
"""

from __future__ import annotations

from experiments.data import images, timeseries, uci  # noqa: F401  (importing a family registers its sets)
from experiments.data.images import (
    CIFAR10,
    DIGITS_SPLIT_SEED,
    DIGITS_TEST_SIZE,
    IMAGE_NAMES,
    ImageData,
    RawImages,
    _parse_cifar10,  # noqa: F401  (tests parse a hand-made archive with it)
    available_image_sets,
    load_images,
    parse_idx,
    stratified_split,
)
from experiments.data.registry import (
    BASE_URLS,
    CHECKSUM_FILE,
    DATASETS,
    DEFAULT_CACHE_DIR,
    ENV_CACHE_DIR,
    ENV_DATA_DIR,
    ENV_URL_PREFIX,
    ChecksumError,
    DataError,
    DataFile,
    Dataset,
    DownloadError,
    available,
    cache_dir,
    checksums,
    data_dir,
    fetch,
    fetch_file,
    get_dataset,
    is_available,
    load,
    main,
    read,
    sha256_file,
    source_url,
)
from experiments.data.timeseries import PM25_FEATURES, CascadedTanks, PM25Task, pm25_forecasting
from experiments.data.uci import (
    PAPER_PERMUTATION_SEED,
    PAPER_TEST_FRACTION,
    PAPER_UCI,
    UCI_FOLDERS,
    UCI_NAMES,
    UCI_PROTOCOLS,
    Standardizer,
    UCIData,
    load_uci,
    uci_split,
)

DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)

__all__ = [
    "BASE_URLS",
    "CHECKSUM_FILE",
    "DATASETS",
    "DATASET_NAMES",
    "DEFAULT_CACHE_DIR",
    "DIGITS_SPLIT_SEED",
    "DIGITS_TEST_SIZE",
    "ENV_CACHE_DIR",
    "ENV_DATA_DIR",
    "ENV_URL_PREFIX",
    "IMAGE_NAMES",
    "PM25_FEATURES",
    "PM25Task",
    "pm25_forecasting",
    "PAPER_PERMUTATION_SEED",
    "PAPER_TEST_FRACTION",
    "PAPER_UCI",
    "UCI_FOLDERS",
    "UCI_NAMES",
    "UCI_PROTOCOLS",
    "CIFAR10",
    "CascadedTanks",
    "ChecksumError",
    "DataError",
    "DataFile",
    "Dataset",
    "DownloadError",
    "ImageData",
    "RawImages",
    "Standardizer",
    "UCIData",
    "available",
    "available_image_sets",
    "cache_dir",
    "checksums",
    "data_dir",
    "fetch",
    "fetch_file",
    "get_dataset",
    "is_available",
    "load",
    "load_images",
    "load_uci",
    "main",
    "parse_idx",
    "read",
    "sha256_file",
    "source_url",
    "stratified_split",
    "uci_split",
]
