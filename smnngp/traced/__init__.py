"""The infinite-width kernel of a network written in Flax, Equinox or plain JAX: the engine reads the program.

``init_fn, apply_fn, kernel_fn = smnngp.traced.infinite_width(model.apply, params)`` traces ``apply_fn(params, x)``
to a jaxpr and interprets it primitive by primitive as operations on kernels, with the width of every random
weight taken to infinity (Tensor Programs: Yang 2019, 2020). ``kernel_fn`` has the contract of a `smnngp.stax`
kernel_fn (``kernel_fn(x1, x2=None, get=...)``, jit-able), so it goes wherever a stax kernel goes: `smnngp.posterior`,
`smnngp.predict`, the scale mixtures, `smnngp.nt`.

What it reads (see docs/traced.md, "The kernel of your own model"):

* ``dot_general`` of an activation (or the input) with a random weight leaf: a dense layer, whatever the
  parameterisation the code writes (the leaf's variance and the constants the program multiplies by give the
  layer's scale); a random bias leaf added: ``+ b_std**2``;
* chains of entrywise primitives on one Gaussian pre-activation: an activation, in closed form when the chain is
  one the engine knows (ReLU and its (a, b) family, leaky ReLU, abs, erf, exact GELU, sin, exp, sign), by
  polar quadrature split where either argument is 0 otherwise (`smnngp.stax.elementwise.gauss_polar_2d`);
* ``conv_general_dilated`` with a random filter (any layout, any number of spatial axes, 'SAME' or 'VALID'):
  a convolutional layer; ``reduce_window_sum`` pooling, flattening and means over every spatial axis: the stax
  pooling, ``Flatten`` and global pooling maps of the kernel's spatial structure;
* dot-product self-attention with queries tied to keys and scores divided by the key width (any entrywise
  weighting: softmax, identity, relu, abs): the deterministic attention weights of the limit
  (`smnngp.stax.GlobalSelfAttention` with ``linear_scaling=True``) mixing the values' positions;
* a weight used several times (tied weights, a recurrent network in ``lax.scan``, written out step by step): the
  Tensor Programs limit, the moments of two uses of one weight paired through its map;
* sums and scalings of activations (residual and skip connections) with their cross-covariances;
* means over the width and the arithmetic on them (layer normalisation written out).

Anything else (batch statistics, control flow, an unsupported primitive) raises `TracedError` naming the
primitive, the line of the user's code and why. Nothing is silently approximated: quadrature is used only for
chains without a closed form, and the returned ``kernel_fn`` says so (``kernel_fn.activations``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from smnngp.stax._core import Layer, _input_kernel
from smnngp.traced._interpret import Interpreter, TracedError, evaluate_data
from smnngp.traced._priors import Bias, Fixed, Weight, resolve_priors
from smnngp.traced._program import trace

__all__ = ["infinite_width", "Weight", "Bias", "Fixed", "TracedError"]


def infinite_width(apply_fn, params, *, priors=None, example_input=None, quadrature_degree: int = 32,
                   name: str | None = None):
    """``(init_fn, apply_fn, kernel_fn)`` of the infinite-width limit of the model ``apply_fn(params, x)``.

    Args:
        apply_fn: the forward pass, ``apply_fn(params, x) -> output`` with ``x`` of shape (batch, features) or
            (batch, spatial..., channels) in any layout the program's first layer reads, and an output of shape
            (batch, outputs): Flax linen's ``model.apply``, an NNX or Equinox model through
            ``nnx.split``/``nnx.merge`` or ``eqx.partition``/``eqx.combine``, or any function.
        params: example parameters (a pytree); only shapes are read from the random leaves, the values of
            `Fixed` ones are used as they are.
        priors: which leaves are random and how: a mapping from path patterns (``fnmatch`` on the leaf's keys
            joined by ``/``, e.g. ``'params/Dense_*/kernel'``) to `Weight` / `Bias` / `Fixed`, or a callable
            ``(path, leaf) -> prior or None``. Leaves it leaves open get the framework's initialiser: ``kernel``
            (Flax, lecun normal) ``Weight(1.0)``, a Flax ``bias`` ``Bias(0.0)``, a ``weight`` matrix (Equinox,
            uniform) ``Weight(1/sqrt(3))`` and its ``bias`` the same uniform's variance, ``scale`` /
            ``embedding`` / a ``weight`` vector (normalisation scales) and its ``bias`` `Fixed`. Any other leaf
            must be named.
        example_input: an input (or a ``jax.ShapeDtypeStruct``) to trace and check the program with now, so that
            an unsupported construction is reported here rather than at the first kernel evaluation.
        quadrature_degree: the accuracy of the quadrature of activations without a closed form: the polar rule's
            nodes are ``max(16, d // 2)`` per arc of angle and ``max(48, d + 16)`` on the ray, the means' ``4``
            times the latter and at least 1,024 (`smnngp.traced._activations.quadrature_nodes`). Activations
            with kinks away from 0 (``abs(cos(h))``) converge algebraically, not spectrally: raise ``d`` for them
            (``d = 176`` puts 192 nodes on the ray, as ``stax`` does for its chains of activations).
        name: the network's name in messages (default: ``apply_fn``'s).

    Returns:
        ``(init_fn, apply_fn, kernel_fn)``, neural-tangents' triple: ``init_fn(key, input_shape) ->
        (output_shape, params)`` draws the finite network (random leaves from their priors; a leaf whose prior has
        ``parameterization='ntk'`` is held as a standard normal and ``apply_fn`` multiplies it by its standard
        deviation, so that the empirical NTK of ``(init_fn, apply_fn)`` converges to ``kernel_fn``'s);
        ``kernel_fn(x1, x2=None, get=None, **kwargs)`` is the infinite-width kernel as a `smnngp.stax`
        kernel_fn, with ``kernel_fn.activations(input_shape)`` saying how each activation was read and
        ``kernel_fn.priors`` the prior of every leaf.

    Raises:
        TracedError: (a ValueError) for a construction without an infinite-width rule, naming the primitive and
            the source line.
        ValueError, TypeError: for priors that do not fit the parameters.
    """
    if not callable(apply_fn):
        raise TypeError(f"infinite_width: apply_fn must be callable, got {type(apply_fn).__name__}")
    if not isinstance(quadrature_degree, (int, np.integer)) or quadrature_degree < 2:
        raise ValueError(f"infinite_width: quadrature_degree must be an integer >= 2, got {quadrature_degree!r}")
    paths, prior_list, treedef = resolve_priors(params, priors)
    leaves = jax.tree_util.tree_leaves(params)
    random = [not isinstance(p, Fixed) for p in prior_list]
    random_priors = [p for p, r in zip(prior_list, random) if r]
    random_paths = [p for p, r in zip(paths, random) if r]
    label = name or getattr(apply_fn, "__qualname__", None) or "traced"

    # what does not depend on the batch size (how each chain was read, whether the kernel is symmetric), shared by
    # the programs traced at every batch size of one feature shape
    per_features: dict = {}

    @functools.lru_cache(maxsize=32)
    def program_for(shape: tuple, dtype: str, parts: tuple | None = None):
        # several inputs (``parts``: their container and shapes) are traced as one array of their flattened
        # features side by side, which the program splits back: data-only operations that the interpreter
        # evaluates on the data before the first random weight
        fn = apply_fn if parts is None else _split_inputs(apply_fn, parts)
        program = trace(fn, leaves, treedef, random, shape, jnp.dtype(dtype))
        shared = per_features.setdefault((shape[1:], dtype, parts), {"recognised": {}, "report": {},
                                                                     "symmetric": None, "full": None})
        interp = Interpreter(program, random_priors, random_paths, int(quadrature_degree), shared["recognised"],
                             shared["report"])
        out_shape = tuple(program.avals[program.out_vars[0]].shape)
        if shared["symmetric"] is None:
            shared["symmetric"] = _dry_run(interp, jnp.dtype(dtype))
            # whether the input's kernel must hold all pairs of positions (the output has none: the answer does
            # not depend on the caller's diagonal_spatial)
            shared["full"] = interp.needs_full()
        symmetric, full_in = shared["symmetric"], shared["full"]

        def kernel_map(k):
            return interp.run(k)[0]

        # the input's layout where it enters the network (batch axis, channel axis); the stax machinery moves
        # the axes of the data there (batch first, channels last) before the input kernel
        layout = None if interp.stacked or interp.layout == (0, len(interp.in_roles) - 1) else interp.layout
        layer = Layer(f"traced({label})", lambda key, s: (s, ()), lambda p, x, **kw: x,
                      lambda s: tuple(s[:1]) + out_shape[1:], kernel_map, lambda full: full or full_in, symmetric,
                      layout=layout)
        return program, interp, layer

    def _program(x, what="inputs"):
        """(program, interpreter, layer, the input as one array, parts) for an input array or a tuple / list of
        them (a network of several inputs)."""
        x, parts = _joined(x, f"kernel_fn of {label}", what)
        return (*_program_joined(x, parts, what), x, parts)

    def _program_joined(x, parts, what):
        shape = tuple(jnp.shape(x))
        if len(shape) < 2:
            raise ValueError(f"kernel_fn of {label}: {what} must have a batch axis and a feature axis, got shape "
                             f"{shape}")
        dtype = jnp.dtype(getattr(x, "dtype", jnp.result_type(float)))
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"kernel_fn of {label}: {what} must be floating point, got {dtype}")
        return program_for(shape, dtype.name, parts)

    def kernel_fn(x1, x2=None, get=None, **kwargs):
        """The infinite-width kernel of the traced model (a `smnngp.stax` kernel_fn); ``x1`` and ``x2`` are
        arrays, or tuples / lists of arrays for a model of several inputs."""
        program1, interp1, layer, x1, parts1 = _program(x1, "x1")
        d1 = _entering(program1, interp1, x1)
        d2 = None
        if x2 is not None:
            x2, parts2 = _joined(x2, f"kernel_fn of {label}", "x2")
            beyond1 = None if parts1 is None else (parts1[0], tuple(p[1:] for p in parts1[1]))
            beyond2 = None if parts2 is None else (parts2[0], tuple(p[1:] for p in parts2[1]))
            if beyond1 != beyond2 or tuple(jnp.shape(x2))[1:] != tuple(jnp.shape(x1))[1:]:
                raise ValueError(f"kernel_fn of {label}: x1 {_describe(x1, parts1)} and x2 {_describe(x2, parts2)} "
                                 f"must agree beyond the batch axis")
            program2, interp2, _ = _program_joined(x2, parts2, "x2")
            d2 = _entering(program2, interp2, x2)
        return layer[2](d1, d2, get, **kwargs)

    def _stds(x_shape, dtype_name, parts=None) -> list[float]:
        """Standard deviation of each random leaf (its fan-in read off the program)."""
        _, interp, _ = program_for(x_shape, dtype_name, parts)
        stds = []
        for i, prior in enumerate(random_priors):
            if isinstance(prior, Weight):
                if i not in interp.fan_in:
                    raise TracedError(f"{label}: the weight {random_paths[i]} is never multiplied into an "
                                      f"activation, so its fan-in is unknown")
                stds.append(math.sqrt(prior.variance(interp.fan_in[i])))
            else:
                stds.append(prior.b_std)
        return stds

    def _ntk_held(prior) -> bool:
        return prior.parameterization == "ntk"

    def init_fn(key, input_shape):
        """``(output_shape, params)`` of the finite network: each random leaf drawn from its prior; a leaf with
        ``parameterization='ntk'`` is held as a standard normal (``apply_fn`` multiplies it by its standard
        deviation), one with ``'standard'`` at its scale; fixed leaves as given."""
        shape, parts = _joined_shape(input_shape, f"init_fn of {label}")
        dtype_name = jnp.dtype(jnp.result_type(float)).name
        program, _, _ = program_for(shape, dtype_name, parts)
        stds = _stds(shape, dtype_name, parts)
        keys = jax.random.split(key, max(1, len(random_priors)))
        drawn, i = [], 0
        for leaf, r in zip(leaves, random):
            if not r:
                drawn.append(leaf)
                continue
            unit = jax.random.normal(keys[i], jnp.shape(leaf), getattr(leaf, "dtype", jnp.result_type(float)))
            drawn.append(unit if _ntk_held(random_priors[i]) else unit * stds[i])
            i += 1
        out_shape = tuple(program.avals[program.out_vars[0]].shape)
        return out_shape, jax.tree_util.tree_unflatten(treedef, drawn)

    def network_apply_fn(params, x, **kwargs):
        """The model on parameters as `init_fn` holds them (``'ntk'`` leaves rescaled first); the ``rng`` keyword
        that `smnngp.empirical.monte_carlo_kernel_fn` passes is dropped, other keywords go to the model."""
        kwargs.pop("rng", None)
        joined, parts = _joined(x, f"apply_fn of {label}", "x")
        stds = _stds(tuple(jnp.shape(joined)), jnp.dtype(joined.dtype).name, parts)
        flat = jax.tree_util.tree_leaves(params)
        scaled, i = [], 0
        for leaf, r in zip(flat, random):
            if r:
                leaf = leaf * stds[i] if _ntk_held(random_priors[i]) else leaf
                i += 1
            scaled.append(leaf)
        return apply_fn(jax.tree_util.tree_unflatten(treedef, scaled), x, **kwargs)

    def activations(input_shape, dtype=None) -> list[tuple[str, str]]:
        """``[(source line, activation), ...]``: how each activation chain of the program was read at inputs of
        ``input_shape`` (a stax closed form such as ``'Relu'``, or ``'Quadrature(...)'`` for
        quadrature)."""
        dtype_name = jnp.dtype(dtype or jnp.result_type(float)).name
        shape, parts = _joined_shape(input_shape, f"activations of {label}")
        _, interp, _ = program_for(shape, dtype_name, parts)
        return list(interp.activation_report.values())

    if example_input is not None:
        _program(example_input, "example_input")
    kernel_fn.priors = dict(zip(paths, prior_list))
    kernel_fn.activations = activations
    return init_fn, network_apply_fn, kernel_fn


def _is_several(x) -> bool:
    return isinstance(x, (tuple, list))


def _joined(x, where: str, what: str):
    """``(one array, parts)``: a tuple / list of inputs as their features flattened and side by side (``parts``:
    the container and each input's shape), or ``(x, None)`` for one array."""
    if not _is_several(x):
        return x, None
    if not x:
        raise ValueError(f"{where}: {what} is an empty {type(x).__name__}; give an array or a tuple of arrays")
    if any(_is_several(a) or not hasattr(a, "shape") for a in x):
        raise TypeError(f"{where}: {what} must be an array or a flat tuple / list of arrays, got "
                        f"{type(x).__name__} of {[type(a).__name__ for a in x]}")
    shapes = tuple(tuple(int(d) for d in a.shape) for a in x)
    if any(len(s) < 2 for s in shapes) or len({s[0] for s in shapes}) != 1:
        raise ValueError(f"{where}: the inputs in {what} must each have a batch axis and a feature axis, with one "
                         f"batch size, got shapes {list(shapes)}")
    dtypes = {jnp.dtype(a.dtype) for a in x}
    if len(dtypes) != 1:
        raise TypeError(f"{where}: the inputs in {what} must share one dtype, got {sorted(d.name for d in dtypes)}")
    joined = jnp.concatenate([jnp.reshape(a, (shapes[0][0], -1)) for a in x], axis=1)
    return joined, (type(x).__name__, shapes)


def _joined_shape(input_shape, where: str):
    """``(shape of the joined input, parts)`` for an input shape or a tuple / list of them (`_joined`)."""
    if input_shape and _is_several(input_shape[0]):
        shapes = tuple(tuple(int(d) for d in s) for s in input_shape)
        if any(len(s) < 2 for s in shapes) or len({s[0] for s in shapes}) != 1:
            raise ValueError(f"{where}: each input shape needs a batch axis and a feature axis, with one batch "
                             f"size, got {list(shapes)}")
        width = sum(math.prod(s[1:]) for s in shapes)
        return (shapes[0][0], width), (type(input_shape).__name__, shapes)
    return tuple(int(s) for s in input_shape), None


def _split_inputs(apply_fn, parts):
    """``apply_fn`` on the joined input of `_joined`: split back into the inputs, in their container."""
    container, shapes = parts
    cuts = np.cumsum([0] + [math.prod(s[1:]) for s in shapes])

    def fn(params, x):
        xs = [jnp.reshape(x[:, int(a):int(b)], (x.shape[0],) + s[1:]) for a, b, s in zip(cuts[:-1], cuts[1:], shapes)]
        return apply_fn(params, list(xs) if container == "list" else tuple(xs))

    return fn


def _describe(x, parts) -> str:
    return str(tuple(jnp.shape(x))) if parts is None else str([s for s in parts[1]])


def _entering(program, interp: Interpreter, x):
    """The input where it enters the network: one array, or several stacked along a position axis."""
    values = evaluate_data(program, interp.kind, jnp.asarray(x), interp.frontier)
    if not interp.stacked:
        return values[0]
    # each value in canonical layout (batch first, channels last), stacked along a new axis after the batch
    return jnp.stack([jnp.moveaxis(v, interp.layout, (0, -1)) for v in values], axis=1)


def _dry_run(interp: Interpreter, dtype) -> bool:
    """Run the interpreter on abstract values (errors surface now, every spatial layer is recorded for
    `Interpreter.needs_full`); whether the kernel is symmetric."""
    found = {}
    d_shape = tuple(interp.program.avals[interp.frontier[0]].shape)
    channels = d_shape[interp.in_roles.index("f")]

    def run(d):  # the input in canonical layout, with all pairs of positions
        k, symmetric = interp.run(_input_kernel(d, None, bool(interp.in_spatial) or interp.stacked, True))
        found["symmetric"] = symmetric
        return k.nngp

    positions = ((len(interp.frontier),) if interp.stacked else ()) + interp.in_spatial
    jax.eval_shape(run, jax.ShapeDtypeStruct((2,) + positions + (channels,), dtype))
    return found["symmetric"]
