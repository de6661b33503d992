"""Whether a run reached a steady state: is the number of requests in the system still growing?

A rate search that judges a rate by a latency quantile over a finite trace answers with the trace's
length: a rate above what the engine sustains has not built its queue yet on a short trace, and a
rate below it may still be filling its KV cache (its latencies not yet those it settles at). Queueing
theory's test of a rate is stability: at a stable rate the number of requests in the system, N(t),
settles to a stationary level; above it N grows without bound (by Little's law, so does the wait).

The test (`trend`) follows steady-state simulation practice (A. M. Law, *Simulation Modeling and
Analysis*, 5th ed., ch. 9: delete the warm-up, then judge batch means): the first half of the trace's
span is taken as warm-up (Welch's procedure picks a cut by eye; half is its conservative rule when no
one looks), the second half is cut into `WINDOWS` equal windows, and the time-average of N(t) in each
(a batch mean, from the requests' arrival and finish times) goes into a one-sided Mann-Kendall trend
test (H. B. Mann, Econometrica 13, 1945; M. G. Kendall, *Rank Correlation Methods*, 1975): S = sum over
window pairs i < j of sign(x_j - x_i), Var S = n (n - 1) (2n + 5) / 18, z = (S - 1) / sqrt(Var S),
growing when z exceeds the normal quantile of `ALPHA`. Batch means of a queue are correlated, so the
test alone would flag stable runs; a trend also has to matter: Sen's slope of the window means (the
median of the pairwise slopes: P. K. Sen, JASA 63, 1968) over the arrival rate is the fraction of
arrivals that accumulate instead of being served, `excess`, and only an excess above `max_excess`
counts. An engine that accumulates a fraction e of its arrivals serves (1 - e) of the rate, so a rate
passed with e below half the search's tolerance is within that tolerance of a rate it sustains.

A run whose trend says "growing" has not decided: the search runs it again on a trace twice as long
(`MAX_SPAN_S` at most), which either breaks the SLO (the queue builds), settles (the cache was still
filling) or still grows at the cap, where the rate counts as failing: arrivals outrun the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

#: Windows (batch means) of the judged half of a run. Eight keep one-sided Mann-Kendall significance
#: reachable (S <= 28; p = 0.05 needs S >= 15) with windows of span / 16 each.
WINDOWS = 8
#: One-sided significance of the trend test, and its normal quantile.
ALPHA, Z_ALPHA = 0.05, 1.6449
#: The longest trace (s) a rate is extended to while its run still grows: the paper's one-hour traces
#: (vLLM paper, section 6) and the longest duration issue 41 asks the answer to agree with.
MAX_SPAN_S = 3600.0
#: Most requests an extended run may hold (a high rate reaches its steady state in fewer seconds:
#: short requests leave the system fast); the span cap is the smaller of the two, never under the
#: user's --duration.
MAX_SPAN_REQUESTS = 200_000


@dataclass(frozen=True)
class Trend:
    """The trend of requests in the system over the second half of a run: `z` (the Mann-Kendall
    statistic), `excess` (Sen's slope of N over the half's arrival rate: the fraction of arrivals
    accumulating, < 0 when draining), `mean_in_system` (time-average N over the half), `span_s` (the
    trace's span, s)."""

    z: float
    excess: float
    mean_in_system: float
    span_s: float

    def growing(self, max_excess: float) -> bool:
        """Significant at ALPHA and accumulating more than `max_excess` of the arrivals."""
        return growing(self.z, self.excess, max_excess)


def growing(z: float, excess: float, max_excess: float) -> bool:
    """Whether a trend (`Trend`'s `z`, `excess`) says the run still grows: z above the one-sided normal
    quantile of ALPHA and more than `max_excess` of the arrivals accumulating."""
    return bool(z > Z_ALPHA and excess > max_excess)


def in_system_means(arrival_s: np.ndarray, finished_s: np.ndarray, start_s: float, end_s: float,
                    windows: int = WINDOWS) -> np.ndarray:
    """Time-average number of requests in the system (arrived, not yet finished) in each of `windows`
    equal windows of [start_s, end_s]; a NaN finish (never finished) counts as still there.

    >>> in_system_means(np.array([0.0, 1.0]), np.array([2.0, np.nan]), 0.0, 4.0, windows=2).tolist()
    [1.5, 1.0]
    """
    a = np.asarray(arrival_s, dtype=float)
    f = np.where(np.isnan(finished_s), np.inf, np.asarray(finished_s, dtype=float))
    edges = np.linspace(start_s, end_s, windows + 1)
    out = np.empty(windows)
    for k in range(windows):
        lo, hi = edges[k], edges[k + 1]
        overlap = np.clip(np.minimum(f, hi) - np.maximum(a, lo), 0.0, None)
        out[k] = overlap.sum() / (hi - lo)
    return out


def mann_kendall_z(x: np.ndarray) -> float:
    """One-sided Mann-Kendall statistic of the series `x` (module docstring): about N(0, 1) without a
    trend, large and positive for a rising one (0 for a series of fewer than 3 values).

    >>> round(mann_kendall_z(np.arange(8.0)), 3)          # S = 28: every pair rises
    3.34
    """
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < 3:
        return 0.0
    s = sum(np.sign(x[j] - x[i]) for i in range(n - 1) for j in range(i + 1, n))
    var = n * (n - 1) * (2 * n + 5) / 18
    return float((s - np.sign(s)) / math.sqrt(var))


def sen_slope(x: np.ndarray, dt: float) -> float:
    """Sen's slope of `x` sampled every `dt` s: the median of (x_j - x_i) / ((j - i) dt) over i < j."""
    n = len(x)
    slopes = [(x[j] - x[i]) / ((j - i) * dt) for i in range(n - 1) for j in range(i + 1, n)]
    return float(np.median(slopes)) if slopes else 0.0


def trend(arrival_s: np.ndarray, finished_s: np.ndarray, span_s: float) -> Trend:
    """The trend of a run's requests in the system over (span_s / 2, span_s] (module docstring); the
    arrival rate is that of the half (a real trace's rate may vary). Rejected requests: pass them with a
    finish equal to their arrival (they never enter)."""
    start = span_s / 2
    a = np.asarray(arrival_s, dtype=float)
    means = in_system_means(a, finished_s, start, span_s)
    arrivals = int(((a > start) & (a <= span_s)).sum())
    rate = arrivals / (span_s - start) if arrivals else math.inf
    excess = sen_slope(means, (span_s - start) / len(means)) / rate
    return Trend(mann_kendall_z(means), excess, float(means.mean()), span_s)


def span_cap_s(duration_s: float, rate_rps: float, max_span_s: float = MAX_SPAN_S) -> float:
    """The longest trace a run at `rate_rps` is extended to: `max_span_s`, or the span of
    MAX_SPAN_REQUESTS arrivals when shorter, never under `duration_s`."""
    return max(duration_s, min(max_span_s, MAX_SPAN_REQUESTS / rate_rps))


def decided(row: dict, passes: bool, max_excess: float) -> bool:
    """Whether a run's verdict stands at steady state: a pass whose requests in the system do not grow
    and whose batch means pass (`kvsim.planning.rate.windows`), or a failure whose queue grows or whose
    batch means fail; anything else needs a longer trace."""
    grows = growing(row.get("trend_z", 0.0), row.get("trend_excess", 0.0), max_excess)
    steady = row.get("steady_verdict", "pass" if passes else "fail")
    return (passes and not grows and steady == "pass") or (not passes and (grows or steady == "fail"))


def settle(rates: Sequence[float], duration_s: float | None, max_excess: float,
           evaluate_at: Callable[[list[float], list[float]], list[dict]], passes: Callable[[dict], bool],
           progress: Callable[[str], None] | None = None, max_span_s: float = MAX_SPAN_S) -> list[dict]:
    """The rows of `rates`' runs, each judged on a trace long enough to decide (`decided`): a run that
    has not runs again on a trace twice as long, up to `span_cap_s` (`max_span_s`). At the cap the run's
    own verdict stands, marked `undecided` (its span), but a pass whose queue still grows or whose batch
    means fail gets `still_growing` (its span; it fails). `evaluate_at(rates, spans)` makes the runs; `duration_s` None (a real trace, whose
    length is its own) extends nothing and marks such a pass `growing_at_end` instead."""
    spans = {r: duration_s for r in rates}
    rows: dict[float, dict] = {}
    todo = list(rates)
    while todo:
        for r, row in zip(todo, evaluate_at(todo, [spans[r] for r in todo])):
            rows[r] = row
        again = []
        for r in todo:
            row, ok = rows[r], passes(rows[r])
            if decided(row, ok, max_excess):
                continue
            grows = growing(row.get("trend_z", 0.0), row.get("trend_excess", 0.0), max_excess)
            cap = math.inf if duration_s is None else span_cap_s(duration_s, r, max_span_s)
            if spans[r] is not None and spans[r] < cap:
                spans[r] = min(2 * spans[r], cap)
                again.append(r)
                if progress is not None:
                    why = (f"requests in the system still growing ({row['trend_excess']:+.1%} of arrivals "
                           f"accumulating, Mann-Kendall z = {row['trend_z']:.2f})" if grows else
                           "its batch means cannot tell the SLO's verdict yet")
                    progress(f"rate search: {r:.4g} req/s {'met' if ok else 'missed'} the SLO on a "
                             f"{row['span_s']:.0f} s trace but {why}: running it again on {spans[r]:.0f} s")
            elif ok and (grows or row.get("steady_verdict") == "fail"):
                row["growing_at_end" if duration_s is None else "still_growing"] = row["span_s"]
            else:
                row["undecided"] = row["span_s"]
        todo = again
    return [rows[r] for r in rates]


def bound_note(lo: dict[str, Any], hi: dict[str, Any] | None, rel_tol: float) -> str:
    """Why an answer is a bound rather than a steady-state rate within `rel_tol` ('' when it is one):
    `lo` the passing row answered, `hi` the lowest failing row (None: none failed)."""
    if lo.get("growing_at_end"):
        return ("a bound: requests in the system were still growing at the end of the trace; a longer trace "
                "at this rate would likely serve less")
    if lo.get("undecided"):
        return (f"uncertain: on {lo['undecided']:.0f} s of arrivals (the longest trace tried) the batch means of "
                "this rate's run still could not tell its steady-state verdict; a longer trace (--max-span) "
                "decides")
    if hi is not None and (hi["rate"] - lo["rate"]) / lo["rate"] > rel_tol * (1 + 1e-9):
        return (f"a lower bound: the search ran out of runs with the knee between {lo['rate']:.4g} and "
                f"{hi['rate']:.4g} req/s (raise --max-runs)")
    return ""
