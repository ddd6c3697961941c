"""Time-series sets: the Cascaded Tanks system-identification benchmark and the PM2.5 air-quality records.

``load("cascaded-tanks") -> CascadedTanks`` (estimation and validation records); ``load("pm25-beijing")`` and
``load("pm25-guangzhou")`` -> a column table ``dict[str, np.ndarray]`` (numeric columns float64 with ``NA`` as
NaN, the others str). Each canonical source is a zip archive; only the registered member is verified and
cached (see `experiments.data.registry`). ``pm25_forecasting()`` builds the next-hour forecasting task of the
singular-BNN paper (section 4.3) from both tables; ``pm25_city_forecasting(city)`` one city's records as a task of
their own (the same windows, split and train-only scaling).
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


# ---------------------------------------------------------------------------------------------------------------
# PM2.5 next-hour forecasting (singular-BNN paper, section 4.3 and appendix G.4)

PM25_FEATURES = ("pm2.5", "DEWP", "TEMP", "PRES", "Iws", "Is", "Ir", "cbwd=NE", "cbwd=NW", "cbwd=SE", "cbwd=cv",
                 "hour_sin", "hour_cos", "month_sin", "month_cos")


class PM25Task(NamedTuple):
    """Windows ``x`` (n, window, 15) of standardised features (`PM25_FEATURES`) and standardised next-hour
    PM2.5 targets ``y`` (n,), split chronologically into train / val / test, plus the Guangzhou windows as the
    out-of-distribution set; ``y_mean``, ``y_std`` undo the target scaling (``y * y_std + y_mean`` in ug/m^3),
    ``x_mean``, ``x_std`` (15,) are the feature scaler, fitted on the training windows only."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_ood: np.ndarray
    y_ood: np.ndarray
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float


def _run_length(flags: np.ndarray) -> np.ndarray:
    """Hours since the current run of ``flags`` began (0 where the flag is off): Beijing's ``Is`` / ``Ir``."""
    out = np.zeros(flags.shape, np.float64)
    for i, f in enumerate(flags):
        out[i] = (out[i - 1] + 1 if i else 1) if f else 0
    return out


def _pm25_frame(table: dict, pm: str, snow: np.ndarray | None, rain: np.ndarray) -> np.ndarray:
    """(rows, 15) feature matrix in `PM25_FEATURES` order, rows with a missing value dropped."""
    wind = table["cbwd"]
    cols = [table[pm], table["DEWP"], table["TEMP"], table["PRES"], table["Iws"],
            np.zeros_like(table["DEWP"]) if snow is None else snow, rain]
    cols += [(wind == d).astype(np.float64) for d in ("NE", "NW", "SE", "cv")]
    hour, month = table["hour"], table["month"]
    cols += [np.sin(2 * np.pi * hour / 24), np.cos(2 * np.pi * hour / 24), np.sin(2 * np.pi * (month - 1) / 12),
             np.cos(2 * np.pi * (month - 1) / 12)]
    frame = np.stack(cols, axis=1)
    known = np.isfinite(frame).all(1) & np.isin(wind, ("NE", "NW", "SE", "SW", "cv"))
    return frame[known]


def _windows(frame: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Sliding windows ``frame[t - window:t]`` and targets ``frame[t, 0]`` for every t >= window."""
    idx = np.arange(window)[None, :] + np.arange(frame.shape[0] - window)[:, None]
    return frame[idx], frame[window:, 0]


PM25_CITIES = ("beijing", "guangzhou")


class PM25CityTask(NamedTuple):
    """One city's next-hour PM2.5 regression task: windows ``x`` (n, window, 15) of standardised features
    (`PM25_FEATURES`) and standardised targets ``y`` (n,), split chronologically into train / val / test; ``x_mean``,
    ``x_std`` (15,) and ``y_mean``, ``y_std`` are the scalers, fitted on the city's training windows only."""

    city: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float


def _check_pm25_args(who: str, window, fractions) -> tuple[float, float, float]:
    if int(window) != window or window < 1:
        raise ValueError(f"{who}: window must be a positive integer, got {window!r}")
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"{who}: fractions must be three positive numbers summing to 1, got {fractions}")
    return fractions


