"""PagedAllocator's lazy decode ticks (`tick_join`, `tick`, `tick_window`, `tick_steps`), checked by hand
on pools of a few blocks: which tick takes which block, the memory breakdown after each tick, a tick
that runs out of blocks and resumes, stale sequences skipped, and the refusals; each with the snapshots of
`tick_steps` read as named tuples and as one numpy table (kvsim/alloc/paged/tick_runs.py)."""

import copy

import pytest

from kvsim.alloc import AllocationError, PagedAllocator
from kvsim.alloc.base import MemoryTable
from kvsim.alloc.paged.tick_runs import TickRun, runs_table


@pytest.fixture(autouse=True, params=["tuples", "table"])
def snapshots_as(request, monkeypatch):
    """Every test twice: `tick_steps`' snapshots (a `TickRun`) read as named tuples, then as the rows of
    the numpy table the step log makes of them (`runs_table`)."""
    if request.param == "table":
        monkeypatch.setattr(TickRun, "rows", lambda run: list(MemoryTable(runs_table([run]))))
    return request.param


def _two_ticking() -> PagedAllocator:
    """5 blocks of 4 slots. A (seq 1): 3 tokens in [0], final 9; B (seq 2): 4 tokens in [1] (full),
    final 11; both ticking, A first; 3 blocks free.

    By hand, tick t grows both by one slot: B (room 0) crosses into a new block at ticks 0, 4, 8, ...,
    A (room 1) at ticks 1, 5, 9, ... So tick 0 gives B block 2, tick 1 gives A block 3, tick 4 gives B
    block 4, and tick 5 finds no free block: 5 ticks fit."""
    a = PagedAllocator(num_blocks=5, block_size=4)
    a.allocate(1, 3, 9)
    a.allocate(2, 4, 11)
    a.tick_join(1)
    a.tick_join(2)
    return a


#: stats after ticks 0..4 of `_two_ticking`, as (token_states, reserved, internal_fragmentation, free,
#: used_blocks, free_blocks, unshared_blocks); capacity 20, no external fragmentation, nothing cached.
#: tick 0: A 4 [0], B 5 [1, 2]: 9 written; reach A min(9, 4) + B min(11, 8) = 12 -> 3 to fill; 2 free
#: tick 1: A 5 [0, 3], B 6: 11 written; reach 8 + 8 = 16 -> 5 to fill; 1 free block
#: tick 2, 3: 13 and 15 written, reach still 16 -> 3 and 1 to fill
#: tick 4: A 8, B 9 [1, 2, 4]: 17 written; reach 8 + min(11, 12) = 19 -> 2 to fill, 20 - 19 = 1 never filled
HAND = [(9, 3, 0, 8, 3, 2, 3), (11, 5, 0, 4, 4, 1, 4), (13, 3, 0, 4, 4, 1, 4), (15, 1, 0, 4, 4, 1, 4),
        (17, 2, 1, 0, 5, 0, 5)]


def _row(s):
    assert (s.capacity_tokens, s.external_fragmentation, s.cached_blocks) == (20, 0, 0)
    return (s.token_states, s.reserved, s.internal_fragmentation, s.free, s.used_blocks, s.free_blocks,
            s.unshared_blocks)


def test_tick_window_counts_the_ticks_the_free_blocks_last():
    a = _two_ticking()
    assert a.tick_window(100) == 5 and a.tick_window(3) == 3
    assert a.tick_window(0) == 0 and a.tick_window(-2) == 0
    b = PagedAllocator(num_blocks=6, block_size=4)     # one more free block: B at 0, 4 and A at 1, 5,
    b.allocate(1, 3, 30)                               # then B finds none at tick 8: 8 ticks
    b.allocate(2, 4, 30)
    b.tick_join(1)
    b.tick_join(2)
    assert b.tick_window(100) == 8
    c = PagedAllocator(num_blocks=5, block_size=4)     # no ticking sequence: no limit of its own
    assert c.tick_window(7) == 7


