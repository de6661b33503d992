"""Lazy decode steps (kvsim/engine/batching/lazy_decode.py, the allocator's ticks) are exact: stepped side by side with
the scheduler's per-sequence path (`_lazy` off), every plan, every block table, the prefix cache and
every request's state is the same after each step, under preemption by recompute and swap, mixed and
separate prefill steps, chunked prefill, prefix caching, queueing and windows; and the lazy path is
what the presets' configuration and the default profile run."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from tests.engine_loop import findable_hashes, steps_of
from tests.quick_examples import examples

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


_run = steps_of             # (tests/engine_loop.py)


def _state(sched, alloc):
    live = sorted(alloc._seqs)
    cache = alloc._cache            # the prefix cache: which blocks hold which hashes, LRU order
    return ([sched.computed_tokens(i) for i in range(len(sched.prompt))], list(sched.generated),
            list(sched.running), [(s, alloc.num_tokens(s), alloc.block_table(s)) for s in live],
            alloc.stats(), None if cache is None else
            (cache.evictable_blocks(),
             findable_hashes(sched, cache)))


def _side_by_side(trace, cfg, stop_at: int = -1, state=None) -> int:
    """Step `trace` lazily and per sequence side by side, asserting equal plans and states after each
    step; `stop_at`: leave the lazy mode (`_stop_lazy`) at the first step from then on when a member's
    state is behind the clocks (so that leaving has something to bring up to date); `state(scheduler,
    allocator)`: what must be equal after each step (default: the paged allocator's `_state`). Returns
    the step it left at (or the steps run; 0 when every request was refused on arrival)."""
    state = state or _state
    steps, stopped, la = 0, -1, None
    for (a, sa, la), (b, sb, lb) in zip(_run(trace, cfg, True), _run(trace, cfg, False), strict=True):
        assert (sa._lazy or stopped >= 0) and not sb._lazy
        assert dataclasses.asdict(a) == dataclasses.asdict(b), f"step {steps}"
        steps += 1
        if 0 <= stop_at <= steps and stopped < 0 and any(t < sa._gen_clock for t in sa._since.values()):
            sa._stop_lazy()        # (reading the state below brings every member up to date: not before)
            stopped = steps
        if stop_at < 0 or steps < stop_at or stopped >= 0:
            assert state(sa, la) == state(sb, lb), f"step {steps}"
        if steps % 7 == 0:
            la.check_invariants()
    if la is None:                  # (no step on either path: every request was refused on arrival)
        return steps
    la.check_invariants()
    assert sa.num_finished + sa.num_rejected == len(trace)
    return stopped if stop_at >= 0 else steps


@settings(**examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(12, 200), swap=st.booleans(),
       separate=st.booleans(), burst=st.booleans())
def test_lazy_steps_equal_per_sequence_steps(seed, num_blocks, swap, separate, burst):
    rng = np.random.default_rng(seed)
    num = 40
    arrivals = np.sort(rng.uniform(0, 0.5 if burst else 4, num))
    trace = Trace.from_arrays(arrivals, rng.integers(1, 90, num), rng.integers(1, 120, num))
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=num_blocks, swap_gib=0.05 if swap else 0),
                    SchedulerConfig(preemption="swap" if swap else "recompute", separate_prefill=separate),
                    engine_profile="ideal")
    steps = 0
    for (a, sa, la), (b, sb, lb) in zip(_run(trace, cfg, True), _run(trace, cfg, False), strict=True):
        assert sa._lazy and not sb._lazy
        assert dataclasses.asdict(a) == dataclasses.asdict(b), f"step {steps}"
        assert _state(sa, la) == _state(sb, lb), f"step {steps}"
        steps += 1
        if steps % 7 == 0:
            la.check_invariants()
    la.check_invariants()
    assert sa.request_columns().keys() and sa.num_finished + sa.num_rejected == num


@settings(**examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(12, 200), swap=st.booleans(),
       prefix=st.booleans(), burst=st.booleans(), budget=st.sampled_from([8, 32, 64, 8192]))
def test_lazy_steps_equal_per_sequence_steps_under_the_default_profile(seed, num_blocks, swap, prefix, burst,
                                                                       budget):
    """vllm-v1: chunked prefill (small token budgets split prompts over several steps beside the
    decodes), its CPU time, prefix caching (shared prompt prefixes: hits at admission, evictions)."""
    rng = np.random.default_rng(seed)
    num = 40
    arrivals = np.sort(rng.uniform(0, 0.5 if burst else 4, num))
    prompts = rng.integers(1, 90, num)
    groups = rng.choice(["a", "b", None], num)
    shared = np.where(groups == None, 0, np.minimum(prompts, rng.integers(1, 60, num)))  # noqa: E711
    trace = Trace.from_arrays(arrivals, prompts, rng.integers(1, 120, num), prefix_group=groups,
                              prefix_tokens=shared)
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=num_blocks, swap_gib=0.05 if swap else 0,
                                     prefix_caching=prefix),
                    SchedulerConfig(preemption="swap" if swap else "recompute", max_batched_tokens=budget))
    _side_by_side(trace, cfg)


@pytest.mark.parametrize("stop_at", [1, 5, 40])
def test_leaving_the_lazy_mode_mid_run_changes_nothing(stop_at):
    rng = np.random.default_rng(stop_at)
    num = 30
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 1, num)), rng.integers(1, 90, num), rng.integers(1, 120, num))
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=40, prefix_caching=True),
                    SchedulerConfig(max_batched_tokens=32))
    assert _side_by_side(trace, cfg, stop_at) >= stop_at


def test_the_presets_configuration_runs_lazily():
    trace = Trace.from_arrays(np.zeros(2), np.array([5, 7]), np.array([3, 4]))
    for cache, sched in (({}, {}), ({"prefix_caching": True}, {}), ({}, {"chunked_prefill": True})):
        for profile in ("ideal", "vllm-v1"):
            cfg = SimConfig(DEP, CacheConfig(kv_gib=1, **cache), SchedulerConfig(**sched), engine_profile=profile)
            assert build_run(trace, cfg).scheduler._lazy
    for reserve in ("max", "pow2", "oracle"):      # contiguous reservations tick too (contiguous_ticks.py)
        cfg = SimConfig(DEP, CacheConfig(kv_gib=1, allocator="contiguous", reserve=reserve))
        assert build_run(trace, cfg).scheduler._lazy
    cfg = SimConfig(DEP, CacheConfig(kv_gib=1, allocator="contiguous"), SchedulerConfig(batching="static"))
    assert not build_run(trace, cfg).scheduler._lazy
