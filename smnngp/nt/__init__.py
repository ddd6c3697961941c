"""neural-tangents 0.6.5's public API with its names and signatures, over smnngp (filled in by issue 29)."""