def test_tick_steps_take_blocks_in_tick_order_with_the_breakdown_after_each():
    a = _two_ticking()
    assert [_row(s) for s in a.tick_steps(5)] == HAND
    assert (a.block_table(1), a.block_table(2)) == ([0, 3], [1, 2, 4])
    assert (a.num_tokens(1), a.num_tokens(2)) == (8, 9)
    a.check_invariants()


def test_ticks_one_at_a_time_then_out_of_blocks_then_resumed():
    a = _two_ticking()
    rows = []
    for _ in range(5):
        assert a.tick() is True
        rows.append(_row(a.stats()))
    assert rows == HAND
    assert a.tick() is False                 # tick 5: A needs a block, none is free; nothing changes
    assert (a.num_tokens(1), a.block_table(1), a.stats().token_states) == (8, [0, 3], 17)
    with pytest.raises(AllocationError, match="^tick_steps ran out of free blocks$"):
        a.tick_steps(1)
    a.free(2)                                # B's blocks 1, 2, 4 released, last first: 4, 2, 1
    assert a.tick() is True                  # A goes on into block 4
    assert (a.block_table(1), a.num_tokens(1)) == ([0, 3, 4], 9)
    # A alone: 9 written, final 9 (nothing to fill), 12 - 9 = 3 never filled; blocks 2, 1 free
    assert _row(a.stats()) == (9, 0, 3, 8, 3, 2, 3)
    a.check_invariants()


def _three_due_at_once() -> PagedAllocator:
    """4 blocks of 2 slots: seqs 1, 2, 3 hold 2 tokens each in [0], [1], [2] (full), all ticking, all
    needing a block at tick 0; one block (3) free."""
    a = PagedAllocator(num_blocks=4, block_size=2)
    for seq in (1, 2, 3):
        a.allocate(seq, 2, 10)
        a.tick_join(seq)
    return a


def test_a_tick_stopped_halfway_resumes_and_skips_sequences_freed_meanwhile():
    a = _three_due_at_once()
    assert a.tick() is False                 # seq 1 took block 3; seq 2 found none
    assert a.block_table(1) == [0, 3] and a.block_table(2) == [1]
    assert a.num_tokens(1) == 2              # the tick is not over: nobody has grown yet
    a.free(3)                                # block 2 released
    assert a.tick() is True                  # seq 2 takes block 2; seq 3 is gone
    assert (a.block_table(1), a.block_table(2)) == ([0, 3], [1, 2])
    assert (a.num_tokens(1), a.num_tokens(2)) == (3, 3)
    # 6 written, each reaches min(10, 4) = 4 -> 2 to fill; all 4 blocks used
    assert _row_any(a.stats()) == (8, 6, 2, 0, 0, 4, 0, 4)
    a.check_invariants()


def test_a_tick_with_make_room_frees_until_a_block_is_free_and_goes_on():
    """The same tick with `make_room` freeing the last sequence each time it is called (the
    scheduler's preemption): seq 2 finds no block, seq 3 is freed (block 2), seq 2 takes it, seq 3's
    entry is stale; the result is the stop-and-resume above, in one call."""
    a = _three_due_at_once()
    victims = [3]
    assert a.tick(make_room=lambda: a.free(victims.pop())) is True
    assert victims == []
    assert (a.block_table(1), a.block_table(2)) == ([0, 3], [1, 2])
    assert (a.num_tokens(1), a.num_tokens(2)) == (3, 3)
    assert _row_any(a.stats()) == (8, 6, 2, 0, 0, 4, 0, 4)
    a.check_invariants()


def test_make_room_that_frees_the_sequence_short_of_a_block_skips_it():
    """4 blocks of 2: seqs 1, 2, 3 full and due, one block free. Seq 1 takes block 3; seq 2 finds none
    and `make_room` frees seq 2 itself (its block 1 released): it is skipped, and seq 3 takes block 1."""
    a = _three_due_at_once()
    assert a.tick(make_room=lambda: a.free(2)) is True
    assert (a.block_table(1), a.block_table(3)) == ([0, 3], [2, 1])
    assert (a.num_tokens(1), a.num_tokens(3)) == (3, 3)
    a.check_invariants()


