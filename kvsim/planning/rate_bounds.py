"""What the rate search knows before and during its runs: the serving ceiling, a first guess, and the
verdict on a run that has already missed its SLO.

- `serve_ceiling_rps`: an upper bound on the request rate the engine could ever sustain. Every
  decode step lasts at least the step time of its batch (`t(B)`: the cost model's kernel time of a
  decode-only step of B sequences reading B context tokens, plus the engine profile's CPU time, both
  non-decreasing in B), runs at most `max_num_seqs` sequences and holds at most the cache's token
  slots. A request of prompt P, M outputs and n samples needs n(M - 1) decode slots and, over its
  decode steps, at least sum_k (P + n k) = (M - 1) P + n (M - 1) M / 2 slot-steps (without the prompt
  term under prefix caching: shared prompts are held once). So, with the trace's means,
  rate <= max_B B / t(B) / E[n (M - 1)] and, for full-attention models, rate <= slots / (t(1) E[...]).
  Above it the arrivals outrun any schedule: queues grow without bound, and the search stops there.
- `start_rate_rps`: where the bracket starts: Little's law with the concurrency the cache holds at
  the trace's mean footprint (prompt + half the outputs) and the step time at that batch.
- `SloWatch`: a run's verdict before it ends. A request that arrived more than L s ago and has no
  first token yet will have a TTFT above L (its token comes after now); with V such requests (or
  finished ones above L) among the at most n requests that will finish, numpy's linear
  percentile q is above L once V >= n - floor((n - 1) q), and the mean once the lower bounds (the
  value, or now - arrival while unknown) sum past n L. The same for e2e with the finish time. The run may then stop: its verdict is already the
  one the whole run would give (tpot and normalized latency are not watched).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from kvsim.engine.config import SimConfig
from kvsim.trace.table import Trace

#: Watched SLO metrics: name -> (request time column the metric ends at, quantile or None for the mean).
WATCHED = {f"{kind}_{stat}": (col, q) for kind, col in (("ttft", "first_token_s"), ("e2e", "finished_s"))
           for stat, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("mean", None))}


def _lengths(trace: Trace, max_seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompt, output and sample counts of the requests the engine can serve (float arrays)."""
    p = np.asarray(trace.prompt_tokens, dtype=float)
    m = np.asarray(trace.output_tokens, dtype=float)
    n = np.maximum(np.asarray(trace.n), np.asarray(trace.beam_width)).astype(float)
    keep = p + m <= max_seq_len
    if not keep.any():
        raise ValueError("no request of the trace fits the model's maximum length")
    return p[keep], m[keep], n[keep]


def _batches(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def _step_floor(cfg: SimConfig, sample: Trace):
    """t(B), s: the decode-only step of B sequences reading B context tokens, kernels + CPU time."""
    from kvsim.engine.build import build_run

    parts = build_run(sample.head(1), cfg)
    cost, profile = parts.cost, parts.profile

    def t(b: int) -> float:
        return cost.step_time(0, 0, b, b) + (profile.cpu_seconds(b) if profile is not None else 0.0)
    return t, parts.capacity_tokens, cfg.deployment.model.is_hybrid


def serve_ceiling_rps(cfg: SimConfig, sample: Trace) -> float:
    """Upper bound (req/s) on the rate `cfg` can sustain for requests like `sample`'s (module docstring)."""
    cfg = cfg.resolved()
    p, m, n = _lengths(sample, cfg.deployment.model.max_seq_len)
    t, capacity, hybrid = _step_floor(cfg, sample)
    sizes = _batches(cfg.batch_limits()[0])
    times = [t(b) for b in sizes]
    # B / t(B) for B in (b_k, b_k+1] is at most b_k+1 / t(b_k): t never decreases with B
    slots_per_s = max([1 / times[0]] + [b2 / t1 for b2, t1 in zip(sizes[1:], times)])
    decode_slots = float((n * (m - 1)).mean())
    bounds = [slots_per_s / decode_slots if decode_slots > 0 else math.inf]
    if not hybrid:
        held = n * (m - 1) * m / 2 + (0 if cfg.cache.prefix_caching else (m - 1) * p)
        if held.mean() > 0:
            bounds.append(capacity / (min(times) * float(held.mean())))
    return min(bounds)


def start_rate_rps(cfg: SimConfig, sample: Trace) -> float:
    """A first guess (req/s) of the highest rate the engine serves: Little's law (module docstring)."""
    cfg = cfg.resolved()
    p, m, n = _lengths(sample, cfg.deployment.model.max_seq_len)
    t, capacity, _ = _step_floor(cfg, sample)
    footprint = float((p + n * m / 2).mean())
    batch = max(1, min(cfg.batch_limits()[0], int(capacity / footprint)))
    return batch / (float(m.mean()) * t(batch))


class SloWatch:
    """`stop_when` for `kvsim.engine.sim.simulate`: True once the run has missed one of `slo`'s watched
    metrics for certain (module docstring). Incremental: each request is looked at once per metric."""

    def __init__(self, slo: Mapping[str, float], arrival_s: np.ndarray):
        self.arrival = np.asarray(arrival_s, dtype=float).tolist()
        self.rules = [[WATCHED[m][0], WATCHED[m][1], float(limit), 0, 0, 0.0]   # col, q, limit, next, V, sum
                      for m, limit in slo.items() if m in WATCHED and math.isfinite(limit)]

    def __call__(self, sched, now: float) -> bool:
        if not self.rules:
            return False
        arrival, num = self.arrival, len(self.arrival)
        status = sched.status
        n = num - sched.num_rejected                 # at most this many requests will finish
        for rule in self.rules:
            col, q, limit, i, v, total = rule
            times = getattr(sched, col)
            while i < num and arrival[i] < now - limit:
                if status[i] != "rejected":
                    t = times[i]
                    if t != t or t - arrival[i] > limit:     # NaN: it comes after now
                        v += 1
                        total += now - arrival[i] if t != t else t - arrival[i]
                    else:
                        total += t - arrival[i]
                i += 1
            rule[3:] = [i, v, total]
            if n <= 0:
                continue
            if q is None:
                if total / n > limit:
                    return True
            elif v >= n - math.floor((n - 1) * q):
                return True
        return False
