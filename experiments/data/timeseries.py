"""Time-series sets: the Cascaded Tanks system-identification benchmark and the PM2.5 air-quality records.

``load("cascaded-tanks") -> CascadedTanks`` (estimation and validation records); ``load("pm25-beijing")`` and
``load("pm25-guangzhou")`` -> a column table ``dict[str, np.ndarray]`` (numeric columns float64 with ``NA`` as
NaN, the others str). Each canonical source is a zip archive; only the registered member is verified and
cached (see `experiments.data.registry`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import NamedTuple

import numpy as np

from experiments.data.registry import DataError, data_file, register, single_file_dataset


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


register(
    single_file_dataset(
        "cascaded-tanks",
        "Cascaded Tanks benchmark (nonlinearbenchmark.org), estimation and validation records",
        data_file(
            "cascaded_tanks/dataBenchmark.csv",
            "cascaded_tanks",
            "3b697e42-01a4-4979-a370-813a456c36f5",  # CascadedTanksFiles.zip
            _parse_cascaded_tanks,
            member="CascadedTanksFiles/dataBenchmark.csv",
        ),
    ),
    single_file_dataset(
        "pm25-beijing",
        "Beijing PM2.5, hourly 2010-2014 (UCI 381)",
        data_file(
            "pm25/PRSA_data_2010.1.1-2014.12.31.csv",
            "pm25_beijing",
            "beijing+pm2+5+data.zip",
            _parse_csv_table,
            member="PRSA_data_2010.1.1-2014.12.31.csv",
        ),
    ),
    single_file_dataset(
        "pm25-guangzhou",
        "Guangzhou PM2.5, hourly 2010-2015 (UCI 394, five Chinese cities)",
        data_file(
            "pm25/GuangzhouPM20100101_20151231.csv",
            "pm25_cities",
            "pm2+5+data+of+five+chinese+cities.zip",
            _parse_csv_table,
            member="FiveCitiePMData/GuangzhouPM20100101_20151231.csv",
        ),
    ),
)
