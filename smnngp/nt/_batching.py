"""neural-tangents' ``batch`` with its signature, over `smnngp.kernels.batched_kernel_fn`."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from smnngp.kernels import batched_kernel_fn

__all__ = ["batch"]


def batch(kernel_fn: Callable, batch_size: int = 0, device_count: int = -1, store_on_device: bool = True) -> Callable:
    """Evaluate ``kernel_fn`` tile by tile and over devices, with neural-tangents 0.6.5's signature.

    A thin adapter over `smnngp.kernels.batched_kernel_fn`: ``batch_size`` rows
    of ``x1`` and of ``x2`` per tile (``0``: one tile holding all points),
    tiles sharded over the first ``device_count`` local devices (``-1``: all of
    them; ``0``: the default device only). With ``x2=None`` only the tiles on
    and above the block diagonal are computed. Any further positional and
    keyword arguments of the returned function go to ``kernel_fn`` (the
    ``params`` of an empirical kernel function, ``diagonal_spatial=True``).

    Differences from neural-tangents: the result is assembled in host memory as
    NumPy arrays whatever ``store_on_device`` says (it is accepted for
    compatibility); ``batch_size`` need not divide the number of points (the
    last tile is padded); ``get=None`` returns the named tuple ``(nngp, ntk)``
    rather than a `Kernel` (its ``.nngp`` and ``.ntk`` read the same).

    Args:
        kernel_fn: ``kernel_fn(x1, x2, get, *args, **kwargs)`` of `smnngp.stax` or `smnngp.empirical`.
        batch_size: rows per tile, a non-negative int (``0`` for no tiling).
        device_count: number of local devices to use; ``-1`` for all, ``0`` for the default device only.
        store_on_device: accepted for neural-tangents compatibility; results are always NumPy arrays.

    Returns:
        ``batched(x1, x2=None, get=None, *args, **kwargs)`` with ``kernel_fn``'s results as NumPy arrays.

    Raises:
        ValueError: if ``batch_size`` is negative or ``device_count`` is below -1 or above the number of local
            devices.
    """
    if not callable(kernel_fn):
        raise TypeError(f"batch: kernel_fn must be callable, got {type(kernel_fn).__name__}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
        raise ValueError(f"batch: batch_size must be a non-negative integer, got {batch_size!r}")
    local = jax.local_devices()
    if not isinstance(device_count, (int, np.integer)) or device_count < -1 or device_count > len(local):
        raise ValueError(f"batch: device_count must be -1, 0 or at most {len(local)} (local devices), "
                         f"got {device_count!r}")
    devices = local if device_count == -1 else local[: max(device_count, 1)]
    wrapped = {}

    def batched(x1, x2=None, get=None, *args, **kwargs):
        n = max(np.shape(x1)[0], 0 if x2 is None else np.shape(x2)[0])
        size = batch_size or max(n, 1)
        if size not in wrapped:
            wrapped[size] = batched_kernel_fn(kernel_fn, size, devices=devices)
        return wrapped[size](x1, x2, get, *args, **kwargs)

    return batched
