"""Write tests/golden/<case>.npz with neural-tangents 0.6.5 (run in the oracle environment).

Usage (from the project root): ``bash scripts/make_golden.sh [module ...]``, e.g.
``bash scripts/make_golden.sh cases_attention`` regenerates that module's cases only. Never imported by the tests.

Every ``tests/golden/cases*.py`` module defines ``build_cases(stax, jnp)`` (see `golden_io` for the format of a
case); the same spec is run by neural-tangents here and by smnngp in ``tests/test_golden.py``.
"""

import os
import sys
import warnings

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from neural_tangents import stax  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from golden_io import case_inputs, case_modules, flatten_kwargs, unpack_case  # noqa: E402

warnings.filterwarnings("ignore")

out_dir = os.path.dirname(os.path.abspath(__file__))
wanted = sys.argv[1:] or None
total = 0
for module in case_modules(wanted):
    for name, spec in module.build_cases(stax, jnp).items():
        layer, shapes, opts = unpack_case(spec)
        x1, x2, call_kwargs = case_inputs(name, shapes, opts)
        kernel_fn = layer[2]
        jkw = {k: jax.tree_util.tree_map(jnp.asarray, v) for k, v in call_kwargs.items()}
        k = kernel_fn(jnp.asarray(x1), None if x2 is None else jnp.asarray(x2), None, **jkw)
        if k.is_reversed:
            # neural-tangents may hand back a full-spatial kernel with its spatial axes in reverse order (after an
            # odd number of convolutions); fixtures hold them in the inputs' order, as smnngp returns them.
            k = k.reverse()
        arrays = dict(x1=x1, nngp=np.asarray(k.nngp), ntk=np.asarray(k.ntk))
        if opts.get("covs"):
            arrays["cov1"] = np.asarray(k.cov1)
            if k.cov2 is not None:
                arrays["cov2"] = np.asarray(k.cov2)
        if x2 is not None:
            arrays["x2"] = x2
        arrays.update(flatten_kwargs(call_kwargs))
        path = os.path.join(out_dir, f"{name}.npz")
        if os.path.exists(path):  # leave an unchanged fixture untouched (no binary churn in git)
            with np.load(path) as old:
                same = set(old.files) == set(arrays) and all(np.array_equal(old[f], arrays[f]) for f in arrays)
            if same:
                total += 1
                continue
        np.savez(path, **arrays)
        total += 1
        print(f"{module.__name__}.{name}: nngp {arrays['nngp'].shape}")
print(f"wrote {total} fixtures to {out_dir} with neural-tangents", __import__("neural_tangents").__version__)