def test_make_room_that_frees_a_forks_twin_lets_it_write_its_block_in_place():
    """2 blocks of 4: seq 1 holds 2 tokens in [0], seq 2 its fork (block 0 shared, partly filled), seq 3
    4 tokens in [1] (full); all three due at tick 0, no block free. Seq 1 must copy block 0 but finds
    no block: `make_room` frees seq 2 (block 0 is seq 1's alone now, nothing freed), then seq 3
    (block 1 free). Seq 1 then writes block 0 in place, as a fresh call would have found it: no copy,
    block 1 stays free."""
    a = PagedAllocator(num_blocks=2, block_size=4)
    a.allocate(1, 2, 10)
    a.fork(1, 2)
    a.allocate(3, 4, 10)
    for seq in (1, 2, 3):
        a.tick_join(seq)
    victims, copies = [3, 2], []
    assert a.tick(copies, make_room=lambda: a.free(victims.pop())) is True
    assert victims == [] and copies == []
    assert a.block_table(1) == [0] and a.num_tokens(1) == 3 and a.num_free_blocks == 1
    a.check_invariants()


def test_tick_steps_resume_a_stopped_tick_through_tick():
    a = _three_due_at_once()
    assert a.tick() is False
    with pytest.raises(AllocationError, match="^tick_steps ran out of free blocks$"):
        a.tick_steps(1)
    a.free(3)
    snapshots = a.tick_steps(2)              # finishes tick 0, then tick 1 (no crossing)
    assert [_row_any(s)[:4] for s in snapshots] == [(8, 6, 2, 0), (8, 8, 0, 0)]
    assert (a.num_tokens(1), a.num_tokens(2)) == (4, 4)
    a.check_invariants()


def _row_any(s):
    return (s.capacity_tokens, s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation,
            s.used_blocks, s.free, s.unshared_blocks)


def test_tick_steps_inline_path_out_of_blocks_raises():
    a = _three_due_at_once()
    with pytest.raises(AllocationError, match="^tick_steps ran out of free blocks$"):
        a.tick_steps(1)                      # (the caller must stay within tick_window: 0 here)


def test_a_sequence_grown_another_way_stops_ticking_and_its_old_tick_is_skipped():
    a = PagedAllocator(num_blocks=6, block_size=4)
    a.allocate(1, 4, 20)                     # [0], full: due at tick 0
    a.allocate(2, 2, 20)                     # [1]: due at tick 2
    a.tick_join(1)
    a.tick_join(2)
    assert a.tick() is True                  # tick 0: seq 1 takes block 2
    assert a.block_table(1) == [0, 2] and a.num_tokens(1) == 5 and a.num_tokens(2) == 3
    assert a.append(2, 3) == []              # seq 2 stops ticking at 3 tokens, grows to 6: block 3
    assert a.block_table(2) == [1, 3]
    # only seq 1 ticks now: 5 tokens in 8 slots, so it crosses at the 4th tick from now and every 4th
    # after; the 2 free blocks cover the 4th and the 8th, the 12th finds none: 11 ticks
    assert a.tick_window(100) == 11
    for _ in range(3):
        assert a.tick() is True              # tick 2 (seq 2's stale entry) takes nothing
    assert (a.block_table(1), a.block_table(2)) == ([0, 2], [1, 3])
    assert (a.num_tokens(1), a.num_tokens(2)) == (8, 6)
    assert a.stats().token_states == 14
    a.check_invariants()
    a.tick_join(2)                           # ticking again, after seq 1
    assert [_row_any(s)[1] for s in a.tick_steps(2)] == [16, 18]
    assert (a.block_table(1), a.block_table(2)) == ([0, 2, 4], [1, 3])
    a.check_invariants()


def test_tick_window_ignores_stale_entries():
    # 4-slot blocks: seq 1 (3 tokens) and seq 2 (3 tokens) both due at tick 1; seq 1 then grows by
    # `append` and stops ticking, leaving a stale entry at tick 1. 1 free block: only seq 2 takes it
    # at tick 1, and its next crossing is tick 5, so 5 ticks fit (a stale entry counted as a taker
    # would end the window at tick 1).
    a = PagedAllocator(num_blocks=3, block_size=4)
    a.allocate(1, 3, 30)
    a.allocate(2, 3, 30)
    a.tick_join(1)
    a.tick_join(2)
    a.append(1)                              # 4 tokens: still one block
    assert a.num_free_blocks == 1
    assert a.tick_window(100) == 5


