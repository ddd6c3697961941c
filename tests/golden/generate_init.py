"""Write tests/golden/init/params.npz: neural-tangents 0.6.5's initial parameters and finite outputs.

Run in the oracle environment (jax 0.4.23 + neural-tangents 0.6.5; ``bash scripts/make_golden.sh`` runs every
``generate_*.py``); never imported by the tests. For each network of ``init_nets.nets`` and each dtype of
``init_nets.DTYPES`` (float32 with ``jax_enable_x64`` off, float64 with it on, as a neural-tangents user gets them)
the file holds, under keys ``<name>__<dtype>__...``:

* ``leaf<i>``: the parameter leaves of ``init_fn(PRNGKey(seed), input_shape)`` in tree order (each array keeps its
  shape);
* ``out``: ``apply_fn(params, x, **init_nets.apply_kwargs(name))`` with ``x = init_nets.inputs(name, ...)``;

and ``meta`` (JSON) holds, under ``"<name>__<dtype>"``, the number of leaves, their nesting (``init_nets.describe``)
and ``init_fn``'s output shape.

jax 0.4.23 draws with ``jax_threefry_partitionable`` off (its default then; on by default from jax 0.5), so a
jax of today reproduces the same bits only with that flag set to False.
"""

import json
import os
import sys

import jax
import numpy as np
from neural_tangents import stax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from init_nets import DTYPES, apply_kwargs, describe, inputs, nets  # noqa: E402

jax.config.update("jax_threefry_partitionable", False)  # already jax 0.4.23's default; stated for the reader

arrays, meta = {}, {}
for dtype in DTYPES:
    jax.config.update("jax_enable_x64", dtype == "float64")
    for name, (layer, shape, seed) in nets(stax).items():
        init_fn, apply_fn, _ = layer
        out_shape, params = init_fn(jax.random.PRNGKey(seed), shape)
        x = inputs(name, shape, dtype)
        out = apply_fn(params, x, **apply_kwargs(name, jax))
        leaves = [np.asarray(p) for p in jax.tree_util.tree_leaves(params)]
        for leaf in leaves:
            if leaf.dtype != np.dtype(dtype):
                raise SystemExit(f"{name}: a leaf has dtype {leaf.dtype}, expected {dtype}")
        key = f"{name}__{dtype}__"
        arrays.update({f"{key}leaf{i}": leaf for i, leaf in enumerate(leaves)})
        arrays[f"{key}out"] = np.asarray(out)
        meta[f"{name}__{dtype}"] = {"n_leaves": len(leaves), "tree": describe(params),
                                    "out_shape": [int(n) for n in out_shape]}
        print(dtype, name, describe(params), [leaf.shape for leaf in leaves], np.asarray(out).shape)

arrays["meta"] = np.asarray(json.dumps(meta, sort_keys=True))
os.makedirs(os.path.join(HERE, "init"), exist_ok=True)
path = os.path.join(HERE, "init", "params.npz")
np.savez_compressed(path, **arrays)
print(path, os.path.getsize(path), "bytes")
