"""Every notebook in notebooks/ runs top to bottom without an error, fast.

Executed with nbclient on the ``python3`` kernel; jupyter_client starts a kernelspec whose
command is ``python`` with this interpreter (``sys.executable``), so the notebooks import
the paraplan installed in the test's environment (checked below). Budget: all notebooks
together in under 60 s on 2 CPU cores (about 20 s measured on the development machine).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT_S = 120
TOTAL_BUDGET_S = 60.0
"""All notebooks together, seconds (kernel start-up included)."""

elapsed_s: dict[str, float] = {}


def execute(nb, cwd: Path) -> None:
    """Run ``nb`` in place on a fresh python3 kernel; raises CellExecutionError on error."""
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()


def test_notebooks_exist():
    names = [p.name for p in PATHS]
    assert names == ["01_quickstart.ipynb", "02_what_if.ipynb", "03_heterogeneous.ipynb"]


def test_kernel_is_this_interpreter(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import sys, paraplan\nprint(sys.executable)\nprint(paraplan.__file__)"))
    execute(nb, tmp_path)
    out = "".join(o.get("text", "") for o in nb.cells[0].outputs).split("\n")
    assert os.path.realpath(out[0]) == os.path.realpath(sys.executable)
    import paraplan

    assert os.path.realpath(out[1]) == os.path.realpath(paraplan.__file__)


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs_without_error(path):
    nb = nbformat.read(path, as_version=4)
    saved = [c for c in nb.cells if c.cell_type == "code"]
    assert saved and all(c.execution_count for c in saved), (
        f"{path.name}: commit the notebook with its outputs (every code cell executed)")
    start = time.perf_counter()
    execute(nb, path.parent)  # CellExecutionError names the cell and the traceback
    elapsed_s[path.name] = time.perf_counter() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors


def test_notebooks_run_within_budget():
    if len(elapsed_s) != len(PATHS):
        pytest.skip("needs every notebook to have run in this session")
    total = sum(elapsed_s.values())
    detail = ", ".join(f"{k}: {v:.1f} s" for k, v in elapsed_s.items())
    print(f"\nnotebooks executed in {total:.1f} s ({detail})")
    assert total < TOTAL_BUDGET_S, detail
