"""kvsim/alloc/paged/block_manager_v0.py by hand: a request's samples swap out and back in with their sharing
(vLLM 0.1.4 maps each physical block once), and the fast-forward reserve window."""

from kvsim.alloc.paged import block_manager_v0 as bm
from kvsim.alloc.paged.allocator import PagedAllocator


def test_swap_keeps_shared_blocks_shared():
    """Blocks of 4. Sample 0 holds a 10-token prompt (blocks a b c, c partly filled); samples 1 and 2
    fork it; 1 grows to 11 tokens (copy of c: c1), 2 to 13 (copy of c: c2, then a new block d). Distinct
    blocks: a b c c1 c2 d = 6, where the three tables list 3 + 3 + 4 = 10. Out: all 6 free; in: 6 taken,
    a and b shared by three tables again, the memory as before."""
    alloc = PagedAllocator(20, 4)
    alloc.allocate(0, 10, 20)
    alloc.fork(0, 1)
    alloc.fork(0, 2)
    alloc.append(1, 1)
    alloc.append(2, 3)
    before = alloc.stats()
    assert before.used_blocks == 6 and bm.distinct_blocks(alloc, [0, 1, 2]) == 6
    image = bm.swap_out(alloc, [0, 1, 2])
    assert image.blocks == 6 and alloc.num_free_blocks == 20
    alloc.check_invariants()
    bm.swap_in(alloc, [0, 1, 2], image)
    alloc.check_invariants()
    assert alloc.stats() == before
    tables = [alloc.block_table(s) for s in (0, 1, 2)]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2] and len({t[2] for t in tables}) == 3
    assert [len(t) for t in tables] == [3, 3, 4]


def test_reserve_window_keeps_a_free_block_per_sequence():
    """10 blocks of 4; two sequences of 4 and 6 tokens (1 and 2 blocks: rooms 0 and 2 slots). 7 blocks
    free, 2 held back: 5 may be taken. The first takes a block at steps 0, 4, 8, ..., the second at 2, 6,
    10, ...: steps 0, 2, 4, 6 and 8 take the 5, the 6th is wanted at step 10, so 10 steps (each starts
    with at least 2 free blocks: 7, 6, 6, 5, 5, 4, 4, 3, 3, 2)."""
    alloc = PagedAllocator(10, 4)
    alloc.allocate(0, 4, 100)
    alloc.allocate(1, 6, 100)
    assert bm.reserve_window(alloc, [0, 1], 100) == 10
    assert bm.reserve_window(alloc, [0, 1], 5) == 5
