"""UCI regression sets with the standard splits of Hernandez-Lobato & Adams (2015), as published with
Gal & Ghahramani (2016), the split protocols, and the `Standardizer`.

``UCI_NAMES``: the 9 sets; ``PAPER_UCI``: the 8 used in the scale-mixture paper's table (all but protein).

``load_uci(name) -> UCIData(name, X, y, splits)``: ``X`` float64 (n, d), ``y`` float64 (n,), ``splits`` the
public ``[(train_idx, test_idx), ...]`` (0-based row indices; 20 splits, protein 5). Only the index files
that ``n_splits.txt`` asks for are fetched. The files of each set are those the checksum table lists under
``uci/<folder>/``.

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

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from experiments.data.registry import DataError, Dataset, checksums, data_file, fetch_file, load, register


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


def minmax_split(data: UCIData, split: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` of public split ``split``: inputs min-max scaled to [0, 1] on the
    training rows (a constant feature is left unscaled), targets in their original units (the masked-BNN paper's
    preprocessing)."""
    train, test = data.splits[split]
    X, y = np.asarray(data.X, float), np.asarray(data.y, float).reshape(-1)
    lo, hi = X[train].min(0), X[train].max(0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return (X[train] - lo) / span, y[train], (X[test] - lo) / span, y[test]


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


def _uci_datasets() -> list[Dataset]:
    sets = []
    for name, folder in UCI_FOLDERS.items():
        prefix = f"uci/{folder}/"
        names = sorted(path[len(prefix) :] for path in checksums() if path.startswith(prefix))
        files = {
            filename: data_file(prefix + filename, "uci", f"{folder}/data/{filename}", _uci_parser(filename))
            for filename in names
        }
        sets.append(Dataset(name, f"UCI {folder} with the standard splits", MappingProxyType(files), _load_uci_dataset))
    return sets


register(*_uci_datasets())
