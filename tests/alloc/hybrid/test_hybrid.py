"""The hybrid allocator (kvsim/alloc/hybrid/) on small pools worked by hand: blocks per group after a prefill
and after each decode step for full + sliding window, full + chunked local and full + Mamba groups, the
admission gate and its per-request cap, the memory breakdown, frees, and what it refuses.

Block size 2 throughout. vLLM 0.33's rules (kvsim/alloc/hybrid/groups.py cites them): after C computed
tokens a sliding window W skips max(0, C - W + 1) tokens, a chunked group C // chunk x chunk; whole skipped
blocks are freed when the sequence next grows; a Mamba group holds one block per sequence.
"""

import pytest

from kvsim.alloc import make_allocator
from kvsim.alloc.hybrid import NULL_BLOCK, GroupSpec, HybridAllocator

FULL, MAMBA = GroupSpec("full"), GroupSpec("mamba")


def make(groups, num_blocks=20, in_flight=8, chunk=8):
    return HybridAllocator(num_blocks, 2, groups, max_model_len=64, max_in_flight_tokens=in_flight,
                           prefill_chunk_tokens=chunk)


def held(a, seq):
    """Pool blocks seq holds per group (null entries are not blocks)."""
    return [sum(b != NULL_BLOCK for b in t) for t in a.group_block_tables(seq)]


def decode_blocks(groups, prompt, steps):
    """Blocks per group after the prefill and after each of `steps` one-token decode steps."""
    a = make(groups)
    a.allocate(0, prompt, prompt + steps)
    out = [held(a, 0)]
    for _ in range(steps):
        assert a.append_each([0]) == 1
        a.check_invariants()
        out.append(held(a, 0))
    return a, out


def test_sliding_window_of_4_frees_the_blocks_that_leave_it():
    # prompt 5 = tokens 0..4 in 3 blocks per group. Step k computes token 4 + k with 4 + k computed:
    # skipped 5-3=2 (1 block), 3 (1), 4 (2), 5 (2) tokens; entries cdiv(5 + k, 2) = 3, 4, 4, 5
    a, out = decode_blocks([FULL, GroupSpec("sliding", window=4)], prompt=5, steps=4)
    assert out == [[3, 3], [3, 2], [4, 3], [4, 2], [5, 3]]
    tables = a.group_block_tables(0)
    assert tables[1][:2] == [NULL_BLOCK, NULL_BLOCK] and len(tables[1]) == len(tables[0]) == 5
    a.free(0)
    a.check_invariants()
    assert a.num_free_blocks == 20


def test_chunked_local_frees_past_chunks():
    # chunk 4: skipped 4 tokens (2 blocks) once 4..7 tokens are computed, 8 (4 blocks) from 8 on
    _, out = decode_blocks([FULL, GroupSpec("chunked", chunk=4)], prompt=5, steps=4)
    assert out == [[3, 3], [3, 1], [4, 2], [4, 2], [5, 1]]


def test_mamba_holds_one_state_block_per_request():
    a, out = decode_blocks([FULL, MAMBA], prompt=5, steps=4)
    assert out == [[3, 1], [3, 1], [4, 1], [4, 1], [5, 1]]
    assert a.stats().used_blocks == 6 and a.num_free_blocks == 14


def test_memory_breakdown_per_group_and_in_total():
    # prompt 5, final 9, two decode steps: 7 tokens. Full: 4 blocks, 7 written, will reach 8 -> 1 reserved.
    # Sliding: 4 entries, the first null: 3 blocks = 6 slots, 5 written (tokens 2..6), 1 reserved.
    a = make([FULL, GroupSpec("sliding", window=4)])
    a.allocate(0, 5, 9)
    a.append(0)
    a.append(0)
    full, swa = a.group_stats()
    assert (full.capacity_tokens, full.token_states, full.reserved, full.internal_fragmentation) == (8, 7, 1, 0)
    assert (swa.capacity_tokens, swa.token_states, swa.reserved, swa.internal_fragmentation) == (6, 5, 1, 0)
    s = a.stats()
    assert (s.capacity_tokens, s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation,
            s.free, s.used_blocks, s.free_blocks) == (40, 12, 2, 0, 0, 26, 7, 13)


