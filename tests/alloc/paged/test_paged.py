"""PagedAllocator: block-boundary growth, exact memory breakdown, fork sharing, copy-on-write, errors."""

import pytest

from kvsim.alloc import AllocationError, PagedAllocator


def test_new_block_exactly_at_block_boundary():
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 4, 20)
    assert a.block_table(1) == [0]
    a.append(1)                       # 5th token crosses into a second block
    assert a.block_table(1) == [0, 1]
    a.append(1, 3)                    # 8 tokens: still two blocks
    assert a.block_table(1) == [0, 1] and a.num_tokens(1) == 8
    a.append(1)
    assert a.block_table(1) == [0, 1, 2]
    assert a.num_free_blocks == 5
    a.check_invariants()


def test_request_peaks_at_ceil_prompt_plus_output_minus_one_blocks():
    prompt, outputs, bs = 10, 7, 4    # final = 16 slots = 4 blocks exactly
    a = PagedAllocator(num_blocks=8, block_size=bs)
    a.allocate(1, prompt, prompt + outputs - 1)
    for _ in range(outputs - 1):      # prefill emits the first token; M - 1 decode steps
        a.append(1)
    assert a.num_tokens(1) == 16 and len(a.block_table(1)) == 4
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (16, 0, 0)
    assert a.peak_slots(prompt, prompt + outputs - 1) == 16
    # 3 samples: the prompt's 2 full blocks once, then 2 blocks each (8 + 3 x 8 slots)
    assert a.peak_slots(prompt, prompt + outputs - 1, num_seqs=3) == 32


def test_stats_split_reserved_and_internal_fragmentation_of_last_block():
    a = PagedAllocator(num_blocks=10, block_size=16)
    a.allocate(1, 20, 30)             # 2 blocks = 32 slots: 20 written, 10 still to fill, 2 never
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation) == (20, 10, 2, 0)
    assert (s.free, s.used_blocks, s.free_blocks, s.unshared_blocks) == (8 * 16, 2, 8, 2)
    assert s.capacity_tokens == 160
    a.append(1, 10)                   # at its final length: nothing reserved
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (30, 0, 2)


def test_fork_shares_blocks_and_append_copies_shared_partial_block():
    a = PagedAllocator(num_blocks=6, block_size=4)
    a.allocate(1, 6, 12)              # blocks 0 (full) and 1 (2 of 4 written)
    a.fork(1, 2)
    assert a.block_table(2) == [0, 1] and a.num_free_blocks == 4
    s = a.stats()                     # shared blocks counted once
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (6, 2, 0)
    assert (s.used_blocks, s.unshared_blocks) == (2, 4)
    assert a.append(2) == [(1, 2)]    # copy-on-write: child moves to a private copy of block 1
    assert a.block_table(2) == [0, 2] and a.block_table(1) == [0, 1]
    assert a.append(1) == []          # block 1 is now the parent's alone: written in place
    s = a.stats()
    assert (s.token_states, s.reserved, s.used_blocks, s.unshared_blocks) == (4 + 3 + 3, 1 + 1, 3, 4)
    a.check_invariants()
    a.free(1)
    a.free(2)
    assert a.num_free_blocks == 6
    a.check_invariants()


def test_fork_with_full_last_block_needs_no_copy():
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 8, 12)
    a.fork(1, 2)
    s = a.stats()                     # two full shared blocks, counted once
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.used_blocks, s.unshared_blocks) == (8, 0, 0, 2, 4)
    assert a.append(2) == [] and a.block_table(2) == [0, 1, 2]
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (9, 3, 0, 4)
    a.check_invariants()


def test_can_append_counts_the_copy_on_write_block():
    a = PagedAllocator(num_blocks=2, block_size=4)
    a.allocate(1, 6, 8)
    a.fork(1, 2)
    assert a.num_free_blocks == 0
    assert not a.can_append(2)
    with pytest.raises(AllocationError, match="1 blocks needed, 0 free"):
        a.append(2)
    assert a.num_tokens(2) == 6       # a failed append changes nothing
    a.free(1)                         # block 1 unshared again: append in place
    assert a.can_append(2) and a.append(2) == []
    a.check_invariants()


