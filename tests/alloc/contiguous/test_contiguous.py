"""ContiguousAllocator: reservation policies, first fit with coalescing, buddy arenas and padding,
external fragmentation against the head request, errors; and the make_allocator factory."""

import pytest

from kvsim.alloc import AllocationError, ContiguousAllocator, PagedAllocator, make_allocator
from kvsim.alloc.contiguous.allocator import reservation


@pytest.mark.parametrize("placement", ["first-fit", "buddy"])
def test_opt13b_pool_holds_exactly_7_max_reservations(placement):
    a = ContiguousAllocator(15_728, max_seq_len=2048, reserve="max", placement=placement)
    for seq in range(7):
        assert a.can_allocate(100, 149)
        a.allocate(seq, 100, 149)
    assert not a.can_allocate(1, 1)
    with pytest.raises(AllocationError, match="no free extent of 2048 slots"):
        a.allocate(7, 1, 1)
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (700, 7 * 49, 7 * (2048 - 149))
    assert s.free + s.external_fragmentation == 15_728 - 7 * 2048
    a.check_invariants()


@pytest.mark.parametrize("prompt, output, expected", [
    (100, 25, 132), (100, 32, 132), (100, 33, 164), (100, 1, 101),
    (2000, 40, 2048),           # 2000 + 64 capped at max_seq_len
    (3000, 10, 3009),           # ... or at the final length when that is longer
])
def test_pow2_reserves_prompt_plus_output_rounded_up(prompt, output, expected):
    assert reservation("pow2", prompt, prompt + output - 1, 2048) == expected
    a = ContiguousAllocator(8192, max_seq_len=2048, reserve="pow2", placement="first-fit")
    a.allocate(1, prompt, prompt + output - 1)
    s = a.stats()
    assert s.token_states + s.reserved + s.internal_fragmentation == expected
    assert a.peak_slots(prompt, prompt + output - 1, num_seqs=3) == 3 * expected


def test_oracle_and_max_reservations():
    assert reservation("oracle", 100, 124, 2048) == 124
    assert reservation("max", 100, 124, 2048) == 2048
    assert reservation("max", 3000, 3100, 2048) == 3100


def test_buddy_rounding_is_external_fragmentation():
    a = ContiguousAllocator(1024, max_seq_len=2048, reserve="oracle", placement="buddy")
    assert a.peak_slots(60, 100, num_seqs=2) == 2 * 128
    a.allocate(1, 60, 100)                # 100 slots placed in a 128-slot buddy block
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation) == (60, 40, 0, 28)
    assert (s.free, s.used_blocks, s.free_blocks) == (1024 - 128, 128, 1024 - 128)
    a.check_invariants()


def test_buddy_splits_non_power_of_two_pool_into_aligned_arenas():
    a = ContiguousAllocator(15_728, max_seq_len=2048, placement="buddy")
    assert a._pool.arenas == [(0, 8192), (8192, 4096), (12288, 2048), (14336, 1024),
                              (15360, 256), (15616, 64), (15680, 32), (15712, 16)]
    b = ContiguousAllocator(100, max_seq_len=8, reserve="oracle", placement="buddy")   # 64 + 32 + 4
    for seq in range(25):
        b.allocate(seq, 4, 4)
    assert not b.can_allocate(1, 1)
    for seq in range(25):
        b.free(seq)
    assert b._pool.extents() == [(0, 64), (64, 32), (96, 4)]  # merged back, never across arenas
    b.check_invariants()


def test_first_fit_places_lowest_and_coalesces_neighbours():
    a = ContiguousAllocator(100, max_seq_len=100, reserve="oracle", placement="first-fit")
    for seq in range(3):
        a.allocate(seq, 30, 30)
    assert a._pool.extents() == [(90, 10)]
    a.free(0)
    a.free(2)
    assert a._pool.extents() == [(0, 30), (60, 40)]     # 2's extent merged with the tail
    assert not a.can_allocate(41, 41)
    a.free(1)
    assert a._pool.extents() == [(0, 100)]
    a.allocate(3, 35, 35)
    assert a._pool.extents() == [(35, 65)]
    a.check_invariants()


