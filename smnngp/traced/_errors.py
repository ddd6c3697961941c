"""The error smnngp.traced raises for a construction without an infinite-width rule."""


class TracedError(ValueError):
    """A construction of the user's program that has no infinite-width limit in smnngp.traced."""