def test_ticking_refusals_and_the_missing_tick_check():
    a = PagedAllocator(num_blocks=8, block_size=4)
    assert a.can_tick
    a.allocate(1, 6, 10)
    a.tick_join(1)
    with pytest.raises(AllocationError, match="^sequence 1 is already ticking$"):
        a.tick_join(1)
    a.allocate(2, 6, 10)
    a.fork(2, 3)                             # 3 shares 2's partly filled last block: it ticks, and its
    a.tick_join(3)                           # first tick copies the block (copy-on-write)
    assert a.tick_window(9) == 0             # a copy pending: no window past it (as decode_window)
    a.allocate(4, 8, 10)
    a.fork(4, 5)                             # shares two full blocks: ticking is fine
    a.tick_join(5)
    a._due.clear()                           # fault injection: the ticks lost their schedule
    a.free(3)
    with pytest.raises(AllocationError, match="^a ticking sequence is missing from its tick$"):
        a.tick_window(9)
    b = PagedAllocator(num_blocks=8, block_size=4, prefix_caching=True)
    assert b.can_tick
    b.allocate(1, 8, 10, block_hashes=[7, 8], hold_tokens=5)   # a chunk: shareable block 1 not yet filled
    with pytest.raises(AllocationError, match=r"^sequence 1 cannot tick \(shareable blocks unfilled\)$"):
        b.tick_join(1)


def _two_ticks(a: PagedAllocator, at_once: bool) -> list:
    """`stats()` after each of two ticks: one `tick_steps(2)` (within a 5-tick window) or two `tick`s."""
    if at_once:
        assert a.tick_window(5) == 5
        return list(a.tick_steps(2))
    mems = []
    for _ in range(2):
        assert a.tick()
        mems.append(a.stats())
    return mems


@pytest.mark.parametrize("at_once", [False, True])
def test_ticks_with_a_prefix_cache_evict_the_lru_block_and_register_what_they_fill(at_once):
    # 2 blocks of 4 slots. Seq 1 (4 tokens, one shareable block, content id 7) fills block 0, which
    # is cached and, once freed, evictable. Seq 2 (3 tokens, final 10) takes block 1 and ticks: due
    # at tick 4 - 3 = 1, where no block is fresh or plain free, so it evicts block 0 (the LRU one).
    # After tick 1 it holds 5 tokens: block 1 is full (its own, registered when it syncs), block 0
    # has 1. Freed, last block first: block 0 is partly filled, never cached -> plain free; block 1
    # is cached -> evictable.
    a = PagedAllocator(num_blocks=2, block_size=4, prefix_caching=True)
    a.allocate(1, 4, 4, block_hashes=[7])
    a.free(1)
    assert a._cache.evictable_blocks() == [0] and a.num_free_blocks == 2    # block 1 never used
    a.allocate(2, 3, 10)
    a.tick_join(2)
    mems = _two_ticks(a, at_once)
    # tick 0: 4 tokens in block 1, block 0 cached-free; tick 1: 5 tokens, blocks [1, 0], none free
    assert [(m.token_states, m.used_blocks, m.free_blocks, m.cached_blocks) for m in mems] == \
        [(4, 1, 1, 1), (5, 2, 0, 0)]
    assert a.block_table(2) == [1, 0] and a._cache.evictable_blocks() == []
    a.check_invariants()
    a.free(2)
    assert a._cache.evictable_blocks() == [1] and list(a._free) == [0]
    a.allocate(3, 2, 2)                          # a plain free block goes before the evictable one
    assert a.block_table(3) == [0] and a._cache.evictable_blocks() == [1]


