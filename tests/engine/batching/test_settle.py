"""Async scheduling's one batch in flight (kvsim/engine/batching/settle.py) in the engine: fast-forward
windows give the same run as stepping one at a time, a finished request holds its blocks one step longer
(by hand), and the run differs from the synchronous step model (`--no-async-scheduling`). `kvsim run`
uses it by default (vllm-v1 time model: kvsim/engine/build.py). (Against vLLM step by step:
tests/vllm/test_hybrid_async_oracle.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.engine.build import build_run
from kvsim.engine.sim import simulate
from kvsim.planning.runs import make_config
from kvsim.trace.formats import load_trace
from kvsim.trace.synthetic import generate
from kvsim.trace.table import Trace

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("flags", [
    {"model": "llama-3-8b", "gpu": "h100-80gb", "kv_gib": 3},                        # paged
    {"model": "gpt-oss-20b", "gpu": "h100-80gb", "kv_gib": 1, "max_model_len": 8192},  # full + sliding
])
def test_windows_are_exact_and_the_lag_changes_the_run(flags):
    tr = load_trace(ROOT / "traces" / "mooncake_conversation_excerpt.jsonl").head(60)
    cfg = make_config(**flags)                # (the default: async scheduling, vLLM 0.33's default)
    assert build_run(tr, cfg).scheduler.settle_lag
    plain = simulate(tr, make_config(**flags, async_scheduling=False)).summary
    fast = simulate(tr, cfg)
    slow = simulate(tr, cfg, fast_forward=False)
    a, b = fast.summary, slow.summary
    for s in (a, b, plain):
        s.pop("sim_wall_s")
    assert a == b
    assert fast.steps.used_blocks.tolist() == slow.steps.used_blocks.tolist()
    assert a["requests_finished"] == plain["requests_finished"] > 20
    assert a != plain          # finished requests hold their blocks a step longer: the run changes


def test_a_finished_request_holds_its_blocks_one_more_step():
    # llama-3-8b, block 16: one request of 40 prompt tokens and 3 outputs: steps 1-3 (prefill + 2 decodes)
    # hold cdiv(40, 16) = 3 blocks; synchronous scheduling frees them after step 3, async after step 4,
    # an empty step (the request's last token is in flight) that takes no time
    one = Trace.from_arrays([0.0], [40], [3])
    cfg = make_config(model="llama-3-8b", gpu="h100-80gb", kv_gib=1)
    sync = simulate(one, make_config(model="llama-3-8b", gpu="h100-80gb", kv_gib=1, async_scheduling=False)).steps
    lag = simulate(one, cfg).steps           # (the default: async scheduling, as vLLM 0.33's)
    assert sync.used_blocks.tolist() == [3, 3, 3]
    assert lag.used_blocks.tolist() == [3, 3, 3, 3]
    assert lag.prefill_tokens.tolist() == [40, 0, 0, 0] and lag.decode_tokens.tolist() == [0, 1, 1, 0]
    assert lag.duration_s.tolist()[3] == 0.0


@pytest.mark.parametrize("flags, held", [
    ({}, True),                                        # vllm-v1, async scheduling on (vLLM 0.33's default)
    ({"async_scheduling": None}, True),                # (`kvsim run` without the switch passes None)
    ({"async_scheduling": False}, False),              # --no-async-scheduling
    ({"engine_profile": "vllm-2023"}, False),          # vLLM 2023's engine: no async scheduling
    ({"engine_profile": "ideal"}, False),              # kernels only
])
def test_which_runs_hold_finished_requests(flags, held):
    one = Trace.from_arrays([0.0], [40], [3])
    sched = build_run(one, make_config(model="llama-3-8b", gpu="h100-80gb", kv_gib=1, **flags)).scheduler
    assert sched.settle_lag == held and sched.async_lag == held
    # (paged under the Scheduler: lazy decode ticks either way; vLLM 0.1.4's policy has its own scheduler)
    assert sched._lazy or flags.get("engine_profile") == "vllm-2023"


@pytest.mark.parametrize("count", [2, 16, 17, 30])
def test_held_requests_are_put_in_batch_order_few_or_many(count):
    # (few: sorted by their places in the batch; more than 16: one pass over the batch) the same order
    one = Trace.from_arrays([0.0], [40], [3])
    sched = build_run(one, make_config(model="llama-3-8b", gpu="h100-80gb", kv_gib=1)).scheduler
    sched.running = [(7 * k) % 31 for k in range(31)]          # 0, 7, 14, 21, 28, 4, 11, ...
    ids = list(range(count))[::-1]                               # 29, 28, ..., given out of order
    want = [i for i in sched.running if i < count]
    assert sched._batch_order(ids) == want and sorted(want) == list(range(count))
    if count == 2:
        assert want == [0, 1]              # 0 at place 0, 1 at place 9 (7 x 9 = 63 = 2 x 31 + 1)
    if count == 30:
        assert want[:6] == [0, 7, 14, 21, 28, 4]


@pytest.mark.parametrize("flags", [
    {"kv_gib": 1.5, "preemption": "recompute"},                       # paged, prefix caching (default)
    {"kv_gib": 1.5, "preemption": "swap"},
    {"kv_gib": 1.5, "preemption": "swap", "prefix_caching": False},
    {"kv_gib": 3, "prefix_caching": False},
    {"kv_gib": 3, "allocator": "contiguous"},
])
def test_async_windows_around_held_requests_match_stepping(flags, monkeypatch):
    # 200 ShareGPT-like requests at 40 req/s on llama-3-8b: requests finish every few steps, so held
    # requests (freed the step after they finish) meet windows often; every step's record, every
    # request's times and the summary are those of stepping one step at a time
    from kvsim.engine.step import Stepper
    tr = generate("sharegpt", rate_rps=40, duration_s=None, num_requests=200, seed=3)
    cfg = make_config(model="llama-3-8b", gpu="h100-80gb", **flags)
    assert build_run(tr, cfg).scheduler.settle_lag
    windows = []
    window = Stepper.window

    def counted(self, *args):
        plan = window(self, *args)
        if plan is not None and self.sched.settle_lag:
            windows.append(len(plan.starts))
        return plan
    monkeypatch.setattr(Stepper, "window", counted)
    fast = simulate(tr, cfg)
    slow = simulate(tr, cfg, fast_forward=False)
    assert len(windows) >= 10                  # (windows did run: their steps not stepped one at a time)
    a, b = fast.summary, slow.summary
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b and a["requests_finished"] == 200
    assert fast.steps.equals(slow.steps)
    assert fast.requests.equals(slow.requests)
