"""Covers: fleet simulation speed: 64 replicas behind the prefix-aware router against one replica, side by
side in one run, each in a fresh process (wall time of the simulation, trace loading excluded).

Scenario: the whole Azure LLM inference conversation trace (2023, 19,366 requests,
`../shared/traces/azure_llm_2023_conv.csv`), OPT-13B on A100-40GB (kvsim run's defaults, vllm-v1 profile),
one replica, then a fleet of 64 replicas with `--router prefix-aware` (the trace has no block hashes:
every decision falls back to the least loaded replica, the router's full cost is paid all the same).

Run: .venv/bin/python bench/fleet_speed.py [--replicas 64] [--router prefix-aware] [--trace PATH] [--repeat 3]
Target (issue 20): the fleet's wall time <= 4x the single replica's. On a shared, loaded machine one pair
says little: `--repeat N` runs N pairs (single then fleet, alternating which goes first) and judges the
median of the pairs' wall-time ratios; the CPU-time ratio (the process's own CPU seconds) is printed
beside it, since other jobs on a loaded machine stretch wall time but not CPU time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from statistics import median
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"
TARGET = 4.0


def one(trace: str, replicas: int, router: str) -> dict:
    import time

    from kvsim.engine.sim import simulate
    from kvsim.fleet.config import FleetConfig
    from kvsim.fleet.sim import simulate_fleet
    from kvsim.planning.runs import make_config
    from kvsim.trace.formats import load_trace

    tr, cfg = load_trace(trace), make_config()
    start, cpu = time.perf_counter(), time.process_time()
    if replicas == 0:
        s = simulate(tr, cfg, keep_steps=False).summary
    else:
        s = simulate_fleet(tr, cfg, FleetConfig(replicas, router)).summary
    return {"replicas": replicas or 1, "router": router if replicas else "-", "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu,
            "requests": s["requests_total"], "finished": s["requests_finished"], "engine_steps": s["engine_steps"],
            "ttft_p99_s": s["ttft_s"]["p99"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--router", default="prefix-aware")
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs (the median ratio is judged)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)      # (a child process: trace replicas router)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.one[2])))
        return
    pairs = []
    for k in range(args.repeat):
        order = (0, args.replicas) if k % 2 == 0 else (args.replicas, 0)   # which goes first alternates
        got = {}
        for replicas in order:                    # 0: the single engine (kvsim.simulate), not a fleet of 1
            out = subprocess.run([sys.executable, __file__, "--one", args.trace, str(replicas), args.router],
                                 check=True, capture_output=True, text=True).stdout
            got[replicas] = json.loads(out.splitlines()[-1])
        pairs.append((got[0], got[args.replicas]))
        for r in pairs[-1]:
            print(f"{r['replicas']:>3} replica(s) {r['router']:>13}: {r['wall_s']:7.2f} s wall ({r['cpu_s']:.2f} s CPU), "
                  f"{r['engine_steps']:>10,} "
                  f"steps, {r['finished']:,}/{r['requests']:,} finished, TTFT p99 {r['ttft_p99_s']:.3g} s")
        single, fleet = pairs[-1]
        print(f"  pair {k + 1}: fleet / single {fleet['wall_s'] / single['wall_s']:.2f}x wall, "
              f"{fleet['cpu_s'] / single['cpu_s']:.2f}x CPU", flush=True)
    ratio = median(f["wall_s"] / s["wall_s"] for s, f in pairs)
    print(f"medians over {len(pairs)} pair(s): single {median(s['wall_s'] for s, _ in pairs):.2f} s, fleet "
          f"{median(f['wall_s'] for _, f in pairs):.2f} s; fleet / single wall time (median of the pairs' ratios): "
          f"{ratio:.2f}x (target <= {TARGET:g}x): {'met' if ratio <= TARGET else 'NOT met'}; the CPU-time ratio "
          f"(steadier on a loaded machine): {median(f['cpu_s'] / s['cpu_s'] for s, f in pairs):.2f}x")


if __name__ == "__main__":
    main()
