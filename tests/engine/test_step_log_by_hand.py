"""The step log and the summary on hand-made step plans and request columns: every column, aggregate
and summary key worked out on paper (no simulation in between)."""

from types import SimpleNamespace

import numpy as np
import pytest

from kvsim.engine import metrics
from kvsim.alloc.base import MemoryStats, MemoryTable
from kvsim.alloc.paged.tick_runs import TickRun
from kvsim.engine.metrics import STEP_COLUMNS, StepLog, summarize
from kvsim.engine.batching.request_state import FINISHED, REJECTED
from kvsim.engine.step import StepPlan


def mem(tokens, reserved, internal, free, used, unshared, external=0):
    """A 20-slot cache in 5 blocks of 4."""
    return MemoryStats(20, tokens, reserved, internal, external, free, used, 5 - used, unshared)


def plans():
    """Seven steps: one prefill step, a window of three decode steps, a window of two, one more step.

    step time dur run wait prefill decode limited_by compute | tokens reserved internal free used unshared
      0  0.0  1.0   2    1       8      0          1       1 |      8        3        1    8    3        4
      1  1.0  0.5   3    2       0      3          3       0 |      9        2        1    8    3        4
      2  1.5  0.5   3    0       0      3  0 (none waits)  0 |     10        1        1    8    3        4
      3  2.0  0.5   3    1       0      3          3       0 |     11        0        1    8    3        3
      4  2.5  1.0   1    4       0      1  0 (plan says 0) 0 |      4        0        0   16    1        1
      5  3.5  0.25  1    4       0      1          0       1 |      5        3        0   12    2        2
      6  4.0  0.5   1    0       2      0  0 (none waits)  0 |      6        2        0   12    2        2
    """
    return [
        StepPlan(prefill_tokens=8, batch_requests=2, limited_by=1, starts=[0.0], durations=[1.0], waiting=[1],
                 memory=[mem(8, 3, 1, 8, 3, 4)], compute_bound=[True]),
        StepPlan(decode_seqs=3, batch_requests=3, limited_by=3, starts=[1.0, 1.5, 2.0],
                 durations=[0.5, 0.5, 0.5], waiting=[2, 0, 1],
                 memory=[mem(9, 2, 1, 8, 3, 4), mem(10, 1, 1, 8, 3, 4), mem(11, 0, 1, 8, 3, 3)]),
        StepPlan(decode_seqs=1, batch_requests=1, limited_by=0, starts=[2.5, 3.5], durations=[1.0, 0.25],
                 waiting=[4, 4], memory=[mem(4, 0, 0, 16, 1, 1), mem(5, 3, 0, 12, 2, 2)],
                 compute_bound=[False, True]),
        StepPlan(prefill_tokens=2, batch_requests=1, limited_by=2, starts=[4.0], durations=[0.5], waiting=[0],
                 memory=[mem(6, 2, 0, 12, 2, 2)]),
    ]


def as_table(plan: StepPlan) -> StepPlan:
    """`plan` with a window's snapshots given as one table (what lazy decode ticks return)."""
    if plan.num_steps > 1:
        plan.memory = MemoryTable(np.array(plan.memory, np.int64))
    return plan


def as_run(plan: StepPlan) -> StepPlan:
    """`plan` with the second window's snapshots as a `TickRun` (what paged lazy decode ticks return):
    3 tokens before it, 1 ticking, reach 4, 1 block, 4 free; tick 1 takes a block reaching 4 more."""
    if plan.num_steps == 2:
        run = TickRun(2, [(1, 1, 4, 0)], 20, 4, 5, 3, 1, 4, 1, 4, 0)
        assert run == plan.memory
        plan.memory = run
    return plan


@pytest.fixture(params=["tuples", "tables", "runs"])
def log(monkeypatch, request):
    """The plans above logged with chunks of 3 rows (the windows' snapshots as named tuples, as one
    table each, or the second window's as a `TickRun` between rows of tuples, its rows split over two
    chunks); `log.chunks` holds what the sink received."""
    monkeypatch.setattr(metrics, "CHUNK", 3)
    chunks = []
    steps = StepLog(sink=lambda chunk: chunks.append({k: v.tolist() for k, v in chunk.items()}))
    steps.chunks = chunks
    convert = {"tables": as_table, "runs": as_run}.get(request.param, lambda plan: plan)
    for plan in plans():
        steps.record(convert(plan))
    return steps


