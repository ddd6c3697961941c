"""Write tests/golden/masking_apply/<net>.npz: neural-tangents 0.6.5's finite networks on masked inputs.

Run in the oracle environment (``bash scripts/make_golden.sh`` runs it; never imported by the tests). Each file
holds the inputs, the parameter leaves (in tree order), the output values, their mask and ``unmask_fn``'s output.
"""

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402
from neural_tangents import stax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from masking_apply_nets import PAD, inputs, nets  # noqa: E402

out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "masking_apply")
os.makedirs(out_dir, exist_ok=True)
for name, (layer, shape) in nets(stax).items():
    init_fn, apply_fn, _ = layer
    x = inputs(name, shape)
    _, params = init_fn(jax.random.PRNGKey(3), shape)
    out = apply_fn(params, x, mask_constant=PAD)
    plain = stax.unmask_fn(apply_fn)(params, x, mask_constant=PAD)
    leaves = [np.asarray(p) for p in jax.tree_util.tree_leaves(params)]
    arrays = {"x": x, "value": np.asarray(out.masked_value), "mask": np.asarray(out.mask), "plain": np.asarray(plain)}
    arrays.update({f"leaf{i}": leaf for i, leaf in enumerate(leaves)})
    np.savez(os.path.join(out_dir, f"{name}.npz"), **arrays)
    print(name, arrays["value"].shape, len(leaves), "leaves")
