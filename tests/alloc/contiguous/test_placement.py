"""The contiguous allocator's placements at their edges, by hand: buddy block sizes for lengths next to
powers of two, which free blocks are too small for the head request, an exact first fit, and a first-fit
release past the last free extent."""

from kvsim.alloc import ContiguousAllocator
from kvsim.alloc.contiguous.placement import Buddy, FirstFit


def test_buddy_rounds_each_length_up_to_the_next_power_of_two():
    pool = Buddy(8)
    assert pool.place(3) == (0, 4)            # 3 -> 4: splits 8 into 4 + 4, keeps the lower
    assert pool.place(1) == (4, 1)            # 1 -> 1: splits the upper 4 into 2 + 1 + 1
    assert pool.place(2) == (6, 2)
    assert pool.extents() == [(5, 1)] and pool.free_slots == 1
    assert pool.fits(1) and not pool.fits(2)
    pool.check(8)


def test_buddy_fits_needs_a_whole_block_of_the_rounded_size():
    pool = Buddy(3)                           # arenas: 2 slots at 0, 1 slot at 2
    assert pool.fits(1) and pool.fits(2)
    assert not pool.fits(3)                   # 3 rounds up to 4: no such block
    assert Buddy(1).fits(1) and not Buddy(1).fits(2)
    assert Buddy(4).fits(4) and not Buddy(4).fits(5)


def test_buddy_free_blocks_too_small_for_the_head_request_are_stranded():
    a = ContiguousAllocator(16, max_seq_len=16, reserve="oracle", placement="buddy")
    a.allocate(1, 2, 2)                       # [0, 2): free blocks 2 at 2, 4 at 4, 8 at 8
    assert a._pool.extents() == [(2, 2), (4, 4), (8, 8)]
    # head of h slots needs a block of h rounded up; smaller free blocks are stranded
    for head, stranded in [(1, 0), (2, 0), (3, 2), (4, 2), (5, 6), (8, 6), (9, 14)]:
        s = a.stats(head_tokens=head, head_final_tokens=head)
        assert (s.external_fragmentation, s.free) == (stranded, 14 - stranded), head
    assert a.stats(head_tokens=3, head_final_tokens=1).external_fragmentation == 2   # final below tokens


def test_first_fit_takes_an_extent_of_exactly_the_length():
    a = ContiguousAllocator(100, max_seq_len=100, reserve="oracle", placement="first-fit")
    for seq in range(3):
        a.allocate(seq, 30, 30)
    a.free(1)                                 # free: 30 at 30, 10 at 90
    assert a.can_allocate(30, 30) and not a.can_allocate(31, 31)
    s = a.stats(head_tokens=30, head_final_tokens=30)     # the 30-slot extent holds it: 10 stranded
    assert (s.external_fragmentation, s.free) == (10, 30)
    a.allocate(3, 30, 30)
    assert a._pool.extents() == [(90, 10)]


def test_first_fit_release_after_the_last_free_extent():
    pool = FirstFit(60)
    assert pool.place(30) == (0, 30) and pool.place(30) == (30, 30)
    assert pool.extents() == []
    pool.release(30, 30)                      # no free extent at all: it becomes the only one
    assert pool.extents() == [(30, 30)]
    pool.release(0, 30)                       # merged with the next one
    assert pool.extents() == [(0, 60)]
    pool.check(60)
    pool = FirstFit(90)
    for _ in range(3):
        pool.place(30)
    pool.release(0, 30)
    pool.release(60, 30)                      # after the last free extent, not adjacent to it
    assert pool.extents() == [(0, 30), (60, 30)]
    pool.check(90)
