"""Static batching's fast-forward windows run through the steps at which a batch's shorter requests emit
their last tokens (they stay in the batch as padding), up to the batch's last step; hand-worked steps and
memory, equality with stepping one at a time, and the pieces the window is priced with."""

from dataclasses import replace

import numpy as np
import pytest

from kvsim.cost.roofline import ConstantCost, CostModel
from kvsim.engine.build import build_run
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.batching.static import _flags
from kvsim.engine.step import Stepper
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from tests.engine_loop import engine_steps
from tests.engine.batching.test_fast_forward import both

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
STATIC = {"allocator": "contiguous", "reserve": "max"}


def test_a_batch_runs_as_its_prefill_one_window_and_its_last_step():
    # prompts of 4, outputs 3, 6 and 10: the prefill emits each first token, then 9 decode steps of 1 s;
    # requests 0 and 1 emit their last tokens at decode steps 2 and 5 and stay as padding
    trace = Trace.from_arrays([0.0, 0.0, 0.0], [4, 4, 4], [3, 6, 10])
    cfg = SimConfig(DEP, CacheConfig(kv_gib=4, allocator="contiguous", reserve="oracle"), SchedulerConfig(batching="static"),
                    engine_profile="ideal")
    parts = replace(build_run(trace, cfg), cost=ConstantCost(1.0))
    out = [(kind, plan) for kind, plan in engine_steps(trace, parts)]
    assert [kind for kind, _ in out] == ["step", "window", "step"]
    window = out[1][1]
    assert window.starts == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert (window.decode_seqs, window.decode_context_tokens) == (3, 12 + 3)
    # slots written while each decode step runs: 3 sequences grow in steps 1-2, 2 in 3-5, 1 in 6-8
    tokens = [15, 18, 20, 22, 24, 25, 26, 27]
    assert [m.token_states for m in window.memory] == tokens
    assert [m.reserved for m in window.memory] == [28 - t for t in tokens]   # peaks 6 + 9 + 13 slots
    last = out[2][1]
    assert last.starts == [9.0] and last.finished == [0, 1, 2] and last.memory[0].token_states == 28
    assert parts.scheduler.generated[:3] == [3, 6, 10]


def test_under_a_stop_watch_windows_end_before_each_request_end():
    """`Stepper.cut_at_request_ends` (set by `simulate` when a `stop_when` watch counts steps): the batch
    above steps as it did before windows ran through request ends: decode steps 1 and 2 alone (a window
    needs two steps before the first last token), a window of steps 3-4, step 5 (request 1's last token),
    a window of steps 6-8 and the last step; so the watch is asked at the same step counts."""
    trace = Trace.from_arrays([0.0, 0.0, 0.0], [4, 4, 4], [3, 6, 10])
    cfg = SimConfig(DEP, CacheConfig(kv_gib=4, allocator="contiguous", reserve="oracle"), SchedulerConfig(batching="static"),
                    engine_profile="ideal")
    sched = build_run(trace, cfg).scheduler
    for i in range(3):
        sched.add(i, 0.0)
    stepper = Stepper(sched, ConstantCost(1.0), trace.arrival_s.tolist())
    stepper.cut_at_request_ends = True
    now, out = 0.0, []
    while (plan := stepper.step(now)) is not None:
        out.append(plan.starts)
        now = plan.end_s
        if (window := stepper.window(plan, now, 3)) is not None:
            out.append(window.starts)
            now = window.end_s
    assert out == [[0.0], [1.0], [2.0], [3.0, 4.0], [5.0], [6.0, 7.0, 8.0], [9.0]]


def test_simulate_with_a_stop_watch_cuts_static_windows_at_request_ends(monkeypatch):
    """A watch asked after every turn of the engine's loop (a step and the window after it;
    `STOP_CHECK_EVERY` 1) is asked at the ends of steps 0, 1, the window to step 4, the window to step 8
    and the last step (a window through request ends would leave only 9 and 10)."""
    from kvsim.engine import sim
    monkeypatch.setattr(sim, "STOP_CHECK_EVERY", 1)
    trace = Trace.from_arrays([0.0, 0.0, 0.0], [4, 4, 4], [3, 6, 10])
    cfg = SimConfig(DEP, CacheConfig(kv_gib=4, allocator="contiguous", reserve="oracle"), SchedulerConfig(batching="static"),
                    engine_profile="ideal")
    asked = []
    result = sim.simulate(trace, cfg, cost=ConstantCost(1.0), stop_when=lambda s, now: asked.append(now) or False)
    assert asked == [1.0, 2.0, 5.0, 9.0, 10.0]
    plain = sim.simulate(trace, cfg, cost=ConstantCost(1.0))
    assert plain.summary["engine_steps"] == result.summary["engine_steps"] == 10


@pytest.mark.parametrize("cache, n, profile", [
    (STATIC, 1, "vllm-2023"), (STATIC, 2, "ideal"), ({"reserve": "pow2", "allocator": "contiguous"}, 1, "vllm-v1"),
    ({}, 1, "vllm-2023"), ({}, 3, "ideal"), ({"prefix_caching": True}, 2, "ideal")])
def test_static_windows_through_request_ends_equal_single_steps(cache, n, profile):
    rng = np.random.default_rng(7)
    num = 60
    groups = rng.choice(["a", None], num)
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 20, num)), rng.integers(20, 200, num), rng.integers(1, 300, num),
                              n=rng.choice([1, n], num), prefix_group=groups,
                              prefix_tokens=np.where(groups == None, 0, 16))   # noqa: E711
    sched = {"batching": "static"} | ({"chunked_prefill": False} if profile != "ideal" else {})
    result = both(trace, SimConfig(DEP, CacheConfig(block_size=8, num_blocks=600, **cache),
                                   SchedulerConfig(**sched), engine_profile=profile))
    assert result.summary["requests_finished"] == num


def test_compute_bound_flags_turn_off_once_found_by_bisection():
    # segments (first step, end, sequences growing, context of the first step): contexts 10, 12, 14, 16, 17, 18, 19
    segments = [(0, 4, 2, 10), (4, 7, 1, 17)]
    contexts = [10, 12, 14, 16, 17, 18, 19]
    for threshold in range(9, 21):
        bound = lambda p, a, w, c, t=threshold: c < t     # noqa: E731
        for k in range(2, 8):
            assert _flags(bound, 4, segments, k) == [c < threshold for c in contexts[:k]]
    assert _flags(None, 4, segments, 5) == [False] * 5


@pytest.mark.parametrize("seqs, growth", [(4, 0), (4, 1), (4, 3), (4, None), (300, 17)])
def test_decode_step_times_with_padding_equal_step_time_bit_for_bit(seqs, growth):
    cost = CostModel(DEP, 16, True)
    grow = seqs if growth is None else growth
    assert cost.decode_step_times(seqs, 1234, 5, growth) == [cost.step_time(0, 0, seqs, 1234 + j * grow)
                                                             for j in range(5)]
    assert ConstantCost(0.5).decode_step_times(seqs, 1234, 3, growth) == [0.5] * 3
