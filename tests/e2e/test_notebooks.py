"""The notebooks run top to bottom (nbclient), fail on any cell error, and are committed with outputs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ("block_size.ipynb", "allocators.ipynb", "capacity.ipynb", "hybrid_models.ipynb", "disaggregation.ipynb",
         "fleet.ipynb")


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_without_errors(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # raises CellExecutionError on the first failing cell
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                  for o in c.outputs)
    assert figures >= 1


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_with_outputs_and_uses_the_public_api(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), "every code cell has its output saved"
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    source = "\n".join(c.source for c in code)
    assert "kvsim." in source and "from kvsim." not in source and "import kvsim." not in source
    assert nb.cells[0].cell_type == "markdown" and "**Covers:**" in nb.cells[0].source
