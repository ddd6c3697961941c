"""Normalisation and noise layers: `LayerNorm`, `Dropout`."""

from __future__ import annotations

__all__: list[str] = []
