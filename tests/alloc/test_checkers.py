"""Fault injection for the allocators' checkers: each test builds a small valid state by hand, corrupts
one field the way a bug would, and expects `check_invariants` / `FirstFit.check` / `Buddy.check` /
`PrefixCache.check` to name that fault (the whole message, so a checker that trips on the wrong
invariant fails the test too). The valid states checked alongside are boundary cases (extents ending at
the capacity, blocks filling their arena, a pool used to its last block) that a too strict checker
would reject."""

import re

import pytest

from kvsim.alloc import ContiguousAllocator, MemoryStats, PagedAllocator
from kvsim.alloc.contiguous.placement import Buddy, FirstFit


def _raises(check, message: str) -> None:
    """`check()` raises AssertionError whose whole message is `message` (a regex)."""
    with pytest.raises(AssertionError) as info:
        check()
    assert re.fullmatch(message, str(info.value)), str(info.value)


# ---- FirstFit ----------------------------------------------------------------------------------

def test_first_fit_check_accepts_boundary_states():
    FirstFit(10).check(10)                 # one extent [0, 10): starts at 0, ends at the capacity
    pool = FirstFit(0)                     # an empty pool has no extent at all
    assert (pool.extents(), pool.free_slots, pool.fits(1), pool.place(1)) == ([], 0, False, None)
    pool.check(0)
    pool = FirstFit(100)
    assert pool.place(99) == (0, 99)       # leaves a 1-slot extent at 99, ending at the capacity
    assert pool.extents() == [(99, 1)]
    pool.check(100)


def _first_fit_two_extents() -> FirstFit:
    """FirstFit(100) with [0, 30) and [60, 100) free: three 30-slot extents placed at 0, 30, 60 (10 free
    at 90); the one at 0 freed, then the one at 60 (merged with the 10 after it); 30 at 30 stays."""
    pool = FirstFit(100)
    for _ in range(3):
        pool.place(30)
    pool.release(0, 30)
    pool.release(60, 30)
    assert pool.extents() == [(0, 30), (60, 40)] and pool.free_slots == 70
    pool.check(100)
    return pool


@pytest.mark.parametrize("corrupt, message", [
    (lambda p: p._starts.reverse(), "free-extent index out of order"),
    (lambda p: p._length.__setitem__(90, 5), "free-extent index out of order"),           # 3 lengths, 2 starts
    (lambda p: p._length.__setitem__(0, 60), "free extents at 0 and 60 overlap or were not coalesced"),
    (lambda p: p._length.__setitem__(0, 61), "free extents at 0 and 60 overlap or were not coalesced"),
    (lambda p: p._length.__setitem__(60, 41), "bad free extent"),                          # ends at 101
    (lambda p: p._length.__setitem__(0, 0), "bad free extent"),                            # empty extent
    (lambda p: (p._starts.__setitem__(0, -5), p._length.__setitem__(-5, p._length.pop(0))), "bad free extent"),
    (lambda p: setattr(p, "free_slots", 71), "free-slot counter drifted"),
])
def test_first_fit_check_names_each_corruption(corrupt, message):
    pool = _first_fit_two_extents()
    corrupt(pool)
    _raises(lambda: pool.check(100), message)


# ---- Buddy -------------------------------------------------------------------------------------

def test_buddy_check_accepts_boundary_states():
    Buddy(100).check(100)                  # arenas 64 + 32 + 4, each one free block filling it
    pool = Buddy(64)
    assert pool.place(32) == (0, 32)       # free: the upper half, 32 at 32 (an odd multiple of 32)
    pool.check(64)
    pool = Buddy(64)
    assert pool.place(16) == (0, 16)       # free: 16 at 16 and 32 at 32, adjacent
    assert pool.extents() == [(16, 16), (32, 32)]
    pool.check(64)


def _emptied(capacity: int) -> Buddy:
    pool = Buddy(capacity)
    for starts in pool._free:
        starts.clear()
    return pool


def _buddy_misaligned():
    pool = _emptied(64)
    pool._free[3].add(36)                  # 8 slots at 36: inside [0, 64), but 36 is not a multiple of 8
    pool.free_slots = 8
    return pool


