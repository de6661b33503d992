"""`kvsim paper` made faster without changing what it reports: runs shared between its grids
(kvsim/planning/run_cache.py) and curve points stopped once surely above the plots' ceiling
(kvsim/planning/sweep/latency_ceiling.py). Both are checked against the plain way: every run to its end,
nothing shared."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvsim.planning import run_cache
from kvsim.planning.paper import experiments as paper
from kvsim.planning.sweep import runner as sweep
from kvsim.planning.sweep.latency_ceiling import CeilingWatch
from kvsim.planning.paper.report import paper_report

#: OPT-13B only, rates from well below to far past the knee, 40 s traces.
PLAN = replace(paper.QUICK, rates={("OPT-13B", "sharegpt"): (0.5, 2.0, 4.0, 8.0),
                                   ("OPT-13B", "alpaca"): (10, 40, 80, 120)},
               table_rate={("OPT-13B", "sharegpt"): 2.0, ("OPT-13B", "alpaca"): 40}, duration_s=40.0,
               block_sizes=(16,), block_rate={"sharegpt": 2.0, "alpaca": 40}, swap_rate=4.0)
TIMING = ["wall_s", "sim_wall_s"]


@pytest.fixture
def counted(monkeypatch):
    """Runs made (calls of the sweep's worker function, one worker: in this process)."""
    made = []
    real = sweep.run_point_parts

    def counting(point, trace=None, config=None):
        made.append(point)
        return real(point, trace, config)

    monkeypatch.setattr(sweep, "run_point_parts", counting)
    run_cache.clear()
    yield made
    run_cache.clear()
    run_cache.set_enabled(True)


def _plain(plan):
    """The paper as it ran before: nothing shared, every run to its end."""
    old = run_cache.set_enabled(False)
    try:
        return paper.run_paper(plan, workers=1, ceiling=False)
    finally:
        run_cache.set_enabled(old)


def test_shared_and_stopped_runs_report_what_whole_runs_do(counted):
    fast = paper.run_paper(PLAN, workers=1)
    fast_made = len(counted)
    plain = _plain(PLAN)
    # 2 presets x 6 curves (5 systems + the side profile) x 4 rates, 1 block size x 2 presets, swap: 2
    assert len(counted) - fast_made == 48 + 2 + 2
    above = fast.above
    assert len(above) > 0
    # the block-size runs at block 16 are the paged curve points at the table rates (2.0, 40: whole runs),
    # made once; the swap study's recompute run is not (the curve's 4.0 may stop); knees may run again
    assert 52 - 2 <= fast_made <= 52 - 2 + len(above)
    # what a stopped point claims is true of the whole run; none is at a table's rate
    whole = plain.curves.set_index(["preset", "system", "rate"]).normalized_latency_s_per_token
    assert (whole[list(zip(above.preset, above.system, above.rate))] > paper.CEILING_S_PER_TOKEN).all()
    assert not above.rate.isin(set(PLAN.table_rate.values())).any()
    # the other points are the whole runs' rows
    keep = [c for c in plain.curves.columns if c not in TIMING + ["run_id"]]   # (run_id: the stop key)
    points = list(zip(above.preset, above.system, above.rate))
    shown = plain.curves.set_index(["preset", "system", "rate"]).index.isin(points)
    pd.testing.assert_frame_equal(fast.curves[keep].reset_index(drop=True),
                                  plain.curves.loc[~shown, keep].reset_index(drop=True))
    pd.testing.assert_frame_equal(fast.capacities, plain.capacities)
    for part in ("blocks", "swap"):
        pd.testing.assert_frame_equal(getattr(fast, part).drop(columns=TIMING),
                                      getattr(plain, part).drop(columns=TIMING))
    text = paper_report(fast).markdown()
    assert "| > 1 |" in text and "were stopped once their normalized latency was surely above 1 s/token" in text
    # every other table of the report is the plain one's
    tables = lambda r: {b[1]: b[2] for b in paper_report(r).blocks if b[0] == "t" and b[1] != "curves"}  # noqa: E731
    for name, df in tables(plain).items():
        pd.testing.assert_frame_equal(tables(fast)[name], df)


def test_sharing_makes_each_distinct_run_once(counted):
    plan = replace(PLAN, duration_s=20.0, rates={("OPT-13B", "sharegpt"): (2.0, 4.0),
                                                  ("OPT-13B", "alpaca"): (40,)})
    first = paper.run_paper(plan, workers=1, ceiling=False)
    # 6 curves x 3 rates + 2 block-size points + 2 swap points; the block-size runs (sharegpt 2.0, alpaca
    # 40, block 16) and the swap study's recompute run (sharegpt 4.0, block 16) are paged curve points
    assert len(counted) == 6 * 3 + 2 + 2 - 3
    again = paper.run_paper(plan, workers=1, ceiling=False)        # every run is kept: none made again
    assert len(counted) == 6 * 3 + 2 + 2 - 3
    pd.testing.assert_frame_equal(first.curves, again.curves)
    plain = _plain(plan)
    pd.testing.assert_frame_equal(first.curves.drop(columns=TIMING), plain.curves.drop(columns=TIMING))


class _Sched:
    def __init__(self, finished, status=None):
        self.finished_s = finished
        self.status = status or ["finished"] * len(finished)
        self.num_rejected = sum(s == "rejected" for s in self.status)


def test_ceiling_bound_by_hand():
    # arrivals 0, 1, 2, 10 s; outputs 10, 20, 5, 1 tokens; at t = 4: request 0 finished at 3 s (0.3 s/token),
    # 1 and 2 wait (3/20 and 2/5), 3 not arrived: (0.3 + 0.15 + 0.4 + 0) / 4 = 0.2125
    watch = CeilingWatch(0.2, np.array([0.0, 1.0, 2.0, 10.0]), np.array([10, 20, 5, 1]))
    nan = float("nan")
    assert watch.lower_bound(_Sched([3.0, nan, nan, nan]), 4.0) == pytest.approx(0.2125)
    assert watch(_Sched([3.0, nan, nan, nan]), 4.0)
    assert not watch(_Sched([3.0, nan, nan, nan]), 3.5)       # (0.3 + 0.125 + 0.3) / 4 = 0.18125
    # a rejected request counts neither in the sum nor in n: (0.3 + 0.15) / 3 = 0.15
    sched = _Sched([3.0, nan, 2.0, nan], ["finished", "waiting", "rejected", "waiting"])
    assert watch.lower_bound(sched, 4.0) == pytest.approx(0.15)


def test_report_tuner_reuses_the_paged_run(counted):
    from kvsim.planning.reports.build import trace_report
    from kvsim.trace.synthetic import generate

    trace = generate("alpaca", rate_rps=10, num_requests=60, seed=0)
    flags = dict(model="opt-13b", kv_gib=1, engine_profile="vllm-2023")
    rep = trace_report(trace, rates=[5, 20], block_sizes=(8, 16), **flags)
    # 5 systems x 2 rates, then the tuner's block sizes 8 and 16 at the trace's own arrivals: its paged
    # run at 16 (the default block size) is the systems table's paged run, made by simulate just before
    assert len(counted) == 5 * 2 + 2 - 1
    old = run_cache.set_enabled(False)
    try:
        plain = trace_report(trace, rates=[5, 20], block_sizes=(8, 16), **flags)
    finally:
        run_cache.set_enabled(old)
    tables = lambda r: {b[1]: b[2] for b in r.blocks if b[0] == "t"}  # noqa: E731
    for name, df in tables(plain).items():
        pd.testing.assert_frame_equal(tables(rep)[name], df)
    assert [b[1] for b in rep.blocks if b[0] == "p"] == [b[1] for b in plain.blocks if b[0] == "p"]
