"""`kvsim paper`'s pool (kvsim/planning/paper/runs.py): items handed to workers as they become ready
(`kvsim.planning.sweep.pool.run_fed`), each curve's points in order of rate, and the point past a knee run to
its end once, not stopped first and made again."""

import threading

import pytest

from kvsim.planning.paper import experiments as paper
from kvsim.planning.paper.runs import STOP, KneeRule, Runs, knees
from kvsim.planning.sweep.pool import run_fed

from tests.planning.paper.test_fast import PLAN, counted  # noqa: F401 (a fixture: the points run, in order)


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_run_fed_takes_what_results_make_ready(workers):
    ready, seen, lock = [3, 2, 1], [], threading.Lock()
    out = {"taken": 0, "most": 0}

    def take():
        if not ready:
            return None
        out["taken"] += 1
        out["most"] = max(out["most"], out["taken"] - len(seen))
        return ready.pop()

    def done(result):
        with lock:
            seen.append(result)
        if result == 4:                  # 2's result makes 10 ready
            ready.append(10)

    run_fed(_square, (), workers, take, done)
    assert sorted(seen) == [1, 4, 9, 100]
    assert out["most"] <= workers        # no more under way than workers


def test_curve_points_run_by_rate_and_each_once(counted):
    made = counted
    res = paper.run_paper(PLAN, workers=1)
    table = set(PLAN.table_rate.values())
    curves: dict[tuple, list[float]] = {}
    for p in made:
        if p.get("block_size") is None and p.get("preemption") is None:
            curves.setdefault((p["preset"], p["allocator"], p.get("reserve"), p.get("batching"),
                               p["engine_profile"]), []).append(p["rate"])
    assert len(curves) == 2 * 6
    lowest = {"sharegpt": 0.5, "alpaca": 10}
    again = 0
    for (preset, *_), rates in curves.items():
        # a point that may stop waits for the points below it (table rates never stop: they go first);
        # only a lowest-rate point that stopped is made again at the end (the thresholds come from it)
        if len(set(rates)) < len(rates):
            assert rates[-1] == lowest[preset] and rates.count(lowest[preset]) == 2
            rates, again = rates[:-1], again + 1
        later = [r for r in rates if r not in table]
        assert later == sorted(later) and len(set(rates)) == len(rates)
    assert again < len(curves)
    # the knee points ran to their end: no capacity needed a stopped point
    assert paper.CEILING_S_PER_TOKEN > 0 and len(res.above) > 0
    whole = [p for p in made if STOP not in p and p["rate"] not in table and p.get("block_size") is None]
    assert whole, "no point past a knee ran to its end: the test no longer covers the knees"


def _runs(values: list[list[float | None]], rates: list[float]) -> tuple[Runs, list]:
    """Curves of one (setup, preset) group with these normalized latencies (None: stopped above the
    ceiling); systems a, b, c."""
    runs, curves = Runs(), []
    for name, vs in zip("abc", values):
        i = runs.add({"rate": rates}, {"preset": "sharegpt", "duration_s": 10.0, "seed": 0})
        runs.rows.append([{"rate": r, "normalized_latency_s_per_token": v} if v is not None else
                          {"rate": r, "latency_above_s_per_token": 1.0} for r, v in zip(rates, vs)])
        curves.append((i, {"setup": "S", "system": name}))
    return runs, curves


def test_knees_by_hand():
    # lowest-rate latencies 0.1, 0.2, 0.3: thresholds 0.2 (every system) and 0.4 (subset b, c)
    runs, curves = _runs([[0.1, 0.15, None, None], [0.2, 0.3, None, None], [0.3, 0.35, 0.5, None]],
                         [1.0, 2.0, 3.0, 4.0])
    rule = KneeRule(2.0, 1.0, ("b", "c"))
    # over every system (0.2): a's first point above it is rate 3, stopped: a knee; b's is rate 2 and
    # c's rate 1, both whole. Over b and c (0.4): b's is rate 3, stopped: a knee; c's is rate 3, whole
    assert knees(runs, curves, rule) == [(0, 2), (1, 2)]
    # a threshold not below the ceiling: every stopped point up to the first whole one above it
    high = KneeRule(20.0, 1.0, ())
    assert knees(runs, curves, high) == [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
