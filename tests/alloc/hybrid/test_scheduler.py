"""The existing scheduler (kvsim/engine/batching/scheduler.py, unchanged) driving the hybrid allocator: a tiny burst
worked step by step by hand (used blocks per step, the preemption, the recompute), and larger bursts
run to completion with preemptions, chunked prefill on and off, invariants checked after every step and
nothing leaked at the end. Built directly (no `build_run`: the model spec's layer kinds are not wired yet)."""

import random

import pytest

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

FULL, SWA4, CHUNK4, MAMBA = GroupSpec("full"), GroupSpec("sliding", window=4), GroupSpec("chunked", chunk=4), GroupSpec("mamba")


def run(trace, groups, num_blocks, block_size=2, chunked=False, budget=8, max_len=64):
    """Every request queued at 0, 1 s per step; returns (plans, scheduler, allocator)."""
    alloc = HybridAllocator(num_blocks, block_size, groups, max_model_len=max_len, max_in_flight_tokens=budget,
                            prefill_chunk_tokens=budget if chunked else None)
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
    return plans, sched, alloc


def test_two_requests_in_eight_blocks_by_hand():
    """Full + sliding window 4, block 2, 8 blocks; two requests of prompt 4 and 5 outputs at t = 0.
    1: both prefill (2 + 2 blocks each): 8 used. 2: request 0's 5th token needs a 3rd block per group
       (nothing left its window: 1 token skipped), none free: request 1 (last admitted) is preempted,
       request 0 takes 2: 6. 3: 2 tokens skipped, its first sliding block freed: 5 (request 1 would need
       3 + 3 to recompute 5 tokens, 3 free). 4: 7 tokens: a 4th entry each: 7. 5: 4 skipped, a 2nd
       sliding block freed: 6; request 0 emits its 5th token and is freed. 6: request 1 recomputes 5
       tokens: 6. 7-9: as request 0's steps 3-5: 5, 7, 6."""
    trace = Trace.from_arrays([0.0, 0.0], [4, 4], [5, 5])
    plans, sched, alloc = run(trace, [FULL, SWA4], num_blocks=8)
    assert [p.memory[0].used_blocks for p in plans] == [8, 6, 5, 7, 6, 6, 5, 7, 6]
    assert [p.preempted for p in plans] == [[], [1], [], [], [], [], [], [], []]
    assert plans[5].prefills == [(1, 5)] and plans[4].finished == [0] and plans[8].finished == [1]
    assert sched.num_preemptions == 1 and sched.num_finished == 2
    assert alloc.num_free_blocks == 8


def test_a_mamba_group_costs_one_block_per_running_request():
    """Full + Mamba, block 2, 10 blocks, three requests of prompt 3 and 3, 3, 4 outputs, a 16-token
    budget: each holds 2 + 1 blocks after its prefill. Step 1: 3 x 3 = 9. Step 2: decode to 4 tokens, no
    new block: 9. Step 3: 5 tokens need a 3rd full block each, one is free: request 0 takes it, request 1
    finds none, request 2 is preempted (3 freed), request 1 takes one: 8 used; requests 0 and 1 finish.
    Step 4: request 2 recomputes prompt + 2 outputs = 5 tokens: 3 + 1 = 4. Step 5: 6 tokens still fit
    3 full blocks: 4, and it finishes."""
    trace = Trace.from_arrays([0.0] * 3, [3, 3, 3], [3, 3, 4])
    plans, sched, _ = run(trace, [FULL, MAMBA], num_blocks=10, budget=16)
    assert [p.memory[0].used_blocks for p in plans] == [9, 9, 8, 4, 4]
    assert [p.preempted for p in plans] == [[], [], [2], [], []]
    assert plans[2].finished == [0, 1] and plans[4].finished == [2]


@pytest.mark.parametrize("groups", [[FULL, SWA4], [FULL, CHUNK4], [FULL, MAMBA], [SWA4, FULL, MAMBA, CHUNK4]])
@pytest.mark.parametrize("chunked", [False, True])
def test_bursts_run_to_completion_with_preemptions(groups, chunked):
    rng = random.Random(7)
    n = 40
    trace = Trace.from_arrays([0.0] * n, [rng.randint(1, 12) for _ in range(n)], [rng.randint(1, 20) for _ in range(n)])
    num_blocks = 15 * len(groups)
    plans, sched, alloc = run(trace, groups, num_blocks=num_blocks, chunked=chunked, budget=8 if chunked else 16)
    assert sched.num_finished == n and sched.num_rejected == 0
    assert sched.num_preemptions > 0
    assert alloc.num_free_blocks == num_blocks and alloc.stats().used_blocks == 0
    for p in plans:
        parts = p.memory[0]
        assert parts.token_states + parts.reserved + parts.internal_fragmentation + parts.free == 2 * num_blocks


def test_windows_hold_fewer_blocks_than_full_attention_on_the_same_burst():
    rng = random.Random(3)
    trace = Trace.from_arrays([0.0] * 20, [rng.randint(8, 16) for _ in range(20)], [rng.randint(10, 30) for _ in range(20)])
    peak = {}
    for name, groups in (("full", [FULL, FULL]), ("sliding", [FULL, SWA4]), ("mamba", [FULL, MAMBA])):
        plans, sched, _ = run(trace, groups, num_blocks=1000, budget=400)
        assert sched.num_preemptions == 0 and sched.num_finished == 20
        peak[name] = max(p.memory[0].used_blocks for p in plans)
    # all 20 admitted at once (ample pool): full + full holds 2 x cdiv(prompt + outputs - 1, 2) at the end
    assert peak["mamba"] < peak["sliding"] < peak["full"]


def test_requests_that_can_never_fit_are_rejected_and_samples_are_refused():
    # 4 blocks of 2: a prompt of 7 and 2 outputs peaks at 4 full + min(4, max(cap, 4)) sliding blocks > 4
    trace = Trace.from_arrays([0.0, 0.0], [7, 2], [2, 2])
    plans, sched, _ = run(trace, [FULL, SWA4], num_blocks=4)
    assert sched.num_rejected == 1 and sched.num_finished == 1 and "KV slots at its peak" in sched.reason[0]
    with pytest.raises(ValueError, match="one sequence per request"):
        run(Trace.from_arrays([0.0], [4], [2], n=[2]), [FULL, SWA4], num_blocks=10)


def test_swap_preemption_brings_a_whole_context_back_only_when_it_fits():
    """vLLM V1 has no swap; kvsim's swap-in allocates a swapped sequence's whole context at once, which the
    scheduler checks with `can_hold` besides the admission gate (a sliding group's gate is capped below it)."""
    rng = random.Random(7)
    trace = Trace.from_arrays([0.0] * 40, [rng.randint(1, 40) for _ in range(40)], [rng.randint(1, 40) for _ in range(40)])
    alloc = HybridAllocator(40, 4, [FULL, GroupSpec("sliding", window=8)], max_model_len=128, max_in_flight_tokens=16,
                            prefill_chunk_tokens=16)
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=16, max_batched_tokens=16, chunked_prefill=True,
                                                    preemption="swap"), max_seq_len=128, swap_tokens=10_000)
    for i in range(40):
        sched.add(i, 0.0)
    stepper, now = Stepper(sched, ConstantCost(1.0)), 0.0
    while (plan := stepper.step(now)) is not None:
        alloc.check_invariants()
        now = plan.end_s
    assert sched.num_finished == 40 and sched.num_swap_outs == sched.num_swap_ins > 0
