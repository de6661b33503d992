"""Prefix caching in PagedAllocator: chained hashes, whole-block hits capped at floor((P-1)/bs),
evictable cached blocks counted free, LRU eviction order."""

import subprocess
import sys

import numpy as np
import pytest

from kvsim.alloc import PagedAllocator, chain_hashes
from kvsim.alloc.paged.prefix import PrefixCache


def test_chain_hashes_are_chained_and_deterministic_across_processes():
    h = chain_hashes([1, 2, 3])
    assert h[:2] == chain_hashes([1, 2])
    assert chain_hashes([2]) != h[1:2]                 # same block id, different parent
    assert chain_hashes([1, 2]) != chain_hashes([2, 1])
    assert all(0 <= x < 2 ** 64 for x in h)
    other = subprocess.run([sys.executable, "-c", "from kvsim.alloc import chain_hashes;"
                            "print(chain_hashes([1, 2, 3]))"], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(h)


def test_whole_block_hits_share_blocks():
    a = PagedAllocator(num_blocks=12, block_size=16, prefix_caching=True)
    assert a.allocate(1, 40, 50, block_hashes=[7, 8]) == 0
    assert a.allocate(2, 40, 50, block_hashes=[7, 8]) == 32
    assert a.block_table(2)[:2] == a.block_table(1)[:2] and a.block_table(2)[2] != a.block_table(1)[2]
    s = a.stats()
    assert (s.used_blocks, s.unshared_blocks, s.token_states) == (4, 6, 32 + 8 + 8)
    assert a.allocate(3, 40, 50, block_hashes=[7, 9]) == 16      # diverges at the second block
    assert a.allocate(4, 40, 50, block_hashes=[6, 8]) == 0       # chained: a different first block
    a.check_invariants()


def test_hits_are_capped_so_the_last_prompt_token_is_computed():
    a = PagedAllocator(num_blocks=8, block_size=16, prefix_caching=True)
    a.allocate(1, 40, 50, block_hashes=[7, 8])
    assert a.allocate(2, 32, 40, block_hashes=[7, 8]) == 16      # floor(31 / 16) = 1 block
    assert a.allocate(3, 33, 40, block_hashes=[7, 8]) == 32      # floor(32 / 16) = 2 blocks
    a.check_invariants()


def test_blocks_filled_by_append_are_registered():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(1, 3, 10, block_hashes=[5, 6])    # block 0 not yet full, so not cached
    a.append(1)                                   # fills block 0 -> registered
    assert a.allocate(2, 5, 10, block_hashes=[5, 6]) == 4   # its block 1 is partial: not cached
    assert a.block_table(2)[0] == a.block_table(1)[0]
    a.append(1, 4)                                # fills block 1 -> registered
    assert a.allocate(3, 9, 10, block_hashes=[5, 6]) == 8
    assert a.block_table(3)[:2] == a.block_table(1)[:2]
    a.check_invariants()


def test_freed_cached_blocks_are_free_but_reusable():
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 9, 9, block_hashes=[1, 2])     # blocks 0, 1 cached; block 2 partial
    a.free(1)
    s = a.stats()
    assert (s.free, s.free_blocks, s.cached_blocks, s.used_blocks) == (16, 4, 2, 0)
    assert a.num_free_blocks == 4 and a.can_allocate(16, 16)
    assert a.allocate(2, 9, 9, block_hashes=[1, 2]) == 8
    assert a.block_table(2)[:2] == [0, 1] and a.stats().cached_blocks == 0
    a.check_invariants()


def test_eviction_is_least_recently_freed_first_tail_blocks_before_head():
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 8, 8, block_hashes=[1, 2])     # blocks 0, 1
    a.allocate(2, 8, 8, block_hashes=[3, 4])     # blocks 2, 3
    a.free(1)                                     # evictable order: 1, 0 (tail first)
    a.free(2)                                     # then 3, 2
    a.allocate(3, 4, 4)                           # evicts block 1 (prefix [1, 2]'s tail)
    assert a.block_table(3) == [1]
    a.allocate(4, 4, 4)                           # evicts block 0
    assert a.block_table(4) == [0]
    assert a.stats().cached_blocks == 2
    assert a.allocate(5, 5, 5, block_hashes=[3, 4]) == 4          # block 2 survived; evicts block 3
    assert a.block_table(5) == [2, 3] and a.stats().cached_blocks == 0
    a.free(3)
    a.free(4)
    assert a.allocate(6, 5, 5, block_hashes=[1, 2]) == 0          # prefix [1, 2] was evicted
    a.check_invariants()


def test_plain_free_blocks_are_used_before_evicting():
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 4, 4, block_hashes=[1])
    a.free(1)
    a.allocate(2, 12, 12)
    assert a.block_table(2) == [1, 2, 3] and a.stats().cached_blocks == 1
    a.check_invariants()


