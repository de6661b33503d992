"""MLA decode over the paged latent cache (small dims: rank 32, rope 16) against the torch reference,
against MLA without weight absorption (per-head K and V decompressed from the latent, as vLLM's
forward_mha), and against the GQA paged kernel reading the same rows as one KV head."""

import pytest
import torch

from gpu_harness import layout, reference
from gpu_harness.check import TOLERANCE
from gpu_harness.check_hybrid import MlaCase, mla_inputs
from gpu_harness.kernels import mla_decode, paged_decode

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

CASES = [  # dtype, q_heads, rank, rope, block_size, splits
    (F32, 16, 32, 16, 8, 1), (BF16, 20, 32, 16, 16, 2), (F16, 5, 32, 16, 4, 1), (BF16, 16, 48, 8, 16, 1),
]


def _ids(case):
    dt, h, r, p, bs, s = case
    return f"{str(dt)[6:]}-h{h}-r{r}+{p}-bs{bs}-s{s}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_mla_matches_reference(case, device, gen):
    dtype, h, rank, rope, bs, splits = case
    c = MlaCase(dtype, h, rank, rope, bs, (1, bs - 1, bs, bs + 1, 3 * bs + 2), splits)
    q, kv, bt, sl, scale = mla_inputs(c, device, gen)
    out = mla_decode(q, kv, bt, sl, kv_lora_rank=rank, scale=scale, num_splits=splits)
    assert out.shape == (5, h, rank) and out.dtype == dtype
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out, reference.ref_mla_decode(q, kv, bt, sl, rank, scale), atol=atol, rtol=rtol)


@pytest.mark.parametrize("splits", [1, 2])
def test_absorbed_mla_equals_attention_over_decompressed_heads(splits, device, gen):
    # DeepSeek-style shapes, small: latent 32, rope 16, 6 heads of nope 8 / value 12 dims
    h, rank, rope, nope, vdim, bs, lens = 6, 32, 16, 8, 12, 8, (5, 21)
    scale = (nope + rope) ** -0.5
    w_uk = torch.randn(rank, h, nope, generator=gen) / rank ** 0.5
    w_uv = torch.randn(rank, h, vdim, generator=gen) / rank ** 0.5
    q_nope = torch.randn(len(lens), h, nope, generator=gen)
    q_pe = torch.randn(len(lens), h, rope, generator=gen)
    c_kv = torch.randn(len(lens), max(lens), rank, generator=gen)
    k_pe = torch.randn(len(lens), max(lens), rope, generator=gen)
    tables = layout.permuted_tables(lens, bs, gen)
    cache, _ = layout.alloc_paged_cache(sum(map(len, tables)), bs, 1, rank + rope, F32, device, fill="zeros")
    layout.scatter_to_paged(torch.cat([c_kv, k_pe], -1)[:, :, None, :], lens, tables, cache)
    q = torch.cat([reference.absorb_query(q_nope, w_uk), q_pe], dim=-1).to(device)
    latent = mla_decode(q, cache[:, :, 0], layout.make_block_table(tables, device), layout.make_seq_lens(lens, device),
                        kv_lora_rank=rank, scale=scale, num_splits=splits)
    out = torch.einsum("bhl,lhv->bhv", latent, w_uv)  # W_UV applied after attention, as vLLM's _v_up_proj
    for b, n in enumerate(lens):
        expanded = reference.ref_mla_expanded(q_nope[b], q_pe[b], c_kv[b, :n], k_pe[b, :n], w_uk, w_uv, scale)
        torch.testing.assert_close(out[b], expanded, atol=1e-5, rtol=1e-5)


def test_mla_equals_gqa_kernel_on_one_kv_head(device, gen):
    # the latent cache read as K (all R_L + R_P values) and V (the latent, rope part zeroed), one KV head
    c = MlaCase(F32, 16, 32, 16, 8, (3, 8, 30), 1)
    q, kv, bt, sl, scale = mla_inputs(c, device, gen)
    k_cache = kv[:, :, None, :].contiguous()
    v_cache = k_cache.clone()
    v_cache[..., 32:] = 0
    gqa = paged_decode(q, k_cache, v_cache, bt, sl, num_splits=1, scale=scale)
    assert gqa[..., 32:].abs().max() == 0
    out = mla_decode(q, kv, bt, sl, kv_lora_rank=32, scale=scale, num_splits=1)
    torch.testing.assert_close(out, gqa[..., :32], atol=1e-5, rtol=1e-5)


def test_split_and_unsplit_agree_and_empty_sequence_is_zero(device, gen):
    c = MlaCase(F32, 16, 32, 16, 16, (0, 40, 70), 1)
    q, kv, bt, sl, scale = mla_inputs(c, device, gen)
    one = mla_decode(q, kv, bt, sl, kv_lora_rank=32, scale=scale, num_splits=1)
    four = mla_decode(q, kv, bt, sl, kv_lora_rank=32, scale=scale, num_splits=4)
    torch.testing.assert_close(four, one, atol=1e-5, rtol=1e-5)
    assert one[0].abs().sum() == 0 and four[0].abs().sum() == 0


def test_bad_shapes_raise(device):
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_cache must be"):
        mla_decode(torch.zeros(1, 4, 48), torch.zeros(2, 16, 1, 48), table, lens, kv_lora_rank=32, scale=1.0)
    with pytest.raises(ValueError, match="cannot hold kv_lora_rank=48"):
        mla_decode(torch.zeros(1, 4, 48), torch.zeros(2, 16, 48), table, lens, kv_lora_rank=48, scale=1.0)
    with pytest.raises(ValueError, match="q must be"):
        mla_decode(torch.zeros(1, 4, 40), torch.zeros(2, 16, 48), table, lens, kv_lora_rank=32, scale=1.0)
