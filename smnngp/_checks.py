"""Input checks shared across the library: the one home of the "no NaN or inf in the data" test."""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["check_finite"]


def check_finite(a, name: str, where: str = "") -> None:
    """Refuse an array with NaN or infinite entries, counting them in the message.

    The test runs on the host with NumPy: the values are there anyway, and an eager ``jnp.isfinite`` would compile
    one XLA program per new shape. A traced value (inside ``jit`` or ``vmap``) cannot be inspected and passes.

    Args:
        a: an array (NumPy, JAX or anything ``np.asarray`` takes).
        name: what the array is, for the message (``"x_train"``).
        where: the function named first in the message, if any.

    Raises:
        ValueError: naming ``where``, ``name`` and the number of non-finite entries.
    """
    if isinstance(a, jax.core.Tracer):
        return
    finite = np.isfinite(np.asarray(a))
    if not finite.all():
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{name} has {int((~finite).sum())} non-finite (NaN or infinite) entries")