def test_one_allocation_takes_never_used_then_plain_free_then_evicted_blocks():
    a = PagedAllocator(num_blocks=5, block_size=4, prefix_caching=True)
    a.allocate(1, 8, 8, block_hashes=[1, 2])     # blocks 0, 1, both full: cached
    a.allocate(2, 3, 3)                           # block 2, partly filled: never cached
    a.free(1)                                     # evictable order: 1, 0 (tail first)
    a.free(2)                                     # block 2: plain free
    a.allocate(3, 20, 20)                         # 5 blocks: never used 3, 4; plain free 2; evicted 1, 0
    assert a.block_table(3) == [3, 4, 2, 1, 0]
    assert a.stats().cached_blocks == 0 and a.num_free_blocks == 0
    a.free(3)
    assert a.cached_tokens(9, block_hashes=[1, 2]) == 0       # prefix [1, 2] went with blocks 0, 1
    a.check_invariants()


def test_duplicate_content_is_cached_beside_the_first_block():
    """As vLLM's block pool: a block recomputed next to a cached one with the same hash (hits stop one
    block short of the end) is cached too, and serves hits after the first is evicted."""
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 4, 5, block_hashes=[1])        # a 4-token prompt computes its only block: block 0
    a.allocate(2, 4, 5, block_hashes=[1])        # cap floor(3 / 4) = 0: computed again in block 1
    a.free(1)                                     # evictable order: 0, then 1
    a.free(2)
    assert a.stats().cached_blocks == 2
    a.allocate(3, 12, 12)                         # never used blocks 2, 3, then evicts block 0
    assert a.block_table(3) == [2, 3, 0]
    a.free(3)
    assert a.allocate(4, 5, 5, block_hashes=[1]) == 4 and a.block_table(4)[0] == 1
    a.check_invariants()


def test_admission_counts_hits_on_blocks_in_use_as_free():
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 10, 10, block_hashes=[1, 2])    # 3 blocks, 1 free
    assert a.can_allocate(9, 9, [1, 2], seq_id=2)  # 3 blocks, 2 of them hits held by seq 1
    assert a.cached_tokens(9, [1, 2], seq_id=2) == 8
    assert not a.can_allocate(9, 9, [1, 3], seq_id=2)
    assert a.allocate(2, 9, 9, [1, 2]) == 8 and a.num_free_blocks == 0
    a.check_invariants()


def test_evictable_hits_take_free_blocks():
    a = PagedAllocator(num_blocks=3, block_size=4, prefix_caching=True)
    a.allocate(1, 8, 8, block_hashes=[1, 2])      # blocks 0, 1 (both full, cached)
    a.allocate(9, 2, 2)                           # block 2
    a.free(1)                                     # 2 free blocks, both evictable hits for [1, 2]
    assert a.cached_tokens(9, [1, 2], seq_id=2) == 8
    assert not a.can_allocate(9, 9, [1, 2], seq_id=2)   # 1 new + 2 evictable hits > 2 free
    assert a.can_allocate(8, 8, [1, 2], seq_id=2)       # 1 hit (cap floor(7/4)) + 1 new = 2
    a.check_invariants()


def test_generated_blocks_are_hashed_so_a_recomputed_sequence_hits_its_own_output():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(1, 5, 20, block_hashes=[7])        # prompt: block 0 (shareable) + 1 token of block 1
    a.append(1, 3)                                # generated tokens fill block 1: cached as seq 1's own
    a.free(1)                                     # preempted
    assert a.cached_tokens(9, [7], seq_id=2) == 4          # another sequence shares only the prompt
    assert a.allocate(1, 9, 20, block_hashes=[7]) == 8     # recompute: its prompt and its own output
    a.check_invariants()


def test_unshared_prompt_blocks_are_cached_for_their_own_sequence():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(3, 9, 12)                          # no shareable ids: blocks 0, 1 are seq 3's own
    a.free(3)
    assert a.cached_tokens(9, seq_id=4) == 0
    assert a.admission(9, 12, (), 4) == (True, 0) and a.admission(9, 12, (), 3) == (True, 8)
    assert a.admission(4, 12, (), 3) == (True, 0)          # one block: its last token is computed
    assert a.allocate(5, 9, 12, hold_tokens=5) == 0 and a.num_tokens(5) == 5   # nothing to hit: 2 fresh
    assert a.block_table(5) == [3, 4]
    assert a.allocate(3, 9, 12) == 8 and a.block_table(3) == [0, 1, 5]    # its own 2 blocks + 1 fresh
    a.check_invariants()


