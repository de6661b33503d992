"""Covers: simulator speed (requests and generated tokens simulated per wall-clock second) and peak memory.

Scenario: one hour of ShareGPT-like traffic at 2 req/s and of Alpaca-like traffic at 30 req/s (the vLLM
paper's workloads), OPT-13B on one A100-40GB with 12 GiB of KV, paged (block 16) and contiguous
(`max`, buddy) allocators. Each run is a fresh process so its peak RSS is its own.

Run: .venv/bin/python bench/sim_speed.py [--duration 3600] [--profile] [--no-fast-forward]
Target (issue 3): >= 1,000,000 generated tokens simulated per second on one core for the paged run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

WORKLOADS = {"sharegpt": 2.0, "alpaca": 30.0}
ALLOCATORS = ("paged", "contiguous")


def one(preset: str, allocator: str, duration: float, profile: bool, fast_forward: bool) -> dict:
    from kvsim.engine.config import CacheConfig, SimConfig
    from kvsim.engine.sim import simulate
    from kvsim.specs import Deployment, get_gpu, get_model
    from kvsim.trace.synthetic import generate

    trace = generate(preset, rate_rps=WORKLOADS[preset], duration_s=duration, seed=0)
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb")),
                    CacheConfig(allocator=allocator, kv_gib=12, reserve="max"))
    start = time.perf_counter()
    if profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        result = prof.runcall(simulate, trace, cfg, fast_forward=fast_forward)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    else:
        result = simulate(trace, cfg, fast_forward=fast_forward)
    wall = time.perf_counter() - start
    s = result.summary
    generated = float((result.requests.output_tokens * result.requests.n)[result.requests.status == "finished"].sum())
    return {"workload": f"{preset} {WORKLOADS[preset]:g} req/s", "allocator": allocator,
            "requests": s["requests_finished"], "generated_tokens": int(generated),
            "engine_steps": s["engine_steps"], "wall_s": round(wall, 2),
            "engine_wall_s": round(s["sim_wall_s"], 2),
            "requests_per_s": round(s["requests_finished"] / wall),
            "tokens_per_s": round(generated / wall),
            "engine_tokens_per_s": round(generated / s["sim_wall_s"]),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="trace length, seconds")
    ap.add_argument("--profile", action="store_true", help="cProfile each run (to stderr)")
    ap.add_argument("--no-fast-forward", action="store_true",
                    help="step one at a time (the engine's exact fast-forward off), for comparison")
    ap.add_argument("--one", nargs=2, metavar=("PRESET", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.duration, args.profile, not args.no_fast_forward)))
        return
    header = ("workload", "allocator", "requests", "generated_tokens", "engine_steps", "wall_s",
              "requests_per_s", "tokens_per_s", "engine_tokens_per_s", "peak_rss_mib")
    print(" | ".join(header))
    for preset in WORKLOADS:
        for allocator in ALLOCATORS:
            cmd = [sys.executable, __file__, "--one", preset, allocator, "--duration", str(args.duration)]
            cmd += ["--profile"] * args.profile + ["--no-fast-forward"] * args.no_fast_forward
            row = json.loads(subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE).stdout)
            print(" | ".join(str(row[k]) for k in header), flush=True)


if __name__ == "__main__":
    main()