def test_out_of_blocks_is_a_predicate_then_an_error():
    a = PagedAllocator(num_blocks=3, block_size=4)
    assert a.can_allocate(12, 12) and not a.can_allocate(13, 13)
    with pytest.raises(AllocationError, match="4 blocks needed, 3 free"):
        a.allocate(1, 13, 13)
    a.allocate(1, 12, 13)
    assert not a.can_append(1)
    with pytest.raises(AllocationError):
        a.append(1)
    a.check_invariants()


def test_free_returns_blocks_for_reuse():
    a = PagedAllocator(num_blocks=4, block_size=2)
    a.allocate(1, 4, 4)
    a.allocate(2, 4, 4)
    a.free(1)
    a.allocate(3, 3, 3)
    assert sorted(a.block_table(3)) == [0, 1]
    a.free(2)
    a.free(3)
    assert a.stats().free == 8
    a.check_invariants()


@pytest.mark.parametrize("call, match", [
    (lambda a: a.append(9), "unknown sequence id 9"),
    (lambda a: a.can_append(9), "unknown sequence id 9"),
    (lambda a: a.free(9), "unknown sequence id 9"),
    (lambda a: a.block_table(9), "unknown sequence id 9"),
    (lambda a: a.num_tokens(9), "unknown sequence id 9"),
    (lambda a: a.fork(9, 10), "unknown sequence id 9"),
    (lambda a: a.tick_join(9), "unknown sequence id 9"),
    (lambda a: a.allocate(2, 4, 4, hold_tokens=0), "sequence 2: hold_tokens 0 outside 1..4"),
    (lambda a: a.fork(1, 1), "sequence id 1 is already allocated"),
    (lambda a: a.allocate(1, 2, 2), "sequence id 1 is already allocated"),
    (lambda a: a.allocate(2, 0, 2), "num_tokens must be >= 1"),
    (lambda a: a.append(1, 0), "num_tokens must be >= 1"),
])
def test_misuse_raises_allocation_error(call, match):
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 3, 5)
    with pytest.raises(AllocationError, match=match):
        call(a)
    assert not a.can_fork(9) and a.can_fork(1)


def test_bad_config_raises_value_error():
    with pytest.raises(ValueError, match="block_size"):
        PagedAllocator(num_blocks=4, block_size=0)


def test_blocks_are_taken_fresh_in_id_order_then_released_oldest_first():
    # the order a free list over all blocks gives (take from the left, release to the right, a
    # sequence's blocks last-first): fresh ids first, then released blocks in release order
    a = PagedAllocator(num_blocks=6, block_size=2)
    a.allocate(1, 4, 4)                          # [0, 1]
    a.allocate(2, 2, 2)                          # [2]
    a.free(1)                                    # released: 1, 0
    a.allocate(3, 6, 6)                          # fresh 3, 4, 5
    assert a.block_table(3) == [3, 4, 5]
    a.free(2)                                    # released: 1, 0, 2
    a.allocate(4, 5, 5)
    assert a.block_table(4) == [1, 0, 2]
    a.check_invariants()


def test_memory_follows_blocks_used_not_capacity():
    import tracemalloc
    tracemalloc.start()
    a = PagedAllocator(num_blocks=10**12, block_size=16, prefix_caching=True)
    a.allocate(1, 100, 200, block_hashes=range(6))
    for _ in range(100):
        a.append(1)
    size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100_000, f"{peak} bytes for 13 blocks used of 10^12"
    assert a.block_table(1) == list(range(13))
    s = a.stats()
    assert (s.used_blocks, s.free_blocks, s.token_states) == (13, 10**12 - 13, 200)
    a.free(1)
    assert a.num_free_blocks == 10**12
    a.check_invariants()


def _shared_partial_pool() -> PagedAllocator:
    """4 blocks of 4. Seq 1: 6 tokens in blocks [0, 1] (block 1 half full), forked to seq 2, so block 1
    is a shared, partly filled block; seq 3: 4 tokens filling block 2. One block (3) is free."""
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 6, 10)
    a.fork(1, 2)
    a.allocate(3, 4, 8)
    return a


