"""Paged decode attention: one query token per sequence, K/V gathered through a block table.

Grid (B, H_kv * ceil(group / BLOCK_H), NUM_SPLITS). A tile of BLOCK_N token positions may span several
pages: the page of each position is looked up (`block_table[b, pos // PAGE_SIZE]`), as in vLLM's unified
Triton kernel, so the page size is independent of the tile shape (page size 1 works).
Page offsets are computed in int64, so `block_id * block_stride` cannot overflow int32.

Sliding window (`window=W`, as vLLM's sliding-window layers): the query at position L-1 attends to the
last W tokens, positions [max(0, L-W), L) (vLLM: FlashAttention's window_size=(W-1, 0), the Triton
unified kernel's `dist < SLIDING_WINDOW`). The hybrid KV cache manager frees the blocks wholly before
the window and puts a null entry in their place (vLLM: its null block, id 0; kvsim's layout: -1).
The kernel never reads those entries, whatever they hold: its loop starts at the tile holding the
window's first token, and the positions before the window in that tile are masked, so neither their
table entries nor their K/V are loaded.

Chunked local attention (`chunk=C`, Llama 4's `attention_chunk_size`) is the same with another first
position: the query at L-1 attends to its own chunk, positions [(L-1) // C * C, L) (vLLM runs Llama 4's
chunked layers as one virtual batch per chunk, `make_local_attention_virtual_batches`; the unified
kernel's chunk_lookback=0 mask selects the same tokens; ChunkedLocalAttentionManager nulls the blocks
before the chunk).
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
def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr, sm_scale,
        stride_qb, stride_qh,
        stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
        stride_tb, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
        group, head_dim,
        PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
        span, SPAN_KIND: tl.constexpr):  # SPAN_KIND 0: full; 1: window of `span`; 2: chunks of `span`
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // tl.cdiv(group, BLOCK_H)
    hblock = tl.program_id(1) % tl.cdiv(group, BLOCK_H)
    split = tl.program_id(2)
    q, heads, mask_h = load_query_block(q_ptr, b, kv_head, hblock, stride_qb, stride_qh, group,
                                        head_dim, BLOCK_H, BLOCK_D, UPCAST)  # q [BLOCK_H, BLOCK_D]
    seq_len = tl.load(seq_lens_ptr + b)
    if SPAN_KIND == 0:
        start, end = split_range(0, seq_len, split, NUM_SPLITS, BLOCK_N)
    else:
        if SPAN_KIND == 1:
            first = tl.maximum(seq_len - span, 0)  # the window's first token position
        else:
            first = tl.maximum(seq_len - 1, 0) // span * span  # the current chunk's first position
        start, end = split_range(first // BLOCK_N * BLOCK_N, seq_len, split, NUM_SPLITS, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions
        mask_n = pos < end
        if SPAN_KIND != 0:
            mask_n = mask_n & (pos >= first)  # never load a table entry before the window or chunk
        page = tl.load(table_ptr + b.to(tl.int64) * stride_tb + pos // PAGE_SIZE, mask=mask_n, other=0)
        page = page.to(tl.int64)
        row = pos % PAGE_SIZE
        k_off = page * stride_kb + row * stride_kt + kv_head * stride_kh  # [BLOCK_N] int64
        v_off = page * stride_vb + row * stride_vt + kv_head * stride_vh
        k = tl.load(k_ptr + k_off[None, :] + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        v = tl.load(v_ptr + v_off[:, None] + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        m_i, l_i, acc = attend_tile(q, k, v, mask_n, m_i, l_i, acc, sm_scale, UPCAST, DOT_PRECISION)
    write_result(out_ptr, lse_ptr, b, heads, mask_h, split, acc, m_i, l_i, stride_ob, stride_oh,
                 stride_os, stride_lb, stride_lh, head_dim, BLOCK_D, NUM_SPLITS)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                 num_splits: int | None = None, max_seq_len: int | None = None,
                 scale: float | None = None, out: torch.Tensor | None = None,
                 window: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """Decode attention over a paged cache; returns out [B, Hq, D] in q's dtype.

    q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, H_kv, D] (NHD, last dim contiguous);
    block_table: [B, max_blocks] int32 (-1 padded); seq_lens: [B] int32 (context length L, >= 0).
    window: sliding window W in tokens (None: full attention); each sequence attends to its last
    min(L, W) tokens, and table entries of blocks wholly before them may be null (any value, never read).
    chunk: chunked local attention with chunks of C tokens (None: off): each sequence attends to the
    tokens of its current chunk, [(L-1) // C * C, L); entries before that chunk may be null likewise.
    num_splits: split-KV factor (default: heuristics.num_kv_splits from the tokens attended, read from
    seq_lens, a device sync, when `max_seq_len` is not given). scale defaults to 1/sqrt(D).
    """
    num_blocks, page_size, kv_heads, head_dim = k_cache.shape
    group = check_decode_args(q, kv_heads, head_dim)
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache and v_cache must have the same NHD shape with contiguous head_dim")
    for name, value in (("window", window), ("chunk", chunk)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 token, got {value}")
    if window is not None and chunk is not None:
        raise ValueError("give a sliding window or a chunk size, not both")
    span = window if chunk is None else chunk
    batch, q_heads, _ = q.shape
    programs = kv_heads * hp.head_programs(group)
    num_splits = resolve_splits(q, programs, seq_lens, num_splits, max_seq_len, span)
    out, target, lse, so, sl = output_buffers(q, num_splits, out)
    if batch == 0:
        return out
    upcast, precision = dot_options(q.dtype, not q.is_cuda)
    _paged_decode_kernel[(batch, programs, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, target, lse,
        1.0 / math.sqrt(head_dim) if scale is None else scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0), *so, *sl,
        group, head_dim,
        PAGE_SIZE=page_size, BLOCK_H=hp.DECODE_BLOCK_H, BLOCK_N=hp.DECODE_BLOCK_N,
        BLOCK_D=hp.head_dim_block(head_dim), NUM_SPLITS=num_splits, UPCAST=upcast,
        DOT_PRECISION=precision, span=span or 0,
        SPAN_KIND=0 if span is None else (1 if chunk is None else 2),
        num_warps=hp.DECODE_NUM_WARPS, num_stages=hp.DECODE_NUM_STAGES)
    if num_splits > 1:
        merge_splits(target, lse, out)
    return out
