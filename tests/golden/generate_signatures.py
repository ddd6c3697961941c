"""Write tests/golden/api/nt_signatures.json: every public name of neural-tangents 0.6.5 and its call signature.

Run in the oracle environment (``bash scripts/make_golden.sh``); ``tests/test_nt_namespace.py`` checks that
``smnngp.nt`` has each name with the same parameters, order, kinds and defaults, apart from the differences it
lists (each documented in docs/neural-tangents.md).
"""

import enum
import inspect
import json
import os
import warnings

warnings.filterwarnings("ignore")

import neural_tangents as nt  # noqa: E402
from neural_tangents import predict, stax  # noqa: E402


def describe(obj):
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return {"kind": "enum", "members": {m.name: m.value for m in obj}}
    if inspect.isclass(obj):
        return {"kind": "class"}
    if not callable(obj):
        return {"kind": "object"}
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return {"kind": "callable"}
    params = []
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        if default is not None and default.startswith("<function"):
            default = "<function>"  # no memory addresses: the file must not change between runs
        params.append([p.name, p.kind.name, default])
    return {"kind": "function", "params": params}


out = {}
for prefix, module in (("", nt), ("stax.", stax), ("predict.", predict)):
    names = [n for n in dir(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        out[prefix + name] = describe(obj)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api", "nt_signatures.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
print(f"wrote {len(out)} public names of neural-tangents {nt.__version__} to {path}")
