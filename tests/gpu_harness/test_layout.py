"""Block tables, seq_lens and slot mappings built from allocator-style block id lists."""

import pytest
import torch

from gpu_harness import layout


def test_block_table_is_int32_and_padded():
    bt = layout.make_block_table([[3, 1], [7], []], "cpu")
    assert bt.dtype == torch.int32
    assert bt.tolist() == [[3, 1], [7, -1], [-1, -1]]
    assert layout.make_block_table([[1]], "cpu", max_blocks=3).tolist() == [[1, -1, -1]]
    with pytest.raises(ValueError, match="more than max_blocks"):
        layout.make_block_table([[1, 2]], "cpu", max_blocks=1)


def test_slot_mapping_formula_and_padding():
    # sequence with blocks [5, 2], block size 4: positions 3..6 -> 5*4+3, 2*4+0, 2*4+1, 2*4+2
    sm = layout.make_slot_mapping([([5, 2], 3, 7), ([9], 0, 1)], 4, "cpu", pad_to=7)
    assert sm.dtype == torch.int64
    assert sm.tolist() == [23, 8, 9, 10, 36, -1, -1]
    with pytest.raises(ValueError, match="past the 1 blocks"):
        layout.slots_for([0], 0, 5, 4)


def test_tables_cover_unique_blocks(gen):
    lens = [1, 8, 9, 17]
    seq = layout.sequential_tables(lens, 8)
    assert seq == [[0], [1], [2, 3], [4, 5, 6]]
    perm = layout.permuted_tables(lens, 8, gen, num_blocks=20)
    assert [len(t) for t in perm] == [1, 1, 2, 3]
    flat = [b for t in perm for b in t]
    assert len(set(flat)) == len(flat) and max(flat) < 20


def test_scatter_gather_round_trip(gen):
    lens = [5, 12]
    k = torch.randn(2, 12, 2, 16, generator=gen)
    tables = layout.permuted_tables(lens, 4, gen)
    cache, _ = layout.alloc_paged_cache(sum(map(len, tables)), 4, 2, 16, torch.float32, "cpu", fill="zeros")
    layout.scatter_to_paged(k, lens, tables, cache)
    back = layout.gather_contiguous(cache, lens, tables)
    assert torch.equal(back[1], k[1]) and torch.equal(back[0, :5], k[0, :5])
    assert back[0, 5:].abs().sum() == 0


def test_sliding_window_tables_null_the_blocks_before_the_window():
    # block size 4, window 3: L=10 attends positions 7..9, so block 0 (positions 0-3) is wholly before
    # the window and block 1 (4-7) is kept for position 7; L=5 attends 2..4 in blocks 0 and 1; L=2 all
    assert layout.window_start(10, 3) == 7 and layout.window_start(2, 3) == 0
    tables = [[5, 6, 7], [1, 2], [9]]
    assert layout.null_out_of_window(tables, [10, 5, 2], 4, 3) == [[-1, 6, 7], [1, 2], [9]]
    # L=13, window 4: positions 9..12, blocks 0 and 1 (0-7) null; vLLM's null block id 0 as the entry
    assert layout.null_out_of_window([[3, 4, 5, 6]], [13], 4, 4, null=0) == [[0, 0, 5, 6]]
    with pytest.raises(ValueError, match="window must be >= 1"):
        layout.null_out_of_window(tables, [10, 5, 2], 4, 0)


def test_group_block_tables_one_per_group_with_nulls_kept():
    # two sequences of a full + sliding-window model: per sequence [full table, sliding table]
    seqs = [[[3, 4, 5], [-1, 6, 7]], [[1], [2]]]
    full, sliding = layout.group_block_tables(seqs, "cpu")
    assert full.dtype == sliding.dtype == torch.int32
    assert full.tolist() == [[3, 4, 5], [1, -1, -1]]
    assert sliding.tolist() == [[-1, 6, 7], [2, -1, -1]]
    wide = layout.group_block_tables(seqs, "cpu", max_blocks=(4, 3))
    assert [t.shape[1] for t in wide] == [4, 3] and wide[0].tolist()[1] == [1, -1, -1, -1]
    assert layout.group_block_tables([], "cpu") == []
    with pytest.raises(ValueError, match="different numbers of KV cache groups"):
        layout.group_block_tables([[[1]], [[1], [2]]], "cpu")
    with pytest.raises(ValueError, match="max_blocks has 1 entries for 2 groups"):
        layout.group_block_tables(seqs, "cpu", max_blocks=(4,))


def test_window_tables_may_null_only_blocks_before_the_window():
    # block size 4, window 3, L=10: the window [7, 10) reads blocks 1 and 2; block 0 may be null
    layout.check_window_tables([[-1, 6, 7], [5, 6, 7]], [10, 10], 4, 3)
    with pytest.raises(ValueError, match=r"sequence 1: block 1 is null but holds tokens of the window \[7, 10\)"):
        layout.check_window_tables([[-1, 6, 7], [-1, -1, 7]], [10, 10], 4, 3)
    with pytest.raises(ValueError, match="sequence 0: 2 blocks cannot hold its 10 tokens"):
        layout.check_window_tables([[6, 7]], [10], 4, 3)
    # what null_out_of_window makes always passes the check
    tables = [[10, 11, 12, 13], [20, 21]]
    layout.check_window_tables(layout.null_out_of_window(tables, [13, 8], 4, 5), [13, 8], 4, 5)


def test_slots_of_a_null_entry_are_refused():
    assert layout.slots_for([-1, 6], 4, 6, 4) == [24, 25]  # positions in block 1, past the null one
    with pytest.raises(ValueError, match=r"positions \[3, 5\) reach block 0 of the table, a null entry"):
        layout.slots_for([-1, 6], 3, 5, 4)
    assert layout.slots_for([-1, 6], 5, 5, 4) == []
