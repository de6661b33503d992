"""Covers: a 1,000,000-request trace through `kvsim run` as a whole process, and its peak memory.

Scenario: Alpaca-like requests at 30 req/s (seed 0; about 9 simulated hours), written as kvsim JSONL,
then `kvsim run TRACE --quiet --json S` (OPT-13B, one A100-40GB, 12 GiB of KV, paged). Without `--out`
the step log keeps only its aggregates, so memory grows with the requests (their per-request records),
not with the engine steps. The same run at a tenth of the requests shows how memory scales. Prints
wall seconds, engine steps and the peak RSS of each `kvsim run` process (ru_maxrss of the child).

Run: python bench/million_requests.py [--requests 1000000] [--out]   (--out also streams steps.csv)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(trace: Path, tmp: Path, out: bool) -> dict:
    """One `kvsim run` in a fresh process: wall seconds, steps, peak RSS (MiB)."""
    summary = tmp / "s.json"
    cmd = [sys.executable, "-m", "kvsim.cli.app", "run", str(trace), "--kv-gib", "12", "--quiet",
           "--json", str(summary)] + (["--out", str(tmp / "out")] if out else [])
    code = ("import resource, subprocess, sys, time\nt = time.perf_counter()\n"
            "subprocess.run(sys.argv[1:], check=True)\n"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    res = subprocess.run([sys.executable, "-c", code, *cmd], check=True, text=True, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall, rss_kib = res.stdout.split()
    s = json.loads(summary.read_text())
    return {"requests": s["requests_total"], "finished": s["requests_finished"], "steps": s["engine_steps"],
            "wall_s": float(wall), "peak_rss_mib": int(rss_kib) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--out", action="store_true", help="also write --out DIR (steps.csv streamed)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvsim.trace.jsonl import write_jsonl
    from kvsim.trace.synthetic import generate

    print("requests | finished | engine steps | wall s | peak RSS MiB")
    with tempfile.TemporaryDirectory() as tmp:
        for num in (args.requests // 10, args.requests):
            path = Path(tmp) / f"alpaca-{num}.jsonl"
            write_jsonl(generate("alpaca", rate_rps=30.0, num_requests=num, seed=0), path)
            r = run(path, Path(tmp), args.out)
            print(f"{r['requests']:,} | {r['finished']:,} | {r['steps']:,} | {r['wall_s']:.1f} | "
                  f"{r['peak_rss_mib']:.0f}", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
