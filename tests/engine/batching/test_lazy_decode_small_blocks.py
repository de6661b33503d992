"""Lazy ticks at small block sizes (1, 2, 3 slots: nearly every ticking sequence crosses a block boundary
at every tick, and a tick left half done by a missing block goes on after a preemption) equal the
per-sequence path step by step, under the preemption churn of a small cache, with and without parallel
samples (a fork's shared partly filled block) and prefix caching (one-slot decode blocks are registered
on both paths); and ticks of one-slot blocks by hand."""

from dataclasses import replace

import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.alloc import PagedAllocator
from kvsim.cost.profiles import get_profile
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from tests.quick_examples import examples
from tests.engine.batching.test_lazy_decode import _side_by_side

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


@settings(**examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 1, 2, 3]), slots=st.integers(40, 600),
       swap=st.booleans(), samples=st.sampled_from([1, 1, 2, 3]), prefix=st.booleans(), burst=st.booleans(),
       profile=st.sampled_from(["vllm-2023", "vllm-v1", "ideal"]))
def test_small_block_ticks_equal_per_sequence_steps(seed, block_size, slots, swap, samples, prefix, burst, profile):
    rng = np.random.default_rng(seed)
    num = 40
    prompts = rng.integers(1, 60, num)
    groups = rng.choice(["a", None], num)
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 0.5 if burst else 4, num)), prompts, rng.integers(1, 80, num),
                              n=rng.choice([1, samples], num), prefix_group=groups,
                              prefix_tokens=np.where(groups == None, 0, np.minimum(prompts, 5)))   # noqa: E711
    sched = {"preemption": "swap" if swap else "recompute"}
    if profile == "vllm-2023":
        sched["chunked_prefill"] = False
        # (on paged memory vllm-2023 runs vLLM 0.1.4's own policy, which has no lazy path: the engine's
        # own separate-prefill policy is what ticks here)
        profile = replace(get_profile("vllm-2023"), policy="kvsim")
    cfg = SimConfig(DEP, CacheConfig(block_size=block_size, num_blocks=max(slots // block_size, 80 // block_size),
                                     swap_gib=0.05 if swap else 0, prefix_caching=prefix),
                    SchedulerConfig(**sched), engine_profile=profile)
    _side_by_side(trace, cfg)


def test_ticks_of_one_slot_blocks_by_hand():
    """Blocks of one slot: every ticking sequence takes a block at every tick. Sequences 1, 2, 3 (2, 1
    and 1 tokens, in blocks [0, 1], [2], [3]) tick in that order over 6 blocks: tick 0 gives them 4, 5
    and finds none for 3: left half done; freeing 2 (blocks 2 and 5, last first) lets it go on: 3 takes
    5 (the first released). Freeing 1 (blocks 1, 4, 0 ... released behind) then 3 ticks alone."""
    a = PagedAllocator(num_blocks=6, block_size=1)
    a.allocate(1, 2, 10)
    a.allocate(2, 1, 10)
    a.allocate(3, 1, 10)
    for s in (1, 2, 3):
        a.tick_join(s)
    assert a.tick() is False
    assert (a.block_table(1), a.block_table(2), a.block_table(3)) == ([0, 1, 4], [2, 5], [3])
    a.free(2)
    assert a.tick() is True
    assert (a.block_table(1), a.block_table(3)) == ([0, 1, 4], [3, 5])
    s = a.stats()
    assert (s.token_states, s.used_blocks, s.free_blocks, s.reserved) == (5, 5, 1, 0)   # (all held slots written)
    a.free(1)
    assert a.tick() is True and a.tick() is True
    assert a.block_table(3) == [3, 5, 2, 4]         # released: 2, then 1's 4, 1, 0 (last block first)
    a.check_invariants()


def test_a_tick_left_half_done_skips_the_sequences_freed_meanwhile():
    """Blocks of one slot, sequences 1..4 ticking, 2 free blocks: 1 and 2 take them; freeing 4 (the
    back of the batch, as preemption picks) and 3 gives blocks 6, then 7 and 5... in release order;
    the tick completes without them (they are stale)."""
    a = PagedAllocator(num_blocks=8, block_size=1)
    for s in (1, 2, 3, 4):
        a.allocate(s, 1, 10)
        a.tick_join(s)
    a.allocate(5, 2, 2)                   # blocks 4, 5: not ticking
    assert a.tick() is False              # 1 -> 6, 2 -> 7; 3 finds none
    assert (a.block_table(1), a.block_table(2)) == ([0, 6], [1, 7])
    a.free(5)                             # 5, 4 released
    assert a.tick() is True               # 3 -> 5, 4 -> 4
    assert (a.block_table(3), a.block_table(4)) == ([2, 5], [3, 4])
    assert a.tick() is False              # nothing free: 1 finds none
    a.free(4)                             # 4 and 3 released (last first): 1 -> 4, 2 -> 3
    a.free(3)                             # 5 and 2 released; 3 is stale now
    assert a.tick() is True
    assert (a.block_table(1), a.block_table(2)) == ([0, 6, 4], [1, 7, 3])
    assert a.num_tokens(1) == 3 and a.stats().free_blocks == 2
    a.check_invariants()


def test_a_decode_block_of_one_slot_is_registered_in_the_prefix_cache_on_both_paths():
    """Blocks of one slot with prefix caching: the block a decode takes is full at once, so it is
    registered like the prompt's (the per-sequence `append_each` missed it: 2 cached blocks after the
    free instead of 3, where the lazy tick registered all 3)."""
    for lazy in (False, True):
        a = PagedAllocator(num_blocks=8, block_size=1, prefix_caching=True)
        a.allocate(1, 2, 10)
        if lazy:
            a.tick_join(1)
            assert a.tick() is True
        else:
            assert a.append_each([1]) == 1
        assert a.num_tokens(1) == 3 and a.block_table(1) == [0, 1, 2]
        a.free(1)
        assert a.stats().cached_blocks == 3, f"lazy={lazy}"
        a.check_invariants()