def test_internal_fragmentation_when_the_sequence_ends_inside_a_block_and_mamba_is_all_state():
    # prompt 3, final 3 (one output token): block 2 of the full group holds 1 written slot, never 2
    a = make([FULL, MAMBA])
    a.allocate(0, 3, 3)
    full, mamba = a.group_stats()
    assert (full.token_states, full.reserved, full.internal_fragmentation) == (3, 0, 1)
    assert (mamba.capacity_tokens, mamba.token_states, mamba.reserved, mamba.internal_fragmentation) == (2, 2, 0, 0)


def test_admission_refused_when_the_pool_is_short_and_a_decode_waits_for_a_block():
    a = make([FULL, GroupSpec("sliding", window=4)], num_blocks=6)
    assert a.can_allocate(4, 4)
    a.allocate(0, 4, 6)                # 2 + 2 blocks, 2 free
    assert not a.can_allocate(4, 4)    # 4 needed
    assert a.can_allocate(2, 2)        # 1 + 1
    a.allocate(1, 2, 2)                # 0 free
    # token 4 of sequence 0 needs a third block in each group; its window has freed nothing yet
    # (skipped 4 - 3 = 1 token: no whole block)
    assert not a.can_append(0) and a.append_each([1, 0]) == 0
    a.free(1)
    assert a.can_append(0) and a.append_each([0]) == 1 and held(a, 0) == [3, 3]
    a.free(0)
    a.check_invariants()
    assert a.num_free_blocks == 6


def test_the_sliding_groups_admission_cap():
    # 30 tokens, 8 in flight: the gate counts full 15 + sliding min(15, cdiv(4 - 1 + 8, 2) + 1 = 7) = 22
    # blocks; the first 8-token chunk takes 4 + 4
    assert make([FULL, GroupSpec("sliding", window=4)], num_blocks=22).can_allocate(30, 40)
    assert not make([FULL, GroupSpec("sliding", window=4)], num_blocks=21).can_allocate(30, 40)
    # the step's own blocks must fit too (`can_hold`): the first 8-token chunk 4 + 4; a whole prompt at
    # once (no chunked prefill) 15 + 15
    a = make([FULL, GroupSpec("sliding", window=4)], num_blocks=29)
    assert a.can_allocate(30, 40) and a.can_hold(8, 30) and not a.can_hold(30, 30)
    assert make([FULL, GroupSpec("sliding", window=4)], num_blocks=30).can_hold(30, 30)
    # chunked 4: min(15, cdiv(4 + 8, 2) = 6)
    assert make([FULL, GroupSpec("chunked", chunk=4)], num_blocks=21).can_allocate(30, 40)
    assert not make([FULL, GroupSpec("chunked", chunk=4)], num_blocks=20).can_allocate(30, 40)


def test_chunked_prefill_frees_the_window_between_chunks():
    a = make([FULL, GroupSpec("sliding", window=4)], num_blocks=30)
    a.allocate(0, 30, 30, hold_tokens=8)
    assert held(a, 0) == [4, 4]
    a.append(0, 8)          # 8 computed: skipped 5 tokens (2 blocks); 16 tokens in 8 entries
    assert held(a, 0) == [8, 6]
    a.append(0, 8)          # 16 computed: skipped 13 tokens (6 blocks); 12 entries
    assert held(a, 0) == [12, 6]
    a.check_invariants()


def test_block_ids_come_from_one_pool_last_freed_first():
    a = make([FULL, GroupSpec("sliding", window=4)], num_blocks=10)
    a.allocate(0, 4, 8)                       # full [0, 1], sliding [2, 3]
    assert a.group_block_tables(0) == [[0, 1], [2, 3]]
    a.append(0)                               # skipped 1 token: nothing freed; takes 4 and 5
    assert a.group_block_tables(0) == [[0, 1, 4], [2, 3, 5]]
    a.append(0)                               # 2 skipped: block 2 freed; 6 tokens still fit 3 entries
    assert a.group_block_tables(0) == [[0, 1, 4], [NULL_BLOCK, 3, 5]]
    a.append(0)                               # 7 tokens: a 4th entry each, block 2 (freed last) then 6
    assert a.group_block_tables(0) == [[0, 1, 4, 2], [NULL_BLOCK, 3, 5, 6]]
    assert a.block_table(0) == [0, 1, 4, 2]


