"""Jenga's allocator (kvsim/alloc/jenga/) on tiny pools worked by hand: two groups whose pages are 2 and 3
bytes make large pages of LCM 6 bytes, holding 3 pages of the first group or 2 of the second (gcd 1 byte:
a page of 2 bytes is 2 x block_size slots, one of 3 bytes 3 x block_size). Checked: small pages placed in
large pages request-aware (a request's own large page first, then a free large page, then any large page of
its group with room), whole large pages freed when their last page is, refusals when a group has no room
although bytes are free, the five-way breakdown per group and in total, and the stranded-page fraction.

Page ids are as each group sees the pool: large page x pages per large page + index inside it.
"""

import pytest

from kvsim.alloc import AllocationError, make_allocator
from kvsim.alloc.hybrid import NULL_BLOCK as NULL
from kvsim.alloc.jenga import JengaAllocator, JengaGroup, groups_from_layers, plan_pool

A, B = JengaGroup("full", page_bytes=2), JengaGroup("full", page_bytes=3)


def make(groups, pool_bytes, block_size=1, in_flight=8, chunk=None):
    return JengaAllocator(pool_bytes, block_size, groups, max_model_len=64, max_in_flight_tokens=in_flight,
                          prefill_chunk_tokens=chunk)


def parts(m):
    return (m.capacity_tokens, m.token_states, m.reserved, m.internal_fragmentation,
            m.external_fragmentation, m.free)


def test_layout_of_pages_of_2_and_3_bytes():
    lay = plan_pool(40, 2, [A, B])
    assert (lay.unit_bytes, lay.large_page_bytes, lay.num_large, lay.remainder_bytes) == (1, 6, 6, 4)
    assert lay.pages_per_large == (3, 2) and lay.units == (2, 3)
    # a large page is 6 bytes = 6 units x block 2 = 12 slots of half a byte
    assert (lay.slots_per_large, lay.capacity_tokens, lay.bytes_per_slot) == (12, 72, 0.5)
    mamba = plan_pool(100_000, 16, [JengaGroup("full", page_bytes=4096), JengaGroup("mamba", page_bytes=6144)])
    assert (mamba.unit_bytes, mamba.large_page_bytes, mamba.pages_per_large, mamba.num_large) == \
        (2048, 12288, (3, 2), 8)


def test_small_pages_go_to_the_requests_own_large_pages():
    a = make([A, B], 36)                       # 6 large pages of 6 bytes; block 1: 36 slots of 1 byte
    a.allocate(0, 2, 5)                        # A: large 0, pages 0, 1; B: large 1, pages 2, 3
    assert a.group_block_tables(0) == [[0, 1], [2, 3]]
    a.allocate(1, 2, 2)                        # a new request takes fresh large pages: A large 2, B large 3
    assert a.group_block_tables(1) == [[6, 7], [6, 7]]
    a.append(0, 1)                             # A: its large 0 has index 2 free -> 2; B: large 1 is full -> large 4
    assert a.group_block_tables(0) == [[0, 1, 2], [2, 3, 8]]
    a.check_invariants()
    # A holds large 0, 2 (one page of 2 bytes free in large 2); B holds 1, 3, 4 (one page of 3 free in 4)
    assert parts(a.stats()) == (36, 5 * 2 + 5 * 3, 0, 0, 2 + 3, 6)
    assert [parts(g) for g in a.group_stats()] == [(12, 10, 0, 0, 2, 0), (18, 15, 0, 0, 3, 0)]
    assert a.stats().used_blocks == 5 and a.stats().free_blocks == 1
    assert a.large_page_waste() == pytest.approx(5 / 36)


def test_a_finished_request_frees_whole_large_pages():
    a = make([A, B], 36)
    a.allocate(0, 2, 5)
    a.allocate(1, 2, 2)
    a.append(0, 1)
    a.free(1)                                  # its large pages 2 (A) and 3 (B) held only its pages
    a.check_invariants()
    assert a.num_free_large == 3 and parts(a.stats()) == (36, 6 + 9, 0, 0, 3, 18)
    a.allocate(2, 1, 1)                        # last released first: A takes large 3, B large 2
    assert a.group_block_tables(2) == [[9], [4]]
    a.free(0)
    a.free(2)
    a.check_invariants()
    assert a.num_free_large == 6 and parts(a.stats()) == (36, 0, 0, 0, 0, 36)


