"""`kvsim paper` wall time: this checkout against an old commit, side by side in one run.

Covers: the whole `kvsim paper` command (every grid of the vLLM paper's experiments, written report).
Scenario: the paper at `--duration` s traces (default 3600, the paper's and the command's default) with
`--workers` processes, first with the old commit (`--old`, default aa1d257, the main this work started
from; in a temporary `git worktree`), then with this checkout (`--new-first`: the other way round; on
this machine the second of two back-to-back runs was 4-14% the slower, whichever tree it was: measured
2 December 2026, so an A/B should be run both ways); prints each wall time and the load
average (the machine may be shared: say so with the figures), and checks that the two reports'
capacity, breakdown, block-size, swap, differences and variants tables are the same file for file (the
curves table differs only where a point stopped above 1 s/token: "> 1").

    python bench/paper_speed.py --duration 300            # minutes
    python bench/paper_speed.py --skip-old                # this checkout only, one-hour traces
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAME = ("capacity", "breakdown", "block_size", "swap", "differences", "variants")


def run(tree: Path, out: Path, duration: float, workers: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvsim.cli.app", "paper", "-o", str(out), "--force",
                    "--duration", str(duration), "--workers", str(workers)], cwd=tree, env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of arrivals per run")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes")
    ap.add_argument("--old", default="aa1d257", help="the commit to compare against")
    ap.add_argument("--skip-old", action="store_true", help="time this checkout only")
    ap.add_argument("--new-first", action="store_true",
                    help="run this checkout before the old commit (the first of two runs is the faster here)")
    args = ap.parse_args()
    print(f"kvsim paper --duration {args.duration:g} --workers {args.workers}; {os.cpu_count()} cores, "
          f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        walls = {}

        def run_new() -> None:
            walls["new"] = run(ROOT, tmp / "new-report", args.duration, args.workers)
            print(f"new (this checkout): {walls['new']:.0f} s; load average now {os.getloadavg()[0]:.1f}", flush=True)

        if args.new_first:
            run_new()
        if not args.skip_old:
            old = tmp / "old"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
                           check=True, capture_output=True)
            try:
                walls["old"] = run(old, tmp / "old-report", args.duration, args.workers)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
            print(f"old ({args.old}): {walls['old']:.0f} s; load average now {os.getloadavg()[0]:.1f}", flush=True)
        if not args.new_first:
            run_new()
        if "old" in walls:
            print(f"speed-up: {walls['old'] / walls['new']:.2f}x")
            for name in SAME:
                a, b = tmp / "old-report/data" / f"{name}.csv", tmp / "new-report/data" / f"{name}.csv"
                if a.exists() or b.exists():
                    same = a.exists() and b.exists() and a.read_bytes() == b.read_bytes()
                    print(f"  data/{name}.csv: {'same' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
