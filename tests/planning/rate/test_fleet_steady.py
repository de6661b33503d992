"""A fleet's steady-state verdict (`kvsim.planning.rate.fleet_steady.judge`) on hand-built runs: a single
FIFO server, every request's first token (and finish) at its service completion, so its queue is known
in closed form."""

import numpy as np
import pytest

from kvsim.planning.rate.fleet_steady import judge

SLO = {"ttft_p99": 0.3}


def fifo(rate: float, service_rps: float, span: float) -> tuple[dict, dict, float]:
    """Arrivals every 1/`rate` s over [0, span), served one at a time at `service_rps`: request i finishes
    at max(arrival, previous finish) + 1/service_rps. (summary, columns, span) as `judge` wants them."""
    a = np.arange(int(round(rate * span))) / rate
    f = np.empty_like(a)
    t = 0.0
    for i, x in enumerate(a):
        t = max(t, x) + 1 / service_rps
        f[i] = t
    cols = {"arrival_s": a, "first_token_s": f, "finished_s": f, "output_tokens": np.ones_like(a),
            "status": np.array(["finished"] * len(a))}
    return {"ttft_s": {"p99": float(np.quantile(f - a, 0.99))}}, cols, span


def passes(summary: dict) -> bool:
    return summary["ttft_s"]["p99"] <= SLO["ttft_p99"]


def run(rate: float, service: float, duration: float, cap: float):
    spans = []

    def run_at(span):
        spans.append(span)
        return fifo(rate, service, span)

    v = judge(run_at, SLO, passes, duration, rate, max_excess=0.025, max_span_s=cap)
    return v, spans


def test_a_queue_growing_under_a_short_passing_trace_fails_on_the_longer_one():
    # 1000 req/s into a 900 req/s server: request i waits (i + 1)/900 - i/1000 ~ i/9000 s. On 2 s the
    # worst wait is 2000/9000 = 0.22 s (passes ttft_p99 <= 0.3), but N(t) = 100 t grows: excess = 100/1000
    # = 10 % of arrivals > 2.5 %, z = 3.34 (every window pair rises) -> rerun on 4 s, where waits pass
    # 0.3 s from i = 2700: 1300 of 4000 late (33 % > 1 %) -> fail, decided by the growing queue.
    assert passes(fifo(1000, 900, 2.0)[0])
    v, spans = run(1000, 900, 2.0, cap=3600)
    assert spans == [2.0, 4.0]
    assert not v.ok and v.span_s == 4.0 and v.note == "" and v.runs == 2
    assert round(v.summary["trend_excess"], 3) == 0.1 and round(v.summary["trend_z"], 2) == 3.34


def test_a_growing_pass_at_the_span_cap_fails_as_still_growing():
    v, spans = run(1000, 900, 2.0, cap=2.0)           # no longer trace allowed: the pass does not stand
    assert spans == [2.0] and not v.ok and v.note.startswith("still growing")
    assert v.summary["meets_slo"] is False


def test_a_stable_fleet_passes_on_its_first_trace():
    # 1000 req/s into a 2000 req/s server: every request waits 0.5 ms, N(t) = 0.5 flat (z = 0). The second
    # half of 20 s holds 10,000 requests, 1,250 a window (>= 1,000), none late -> the batch means pass.
    v, spans = run(1000, 2000, 20.0, cap=3600)
    assert spans == [20.0] and v.ok and v.note == "" and v.summary["steady_verdict"] == "pass"


def test_a_stable_pass_too_short_to_tell_reruns_then_stands_uncertain_at_the_cap():
    # 100 req/s for 2 s: 12 requests a window, too few for batch means -> 4 s, then the 8 s cap
    v, spans = run(100, 2000, 2.0, cap=8.0)
    assert spans == [2.0, 4.0, 8.0] and v.ok and v.note.startswith("uncertain: on 8 s")


def test_attainment_batch_means_pass_fail_or_cannot_tell():
    """A P:D layout's attainment (`windows.attainment_verdict`, target 90 %: misses <= 10 %) on 16,000
    requests over 1,000 s: the second half's 8 windows hold 1,000 each."""
    from kvsim.planning.rate.windows import attainment_verdict

    cols = fifo(16, 2000, 1000.0)[1]
    i = np.arange(16_000)
    every = attainment_verdict(cols, np.ones(16_000, bool), 0.9, 1000.0)
    assert (every["steady_verdict"], every["steady_attainment"], every["attainment_low"]) == ("pass", 1.0, 1.0)
    fifth = attainment_verdict(cols, i % 5 != 0, 0.9, 1000.0)          # 20 % miss in every window
    assert fifth["steady_verdict"] == "fail" and fifth["attainment_low"] == pytest.approx(0.8)
    # misses 5 % in even windows, 15 % in odd ones: mean 10 % (the limit), spread 0.0535 -> undecided;
    # the lower bound 0.9 - 1.895 x 0.0535 / sqrt(8)
    window = (i - 8000) // 1000
    miss = np.where(window % 2 == 0, i % 20 == 0, i % 20 < 3)
    mixed = attainment_verdict(cols, ~miss, 0.9, 1000.0)
    assert mixed["steady_verdict"] == "undecided"
    assert mixed["attainment_low"] == pytest.approx(0.9 - 1.895 * np.std([0.05, 0.15] * 4, ddof=1) / 8 ** 0.5)
    short = attainment_verdict(fifo(16, 2000, 100.0)[1], np.ones(1600, bool), 0.9, 100.0)  # 100 a window
    assert (short["steady_verdict"], short["attainment_low"], short["window_requests"]) == ("undecided", None, 100)


def test_judge_with_the_attainment_windows_decides_a_fail_and_reruns_an_undecided_pass():
    """`judge(windows=...)` as the P:D split search calls it: a layout missing 20 % of its requests in
    every window fails on its first run (decided by the batch means, not a growing queue); one passing
    its trace whose batch means sit at the limit runs again until the cap, then stands uncertain."""
    from kvsim.planning.rate.windows import attainment_verdict

    def run_at(span):
        spans.append(span)
        return fifo(16, 2000, 1000.0)

    def windows(miss):
        return lambda cols, span: attainment_verdict(cols, ~miss, 0.9, span)

    i = np.arange(16_000)
    spans = []
    v = judge(run_at, {}, lambda s: False, 1000.0, 16, 0.025, 4000.0, windows=windows(i % 5 == 0))
    assert spans == [1000.0] and not v.ok and v.note == "" and v.summary["steady_verdict"] == "fail"
    spans = []
    miss = np.where(((i - 8000) // 1000) % 2 == 0, i % 20 == 0, i % 20 < 3)
    v = judge(run_at, {}, lambda s: True, 1000.0, 16, 0.025, 4000.0, windows=windows(miss))
    # (the stub answers every span with the same 1,000 s run, which the verdict names)
    assert spans == [1000.0, 2000.0, 4000.0] and v.ok and v.note.startswith("uncertain: on 1000 s")
