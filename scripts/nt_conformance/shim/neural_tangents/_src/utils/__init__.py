"""``neural_tangents._src.utils`` (conformance shim)."""
