"""Monte-Carlo NNGP / NTK of a finite network: neural-tangents 0.6.5's ``monte_carlo_kernel_fn``.

The estimate over ``n`` random initialisations is ``K_n = (1/n) sum_{s=1}^n K(theta_s)`` with ``K(theta)``
the empirical kernel of `smnngp.empirical.empirical_kernel_fn`. The random stream is neural-tangents': the
key is advanced ``key, k_s = split(key)`` once per sample, and ``init_key, rng = split(k_s)`` gives the
parameters ``init_fn(init_key, x1.shape)`` and the ``rng`` keyword passed to ``apply_fn`` (dropout). So the
same ``init_fn`` and key give the same draws as neural-tangents (under the same PRNG implementation).

Samples are evaluated in groups under one `jit` + `vmap` (group size ``samples_per_call``); with several
local devices the group axis is sharded over them with a `NamedSharding`, each device drawing and reducing
its own samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.empirical import _axes
from smnngp.empirical._kernels import DEFAULT_NTK_IMPLEMENTATION, _dispatch_get, empirical_kernel_fn

__all__ = ["monte_carlo_kernel_fn"]


def _canonical_n_samples(n_samples):
    if isinstance(n_samples, (int, np.integer)) and not isinstance(n_samples, bool):
        ns, generator = {int(n_samples)}, False
    elif isinstance(n_samples, Iterable) and not isinstance(n_samples, (str, bytes)):
        ns, generator = set(n_samples), True
        if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in ns):
            raise ValueError(f"monte_carlo_kernel_fn: n_samples must contain only integers, got {n_samples!r}")
        ns = {int(n) for n in ns}
    else:
        raise TypeError(f"monte_carlo_kernel_fn: n_samples must be an int or an iterable of ints, "
                        f"got {type(n_samples).__name__}")
    if not ns or any(n <= 0 for n in ns):
        raise ValueError(f"monte_carlo_kernel_fn: n_samples must be positive, got {n_samples!r}")
    return sorted(ns), generator


def monte_carlo_kernel_fn(init_fn: Callable, apply_fn: Callable, key, n_samples, batch_size: int = 0,
                          device_count: int = -1, store_on_device: bool = True, trace_axes=(-1,),
                          diagonal_axes=(), vmap_axes=None, implementation=DEFAULT_NTK_IMPLEMENTATION,
                          samples_per_call: int = 8) -> Callable:
    """Monte-Carlo estimate ``(1/n) sum_s K(theta_s)`` of the NNGP and NTK of a finite network.

    Args:
        init_fn: ``init_fn(key, input_shape) -> (output_shape, params)``.
        apply_fn: ``apply_fn(params, x, **kwargs)``; it receives an ``rng`` keyword (per-sample dropout key).
        key: PRNG key of the random initialisations.
        n_samples: an int ``n`` (the function returns the estimate) or an iterable of ints (it returns a
            generator of the estimates at each ``n``, in increasing order).
        batch_size: rows of ``x1`` and ``x2`` per tile (``0``: one tile); need not divide the batch.
        device_count: local devices over which samples are spread; ``-1`` all, ``0`` the default one.
        store_on_device: ``False`` returns NumPy (host) arrays, ``True`` JAX arrays.
        trace_axes: output axes summed over.
        diagonal_axes: output axes kept once.
        vmap_axes: NTK only; see `smnngp.empirical.empirical_ntk_fn`.
        implementation: NTK only; an `smnngp.empirical.NtkImplementation` or its integer value.
        samples_per_call: samples drawn per `jit` call (memory holds this many kernels; smnngp extension).

    Returns:
        ``kernel_fn(x1, x2=None, get=None, **apply_fn_kwargs)``: ``get`` as in `empirical_kernel_fn` (the named
        tuple is ``MonteCarloKernel``), or a generator of such results when ``n_samples`` is iterable.

    Raises:
        ValueError: for non-positive or non-integer ``n_samples``, a negative ``batch_size``, a bad
            ``device_count`` or ``samples_per_call``.
        TypeError: if ``n_samples`` is neither an int nor an iterable.
    """
    ns, generator = _canonical_n_samples(n_samples)
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
        raise ValueError(f"monte_carlo_kernel_fn: batch_size must be a non-negative integer, got {batch_size!r}")
    local = jax.local_devices()
    if not isinstance(device_count, (int, np.integer)) or not -1 <= device_count <= len(local):
        raise ValueError(f"monte_carlo_kernel_fn: device_count must be -1, 0 or at most {len(local)}, "
                         f"got {device_count!r}")
    if not isinstance(samples_per_call, (int, np.integer)) or samples_per_call < 1:
        raise ValueError(f"monte_carlo_kernel_fn: samples_per_call must be a positive integer, "
                         f"got {samples_per_call!r}")
    devices = local if device_count == -1 else local[: max(device_count, 1)]
    n_dev = len(devices)
    group = int(np.ceil(samples_per_call / n_dev) * n_dev)
    per_device = group // n_dev
    emp = empirical_kernel_fn(apply_fn, trace_axes, diagonal_axes, vmap_axes, implementation)
    diagonal = bool(jax.tree_util.tree_leaves(diagonal_axes))  # kernels with single (not paired) axes

    # Per-sample keys in neural-tangents' order: key_{s} from successive splits of the running key.
    keys = []
    running = key
    for _ in range(ns[-1]):
        running, k = jax.random.split(running)
        keys.append(k)
    keys = jnp.stack(keys)
    cache = {}

    def group_sum(gets, static_kw):
        if (gets, static_kw) not in cache:
            def one(k, x1, x2, kw):
                init_key, rng = jax.random.split(k)
                shape = jax.tree_util.tree_map(jnp.shape, x1)
                _, params = init_fn(init_key, shape)
                out = emp(x1, x2, gets, params, rng=rng, **kw, **dict(static_kw))
                return _by_name(out, gets)

            def summed(ks, mask, x1, x2, kw):
                outs = jax.vmap(one, in_axes=(0, None, None, None))(ks, x1, x2, kw)
                return jax.tree_util.tree_map(
                    lambda t: jnp.tensordot(mask.astype(t.dtype), t, axes=(0, 0)), outs)

            cache[(gets, static_kw)] = jax.jit(summed)
        return cache[(gets, static_kw)]

    def tile_sum(lo, hi, x1, x2, gets, kw, static_kw):
        fn = group_sum(gets, static_kw)
        count = hi - lo
        padded = int(np.ceil(count / group) * group)
        ks = keys[lo:hi]
        mask = jnp.ones((count,))
        if padded > count:
            ks = jnp.concatenate([ks, jnp.broadcast_to(ks[:1], (padded - count,) + ks.shape[1:])])
            mask = jnp.concatenate([mask, jnp.zeros((padded - count,))])
        # Each device sums its own share of the samples in a program of its own (dispatched asynchronously, so
        # the devices run at once); the partial sums meet on the first device. Plain per-device placement, not a
        # sharded array: JAX's batching rule for grouped convolutions (met in a conv net's Jacobian with the
        # weights vmapped over samples) refuses sharding-annotated operands.
        inputs = [jax.device_put((x1, x2, kw), d) for d in devices]
        total = None
        for start in range(0, padded, group):
            for i, d in enumerate(devices):
                lo_i = start + i * per_device
                part = fn(jax.device_put(ks[lo_i:lo_i + per_device], d),
                          jax.device_put(mask[lo_i:lo_i + per_device], d), *inputs[i])
                part = jax.device_put(part, devices[0])
                total = part if total is None else jax.tree_util.tree_map(jnp.add, total, part)
        return total

    def tiles(x):
        n = jax.tree_util.tree_leaves(x)[0].shape[0]
        size = batch_size or n
        return [(i, min(i + size, n)) for i in range(0, n, size)]

    def estimates(x1, x2, get, apply_fn_kwargs):
        gets = ("nngp", "ntk") if get is None else ((get,) if isinstance(get, str) else tuple(get))
        kw = {k: v for k, v in apply_fn_kwargs.items() if _is_array_tree(v)}
        static_kw = tuple(sorted((k, v) for k, v in apply_fn_kwargs.items() if not _is_array_tree(v)))
        running_sum, done = None, 0
        for n in ns:
            if batch_size == 0:
                part = tile_sum(done, n, x1, x2, gets, kw, static_kw)
            else:
                part = _tiled(tile_sum, tiles, done, n, x1, x2, gets, kw, static_kw,
                              mirror=x2 is None and not diagonal and _axes.symmetric_kwargs(kw))
            running_sum = part if running_sum is None else jax.tree_util.tree_map(jnp.add, running_sum, part)
            done = n
            est = dict(zip(gets, (jax.tree_util.tree_map(lambda t, n=n: t / n, v) for v in running_sum)))
            if not store_on_device:
                est = jax.tree_util.tree_map(np.asarray, est)
            yield _dispatch_get("MonteCarloKernel", get, lambda g: est[g])

    def kernel_fn(x1, x2=None, get=None, **apply_fn_kwargs):
        x2 = _axes.none_if_empty(x2)
        gen = estimates(x1, x2, get, apply_fn_kwargs)
        if generator:
            return gen
        *_, last = gen
        return last

    return kernel_fn


def _by_name(out, gets):
    """One entry per name of ``gets`` from what an empirical kernel_fn returned for ``get=gets``: a named tuple
    of kernels, or, for a network with several outputs, a list (pytree) of such named tuples."""

    def is_named(t):
        return isinstance(t, tuple) and getattr(t, "_fields", None) == gets

    if is_named(out):
        return tuple(out)
    return tuple(jax.tree_util.tree_map(lambda t, g=g: getattr(t, g), out, is_leaf=is_named) for g in gets)


def _is_array_tree(v):
    leaves = jax.tree_util.tree_leaves(v)
    return bool(leaves) and all(isinstance(t, (jax.Array, np.ndarray)) for t in leaves)


def _tiled(tile_sum, tiles, lo, hi, x1, x2, gets, kw, static_kw, mirror: bool = False):
    """Assemble the kernel tile by tile along the batch axes of ``x1`` and ``x2`` (the first output axes).

    With ``mirror`` (the kernel of x1 against itself, every axis paired) a tile below the diagonal is the
    transpose of the one above it: computed once, and the estimate is symmetric as K(x, x) is.
    """
    xb = x1 if x2 is None else x2
    n1, n2 = tiles(x1)[-1][1], tiles(xb)[-1][1]
    rows, grid = [], []
    for i, (a, b) in enumerate(tiles(x1)):
        cols = []
        for j, (c, d) in enumerate(tiles(xb)):
            if mirror and j < i:
                cols.append(jax.tree_util.tree_map(_axes.flip_pairs, grid[j][i]))
                continue
            s1 = jax.tree_util.tree_map(lambda t, a=a, b=b: t[a:b], x1)
            s2 = jax.tree_util.tree_map(lambda t, c=c, d=d: t[c:d], xb)
            kw_tile = _axes.tile_kwargs(kw, (a, b), (c, d), n1, n2)
            cols.append(tile_sum(lo, hi, s1, s2, gets, kw_tile, static_kw))
        grid.append(cols)
        rows.append(jax.tree_util.tree_map(lambda *t: jnp.concatenate(t, axis=1), *cols))
    return jax.tree_util.tree_map(lambda *t: jnp.concatenate(t, axis=0), *rows)
