"""Graph layers: `Aggregate` (pattern-based neighbourhood aggregation)."""

from __future__ import annotations

__all__: list[str] = []