def test_append_each_with_a_shared_partial_block():
    """Seq 1's 7th token would land in shared block 1: it is copied to the free block 3 (pair (1, 3)) and
    seq 1 writes there; seq 2 is then block 1's only holder and writes in place; seq 3 needs a new
    block and none is left: 2 grew. From index 1 (seq 2 at index 0 skipped) the same 2 grow."""
    a = _shared_partial_pool()
    copies: list[tuple[int, int]] = []
    assert a.append_each([1, 2, 3], copies=copies) == 2
    assert copies == [(1, 3)]
    assert (a.block_table(1), a.block_table(2), a.block_table(3)) == ([0, 3], [0, 1], [2])
    assert (a.num_tokens(1), a.num_tokens(2), a.num_tokens(3)) == (7, 7, 4)
    b = _shared_partial_pool()
    assert b.append_each([2, 1, 2, 3], start=1, copies=[]) == 2
    assert (b.num_tokens(1), b.num_tokens(2), b.num_tokens(3)) == (7, 7, 4)
    c = _shared_partial_pool()         # without a copies list the copy still happens; all from index 1 grow
    assert c.append_each([3, 1, 2], start=1) == 2 and c.block_table(1) == [0, 3]
    a.check_invariants(); b.check_invariants(); c.check_invariants()


def test_append_each_takes_a_sequence_off_the_ticks():
    """Seq 1 (3 tokens, final 10) joins the ticks, then grows by `append_each` instead: it leaves the
    ticks, so the next tick writes nothing more for it (4 tokens, not 5)."""
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 3, 10)
    a.tick_join(1)
    assert a.append_each([1]) == 1 and a.num_tokens(1) == 4
    a.tick()
    assert a.num_tokens(1) == 4 and a.block_table(1) == [0]
    a.check_invariants()


def test_peak_slots_of_forked_sequences_in_whole_blocks():
    """Blocks of 16: two samples forked from 20 tokens, each ending at 50. The one full prompt block
    (16 slots) is shared; each sample holds ceil(50 / 16) = 4 blocks of its own view, 64 slots less the
    shared 16: 16 + 2 x 48 = 112. One sequence: 64."""
    a = PagedAllocator(num_blocks=64, block_size=16)
    assert a.peak_slots(20, 50, num_seqs=2) == 112
    assert a.peak_slots(20, 50) == 64


def test_no_cache_allocate_edges_by_hand():
    """Blocks of 4, no prefix cache. 6 tokens with a final length of 2 (less than written): the final
    length is the 6 written, so nothing is reserved and 2 slots of block 1 are internal fragmentation.
    12 tokens need 3 blocks: refused in a pool of 2. A chunked prefill holding 3 of 10 tokens takes one
    block (block 2, after seq 1's 0 and 1)."""
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 6, 2)
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (6, 0, 2, 8)
    a.check_invariants()
    with pytest.raises(AllocationError, match="^sequence 1: 3 blocks needed, 2 free$"):
        PagedAllocator(num_blocks=2, block_size=4).allocate(1, 12, 12)
    a.allocate(2, 10, 12, hold_tokens=3)      # a first chunk of 3 of 10 prompt tokens: one block now
    assert (a.num_tokens(2), a.block_table(2), a.num_free_blocks) == (3, [2], 1)
    a.check_invariants()


def test_a_freed_ticking_sequence_takes_no_block_at_its_old_tick():
    """Seq 1 (3 tokens, final 10) ticks from clock 0 and would take its next block at tick 1; it is
    freed after tick 0, so tick 1 finds its stale entry and takes nothing: all 4 blocks free."""
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 3, 10)
    a.tick_join(1)
    assert a.tick()
    a.free(1)
    assert a.tick() and a.num_free_blocks == 4
    a.check_invariants()


def test_append_each_stops_at_an_unknown_sequence():
    """Seqs 1 and 2 (3 tokens each, blocks of 4) grow to 4 before the unknown id 9 stops the call; the
    token count stays consistent."""
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 3, 3)
    a.allocate(2, 3, 3)
    with pytest.raises(AllocationError, match="^unknown sequence id 9$"):
        a.append_each([1, 2, 9])
    assert (a.num_tokens(1), a.num_tokens(2), a.stats().token_states) == (4, 4, 8)
    a.check_invariants()