def test_make_allocator_builds_it_and_the_others_are_unchanged():
    a = make_allocator("hybrid", 40, block_size=2, max_seq_len=64, groups=[FULL, MAMBA], max_in_flight_tokens=8)
    assert isinstance(a, HybridAllocator) and a.num_blocks == 20 and a.capacity_tokens == 40
    with pytest.raises(ValueError, match="needs its KV cache groups"):
        make_allocator("hybrid", 40, block_size=2)
    assert type(make_allocator("paged", 40, block_size=2)).__name__ == "PagedAllocator"


def test_what_it_refuses():
    with pytest.raises(ValueError, match="kind 'linear' unknown"):
        GroupSpec("linear")
    with pytest.raises(ValueError, match="window >= 1"):
        GroupSpec("sliding")
    with pytest.raises(ValueError, match="chunk >= 1"):
        GroupSpec("chunked", chunk=0)
    with pytest.raises(ValueError, match="sliding only"):
        GroupSpec("full", window=4)
    with pytest.raises(ValueError, match="non-empty sequence of GroupSpec"):
        HybridAllocator(10, 2, [], 64, 8)
    a = make([FULL, MAMBA])
    with pytest.raises(ValueError, match="one sequence per request, got 2"):
        a.peak_slots(4, 8, 2)
    a.allocate(0, 4, 8)
    assert not a.can_fork(0)
    with pytest.raises(ValueError, match="does not fork"):
        a.fork(0, 1)
    assert a.cached_tokens(4) == 0


def test_peak_slots_sums_each_groups_peak():
    # prompt 5, final 9: full 5 blocks; sliding at most min(5, max(cap 7, first chunk 3)) = 5; Mamba 1
    a = make([FULL, GroupSpec("sliding", window=4), MAMBA])
    assert a.peak_slots(5, 9) == 2 * (5 + 5 + 1)
    # final 40: the sliding group is capped at 7 blocks
    assert a.peak_slots(5, 40) == 2 * (20 + 7 + 1)


