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

A P:D layout's SLO attainment (DistServe's: at least a fraction `target` of the requests meet every
latency SLO) is judged the same way as a quantile at q = target (`attainment_verdict`): each window's
fraction of requests missing is a batch mean, and the interval says the attainment's lower bound.

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
    keep = np.asarray(columns["status"]) != "rejected"
    which = _windows(columns, t_end)
    keep &= which >= 0
    verdicts = []
    for metric, limit in slo.items():
        if not math.isfinite(limit):
            continue                                  # (no request can break an infinite limit)
        name, _, stat = metric.rpartition("_") if metric != "normalized_latency" else (metric, "", "mean")
        values = _values(columns, name, t_end)
        ok = keep & ~np.isnan(values)
        q = _QUANTILES.get(stat)
        x = (values[ok] > limit).astype(float) if q is not None else values[ok]
        band = batch_means(x, which[ok], MIN_TAIL / (1 - q) if q is not None else 0)
        verdicts.append(_judged(band, 1 - q if q is not None else limit))
    return "fail" if "fail" in verdicts else "undecided" if "undecided" in verdicts else "pass"


def _windows(columns: Mapping[str, Any], t_end: float) -> np.ndarray:
    """Each request's window (0 .. WINDOWS - 1) over (t_end / 2, t_end] by arrival; -1 outside."""
    arrival = np.asarray(columns["arrival_s"], dtype=float)
    edges = np.linspace(t_end / 2, t_end, WINDOWS + 1)
    which = np.searchsorted(edges, arrival, side="right") - 1
    return np.where((which >= 0) & (which < WINDOWS) & (arrival <= t_end), which, -1)


def batch_means(x: np.ndarray, which: np.ndarray, tail: float = 0.0) -> tuple[float, float, int]:
    """(mean of the WINDOWS batch means of the per-request values `x`, the half-width of its one-sided
    95 % Student-t interval, the fewest requests in a window); the half-width is NaN when a window
    holds fewer than max(MIN_WINDOW_REQUESTS, `tail`) requests (too few to judge: module docstring).

    >>> batch_means(np.tile([0.0, 1.0], 8000), np.repeat(np.arange(8), 2000))
    (0.5, 0.0, 2000)
    """
    counts = np.bincount(which, minlength=WINDOWS)[:WINDOWS]
    sums = np.zeros(WINDOWS)
    np.add.at(sums, which, x)
    if counts.min() < max(MIN_WINDOW_REQUESTS, tail):
        total = int(counts.sum())
        return (float(sums.sum()) / total if total else math.nan), math.nan, int(counts.min())
    means = sums / counts
    return float(means.mean()), T_QUANTILE * float(means.std(ddof=1)) / math.sqrt(WINDOWS), int(counts.min())


def _judged(band: tuple[float, float, int], target: float) -> str:
    """`fail` when the interval of `batch_means` lies past `target`, `pass` within it, else `undecided`."""
    centre, half, _ = band
    if math.isnan(half):
        return "undecided"
    return "fail" if centre - half > target else "pass" if centre + half <= target else "undecided"


def attainment_verdict(columns: Mapping[str, Any], met: np.ndarray, target: float,
                       t_end: float) -> dict[str, Any]:
    """The steady-state verdict of an SLO attainment (DistServe's: the fraction of requests meeting
    every latency SLO must reach `target`; `met` per request, rejected and unfinished ones False) over
    the second half of a run whose arrivals span `t_end` s: the batch means of the misses, a quantile
    SLO at q = `target` (module docstring). -> `steady_verdict`, `steady_attainment` (over the judged
    half), `attainment_low` (its one-sided 95 % lower bound; None when too few requests a window),
    `window_requests` (the fewest in a window) and `window_requests_needed`."""
    which = _windows(columns, t_end)
    keep = which >= 0
    tail = MIN_TAIL / (1 - target) if target < 1 else math.inf
    band = batch_means((~np.asarray(met, dtype=bool)[keep]).astype(float), which[keep], tail)
    centre, half, fewest = band
    return {"steady_verdict": _judged(band, 1 - target), "steady_attainment": 1 - centre,
            "attainment_low": None if math.isnan(half) else 1 - centre - half, "window_requests": fewest,
            "window_requests_needed": max(MIN_WINDOW_REQUESTS, tail)}
