"""The rate search's bounds (kvsim/planning/rate/bounds.py): the early verdict on a run equals the
whole run's, by hand and on runs; the serving ceiling is never beaten by a run and ends the search of an
SLO that every rate meets; progress is reported per run."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import kvsim
from kvsim.planning.rate.search import meets
from kvsim.planning.rate.bounds import SloWatch, serve_ceiling_rps
from kvsim.planning.rate.runs import base_trace, run_rate
from kvsim.planning.runs import make_config
from kvsim.planning.sweep.runner import run_point

NAN = float("nan")


def test_slo_watch_by_hand():
    # arrivals 0, 1, 2, 3 s; limit 1 s. At now = 2.5 the requests that arrived before 1.5 are decided:
    # request 0's first token came at 0.5 (TTFT 0.5), request 1 has none yet (its TTFT will be > 1.5 - 1).
    # p99 of at most 4 finished: numpy's index floor(3 x 0.99) = 2, so 4 - 2 = 2 requests above 1 s
    # decide it; p50 needs 4 - floor(1.5) = 3; the mean's lower bound is (0.5 + (2.5 - 1)) / 4 = 0.5.
    sched = SimpleNamespace(status=["finished", "unfinished", "unfinished", "unfinished"], num_rejected=0,
                            first_token_s=[0.5, NAN, NAN, NAN], finished_s=[NAN] * 4)
    arrivals = np.array([0.0, 1.0, 2.0, 3.0])
    p99, p50, mean = (SloWatch({m: 1.0}, arrivals) for m in ("ttft_p99", "ttft_p50", "ttft_mean"))
    assert not p99(sched, 2.5) and not p50(sched, 2.5) and not mean(sched, 2.5)
    # at 3.5 request 2 is decided too (no token): 2 above 1 s -> p99 missed; p50 still needs 3
    assert p99(sched, 3.5) and not p50(sched, 3.5)
    # a rejected request leaves at most 3 to finish: p50 then needs 3 - floor(2 x 0.5) = 2
    sched.status[3], sched.num_rejected = "rejected", 1
    assert SloWatch({"ttft_p50": 1.0}, arrivals)(sched, 3.5)
    # the mean at now = 10 (limit 6: requests 0-2 decided, 3 rejected): 0.5, and at least 10 - 1 and
    # 10 - 2 for the two without a token: 17.5 / 3 = 5.83 < 6; a limit of 5.5 is missed
    assert not SloWatch({"ttft_mean": 6.0}, arrivals)(sched, 10.0)
    assert SloWatch({"ttft_mean": 5.5}, arrivals)(sched, 10.0)
    # unwatched metrics and infinite limits never stop a run
    assert not SloWatch({"tpot_p99": 1e-9, "ttft_p99": math.inf}, arrivals)(sched, 100.0)


def test_slo_watch_normalized_latency_by_hand():
    # arrivals 0, 1, 2, 3 s with 2, 4, 1, 1 output tokens (mean 2); limit 1 s/token: a request is looked
    # at 1 x 2 = 2 s after it arrived. Request 0 finished at 1.0 (0.5 s/token); the others not yet.
    sched = SimpleNamespace(status=["finished"] + ["unfinished"] * 3, num_rejected=0, finished_s=[1.0, NAN, NAN, NAN])
    arrivals, outputs = np.array([0.0, 1.0, 2.0, 3.0]), np.array([2, 4, 1, 1])
    watch = SloWatch({"normalized_latency": 1.0}, arrivals, outputs)
    # at 4.5 requests 0-2 are looked at: 0.5 + (4.5 - 1) / 4 + (4.5 - 2) / 1 = 3.875, / 4 = 0.97 <= 1
    assert not watch(sched, 4.5)
    # at 5.5 request 3 too: + (5.5 - 3) / 1 = 6.375 / 4 = 1.59 > 1: missed for certain
    assert watch(sched, 5.5)
    # a limit of 0.9 s/token is missed at 4.5 already (requests up to 4.5 - 1.8 = 2.7 looked at: 0.97)
    assert SloWatch({"normalized_latency": 0.9}, arrivals, outputs)(sched, 4.5)
    # without the output lengths it is not watched
    assert not SloWatch({"normalized_latency": 0.9}, arrivals)(sched, 100.0)


@pytest.mark.parametrize("slo", [{"ttft_p99": 0.5}, {"e2e_p50": 3.0}, {"ttft_mean": 0.3},
                                 {"normalized_latency": 0.2}])
def test_a_run_stopped_early_has_the_verdict_of_the_whole_run(slo):
    cfg = make_config(model="opt-13b", kv_gib=1)
    trace = base_trace("alpaca", 200.0, 0)
    stopped = 0
    for rate in (0.5, 2.0, 8.0, 16.0, 32.0):
        point = {"duration_s": 30.0, "seed": 0, "time_scale": 1 / rate}
        early, whole = run_rate(point, trace, cfg, slo), run_point(point, trace, cfg)
        assert early["status"] == whole["status"] == "ok"
        assert meets(early, slo) == meets(whole, slo), rate
        stopped += early.get("stopped_early_s") is not None
        assert whole.get("stopped_early_s") is None
    assert stopped            # (some run was stopped early: the comparison tested something)


def test_no_run_beats_the_serving_ceiling():
    cfg = make_config(model="opt-13b", kv_gib=1)
    sample = base_trace("alpaca", 1.0, 0)
    ceiling = serve_ceiling_rps(cfg, sample)
    # arrivals at three times the ceiling for 60 s: every request finishes, so the run serves them all
    # in at least (requests / true capacity) s; its throughput can never exceed the ceiling
    row = run_point({"duration_s": 60.0, "seed": 0, "time_scale": 1 / (3 * ceiling)}, sample, cfg)
    assert row["requests_finished"] + row["requests_rejected"] == row["requests_total"] > 100
    assert row["throughput_rps"] <= ceiling


@pytest.mark.parametrize("limit", [math.inf, 1e9])
def test_an_slo_every_rate_meets_ends_at_the_ceiling(limit):
    said = []
    r = kvsim.max_rate({"ttft_p99": limit}, preset="alpaca", duration_s=20, kv_gib=1, progress=said.append,
                       max_span_s=20)        # (no run again on a longer trace: see tests/planning/rate/test_steady.py)
    assert r.rate_rps == pytest.approx(r.ceiling_rps) and math.isfinite(r.ceiling_rps)
    assert f"meets the SLO at every rate up to {r.ceiling_rps:.4g} req/s" in r.limited_by
    assert r.curve.meets_slo.all() and len(r.curve) <= 16
    assert said[0].startswith("rate search: serving ceiling") and len(said) == len(r.curve) + 1


def test_the_rate_searchs_run_memo_tells_traces_apart_by_their_shared_prefixes():
    """Two traces with the same arrivals and lengths but different prefix groups are different runs."""
    from kvsim.planning.rate.runs import _fingerprint
    from kvsim.trace.table import Trace
    plain = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5])
    shared = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5], prefix_group=["a", "a"], prefix_tokens=[32, 32])
    assert _fingerprint(plain) != _fingerprint(shared)
    assert _fingerprint(plain) == _fingerprint(Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5]))
