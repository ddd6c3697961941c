"""`smnngp.nt.batch` compiles its tile function (issue 50): the batched kernel equals the unbatched one, the tile
function is traced a bounded number of times (once per tile kind, not once per tile), only the tiles on and above
the diagonal of K(x, x) run, a short last tile shares the others' program, and kernel functions that cannot be
compiled still work. Also the pieces `smnngp.kernels` shares between `nt.batch` and `batched_kernel_fn`."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smnngp import stax
from smnngp.kernels import Kernel, batched_kernel_fn, pad_to, split_static, swap_pairs
from smnngp.nt import batch

jax.config.update("jax_enable_x64", True)

RNG = np.random.RandomState(50)
X = jnp.asarray(RNG.normal(size=(7, 4, 4, 2)))  # 7 points: tiles of 3, 3 and 1 (padded to 3)
Y = jnp.asarray(RNG.normal(size=(5, 4, 4, 2)))
CNN = stax.serial(stax.Conv(6, (2, 2), padding="SAME", W_std=1.4, b_std=0.1), stax.Relu(),
                  stax.AvgPool((2, 2), padding="SAME"), stax.Conv(6, (2, 2), W_std=1.2), stax.Relu(),
                  stax.GlobalAvgPool(), stax.Dense(1, W_std=1.1, b_std=0.05))


def rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def counted(kernel_fn):
    """``kernel_fn`` with a count of its Python calls by kind (a compiled call runs Python only when traced)."""
    calls = collections.Counter()

    def fn(x1, x2=None, *args, **kwargs):
        calls["diagonal" if x2 is None else "off"] += 1
        return kernel_fn(x1, x2, *args, **kwargs)

    return fn, calls


@pytest.mark.parametrize("size", [3, 20])
@pytest.mark.parametrize("get", ["nngp", ("nngp", "ntk"), None], ids=["nngp", "both", "Kernel"])
def test_batched_equals_unbatched(size, get):
    for x2 in (None, Y):
        ref = CNN[2](X, x2, get)
        out = batch(CNN[2], batch_size=size)(X, x2, get)
        assert type(out) is type(ref)
        for name in ("nngp", "ntk", "cov1", "cov2"):
            r = ref if isinstance(get, str) else getattr(ref, name, None) if get is None or name in get else None
            o = out if isinstance(get, str) else getattr(out, name, None) if get is None or name in get else None
            if r is None:
                assert o is None, name
                continue
            assert rel(o, r) < 1e-12, (name, size, x2 is None)
            if isinstance(get, str):
                break
        if get is None:
            assert out.x1_is_x2 == ref.x1_is_x2 and out.shape1 == ref.shape1 and out.shape2 == ref.shape2


def test_the_tile_function_is_traced_once_per_kind_of_tile():
    fn, calls = counted(CNN[2])
    batched = batch(fn, batch_size=3)
    out = batched(X, None, "ntk")  # 3 x 3 tiles, the last row and column short: still 2 programs
    assert calls == {"diagonal": 1, "off": 1}
    np.testing.assert_allclose(out, CNN[2](X, None, "ntk"), rtol=1e-12)
    batched(X, None, "ntk")
    batched(X[:6], None, "ntk")  # other points, the same tile shapes
    batched(X, Y, "ntk")  # x1 against x2: the off-diagonal tiles' program (Y's last tile padded to 3)
    assert calls == {"diagonal": 1, "off": 1}
    batched(X, None, "nngp")  # another get is another program (static, as neural-tangents treats it)
    assert calls == {"diagonal": 2, "off": 2}


def test_only_the_tiles_on_and_above_the_diagonal_run():
    runs = []

    def kernel_fn(x1, x2=None, get=None):
        jax.debug.callback(lambda: runs.append(x2 is None))  # once per execution, compiled or not
        return CNN[2](x1, x2, get)

    out = batch(kernel_fn, batch_size=3)(X, None, "nngp")
    jax.effects_barrier()
    assert len(runs) == 6 and sum(runs) == 3  # 3 diagonal tiles, 3 above them, none of the 3 below
    np.testing.assert_allclose(out, CNN[2](X, None, "nngp"), rtol=1e-12)


def test_kernel_inputs_compose_with_a_short_last_tile():
    block = stax.serial(stax.Conv(8, (2, 2), padding="SAME"), stax.Relu())
    readout = stax.serial(stax.GlobalAvgPool(), stax.Dense(3))
    composed = stax.serial(block, readout)
    fn, calls = counted(readout[2])
    for x2 in (None, Y):
        k = batch(block[2], 3)(X, x2)
        assert isinstance(k, Kernel)
        out = batch(fn, 3)(k)  # a new batched function of the same kernel_fn: the same compiled programs
        ref = composed[2](X, x2)
        for name in ("nngp", "ntk", "cov1") + (("cov2",) if x2 is not None else ()):
            assert rel(getattr(out, name), getattr(ref, name)) < 1e-12, name
        assert out.shape1 == ref.shape1 and out.shape2 == ref.shape2
    # a Kernel's tiles, all 3 x 3: those on the diagonal of K(x, x) (x1 is x2), and the others, of K(x, x) and of
    # K(x1, x2) alike
    assert calls == {"diagonal": 2}


def test_under_jit():
    batched = jax.jit(batch(CNN[2], batch_size=3), static_argnums=2)
    for x2 in (None, Y):
        out = batched(X, x2, ("nngp", "ntk"))
        ref = CNN[2](X, x2, ("nngp", "ntk"))
        assert rel(out.nngp, ref.nngp) < 1e-12 and rel(out.ntk, ref.ntk) < 1e-12


def test_per_point_keywords_are_padded_with_their_tiles():
    # a graph network: the pattern (one adjacency per point) is cut and padded with the points
    net = stax.serial(stax.Dense(8, W_std=1.3), stax.Aggregate(), stax.Relu(), stax.GlobalAvgPool(), stax.Dense(1))
    x = jnp.asarray(RNG.normal(size=(5, 4, 3)))
    p = jnp.asarray((RNG.uniform(size=(5, 4, 4)) < 0.5) | np.eye(4, dtype=bool), jnp.float64)
    ref = net[2](x, None, "nngp", pattern=(p, p))
    out = batch(net[2], batch_size=2)(x, None, "nngp", pattern=(p, p))
    assert rel(out, ref) < 1e-12


def test_kernel_functions_that_cannot_be_compiled_still_work():
    net = stax.serial(stax.Dense(8, W_std=1.5, b_std=0.1), stax.Relu(), stax.Dense(1))
    x = jnp.asarray(RNG.normal(size=(7, 3)))
    ref = net[2](x, None, "nngp")

    class Unhashable:  # neither an array nor hashable: cannot be a static argument
        __hash__ = None

    def with_object(x1, x2=None, get=None, options=None):
        assert isinstance(options, Unhashable)
        return net[2](x1, x2, get)

    out = batch(with_object, 3)(x, None, "nngp", options=Unhashable())
    np.testing.assert_allclose(out, ref, rtol=1e-12)

    concrete = []

    def needs_values(x1, x2=None, get=None):
        concrete.append(float(jnp.sum(x1)))  # a concrete value: fails under tracing
        return net[2](x1, x2, get)

    out = batch(needs_values, 3)(x, None, "nngp")
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    assert len(concrete) == 6  # tile by tile, as it is (the first traced attempt failed before appending)

    def raises(x1, x2=None, get=None):
        raise ValueError("the kernel function's own error")

    with pytest.raises(ValueError, match="own error"):
        batch(raises, 3)(x, None, "nngp")

    def wrong_type(x1, x2=None, get=None):
        raise TypeError("a genuine TypeError")

    with pytest.raises(TypeError, match="genuine"):  # raised again by the uncompiled call, unchanged
        batch(wrong_type, 3)(x, None, "nngp")


def test_parallel_inputs_named_tuples_and_store_on_device():
    net = stax.parallel(stax.serial(stax.Dense(6), stax.Relu(), stax.Dense(1)), stax.Dense(2, W_std=1.2))
    x = (jnp.asarray(RNG.normal(size=(5, 3))), jnp.asarray(RNG.normal(size=(5, 4))))
    ref = net[2](x, None, ("nngp", "ntk"))
    out = batch(net[2], 2, store_on_device=False)(x, None, ("nngp", "ntk"))
    assert isinstance(out, list) and len(out) == 2
    for o, r in zip(out, ref):
        assert type(o) is type(r) and o._fields == ("nngp", "ntk")
        assert rel(o.nngp, r.nngp) < 1e-12 and rel(o.ntk, r.ntk) < 1e-12
        assert o.nngp.devices() == {jax.devices("cpu")[0]}


def test_batched_kernel_fn_mirrors_diagonal_spatial_kernels_with_square_images():
    # (N, N, H, W) with H == W: the mirrored tile swaps the two points only, not H and W
    net = stax.serial(stax.Conv(4, (2, 2), padding="SAME", W_std=1.3), stax.Relu(), stax.Conv(2, (2, 2)))
    ref = net[2](X, None, "nngp", diagonal_spatial=True)
    out = batched_kernel_fn(net[2], batch_size=3)(X, None, "nngp", diagonal_spatial=True)
    assert rel(out, ref) < 1e-12
    full = batched_kernel_fn(net[2], batch_size=3)(X, None, "nngp")  # (N, N, H, H', W, W'): pairs swapped
    assert rel(full, net[2](X, None, "nngp")) < 1e-12


def test_shared_tile_pieces():
    a = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(pad_to(a, 5), np.array([[0, 1], [2, 3], [4, 5], [4, 5], [4, 5.0]]))
    assert isinstance(pad_to(a, 5), np.ndarray) and pad_to(a, 3) is a
    np.testing.assert_array_equal(pad_to(jnp.asarray(a), 3, axis=1), [[0, 1, 1], [2, 3, 3], [4, 5, 5]])
    with pytest.raises(ValueError, match="more than"):
        pad_to(a, 2)
    k = RNG.normal(size=(2, 3, 4, 5, 6, 7))  # k(a, b) with two interleaved spatial pairs
    assert swap_pairs(k, False).shape == (3, 2, 5, 4, 7, 6)
    assert swap_pairs(k, True).shape == (3, 2, 4, 5, 6, 7)
    np.testing.assert_array_equal(swap_pairs(swap_pairs(k, False), False), k)
    # the static part of the arguments: arrays traced, the rest compared by type and value
    arrays, static = split_static(((jnp.ones(2), "nngp"), {"flag": True, "w": np.ones(3), "n": 1}))
    assert len(arrays) == 2
    assert static == split_static(((jnp.zeros(2), "nngp"), {"flag": True, "w": np.zeros(3), "n": 1}))[1]
    assert static != split_static(((jnp.zeros(2), "nngp"), {"flag": True, "w": np.zeros(3), "n": 1.0}))[1]
    assert static != split_static(((jnp.zeros(2), "ntk"), {"flag": True, "w": np.zeros(3), "n": 1}))[1]
    args, kwargs = static.merge(arrays)
    assert args[1] == "nngp" and kwargs["n"] == 1 and kwargs["w"].shape == (3,)
    with pytest.raises(TypeError, match="neither an array nor hashable"):
        split_static(({1, 2},))