@pytest.mark.parametrize("at_once", [False, True])
def test_sequences_crossing_at_one_tick_take_a_fresh_then_a_plain_free_then_an_evicted_block(at_once):
    # 6 blocks of 4 slots. Seq 1 (4 tokens, content id 7) fills block 0, cached; seq 9 (3 tokens)
    # block 1, never full so never cached. Freed: block 0 evictable, block 1 plain free. Seqs 2, 3, 4
    # (3 tokens, final 10) take the never used blocks 2, 3, 4 and tick, all due at tick 1, where they
    # take, in the order they joined, the last never used block 5, the plain free block 1, and block 0
    # evicted (as `_take` one at a time).
    a = PagedAllocator(num_blocks=6, block_size=4, prefix_caching=True)
    a.allocate(1, 4, 4, block_hashes=[7])
    a.allocate(9, 3, 3)
    a.free(1)
    a.free(9)
    for seq in (2, 3, 4):
        a.allocate(seq, 3, 10)
        a.tick_join(seq)
    mems = _two_ticks(a, at_once)                # (tick 1 takes 3 of 3 free blocks; the next is tick 5)
    # tick 0: 3 x 4 tokens in 3 blocks, free: block 5, block 1, block 0 (cached); tick 1: 15 tokens, 6 used
    assert [(m.token_states, m.used_blocks, m.free_blocks, m.cached_blocks) for m in mems] == \
        [(12, 3, 3, 1), (15, 6, 0, 0)]
    assert [a.block_table(s) for s in (2, 3, 4)] == [[2, 5], [3, 1], [4, 0]]
    assert a.cached_tokens(5, block_hashes=[7]) == 0       # content 7 was evicted with block 0
    a.check_invariants()


def test_check_invariants_ignores_a_stale_entry_filed_before_a_later_join():
    # 4-slot blocks: seq 1 (3 tokens, key 0) and seq 2 (3 tokens, key 1) are both filed at tick 1;
    # seq 1 grows by `append` to 4 and joins again (key 2, filed at tick 0). Tick 1's list still
    # holds seq 1 first: stale, so its key 2 before seq 2's 1 is no disorder.
    a = PagedAllocator(num_blocks=4, block_size=4)
    a.allocate(1, 3, 30)
    a.allocate(2, 3, 30)
    a.tick_join(1)
    a.tick_join(2)
    a.append(1)
    a.tick_join(1)
    assert [s.key for s in a._due[1]] == [2, 1] and [s.key for s in a._due[0]] == [2]
    a.check_invariants()
    # tick 0: seq 1 (4 tokens) takes block 2; tick 1: the stale seq 1 is passed over, seq 2 takes 3
    b = copy.deepcopy(a)
    assert a.tick() and a.tick()
    assert (a.block_table(1), a.block_table(2), a.num_tokens(1), a.num_tokens(2)) == ([0, 2], [1, 3], 6, 5)
    a.check_invariants()
    assert [s.token_states for s in b.tick_steps(2)] == [9, 11]
    assert (b.block_table(1), b.block_table(2)) == ([0, 2], [1, 3])
    b.check_invariants()


def _stale_then_real() -> PagedAllocator:
    """5 blocks of 4 slots. Seq 1 (3 tokens in [0]) joins, filed at tick 1; it grows by `append` to 5
    ([0, 1]) and joins again, filed at tick 8 - 5 = 3. Seq 2 (2 tokens in [2]) joins, filed at tick 2.
    Tick 1's entry for seq 1 is stale (seq 1 is ticking, but due at 3). 2 blocks free."""
    a = PagedAllocator(num_blocks=5, block_size=4)
    a.allocate(1, 3, 30)
    a.tick_join(1)
    a.append(1, 2)
    a.tick_join(1)
    a.allocate(2, 2, 30)
    a.tick_join(2)
    assert [s.key for s in a._due[1]] == [1] and a._due[1][0].at >= 0
    return a


