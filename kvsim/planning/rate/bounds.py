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
- `start_rate_rps`: where the search starts, near the rate at which the engine saturates (above the
  knee of any SLO, so its first run usually misses the SLO early and costs little). Little's law
  over time-weighted footprints: at λ req/s and steps of τ s, a = λτ requests arrive per step; each
  holds its slots for its decode steps, E[held] slot-steps (as above), so the cache holds a E[held]
  token slots and decodes B = a E[n (M - 1)] sequences a step. The memory-bound rate fills the cache:
  a = slots / E[held], also capped by `max_num_seqs` (B) and the token budget (a E[P + n (M - 1)]
  tokens a step). τ is the cost model's step with a E[P] prefill tokens (a E[P²] attention pairs), B
  decodes reading a E[held] context tokens, plus CPU time; the guess is a / τ. On ShareGPT lengths,
  OPT-13B, 12 GiB: 2.8 req/s, where runs saturate at about 2.5-2.7 (the old guess, the cache over
  the mean footprint P + M / 2 at the decode-only step time, was 5.4).
- `SloWatch`: a run's verdict before it ends. A request that arrived more than L s ago and has no
  first token yet will have a TTFT above L (its token comes after now); with V such requests (or
  finished ones above L) among the at most n requests that will finish, numpy's linear
  percentile q is above L once V >= n - floor((n - 1) q), and the mean once the lower bounds (the
  value, or now - arrival while unknown) sum past n L. The same for e2e with the finish time, and for
  the normalized latency (the mean of e2e / output tokens; a request is looked at once one of the mean
  output length would be late). The run may then stop: its verdict is already the one the whole run
  would give (tpot is not watched).
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
    """A first guess (req/s) of the rate at which the engine saturates: Little's law with
    time-weighted footprints, steps timed at the batch and context that rate holds (module docstring)."""
    from kvsim.engine.build import build_run

    cfg = cfg.resolved()
    p, m, n = _lengths(sample, cfg.deployment.model.max_seq_len)
    parts = build_run(sample.head(1), cfg)
    decode = n * (m - 1)
    held = decode * m / 2 + (m - 1) * p          # (prompts held whole: a guess, not a bound)
    seqs_cap, tokens_cap = cfg.batch_limits()
    per_step = [tokens_cap / float((p + decode).mean())]   # arrivals per step
    if decode.mean() > 0:
        per_step.append(seqs_cap / float(decode.mean()))
    if held.mean() > 0 and not cfg.deployment.model.is_hybrid:
        per_step.append(parts.capacity_tokens / float(held.mean()))
    a = min(per_step)
    seqs = a * float(decode.mean())
    step = parts.cost.step_time(a * float(p.mean()), a * float((p * p).mean()), seqs, a * float(held.mean()))
    if parts.profile is not None:
        step += parts.profile.cpu_seconds(a * float(decode.mean()) + a)
    return a / step


class SloWatch:
    """`stop_when` for `kvsim.engine.sim.simulate`: True once the run has missed one of `slo`'s watched
    metrics for certain (module docstring). Incremental: each request is looked at once per metric."""

    def __init__(self, slo: Mapping[str, float], arrival_s: np.ndarray, output_tokens: np.ndarray | None = None):
        """`output_tokens` (per request) lets it watch `normalized_latency` too (e2e / output tokens)."""
        self.arrival = np.asarray(arrival_s, dtype=float).tolist()
        self.per_token, self.rules = None, []
        for m, limit in slo.items():
            if not math.isfinite(limit):
                continue
            if m in WATCHED:          # col, q, limit, next, V, sum, horizon (s after arrival), per token
                self.rules.append([WATCHED[m][0], WATCHED[m][1], float(limit), 0, 0, 0.0, float(limit), False])
            elif m == "normalized_latency" and output_tokens is not None and len(output_tokens):
                out = np.asarray(output_tokens, dtype=float)
                self.per_token = (1.0 / out).tolist()     # looked at once one of mean length is late
                self.rules.append(["finished_s", None, float(limit), 0, 0, 0.0, limit * float(out.mean()), True])

    def __call__(self, sched, now: float) -> bool:
        if not self.rules:
            return False
        arrival, num = self.arrival, len(self.arrival)
        status = sched.status
        n = num - sched.num_rejected                 # at most this many requests will finish
        for rule in self.rules:
            col, q, limit, i, v, total, horizon, per_token = rule
            times = getattr(sched, col)
            while i < num and arrival[i] < now - horizon:
                if status[i] != "rejected":
                    t = times[i]
                    late = (now if t != t else t) - arrival[i]       # NaN: it comes after now
                    late = late * self.per_token[i] if per_token else late
                    if t != t or late > limit:
                        v += late > limit
                    total += late
                i += 1
            rule[3:6] = [i, v, total]
            if n <= 0:
                continue
            if q is None:
                if total / n > limit:
                    return True
            elif v >= n - math.floor((n - 1) * q):
                return True
        return False
