"""Covers: the hybrid allocator's cost to the engine loop (kvsim/alloc/hybrid: per-sequence events between
block moves, fast-forward windows) against the paged allocator on the same trace and pool.
Scenario: a ShareGPT-like trace (600 s at `--rate` requests/s), 20,000 blocks of 16 tokens, budget 8192,
256 sequences, chunked prefill, 20 ms steps (ConstantCost), the unchanged Scheduler and Stepper driven
without SimPy (arrivals before each step, windows after it); full attention (paged, lazy decode ticks)
beside gpt-oss-like (full + sliding 128) and Gemma-3-like (five sliding-1024 groups + full) hybrids.
Prints wall seconds per allocator.

Run: .venv/bin/python bench/hybrid_speed.py [--rate 5]
"""

from __future__ import annotations

import argparse
import time

from kvsim.alloc import PagedAllocator
from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper
from kvsim.trace.synthetic import generate

FULL, SWA128, SWA1024 = GroupSpec("full"), GroupSpec("sliding", window=128), GroupSpec("sliding", window=1024)
ALLOCATORS = {
    "paged (full attention)": lambda: PagedAllocator(20_000, 16),
    "hybrid full + sliding-128 (gpt-oss-like)": lambda: HybridAllocator(20_000, 16, [FULL, SWA128], 8192, 8192, 8192),
    "hybrid 5 x sliding-1024 + full (Gemma-3-like)":
        lambda: HybridAllocator(20_000, 16, [SWA1024] * 5 + [FULL], 8192, 8192, 8192),
}


def run(trace, alloc) -> tuple[int, Scheduler]:
    """Every request to completion; returns (steps and windows, scheduler)."""
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=256, max_batched_tokens=8192, chunked_prefill=True),
                      max_seq_len=8192)
    arrivals = trace.arrival_s.tolist()
    stepper, now, nxt, count = Stepper(sched, ConstantCost(0.02), arrivals), 0.0, 0, 0
    while True:
        while nxt < len(arrivals) and arrivals[nxt] <= now:
            sched.add(nxt, now)
            nxt += 1
        plan = stepper.step(now)
        if plan is None:
            if nxt == len(arrivals):
                return count, sched
            now = arrivals[nxt]
            continue
        now, count = plan.end_s, count + 1
        window = stepper.window(plan, now, nxt)
        if window is not None:
            now, count = window.end_s, count + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=5.0, help="requests per second")
    args = ap.parse_args()
    trace = generate("sharegpt", rate_rps=args.rate, duration_s=600.0, seed=0)
    for name, make in ALLOCATORS.items():
        start = time.perf_counter()
        count, sched = run(trace, make())
        print(f"rate {args.rate:g}/s, {len(trace)} requests: {name}: {time.perf_counter() - start:.2f} s "
              f"({count} steps and windows, {sched.num_preemptions} preemptions)")


if __name__ == "__main__":
    main()
