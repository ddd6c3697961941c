"""`import smnngp.nt as nt`: neural-tangents 0.6.5's public names and call signatures.

tests/golden/api/nt_signatures.json lists every public name of neural-tangents 0.6.5 (top level, ``stax``,
``predict``) with its parameters, written in the oracle environment by tests/golden/generate_signatures.py. Each
name must exist in ``smnngp.nt`` with the same parameter names, order, kinds and defaults; smnngp may add
parameters after neural-tangents' own (with defaults). The exceptions are listed here with their reasons, and
docs/neural-tangents.md documents each.
"""

import enum
import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

import smnngp.nt as nt

SPEC = json.loads((Path(__file__).parent / "golden" / "api" / "nt_signatures.json").read_text())

# neural-tangents names smnngp does not provide, with the reason (docs/neural-tangents.md, "Not provided").
NOT_PROVIDED: dict[str, str] = {}  # every name of neural-tangents 0.6.5 is provided
# neural-tangents' private (underscore) tuning arguments of the empirical kernels are not part of the API.
PRIVATE = re.compile(r"^_")


def resolve(name):
    obj = nt
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def normalise_default(text):
    """Defaults as comparable values: numbers by value, enums and callables by kind, the rest verbatim."""
    if text is None:
        return None
    if text.startswith("<function"):
        return "<callable>"
    m = re.match(r"^<?(?:\w+\.)*(\w+)(?::.*)?>?$", text)
    if m and "." in text and not text[0].isdigit():  # Precision.HIGHEST, <Enum.NAME: 1>
        return m.group(1)
    try:
        return float(text)
    except ValueError:
        return text


def our_params(obj):
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)]
            for p in inspect.signature(obj).parameters.values()]


def test_spec_covers_neural_tangents_api():
    assert len(SPEC) >= 70
    assert {"stax.serial", "predict.gradient_descent_mse_ensemble", "empirical_ntk_fn", "batch"} <= set(SPEC)


@pytest.mark.parametrize("name", sorted(SPEC))
def test_name_and_signature_match_neural_tangents(name):
    spec = SPEC[name]
    if name in NOT_PROVIDED:
        assert not hasattr(nt.stax if name.startswith("stax.") else nt, name.split(".")[-1]), \
            f"{name} exists now: remove it from NOT_PROVIDED and from the docs' list"
        pytest.skip(NOT_PROVIDED[name])
    obj = resolve(name)
    if spec["kind"] == "enum":
        assert isinstance(obj, type) and issubclass(obj, enum.Enum)
        assert {m.name: m.value for m in obj} == spec["members"]
        return
    if spec["kind"] != "function":
        return
    theirs = [p for p in spec["params"] if not PRIVATE.match(p[0])]
    ours = our_params(obj)
    head, extra = ours[: len(theirs)], ours[len(theirs):]
    assert [p[:2] for p in head] == [p[:2] for p in theirs], f"{name}: parameters differ from neural-tangents'"
    for (pname, _, mine), (_, _, their) in zip(head, theirs):
        a, b = normalise_default(mine), normalise_default(their)
        if isinstance(a, float) and isinstance(b, float):
            assert np.isclose(a, b), f"{name}: default of {pname} is {mine}, neural-tangents' is {their}"
        else:
            assert a == b, f"{name}: default of {pname} is {mine}, neural-tangents' is {their}"
    for pname, kind, default in extra:  # smnngp's additions come last, optional
        assert default is not None or kind in ("VAR_KEYWORD", "VAR_POSITIONAL"), \
            f"{name}: added parameter {pname} must have a default"


def test_namespace_is_smnngp_itself():
    import smnngp.empirical
    import smnngp.stax

    assert nt.stax is smnngp.stax
    assert nt.empirical_ntk_fn is smnngp.empirical.empirical_ntk_fn
