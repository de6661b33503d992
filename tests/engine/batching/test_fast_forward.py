"""The engine's fast-forward windows are exact: every step row and request record equals the run
that steps one at a time, across allocators, preemption modes, samples, prefix caching, queueing,
ties between arrivals and step boundaries, and engine profiles (their policies and CPU times). Both
modes share the scheduler and allocator, so this only proves the windows exact;
tests/engine/test_reference_engine.py checks both against an independent reference."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings, strategies as st

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace
from kvsim.trace.formats import load_trace

from tests.engine_loop import engine_steps

ROOT = Path(__file__).resolve().parents[3]
DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
PROFILES = ("vllm-2023", "vllm-v1", "ideal")

CONFIGS = {
    "paged": ({}, {}),
    "paged-swap": ({}, {"preemption": "swap"}),
    "paged-prefix-chunked": ({"prefix_caching": True}, {"chunked_prefill": True, "max_batched_tokens": 64}),
    "paged-prefix": ({"prefix_caching": True}, {}),
    "paged-chunked-small": ({}, {"chunked_prefill": True, "max_batched_tokens": 32}),
    "contiguous-max": ({"allocator": "contiguous", "reserve": "max"}, {}),
    "contiguous-pow2-first-fit": ({"allocator": "contiguous", "reserve": "pow2", "placement": "first-fit"}, {}),
    "contiguous-oracle": ({"allocator": "contiguous", "reserve": "oracle"}, {}),
    "static": ({"allocator": "contiguous", "reserve": "max"}, {"batching": "static"}),
    "static-pow2": ({"allocator": "contiguous", "reserve": "pow2"}, {"batching": "static"}),
    "static-paged": ({}, {"batching": "static"}),
}


def both(trace, cfg, cost=None):
    a = simulate(trace, cfg, cost=cost, fast_forward=False)
    b = simulate(trace, cfg, cost=cost)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    a.summary.pop("sim_wall_s"), b.summary.pop("sim_wall_s")
    assert a.summary == b.summary
    return b


@settings(max_examples=100, deadline=None)
# found by this test: swapping two samples back in once checked their slots pooled, not per block
@example(seed=0, config="paged-swap", num_blocks=40, samples=2, constant=False, profile="ideal")
@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(sorted(CONFIGS)),
       num_blocks=st.integers(40, 400), samples=st.sampled_from([1, 1, 2, 3]), constant=st.booleans(),
       profile=st.sampled_from(PROFILES))
def test_windows_equal_single_steps(seed, config, num_blocks, samples, constant, profile):
    rng = np.random.default_rng(seed)
    num = 30
    # integer arrival times with a constant cost make exact ties between arrivals and step ends
    arrivals = np.sort(rng.integers(0, 12, num)).astype(float) if constant else np.sort(rng.uniform(0, 3, num))
    prompts = rng.integers(1, 120, num)
    groups = rng.choice(["a", "b", None], num)
    shared = np.where(groups == None, 0, np.minimum(prompts, rng.integers(1, 60, num)))  # noqa: E711
    trace = Trace.from_arrays(arrivals, prompts, rng.integers(1, 150, num), n=rng.choice([1, samples], num),
                              prefix_group=groups, prefix_tokens=shared)
    cache, sched = CONFIGS[config]
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=num_blocks, **cache),
                    SchedulerConfig(**profile_sched(sched, profile)), engine_profile=profile)
    both(trace, cfg, ConstantCost(0.25) if constant else None)


def profile_sched(sched: dict, profile: str) -> dict:
    """The scheduler flags of a config under `profile`: vllm-2023 never chunks prompts, the others
    take the profile's chunking unless the config sets it."""
    if profile == "vllm-2023":
        return {**sched, "chunked_prefill": False}
    return sched


@pytest.mark.parametrize("config, profile", [(c, "ideal") for c in sorted(CONFIGS)] + [
    ("paged", "vllm-2023"), ("contiguous-pow2-first-fit", "vllm-2023"), ("paged-swap", "vllm-v1"),
    ("paged", "vllm-v1"), ("paged-prefix", "vllm-v1"), ("paged-chunked-small", "vllm-v1")])