def test_a_stale_entry_of_a_sequence_ticking_again_takes_nothing():
    # by hand: seq 2 crosses at tick 2 (block 3), seq 1 at tick 3 (block 4); seq 2's next crossing,
    # tick 6, finds no block: ticks 0..5 fit
    a = _stale_then_real()
    assert a.tick_window(100) == 6
    assert all(a.tick() for _ in range(4))
    assert (a.block_table(1), a.block_table(2)) == ([0, 1, 4], [2, 3])
    assert (a.num_tokens(1), a.num_tokens(2)) == (9, 6)
    b = _stale_then_real()
    assert [s.token_states for s in b.tick_steps(4)] == [9, 11, 13, 15]
    assert (b.block_table(1), b.block_table(2)) == ([0, 1, 4], [2, 3])
    b.check_invariants()


def test_tick_window_of_one_when_the_first_tick_has_no_block():
    a = _three_due_at_once()                 # 3 sequences need a block at tick 0, 1 is free
    assert a.tick_window(1) == 0


def test_ticks_take_fresh_blocks_before_released_ones_then_released_ones():
    # 3 blocks of 2 slots: X (seq 9) in [0], A (seq 1, 2 tokens, ticking) in [1]; X freed: block 0 is
    # released while block 2 is still fresh. A crosses at ticks 0 (fresh 2 first) and 2 (released 0).
    a = PagedAllocator(num_blocks=3, block_size=2)
    a.allocate(9, 2, 2)
    a.allocate(1, 2, 10)
    a.tick_join(1)
    a.free(9)
    assert a.tick() is True and a.block_table(1) == [1, 2]
    assert a.tick() is True and a.tick() is True and a.block_table(1) == [1, 2, 0]
    b = PagedAllocator(num_blocks=3, block_size=2)
    b.allocate(9, 2, 2)
    b.allocate(1, 2, 10)
    b.tick_join(1)
    b.free(9)
    # after ticks 0..2: 3, 4, 5 written; reach min(10, 4) = 4, 4, then 6 (block 0 taken at tick 2)
    snaps = b.tick_steps(3)
    assert [(s.token_states, s.reserved, s.used_blocks, s.free_blocks, s.free) for s in snaps] == \
        [(3, 1, 2, 1, 2), (4, 0, 2, 1, 2), (5, 1, 3, 0, 0)]
    assert b.block_table(1) == [1, 2, 0]
    b.check_invariants()


def test_tick_steps_count_shared_blocks_once():
    # 8 blocks of 4 slots. Seq 1: 8 tokens [0, 1] (final 8) forked to seq 2: two full blocks shared.
    # Seq 3: 3 tokens [2], final 12, ticking. After tick 0: 8 + 4 = 12 written (shared once); after
    # tick 1: 13, block 3 taken. Reach 8 + min(12, 4 then 8).
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 8, 8)
    a.fork(1, 2)
    a.allocate(3, 3, 12)
    a.tick_join(3)
    snaps = a.tick_steps(2)
    assert [(s.token_states, s.reserved, s.internal_fragmentation, s.used_blocks, s.unshared_blocks)
            for s in snaps] == [(12, 0, 0, 3, 5), (13, 3, 0, 4, 6)]
    a.check_invariants()


def test_tick_steps_with_a_partly_filled_block_shared_elsewhere():
    # Seq 1: 6 tokens [0, 1] (final 10) forked to seq 2: block 1 (2 of 4 written) shared. Seq 3: 3
    # tokens [2], final 12, ticking. Shared blocks once: written 4 + 2 + seq 3's; reach 8 + seq 3's.
    # tick 0: 6 + 4 = 10 written, reach 8 + 4 -> 2 to fill; tick 1: 11 written, block 3, reach 16 -> 5
    a = PagedAllocator(num_blocks=8, block_size=4)
    a.allocate(1, 6, 10)
    a.fork(1, 2)
    a.allocate(3, 3, 12)
    a.tick_join(3)
    assert a.tick_window(5) == 0             # a shared partly filled block: no window (as decode_window)
    snaps = a.tick_steps(2)                  # (the ticks one at a time)
    assert [(s.token_states, s.reserved, s.internal_fragmentation, s.used_blocks) for s in snaps] == \
        [(10, 2, 0, 3), (11, 5, 0, 4)]
    a.check_invariants()