def test_every_column_of_every_row(log):
    cols = log.columns()
    assert list(cols) == list(STEP_COLUMNS)
    assert {c: cols[c].tolist() for c in STEP_COLUMNS} == {
        "step": [0, 1, 2, 3, 4, 5, 6],
        "time_s": [0.0, 1.0, 1.5, 2.0, 2.5, 3.5, 4.0],
        "duration_s": [1.0, 0.5, 0.5, 0.5, 1.0, 0.25, 0.5],
        "running": [2, 3, 3, 3, 1, 1, 1],
        "waiting": [1, 2, 0, 1, 4, 4, 0],
        "prefill_tokens": [8, 0, 0, 0, 0, 0, 2],
        "decode_tokens": [0, 3, 3, 3, 1, 1, 0],
        "used_blocks": [3, 3, 3, 3, 1, 2, 2],
        "free_blocks": [2, 2, 2, 2, 4, 3, 3],
        "token_states": [8, 9, 10, 11, 4, 5, 6],
        "reserved": [3, 2, 1, 0, 0, 3, 2],
        "internal_fragmentation": [1, 1, 1, 1, 0, 0, 0],
        "external_fragmentation": [0, 0, 0, 0, 0, 0, 0],
        "free": [8, 8, 8, 8, 16, 12, 12],
        "unshared_blocks": [4, 4, 4, 3, 1, 2, 2],
        "limited_by": [1, 3, 0, 3, 0, 0, 0],
        "compute_bound": [1, 0, 0, 0, 0, 1, 0],
    }
    assert {c: cols[c].dtype for c in STEP_COLUMNS} == {
        c: np.dtype(np.float64 if c in ("time_s", "duration_s") else np.int64) for c in STEP_COLUMNS}


def test_chunks_are_always_chunk_rows_but_the_last(log):
    log.close()
    assert [c["step"] for c in log.chunks] == [[0, 1, 2], [3, 4, 5], [6]]
    assert log.chunks[1]["token_states"] == [11, 4, 5]


def test_aggregates_by_hand(log):
    """Durations sum to 4.25 s; the last step ends at 4.5 s. Time weighted (slot-seconds):
    tokens 8 + 4.5 + 5 + 5.5 + 4 + 1.25 + 3 = 31.25; reserved 3 + 1 + 0.5 + 0.75 + 1 = 6.25;
    internal 1 + 1.5 = 2.5; free 8 + 12 + 16 + 3 + 6 = 45 (the four sum to 20 x 4.25 = 85);
    used blocks 3 + 4.5 + 1 + 0.5 + 1 = 10; unshared 4 + 2 + 2 + 1.5 + 1 + 0.5 + 1 = 12.
    Waiting held back by kv_memory 1 s (step 0), by the token budget 1 s (steps 1 and 3); compute-bound
    steps 0 and 5: 1.25 s. Running 14 over 7 steps, at most 3; allocated at most 8 + 3 + 1 = 12."""
    log.close()
    assert (log.num_steps, log.total_s, log.end_s) == (7, 4.25, 4.5)
    assert log.weighted == {"token_states": 31.25, "reserved": 6.25, "internal_fragmentation": 2.5,
                            "external_fragmentation": 0.0, "free": 45.0, "used_blocks": 10.0,
                            "unshared_blocks": 12.0}
    assert log.limit_s[1:] == [1.0, 0.0, 1.0]
    assert log.compute_bound_s == 1.25
    assert (log.sum_running, log.max_running, log.max_allocated) == (14, 3, 12)
    assert log.time_average("token_states") == pytest.approx(31.25 / 4.25)


def test_summary_by_hand(log):
    """Three requests on the log above (capacity 20 slots, blocks of 4):
    r0 arrives 0, first token 1, done 4.5, 4 tokens x 2 samples; r1 arrives 0.5, first 2, done 3.5,
    1 token; r2 rejected. TTFT 1, 1.5; E2E 4.5, 3; TPOT only r0's (4.5 - 1) / 3; 9 tokens / 4.5 s.
    Normalized latency (4.5 / 4 + 3 / 1) / 2 = 2.0625. Sharing saved (12 - 10) / 12."""
    requests = {"status": np.array([FINISHED, FINISHED, REJECTED]), "arrival_s": np.array([0.0, 0.5, 0.0]),
                "first_token_s": np.array([1.0, 2.0, np.nan]), "finished_s": np.array([4.5, 3.5, np.nan]),
                "output_tokens": np.array([4, 1, 7]), "n": np.array([2, 1, 1])}
    sched = SimpleNamespace(num_preemptions=2, prefix_hit_tokens=6, admitted_prompt_tokens=24)
    s = summarize(requests, log, sched, 20, 4, 5, 0.125)
    approx = pytest.approx
    assert s == {
        "requests_total": 3, "requests_finished": 2, "requests_rejected": 1,
        "duration_s": 4.5, "throughput_rps": approx(2 / 4.5), "throughput_tokens_per_s": 2.0,
        "mean_batch_size": 2.0, "max_batch_size": 3, "normalized_latency_s_per_token": 2.0625,
        "ttft_s": {"p50": 1.25, "p90": approx(1.45), "p99": approx(1.495), "mean": 1.25},
        "tpot_s": {"p50": approx(3.5 / 3), "p90": approx(3.5 / 3), "p99": approx(3.5 / 3), "mean": approx(3.5 / 3)},
        "e2e_s": {"p50": 3.75, "p90": approx(4.35), "p99": approx(4.485), "mean": 3.75},
        "preemptions": 2,
        "kv": {"capacity_tokens": 20, "block_size": 4, "num_blocks": 5,
               "mean_fraction": {"token_states": approx(31.25 / 85), "reserved": approx(6.25 / 85),
                                 "internal_fragmentation": approx(2.5 / 85), "external_fragmentation": 0.0,
                                 "free": approx(45 / 85)},
               "peak_allocated_fraction": 0.6, "sharing_saved_fraction": approx(1 / 6)},
        "prefix_cache_hit_tokens": 6, "prefix_cache_hit_rate": 0.25,
        "limited_by": {"kv_memory": approx(1 / 4.25), "max_num_seqs": 0.0, "token_budget": approx(1 / 4.25)},
        "compute_bound_fraction": approx(1.25 / 4.25), "sim_wall_s": 0.125, "engine_steps": 7,
        "gpu_busy_fraction": approx(4.25 / 4.5),        # 4.25 s of steps over the 4.5 s span (idle 0.25 s)
    }