def _buddy_straddling():
    pool = _emptied(100)
    pool._free[3].add(96)                  # 8 slots at 96: the last arena is [96, 100)
    pool.free_slots = 8
    return pool


def _buddy_outside():
    pool = _emptied(100)
    pool._free[0].add(100)                 # past the pool: in no arena
    pool.free_slots = 1
    return pool


def _buddy_unmerged():
    pool = _emptied(128)                   # one arena of 128, free as two 64-slot buddies
    pool._free[6].update((0, 64))
    pool.free_slots = 128
    return pool


def _buddy_arena_sized_with_its_xor_buddy():
    # Buddy(96): arenas [0, 64) and [64, 96). A 64-block at 0 fills its arena (its xor partner 64 is no
    # buddy); 64 slots at 64 straddle the 32-slot arena. The only fault is the straddle.
    pool = _emptied(96)
    pool._free[6].update((0, 64))
    pool.free_slots = 128
    return pool


def _buddy_overlapping():
    pool = _emptied(64)
    pool._free[5].add(0)                   # 32 at 0 and 16 at 16: each aligned, not buddies, overlapping
    pool._free[4].add(16)
    pool.free_slots = 48
    return pool


def _buddy_drifted():
    pool = Buddy(100)
    pool.free_slots = 99
    return pool


@pytest.mark.parametrize("make, capacity, message", [
    (_buddy_misaligned, 64, "free block 36 not aligned to 8"),
    (_buddy_straddling, 100, r"free block 96\+8 straddles an arena"),
    (_buddy_outside, 100, r"free block 100\+1 straddles an arena"),
    (_buddy_unmerged, 128, "free buddies at (0|64) were not merged"),
    (_buddy_arena_sized_with_its_xor_buddy, 96, r"free block 64\+64 straddles an arena"),
    (_buddy_overlapping, 64, "free blocks at 0 and 16 overlap"),
    (_buddy_drifted, 100, "free-slot counter drifted"),
])
def test_buddy_check_names_each_corruption(make, capacity, message):
    pool = make()
    _raises(lambda: pool.check(capacity), message)


# ---- ContiguousAllocator -----------------------------------------------------------------------

def _contiguous() -> ContiguousAllocator:
    """100 slots, oracle reservations, first fit: seq 1 holds [0, 20) full (tokens = final = reserved
    = placed = 20), seq 2 holds [20, 50) with 5 of 30 written; [50, 100) is free."""
    a = ContiguousAllocator(100, 100, reserve="oracle", placement="first-fit")
    a.allocate(1, 20, 20)
    a.allocate(2, 5, 30)
    assert a._pool.extents() == [(50, 50)]
    a.check_invariants()
    return a


@pytest.mark.parametrize("corrupt, message", [
    (lambda a: a._extent.__setitem__(1, (1, 20, 20)), r"ranges overlap or leave a hole at address 0 \(next starts at 1\)"),
    (lambda a: a._extent.__setitem__(2, (19, 30, 30)), r"ranges overlap or leave a hole at address 20 \(next starts at 19\)"),
    (lambda a: setattr(a, "capacity_tokens", 101), "ranges end at 100, capacity is 101"),
    (lambda a: a._tokens.__setitem__(1, 21), "seq 1: tokens 21, final 20, reserved 20, placed 20"),
    (lambda a: a._final.__setitem__(1, 21), "seq 1: tokens 20, final 21, reserved 20, placed 20"),
    (lambda a: a._extent.__setitem__(1, (0, 21, 20)), "seq 1: tokens 20, final 20, reserved 21, placed 20"),
    (lambda a: setattr(a, "_sum_tokens", 26), "token counter drifted"),
    (lambda a: setattr(a, "_sum_final", 49), "final counter drifted"),
    (lambda a: setattr(a, "_sum_reservation", 51), "reservation counter drifted"),
    (lambda a: setattr(a, "_sum_placed", 49), "placed counter drifted"),
])
def test_contiguous_check_invariants_names_each_corruption(corrupt, message):
    a = _contiguous()
    corrupt(a)
    _raises(a.check_invariants, message)