def test_chunked_prefill_holds_only_its_first_chunk():
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(1, 8, 8, block_hashes=[1, 2])
    assert a.allocate(2, 20, 30, block_hashes=[1, 2], hold_tokens=9) == 8   # 2 hits + 1 new block
    assert len(a.block_table(2)) == 3 and a.num_tokens(2) == 9
    a.append(2, 11)
    assert len(a.block_table(2)) == 5 and a.block_table(2)[:2] == a.block_table(1)
    a.check_invariants()


def test_hashes_ignored_without_prefix_caching():
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 9, 9, block_hashes=[1, 2])
    assert a.allocate(2, 9, 9, block_hashes=[1, 2]) == 0
    assert a.stats().unshared_blocks == a.stats().used_blocks == 6


def test_both_hash_mixers_are_splitmix64():
    """SplitMix64 seeded with 0 (Steele, Lea and Flood 2014; Vigna's splitmix64.c) outputs the finaliser
    of k x 0x9E3779B97F4A7C15 for k = 1, 2, 3, 4; its published first outputs are these four. The
    allocator's chained hashes use that finaliser on ints, the trace's block ids its low 63 bits."""
    from kvsim.trace import block_ids
    from kvsim.alloc.paged import prefix
    published = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    states = [k * 0x9E3779B97F4A7C15 % 2**64 for k in (1, 2, 3, 4)]
    assert [prefix._mix64(s) for s in states] == published
    assert block_ids._mix64(np.array(states, dtype=np.uint64)).tolist() == [p % 2**63 for p in published]


def _ticked(free: str, held: bool = False) -> PagedAllocator:
    """4-slot blocks: sequence 1 (5 tokens, one shareable block with content id 10) ticks 10 times to
    15 tokens in blocks [0, 1, 2, 3] (block 3 holds 3), then is freed by `free` or `free_finished`;
    `held`: its ticks stopped first, blocks kept (`tick_leave`: async scheduling holds it a step)."""
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(1, 5, 20, block_hashes=[10])
    a.tick_join(1)
    for _ in range(10):
        assert a.tick()
    assert a._seqs[1].table == [0, 1, 2, 3]     # (not `block_table`: reading brings it up to date)
    if held:
        a.tick_leave(1)
        assert a._seqs[1].at == -1 and a._seqs[1].tokens == 15
    getattr(a, free)(1)
    a.check_invariants()
    return a


@pytest.mark.parametrize("held", [False, True])
def test_a_finished_sequence_parks_its_own_blocks_nameless_in_the_same_order(held):
    a, b = _ticked("free", held), _ticked("free_finished", held)
    # tail first: the partly filled block 3 to the free list, blocks 2, 1, 0 evictable in that order
    for x in (a, b):
        assert x._cache.evictable_blocks() == [2, 1, 0] and list(x._free) == [3]
        assert x.stats() == a.stats() and x.stats().cached_blocks == 3
    h1 = a._cache.cached_hash(1)
    assert h1 == -1 - (1 << 32) - 1                    # sequence 1's own block 1 (`unique_hashes`)
    assert b._cache.cached_hash(1) is None and b._cache.cached_hash(2) is None   # nameless
    assert b._cache.cached_hash(0) == a._cache.cached_hash(0)                    # shareable: kept
    for x in (a, b):     # a new sequence hits block 0; takes never used 4..7, then free 3, then evicts 2
        assert x.allocate(2, 30, 30, block_hashes=[10]) == 4
        assert x.block_table(2) == [0, 4, 5, 6, 7, 3, 2, 1]
        x.check_invariants()


def test_cached_and_nameless_evictable_blocks_leave_in_the_order_they_were_parked():
    """Cached and nameless evictable blocks sit in two queues; the LRU order across them, worked by
    hand: park cached 0, nameless 2 and 3, cached 1, nameless 4, cached 1 again after a hit took it
    back (it moves to the newest end), cached 5."""
    cache = PrefixCache()
    for h, block in ((100, 0), (101, 1), (105, 5)):
        cache.register(h, block)
    assert cache.park(0) and not cache.park(2)         # (2 holds no hash: a plain free block)
    cache.park_nameless([2, 3])
    cache.park(1)
    cache.park_nameless([4])
    assert cache.evictable_blocks() == [0, 2, 3, 1, 4] and cache.num_evictable == 5
    cache.reuse(1)
    cache.park(1)
    cache.park(5)
    assert cache.evictable_blocks() == [0, 2, 3, 4, 1, 5]
    cache.check([0] * 6)
    evicted = cache.evict_many(2) + [cache.evict_lru() for _ in range(4)]
    assert evicted == [0, 2, 3, 4, 1, 5] and cache.num_evictable == 0
    assert not any(cache.holds(h) for h in (100, 101, 105))
    cache.park_nameless([7, 9])                         # nameless parked while no cached one is
    assert cache.evict_many(1) == [7]
    cache.register(108, 8)
    cache.park(8)
    assert cache.evictable_blocks() == [9, 8] and cache.evict_many(2) == [9, 8]


