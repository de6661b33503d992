"""The hybrid allocator's fast-forward (kvsim/alloc/hybrid/windows.py): `decode_window` worked by hand, then
`append_steps` against `append_each` one step at a time from random states (same tables, same free queue,
same memory after every step), and a whole engine run with and without windows step for step."""

import copy
import random

import pytest

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.trace.synthetic import generate

from tests.engine_loop import engine_steps

FULL, SWA4 = GroupSpec("full"), GroupSpec("sliding", window=4)


def test_decode_window_by_hand():
    """Full + sliding 4, block 2, 10 blocks; prompt 5 (3 + 3 blocks, 4 free), final 20. Step j grows
    from 5 + j tokens: the sliding group frees a block at j = 0, 2, 4, ... (skipped 2, 4, 6, ... tokens)
    and both groups take one at j = 1, 3, 5, ... (7, 9, 11, ... tokens). Free before each step: 4, 5, 3,
    4, 2, 3, 1, 2, 0, 1: step 9 needs 2 with 1 free. The window is 9 steps."""
    a = HybridAllocator(10, 2, [FULL, SWA4], 64, 8, 8)
    a.allocate(0, 5, 20)
    assert a.decode_window([0], 100) == 9
    assert a.decode_window([0], 4) == 4
    b = copy.deepcopy(a)
    mems = a.append_steps([0], 9)
    assert [m.free_blocks for m in mems] == [5, 3, 4, 2, 3, 1, 2, 0, 1]
    for m in mems:
        assert b.append_each([0]) == 1 and b.stats() == m
    assert a.group_block_tables(0) == b.group_block_tables(0) and list(a._free) == list(b._free)
    assert not a.can_append(0)                          # step 9 indeed does not fit
    a.check_invariants()


def random_state(rng, caching=False):
    kinds = [FULL, GroupSpec("sliding", window=rng.randint(1, 9)), GroupSpec("chunked", chunk=rng.randint(1, 9))]
    groups = rng.sample(kinds + [GroupSpec("mamba")], rng.randint(1, 4))     # (caching: Mamba in align mode)
    a = HybridAllocator(rng.randint(10, 80), rng.randint(1, 4), groups, 1000, 16, 16, prefix_caching=caching)
    ids = []
    for s in range(rng.randint(1, 6)):
        n = rng.randint(1, 16)
        shared = list(range(rng.randint(0, n // a.block_size)))      # a prefix shared by all (cache hits)
        if a.can_allocate(n, n, shared, s) and a.can_hold(n, n, shared, s):
            a.allocate(s, n, n + rng.randint(0, 60), shared)
            ids.append(s)
            for _ in range(rng.randint(0, 6)):
                k = rng.randint(1, 4)
                if a.can_append(s, k):
                    a.append(s, k)
    rng.shuffle(ids)
    return a, ids


@pytest.mark.parametrize("caching", [False, True])
def test_append_steps_equals_append_each_step_by_step(caching):
    rng = random.Random(11)
    windows = 0
    for _ in range(300):
        a, ids = random_state(rng, caching)
        if caching and rng.random() < 0.5 and ids:      # some cached blocks freed (evictable) first
            a.free(ids.pop())
        if not ids:
            continue
        steps = a.decode_window(ids, rng.randint(1, 80))
        b = copy.deepcopy(a)
        mems = a.append_steps(ids, steps)
        assert len(mems) == steps
        for m in mems:
            assert b.append_each(ids) == len(ids) and b.stats() == m
        for s in ids:
            assert a.group_block_tables(s) == b.group_block_tables(s) and a.num_tokens(s) == b.num_tokens(s)
        assert list(a._free) == list(b._free) and a.group_stats() == b.group_stats() and a.stats() == b.stats()
        if caching:
            assert a._cache.evictable_blocks() == b._cache.evictable_blocks() and a._ref == b._ref
        a.check_invariants()
        windows += steps > 1
    assert windows > 100


class _NoWindows(HybridAllocator):
    def decode_window(self, seq_ids, max_steps):
        return 0


def _run(cls, trace, caching=False, mamba=True):
    groups = [FULL, GroupSpec("sliding", window=128)] + ([GroupSpec("mamba")] if mamba else [])
    alloc = cls(400, 16, groups, 4096, 2048, 2048, prefix_caching=caching)
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=64, max_batched_tokens=2048, chunked_prefill=True),
                      max_seq_len=4096, block_ids=(lambda i: trace.prompt_block_ids(i, 16)) if caching else None)

    class Parts:
        scheduler, cost = sched, ConstantCost(0.02)
    per_step = []
    for kind, plan in engine_steps(trace, Parts):
        for start, mem in zip(plan.starts, plan.memory):
            per_step.append((round(start, 9), mem, tuple(plan.preempted) if kind == "step" else ()))
    return per_step, sched


@pytest.mark.parametrize("caching, mamba", [(False, True), (True, False),
                                            pytest.param(True, True, marks=pytest.mark.long)])  # (align mode)
def test_an_engine_run_is_the_same_with_and_without_windows(caching, mamba):
    trace = generate("sharegpt", rate_rps=4.0, duration_s=60.0, seed=2, shared_prefix_tokens=80 if caching else 0)
    with_windows, s1 = _run(HybridAllocator, trace, caching, mamba)
    without, s2 = _run(_NoWindows, trace, caching, mamba)
    if caching:
        assert s1.prefix_hit_tokens == s2.prefix_hit_tokens > 0
    assert s1.num_finished == s2.num_finished == len(trace) and s1.num_preemptions == s2.num_preemptions > 0
    assert with_windows == without
    assert list(s1.finished_s) == list(s2.finished_s)
