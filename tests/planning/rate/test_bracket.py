"""The rate search's arithmetic (kvsim/planning/rate/bracket.py, rate_bounds.start_rate_rps), worked
out by hand: the first guess from time-weighted footprints, the step down from a failing run, the next
rate inside a bracket, and a whole search against a made-up latency curve."""

import math
from types import SimpleNamespace

import pytest

import kvsim.engine.build
import kvsim.planning.rate.search as rt
import kvsim.planning.rate.bounds as rb
from kvsim.planning.rate.bracket import Descent, Tried, done, narrow
from kvsim.planning.runs import make_config
from kvsim.trace.table import Trace


class _LinearCost:
    """Step time 10 ms + 1 ms per decoding sequence + 1 us per context token + 10 us per prefill token."""

    def step_time(self, prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens):
        return 0.01 + 1e-3 * decode_seqs + 1e-6 * decode_context_tokens + 1e-5 * prefill_tokens


@pytest.mark.parametrize("max_num_seqs", [256, 16])
def test_start_rate_by_hand(monkeypatch, max_num_seqs):
    # two requests: (P 10, M 11) and (P 30, M 21), one sample each, a 1,000-slot cache, no CPU time.
    # decode slots n (M - 1): 10 and 20, mean 15; slot-steps held (M - 1) M / 2 + (M - 1) P:
    # 55 + 100 = 155 and 210 + 600 = 810, mean 482.5; prompts: mean 20, mean square 500.
    parts = SimpleNamespace(cost=_LinearCost(), profile=None, capacity_tokens=1000)
    monkeypatch.setattr(kvsim.engine.build, "build_run", lambda trace, cfg: parts)
    cfg = make_config(model="opt-13b", kv_gib=12, max_num_seqs=max_num_seqs, max_batched_tokens=8192)
    sample = Trace.from_arrays([0.0, 1.0], [10, 30], [11, 21])
    # arrivals per step a: the cache 1000 / 482.5 = 2.07; the token budget 8192 / (20 + 15) = 234;
    # max_num_seqs / 15: 17.1 at 256 (the cache decides), 1.07 at 16 (the batch cap decides)
    a = 1000 / 482.5 if max_num_seqs == 256 else 16 / 15
    step = 0.01 + 1e-3 * (15 * a) + 1e-6 * (482.5 * a) + 1e-5 * (20 * a)
    assert rb.start_rate_rps(cfg, sample) == pytest.approx(a / step, rel=1e-12)
    # with CPU time 2 ms + 0.1 ms per sequence (15 a decoding + a prefilling)
    parts.profile = SimpleNamespace(cpu_seconds=lambda seqs: 0.002 + 1e-4 * seqs)
    assert rb.start_rate_rps(cfg, sample) == pytest.approx(a / (step + 0.002 + 1e-4 * 16 * a), rel=1e-12)


def test_descent_by_hand():
    tol = 0.05
    d = Descent(tol)
    # stop fraction 0.0016 -> 0.0016 ** 0.25 = 0.2, kept at 1/1.5 (the first step's steepest)
    assert d.factor(Tried(2.0, False, stop_frac=0.0016)) == pytest.approx(1 / 1.5)
    # 0.6561 -> 0.9, inside [1/2 (steps may grow now), 1/1.05]
    assert d.factor(Tried(1.33, False, stop_frac=0.6561)) == pytest.approx(0.9)
    # late misses: held at 1/1.05 twice, then 1/1.05^2, then 1/1.05^4 (a guess that keeps saying near)
    late = [d.factor(Tried(1.2, False, stop_frac=0.99)) for _ in range(4)]
    assert late == pytest.approx([1 / 1.05, 1 / 1.05, 1 / 1.05 ** 2, 1 / 1.05 ** 4])
    # a failing run that went to the end at 1.2x its limit: 1 / 1.2; the next at 1.1x, one step lower
    # (4 -> 10/3 req/s): latency ~ rate ** k with k = ln(1.2 / 1.1) / ln(1.2) = 0.4772, so the limit is
    # met at 1.1 ** (-1 / k) = 0.8190 of 10/3 req/s
    d = Descent(tol)
    assert d.factor(Tried(4.0, False, worst=1.2)) == pytest.approx(1 / 1.2)
    k = math.log(1.2 / 1.1) / math.log(4.0 / (10 / 3))
    assert d.factor(Tried(10 / 3, False, worst=1.1)) == pytest.approx(1.1 ** (-1 / k))
    assert 1.1 ** (-1 / k) == pytest.approx(0.8190, abs=1e-4)
    # a latency that did not grow with the rate: as steep as allowed (1/2)
    assert d.factor(Tried(2.73, False, worst=1.1)) == pytest.approx(0.5)


