"""Contiguous reservations on the lazy decode path (kvsim/alloc/contiguous/ticks.py) are exact: stepped
side by side with the per-sequence path (`_lazy` off), every plan (its memory snapshots judged against
the head of the queue included), every sequence's written slots and extent and every request's state
is the same after each step, for the max, pow2 and oracle policies under buddy and first-fit
placement, with queueing, windows, chunked and separate prefill steps, swap, parallel samples and a
hybrid model (whose grouped reservations keep the per-sequence path)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.alloc.base import AllocationError
from kvsim.alloc.contiguous.allocator import ContiguousAllocator
from kvsim.engine.build import build_run
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.planning.runs import make_config
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from tests.engine.batching.test_lazy_decode import _side_by_side as side_by_side
from tests.quick_examples import examples

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


def _state(sched, alloc):
    head = sched.head_of_queue()
    return ([sched.computed_tokens(i) for i in range(len(sched.prompt))], list(sched.generated),
            list(sched.running), sorted((s, alloc.num_tokens(s), alloc._extent[s]) for s in alloc._extent),
            alloc.stats(*head))


def _side_by_side(trace, cfg) -> int:
    """Steps run side by side, plans and contiguous states compared after each (tests/engine/batching/test_lazy_decode.py)."""
    return side_by_side(trace, cfg, state=_state)


@settings(**examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(20, 700), reserve=st.sampled_from(["max", "pow2", "oracle"]),
       placement=st.sampled_from(["buddy", "first-fit"]), swap=st.booleans(), chunked=st.booleans(),
       separate=st.booleans(), burst=st.booleans())
def test_contiguous_lazy_steps_equal_per_sequence_steps(seed, capacity, reserve, placement, swap, chunked, separate,
                                                        burst):
    rng = np.random.default_rng(seed)
    num = 40
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 0.5 if burst else 4, num)), rng.integers(1, 90, num),
                              rng.integers(1, 160, num))
    cfg = SimConfig(DEP, CacheConfig(allocator="contiguous", reserve=reserve, placement=placement,
                                     num_blocks=capacity, swap_gib=0.05 if swap else 0),
                    SchedulerConfig(max_batched_tokens=64 if chunked else 2048, chunked_prefill=chunked,
                                    preemption="swap" if swap else "recompute",
                                    separate_prefill=separate and not chunked),
                    engine_profile="ideal")
    assert _side_by_side(trace, cfg) > 0 or (reserve == "max" and capacity * 16 < DEP.model.max_seq_len)


@pytest.mark.parametrize("profile", ["vllm-2023", "vllm-v1"])
def test_contiguous_lazy_steps_under_the_papers_profiles(profile):
    """The kvsim paper's Orca baselines (vllm-2023) and the default profile (vllm-v1: CPU time, chunked
    steps), with a queue that a small cache keeps (the head's reservation stranded between extents)."""
    rng = np.random.default_rng(7)
    num = 60
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 2, num)), rng.integers(5, 400, num), rng.integers(1, 300, num))
    for reserve in ("max", "pow2", "oracle"):
        cfg = SimConfig(DEP, CacheConfig(allocator="contiguous", reserve=reserve, num_blocks=5000),
                        engine_profile=profile)
        assert _side_by_side(trace, cfg) > num


def test_parallel_samples_tick_each_sample():
    rng = np.random.default_rng(3)
    num = 20
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 1, num)), rng.integers(1, 60, num), rng.integers(1, 80, num),
                              n=rng.integers(1, 4, num))
    cfg = SimConfig(DEP, CacheConfig(allocator="contiguous", reserve="oracle", num_blocks=2500),
                    engine_profile="ideal")
    assert _side_by_side(trace, cfg) > 0


def test_hand_worked_ticks():
    """Max reservations of 8 slots (first fit, 64 slots): sequences of 3 and 5 slots (finals 5 and 7)
    tick twice: 5 + 7 = 12 written, nothing left to fill, (8 - 5) + (8 - 7) = 4 never filled, 48 free."""
    alloc = ContiguousAllocator(64, 8, reserve="max", placement="first-fit")
    alloc.allocate(0, 3, 5)
    alloc.allocate(1, 5, 7)
    alloc.tick_join(0)
    alloc.tick_join(1)
    assert alloc.tick() and alloc.tick()
    s = alloc.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (12, 0, 4, 48)
    assert (alloc.num_tokens(0), alloc.num_tokens(1)) == (5, 7)
    assert list(alloc.tick_steps(0)) == []
    alloc.free(0)                    # a ticking sequence freed: its 5 slots leave the count
    assert alloc.stats().token_states == 7
    alloc.append(1)                  # appending stops its ticking: a tick no longer moves it
    alloc.tick()
    assert alloc.num_tokens(1) == 8 and alloc.stats().token_states == 8
    alloc.tick_join(1)
    with pytest.raises(AllocationError):
        alloc.tick_join(1)


def test_tick_steps_snapshots_against_the_head_of_the_queue():
    """Oracle reservations in a buddy pool of 512 slots: finals 100 and 200 take blocks of 128 (at 0)
    and 256 (at 256): 28 + 56 = 84 slots of padding, one free block of 128. A head of final 200 needs a
    256-slot block: those 128 free slots are stranded (external 84 + 128 = 212, free 0). Written:
    4 + 6 = 10, to fill 300 - 10; each tick writes 2 more."""
    alloc = ContiguousAllocator(512, 8, reserve="oracle", placement="buddy")
    alloc.allocate(0, 4, 100)
    alloc.allocate(1, 6, 200)
    for s in (0, 1):
        alloc.tick_join(s)
    short = alloc.tick_steps(3, 150, 200)
    assert [(m.token_states, m.reserved, m.external_fragmentation, m.free) for m in short] == \
        [(12, 288, 212, 0), (14, 286, 212, 0), (16, 284, 212, 0)]
    long = alloc.tick_steps(64, 150, 200)     # a FillRun (last snapshot + slots per tick): the same rows
    assert type(long).__name__ == "FillRun" and len(long) == 64 and tuple(long[0])[1:6] == (18, 282, 0, 212, 0)
    assert (long[63].token_states, long[63].reserved, long[63].external_fragmentation) == (144, 156, 212)
    assert alloc.num_tokens(0) == 4 + 67 and alloc.stats().token_states == 144


def test_a_hybrid_models_grouped_reservations_do_not_tick():
    cfg = make_config(model="gpt-oss-20b", gpu="h100-80gb", kv_gib=1, max_model_len=4096, allocator="contiguous")
    trace = Trace.from_arrays(np.zeros(2), np.array([5, 7]), np.array([3, 4]))
    assert not build_run(trace, cfg).scheduler._lazy
