"""Run notebooks here top to bottom and save them with their outputs:
`python notebooks/execute.py NAME.ipynb ...`, or `--all` for every one. Without arguments it lists the
notebooks and rewrites nothing. The test suite executes the same notebooks without saving them."""

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


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0].rstrip(":"),
                                 epilog="Without arguments: list the notebooks, change nothing.")
    ap.add_argument("names", nargs="*", help="notebooks to execute and save (file names in notebooks/)")
    ap.add_argument("--all", action="store_true", help="execute and save every notebook here")
    args = ap.parse_args(argv)
    every = sorted(HERE.glob("*.ipynb"))
    if not args.names and not args.all:
        print("notebooks (run with NAME.ipynb ... or --all to execute and save them):")
        print("\n".join(f"  {p.name}" for p in every))
        return 0
    paths = every if args.all else [HERE / n for n in args.names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        print(f"error: no such notebook in {HERE}: {', '.join(missing)}", file=sys.stderr)
        return 2
    for path in paths:
        nb, seconds = execute(path)
        for cell in nb.cells:               # reproducible files: no execution timestamps
            cell.get("metadata", {}).pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
