"""Sliding-window paged decode: only the last W tokens are attended, and null table entries (blocks
wholly before the window) are never read, whether they hold -1 (out of bounds) or point at vLLM's null
block 0 filled with NaN.

Each case's contexts L put the window start L - W mid-block, on a block boundary and before 0 (W > L).
"""

import pytest
import torch

from gpu_harness import layout, reference
from gpu_harness.check import TOLERANCE, DecodeCase, decode_inputs
from gpu_harness.check_hybrid import WindowCase, window_inputs
from gpu_harness.kernels import contiguous_decode, paged_decode

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

CASES = [  # dtype, q_heads, kv_heads, head_dim, block_size, window, splits, null
    (F32, 4, 2, 64, 8, 8, 1, "pad"), (BF16, 8, 1, 64, 8, 12, 2, "null0"),
    (F16, 4, 4, 80, 16, 20, 1, "null0"), (BF16, 5, 1, 64, 4, 9, 1, "pad"),
    (F32, 4, 1, 64, 64, 40, 2, "null0"),  # a page wider than a tile (DECODE_BLOCK_N = 32)
]


def _lens(bs: int, w: int) -> tuple[int, ...]:
    # 1 and w-1: window before 0; w+1: starts at 1 (mid-block); w+bs: starts at bs (a boundary);
    # 3w+5: starts at 2w+5, deep in the table
    return (1, w - 1, w + 1, w + bs, 3 * w + 5)


def _ids(case):
    dt, hq, hk, d, bs, w, s, null = case
    return f"{str(dt)[6:]}-h{hq}/{hk}-d{d}-bs{bs}-W{w}-s{s}-{null}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_window_matches_reference_and_skips_null_entries(case, device, gen):
    dtype, hq, hk, d, bs, w, splits, null = case
    c = WindowCase(DecodeCase(dtype, hq, hk, d, bs, _lens(bs, w), splits), w, null)
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    null_id = -1 if null == "pad" else 0
    assert (bt == null_id).sum() > 0  # the case has null entries for the kernel to skip
    if null == "null0":
        assert kc[0].isnan().all() and vc[0].isnan().all()
    out = paged_decode(q, kc, vc, bt, sl, num_splits=splits, window=w)
    assert not out.isnan().any()
    atol, rtol = TOLERANCE[dtype]
    ref = reference.ref_paged_decode(q, kc, vc, bt, sl, window=w)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_window_masks_tokens_before_it_inside_the_first_block(device, gen):
    # tables keep every real block (no nulls): the tokens before the window inside its first block and
    # the blocks before it hold real data, which a kernel without the window mask would attend to
    c = DecodeCase(F32, 4, 2, 64, 8, (13, 30), 1)
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, window=6)  # windows [7, 13) and [24, 30): mid-block starts
    torch.testing.assert_close(out, reference.ref_paged_decode(q, kc, vc, bt, sl, window=6),
                               atol=1e-5, rtol=1e-5)
    full = paged_decode(q, kc, vc, bt, sl)
    assert (out - full).abs().max() > 1e-2


def test_window_of_one_returns_the_last_value_row(device, gen):
    # W=1: the softmax has one token, weight exactly 1, so out[b, h] = V[last token, h // group]
    c = DecodeCase(F32, 6, 2, 64, 4, (1, 6, 9), 1)
    q, kc, vc, bt, sl, tables = decode_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, window=1)
    for b, n in enumerate(c.seq_lens):
        last = vc[tables[b][(n - 1) // 4], (n - 1) % 4]  # [H_kv, D]
        assert torch.equal(out[b], last.repeat_interleave(3, dim=0))


@pytest.mark.parametrize("splits", [1, 3])
def test_window_wider_than_every_context_equals_full_attention(splits, device, gen):
    c = DecodeCase(BF16, 8, 2, 64, 8, (1, 8, 17, 40), splits)
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    full = paged_decode(q, kc, vc, bt, sl, num_splits=splits)
    for w in (40, 1000):  # W = max L and W > max L: the same tiles and arithmetic, bit-identical
        assert torch.equal(paged_decode(q, kc, vc, bt, sl, num_splits=splits, window=w), full)


def test_window_equals_contiguous_decode_of_the_last_w_tokens(device, gen):
    w, lens = 10, (4, 19, 33)
    c = WindowCase(DecodeCase(F32, 8, 2, 64, 8, lens, 2), w, "null0")
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, num_splits=2, window=w)
    # the window's tokens, gathered by hand and left-aligned into contiguous buffers
    k = torch.zeros(len(lens), w, 2, 64)
    v = torch.zeros(len(lens), w, 2, 64)
    for b, n in enumerate(lens):
        for i, p in enumerate(range(max(0, n - w), n)):
            blk = int(bt[b, p // 8])
            k[b, i], v[b, i] = kc[blk, p % 8], vc[blk, p % 8]
    kept = layout.make_seq_lens([min(n, w) for n in lens], device)
    torch.testing.assert_close(out, contiguous_decode(q, k, v, kept, num_splits=1), atol=1e-5, rtol=1e-5)


def test_default_splits_follow_the_window(device, gen):
    c = WindowCase(DecodeCase(F16, 4, 1, 64, 16, (100, 300), 1), 64, "pad")
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, window=64)  # heuristic split count from min(L, W)
    torch.testing.assert_close(out, reference.ref_paged_decode(q, kc, vc, bt, sl, window=64),
                               atol=1.5e-2, rtol=1e-2)


def test_bad_window_raises(device):
    q = torch.zeros(1, 4, 64)
    kc = torch.zeros(2, 16, 4, 64)
    with pytest.raises(ValueError, match="window must be >= 1"):
        paged_decode(q, kc, kc, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), window=0)
    with pytest.raises(ValueError, match="null must be one of"):
        window_inputs(WindowCase(DecodeCase(F32, 4, 4, 64, 16, (3,), 1), 2, "zero"), device, None)


def test_full_grid_covers_window_starts_and_null_kinds(monkeypatch):
    """The GPU grid (not run here) holds, per block size, windows that start before 0, mid-block and on
    a later block boundary, both null kinds, both split settings, and the int32-overflow cache."""
    import gpu_harness.check_hybrid as ch
    cases = []
    monkeypatch.setattr(ch, "check_window", lambda c, device, gen: cases.append(c))
    monkeypatch.setattr(ch, "check_mla", lambda c, device, gen: None)
    ch._full_grid("cpu", None)
    for w, sizes in ((128, (1, 16, 32)), (1024, (16, 32))):
        for bs in sizes:
            mine = [c for c in cases if c.window == w and c.decode.block_size == bs and not c.chunked]
            starts = {layout.window_start(n, w) for c in mine for n in c.decode.seq_lens}
            assert 0 in starts and any(s > 0 and s % bs == 0 for s in starts)
            assert bs == 1 or any(s % bs for s in starts)
            assert {c.null for c in mine} == {"pad", "null0"} and {c.decode.splits for c in mine} == {1, 8}
    assert any(c.decode.table == "high" for c in cases)
