"""Whether a run has decided its SLO verdict at steady state: batch means of the SLO over the second
half of the simulated time, with a confidence interval (the method of batch means: A. M. Law,
*Simulation Modeling and Analysis*, 5th ed., section 9.5.3; the sequential rule of 9.4.1: run longer
until the interval is narrow enough to decide).

A quantile SLO `<metric>_p<q> <= L` holds at steady state when the fraction of requests whose metric
exceeds L is at most 1 - q; a mean SLO when the metric's mean is at most L. Over (t/2, t] (t: the
trace's span, or the time a stopped run stopped; the first half is warm-up, `kvsim.planning.rate.steady`)
cut into `WINDOWS` windows by arrival time, each window's violating fraction (or mean) is one batch
mean; their mean and a one-sided Student-t interval (7 degrees of freedom, 95 %: t = 1.895) say:

- `pass` when the interval's upper end is within the limit (for a quantile, every window must hold at
  least `MIN_TAIL` / (1 - q) requests, so it would show MIN_TAIL violations at the quantile's own rate:
  a p99 needs 1,000 requests a window, 16,000 over the run; even a half without any violation: late
  requests come in bursts, minutes apart, so a quiet stretch says little about the next; and every
  metric, means included, needs `MIN_WINDOW_REQUESTS` a window, for the same reason);
- `fail` when its lower end is past the limit;
- `undecided` otherwise: a rate near the knee on a trace too short to tell (bursts of long requests
  cluster violations in time, so a short trace's quantile swings with where its bursts fell).

A request still unfinished at t counts by what is known: late already (t - arrival past the limit) or
not (yet); tpot is looked at for finished requests only.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from kvsim.planning.rate.steady import WINDOWS

#: One-sided 95 % Student-t quantile with WINDOWS - 1 = 7 degrees of freedom.
T_QUANTILE = 1.895
#: Violations a window must expect at the quantile's own rate before its fraction counts (a Poisson
#: count of 10 varies by +-32 %). Fewer let a short trace pass a rate its quiet stretch flattered:
#: Llama-2-70B, TP 4, A100-80GB, ShareGPT, ttft_p99 <= 2 passed 6.27 req/s on 600 s (4,000 requests,
#: 500 a window) and failed it on 3,600 s, whose heavier stretches build a queue for minutes
#: (bench/steady_rate.py, docs/rate-search.md).
MIN_TAIL = 10
#: Requests every window must hold, whatever the metric: batch means are near-independent only when a
#: window outlasts a burst of long requests (minutes). Measured: Llama-2-7B, A100-80GB, ShareGPT,
#: normalized_latency <= 0.1 passed 9.59 req/s on 120 s (140 requests a window) and 9.79 on 600 s,
#: where 3,600 s answers 9.22 (bench/steady_rate.py); the same count as a p99's MIN_TAIL / 0.01.
MIN_WINDOW_REQUESTS = 1000
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _values(columns: Mapping[str, Any], metric: str, t_end: float) -> np.ndarray:
    """Per-request value of `metric` (`ttft`, `e2e`, `tpot`, `normalized_latency`) known at `t_end`, s:
    a lower bound for unfinished requests (NaN where nothing is known: tpot before the finish)."""
    arrival = np.asarray(columns["arrival_s"], dtype=float)
    first = np.asarray(columns["first_token_s"], dtype=float)
    finished = np.asarray(columns["finished_s"], dtype=float)
    out = np.asarray(columns["output_tokens"], dtype=float)
    if metric == "ttft":
        return np.where(np.isnan(first), t_end, first) - arrival
    e2e = np.where(np.isnan(finished), t_end, finished) - arrival
    if metric == "e2e":
        return e2e
    if metric == "normalized_latency":
        return e2e / out
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, (finished - first) / (out - 1), np.nan)


def verdict(columns: Mapping[str, Any], slo: Mapping[str, float], t_end: float) -> str:
    """`pass`, `fail` or `undecided` for `slo` over the second half of a run that simulated up to
    `t_end` s (module docstring); `columns`: the run's per-request columns (rejected requests skipped)."""
    arrival = np.asarray(columns["arrival_s"], dtype=float)
    keep = np.asarray(columns["status"]) != "rejected"
    edges = np.linspace(t_end / 2, t_end, WINDOWS + 1)
    which = np.searchsorted(edges, arrival, side="right") - 1
    keep &= (which >= 0) & (which < WINDOWS) & (arrival <= t_end)
    verdicts = []
    for metric, limit in slo.items():
        if not math.isfinite(limit):
            continue                                  # (no request can break an infinite limit)
        name, _, stat = metric.rpartition("_") if metric != "normalized_latency" else (metric, "", "mean")
        values = _values(columns, name, t_end)
        ok = keep & ~np.isnan(values)
        q = _QUANTILES.get(stat)
        means, counts = np.zeros(WINDOWS), np.bincount(which[ok], minlength=WINDOWS)
        x = (values[ok] > limit).astype(float) if q is not None else values[ok]
        np.add.at(means, which[ok], x)
        need = max(MIN_WINDOW_REQUESTS, MIN_TAIL / (1 - q) if q is not None else 0)
        if counts.min() < need:
            verdicts.append("undecided")
            continue
        means /= counts
        target = 1 - q if q is not None else limit
        centre, half = float(means.mean()), T_QUANTILE * float(means.std(ddof=1)) / math.sqrt(WINDOWS)
        verdicts.append("fail" if centre - half > target else "pass" if centre + half <= target else "undecided")
    return "fail" if "fail" in verdicts else "undecided" if "undecided" in verdicts else "pass"
