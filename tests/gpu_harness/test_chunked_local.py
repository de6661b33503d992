"""Chunked local attention (Llama 4's attention_chunk_size C): a decode at context L attends to the
tokens of its own chunk, [(L-1) // C * C, L), and never reads the (null) entries of earlier blocks."""

import pytest
import torch

from gpu_harness import layout, reference
from gpu_harness.check import TOLERANCE, DecodeCase, decode_inputs
from gpu_harness.check_hybrid import WindowCase, window_inputs
from gpu_harness.kernels import contiguous_decode, paged_decode

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

CASES = [  # dtype, q_heads, kv_heads, head_dim, block_size, chunk, splits, null
    (F32, 4, 2, 64, 4, 8, 1, "pad"), (BF16, 8, 1, 64, 8, 16, 2, "null0"), (F16, 5, 1, 80, 16, 16, 1, "pad"),
]


def _ids(case):
    dt, hq, hk, d, bs, c, s, null = case
    return f"{str(dt)[6:]}-h{hq}/{hk}-d{d}-bs{bs}-C{c}-s{s}-{null}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_chunked_matches_reference_and_skips_null_entries(case, device, gen):
    dtype, hq, hk, d, bs, chunk, splits, null = case
    # L = C ends the first chunk; C+1 opens the second (one token); 2C+3 and 3C + C/2 are mid-chunk
    lens = (1, chunk, chunk + 1, 2 * chunk + 3, 3 * chunk + chunk // 2)
    c = WindowCase(DecodeCase(dtype, hq, hk, d, bs, lens, splits), chunk, null, chunked=True)
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    assert (bt == (-1 if null == "pad" else 0)).sum() > 0
    out = paged_decode(q, kc, vc, bt, sl, num_splits=splits, chunk=chunk)
    assert not out.isnan().any()
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference.ref_paged_decode(q, kc, vc, bt, sl, chunk=chunk), atol=atol, rtol=rtol)


def test_first_token_of_a_chunk_attends_to_itself_only(device, gen):
    # L = C + 1 and 2C + 1: the query is the chunk's first token, weight 1, out = V[that token]
    c = DecodeCase(F32, 6, 2, 64, 4, (9, 17), 1)
    q, kc, vc, bt, sl, tables = decode_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, chunk=8)
    for b, n in enumerate(c.seq_lens):
        assert torch.equal(out[b], vc[tables[b][(n - 1) // 4], (n - 1) % 4].repeat_interleave(3, dim=0))


def test_chunk_equals_contiguous_decode_of_its_tokens(device, gen):
    chunk, lens = 8, (8, 16, 21)  # chunks [0, 8), [8, 16), [16, 21)
    c = WindowCase(DecodeCase(F32, 8, 2, 64, 4, lens, 2), chunk, "null0", chunked=True)
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    k = torch.zeros(3, chunk, 2, 64)
    v = torch.zeros(3, chunk, 2, 64)
    for b, (n, first) in enumerate(zip(lens, (0, 8, 16))):
        for i, p in enumerate(range(first, n)):
            blk = int(bt[b, p // 4])
            k[b, i], v[b, i] = kc[blk, p % 4], vc[blk, p % 4]
    kept = layout.make_seq_lens([8, 8, 5], device)
    torch.testing.assert_close(paged_decode(q, kc, vc, bt, sl, num_splits=2, chunk=chunk),
                               contiguous_decode(q, k, v, kept, num_splits=1), atol=1e-5, rtol=1e-5)


def test_chunk_longer_than_every_context_equals_full_attention(device, gen):
    c = DecodeCase(BF16, 8, 2, 64, 8, (1, 8, 17, 40), 2)
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    full = paged_decode(q, kc, vc, bt, sl, num_splits=2)
    assert torch.equal(paged_decode(q, kc, vc, bt, sl, num_splits=2, chunk=40), full)


def test_chunk_start_and_tables_by_hand():
    # chunks of 8: L 1..8 read from 0, L 9..16 from 8, L 17 from 16
    assert [layout.chunk_start(n, 8) for n in (0, 1, 8, 9, 16, 17)] == [0, 0, 0, 8, 8, 16]
    # block size 4, chunk 8, L 17: chunk [16, 17) is in block 4, blocks 0-3 null
    assert layout.null_out_of_window([[9, 8, 7, 6, 5]], [17], 4, 8, chunked=True) == [[-1, -1, -1, -1, 5]]
    with pytest.raises(ValueError, match=r"block 3 is null but holds tokens of the window \[8, 13\)"):
        layout.check_window_tables([[-1, -1, 1, -1]], [13], 4, 8, chunked=True)


def test_bad_chunk_raises(device):
    q, kc = torch.zeros(1, 4, 64), torch.zeros(2, 16, 4, 64)
    bt, sl = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        paged_decode(q, kc, kc, bt, sl, chunk=0)
    with pytest.raises(ValueError, match="not both"):
        paged_decode(q, kc, kc, bt, sl, window=4, chunk=8)
