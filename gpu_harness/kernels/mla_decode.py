"""MLA decode attention (DeepSeek-V2/V3, Kimi K2) over the paged latent cache, with absorbed queries.

Per token and layer the cache holds one row of R_L + R_P values: the compressed latent c_kv (R_L =
`kv_lora_rank`, 512 in DeepSeek-V3) then the rope key k_pe (R_P = `qk_rope_head_dim`, 64). It is one
"KV head" shared by every query head (MQA). The decode math is vLLM's "data-movement friendly" path
(`vllm/model_executor/layers/attention/mla_attention.py`, forward_mqa; kernel: the IS_MLA branch of
`vllm/v1/attention/ops/triton_decode_attention.py`): the caller absorbs W_UK into the no-rope query,
ql_nope[h] = q_nope[h] @ W_UK[:, h, :]^T (R_L values), and passes q = [ql_nope | q_pe]. Then

    score[h, t] = scale * (ql_nope[h] . c_kv[t] + q_pe[h] . k_pe[t])
    out[h]      = sum_t softmax_t(score[h, :]) * c_kv[t]          (in latent space, R_L values)

and the caller applies W_UV to `out` afterwards. Values are the latent itself, so each latent tile is
loaded once and used transposed for the value product. Grid (B, ceil(Hq / BLOCK_H), NUM_SPLITS): one
program scores BLOCK_H query heads against each tile with `tl.dot`; pages are looked up per token
position as in `paged_decode`, and the split merge is shared with it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_harness.kernels import heuristics as hp
from gpu_harness.kernels.decode_common import (check_decode_args, dot_options, load_query_block,
                                               merge_splits, output_buffers, resolve_splits,
                                               softmax_update, split_range, write_result)


@triton.jit
def _mla_decode_kernel(
        q_ptr, kv_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr, sm_scale,
        stride_qb, stride_qh, stride_kb, stride_kt,
        stride_tb, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
        num_heads, rank, rope,
        PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
        BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    hblock = tl.program_id(1)
    split = tl.program_id(2)
    # all query heads share the one latent "KV head": kv_head 0, group = num_heads
    q_lat, heads, mask_h = load_query_block(q_ptr, b, 0, hblock, stride_qb, stride_qh, num_heads,
                                            rank, BLOCK_H, BLOCK_L, UPCAST)  # [BLOCK_H, BLOCK_L]
    q_pe, _, _ = load_query_block(q_ptr + rank, b, 0, hblock, stride_qb, stride_qh, num_heads,
                                  rope, BLOCK_H, BLOCK_R, UPCAST)  # [BLOCK_H, BLOCK_R]
    seq_len = tl.load(seq_lens_ptr + b)
    start, end = split_range(0, seq_len, split, NUM_SPLITS, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    mask_l = offs_l < rank
    mask_r = offs_r < rope
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions
        mask_n = pos < end
        page = tl.load(table_ptr + b.to(tl.int64) * stride_tb + pos // PAGE_SIZE, mask=mask_n, other=0)
        row_off = page.to(tl.int64) * stride_kb + (pos % PAGE_SIZE) * stride_kt  # [BLOCK_N] int64
        c_kv = tl.load(kv_ptr + row_off[None, :] + offs_l[:, None],
                       mask=mask_n[None, :] & mask_l[:, None], other=0.0)  # [BLOCK_L, BLOCK_N]
        k_pe = tl.load(kv_ptr + rank + row_off[None, :] + offs_r[:, None],
                       mask=mask_n[None, :] & mask_r[:, None], other=0.0)  # [BLOCK_R, BLOCK_N]
        if UPCAST:
            c_kv = c_kv.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        qk = tl.dot(q_lat, c_kv, input_precision=DOT_PRECISION)
        qk = (qk + tl.dot(q_pe, k_pe, input_precision=DOT_PRECISION)) * sm_scale  # [BLOCK_H, BLOCK_N]
        m_i, l_i, acc = softmax_update(qk, tl.trans(c_kv), mask_n, m_i, l_i, acc, DOT_PRECISION)
    write_result(out_ptr, lse_ptr, b, heads, mask_h, split, acc, m_i, l_i, stride_ob, stride_oh,
                 stride_os, stride_lb, stride_lh, rank, BLOCK_L, NUM_SPLITS)


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, *, kv_lora_rank: int, scale: float,
               num_splits: int | None = None, max_seq_len: int | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """MLA decode over a paged latent cache; returns out [B, Hq, kv_lora_rank] in q's dtype (latent space).

    q: [B, Hq, R_L + R_P], the absorbed no-rope query then the rope query; kv_cache:
    [num_blocks, block_size, R_L + R_P] (c_kv then k_pe, last dim contiguous); block_table:
    [B, max_blocks] int32 (-1 padded); seq_lens: [B] int32. `scale` is the model's softmax scale
    (DeepSeek: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times its YaRN mscale squared), which the
    cache shape does not determine, so it has no default. num_splits, max_seq_len as in `paged_decode`.
    """
    if kv_cache.dim() != 3 or kv_cache.stride(2) != 1:
        raise ValueError(f"kv_cache must be [num_blocks, block_size, rank + rope] with a contiguous last "
                         f"dim, got shape {tuple(kv_cache.shape)}")
    num_blocks, page_size, width = kv_cache.shape
    rope = width - kv_lora_rank
    if kv_lora_rank < 1 or rope < 1:
        raise ValueError(f"kv_cache rows of {width} values cannot hold kv_lora_rank={kv_lora_rank} "
                         f"plus a rope part of >= 1")
    check_decode_args(q, 1, width)
    batch, q_heads, _ = q.shape
    programs = hp.head_programs(q_heads)
    num_splits = resolve_splits(q, programs, seq_lens, num_splits, max_seq_len)
    out, target, lse, so, sl = output_buffers(q, num_splits, out, kv_lora_rank)
    if batch == 0:
        return out
    upcast, precision = dot_options(q.dtype, not q.is_cuda)
    _mla_decode_kernel[(batch, programs, num_splits)](
        q, kv_cache, block_table, seq_lens, target, lse, scale,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        block_table.stride(0), *so, *sl,
        q_heads, kv_lora_rank, rope,
        PAGE_SIZE=page_size, BLOCK_H=hp.DECODE_BLOCK_H, BLOCK_N=hp.DECODE_BLOCK_N,
        BLOCK_L=hp.head_dim_block(kv_lora_rank), BLOCK_R=hp.head_dim_block(rope),
        NUM_SPLITS=num_splits, UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=hp.DECODE_NUM_WARPS, num_stages=hp.mla_num_stages(kv_lora_rank, kv_cache.element_size()))
    if num_splits > 1:
        merge_splits(target, lse, out)
    return out
