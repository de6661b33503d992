"""Paged and contiguous decode kernels against the torch reference, plus metamorphic checks.

Every case runs a batch with contexts 1, bs-1, bs and bs+1, so each covers the page-boundary lengths.
Cases are picked so that every dtype, GQA group (1, 4, 8, and 5 and 20 across DECODE_BLOCK_H chunks),
head dim (64, 80, 128), block size (8, 16, 32) and split factor (1, 2) appears.
"""

import pytest
import torch

from gpu_harness import layout, reference
from gpu_harness.check import TOLERANCE, DecodeCase, decode_inputs
from gpu_harness.kernels import contiguous_decode, paged_decode

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

CASES = [  # dtype, q_heads, kv_heads, head_dim, block_size, splits
    (F32, 2, 2, 64, 8, 1), (F32, 8, 2, 80, 16, 2), (F32, 8, 1, 128, 32, 1),
    (F16, 4, 4, 80, 32, 2), (F16, 8, 2, 128, 8, 1), (F16, 8, 1, 64, 16, 1),
    (BF16, 2, 2, 128, 16, 1), (BF16, 8, 2, 64, 32, 2), (BF16, 8, 1, 80, 8, 1),
    (F16, 5, 1, 64, 16, 1), (BF16, 20, 1, 64, 8, 2),
]


def _ids(case):
    dt, hq, hk, d, bs, s = case
    return f"{str(dt)[6:]}-h{hq}/{hk}-d{d}-bs{bs}-s{s}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_paged_decode_matches_reference(case, device, gen):
    dtype, hq, hk, d, bs, splits = case
    c = DecodeCase(dtype, hq, hk, d, bs, (1, bs - 1, bs, bs + 1), splits)
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, num_splits=splits)
    assert out.dtype == dtype and out.shape == q.shape
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference.ref_paged_decode(q, kc, vc, bt, sl), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype,hq,hk,d,splits", [(F32, 8, 2, 80, 1), (F16, 8, 1, 64, 2),
                                                  (BF16, 4, 4, 128, 3)])
def test_contiguous_decode_matches_reference(dtype, hq, hk, d, splits, device, gen):
    lens = [1, 31, 33, 50]
    k = torch.randn(4, 50, hk, d, generator=gen).to(device, dtype)
    v = torch.randn(4, 50, hk, d, generator=gen).to(device, dtype)
    q = torch.randn(4, hq, d, generator=gen).to(device, dtype)
    sl = layout.make_seq_lens(lens, device)
    out = contiguous_decode(q, k, v, sl, num_splits=splits)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference.ref_contiguous_decode(q, k, v, sl), atol=atol, rtol=rtol)


def _same_tokens(c: DecodeCase, other: DecodeCase, device, gen):
    """Outputs of the paged kernel for the same logical K/V laid out as `c` and as `other`."""
    q, kc, vc, bt, sl, tables = decode_inputs(c, device, gen)
    _, kc2, vc2, bt2, sl2, tables2 = decode_inputs(other, device, gen)
    for src, dst in ((kc, kc2), (vc, vc2)):
        layout.scatter_to_paged(layout.gather_contiguous(src, c.seq_lens, tables), c.seq_lens, tables2, dst)
    return (paged_decode(q, kc, vc, bt, sl, num_splits=c.splits),
            paged_decode(q, kc2, vc2, bt2, sl2, num_splits=other.splits), (q, kc, vc, sl, tables))


def test_permuted_table_equals_sequential(device, gen):
    lens = (9, 40)
    a, b, _ = _same_tokens(DecodeCase(BF16, 8, 2, 64, 8, lens, 1, "sequential"),
                           DecodeCase(BF16, 8, 2, 64, 8, lens, 1, "permuted"), device, gen)
    assert torch.equal(a, b)  # same tiles, same arithmetic: bit-identical


def test_block_size_8_equals_32(device, gen):
    lens = (17, 40)
    a, b, _ = _same_tokens(DecodeCase(F16, 8, 2, 80, 8, lens, 1), DecodeCase(F16, 8, 2, 80, 32, lens, 1),
                           device, gen)
    assert torch.equal(a, b)


def test_split_and_unsplit_agree_with_contiguous(device, gen):
    lens = (1, 70, 100)
    unsplit, split, (q, kc, vc, sl, tables) = _same_tokens(
        DecodeCase(F32, 8, 2, 64, 16, lens, 1), DecodeCase(F32, 8, 2, 64, 16, lens, 4), device, gen)
    torch.testing.assert_close(split, unsplit, atol=1e-5, rtol=1e-5)
    k = layout.gather_contiguous(kc, lens, tables)
    v = layout.gather_contiguous(vc, lens, tables)
    torch.testing.assert_close(contiguous_decode(q, k, v, sl, num_splits=1), unsplit, atol=1e-5, rtol=1e-5)


def test_empty_sequence_gives_zeros(device, gen):
    c = DecodeCase(F32, 4, 2, 64, 16, (0, 5), 1)
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    for splits in (1, 2):
        out = paged_decode(q, kc, vc, bt, sl, num_splits=splits)
        assert out[0].abs().sum() == 0
        torch.testing.assert_close(out, reference.ref_paged_decode(q, kc, vc, bt, sl), atol=1e-4, rtol=1e-4)


def test_bad_shapes_raise(device):
    q = torch.zeros(1, 6, 64)
    kc = torch.zeros(2, 16, 4, 64)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        paged_decode(q, kc, kc, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