def test_a_group_is_refused_while_another_group_strands_free_bytes():
    a = make([A, B], 12)                       # 2 large pages, 12 slots of 1 byte
    a.allocate(0, 1, 1)                        # A: large 0 page 0; B: large 1 page 2
    assert a.can_allocate(1, 1)                # A has 2 free pages in large 0, B 1 in large 1
    a.allocate(1, 1, 1)                        # no free large page: the groups' own large pages
    assert a.group_block_tables(1) == [[1], [3]]
    # 2 bytes are free (A's page 2 of large 0), but B has no room and no large page is free
    assert not a.can_allocate(1, 1)
    assert a.can_append(0) is False and a.append_each([0, 1]) == 0
    assert parts(a.stats()) == (12, 2 * 2 + 2 * 3, 0, 0, 2, 0)
    assert a.large_page_waste() == pytest.approx(2 / 12)
    with pytest.raises(AllocationError, match="do not fit"):
        a.allocate(2, 1, 1)
    # the two requests share both large pages: finishing one frees none
    a.free(0)
    assert a.num_free_large == 0 and parts(a.stats()) == (12, 2 + 3, 0, 0, 4 + 3, 0)
    a.free(1)
    assert a.num_free_large == 2
    a.check_invariants()


def test_peak_slots_count_whole_large_pages():
    a = make([A, B], 12)
    assert a.peak_slots(1, 1) == (1 + 1) * 6          # 1 page each: one large page per group
    assert a.peak_slots(3, 3) == (1 + 2) * 6 > a.capacity_tokens   # B's 3 pages need 2 large pages
    assert a.peak_slots(2, 2) == 12
    with pytest.raises(ValueError, match="one sequence per request"):
        a.peak_slots(2, 2, num_seqs=2)


def test_a_sliding_window_reuses_its_own_large_page():
    # A: sliding window 4 (2-byte pages), B: full (3-byte pages); block 2; 6 large pages of 12 slots
    a = make([JengaGroup("sliding", window=4, page_bytes=2), B], 36, block_size=2)
    a.allocate(0, 5, 9)                        # 3 pages each: A fills large 0; B large 1 then large 2
    assert a.group_block_tables(0) == [[0, 1, 2], [2, 3, 4]]
    a.append_each([0])                         # 5 computed: 2 tokens left the window: A's page 0 freed
    assert a.group_block_tables(0) == [[NULL, 1, 2], [2, 3, 4]]
    a.append_each([0])                         # 7 tokens: a 4th entry; A reuses index 0 of large 0
    assert a.group_block_tables(0) == [[NULL, 1, 2, 0], [2, 3, 4, 5]]
    a.append_each([0])                         # 7 computed: 4 skipped: page 1 freed
    a.append_each([0])                         # 9 tokens: A takes index 1 again; B's large 1, 2 full -> 3
    assert a.group_block_tables(0) == [[NULL, NULL, 2, 0, 1], [2, 3, 4, 5, 6]]
    a.check_invariants()
    assert a.pool.large_held == [1, 3]
    # A: 3 pages x 2 units; 9 - 2 x 2 = 5 tokens written, 1 slot of its last page never (x 2 units)
    # B: 9 tokens x 3 units, 1 never-written slot x 3, one free page of large 3 (2 slots x 3) stranded
    assert [parts(g) for g in a.group_stats()] == [(12, 10, 0, 2, 0, 0), (36, 27, 0, 3, 6, 0)]
    assert parts(a.stats()) == (72, 37, 0, 5, 6, 24)


def test_a_mamba_state_page_and_attention_pages_of_other_sizes():
    # full pages of 4 bytes, Mamba states of 6: gcd 2, large pages of 12 bytes (3 full or 2 states)
    a = make([JengaGroup("full", page_bytes=4), JengaGroup("mamba", page_bytes=6)], 24, block_size=2)
    assert a.capacity_tokens == 2 * 12
    a.allocate(0, 3, 4)                        # full: 2 pages in large 0; state: large 1
    a.allocate(1, 2, 2)                        # no free large page: the groups' own large pages
    assert a.group_block_tables(0) == [[0, 1], [2]] and a.group_block_tables(1) == [[2], [3]]
    # full: 5 tokens x 2 units written, seq 0 will still write 1 (x 2); states: 2 pages x 2 x 3, all state
    assert [parts(g) for g in a.group_stats()] == [(12, 10, 2, 0, 0, 0), (12, 12, 0, 0, 0, 0)]
    assert not a.can_allocate(1, 1)
    a.append(0, 1)                             # 4 tokens: still 2 pages
    a.check_invariants()


