"""ContiguousAllocator details worked by hand: chunked prefill's `hold_tokens`, growth past the final
length inside a `max` reservation, the batched `append_each` with a start index, a buddy-placed fork's
reservation, buddy peak footprints next to powers of two, the head request's default, and the
argument checks with their messages."""

import pytest

from kvsim.alloc import AllocationError, ContiguousAllocator


def test_hold_tokens_writes_part_of_the_prompt_now_and_the_rest_by_append():
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="first-fit")
    assert a.allocate(1, 10, 20, hold_tokens=4) == 0          # no prefix caching: 0 cached
    assert a.num_tokens(1) == 4 and a.cached_tokens(10) == 0
    s = a.stats()                                              # 4 written, 16 to fill of 20 reserved
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (4, 16, 0, 44)
    a.append(1, 6)
    assert a.num_tokens(1) == 10
    for hold in (0, 11):
        with pytest.raises(AllocationError, match=rf"^sequence 2: needs 1 <= hold_tokens \({hold}\) <= "
                                                  r"num_tokens \(10\)$"):
            a.allocate(2, 10, 20, hold_tokens=hold)
    with pytest.raises(AllocationError, match="^sequence 1: num_tokens must be >= 1, got 0$"):
        a.append(1, 0)
    a.check_invariants()


def test_growth_past_the_final_length_inside_a_max_reservation():
    a = ContiguousAllocator(128, 64, reserve="max", placement="first-fit")
    a.allocate(1, 10, 12)                  # 64 reserved at [0, 64)
    a.allocate(2, 20, 30)                  # 64 reserved at [64, 128)
    a.append(1, 5)                         # 15 written: past its final 12, which becomes 15
    # written 15 + 20 = 35; finals 15 + 30 = 45 -> 10 to fill; 128 - 45 = 83 never filled
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation) == (35, 10, 83, 0)
    a.append(1)                            # 16 written, final 16: 36 written, 46 reached -> 10, 82
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation) == (36, 10, 82)
    a.check_invariants()


def test_append_past_a_buddy_reservation_names_the_reservation_not_the_block():
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="buddy")
    a.allocate(1, 10, 12)                  # 12 reserved, placed in a 16-slot block
    a.append(1, 2)
    with pytest.raises(AllocationError, match="^sequence 1: 13 tokens past its reservation of 12 slots$"):
        a.append(1)


def test_append_each_from_a_start_index_stops_at_the_first_full_reservation():
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="first-fit")
    a.allocate(1, 5, 10)                   # room for 5 more
    a.allocate(2, 6, 6)                    # full
    a.allocate(3, 5, 10)
    assert a.append_each([1, 2, 3]) == 1                       # 1 grows, 2 cannot
    assert a.append_each([3, 1, 2], 1) == 1                    # from index 1: 1 grows, stops at 2
    assert a.append_each([2, 1, 3], 1) == 2                    # 1 and 3 grow; 2 is skipped
    assert [a.num_tokens(s) for s in (1, 2, 3)] == [8, 6, 6]
    copies = []
    assert a.append_each([3], 0, copies) == 1 and copies == []
    a.check_invariants()


def test_buddy_fork_keeps_the_parents_reservation_not_its_block():
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="buddy")
    a.allocate(1, 10, 12)                  # 12 reserved in 16
    a.fork(1, 2)
    # finals 12 + 12, reservations 12 + 12: nothing unreachable; 2 x 4 slots of buddy padding
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation, s.free) == (20, 4, 0, 8, 32)
    assert (s.used_blocks, s.free_blocks, s.unshared_blocks) == (32, 32, 32)
    a.check_invariants()


@pytest.mark.parametrize("num_tokens, final_tokens, expected", [
    (1, 1, 1), (2, 3, 4), (3, 5, 8), (5, 7, 8), (5, 8, 8), (5, 9, 16),
])
def test_buddy_peak_slots_round_the_reservation_up_to_a_power_of_two(num_tokens, final_tokens, expected):
    a = ContiguousAllocator(64, 64, reserve="oracle", placement="buddy")
    assert a.peak_slots(num_tokens, final_tokens) == expected
    assert a.peak_slots(num_tokens, final_tokens, num_seqs=3) == 3 * expected


def test_without_a_head_request_nothing_is_stranded_and_a_one_slot_head_still_counts():
    a = ContiguousAllocator(100, 40, reserve="max", placement="first-fit")
    a.allocate(1, 5, 5)                    # 40 reserved at [0, 40)
    a.allocate(2, 5, 5)                    # [40, 80); 20 free at 80
    s = a.stats()                          # no head: the 20 free slots are free
    assert (s.external_fragmentation, s.free) == (0, 20)
    s = a.stats(head_tokens=1, head_final_tokens=1)            # a 1-token head still reserves 40
    assert (s.external_fragmentation, s.free) == (20, 0)
    steps = a.append_steps([1], 1)
    assert (steps[0].external_fragmentation, steps[0].free, steps[0].token_states) == (0, 20, 11)


def test_bad_sizes_raise_value_error_naming_both():
    for capacity, max_seq_len in ((0, 16), (64, 0)):
        with pytest.raises(ValueError, match=rf"^capacity_tokens and max_seq_len must be >= 1, got {capacity}, "
                                             rf"{max_seq_len}$"):
            ContiguousAllocator(capacity, max_seq_len)
    assert ContiguousAllocator(64, 16).block_size == 1
