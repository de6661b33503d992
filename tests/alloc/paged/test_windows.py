"""Both allocators' fast-forward (`decode_window`, `append_steps`) and beam search's `refork`, worked by
hand on tiny pools: how many decode steps fit, the breakdown after each step, the blocks taken, what a
refork shares, copies and frees; and `make_allocator`'s defaults."""

import pytest

from kvsim.alloc import AllocationError, ContiguousAllocator, PagedAllocator, make_allocator


# ---- paged fast-forward ------------------------------------------------------------------------

def _paged_pair() -> PagedAllocator:
    """5 blocks of 4 slots. A (seq 1): 3 tokens in [0], final 9; B (seq 2): 4 tokens in [1], final 11.

    Decoding both, step s (0-based) grows each by a slot: B crosses a block boundary at steps 0, 4, 8,
    A at 1, 5; the 3 free blocks go to B (0), A (1), B (4), and step 5 finds none for A: 5 steps.
    A alone: blocks at steps 1, 5, final 9 - 3 = 6 steps. B alone: final 11 - 4 = 7 steps."""
    a = PagedAllocator(num_blocks=5, block_size=4)
    a.allocate(1, 3, 9)
    a.allocate(2, 4, 11)
    return a


def test_paged_decode_window_by_hand():
    a = _paged_pair()
    assert a.decode_window([1, 2], 100) == 5
    assert a.decode_window([1, 2], 4) == 4
    assert a.decode_window([1], 100) == 6 and a.decode_window([2], 100) == 7
    assert a.decode_window([1], 8) == 6 and a.decode_window([1, 2], 1) == 1
    assert a.decode_window([], 7) == 7
    assert a.decode_window([1, 2], 0) == 0 and a.decode_window([], -3) == 0
    a.append(1, 6)                            # A at its final 9: no step left for it
    assert a.decode_window([1, 2], 100) == 0 and a.decode_window([2], 3) == 3


def test_paged_decode_window_is_zero_when_the_first_step_needs_a_block_and_none_is_free():
    a = PagedAllocator(num_blocks=1, block_size=4)
    a.allocate(1, 4, 10)                      # its only block is full
    assert a.decode_window([1], 1) == 0 and a.decode_window([1], 5) == 0


def test_paged_can_append_one_slot_into_the_last_free_slot_of_a_full_pool():
    a = PagedAllocator(num_blocks=1, block_size=4)
    a.allocate(1, 3, 10)                      # one slot left in its only block, no free block
    assert a.can_append(1) and not a.can_append(1, 2)


def test_paged_append_steps_breakdown_after_each_step():
    a = _paged_pair()
    # (token_states, reserved, internal, free slots, used, free blocks, unshared) after steps 0..4:
    # 0: A 4 [0], B 5 [1, 2]: 9 written, reach 4 + 8 = 12, 2 blocks free
    # 1: A 5 [0, 3], B 6: 11 written, reach 8 + 8 = 16, 1 free;  2, 3: 13, 15 written
    # 4: A 8, B 9 [1, 2, 4]: 17 written, reach 8 + min(11, 12) = 19, 20 - 19 = 1 never filled
    rows = [(s.token_states, s.reserved, s.internal_fragmentation, s.free, s.used_blocks, s.free_blocks,
             s.unshared_blocks, s.external_fragmentation)
            for s in a.append_steps([1, 2], 5, head_tokens=50, head_final_tokens=60)]
    assert rows == [(9, 3, 0, 8, 3, 2, 3, 0), (11, 5, 0, 4, 4, 1, 4, 0), (13, 3, 0, 4, 4, 1, 4, 0),
                    (15, 1, 0, 4, 4, 1, 4, 0), (17, 2, 1, 0, 5, 0, 5, 0)]
    assert (a.block_table(1), a.block_table(2), a.num_tokens(1), a.num_tokens(2)) == ([0, 3], [1, 2, 4], 8, 9)
    a.check_invariants()


def test_paged_decode_window_is_zero_while_a_partial_block_is_shared():
    a = _paged_pair()
    a.fork(1, 3)                              # shares A's partly filled block 0
    assert a.decode_window([2], 5) == 0
    a.append(3)                               # copy-on-write: nothing partly filled is shared now
    assert a.decode_window([2], 5) == 5


