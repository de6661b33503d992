"""Stopping a run once its normalized latency is surely above a ceiling (a sweep point's
`stop_above_s_per_token`): a latency curve past a system's capacity needs to know only that its
point is off the top of the plot (the vLLM paper's plots stop at 1 s/token), and a queue that grows
for an hour takes most of the time of a study.

Normalized latency is the mean over finished requests of end-to-end latency / output tokens
(`kvsim.engine.metrics`). At simulated time t it is at least

    LB(t) = ( sum over finished requests of e2e_i / out_i
              + sum over requests arrived by t, not finished, of (t - a_i) / out_i ) / n,

n = the requests not rejected so far (every other request will finish, adding a term >= 0; a request
refused later would lower n, which only raises the mean, unless it is one already counted: kvsim refuses
a queued request only when it cannot fit an empty cache, which `never_served` rules out on arrival for
every allocator the paper runs). LB only grows with t, so once LB(t) > ceiling the finished run's value is
above the ceiling too, and the run stops (`kvsim.engine.sim.simulate`'s `stop_when`). The row of a stopped
run then holds no metric but `latency_above_s_per_token` (the ceiling) and `stopped_early_s`: the summary
of a run cut short is not the run's.
"""

from __future__ import annotations

import numpy as np

from kvsim.engine.batching.request_state import REJECTED

#: The summary-row column that marks a run stopped above the ceiling (its value: the ceiling, s/token).
ABOVE = "latency_above_s_per_token"


class CeilingWatch:
    """`stop_when(scheduler, now)`: True once the mean normalized latency of the run is surely above
    `ceiling_s_per_token` (the module's bound). Vectorized over the arrived requests at each call (the
    engine asks every few thousand steps)."""

    def __init__(self, ceiling_s_per_token: float, arrival_s: np.ndarray, output_tokens: np.ndarray):
        self.ceiling = float(ceiling_s_per_token)
        self.arrival = np.asarray(arrival_s, dtype=float)
        self.inverse = 1.0 / np.asarray(output_tokens, dtype=float)

    def lower_bound(self, sched, now: float) -> float:
        """LB(now), s per token (0.0 while every request was rejected)."""
        arrived = int(np.searchsorted(self.arrival, now, side="right"))
        n = len(self.arrival) - sched.num_rejected
        if n <= 0 or arrived == 0:
            return 0.0
        finished = np.asarray(sched.finished_s[:arrived], dtype=float)
        end = np.where(np.isnan(finished), now, finished)          # not finished: at least until now
        waited = end - self.arrival[:arrived]
        if sched.num_rejected:
            waited[np.fromiter((s == REJECTED for s in sched.status[:arrived]), bool, arrived)] = 0.0
        return float((waited * self.inverse[:arrived]).sum()) / n

    def __call__(self, sched, now: float) -> bool:
        return self.lower_bound(sched, now) > self.ceiling


def run_capped(trace, config, ceiling_s_per_token: float) -> tuple[dict, float | None]:
    """(summary, None) of the whole run of `trace` under `config`, or ({ABOVE: ceiling}, when it
    stopped) once its normalized latency is surely above `ceiling_s_per_token`."""
    from kvsim.engine.sim import simulate

    watch = CeilingWatch(ceiling_s_per_token, trace.arrival_s, trace.output_tokens)
    result = simulate(trace, config, keep_steps=False, stop_when=watch)
    stopped = result.summary.get("stopped_early_s")
    if stopped is None:
        return result.summary, None
    return {ABOVE: float(ceiling_s_per_token), "stopped_early_s": stopped}, stopped
