"""The format of golden-fixture cases, shared by the generator (oracle environment) and the tests.

Imports neither library. A case module ``tests/golden/cases*.py`` defines ``build_cases(stax, jnp)`` returning
``{name: spec}`` where ``spec`` is ``(layer, (x1_shape, x2_shape or None))`` or ``(layer, shapes, opts)`` with
``opts`` a dict of:

* ``"kwargs"``: static keyword arguments of ``kernel_fn`` (``diagonal_spatial=True``, ``mask_constant=...``);
* ``"inputs"``: ``inputs(rng, shapes) -> (x1, x2, array_kwargs)``, inputs made by the case itself (masked entries,
  graphs) and array-valued keyword arguments of ``kernel_fn`` (``pattern=(p1, p2)``); an array keyword is an
  array, ``None`` or a tuple of those;
* ``"tol"``: ``(float64 tolerance, float32 tolerance)`` when the layer's documented error is larger than the
  default (quadrature layers);
* ``"covs": True``: also store and compare the `Kernel`'s ``cov1`` / ``cov2`` (``kernel_fn`` called with
  ``get=None``);
* ``"f32": False``: skip the float32 comparison (a case whose conditioning float32 cannot meet).

The fixture ``<name>.npz`` stores ``x1``, ``x2`` (when given), ``nngp``, ``ntk`` and each array keyword as
``kw__<name>`` (an array), ``kw__<name>__<i>`` (element ``i`` of a tuple; ``kwn__<name>`` holds its length,
``kwnone__<name>__<i>`` marks a ``None`` element) or ``kwnone__<name>``.
"""

import glob
import importlib
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def case_modules(wanted=None):
    """The case modules ``cases.py``, ``cases_*.py`` (only those named in ``wanted`` when given)."""
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "cases*.py")))
    if wanted:
        unknown = set(wanted) - set(names)
        if unknown:
            raise SystemExit(f"unknown case modules {sorted(unknown)}; have {names}")
        names = [n for n in names if n in wanted]
    return [importlib.import_module(n) for n in names]


def all_cases(stax, jnp):
    cases = {}
    for module in case_modules():
        for name, spec in module.build_cases(stax, jnp).items():
            if name in cases:
                raise ValueError(f"golden case {name!r} is defined twice (second time in {module.__name__})")
            cases[name] = spec
    return cases


def unpack_case(spec):
    layer, shapes, *rest = spec
    return layer, shapes, (rest[0] if rest else {})


def make_inputs(name, shapes):
    """Deterministic inputs for a case (independent of either library)."""
    rng = case_rng(name)
    s1, s2 = shapes
    x1 = rng.normal(size=s1)
    x2 = None if s2 is None else rng.normal(size=s2)
    return x1, x2


def case_rng(name):
    return np.random.RandomState(sum(ord(ch) for ch in name))


def case_inputs(name, shapes, opts):
    """``(x1, x2, kernel_fn keyword arguments)`` of a case, as the generator makes them."""
    kwargs = dict(opts.get("kwargs", {}))
    if "inputs" in opts:
        x1, x2, array_kwargs = opts["inputs"](case_rng(name), shapes)
        kwargs.update(array_kwargs)
    else:
        x1, x2 = make_inputs(name, shapes)
    return x1, x2, kwargs


def flatten_kwargs(kwargs):
    """Array keywords as npz entries (see the module docstring); static ones are not stored."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, tuple):
            out[f"kwn__{key}"] = np.asarray(len(value))
            for i, v in enumerate(value):
                if v is None:
                    out[f"kwnone__{key}__{i}"] = np.asarray(0)
                else:
                    out[f"kw__{key}__{i}"] = np.asarray(v)
        elif value is None:
            out[f"kwnone__{key}"] = np.asarray(0)
        elif isinstance(value, np.ndarray) or hasattr(value, "shape"):
            out[f"kw__{key}"] = np.asarray(value)
    return out


def load_kwargs(gold, opts):
    """The keyword arguments of ``kernel_fn`` for a stored fixture: static ones from ``opts``, arrays from it."""
    kwargs = dict(opts.get("kwargs", {}))
    files = set(gold.files)
    for f in files:
        if f.startswith("kwn__"):
            key = f[len("kwn__"):]
            n = int(gold[f])
            kwargs[key] = tuple(None if f"kwnone__{key}__{i}" in files else gold[f"kw__{key}__{i}"] for i in range(n))
        elif f.startswith("kwnone__") and f.count("__") == 1:
            kwargs[f[len("kwnone__"):]] = None
        elif f.startswith("kw__") and f.count("__") == 1:
            kwargs[f[len("kw__"):]] = gold[f]
    return kwargs