def test_paged_append_steps_register_the_blocks_they_fill_in_the_prefix_cache():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(2, 3, 12, block_hashes=[7, 8])
    assert a.decode_window([2], 5) == 0       # its shareable block 0 is not full yet
    a.free(2)                                 # block 0 back on the free list; fresh blocks go first
    a.allocate(1, 4, 12, block_hashes=[7])    # block 1, full and cached
    assert a.decode_window([1], 100) == 8     # final 12 - 4; 7 free blocks are plenty
    a.append_steps([1], 5)                    # 9 tokens: block 2 filled (its own content), block 3 begun
    assert a.block_table(1) == [1, 2, 3]
    a.free(1)
    # a sequence recomputed under the same id finds both full blocks; another id only the shared one
    assert a.cached_tokens(9, [7], seq_id=1) == 8 and a.cached_tokens(9, [7], seq_id=3) == 4
    a.check_invariants()


def test_a_sequences_own_blocks_are_found_only_under_its_own_id():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(4, 9, 9)                       # no shareable prefix: blocks 0, 1 full, cached by id 4
    a.free(4)
    assert a.cached_tokens(9, (), seq_id=4) == 8
    assert [a.cached_tokens(9, (), seq_id=s) for s in range(16) if s != 4] == [0] * 15
    assert a.can_allocate(9, 9, (), seq_id=8) and a.allocate(8, 9, 9) == 0


# ---- contiguous fast-forward -------------------------------------------------------------------

def _contiguous_pair() -> ContiguousAllocator:
    """100 slots, oracle reservations, first fit: seq 1 = 10 of 15 at [0, 15), seq 2 = 5 of 8 at
    [15, 23); [23, 100) free (77 slots). Steps until one reaches its final: 15 - 10 = 5, 8 - 5 = 3."""
    a = ContiguousAllocator(100, 100, reserve="oracle", placement="first-fit")
    a.allocate(1, 10, 15)
    a.allocate(2, 5, 8)
    return a


def test_contiguous_decode_window_by_hand():
    a = _contiguous_pair()
    assert a.decode_window([1, 2], 10) == 3 and a.decode_window([1], 10) == 5
    assert a.decode_window([1, 2], 2) == 2 and a.decode_window([], 4) == 4
    assert a.decode_window([1, 2], -1) == 0


def test_contiguous_append_steps_breakdown_after_each_step():
    a = _contiguous_pair()
    # each step writes 2 slots: 17, 19, 21 written; still to fill (15 - t1) + (8 - t2): 6, 4, 2.
    # A head request of 80 slots fits in no free extent (77): all 77 free slots are stranded.
    rows = [(s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation, s.free,
             s.used_blocks, s.free_blocks, s.unshared_blocks)
            for s in a.append_steps([1, 2], 3, head_tokens=80, head_final_tokens=80)]
    assert rows == [(17, 6, 0, 77, 0, 23, 77, 23), (19, 4, 0, 77, 0, 23, 77, 23), (21, 2, 0, 77, 0, 23, 77, 23)]
    assert (a.num_tokens(1), a.num_tokens(2)) == (13, 8)
    s = a.stats(head_tokens=70, head_final_tokens=70)      # fits in the 77: nothing stranded
    assert (s.token_states, s.reserved, s.external_fragmentation, s.free) == (21, 2, 0, 77)
    a.check_invariants()


# ---- refork ------------------------------------------------------------------------------------

def test_contiguous_refork_copies_into_the_childs_own_reservation():
    a = ContiguousAllocator(100, 100, reserve="oracle", placement="first-fit")
    a.allocate(1, 10, 20)                     # [0, 20)
    a.allocate(2, 5, 25)                      # [20, 45)
    a.append(1, 3)                            # parent: 13 written, final 20
    assert a.refork(1, 2) == 13
    assert a.num_tokens(2) == 13 and a._pool.extents() == [(45, 55)]      # nothing moved
    # 26 written; finals 20 + 20 -> 14 to fill; reservations 20 + 25 -> 5 never filled; 55 free
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation, s.free) == (26, 14, 5, 0, 55)
    a.allocate(3, 5, 15)                      # [45, 60)
    with pytest.raises(AllocationError, match=r"^sequence 3: its reservation of 15 slots cannot hold a copy "
                                              r"of sequence 1 \(final 20\)$"):
        a.refork(1, 3)
    assert a.num_tokens(3) == 5
    assert a.refork(3, 2) == 5                # back down: seq 2 = 5 of final 15 in its 25
    # 13 + 5 + 5 = 23 written; finals 20 + 15 + 15 = 50 -> 27 to fill; reservations 60 -> 10 never
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (23, 27, 10, 40)
    a.allocate(4, 1, 20)                      # reservation 20: exactly the parent's final
    assert a.refork(1, 4) == 13 and a.num_tokens(4) == 13
    for call in (lambda: a.refork(9, 2), lambda: a.refork(1, 9)):
        with pytest.raises(AllocationError, match="^unknown sequence id 9$"):
            call()
    a.check_invariants()


