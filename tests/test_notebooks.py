"""Every notebook in notebooks/ runs top to bottom without an error, fast.

Executed with nbclient on the ``python3`` kernel; jupyter_client starts a kernelspec whose
command is ``python`` with this interpreter (``sys.executable``), so the notebooks import
the paraplan installed in the test's environment (checked below). No wall-clock assertion
(the suite runs on loaded 2-core machines): the three notebooks take about 65 s there, most of
it 03_heterogeneous's ILP searches (50 s measured on 2026-11-24 before and after the module
split, run back to back).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT_S = 120


def execute(nb, cwd: Path) -> None:
    """Run ``nb`` in place on a fresh python3 kernel; raises CellExecutionError on error."""
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()


def test_notebooks_exist():
    names = [p.name for p in PATHS]
    assert names == ["01_quickstart.ipynb", "02_what_if.ipynb", "03_heterogeneous.ipynb",
                     "04_fleet_planning.ipynb"]


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
def test_notebook_runs_without_error(path, monkeypatch):
    # 04_fleet_planning runs its 4-job grid cut here (the kernel inherits the environment).
    monkeypatch.setenv("PARAPLAN_QUICK", "1")
    nb = nbformat.read(path, as_version=4)
    saved = [c for c in nb.cells if c.cell_type == "code"]
    assert saved and all(c.execution_count for c in saved), (
        f"{path.name}: commit the notebook with its outputs (every code cell executed)")
    execute(nb, path.parent)  # CellExecutionError names the cell and the traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors

