"""The `kvsim paper` runs that cost the most, one by one: this checkout against an old commit, paired.

Covers: single sweep points of the paper's grids (`kvsim.planning.sweep.point.run_point`) at one-hour
traces, one kind of run each: the Orca baselines (contiguous max / pow2 / oracle, continuous
batching), FasterTransformer (static batching), vLLM at block sizes 1, 2 and 16, recompute against swap
at block size 1, and the `vllm-v1` curve (prefix caching, chunked steps), all at the paper's table rates
(OPT-13B on one A100-40GB with 12 GiB of KV: ShareGPT-like at 2 req/s, Alpaca-like at 30 req/s), where
queues grow and preemptions churn. Each point runs in a fresh process of each tree, old then new; the
table gives CPU seconds (user + system) and their ratio, and checks that the two rows are the same
(every column but the run's own wall time).

    python bench/paper_points.py --old 783b180          # about 5 minutes
    python bench/paper_points.py --old 783b180 --only contiguous

Where the one-hour `kvsim paper` spends its time: `bench/paper_speed.py` runs the whole command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPT13B = {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1, "kv_gib": 12, "duration_s": 3600.0, "seed": 0,
          "engine_profile": "vllm-2023"}
ALPACA, SHAREGPT = {"preset": "alpaca", "rate": 30}, {"preset": "sharegpt", "rate": 2.0}
POINTS = {
    "contiguous max, Alpaca": {**ALPACA, "allocator": "contiguous", "reserve": "max"},
    "contiguous pow2, Alpaca": {**ALPACA, "allocator": "contiguous", "reserve": "pow2"},
    "contiguous oracle, Alpaca": {**ALPACA, "allocator": "contiguous", "reserve": "oracle"},
    "contiguous oracle, ShareGPT": {**SHAREGPT, "allocator": "contiguous", "reserve": "oracle"},
    "static, Alpaca": {**ALPACA, "allocator": "contiguous", "reserve": "max", "batching": "static"},
    "static, ShareGPT": {**SHAREGPT, "allocator": "contiguous", "reserve": "max", "batching": "static"},
    "paged block 1, Alpaca": {**ALPACA, "allocator": "paged", "block_size": 1},
    "paged block 2, Alpaca": {**ALPACA, "allocator": "paged", "block_size": 2},
    "paged block 1, swap, ShareGPT 3": {"preset": "sharegpt", "rate": 3.0, "allocator": "paged", "block_size": 1,
                                        "preemption": "swap"},
    "paged block 16, Alpaca": {**ALPACA, "allocator": "paged"},
    "paged vllm-v1, Alpaca": {**ALPACA, "allocator": "paged", "engine_profile": "vllm-v1"},
}
CHILD = """
import json, sys
from kvsim.planning.sweep.point import run_point
row = run_point(json.loads(sys.argv[1]))
print(json.dumps({k: v for k, v in row.items() if k not in ("wall_s", "sim_wall_s")}, sort_keys=True, default=str))
"""


def timed(tree: Path, point: dict) -> tuple[float, str]:
    """(CPU seconds, the row as JSON) of `point` run in a fresh process of `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(point)], cwd=tree, check=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="783b180", help="commit to compare with (the main this work started from)")
    ap.add_argument("--only", default="", help="run only the points whose name contains this")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old], check=True,
                       capture_output=True)
        try:
            total = [0.0, 0.0]
            print(f"{'point (OPT-13B, one hour)':<36} {args.old:>9} {'this':>9} {'ratio':>6}  same row")
            for name, flags in POINTS.items():
                if args.only not in name:
                    continue
                point = {**OPT13B, **flags}
                (cpu_old, row_old), (cpu_new, row_new) = timed(old, point), timed(ROOT, point)
                total[0] += cpu_old
                total[1] += cpu_new
                print(f"{name:<36} {cpu_old:8.1f}s {cpu_new:8.1f}s {cpu_old / cpu_new:5.2f}x  "
                      f"{'yes' if row_old == row_new else 'NO'}", flush=True)
            print(f"{'all':<36} {total[0]:8.1f}s {total[1]:8.1f}s {total[0] / max(total[1], 1e-9):5.2f}x")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=True)


if __name__ == "__main__":
    main()
