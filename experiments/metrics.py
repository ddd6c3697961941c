"""One home for the metrics and summaries that experiments report."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rmse", "mean_se", "compare_marker", "format_mean_se"]


def rmse(y, mean) -> float:
    y, mean = np.asarray(y, float), np.asarray(mean, float)
    if y.shape != mean.shape:
        raise ValueError(f"rmse: shapes differ, y {y.shape} vs mean {mean.shape}")
    return float(np.sqrt(np.mean((y - mean) ** 2)))


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
    v = np.asarray(values, float)
    if v.size == 0:
        raise ValueError("mean_se of no values")
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0
    return float(v.mean()), se


def format_mean_se(m: float, se: float, digits: int = 2) -> str:
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def compare_marker(ours: tuple[float, float], theirs: tuple[float, float], lower_is_better: bool = True) -> str:
    """'+' when ours is better beyond both error bars, '-' when worse beyond them, '' otherwise."""
    (m1, s1), (m2, s2) = ours, theirs
    gap = s1 + s2
    if lower_is_better:
        m1, m2 = -m1, -m2
    if m1 - m2 > gap:
        return "+"
    if m2 - m1 > gap:
        return "-"
    return ""