def test_contiguous_check_invariants_accepts_padding_unreachable_slots_and_an_empty_pool():
    a = ContiguousAllocator(64, 64, reserve="pow2", placement="buddy")
    a.allocate(1, 10, 20)                  # 10 + 16 = 26 reserved, placed in a 32-slot block
    # 10 written, 10 to fill, 26 - 20 = 6 never filled, 32 - 26 = 6 padding, 32 free
    assert tuple(a.stats())[:6] == (64, 10, 10, 6, 6, 32)
    a.check_invariants()
    a.free(1)
    a.check_invariants()


def test_contiguous_check_invariants_recounts_the_categories():
    a = _contiguous()
    # the true breakdown: 25 written, 25 still to fill (seq 2's 30 - 5), no fragmentation, 50 free
    assert tuple(a.stats())[:6] == (100, 25, 25, 0, 0, 50)
    a.stats = lambda *args: MemoryStats(100, 25, 25, 0, 1, 50, 50, 50, 50)     # one slot too many
    _raises(a.check_invariants, r"categories do not sum to capacity: MemoryStats\(.*\)")


# ---- PagedAllocator ----------------------------------------------------------------------------

def _paged() -> PagedAllocator:
    """8 blocks of 4 slots: seq 1 = 6 tokens in [0, 1] (final 10), seq 2 its fork (sharing both blocks,
    block 1 partly filled), seq 3 = 4 tokens in [2]; seq 4 took block 3 and was freed (free list [3]).
    High-water mark 4; blocks 4..7 never used."""
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 6, 10)
    a.fork(1, 2)
    a.allocate(3, 4, 4)
    a.allocate(4, 2, 2)
    a.free(4)
    assert (a.block_table(2), a.block_table(3), list(a._free), a._top) == ([0, 1], [2], [3], 4)
    a.check_invariants()
    return a


def _ticking(a: PagedAllocator) -> PagedAllocator:
    a.allocate(5, 3, 8)                    # [4]: 3 tokens, due at clock 1
    a.allocate(6, 7, 8)                    # [5, 6]: 7 tokens, due at clock 1 too
    a.tick_join(5)
    a.tick_join(6)
    assert [s.key for s in a._due[1]] == [0, 1]
    a.check_invariants()
    return a


def _swap_tables(a: PagedAllocator) -> None:
    a.allocate(7, 8, 8)                    # two full blocks [4, 5], shared by its fork 8 in reverse
    a.fork(7, 8)
    a._seqs[8].table.reverse()


@pytest.mark.parametrize("corrupt, message", [
    (lambda a: setattr(a, "_ticking", 1), "ticking count drifted"),
    (lambda a: _ticking(a)._due.clear(), "tick lost"),
    (lambda a: setattr(_ticking(a)._seqs[5], "due", 5), "a ticking sequence's due tick drifted"),
    (lambda a: setattr(a._seqs[3], "due", 0), "a sequence not ticking is due"),
    (lambda a: _ticking(a)._due[1].reverse(), "ticking sequences filed out of order"),
    (lambda a: a._free.append(3), "a block appears twice in the free list"),
    (lambda a: a._ref.append(0), "high-water mark and reference counts disagree"),
    (lambda a: a._free.append(4), "a released block lies above the high-water mark"),
    (lambda a: setattr(a._seqs[3], "tokens", 5), "seq 3: 1 blocks for 5 tokens"),
    (lambda a: setattr(a._seqs[1], "final", 5), "seq 1: 6 tokens past its final 5"),
    (lambda a: a._ref.__setitem__(2, 2), "reference counts differ from the number of tables holding blocks"),
    (lambda a: a._free.append(2), "block sets overlap"),
    (lambda a: a._free.clear(), "a block is lost"),
    (_swap_tables, r"block (4|5) held at different \(index, fill\): \{\((0|1), 4\), \((0|1), 4\)\}"),
    (lambda a: setattr(a, "_sum_tokens", 17), "token counter drifted"),
    (lambda a: setattr(a, "_sum_blocks", 6), "block counter drifted"),
    (lambda a: setattr(a, "_sum_reach", 21), "reach counter drifted"),
    (lambda a: setattr(a, "_excess", 0), "shared full-block counter drifted"),
    (lambda a: setattr(a, "_shared_partial", 0), "shared partial-block counter drifted"),
])
def test_paged_check_invariants_names_each_corruption(corrupt, message):
    a = _paged()
    corrupt(a)
    _raises(a.check_invariants, message)


