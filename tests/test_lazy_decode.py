"""Lazy decode steps (kvsim/engine/lazy_decode.py, the allocator's ticks) are exact: stepped side by side with
the scheduler's per-sequence path (`_lazy` off), every plan, every block table and every request's
state is the same after each step, under preemption by recompute and swap, mixed and separate
prefill steps, queueing and windows; and the lazy path is what the presets' configuration runs."""

import dataclasses

import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from engine_loop import engine_steps
from quick_examples import examples

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


def _run(trace, cfg, lazy: bool):
    """Yield (plan, scheduler, allocator) after each step or window of the engine's loop."""
    parts = build_run(trace, cfg)
    if not lazy:
        parts.scheduler._lazy = False
    for _, plan in engine_steps(trace, parts):
        yield plan, parts.scheduler, parts.allocator


def _state(sched, alloc):
    live = sorted(alloc._seqs)
    return ([sched.computed_tokens(i) for i in range(len(sched.prompt))], list(sched.generated),
            list(sched.running), [(s, alloc.num_tokens(s), alloc.block_table(s)) for s in live],
            alloc.stats())


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


def test_the_presets_configuration_runs_lazily():
    trace = Trace.from_arrays(np.zeros(2), np.array([5, 7]), np.array([3, 4]))
    parts = build_run(trace, SimConfig(DEP, CacheConfig(kv_gib=1), engine_profile="ideal"))
    assert parts.scheduler._lazy
    for cache, sched in (({"prefix_caching": True}, {}), ({"allocator": "contiguous"}, {}),
                         ({}, {"chunked_prefill": True})):
        cfg = SimConfig(DEP, CacheConfig(kv_gib=1, **cache), SchedulerConfig(**sched), engine_profile="ideal")
        assert not build_run(trace, cfg).scheduler._lazy
