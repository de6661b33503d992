"""Covers: loading a 1M-request kvsim JSONL trace.

Scenario: generate a ShareGPT-like trace of 1,000,000 requests (seed 0), write it to a temp file, then
time `read_jsonl` and report its peak traced Python/numpy memory (tracemalloc, in a separate pass so the
timing is not slowed by tracing). Prints seconds and MiB.
"""

import os
import tempfile
import time
import tracemalloc

from kvsim.trace.jsonl import read_jsonl, write_jsonl
from kvsim.trace.synthetic import generate

NUM = 1_000_000

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "big.jsonl")
    t0 = time.perf_counter()
    write_jsonl(generate("sharegpt", rate_rps=100.0, num_requests=NUM, seed=0), path)
    print(f"generate + write: {time.perf_counter() - t0:.2f} s, {os.path.getsize(path) / 2**20:.1f} MiB file")
    t0 = time.perf_counter()
    trace = read_jsonl(path)
    print(f"load {len(trace):,} requests: {time.perf_counter() - t0:.2f} s")
    tracemalloc.start()
    read_jsonl(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"peak traced memory while loading: {peak / 2**20:.0f} MiB (result arrays: "
          f"{sum(getattr(trace, f).nbytes for f in ('arrival_s', 'prompt_tokens', 'output_tokens', 'n', 'beam_width', 'prefix_tokens')) / 2**20:.0f} MiB)")
