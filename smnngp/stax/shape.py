"""Shape layers: `Index`, `Slice`, `ImageResize`, `DotGeneral`."""

from __future__ import annotations

__all__: list[str] = []
