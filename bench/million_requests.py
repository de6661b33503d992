"""Covers: a 1,000,000-request trace through `kvsim run` as a whole process, and its peak memory.

Scenario: Alpaca-like requests at 30 req/s (seed 0; about 9 simulated hours), written as kvsim JSONL,
then `kvsim run TRACE --quiet --json S` (OPT-13B, one A100-40GB, 12 GiB of KV, paged). Without `--out`
the step log keeps only its aggregates, so memory grows with the requests (their per-request records),
not with the engine steps. The same run at a tenth of the requests shows how memory scales. Prints
wall seconds, engine steps and the peak RSS of each `kvsim run` process (ru_maxrss of the child, given
in MiB = 2^20 bytes and in MB = 10^6 bytes: issue 19's target is <= 600 MB).
`--profiles vllm-v1,ideal` runs each engine profile in turn on the same trace (the default flags run
`vllm-v1`; issue 19 wants the `ideal` profile's wall time beside it).

Run: python bench/million_requests.py [--requests 1000000] [--out] [--profiles vllm-v1,ideal] [--no-tenth]
     (--out also streams steps.csv)
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


def run(trace: Path, tmp: Path, out: bool, profile: str | None = None) -> dict:
    """One `kvsim run` in a fresh process: wall and CPU seconds (user + system: steadier than wall on a
    shared machine), steps, peak RSS (MiB); `profile`: an
    `--engine-profile` (None: the default flags)."""
    summary = tmp / "s.json"
    cmd = [sys.executable, "-m", "kvsim.cli.app", "run", str(trace), "--kv-gib", "12", "--quiet",
           "--json", str(summary)] + (["--out", str(tmp / "out")] if out else [])
    cmd += ["--engine-profile", profile] if profile else []
    code = ("import resource, subprocess, sys, time\nt = time.perf_counter()\n"
            "subprocess.run(sys.argv[1:], check=True)\n"
            "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "print(time.perf_counter() - t, u.ru_maxrss, u.ru_utime + u.ru_stime)")
    res = subprocess.run([sys.executable, "-c", code, *cmd], check=True, text=True, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall, rss_kib, cpu = res.stdout.split()
    s = json.loads(summary.read_text())
    return {"requests": s["requests_total"], "finished": s["requests_finished"], "steps": s["engine_steps"],
            "wall_s": float(wall), "cpu_s": float(cpu), "peak_rss_mib": int(rss_kib) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--out", action="store_true", help="also write --out DIR (steps.csv streamed)")
    ap.add_argument("--profiles", default="default",
                    help="comma-separated --engine-profile values; 'default' = no flag (vllm-v1)")
    ap.add_argument("--no-tenth", action="store_true", help="skip the run at a tenth of the requests")
    args = ap.parse_args()
    profiles = [None if p == "default" else p for p in args.profiles.split(",")]
    sys.path.insert(0, str(ROOT))
    from kvsim.trace.jsonl import write_jsonl
    from kvsim.trace.synthetic import generate

    print("profile | requests | finished | engine steps | wall s | CPU s | peak RSS MiB | peak RSS MB")
    with tempfile.TemporaryDirectory() as tmp:
        for num in ((args.requests,) if args.no_tenth else (args.requests // 10, args.requests)):
            path = Path(tmp) / f"alpaca-{num}.jsonl"
            write_jsonl(generate("alpaca", rate_rps=30.0, num_requests=num, seed=0), path)
            for profile in profiles:
                r = run(path, Path(tmp), args.out, profile)
                mb = r["peak_rss_mib"] * 2 ** 20 / 1e6
                print(f"{profile or 'default (vllm-v1)'} | {r['requests']:,} | {r['finished']:,} | {r['steps']:,} | "
                      f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mib']:.0f} | {mb:.0f}", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
