"""A fleet's SLO verdict at steady state (issue 41): fleet planning (`kvsim.planning.rate.fleet_gpus`)
judges each candidate fleet as the single-replica rate search judges a rate, by the same method and the
same code: the Mann-Kendall trend of requests in the system over the second half of the trace
(`kvsim.planning.rate.steady.trend`), the batch means of the SLO with a Student-t interval
(`kvsim.planning.rate.windows.verdict`), and, while the two cannot decide (`steady.decided`), the fleet
runs again on a trace twice as long, up to the span cap (`steady.span_cap_s`, --max-span). At the cap a
pass whose queue still grows (or whose batch means fail) fails; a pass the batch means still cannot tell
stands, marked uncertain. A fleet whose routed arrivals outrun its replicas builds its queue slowly
enough to pass a short trace; this is what stops fleet planning from answering too few replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from kvsim.planning.rate.steady import decided, growing, span_cap_s, trend
from kvsim.planning.rate.windows import verdict


@dataclass(frozen=True)
class FleetVerdict:
    """A fleet's steady-state verdict: `ok` (meets the SLO), `summary` (the run judged last, `meets_slo`
    set), `span_s` (the trace span judged on, s), `note` ('' when decided; else why not: `still growing`
    fails, `uncertain` passes) and `runs` (fleet simulations made)."""

    ok: bool
    summary: dict
    span_s: float
    note: str
    runs: int


def steady_row(columns: Mapping[str, Any], span_s: float, slo: Mapping[str, float]) -> dict[str, Any]:
    """A run's steady-state figures over (span_s / 2, span_s] from its per-request columns (rejected
    requests leave at arrival), as `kvsim.planning.rate.runs` records them for one replica: `trend_z`,
    `trend_excess`, `trend_in_system`, `steady_verdict`."""
    arrival = np.asarray(columns["arrival_s"], dtype=float)
    finished = np.asarray(columns["finished_s"], dtype=float)
    finished = np.where(np.asarray(columns["status"]) == "rejected", arrival, finished)
    t = trend(arrival, np.where(finished > span_s, np.nan, finished), span_s)
    return {"trend_z": t.z, "trend_excess": t.excess, "trend_in_system": t.mean_in_system,
            "steady_verdict": verdict(columns, slo, span_s)}


def judge(run_at: Callable[[float | None], tuple[dict, Mapping[str, Any], float]], slo: Mapping[str, float],
          passes: Callable[[dict], bool], duration_s: float | None, rate_rps: float, max_excess: float,
          max_span_s: float) -> FleetVerdict:
    """The steady-state verdict of one fleet (module docstring). `run_at(span)` simulates it on a trace of
    `span` s (None: the given trace, which is not extended) -> (summary, per-request columns, the span
    judged, s); `passes(summary)` is the plain SLO check of the whole trace; `max_excess` the fraction of
    arrivals that may accumulate (`steady.growing`); `duration_s` the first span (None: a real trace)."""
    span, runs = duration_s, 0
    cap = math.inf if duration_s is None else span_cap_s(duration_s, rate_rps, max_span_s)
    while True:
        summary, columns, judged = run_at(span)
        runs += 1
        ok = passes(summary)
        row = steady_row(columns, judged, slo)
        summary.update(row, span_s=judged)
        if decided(row, ok, max_excess):
            return _done(summary, ok, judged, "", runs)
        if span is not None and span < cap:
            span = min(2 * span, cap)
            continue
        grows = growing(row["trend_z"], row["trend_excess"], max_excess)
        if ok and (grows or row["steady_verdict"] == "fail"):
            why = ("requests in the system still growing" if grows else "its batch means fail the SLO")
            return _done(summary, False, judged, f"still growing: passed {judged:.0f} s of arrivals but {why} "
                         "(not stable at this rate)", runs)
        return _done(summary, ok, judged, f"uncertain: on {judged:.0f} s of arrivals (the longest trace tried) "
                     "the batch means could not tell the steady-state verdict (a longer --max-span decides)", runs)


def _done(summary: dict, ok: bool, span_s: float, note: str, runs: int) -> FleetVerdict:
    summary["meets_slo"] = ok
    return FleetVerdict(ok, summary, span_s, note, runs)


def unsteady_note(columns: Mapping[str, Any], span_s: float, max_excess: float = 0.025) -> str:
    """'' when the requests in the system of a run (per-request `arrival_s`, `finished_s`, `status`) do
    not grow over (span_s / 2, span_s] (`steady.trend`), else why the run is not stable: what the P:D
    split search (`kvsim.fleet.disagg.plan.split_search`, `steady=`) asks of a layout meeting its
    attainment target on the trace as given. `max_excess`: half the rate search's default tolerance."""
    row = steady_row(columns, span_s, {})
    if not growing(row["trend_z"], row["trend_excess"], max_excess):
        return ""
    return (f"requests in the system still growing at the end of the {span_s:.0f} s trace "
            f"({row['trend_excess']:+.1%} of arrivals accumulating, Mann-Kendall z = {row['trend_z']:.2f})")