def test_paged_check_invariants_accepts_a_pool_used_to_its_last_block():
    a = PagedAllocator(num_blocks=3, block_size=4)
    a.allocate(1, 12, 12)
    assert a._top == a.num_blocks == 3 and a.num_free_blocks == 0
    a.check_invariants()


def test_paged_check_invariants_recounts_stats():
    a = _paged()
    # by hand: blocks 0, 1 (shared; 4 + 2 written, reached up to 4 + 4 by seq 1's final 10) and 2 (4 of
    # 4): 10 written, 2 still to fill, nothing unreachable; 5 free blocks = 20 slots
    true = a.stats()
    assert tuple(true)[:6] == (32, 10, 2, 0, 0, 20)
    a.stats = lambda *args: true._replace(token_states=11, reserved=1)
    _raises(a.check_invariants, r"stats MemoryStats\(.*\) disagree with a recount")
    a.stats = lambda *args: true._replace(free=21)
    _raises(a.check_invariants, "categories do not sum to capacity")


# ---- PrefixCache -------------------------------------------------------------------------------

def _cached() -> PagedAllocator:
    """4-slot blocks, prefix caching: a 9-token sequence with two shareable blocks fills [0, 1, 2];
    its full blocks 0 and 1 are cached, and freed they stay evictable; block 2 (1 token) goes to the
    free list."""
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 9, 9, block_hashes=[10, 20])
    a.free(1)
    assert a._cache.evictable_blocks() == [1, 0] and list(a._free) == [2]
    a.check_invariants()
    return a


def test_prefix_cache_check_names_each_corruption():
    a = _cached()
    cache = a._cache
    h0, h1 = cache.cached_hash(0), cache.cached_hash(1)
    cache._blocks_of[999] = {}
    _raises(a.check_invariants, "hash 0x3e7 maps to no block")
    del cache._blocks_of[999]
    cache._blocks_of[h0] = {0: None, 1: None}     # (one block holds h0: an int, a dict for two or more)
    _raises(a.check_invariants, f"hash map points {h0:#x} at block 1, which holds another")
    cache._blocks_of[h0] = {0: None}
    _raises(a.check_invariants, f"hash {h0:#x} maps to one block in a dict")
    cache._blocks_of[h0] = 0
    cache._hash_of[2] = h0
    _raises(a.check_invariants, "block -> hash and hash -> block maps disagree")
    del cache._hash_of[2]
    cache.park_nameless([2])                   # nameless evictable: allowed at count 0
    cache.check([0, 0, 0, 0])
    _raises(lambda: cache.check([0, 0, 1, 0]), "evictable block 2 has reference count 1")
    assert cache.evictable_blocks() == [1, 0, 2]
    cache._nameless.clear()
    _raises(lambda: cache.check([0, 0, 0, 0]), "evictable count drifted")
    cache.num_evictable -= 1
    cache._evictable[1] = 1                    # (says a nameless block was parked before it, not before 0)
    _raises(lambda: cache.check([0, 0, 0, 0]), "cached evictable blocks out of park order")
    cache._evictable[1] = 0
    _raises(lambda: cache.check([0, 1, 0, 0]), "evictable block 1 has reference count 1")
    del cache._evictable[0]
    cache.num_evictable -= 1
    _raises(lambda: cache.check([0, 0, 0, 0]), "cached free block 0 is not evictable")
    assert h1 is not None


def test_paged_check_invariants_rejects_a_partly_filled_cached_block():
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 6, 6, block_hashes=[10])   # block 0 full (cached), block 1 holds 2 tokens
    a.check_invariants()
    a._cache.register(12345, 1)
    _raises(a.check_invariants, "cached block 1 is not full")
