"""Async scheduling's admission lag under vllm-v1 (kvsim/engine/step.py, Admission.admit_cutoff): exact
under fast-forward windows, the same in a one-replica fleet, and one step of TTFT by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.engine.sim import simulate
from kvsim.fleet.config import FleetConfig
from kvsim.fleet.sim import simulate_fleet
from kvsim.planning.runs import make_config
from kvsim.trace.formats import load_trace

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("trace, flags", [
    ("alpaca_30rps_2min.jsonl", {"model": "llama-2-7b", "gpu": "h100-80gb"}),
    ("mooncake_conversation_excerpt.jsonl", {"model": "llama-3-8b", "gpu": "h100-80gb", "kv_gib": 3}),
])
def test_windows_are_exact_under_the_lag(trace, flags):
    tr = load_trace(ROOT / "traces" / trace).head(300)
    cfg = make_config(**flags)
    fast = simulate(tr, cfg).summary
    slow = simulate(tr, cfg, fast_forward=False).summary
    for s in (fast, slow):
        s.pop("sim_wall_s")
    assert fast == slow
    one = simulate_fleet(tr, cfg, FleetConfig(1, "least-requests")).summary
    one.pop("sim_wall_s"), one.pop("fleet")
    assert one == fast


def test_a_request_arriving_mid_step_waits_one_more_step():
    # llama-2-7b on an H100: request 0 alone at t = 0, request 1 arrives just after step 1 started
    from kvsim.trace.table import Trace
    cfg = make_config(model="llama-2-7b", gpu="h100-80gb")
    alone = simulate(Trace.from_arrays([0.0], [100], [50]), cfg)
    steps = alone.steps.duration_s.tolist()
    t1 = 1e-6                                   # during the first step (which takes ~8 ms)
    both = simulate(Trace.from_arrays([0.0, t1], [100, 100], [50, 50]), cfg)
    first = both.requests.first_token_s.tolist()
    starts = both.steps.time_s.tolist()
    # step 2 was scheduled when step 1 started (before t1): request 1 prefills in step 3
    assert both.steps.prefill_tokens.tolist()[:3] == [100, 0, 100]
    assert first[1] == pytest.approx(starts[2] + both.steps.duration_s.tolist()[2])
    assert first[0] == pytest.approx(steps[0])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_arriving_during_the_last_step_is_not_stranded(async_scheduling):
    # request 1 arrives while request 0's only step runs; the step scheduled ahead of it has no tokens
    # (async scheduling: request 0 is held, finished, through it; it is queued and takes no time, as vLLM
    # queues an empty batch; synchronous: nothing is planned), so the engine schedules again when
    # step 1 ends and admits request 1 then
    from kvsim.trace.table import Trace
    cfg = make_config(model="llama-2-7b", gpu="h100-80gb", async_scheduling=async_scheduling)
    run = simulate(Trace.from_arrays([0.0, 1e-6], [100, 100], [1, 1]), cfg)
    assert run.summary["requests_finished"] == 2
    ends = (run.steps.time_s + run.steps.duration_s).tolist()
    # (async: an empty step after each request's only one, while it is held)
    assert run.steps.prefill_tokens.tolist() == ([100, 0, 100, 0] if async_scheduling else [100, 100])
    second = 2 if async_scheduling else 1
    assert run.requests.first_token_s.tolist() == [pytest.approx(ends[0]), pytest.approx(ends[second])]
    assert run.steps.time_s.tolist()[second] == pytest.approx(ends[0])      # no idle gap
    if async_scheduling:
        assert run.steps.duration_s.tolist()[1::2] == [0.0, 0.0]
        assert run.steps.time_s.tolist()[1::2] == [ends[0], ends[2]]
