"""The rate search's steady-state verdicts (`kvsim.planning.rate.steady`, `kvsim.planning.rate.windows`):
the trend of requests in the system and the SLO's batch means on constructed request columns whose
answers are known by hand, the extension rule on made-up runs, and a search whose answer no longer
moves with the duration it was given."""

import math

import numpy as np
import pytest

from kvsim.planning.rate import search as rt
from kvsim.planning.rate import bounds as rb
from kvsim.planning.rate.steady import bound_note, in_system_means, mann_kendall_z, settle, trend
from kvsim.planning.rate.windows import MIN_TAIL, MIN_WINDOW_REQUESTS, verdict


def test_in_system_means_and_the_trend_of_a_stable_and_a_growing_queue():
    arrival = np.arange(0.0, 400.0)                          # one request a second
    # each stays 5 s: 5 in the system at any time after the first 5 s, no trend
    flat = trend(arrival, arrival + 5.0, 400.0)
    assert in_system_means(arrival, arrival + 5.0, 200.0, 400.0).tolist() == [5.0] * 8
    assert flat.z == 0.0 and flat.excess == 0.0 and flat.mean_in_system == 5.0 and not flat.growing(0.025)
    # none finishes: N(t) = t, every arrival accumulates; every window pair rises (S = 28); the half
    # (200, 400] holds 199 arrivals, so N's slope of 1 /s is 200 / 199 of the arrival rate
    grow = trend(arrival, np.full(400, np.nan), 400.0)
    assert grow.excess == pytest.approx(200 / 199) and grow.z == pytest.approx(27 / math.sqrt(8 * 7 * 21 / 18))
    assert grow.growing(0.025) and not grow.growing(1.5)     # significant, but not above a 150 % limit
    # half of them never finish: half the arrivals accumulate
    half = np.where(np.arange(400) % 2 == 0, arrival + 5.0, np.nan)
    assert trend(arrival, half, 400.0).excess == pytest.approx(0.5 * 200 / 199)
    assert mann_kendall_z(np.array([3.0, 1.0, 2.0])) == 0.0  # S = -1 + -1 + 1 = -1: (S + 1) / sd = 0


def _columns(n, span, ttft):
    arrival = np.linspace(0.0, span, n, endpoint=False)
    ttft = np.broadcast_to(ttft, (n,))
    return {"arrival_s": arrival, "first_token_s": arrival + ttft, "finished_s": arrival + ttft + 1.0,
            "output_tokens": np.full(n, 2), "status": np.array(["finished"] * n, dtype=object)}


def test_batch_means_pass_fail_or_cannot_tell():
    need = MIN_TAIL / 0.01                                   # requests a window must hold for a p99
    big = int(need * 8 * 2)                                  # the second half holds 8 windows of `need`
    assert need == MIN_WINDOW_REQUESTS
    assert verdict(_columns(big, 1000.0, 0.1), {"ttft_p99": 2}, 1000.0) == "pass"
    assert verdict(_columns(big, 1000.0, 3.0), {"ttft_p99": 2}, 1000.0) == "fail"
    # 2 % of the requests late in every window: the fraction 0.02 > 0.01 with no spread: fail
    late = np.where(np.arange(big) % 50 == 0, 3.0, 0.1)
    assert verdict(_columns(big, 1000.0, late), {"ttft_p99": 2}, 1000.0) == "fail"
    assert verdict(_columns(big, 1000.0, late), {"ttft_p90": 2}, 1000.0) == "pass"
    # a short trace with a violation: too few requests a window to tell a p99
    assert verdict(_columns(400, 100.0, late[:400]), {"ttft_p99": 2}, 100.0) == "undecided"
    # no violation at all, but windows of fewer than `need` requests: still cannot tell (bursts cluster)
    assert verdict(_columns(int(8 * need), 100.0, 0.1), {"ttft_p99": 2}, 100.0) == "undecided"
    # a mean: the batch means' interval, on windows of MIN_WINDOW_REQUESTS; an infinite limit never fails
    assert verdict(_columns(big, 1000.0, 0.1), {"ttft_mean": 2}, 1000.0) == "pass"
    assert verdict(_columns(big, 1000.0, 3.0), {"ttft_mean": 2, "e2e_p99": math.inf}, 1000.0) == "fail"
    assert verdict(_columns(400, 100.0, 3.0), {"ttft_mean": 2}, 100.0) == "undecided"     # 25 a window


