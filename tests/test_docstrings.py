"""Every public function and class of ``smnngp``, ``finite`` and ``samplers`` documents its arguments and returns.

Public means: named in the ``__all__`` of the package or of one of its modules, and defined in one of the three
packages (re-exports of other libraries are theirs to document). The rules, checked per name:

* a non-empty docstring of its own (not the signature ``NamedTuple``/dataclass generate);
* every parameter named in it as a word (``x``, ``x:`` or ````x````; ``*args``/``**kwargs`` excepted): for a
  class, the parameters of its ``__init__`` or, for a ``NamedTuple``/dataclass, its fields, in the class or
  ``__init__`` docstring;
* for a function whose return annotation is not ``None``, a statement of what it returns (the word "return"
  or "yield" in any form).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

PACKAGES = ("smnngp", "finite", "samplers")


def _public_names():
    seen, out = set(), []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        # Every module, nested packages included (smnngp.stax, smnngp.empirical, smnngp.predict are packages).
        modules = [pkg] + [importlib.import_module(m.name)
                           for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg_name}.")]
        for mod in modules:
            for name in getattr(mod, "__all__", ()):
                obj = getattr(mod, name)
                if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if getattr(obj, "__module__", "").split(".")[0] not in PACKAGES or id(obj) in seen:
                    continue
                seen.add(id(obj))
                out.append((f"{obj.__module__}.{obj.__qualname__}", obj))
    return sorted(out, key=lambda t: t[0])


def _parameters(obj) -> list[str]:
    if inspect.isclass(obj):
        if isinstance(getattr(obj, "_fields", None), tuple):
            return list(obj._fields)
        if hasattr(obj, "__dataclass_fields__"):
            return list(obj.__dataclass_fields__)
        if "__init__" not in obj.__dict__:
            return []
        target = obj.__init__
    else:
        target = obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [n for n, p in sig.parameters.items()
            if n not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _docstring(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and doc.startswith(obj.__name__ + "("):
        doc = ""  # the signature NamedTuple and dataclass write when a class has no docstring of its own
    if inspect.isclass(obj) and "__init__" in obj.__dict__:
        doc += "\n" + (inspect.getdoc(obj.__init__) or "")
    return doc


NAMES = _public_names()


def test_the_enumeration_finds_the_library():
    names = {n for n, _ in NAMES}
    assert len(NAMES) > 250
    assert {"smnngp.stax.linear.Dense", "smnngp.stax.attention.GlobalSelfAttention", "finite.masked.masked_mlp",
            "samplers.driver.split_rhat"} <= names


@pytest.mark.parametrize("name,obj", NAMES, ids=[n for n, _ in NAMES])
def test_public_name_documents_arguments_and_returns(name, obj):
    doc = _docstring(obj)
    assert doc.strip(), f"{name} has no docstring"
    missing = [p for p in _parameters(obj) if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_])", doc)]
    assert not missing, f"{name}: the docstring does not name the argument(s) {missing}"
    if inspect.isfunction(obj):
        ann = inspect.signature(obj).return_annotation
        if ann not in (None, "None"):
            assert re.search(r"return|yield", doc, re.IGNORECASE), f"{name}: the docstring does not say what it returns"
