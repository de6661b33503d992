"""Run every notebook here top to bottom and save it with its outputs: `python notebooks/execute.py`
(or name notebooks). The test suite executes the same notebooks without saving them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
#: Seconds a single cell may run before the execution fails.
CELL_TIMEOUT_S = 120


def execute(path: Path) -> tuple[nbformat.NotebookNode, float]:
    """The notebook at `path` executed in its own folder (raises on any cell error); and the seconds."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, time.perf_counter() - start


def main(names: list[str]) -> None:
    paths = [HERE / n for n in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        nb, seconds = execute(path)
        for cell in nb.cells:               # reproducible files: no execution timestamps
            cell.get("metadata", {}).pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: {seconds:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
