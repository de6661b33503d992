"""A fleet's SLO verdict at steady state (issue 41): fleet planning (`kvsim.planning.rate.fleet_gpus`)
judges each candidate fleet as the single-replica rate search judges a rate, by the same method and the
same code: the Mann-Kendall trend of requests in the system over the second half of the trace
(`kvsim.planning.rate.steady.trend`), the batch means of the SLO with a Student-t interval
(`kvsim.planning.rate.windows.verdict`), and, while the two cannot decide (`steady.decided`), the fleet
runs again on a trace twice as long, up to the span cap (`steady.span_cap_s`, --max-span). At the cap a
pass whose queue still grows (or whose batch means fail) fails; a pass the batch means still cannot tell
stands, marked uncertain. A fleet whose routed arrivals outrun its replicas builds its queue slowly
enough to pass a short trace; this is what stops fleet planning from answering too few replicas.
The P:D split search (`kvsim.fleet.disagg.plan.split_search`) judges each layout with the same `judge`,
its SLO being an attainment (`windows.attainment_verdict`: the batch means of the misses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from kvsim.planning.rate.steady import decided, growing, span_cap_s, trend
from kvsim.planning.rate.windows import attainment_verdict, verdict


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


def steady_row(columns: Mapping[str, Any], span_s: float, slo: Mapping[str, float],
               windows: Callable[[Mapping[str, Any], float], dict] | None = None) -> dict[str, Any]:
    """A run's steady-state figures over (span_s / 2, span_s] from its per-request columns (rejected
    requests leave at arrival), as `kvsim.planning.rate.runs` records them for one replica: `trend_z`,
    `trend_excess`, `trend_in_system`, `steady_verdict`. `windows(columns, span_s)`: the batch-means
    figures instead of `verdict`'s for `slo` (a dict with `steady_verdict`: a P:D layout's attainment,
    `kvsim.planning.rate.windows.attainment_verdict`)."""
    arrival = np.asarray(columns["arrival_s"], dtype=float)
    finished = np.asarray(columns["finished_s"], dtype=float)
    finished = np.where(np.asarray(columns["status"]) == "rejected", arrival, finished)
    t = trend(arrival, np.where(finished > span_s, np.nan, finished), span_s)
    judged = windows(columns, span_s) if windows is not None else {"steady_verdict": verdict(columns, slo, span_s)}
    return {"trend_z": t.z, "trend_excess": t.excess, "trend_in_system": t.mean_in_system, **judged}


def judge(run_at: Callable[[float | None], tuple[dict, Mapping[str, Any], float]], slo: Mapping[str, float],
          passes: Callable[[dict], bool], duration_s: float | None, rate_rps: float, max_excess: float,
          max_span_s: float, windows: Callable[[Mapping[str, Any], float], dict] | None = None) -> FleetVerdict:
    """The steady-state verdict of one fleet (module docstring). `run_at(span)` simulates it on a trace of
    `span` s (None: the given trace, which is not extended) -> (summary, per-request columns, the span
    judged, s); `passes(summary)` is the plain SLO check of the whole trace; `max_excess` the fraction of
    arrivals that may accumulate (`steady.growing`); `duration_s` the first span (None: a real trace);
    `windows`: `steady_row`'s (None: the batch means of `slo`)."""
    span, runs = duration_s, 0
    cap = math.inf if duration_s is None else span_cap_s(duration_s, rate_rps, max_span_s)
    while True:
        summary, columns, judged = run_at(span)
        runs += 1
        ok = passes(summary)
        row = steady_row(columns, judged, slo, windows)
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
        longest = "the longest trace tried" if duration_s is not None else "the trace as given, not extended"
        decides = "a longer --max-span decides" if duration_s is not None else "a longer trace decides"
        return _done(summary, ok, judged, f"uncertain: on {judged:.0f} s of arrivals ({longest}) the batch "
                     f"means could not tell the steady-state verdict ({decides})", runs)


def _done(summary: dict, ok: bool, span_s: float, note: str, runs: int) -> FleetVerdict:
    summary["meets_slo"] = ok
    return FleetVerdict(ok, summary, span_s, note, runs)



def judge_attainment(run_at: Callable[[float | None], tuple[Mapping[str, Any], float]],
                     met: Callable[[Mapping[str, Any]], np.ndarray], target: float, **judging: Any) -> FleetVerdict:
    """A P:D layout's steady-state verdict (`kvsim.fleet.disagg.plan.split_search`): `judge` with an SLO
    attainment for its SLO, at least `target` of the requests meeting every latency SLO, on the whole
    trace and by the batch means of the misses over its second half (`windows.attainment_verdict`).
    `run_at(span)` -> (per-request columns, the span judged, s); `met(columns)`: per request, True when
    it met every SLO; `judging`: `judge`'s `duration_s`, `rate_rps`, `max_excess`, `max_span_s`. The
    verdict's summary holds `attainment` and the `attainment_verdict` figures."""
    def run(span: float | None) -> tuple[dict, Mapping[str, Any], float]:
        columns, judged = run_at(span)
        ok = np.asarray(met(columns), dtype=bool)
        return {"attainment": float(ok.mean()) if len(ok) else 0.0}, columns, judged

    return judge(run, {}, lambda s: s["attainment"] >= target,
                 windows=lambda columns, span: attainment_verdict(columns, met(columns), target, span), **judging)