def test_prefix_hit_across_a_full_and_a_sliding_group_by_hand():
    """10 blocks. Sequence 0: prompt of 4 full blocks (content a b c d): full [0 1 2 3], sliding [4 5 6 7],
    all cached; freed, they stay cached, evictable tail first (3 2 1 0 7 6 5 4). Sequence 1: the same 4
    blocks + 2 tokens: full attention hits all 4 (at most (10 - 1) // 2 blocks); the window of token 8
    needs cdiv(4 - 1, 2) = 2 blocks, the last two: [-, -, 6, 7]. 8 tokens served; new blocks 8 and 9;
    blocks 4 and 5 stay free and cached."""
    a = HybridAllocator(10, 2, [FULL, GroupSpec("sliding", window=4)], 64, 8, 8, prefix_caching=True,
                        retention_interval=None)     # dense: every full sliding block cached
    content = [11, 12, 13, 14]
    assert a.allocate(0, 8, 8, content) == 0
    assert a.group_block_tables(0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    a.free(0)
    assert a.num_free_blocks == 10 and a.stats().cached_blocks == 8
    assert a.cached_tokens(10, content + [15], 1) == 8 and a.can_allocate(10, 12, content, 1)
    assert a.allocate(1, 10, 12, content) == 8
    assert a.group_block_tables(1) == [[0, 1, 2, 3, 8], [NULL_BLOCK, NULL_BLOCK, 6, 7, 9]]
    s = a.stats()
    assert (s.used_blocks, s.free_blocks, s.cached_blocks) == (8, 2, 2) and a._cache.evictable_blocks() == [5, 4]
    # a third sequence with the same prompt shares the 4 full blocks and sliding blocks 6, 7
    assert a.allocate(2, 10, 12, content) == 8 and a.stats().used_blocks == 10    # evicts 5, then 4
    assert a.group_block_tables(2) == [[0, 1, 2, 3, 5], [NULL_BLOCK, NULL_BLOCK, 6, 7, 4]]
    full, swa = a.group_stats()
    assert (full.used_blocks, full.unshared_blocks, swa.used_blocks, swa.unshared_blocks) == (6, 10, 4, 6)
    a.check_invariants()
    for seq in (1, 2):
        a.free(seq)
    a.check_invariants()
    assert a.num_free_blocks == 10


def test_twin_groups_diverging_under_prefix_caching_are_summed_not_multiplied():
    """Two full-attention groups, block size 1, 7 blocks, prefix caching. Seq 1 registers hash 0 in both
    groups (blocks 2 and 3), is freed; seq 2's growth and seq 3 reuse blocks 0-2, so group 0's cached
    copy (block 2) is evicted while group 1's (block 3) stays; seq 3 registers hash 0 again (group 0:
    block 1). Seq 4 (2 tokens, hash 0) hits in both: group 0 shares block 1 with seq 3, group 1 takes
    block 3. Held: group 0 = 1 distinct block, group 1 = 2 (blocks 2, 3), so the kind's record holds 3
    blocks, not twice group 0's 1 (found by the stateful test)."""
    from kvsim.alloc.hybrid import GroupSpec, HybridAllocator

    full = GroupSpec(kind="full", window=0, chunk=0)
    a = HybridAllocator(7, 1, [full, full], max_model_len=10_000, max_in_flight_tokens=64,
                        prefill_chunk_tokens=64, prefix_caching=True)
    a.record_groups = True
    a.allocate(0, 1, 1, [], hold_tokens=1)
    a.free(0)
    a.allocate(1, 1, 1, [0], hold_tokens=1)
    a.free(1)
    a.allocate(2, 1, 1, [], hold_tokens=1)
    assert a.append_each([2]) == 1
    a.free(2)
    a.allocate(3, 1, 1, [0], hold_tokens=1)
    assert a.allocate(4, 2, 2, [0], hold_tokens=1) == 1
    assert a.group_block_tables(4) == [[1], [3]] and a.group_block_tables(3) == [[1], [2]]
    record = a.stats()
    assert record.group0_blocks == 3
    a.check_invariants()


def test_mamba_with_prefix_caching_runs_vllms_align_mode():
    """vLLM 0.33's "align" mode (kvsim/alloc/hybrid/mamba.py), worked by hand at block 2: a 6-token prompt
    takes 3 full blocks and ONE Mamba state block at entry 2 (nulls before it); the 7th token crosses a
    block boundary: a new state block beside the old one; the 8th frees the old one (C - 1 = 6 tokens
    skipped: 3 whole blocks)."""
    a = HybridAllocator(10, 2, [FULL, MAMBA], 64, 8, prefix_caching=True)
    a.allocate(0, 6, 9)
    assert a.group_block_tables(0) == [[0, 1, 2], [-1, -1, 3]]
    a.append(0)
    assert a.group_block_tables(0) == [[0, 1, 2, 4], [-1, -1, 3, 5]]
    a.check_invariants()
    a.append(0)
    assert a.group_block_tables(0) == [[0, 1, 2, 4], [-1, -1, -1, 5]]
    assert [g.used_blocks for g in a.group_stats()] == [4, 1]
    a.check_invariants()
    # a chunk stops at the last block boundary before the prompt's last token, and at a junction
    assert a.clip_chunk(None, 0, 8, 9, 9, 8) == 8 and a.clip_chunk(None, 0, 9, 10, 10, 8) == 8
    assert a.clip_chunk(None, 0, 7, 20, 20, 8) == 6       # (a chunk short of the prompt ends on a block)
    a.free(0)
    a.check_invariants()