def test_contiguous_refork_is_bounded_by_the_reservation_not_the_buddy_block():
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="buddy")
    a.allocate(1, 10, 14)                     # 14 reserved in a 16-slot block
    a.allocate(2, 5, 12)                      # 12 reserved in a 16-slot block: 4 slots of padding
    with pytest.raises(AllocationError, match=r"^sequence 2: its reservation of 12 slots cannot hold a copy "
                                              r"of sequence 1 \(final 14\)$"):
        a.refork(1, 2)


def test_paged_refork_frees_the_childs_blocks_and_shares_the_parents():
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 6, 12)                      # [0, 1]
    a.allocate(2, 9, 12)                      # [2, 3, 4]
    with pytest.raises(AllocationError, match="^unknown sequence id 9$"):
        a.refork(9, 2)
    assert a.block_table(2) == [2, 3, 4]      # a refused refork leaves the child alone
    assert a.refork(1, 2) == 0
    assert a.block_table(2) == [0, 1] and a.num_free_blocks == 6
    # shared blocks once: 6 written, reach min(12, 8) = 8 -> 2 to fill; 2 used, 4 in the tables
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.used_blocks, s.unshared_blocks) == (6, 2, 0, 2, 4)
    assert a.append(2) == [(1, 5)]            # copy-on-write into fresh block 5 (2, 3, 4 were released)
    with pytest.raises(AllocationError, match="^unknown sequence id 9$"):
        a.refork(1, 9)
    a.check_invariants()


# ---- make_allocator ----------------------------------------------------------------------------

def test_make_allocator_defaults_and_prefix_caching():
    paged = make_allocator("paged", 170)      # 16-slot blocks: 10 of them, 10 slots unused
    assert (paged.num_blocks, paged.block_size, paged.capacity_tokens, paged.can_tick) == (10, 16, 160, True)
    cached = make_allocator("paged", 160, block_size=8, prefix_caching=True)
    assert (cached.num_blocks, cached.can_tick) == (20, True)    # ticks evict LRU cached blocks (issue 19)
    contiguous = make_allocator("contiguous", 5000)
    assert (contiguous.max_seq_len, contiguous.reserve, contiguous.placement) == (2048, "max", "buddy")


# ---- paged appends -----------------------------------------------------------------------------

def test_paged_append_past_the_final_length_inside_the_last_block():
    a = PagedAllocator(num_blocks=4, block_size=8)
    a.allocate(1, 3, 4)                       # [0]: 3 written, final 4
    a.allocate(2, 3, 10)                      # [1]
    a.append(1, 2)                            # 5 written: past its final 4, which becomes 5
    # written 5 + 3 = 8; reach min(5, 8) + min(10, 8) = 13 -> 5 to fill; 16 - 13 = 3 never filled
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (8, 5, 3)
    a.append(1)
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (9, 5, 2)
    a.check_invariants()


def test_paged_append_of_several_slots_into_a_shared_partial_block_counts_the_copy():
    a = PagedAllocator(num_blocks=3, block_size=4)
    a.allocate(1, 6, 12)                      # [0, 1], block 1 half full
    a.fork(1, 2)                              # 1 free block
    # 4 more slots for seq 2: 10 tokens = 3 blocks, one new, plus a private copy of block 1: 2 blocks
    assert not a.can_append(2, 4) and a.can_append(2, 2)
    with pytest.raises(AllocationError, match="^sequence 2: 2 blocks needed, 1 free$"):
        a.append(2, 4)
    assert a.append(2, 2) == [(1, 2)]         # 8 tokens: the copy fills block 2, no new block
    a.check_invariants()