def test_the_fast_forward_and_appends_stop_a_sequence_ticking_since_clock_0():
    a = PagedAllocator(num_blocks=5, block_size=4)
    a.allocate(1, 3, 9)
    a.tick_join(1)                           # at clock 0
    a.append_steps([1], 2)                   # 5 tokens; no longer ticking
    assert a.tick() is True
    assert a.num_tokens(1) == 5 and a.block_table(1) == [0, 1]
    a.check_invariants()
    b = PagedAllocator(num_blocks=5, block_size=4)
    b.allocate(1, 3, 9)
    b.tick_join(1)
    assert b.tick() and b.tick()             # 5 tokens in [0, 1]
    assert b.decode_window([1], 100) == 4    # its final 9 - 5: the ticks counted
    b.check_invariants()


def test_a_snapshot_table_reads_as_a_list_of_snapshots():
    import numpy as np

    from kvsim.alloc.base import MemoryStats, MemoryTable

    rows = [MemoryStats(20, 9, 3, 0, 0, 8, 3, 2, 3), MemoryStats(20, 11, 5, 0, 0, 4, 4, 1, 4)]
    table = MemoryTable(np.array(rows, np.int64))
    assert len(table) == 2 and table[1] == rows[1] and table[-1].unshared_blocks == 4
    assert table == rows and table[1:] == rows[1:] and list(table) == rows and table != rows[:1]


def test_runs_of_several_windows_make_one_table_of_their_snapshots_by_hand(snapshots_as):
    """Three windows' runs worked out tick by tick (columns: capacity, token_states, reserved, internal,
    external, free slots, used, free blocks, unshared, cached):
    A: 4-slot blocks, 10 blocks; 10 tokens + 2 a tick, reach 14, 4 blocks, 6 free, 2 cached; tick 0 takes
       1 block (reach + 4), tick 2 takes 2 (reach + 5), evicting 1 cached;
    B: 2-slot blocks, 4 blocks; 3 tokens, nothing ticking, reach 5, 3 blocks, 1 free;
    C: as B's pool but empty, 1 ticking; tick 0 takes 1 block (reach + 1) evicting the 1 cached."""
    a = TickRun(3, [(0, 1, 4, 0), (2, 2, 5, 1)], 40, 4, 10, 10, 2, 14, 4, 6, 2)
    b = TickRun(2, [], 8, 2, 4, 3, 0, 5, 3, 1, 0)
    c = TickRun(1, [(0, 1, 1, 1)], 8, 2, 4, 0, 1, 0, 0, 4, 1)
    hand = [(40, 12, 6, 2, 0, 20, 5, 5, 5, 2), (40, 14, 4, 2, 0, 20, 5, 5, 5, 2), (40, 16, 7, 5, 0, 12, 7, 3, 7, 1),
            (8, 3, 2, 1, 0, 2, 3, 1, 3, 0), (8, 3, 2, 1, 0, 2, 3, 1, 3, 0), (8, 1, 0, 1, 0, 6, 1, 3, 1, 0)]
    assert runs_table([a, b, c]).tolist() == [list(row) for row in hand]
    assert list(a) + list(b) + list(c) == hand and len(a) == 3 and a[2] == hand[2]


def test_joining_many_at_once_is_joining_each_in_order():
    """`tick_join_many([1, 2])` files A and B as `_two_ticking` joins them one by one (the same first
    ticks: B's block 2 at tick 0, A's block 3 at tick 1); a refused id stops it there, those before it
    joined and counted (check_invariants)."""
    a = PagedAllocator(num_blocks=5, block_size=4)
    a.allocate(1, 3, 9)
    a.allocate(2, 4, 11)
    a.tick_join_many([1, 2])
    b = _two_ticking()
    for x in (a, b):
        assert x.tick() and x.tick()
        assert (x.block_table(1), x.block_table(2)) == ([0, 3], [1, 2])
        x.check_invariants()
    c = PagedAllocator(num_blocks=5, block_size=4)
    c.allocate(1, 3, 9)
    c.allocate(2, 4, 11)
    c.tick_join(2)
    with pytest.raises(AllocationError, match="^sequence 2 is already ticking$"):
        c.tick_join_many([1, 2])
    c.check_invariants()
    assert c.tick() and c.block_table(2) == [1, 2]
