"""Sweep speed: the same runs on all cores (local processes) and one after another.

Covers: `kvsim.run_sweep` with `workers=os.cpu_count()` against `workers=1`.
Scenario: RUNS one-hour ShareGPT-like traces at 2 req/s (seeds 0..RUNS-1) on OPT-13B, 1 x A100-40GB,
12 GiB of KV cache, paged blocks of 16. Prints both wall times, the speed-up, and checks that the two
tables agree run for run (each run is deterministic for its seed).

    python bench/sweep_speed.py                  # 100 runs of 3600 s (the issue's figure)
    python bench/sweep_speed.py --runs 20 --duration 600
"""

from __future__ import annotations

import argparse
import os
import time

import kvsim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="grid points (seeds)")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of arrivals per run")
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes for the parallel sweep")
    ap.add_argument("--serial-first", action="store_true", help="time the serial sweep first")
    args = ap.parse_args()
    grid = {"seed": list(range(args.runs))}
    base = {"model": "opt-13b", "gpu": "a100-40gb", "kv_gib": 12, "block_size": 16,
            "rate": args.rate, "duration_s": args.duration}
    print(f"{args.runs} runs: sharegpt, {args.rate:g} req/s, {args.duration:g} s each, OPT-13B on A100-40GB, "
          f"12 GiB KV; {os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.1f}")
    walls, tables = {}, {}
    order = [("parallel", args.workers), ("serial", 1)]
    for label, workers in (order[::-1] if args.serial_first else order):
        start = time.perf_counter()
        tables[label] = kvsim.run_sweep(grid, base, preset="sharegpt", workers=workers)
        walls[label] = time.perf_counter() - start
        df = tables[label]
        print(f"{label:8s} workers={workers:2d}: {walls[label]:8.1f} s wall, {int((df.status == 'ok').sum())} ok, "
              f"{int(df.requests_total.sum()):,} requests, mean sim time per run {df.sim_wall_s.mean():.2f} s; "
              f"load average after: {os.getloadavg()[0]:.1f}")
    cols = ["seed", "requests_finished", "normalized_latency_s_per_token", "engine_steps"]
    same = tables["parallel"][cols].equals(tables["serial"][cols])
    print(f"speed-up: {walls['serial'] / walls['parallel']:.2f}x on {args.workers} workers "
          f"(tables identical: {same})")


if __name__ == "__main__":
    main()