def test_empty_and_idle_logs():
    empty = StepLog()
    assert {c: (v.tolist(), v.dtype) for c, v in empty.columns().items()} == {
        c: ([], np.dtype(np.float64 if c in ("time_s", "duration_s") else np.int64)) for c in STEP_COLUMNS}
    assert empty.time_average("free") == 0.0
    with pytest.raises(ValueError, match=r"^this step log kept no rows \(keep=False\)$"):
        StepLog(keep=False).columns()
    idle = StepLog(keep=False)            # one step with nothing allocated
    idle.record(StepPlan(starts=[0.0], durations=[2.0], waiting=[0], memory=[mem(0, 0, 0, 20, 0, 0)]))
    s = summarize({"status": np.array([REJECTED]), "arrival_s": np.array([0.0]),
                   "first_token_s": np.array([np.nan]), "finished_s": np.array([np.nan]),
                   "output_tokens": np.array([3]), "n": np.array([1])}, idle,
                  SimpleNamespace(num_preemptions=0, prefix_hit_tokens=0, admitted_prompt_tokens=0), 20, 4, 5, 0.0)
    assert s["kv"]["peak_allocated_fraction"] == 0.0 and s["kv"]["sharing_saved_fraction"] == 0.0
    assert s["kv"]["mean_fraction"]["free"] == 1.0 and s["limited_by"]["kv_memory"] == 0.0
    assert (s["throughput_rps"], s["normalized_latency_s_per_token"], s["ttft_s"]["p50"]) == (0.0, None, None)
    assert (s["prefix_cache_hit_rate"], s["compute_bound_fraction"], s["duration_s"]) == (0.0, 0.0, 2.0)


def test_sharing_saved_with_one_unshared_block_on_average():
    """2 s holding 2 blocks' worth of sharers in 1 block, then 2 s of nothing: on average 1 unshared
    block and 0.5 used, so sharing saved half."""
    steps = StepLog(keep=False)
    steps.record(StepPlan(starts=[0.0, 2.0], durations=[2.0, 2.0], waiting=[0, 0],
                          memory=[mem(4, 0, 0, 16, 1, 2), mem(0, 0, 0, 20, 0, 0)]))
    s = summarize({"status": np.array([REJECTED]), "arrival_s": np.array([0.0]),
                   "first_token_s": np.array([np.nan]), "finished_s": np.array([np.nan]),
                   "output_tokens": np.array([3]), "n": np.array([1])}, steps,
                  SimpleNamespace(num_preemptions=0, prefix_hit_tokens=0, admitted_prompt_tokens=0), 20, 4, 5, 0.0)
    assert s["kv"]["sharing_saved_fraction"] == 0.5


def test_a_chunk_is_handed_on_as_soon_as_it_is_full(monkeypatch):
    """Chunks of 3 rows: 1 row buffered, then 4 (one chunk out, 1 left), then 3 (a second chunk out at
    once, not at the next record or at close), then 1 more, and the last row at close."""
    monkeypatch.setattr(metrics, "CHUNK", 3)
    sizes = []
    steps = StepLog(keep=False, sink=lambda chunk: sizes.append(len(chunk["step"])))
    after = []
    for plan in plans():
        steps.record(as_table(plan))          # (a window's rows split over chunks either way)
        after.append(list(sizes))
    steps.close()
    assert after == [[], [3], [3, 3], [3, 3]] and sizes == [3, 3, 1]