def test_windows_equal_single_steps_on_a_shipped_trace(config, profile):
    cache, sched = CONFIGS[config]
    trace = load_trace(ROOT / "traces" / "sharegpt_2rps_10min.jsonl").head(400)
    both(trace, SimConfig(DEP, CacheConfig(kv_gib=4, **cache), SchedulerConfig(**profile_sched(sched, profile)),
                          engine_profile=profile))


@pytest.mark.parametrize("prefix", [False, True])
def test_windows_equal_single_steps_with_samples_under_the_default_profile(prefix):
    """Parallel samples (n = 2 and 4, forks sharing the prompt) under vllm-v1's chunked prefill."""
    trace = load_trace(ROOT / "traces" / "sharegpt_2rps_10min.jsonl").head(200)
    trace = Trace.from_arrays(trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                              n=np.where(np.arange(len(trace)) % 3 == 0, 4, 2))
    both(trace, SimConfig(DEP, CacheConfig(kv_gib=4, prefix_caching=prefix),
                          SchedulerConfig(max_batched_tokens=512)))


def test_windows_carry_most_steps_of_a_steady_decode_workload():
    trace = load_trace(ROOT / "traces" / "sharegpt_2rps_10min.jsonl").head(400)
    parts = build_run(trace, SimConfig(DEP, CacheConfig(kv_gib=12), SchedulerConfig()))
    sched, single, windowed = parts.scheduler, 0, 0
    for kind, plan in engine_steps(trace, parts):
        if kind == "step":
            single += 1
        else:
            windowed += plan.num_steps
    assert sched.num_finished == 400
    assert windowed > 0.5 * (single + windowed)
    parts.allocator.check_invariants()


@pytest.mark.parametrize("watched", [False, True])
def test_a_window_follows_a_prompt_step_that_left_the_queue_blocked(watched):
    """vLLM v0's separate prefill: after a prompt-only step whose admission stopped for want of KV memory,
    the next step only decodes, so a window may start right there (not under a stop watch, which asks
    every so many engine iterations); the rows are those of single steps either way (`both`)."""
    trace = load_trace(ROOT / "traces" / "sharegpt_2rps_10min.jsonl").head(300)
    cache, sched = CONFIGS["contiguous-max"]
    cfg = SimConfig(DEP, CacheConfig(kv_gib=2, **cache), SchedulerConfig(**profile_sched(sched, "vllm-2023")),
                    engine_profile="vllm-2023")
    seen = list(engine_steps(trace, build_run(trace, cfg), watched))
    blocked = [(a[1], b[0]) for a, b in zip(seen, seen[1:]) if a[0] == "step" and a[1].prefills
               and not a[1].finished and a[1].limited_by == 1]
    assert len(blocked) > 10
    assert any(kind == "window" for _, kind in blocked) != watched
    both(trace, cfg)


def test_windows_run_through_last_tokens_and_follow_one_another():
    """A window runs through the step at which requests emit their last token (they are retired at its
    end, in batch order) and another may follow it at once; under a stop watch neither (its step counts
    stay put). Either way every row equals single steps (`both`)."""
    trace = load_trace(ROOT / "traces" / "sharegpt_2rps_10min.jsonl").head(400)
    # (synchronous scheduling: under async scheduling a finished request is held through the next step,
    # kvsim/engine/batching/settle.py, so no window follows one that ran through last tokens)
    cfg = SimConfig(DEP, CacheConfig(kv_gib=12), SchedulerConfig(async_scheduling=False))
    seen = list(engine_steps(trace, build_run(trace, cfg)))
    through = [p for kind, p in seen if kind == "window" and p.finished]
    assert len(through) > 50
    assert all(p.finished == [i for i in p.decodes if i in set(p.finished)] for p in through)
    assert any(a[0] == b[0] == "window" for a, b in zip(seen, seen[1:]))
    watched = list(engine_steps(trace, build_run(trace, cfg), watched=True))
    assert not any(kind == "window" and p.finished for kind, p in watched)
    assert not any(a[0] == b[0] == "window" for a, b in zip(watched, watched[1:]))
    assert len(watched) > len(seen)
    both(trace, cfg)