def _row(rate, span, verdict_, z=0.0, excess=0.0, meets=True):
    return {"rate": rate, "span_s": span, "status": "ok", "ttft_s_p99": 1.0 if meets else 3.0,
            "steady_verdict": verdict_, "trend_z": z, "trend_excess": excess}


def test_settle_runs_again_until_decided_and_marks_what_the_cap_leaves():
    calls = []

    def at(rates, spans):
        calls.append(list(zip(rates, spans)))
        out = []
        for r, s in zip(rates, spans):
            if r == 1.0:        # the cache still filling until 400 s, then steady
                out.append(_row(r, s, "pass", *((3.0, 0.1) if s < 400 else (0.5, 0.0))))
            elif r == 2.0:      # a queue that never stops growing
                out.append(_row(r, s, "pass", 3.0, 0.2))
            else:               # batch means that never tell
                out.append(_row(r, s, "undecided"))
        return out

    passes = (lambda row: rt.meets(row, {"ttft_p99": 2}))
    rows = settle([1.0, 2.0, 3.0], 100.0, 0.025, at, passes, max_span_s=800.0)
    assert calls == [[(1.0, 100.0), (2.0, 100.0), (3.0, 100.0)], [(1.0, 200.0), (2.0, 200.0), (3.0, 200.0)],
                     [(1.0, 400.0), (2.0, 400.0), (3.0, 400.0)], [(2.0, 800.0), (3.0, 800.0)]]
    assert [r["span_s"] for r in rows] == [400.0, 800.0, 800.0]
    assert passes(rows[0]) and not passes(rows[1]) and rows[1]["still_growing"] == 800.0
    assert passes(rows[2]) and rows[2]["undecided"] == 800.0
    assert bound_note(rows[2], None, 0.05).startswith("uncertain: on 800 s of arrivals")
    assert bound_note(rows[0], _row(1.2, 400.0, "fail", meets=False), 0.05).startswith("a lower bound")
    assert bound_note(rows[0], _row(1.04, 400.0, "fail", meets=False), 0.05) == ""
    # a real trace (no duration): nothing runs again, a growing pass is flagged
    real = settle([2.0], None, 0.025, lambda rates, spans: [_row(2.0, 50.0, "pass", 3.0, 0.2)], passes)
    assert real[0]["growing_at_end"] == 50.0 and passes(real[0])


def test_the_answer_does_not_move_with_the_duration(monkeypatch):
    """A made-up engine whose knee is 1.0 req/s at steady state, but whose runs above it pass on traces
    shorter than 400 s (the queue has not built yet, and its trend shows it growing): the old search
    answered with the duration, the steady one answers 1.0 from every duration."""
    monkeypatch.setattr(rb, "start_rate_rps", lambda cfg, sample: 2.0)
    monkeypatch.setattr(rb, "serve_ceiling_rps", lambda cfg, sample: 10.0)

    def evaluate(rates, spans, cfg, workload, trace, workers, slo):
        rows = []
        for r, s in zip(rates, spans):
            if r <= 1.0:
                rows.append(_row(r, s, "pass", 0.3, 0.0))
            elif s < 400:
                rows.append(_row(r, s, "pass", 3.0, 0.1))
            else:
                rows.append({**_row(r, s, "fail", 3.0, 0.1, meets=False), "stopped_early_s": 390.0,
                             "requests_total": r * s})
        return rows

    monkeypatch.setattr(rt, "_evaluate", evaluate)
    answers = [rt.max_rate({"ttft_p99": 2.0}, preset="alpaca", duration_s=d, model="opt-13b", kv_gib=12,
                           rel_tol=0.05) for d in (100.0, 600.0, 3600.0)]
    for a in answers:           # (each search takes its own path to the bracket: within the tolerance)
        assert 1.0 / 1.05 <= a.rate_rps <= 1.0 < a.hi_rps <= 1.05 * a.rate_rps and a.note == ""
    assert answers[0].span_s == 100.0 and answers[0].knee["span_s"] == 400.0