def test_whole_second_steps_still_log_float_times():
    steps = StepLog()
    steps.record(StepPlan(starts=[0], durations=[1], waiting=[0], memory=[mem(4, 0, 0, 16, 1, 1)]))
    cols = steps.columns()
    assert cols["time_s"].dtype == cols["duration_s"].dtype == np.float64
    assert (steps.end_s, steps.total_s) == (1.0, 1.0)


def test_summary_of_a_run_without_steps():
    none = np.array([], dtype=np.int64)
    s = summarize({"status": none, "arrival_s": np.array([]), "first_token_s": np.array([]),
                   "finished_s": np.array([]), "output_tokens": none, "n": none}, StepLog(),
                  SimpleNamespace(num_preemptions=0, prefix_hit_tokens=0, admitted_prompt_tokens=0), 20, 4, 5, 0.0)
    assert s["limited_by"] == {"kv_memory": 0.0, "max_num_seqs": 0.0, "token_budget": 0.0}
    assert (s["compute_bound_fraction"], s["kv"]["peak_allocated_fraction"], s["mean_batch_size"]) == (0.0, 0.0, 0.0)
    assert s["kv"]["mean_fraction"]["free"] == 0.0 and s["engine_steps"] == 0 and s["duration_s"] == 0.0


def float_steps():
    """Seven one-step plans whose duration-weighted sums round differently when added in other groups."""
    durations = [0.512, 0.95, 0.144, 0.949, 0.312, 0.423, 0.828]
    tokens = [5, 8, 13, 11, 2, 1, 17]
    start = np.concatenate([[0.0], np.cumsum(durations)[:-1]]).tolist()
    return [StepPlan(starts=[s], durations=[d], waiting=[0], memory=[mem(t, 0, 0, 20 - t, 1, 1)])
            for s, d, t in zip(start, durations, tokens)]


def test_kept_rows_fold_in_the_same_chunks_as_streamed_ones(monkeypatch):
    """Kept rows wait in the buffer (up to HOLD) but are folded CHUNK rows at a time as streamed rows
    are, so the time-weighted sums agree to the last bit (summed in one go they would not:
    37.593999999999994 against 37.594 token slot-seconds)."""
    monkeypatch.setattr(metrics, "CHUNK", 3)
    monkeypatch.setattr(metrics, "HOLD", 8)
    kept, streamed = StepLog(keep=True), StepLog(keep=False)
    for plan in float_steps():
        kept.record(plan)
        streamed.record(plan)
    kept.close()
    streamed.close()
    assert kept.weighted == streamed.weighted and kept.weighted["token_states"] == 37.594
    assert kept.total_s == streamed.total_s == 4.118


def test_kept_rows_are_still_streamed_as_soon_as_a_chunk_is_full(monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK", 3)
    sizes = []
    steps = StepLog(keep=True, sink=lambda chunk: sizes.append(len(chunk["step"])))
    for plan in float_steps()[:3]:
        steps.record(plan)
    assert sizes == [3]


def test_a_tick_run_between_rows_of_tuples_is_placed_in_its_steps():
    """Every row buffered until the end (no sink): the run's two rows come out between the tuples' rows
    (steps 4 and 5 of seven), as the tuples would have given them."""
    tuples, runs = StepLog(), StepLog()
    for plan, twin in zip(plans(), plans()):
        tuples.record(plan)
        runs.record(as_run(twin))
    assert runs._runs and runs._rows                 # (both kinds waiting to be turned into one table)
    want, got = tuples.columns(), runs.columns()
    assert {c: got[c].tolist() for c in STEP_COLUMNS} == {c: want[c].tolist() for c in STEP_COLUMNS}
    assert got["token_states"].tolist() == [8, 9, 10, 11, 4, 5, 6]


def test_a_step_plan_makes_each_list_field_its_own_and_keeps_the_other_defaults():
    """`StepPlan.__init__` (hand-written: made every step) gives every list field a new empty list and
    every other field its declared default, as the dataclass's own `__init__` would."""
    import dataclasses

    a, b = StepPlan(), StepPlan(decode_seqs=3, starts=[1.0])
    for f in dataclasses.fields(StepPlan):
        if f.default_factory is list:
            assert getattr(a, f.name) == [] and getattr(a, f.name) is not getattr(StepPlan(), f.name), f.name
        else:
            assert getattr(a, f.name) == f.default, f.name
    assert (b.decode_seqs, b.starts, b.prefills, b.decode_context_tokens) == (3, [1.0], [], 0)
    with pytest.raises(TypeError, match="no field 'bogus'"):
        StepPlan(bogus=1)