def test_admission_caps_a_sliding_group_and_checks_the_first_chunk_as_the_hybrid_manager_does():
    # window 2, in flight 2, block 1: cap = cdiv(min(2 - 1 + 2, 64), 1) + 1 = 4 pages however long the prompt
    a = make([JengaGroup("sliding", window=2, page_bytes=2)], 8, in_flight=2, chunk=2)   # 4 large pages of 1 page
    assert a.can_allocate(30, 30)              # the capped 4 pages fit (a full group would count 30)
    assert a.can_hold(4, 30) and not a.can_hold(5, 30)     # this step's first 4 tokens fit, 5 do not
    assert not make([JengaGroup("sliding", window=2, page_bytes=2)], 2, in_flight=2).can_allocate(30, 30)
    assert not make([JengaGroup("full", page_bytes=2)], 58, in_flight=2).can_allocate(30, 30)   # 29 pages


def test_bad_input_and_registration():
    with pytest.raises(ValueError, match="page_bytes >= 1"):
        JengaGroup("full")
    with pytest.raises(ValueError, match="a sliding group needs window >= 1"):
        JengaGroup("sliding", page_bytes=2)
    with pytest.raises(ValueError, match=r"LCM of the page sizes \[4, 6\] = 12 bytes\) is larger than the pool \(10"):
        make([JengaGroup("full", page_bytes=4), JengaGroup("full", page_bytes=6)], 10)
    with pytest.raises(ValueError, match="prefix caching with a Mamba group is not modelled"):
        JengaAllocator(12, 1, [A, JengaGroup("mamba", page_bytes=3)], 64, 8, prefix_caching=True)
    with pytest.raises(ValueError, match="does not fork"):
        make([A], 12).fork(0, 1)
    with pytest.raises(AllocationError, match="unknown sequence id 3"):
        make([A], 12).free(3)
    a = make_allocator("jenga", 0, block_size=2, max_seq_len=64, groups=[A, B], max_in_flight_tokens=8,
                       pool_bytes=40)
    assert isinstance(a, JengaAllocator) and a.capacity_tokens == 72
    with pytest.raises(ValueError, match="needs pool_bytes >= 1"):
        make_allocator("jenga", 100, groups=[A])


@pytest.mark.parametrize("empty_first", [True, False])
def test_empty_large_pages_first_trades_stranded_pages_for_whole_frees(empty_first):
    a = JengaAllocator(36, 1, [A, B], 64, 8, empty_first=empty_first)
    a.allocate(0, 2, 2)                        # A: large 0 pages 0, 1 (index 2 free); B: large 1, full
    a.allocate(1, 1, 1)
    if empty_first:                            # A opens large 2 rather than use large 0's free page
        assert a.group_block_tables(1) == [[6], [6]]
        assert parts(a.stats()) == (36, 3 * 2 + 3 * 3, 0, 0, (1 + 2) * 2 + 1 * 3, 12)
    else:                                      # A packs into large 0; B must open one: large 2
        assert a.group_block_tables(1) == [[2], [4]]
        assert parts(a.stats()) == (36, 3 * 2 + 3 * 3, 0, 0, 1 * 3, 18)
    before = a.num_free_large
    a.free(0)
    a.check_invariants()
    # request-aware: request 0's large pages 0 and 1 empty whole; packed: large 0 still holds request 1's
    # page (it started with one more large page free: 4 are free either way)
    assert (before, a.num_free_large) == ((2, 4) if empty_first else (3, 4))


def test_groups_from_layers_sum_the_pages_of_layers_of_one_kind_and_span():
    # gemma-3-27b-like: 5 sliding (window 1024) per full layer, 8192 B per layer per token, block 16;
    # a Mamba layer's state counts once per request, not per token
    layers = [("sliding", 1024, 8192)] * 5 + [("full", 0, 8192)] + [("sliding", 1024, 8192)] * 5 + [("full", 0, 8192)]
    assert groups_from_layers(layers, 16) == [JengaGroup("sliding", window=1024, page_bytes=10 * 16 * 8192),
                                              JengaGroup("full", page_bytes=2 * 16 * 8192)]
    mixed = [("mamba", 0, 1000), ("full", 0, 64), ("mamba", 0, 1000), ("chunked", 8, 64), ("sliding", 4, 64)]
    assert groups_from_layers(mixed, 2) == [JengaGroup("mamba", page_bytes=2000), JengaGroup("full", page_bytes=128),
                                            JengaGroup("chunked", chunk=8, page_bytes=128),
                                            JengaGroup("sliding", window=4, page_bytes=128)]
    with pytest.raises(ValueError, match="a full layer needs bytes >= 1"):
        groups_from_layers([("full", 0, 0)], 16)
