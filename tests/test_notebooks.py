"""Execute every notebook in notebooks/ in its fast mode and fail on the first cell that raises.

Each notebook runs from a temporary copy (its outputs are never written back) in a
fresh kernel with ``SMNNGP_FAST=1`` and the non-interactive Agg matplotlib backend.
The kernel is always this interpreter (``sys.executable``): a kernelspec pointing at
it is written into a temporary directory, so the test works in a fresh virtual
environment where no 'python3' kernelspec, or a foreign one, is installed.

Marked ``slow``: the default run builds the documentation site (``tests/test_docs_site.py``), which executes the
same notebooks in fast mode and fails on a cell that raises; this file runs them one per test, which is handy when
one breaks: ``python -m pytest -m slow tests/test_notebooks.py``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# registered data sets a notebook reads (the others generate their data or use scikit-learn's bundled digits)
NOTEBOOK_DATA = {"06_cascaded_tanks.ipynb": ("cascaded-tanks",)}
KERNEL_NAME = "smnngp-test-python3"
CELL_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec directory holding one spec that launches ``sys.executable -m ipykernel_launcher``."""
    kernels = tmp_path_factory.mktemp("jupyter") / "kernels"
    write_kernel_spec(str(kernels / KERNEL_NAME), overrides={"display_name": f"smnngp tests ({sys.executable})"})
    return kernels


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SMNNGP_FAST"] = "1"
    env["MPLBACKEND"] = "Agg"
    # The repository root first, so the notebooks import this checkout even when it is not installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _failing_cell(nb) -> tuple[int, str]:
    """(index among code cells, source) of the first cell with an error output."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code_cells):
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            return i, cell.source
    return -1, ""


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.needs_data(*NOTEBOOK_DATA.get(p.name, ())))
                                  for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_dir: Path, tmp_path: Path):
    copy = tmp_path / path.name
    shutil.copyfile(path, copy)
    nb = nbformat.read(copy, as_version=4)
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    client = NotebookClient(
        nb,
        km=km,
        kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        # cleanup_kc: shut the kernel down afterwards although the manager was passed in.
        client.execute(env=_kernel_env(), cleanup_kc=True)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        index, source = _failing_cell(nb)
        where = f"code cell {index}" if index >= 0 else "a cell"
        pytest.fail(f"{path.name}: {where} failed\n--- source ---\n{source}\n--- error ---\n{err}", pytrace=False)
