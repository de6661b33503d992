"""`make test`'s wall time on this tree beside an older commit's, in one run: each tree is a fresh
checkout (git worktree) sharing this checkout's .venv, and each runs its own Makefile's `test` recipe
(the set-up, which `make test` does first when .venv is missing, is timed apart once, with --setup).

    python bench/test_suite_time.py --old 77beaf1            # one run each, old first
    python bench/test_suite_time.py --old 77beaf1 --repeats 2 --new-first
    python bench/test_suite_time.py --setup                  # a fresh clone's `make install`, timed

Prints per run: tree, wall seconds, CPU seconds of the process tree, and pytest's closing line. Quote
it from a quiet machine: a second load on 2 cores stretches the parallel suite more than the serial one.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"


def test_command(tree: Path) -> list[str]:
    """The tree's `make test` recipe with $(BIN) as this checkout's venv."""
    text = (tree / "Makefile").read_text()
    recipe = re.search(r"^test: .*\n\t(.*)$", text, re.M).group(1)
    return recipe.replace("$(BIN)", str(VENV_BIN)).split()


def run_suite(tree: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the children, pytest's last line)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(test_command(tree), cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [l for l in (done.stdout + done.stderr).splitlines() if re.search(r"\d+ (passed|failed)", l)]
    return wall, cpu, (lines[-1].strip() if lines else f"exit {done.returncode}")


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(where), rev], cwd=ROOT, check=True)
    return where


def setup_time() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kvsim-setup-"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "clone")], check=True)
        t0 = time.perf_counter()
        done = subprocess.run(["make", "install"], cwd=tmp / "clone", capture_output=True, text=True)
        print(f"make install in a fresh clone: {time.perf_counter() - t0:.0f} s (exit {done.returncode})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the older commit to time beside this tree")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--new-first", action="store_true")
    ap.add_argument("--setup", action="store_true", help="time a fresh clone's `make install` instead")
    args = ap.parse_args()
    if args.setup:
        setup_time()
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="kvsim-suite-"))
    trees = {"this tree": checkout("HEAD", tmp / "new")}
    if args.old:
        trees[args.old] = checkout(args.old, tmp / "old")
    order = list(trees) if args.new_first or not args.old else [args.old, "this tree"]
    try:
        for _ in range(args.repeats):
            for name in order:
                wall, cpu, last = run_suite(trees[name])
                print(f"{name:>12}: wall {wall:6.1f} s, CPU {cpu:6.1f} s  {last}", flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
