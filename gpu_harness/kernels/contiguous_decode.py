"""Contiguous decode attention: the paged kernel's math over per-request buffers [B, S_max, H_kv, D].

The baseline for the cost of the paged indirection: same grid, tiles, GQA grouping and split-KV as
`paged_decode`, but token `pos` of sequence `b` is at `b * stride_b + pos * stride_s`, with no table.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_harness.kernels import heuristics as hp
from gpu_harness.kernels.decode_common import (attend_tile, check_decode_args, dot_options,
                                               load_query_block, merge_splits, output_buffers,
                                               resolve_splits, split_range, write_result)


@triton.jit
def _contiguous_decode_kernel(
        q_ptr, k_ptr, v_ptr, seq_lens_ptr, out_ptr, lse_ptr, sm_scale,
        stride_qb, stride_qh,
        stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
        stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
        group, head_dim,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // tl.cdiv(group, BLOCK_H)
    hblock = tl.program_id(1) % tl.cdiv(group, BLOCK_H)
    split = tl.program_id(2)
    q, heads, mask_h = load_query_block(q_ptr, b, kv_head, hblock, stride_qb, stride_qh, group,
                                        head_dim, BLOCK_H, BLOCK_D, UPCAST)  # q [BLOCK_H, BLOCK_D]
    seq_len = tl.load(seq_lens_ptr + b)
    start, end = split_range(0, seq_len, split, NUM_SPLITS, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kv_head * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kv_head * stride_vh
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        mask_n = pos < end
        k = tl.load(k_base + pos[None, :].to(tl.int64) * stride_kt + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vt + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        m_i, l_i, acc = attend_tile(q, k, v, mask_n, m_i, l_i, acc, sm_scale, UPCAST, DOT_PRECISION)
    write_result(out_ptr, lse_ptr, b, heads, mask_h, split, acc, m_i, l_i, stride_ob, stride_oh,
                 stride_os, stride_lb, stride_lh, head_dim, BLOCK_D, NUM_SPLITS)


def contiguous_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, *,
                      num_splits: int | None = None, max_seq_len: int | None = None,
                      scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over contiguous buffers; returns out [B, Hq, D] in q's dtype.

    q: [B, Hq, D]; k, v: [B, S_max, H_kv, D] (last dim contiguous); seq_lens: [B] int32 (<= S_max).
    num_splits, max_seq_len and scale as in `paged_decode` (same heuristics, so the two are comparable).
    """
    batch, _, kv_heads, head_dim = k.shape
    group = check_decode_args(q, kv_heads, head_dim)
    if k.stride(3) != 1 or v.stride(3) != 1 or v.shape != k.shape or q.shape[0] != batch:
        raise ValueError("k and v must both be [B, S_max, H_kv, D] with contiguous head_dim, B = q's batch")
    programs = kv_heads * hp.head_programs(group)
    num_splits = resolve_splits(q, programs, seq_lens, num_splits, max_seq_len)
    out, target, lse, so, sl = output_buffers(q, num_splits, out)
    if batch == 0:
        return out
    upcast, precision = dot_options(q.dtype, not q.is_cuda)
    _contiguous_decode_kernel[(batch, programs, num_splits)](
        q, k, v, seq_lens, target, lse,
        1.0 / math.sqrt(head_dim) if scale is None else scale,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        *so, *sl,
        group, head_dim,
        BLOCK_H=hp.DECODE_BLOCK_H, BLOCK_N=hp.DECODE_BLOCK_N, BLOCK_D=hp.head_dim_block(head_dim),
        NUM_SPLITS=num_splits, UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=hp.DECODE_NUM_WARPS, num_stages=hp.DECODE_NUM_STAGES)
    if num_splits > 1:
        merge_splits(target, lse, out)
    return out
