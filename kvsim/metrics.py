"""Per-step and per-request records, and the run summary (keys of DESIGN.md's `--json`).

Memory columns are token slots; times are seconds. Memory fractions are time-averaged: each step's
snapshot is weighted by the step's duration.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from kvsim.alloc.base import MemoryStats
from kvsim.scheduler import FINISHED, REJECTED, Scheduler, StepPlan

STEP_COLUMNS = ("step", "time_s", "duration_s", "running", "waiting", "prefill_tokens", "decode_tokens",
                "used_blocks", "free_blocks", "token_states", "reserved", "internal_fragmentation",
                "external_fragmentation", "free", "unshared_blocks")
CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


class StepLog:
    """One tuple per engine step (cheap to append; turned into a DataFrame at the end)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def record(self, now: float, duration: float, plan: StepPlan, waiting: int, mem: MemoryStats) -> None:
        """Log the step that starts at `now` (s) and lasts `duration` (s), with its memory snapshot."""
        self.record_steps((now,), (duration,), plan, (waiting,), (mem,))

    def record_steps(self, starts: Sequence[float], durations: Sequence[float], plan: StepPlan,
                     waiting: Sequence[int], mems: Sequence[MemoryStats]) -> None:
        """Log consecutive steps of the same batch shape (`plan`'s counts), one per start time."""
        step, rows = len(self.rows), self.rows
        batch, prefill, decode = plan.batch_requests, plan.prefill_tokens, plan.decode_seqs
        for now, duration, w, mem in zip(starts, durations, waiting, mems):
            rows.append((step, now, duration, batch, w, prefill, decode, mem.used_blocks, mem.free_blocks,
                         mem.token_states, mem.reserved, mem.internal_fragmentation,
                         mem.external_fragmentation, mem.free, mem.unshared_blocks))
            step += 1

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.rows, columns=STEP_COLUMNS)


def requests_frame(sched: Scheduler, trace) -> pd.DataFrame:
    """One row per request: times in seconds from trace start, status finished|rejected|unfinished."""
    ids = [trace.request_id(i) for i in range(len(trace))]
    return pd.DataFrame({
        "id": ids, "arrival_s": trace.arrival_s, "admitted_s": sched.admitted_s,
        "first_token_s": sched.first_token_s, "finished_s": sched.finished_s,
        "prompt_tokens": trace.prompt_tokens, "output_tokens": trace.output_tokens,
        "n": sched.n, "preemptions": sched.preemptions, "status": sched.status, "reason": sched.reason,
    })


def _quantiles(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean())}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, sched: Scheduler, capacity_tokens: int,
              block_size: int, num_blocks: int, sim_wall_s: float) -> dict:
    """The run summary: throughput, latency quantiles, batch sizes, preemptions, memory breakdown."""
    done = requests[requests.status == FINISHED]
    duration = float(steps.time_s.iloc[-1] + steps.duration_s.iloc[-1]) if len(steps) else 0.0
    out_tokens = float((done.output_tokens * done.n).sum())
    e2e = (done.finished_s - done.arrival_s).to_numpy()
    ttft = (done.first_token_s - done.arrival_s).to_numpy()
    multi = done[done.output_tokens > 1]
    tpot = ((multi.finished_s - multi.first_token_s) / (multi.output_tokens - 1)).to_numpy()
    weights = steps.duration_s.to_numpy()
    total_w = weights.sum()

    def time_avg(column) -> float:
        return float((steps[column].to_numpy() * weights).sum() / total_w) if total_w else 0.0

    fractions = {c: time_avg(c) / capacity_tokens for c in CATEGORIES}
    allocated = steps.token_states + steps.reserved + steps.internal_fragmentation
    unshared = time_avg("unshared_blocks")
    saved = unshared - time_avg("used_blocks")
    return {
        "requests_total": int(len(requests)),
        "requests_finished": int(len(done)),
        "requests_rejected": int((requests.status == REJECTED).sum()),
        "duration_s": duration,
        "throughput_rps": len(done) / duration if duration else 0.0,
        "throughput_tokens_per_s": out_tokens / duration if duration else 0.0,
        "mean_batch_size": float(steps.running.mean()) if len(steps) else 0.0,
        "max_batch_size": int(steps.running.max()) if len(steps) else 0,
        "normalized_latency_s_per_token": float((e2e / done.output_tokens.to_numpy()).mean()) if len(done) else None,
        "ttft_s": _quantiles(ttft), "tpot_s": _quantiles(tpot), "e2e_s": _quantiles(e2e),
        "preemptions": int(sched.num_preemptions),
        "kv": {
            "capacity_tokens": int(capacity_tokens), "block_size": int(block_size),
            "num_blocks": int(num_blocks), "mean_fraction": fractions,
            "peak_allocated_fraction": float(allocated.max() / capacity_tokens) if len(steps) else 0.0,
            "sharing_saved_fraction": saved / unshared if unshared > 0 else 0.0,
        },
        "prefix_cache_hit_tokens": int(sched.prefix_hit_tokens),
        "prefix_cache_hit_rate": (sched.prefix_hit_tokens / sched.admitted_prompt_tokens
                                  if sched.admitted_prompt_tokens else 0.0),
        "sim_wall_s": sim_wall_s,
        "engine_steps": int(len(steps)),
    }
