"""The house's import rules, read from the source with `ast` (nothing is imported or run).

* Packages import one way: experiments -> samplers -> finite -> smnngp; no module imports a package above its own.
* No experiment (a module of `experiments/` with a ``DESCRIPTION``, which `python -m experiments` lists) imports
  another experiment: what two experiments share is library code, or a shared experiment helper without a
  ``DESCRIPTION`` (`experiments.data`, `metrics`, `report`, `progress`, `shifts`, `paper_tables`, and `tanks`, the
  Cascaded Tanks protocol of the two tanks experiments).
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ORDER = ("smnngp", "finite", "samplers", "experiments")  # each may import only those before it (and itself)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in ``path``, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # `from experiments import mbnn_uci` names a module through its package
            out += [(node.lineno, f"{mod}.{alias.name}") for alias in node.names]
    return out


def defines_description(path: Path) -> bool:
    """Whether the module assigns ``DESCRIPTION`` at top level (an experiment of `python -m experiments`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DESCRIPTION" for t in node.targets)
               for node in tree.body)


def modules_of(package: str):
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", ORDER)
def test_packages_import_only_downward(package):
    allowed = set(ORDER[: ORDER.index(package) + 1])
    bad = [f"{p.relative_to(REPO)}:{line} imports {mod}" for p in modules_of(package)
           for line, mod in imported_modules(p) if mod.split(".")[0] in ORDER and mod.split(".")[0] not in allowed]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_experiment_imports_another():
    experiments = {p.stem for p in (REPO / "experiments").glob("*.py") if defines_description(p)}
    assert {"mbnn_uci", "svtp", "tanks_simulation"} <= experiments and "metrics" not in experiments
    bad = []
    for path in (REPO / "experiments").glob("*.py"):
        for line, mod in imported_modules(path):
            parts = mod.split(".")
            if parts[0] == "experiments" and len(parts) > 1 and parts[1] in experiments and parts[1] != path.stem:
                bad.append(f"experiments/{path.name}:{line} imports {mod}")
    assert not bad, "experiments importing other experiments (move what they share into the library):\n" + \
        "\n".join(bad)


def test_the_checks_see_imports():
    """The parser finds each form of import, so the tests above cannot pass by seeing none."""
    names = {mod for _, mod in imported_modules(REPO / "experiments" / "mbnn_uci.py")}
    assert "experiments.metrics" in names and "samplers.mbnn" in names
    # the __main__ dispatcher imports every experiment: the package-level rule sees those imports
    main = {mod for _, mod in imported_modules(REPO / "experiments" / "__main__.py")}
    assert any(m.startswith("experiments.") for m in main) or "importlib" in main
