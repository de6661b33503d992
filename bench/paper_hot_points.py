"""The costliest groups of `kvsim paper`'s runs: this checkout against an old commit, paired, in CPU time.

Covers: static batching (the FasterTransformer curves: every setup, preset and rate, stopped above the
ceiling as the paper stops them) and OPT-13B's block-size sweeps at small blocks (1, 2, 4, 8 slots: the
ShareGPT and Alpaca sweeps and the recompute/swap study), under the paper's main engine profile.
Scenario: for each group, its points run in one process of the old commit (`--old`, in a temporary
`git worktree`) then in one of this checkout, so that load from anything else on the machine falls on
both alike; each process reports its CPU time (`resource.getrusage`: user + system) per point. Prints
per group the CPU seconds of both and the ratio, and checks that every row (wall times aside) is the
same: the speed-ups must not change an output.

    python bench/paper_hot_points.py                       # one-hour traces, against 87f6a15 (main before it)
    python bench/paper_hot_points.py --duration 600 --groups static,block1
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
GROUPS = ("static", "block1", "block2", "block4", "block8")


def points(group: str, duration: float) -> list[dict]:
    """The paper's points of `group` (as `kvsim.planning.paper.run_paper` queues them, main profile)."""
    from kvsim.planning.paper import CEILING_S_PER_TOKEN, FULL, SETUPS, STOP, engine_profiles
    from kvsim.planning.runs import SYSTEMS
    profile = engine_profiles()[0]
    extra = {"engine_profile": profile} if profile else {}
    out = []
    if group == "static":
        for setup in FULL.setups:
            for preset in ("sharegpt", "alpaca"):
                for rate in FULL.rates[(setup, preset)]:
                    p = {**SETUPS[setup], "preset": preset, "duration_s": duration, "seed": FULL.seed, **extra,
                         **SYSTEMS["static"], "rate": rate}
                    if rate != FULL.table_rate.get((setup, preset)):
                        p[STOP] = float(CEILING_S_PER_TOKEN)
                    out.append(p)
        return out
    bs = int(group.removeprefix("block"))
    base = {**SETUPS["OPT-13B"], "duration_s": duration, "seed": FULL.seed, **extra, "allocator": "paged",
            "block_size": bs}
    out += [{**base, "preset": p, "rate": r} for p, r in FULL.block_rate.items()]
    out += [{**base, "preset": "sharegpt", "rate": FULL.swap_rate, "preemption": m} for m in ("recompute", "swap")]
    return out


def worker() -> None:
    """Run the points read from stdin (JSON list) with the kvsim on PYTHONPATH; one JSON line each."""
    from kvsim.planning.sweep_point import run_point
    for point in json.loads(sys.stdin.read()):
        before = resource.getrusage(resource.RUSAGE_SELF)
        row = run_point(point)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        row = {k: v for k, v in row.items() if "wall" not in k}
        print(json.dumps({"cpu_s": cpu, "row": row}, sort_keys=True, default=str), flush=True)


def run_group(tree: Path, pts: list[dict]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, __file__, "--worker"], input=json.dumps(pts), env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of arrivals per run")
    ap.add_argument("--old", default="87f6a15", help="the commit to compare against")
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()
    groups = args.groups.split(",")
    print(f"paper hot points, {args.duration:g} s traces, old {args.old}; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
                       check=True, capture_output=True)
        try:
            total = [0.0, 0.0]
            for group in groups:
                pts = points(group, args.duration)
                a, b = run_group(old, pts), run_group(ROOT, pts)
                same = [x["row"] == y["row"] for x, y in zip(a, b)]
                ca, cb = sum(x["cpu_s"] for x in a), sum(y["cpu_s"] for y in b)
                total[0] += ca
                total[1] += cb
                print(f"{group:8s} {len(pts):3d} runs: old {ca:7.1f} s, new {cb:7.1f} s CPU, "
                      f"{ca / cb:.2f}x; rows {'all the same' if all(same) and len(a) == len(b) == len(pts) else 'DIFFERENT'}"
                      f"; load average {os.getloadavg()[0]:.1f}", flush=True)
                for k, s in enumerate(same):
                    if not s:
                        diff = [f for f in a[k]["row"] if a[k]["row"][f] != b[k]["row"].get(f)]
                        print(f"  point {k} ({pts[k].get('preset')} {pts[k].get('rate')}): {diff[:6]}")
            print(f"total: old {total[0]:.1f} s, new {total[1]:.1f} s CPU, {total[0] / total[1]:.2f}x")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)


if __name__ == "__main__":
    main()
