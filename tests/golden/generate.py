"""Write tests/golden/<case>.npz with neural-tangents 0.6.5 (run in the oracle environment).

Usage (from the project root): ``bash scripts/make_golden.sh``. Never imported by the tests.
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
from cases import build_cases, make_inputs  # noqa: E402

warnings.filterwarnings("ignore")

out_dir = os.path.dirname(os.path.abspath(__file__))
cases = build_cases(stax, jnp)
for name, (layer, shapes) in cases.items():
    kernel_fn = layer[2]
    x1, x2 = make_inputs(name, shapes)
    k = kernel_fn(jnp.asarray(x1), None if x2 is None else jnp.asarray(x2), ("nngp", "ntk"))
    arrays = dict(x1=x1, nngp=np.asarray(k.nngp), ntk=np.asarray(k.ntk))
    if x2 is not None:
        arrays["x2"] = x2
    np.savez(os.path.join(out_dir, f"{name}.npz"), **arrays)
    print(f"{name}: nngp {arrays['nngp'].shape}")
print(f"wrote {len(cases)} fixtures to {out_dir} with neural-tangents", __import__("neural_tangents").__version__)
