"""The existing scheduler (kvsim/engine/batching/scheduler.py, unchanged) driving Jenga's allocator: with one page size
for every group it runs step for step as vLLM's hybrid manager (HybridAllocator, itself checked against vLLM's
own scheduler); with natural page sizes a tiny case worked by hand (more requests fit the same bytes than
under padded pages); and bursts of 40 requests run to completion with preemptions over several group mixes
and page sizes, chunked prefill on and off, invariants checked after every step and nothing leaked.
Built directly (no `build_run`: the model spec's layer kinds are not wired to the allocators yet)."""

import random

import pytest

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.alloc.jenga import JengaAllocator, JengaGroup
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

KINDS = {"full": GroupSpec("full"), "swa4": GroupSpec("sliding", window=4), "chunk4": GroupSpec("chunked", chunk=4),
         "mamba": GroupSpec("mamba")}


def jenga(kinds_and_bytes):
    return [JengaGroup(KINDS[k].kind, KINDS[k].window, KINDS[k].chunk, page) for k, page in kinds_and_bytes]


def run(trace, alloc, chunked=False, budget=8, max_len=64):
    """Every request queued at 0, 1 s per step; returns (plans, scheduler)."""
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=16, max_batched_tokens=budget,
                                                    chunked_prefill=chunked), max_seq_len=max_len)
    for i in range(len(trace)):
        sched.add(i, 0.0)
    stepper, now, plans = Stepper(sched, ConstantCost(1.0)), 0.0, []
    while (plan := stepper.step(now, tables=True)) is not None:
        alloc.check_invariants()
        plans.append(plan)
        now = plan.end_s
        assert len(plans) < 10_000
    return plans, sched


def make_jenga(groups, pool_bytes, chunked=False, budget=8, **kw):
    return JengaAllocator(pool_bytes, 2, groups, max_model_len=64, max_in_flight_tokens=budget,
                          prefill_chunk_tokens=budget if chunked else None, **kw)


def burst(seed, n=40):
    rng = random.Random(seed)
    return Trace.from_arrays([0.0] * n, [rng.randint(1, 12) for _ in range(n)],
                             [rng.randint(1, 20) for _ in range(n)])


def summary(plans):
    return [(p.memory[0].used_blocks, p.preempted, p.finished, p.prefills) for p in plans]


@pytest.mark.parametrize("kinds", [["full", "swa4"], ["full", "chunk4"], ["full", "mamba"],
                                   ["swa4", "full", "mamba", "chunk4"]])
@pytest.mark.parametrize("chunked", [False, True])
def test_at_one_page_size_it_runs_as_the_hybrid_manager(kinds, chunked):
    num_blocks, page, budget = 15 * len(kinds), 6, 8 if chunked else 16
    trace = burst(7)
    hybrid = HybridAllocator(num_blocks, 2, [KINDS[k] for k in kinds], max_model_len=64,
                             max_in_flight_tokens=budget, prefill_chunk_tokens=budget if chunked else None)
    plans_h, sched_h = run(trace, hybrid, chunked, budget)
    alloc = make_jenga(jenga([(k, page) for k in kinds]), num_blocks * page + 5, chunked, budget)
    plans_j, sched_j = run(trace, alloc, chunked, budget)
    assert sched_h.num_preemptions > 0 and sched_j.num_finished == 40
    assert summary(plans_j) == summary(plans_h)
    assert [p.tables for p in plans_j] == [p.tables for p in plans_h]
    assert [p.memory[0][1:4] for p in plans_j] == [p.memory[0][1:4] for p in plans_h]


def test_natural_page_sizes_fit_more_requests_in_the_same_bytes_by_hand():
    """Full pages of 2 bytes, sliding (window 4) pages of 1 byte (half the layers), block 2, 12 bytes; three
    requests of prompt 4 and 1 output (each holds 2 pages per group, then finishes at its prefill).
    Jenga: large pages of 2 bytes (1 full page or 2 sliding), 6 of them; a request takes 2 + 1: two
    requests prefill in step 1 (6 used), the third in step 2 (3 used). vLLM's hybrid manager pads both
    pages to 2 bytes: 6 blocks, 4 per request: one request per step, three steps."""
    trace = Trace.from_arrays([0.0] * 3, [4, 4, 4], [1, 1, 1])
    plans, sched = run(trace, make_jenga(jenga([("full", 2), ("swa4", 1)]), 12))
    assert [(p.memory[0].used_blocks, [i for i, _ in p.prefills], p.finished) for p in plans] == \
        [(6, [0, 1], [0, 1]), (3, [2], [2])]
    padded, _ = run(trace, HybridAllocator(6, 2, [KINDS["full"], KINDS["swa4"]], max_model_len=64,
                                           max_in_flight_tokens=8))
    assert [(p.memory[0].used_blocks, p.finished) for p in padded] == [(4, [0]), (4, [1]), (4, [2])]


@pytest.mark.parametrize("mix", [[("full", 3), ("swa4", 2)], [("full", 4), ("chunk4", 6)],
                                 [("full", 4), ("mamba", 6)],
                                 [("swa4", 2), ("full", 3), ("mamba", 10), ("chunk4", 5)]])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("empty_first", [True, False])
def test_bursts_run_to_completion_with_preemptions(mix, chunked, empty_first):
    from math import lcm
    large = lcm(*(b for _, b in mix))
    pool = max(large, 15 * sum(b for _, b in mix)) + 1     # about 15 pages per group
    alloc = make_jenga(jenga(mix), pool, chunked, 8 if chunked else 16, empty_first=empty_first)
    plans, sched = run(burst(11), alloc, chunked, 8 if chunked else 16)
    assert sched.num_finished == 40 and sched.num_rejected == 0 and sched.num_preemptions > 0
    assert alloc.num_free_large == alloc.layout.num_large and alloc.stats().used_blocks == 0
    for p in plans:
        m = p.memory[0]
        assert m.token_states + m.reserved + m.internal_fragmentation + m.external_fragmentation + m.free == \
            alloc.capacity_tokens


def test_requests_that_can_never_fit_are_rejected_and_samples_are_refused():
    # 2 large pages of 6 bytes: prompt 7 + 2 outputs needs 4 full pages of 2 bytes (2 large) + sliding pages
    alloc = make_jenga(jenga([("full", 2), ("swa4", 3)]), 12)
    _, sched = run(Trace.from_arrays([0.0, 0.0], [7, 2], [2, 2]), alloc)
    assert sched.num_rejected == 1 and sched.num_finished == 1 and "KV slots at its peak" in sched.reason[0]
    with pytest.raises(ValueError, match="one sequence per request"):
        run(Trace.from_arrays([0.0], [4], [2], n=[2]), make_jenga(jenga([("full", 2)]), 12))