def test_narrow_by_hand():
    tol = 0.05
    # 1.1 / 1.0 <= 1.05 ** 2: the geometric middle ends the search whatever its verdict
    x = narrow(Tried(1.0, True), Tried(1.1, False), tol)
    assert x == pytest.approx(math.sqrt(1.1)) and done(1.0, x, tol) and done(x, 1.1, tol)
    # a pass at 0.6 of its limit: one tolerance step above it
    assert narrow(Tried(1.0, True, worst=0.6), Tried(2.0, False, stop_frac=0.1), tol) == pytest.approx(1.05)
    # a failure that stopped at 90 % of its span: one tolerance step below it
    assert narrow(Tried(1.0, True, worst=0.2), Tried(2.0, False, stop_frac=0.9), tol) == pytest.approx(2 / 1.05)
    # nothing says where: the geometric middle
    assert narrow(Tried(1.0, True, worst=0.2), Tried(2.0, False, stop_frac=0.3), tol) == pytest.approx(math.sqrt(2))
    assert done(1.0, 1.05, tol) and not done(1.0, 1.0501, tol)


def test_search_on_a_made_up_curve(monkeypatch):
    # knee at 1.01 req/s, an SLO on the mean TTFT (a missed mean can stop a run at any time): a run above
    # the knee stops at (1 / rate) ** 4 of its span (so the step down from it would be 1 / rate), one
    # below passes at 0.4 of its limit. Start 2.0, ceiling 10.
    monkeypatch.setattr(rb, "start_rate_rps", lambda cfg, sample: 2.0)
    monkeypatch.setattr(rb, "serve_ceiling_rps", lambda cfg, sample: 10.0)

    def evaluate(rates, spans, cfg, workload, trace, workers, slo):
        rows = []
        for r in rates:
            row = {"rate": r, "status": "ok", "requests_total": 100 * r, "ttft_s_mean": 0.8, "error": ""}
            if r > 1.01:
                row.update(stopped_early_s=100 * (1 / r) ** 4, ttft_s_mean=3.0)
            rows.append(row)
        return rows

    monkeypatch.setattr(rt, "_evaluate", evaluate)
    res = rt.max_rate({"ttft_mean": 2.0}, preset="alpaca", duration_s=100, model="opt-13b", kv_gib=12,
                      rel_tol=0.05)
    # the same rates whatever the worker count (two workers made it trisect the bracket before)
    two = rt.max_rate({"ttft_mean": 2.0}, preset="alpaca", duration_s=100, model="opt-13b", kv_gib=12,
                      rel_tol=0.05, workers=2)
    assert list(two.curve.rate) == list(res.curve.rate)
    # 2.0 fails, stop 1/16 -> 0.5, kept at 1/1.5: 4/3; fails, stop (3/4)^4 -> 0.75 (steps to 1/2 now
    # allowed): 1.0, passes (0.4 of the limit); bracket [1, 4/3], the failure early (0.32 of its span):
    # the middle (4/3)^0.5 = 1.1547, fails; [1, 1.1547] -> 1.0746, fails (1.0746 <= 1.05^2) -> 1.0366,
    # fails: [1.0, 1.0366] is within 5 %
    want = [2.0, 4 / 3, 1.0, (4 / 3) ** 0.5, (4 / 3) ** 0.25, (4 / 3) ** 0.125]
    assert list(res.curve.rate) == pytest.approx(sorted(want))
    assert res.rate_rps == pytest.approx(1.0) and res.knee["rate"] == pytest.approx((4 / 3) ** 0.125)


def test_stop_fraction_of_a_run_row():
    # 300 requests at 2 req/s span 150 s; stopped at 112.5 s: 0.75 of it. A missed p50 stops a run
    # only once half the requests are decided, so it reads (0.75 - 0.5) / 0.5 = 0.5; a mean: 0.75
    row = {"rate": 2.0, "status": "ok", "requests_total": 300, "stopped_early_s": 112.5, "meets_slo": False}
    assert rt._tried(row, {"e2e_p50": 10.0}) == Tried(2.0, False, 0.5, None)
    assert rt._tried(row, {"ttft_mean": 1.0}) == Tried(2.0, False, 0.75, None)
    # a run that went to the end: its largest value over limit
    row = {"rate": 1.0, "status": "ok", "requests_total": 300, "ttft_s_p99": 1.5, "e2e_s_p50": 2.0, "meets_slo": True}
    assert rt._tried(row, {"ttft_p99": 2.0, "e2e_p50": 10.0}) == Tried(1.0, True, 1.0, 0.75)