def test_free_extents_too_small_for_the_head_request_are_external_fragmentation():
    a = ContiguousAllocator(100, max_seq_len=100, reserve="oracle", placement="first-fit")
    for seq in range(3):
        a.allocate(seq, 30, 30)
    a.free(1)                                   # free extents: 30 slots at 30, 10 at 90
    s = a.stats()
    assert (s.external_fragmentation, s.free) == (0, 40)          # no head request
    s = a.stats(head_tokens=40, head_final_tokens=40)             # fits nowhere: all 40 stranded
    assert (s.external_fragmentation, s.free) == (40, 0)
    s = a.stats(head_tokens=20, head_final_tokens=20)             # only the 10-slot extent is too small
    assert (s.external_fragmentation, s.free) == (10, 30)
    assert s.token_states + s.reserved + s.internal_fragmentation + s.external_fragmentation + s.free == 100


def test_append_inside_reservation_only():
    a = ContiguousAllocator(64, max_seq_len=64, reserve="oracle", placement="first-fit")
    a.allocate(1, 10, 12)
    assert a.append(1, 2) == [] and a.num_tokens(1) == 12
    assert not a.can_append(1)
    with pytest.raises(AllocationError, match="13 tokens past its reservation of 12 slots"):
        a.append(1)
    assert a.num_tokens(1) == 12
    a.check_invariants()


def test_fork_copies_into_a_new_extent():
    a = ContiguousAllocator(64, max_seq_len=64, reserve="oracle", placement="first-fit")
    a.allocate(1, 10, 20)
    assert a.can_fork(1)
    a.fork(1, 2)
    assert a._pool.extents() == [(40, 24)] and a.num_tokens(2) == 10
    assert a.stats().token_states == 20
    a.allocate(3, 24, 24)
    assert not a.can_fork(1)                     # 0 slots left
    a.check_invariants()


@pytest.mark.parametrize("call, match", [
    (lambda a: a.append(9), "unknown sequence id 9"),
    (lambda a: a.can_append(9), "unknown sequence id 9"),
    (lambda a: a.free(9), "unknown sequence id 9"),
    (lambda a: a.num_tokens(9), "unknown sequence id 9"),
    (lambda a: a.fork(9, 10), "unknown sequence id 9"),
    (lambda a: a.fork(1, 1), "sequence id 1 is already allocated"),
    (lambda a: a.allocate(1, 2, 2), "sequence id 1 is already allocated"),
    (lambda a: a.allocate(2, 0, 2), "num_tokens must be >= 1"),
])
def test_misuse_raises_allocation_error(call, match):
    a = ContiguousAllocator(64, max_seq_len=16)
    a.allocate(1, 3, 5)
    with pytest.raises(AllocationError, match=match):
        call(a)


def test_bad_config_raises_value_error():
    with pytest.raises(ValueError, match="unknown reserve policy 'min'; known: max, pow2, oracle"):
        ContiguousAllocator(64, 16, reserve="min")
    with pytest.raises(ValueError, match="unknown placement 'best-fit'; known: first-fit, buddy"):
        ContiguousAllocator(64, 16, placement="best-fit")


def test_make_allocator():
    paged = make_allocator("paged", 15_728, block_size=16, prefix_caching=True)
    assert isinstance(paged, PagedAllocator) and (paged.num_blocks, paged.capacity_tokens) == (983, 15_728)
    contiguous = make_allocator("contiguous", 15_728, reserve="pow2", placement="first-fit")
    assert isinstance(contiguous, ContiguousAllocator)
    assert (contiguous.capacity_tokens, contiguous.reserve, contiguous.placement) == (15_728, "pow2", "first-fit")
    with pytest.raises(ValueError, match="unknown allocator 'slab'; known: paged, contiguous"):
        make_allocator("slab", 100)
