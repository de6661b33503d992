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