def _pm25_city_windows(city: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    """All windows and targets of one city, chronological, in `PM25_FEATURES` order (see `pm25_forecasting` for
    how each city's columns are mapped)."""
    from experiments.data.registry import load

    if city == "beijing":
        bj = load("pm25-beijing")
        return _windows(_pm25_frame(bj, "pm2.5", bj["Is"], bj["Ir"]), window)
    if city == "guangzhou":
        gz = load("pm25-guangzhou")
        rain = _run_length(np.nan_to_num(gz["precipitation"], nan=0.0) > 0)
        return _windows(_pm25_frame(gz, "PM_US Post", None, rain), window)
    raise ValueError(f"unknown PM2.5 city {city!r}; choose one of {PM25_CITIES}")


def _pm25_split(x: np.ndarray, y: np.ndarray, fractions):
    """Chronological split of the windows by ``fractions`` and the scalers fitted on the training part.

    Returns ``(parts, fx, fy, x_mean, x_std, y_mean, y_std)``: the three slices, and the float32 feature and
    target scalings ``fx``, ``fy`` (per feature over every time step of the training windows; the target's mean
    and standard deviation over the training targets)."""
    n = x.shape[0]
    n_tr = int(fractions[0] * n)
    n_val = (n - n_tr) // 2 if abs(fractions[1] - fractions[2]) < 1e-12 else int(fractions[1] * n)
    parts = [slice(0, n_tr), slice(n_tr, n_tr + n_val), slice(n_tr + n_val, n)]
    flat = x[parts[0]].reshape(-1, x.shape[-1])
    x_mean, x_std = flat.mean(0), flat.std(0)
    x_std = np.where(x_std > 0, x_std, 1.0)
    y_mean, y_std = float(y[parts[0]].mean()), float(y[parts[0]].std())

    def fx(a):
        return ((a - x_mean) / x_std).astype(np.float32)

    def fy(a):
        return ((a - y_mean) / y_std).astype(np.float32)

    return parts, fx, fy, x_mean, x_std, y_mean, y_std


def pm25_forecasting(window: int = 24, fractions=(0.70, 0.15, 0.15)) -> PM25Task:
    """The PM2.5 task: ``window`` hours of 15 features -> the next hour's PM2.5.

    Beijing (UCI 381): rows with a missing value (2,067 missing PM2.5 readings) are dropped and the remaining
    41,757 hours windowed as one series (the paper's count: 41,757 - 24 = 41,733 windows), then split
    chronologically by ``fractions`` (29,213 / 6,260 / 6,260). Features: PM2.5, dew point, temperature,
    pressure, cumulated wind speed, cumulated hours of snow and of rain, the wind direction one-hot (NE, NW, SE,
    calm) and the hour and month on the circle; the paper lists these sources but not the exact 15 columns, so
    this set is our reading. The scaler (per feature, over every time step of the training windows) and the
    target scaler are fitted on the training windows only.

    Guangzhou (UCI 394) is the out-of-distribution set, mapped to the same columns: PM2.5 from the US Post
    monitor (the instrument type of Beijing's US Embassy series), no snow column (zeros), ``Ir`` as the length
    of the current run of hours with precipitation, and the SW wind direction (absent from Beijing) as an all-zero
    one-hot; 32,327 windows (the paper reports 20,050 without saying how it mapped the columns).
    """
    fractions = _check_pm25_args("pm25_forecasting", window, fractions)
    x, y = _pm25_city_windows("beijing", window)
    x_ood, y_ood = _pm25_city_windows("guangzhou", window)
    parts, fx, fy, x_mean, x_std, y_mean, y_std = _pm25_split(x, y, fractions)
    return PM25Task(*(f(a[p]) for p in parts for f, a in ((fx, x), (fy, y))), fx(x_ood), fy(y_ood), x_mean, x_std,
                    y_mean, y_std)


def pm25_city_forecasting(city: str, window: int = 24, fractions=(0.70, 0.15, 0.15)) -> PM25CityTask:
    """One city's records as a regression task of their own: ``window`` hours of the 15 features -> the next
    hour's PM2.5, windowed as `pm25_forecasting` windows Beijing (rows with a missing value dropped, one series),
    split chronologically by ``fractions`` and scaled by the city's own training windows.

    ``city='beijing'`` gives exactly `pm25_forecasting`'s train / val / test arrays (29,213 / 6,260 / 6,260);
    ``city='guangzhou'`` maps the Guangzhou columns as `pm25_forecasting` does for its out-of-distribution set
    (32,327 windows: 22,628 / 4,849 / 4,850).

    Args:
        city: ``'beijing'`` or ``'guangzhou'``.
        window: hours of history per window, a positive integer.
        fractions: train / validation / test fractions, three positive numbers summing to 1.

    Returns:
        :class:`PM25CityTask` with float32 arrays and the float64 scalers.

    Raises:
        ValueError: for an unknown city, a window that is not a positive integer, or bad fractions.
    """
    if city not in PM25_CITIES:
        raise ValueError(f"pm25_city_forecasting: unknown city {city!r}; choose one of {PM25_CITIES}")
    fractions = _check_pm25_args("pm25_city_forecasting", window, fractions)
    x, y = _pm25_city_windows(city, window)
    parts, fx, fy, x_mean, x_std, y_mean, y_std = _pm25_split(x, y, fractions)
    return PM25CityTask(city, *(f(a[p]) for p in parts for f, a in ((fx, x), (fy, y))), x_mean, x_std, y_mean,
                        y_std)
