"""Attention layers: `GlobalSelfAttention` (finite network, NNGP and NTK)."""

from __future__ import annotations

__all__: list[str] = []