def test_free_finished_is_free_where_blocks_are_shared_or_a_cpu_tier_keeps_hashes():
    for kwargs, fork in (({}, True), ({"cpu_tier_blocks": 4}, False)):
        a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True, **kwargs)
        a.allocate(1, 9, 20, block_hashes=[10])
        if fork:
            a.fork(1, 2)                                 # blocks 0 and 1 shared (2: copied on the tick)
        a.tick_join(1)
        for _ in range(4):
            assert a.tick()
        a.free_finished(1)
        assert a._cache.cached_hash(1) is not None       # registered as `free` registers it
        a.check_invariants()


def test_own_blocks_are_named_when_freed_short_of_finishing_and_never_while_live():
    """4-slot blocks: sequence 1, 13 tokens, one shareable block (content id 10), holds blocks [0, 1,
    2, 3]. While it lives only block 0 is cached; its own full blocks 1, 2 are registered when it is
    preempted (`free`), under its salt: its re-admission hits 0, 1, 2 (12 tokens, at most (13 - 1) // 4
    blocks). A fork's preemption names its own blocks only (its parent's full blocks are the parent's)."""
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    a.allocate(1, 13, 13, block_hashes=[10])
    assert [a._cache.cached_hash(b) is not None for b in range(4)] == [True, False, False, False]
    a.free(1)                                           # preempted: tail first, 3 to the free list
    assert [a._cache.cached_hash(b) for b in (1, 2)] == [-1 - (1 << 32) - 1, -1 - (1 << 32) - 2]
    assert a._cache.evictable_blocks() == [2, 1, 0] and list(a._free) == [3]
    assert a.admission(13, 13, [10], 1) == (True, 12) and a.allocate(1, 13, 13, [10]) == 12
    assert a.block_table(1) == [0, 1, 2, 4]             # hits 0, 1, 2; never used block 4 for the rest
    a.check_invariants()
    a.fork(1, 2)                                        # sequence 2 shares 0, 1, 2 full and 4 (1 slot)
    a.append(2, 4)                                      # copy-on-write of block 4, then a block of its own
    assert a.block_table(2) == [0, 1, 2, 5, 6]
    a.free(2)                                           # its own full block 5 (index 3) named by its salt
    assert a._cache.cached_hash(5) == -1 - (2 << 32) - 3 and a._cache.cached_hash(4) is None
    assert [a._cache.cached_hash(b) for b in (0, 1, 2)] == [a._cache.cached_hash(0), -1 - (1 << 32) - 1,
                                                            -1 - (1 << 32) - 2]
    a.check_invariants()


def test_admission_is_can_allocate_and_cached_tokens_at_once():
    """4-slot blocks, 4 of them: sequence 1 (9 tokens, shareable blocks 10, 20) freed leaves blocks 0, 1
    cached. A 13-token sequence with the same two blocks hits both (8 tokens) and needs 2 more blocks of
    the 4 free (the 2 evictable hits count as taken): it fits; at 17 tokens it needs 5 - 2 + 2 = 5: no.
    Without a prefix cache: 3 blocks for 9 tokens fit, 0 cached."""
    a = PagedAllocator(num_blocks=4, block_size=4, prefix_caching=True)
    a.allocate(1, 9, 9, block_hashes=[10, 20])
    a.free(1)
    assert a.admission(13, 13, [10, 20], 2) == (True, 8) == (a.can_allocate(13, 13, [10, 20], 2),
                                                            a.cached_tokens(13, [10, 20], 2))
    assert a.admission(17, 17, [10, 20], 2) == (False, 8) == (a.can_allocate(17, 17, [10, 20], 2),
                                                             a.cached_tokens(17, [10, 20], 2))
    assert PagedAllocator(num_blocks=4, block_size=4).admission(9, 9) == (True, 0)


def test_free_finished_of_a_sequence_short_of_its_prompt_is_free():
    """4-slot blocks: sequence 1, a 13-token prompt with three shareable blocks (content ids 10, 11,
    12), given its first 5 slots (a prefill chunk: blocks [0, 1]), not ticking: its own blocks start
    past its table (`own` 3 > 1 full block), so `free_finished` frees as `free` does: block 1 (partly
    filled) to the free list once, block 0 (full, shareable: cached) evictable."""
    a = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    b = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    for x in (a, b):
        x.allocate(1, 13, 20, block_hashes=[10, 11, 12], hold_tokens=5)
        assert x._seqs[1].table == [0, 1] and x._seqs[1].at == -1 and x._seqs[1].own == 3
    a.free(1)
    b.free_finished(1)
    for x in (a, b):
        assert list(x._free) == [1] and x._cache.evictable_blocks() == [0]
        assert x.stats() == a.stats() and x.num_free_blocks == 8
        x.check_invariants()
