"""Pieces shared by the paged, contiguous and MLA decode kernels: GQA query block, online-softmax tile
update, split-KV ranges, result write-out, and the split merge kernel (flash-decoding stage 2).

One decode program handles up to DECODE_BLOCK_H query heads that share one KV head, so each K/V tile is
loaded once per group and scored with `tl.dot` on [BLOCK_H, D] x [D, BLOCK_N] (fp32 accumulation).
With NUM_SPLITS > 1 each program covers one slice of the context and writes its normalised partial output
and log-sum-exp (natural log, fp32); `merge_splits` combines them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_harness.kernels import heuristics as hp


@triton.jit
def load_query_block(q_ptr, b, kv_head, hblock, stride_qb, stride_qh, group, head_dim,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """Query rows of one GQA chunk: q [BLOCK_H, BLOCK_D] (padded rows and dims are 0), heads, row mask."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    local = hblock * BLOCK_H + offs_h
    mask_h = local < group
    heads = kv_head * group + local
    ptrs = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(ptrs, mask=mask_h[:, None] & (offs_d < head_dim)[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q, heads, mask_h


@triton.jit
def split_range(lo, hi, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Token range [start, end) of split `split` of [lo, hi): equal slices rounded up to whole tiles.

    `lo` must be a multiple of BLOCK_N (0 for full attention), so every split starts on a tile boundary.
    """
    per_split = tl.cdiv(tl.cdiv(hi - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, hi)
    return start, end


@triton.jit
def attend_tile(q, k, v, mask_n, m_i, l_i, acc, sm_scale,
                UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax update with one tile: q [H, D], k [D, N] (transposed), v [N, D], mask_n [N]."""
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = tl.dot(q, k, input_precision=DOT_PRECISION) * sm_scale  # [BLOCK_H, BLOCK_N] fp32
    return softmax_update(qk, v, mask_n, m_i, l_i, acc, DOT_PRECISION)


@triton.jit
def softmax_update(qk, v, mask_n, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Online-softmax update with one tile's scaled scores qk [H, N] (fp32) and values v [N, Dv].

    Masked tokens (mask_n False) get weight 0; every tile must hold at least one unmasked token.
    """
    qk = tl.where(mask_n[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))  # [BLOCK_H]; finite: every tile has a valid token
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def write_result(out_ptr, lse_ptr, b, heads, mask_h, split, acc, m_i, l_i,
                 stride_ob, stride_oh, stride_os, stride_lb, stride_lh, head_dim,
                 BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Store acc / l: into out [B, Hq, D] when unsplit, else into partial [B, Hq, S, D] and lse [B, Hq, S]."""
    offs_d = tl.arange(0, BLOCK_D)
    safe_l = tl.where(l_i > 0, l_i, 1.0)  # an empty split (or seq_len 0) writes zeros
    res = acc / safe_l[:, None]
    base = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    mask = mask_h[:, None] & (offs_d < head_dim)[None, :]
    if NUM_SPLITS == 1:
        tl.store(base, res.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(base + split * stride_os, res, mask=mask)
        lse = tl.where(l_i > 0, m_i + tl.log(safe_l), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, out_ptr,
                  stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                  head_dim, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (B, Hq): out[b, h] = sum_s w_s * partial[b, h, s] with w_s = softmax over splits of lse."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: weights 0, output 0
    w = tl.exp(lse - m)  # [BLOCK_S]
    ptrs = part_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    part = tl.load(ptrs, mask=mask_s[:, None] & (offs_d < head_dim)[None, :], other=0.0)  # [S, D]
    total = tl.sum(w, 0)
    res = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


def split_buffers(q: torch.Tensor, num_splits: int, out_dim: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [B, Hq, S, Dv] and log-sum-exps [B, Hq, S] for a split launch.

    Dv is `out_dim` (MLA: the latent rank), by default q's last dimension.
    """
    b, h, d = q.shape
    d = d if out_dim is None else out_dim
    part = torch.empty((b, h, num_splits, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((b, h, num_splits), dtype=torch.float32, device=q.device)
    return part, lse


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Merge split partials into out [B, Hq, D] (in place). part [B, Hq, S, D] fp32, lse [B, Hq, S] fp32."""
    b, h, s, d = part.shape
    _merge_kernel[(b, h)](part, lse, out, part.stride(0), part.stride(1), part.stride(2),
                          lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), d,
                          NUM_SPLITS=s, BLOCK_S=triton.next_power_of_2(s),
                          BLOCK_D=triton.next_power_of_2(d))


def check_decode_args(q: torch.Tensor, num_kv_heads: int, head_dim: int) -> int:
    """Validate q [B, Hq, D] against the KV shape; return the GQA group size Hq / H_kv."""
    if q.dim() != 3 or q.shape[2] != head_dim:
        raise ValueError(f"q must be [batch, q_heads, {head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % num_kv_heads:
        raise ValueError(f"q_heads ({q.shape[1]}) must be a multiple of kv_heads ({num_kv_heads})")
    if q.stride(2) != 1:
        raise ValueError("q's last dimension must be contiguous")
    return q.shape[1] // num_kv_heads


def dot_options(dtype: torch.dtype, interpret: bool) -> tuple[bool, str | None]:
    """(UPCAST, DOT_PRECISION): upcast to fp32 under the interpreter (its bf16 tl.dot is broken, triton
    issue 11584); fp32 dots use exact "ieee" precision rather than TF32; None = the target's default."""
    upcast = interpret and dtype != torch.float32
    precise = upcast or dtype == torch.float32
    return upcast, "ieee" if precise else None


def resolve_splits(q: torch.Tensor, programs: int, seq_lens: torch.Tensor, num_splits: int | None,
                   max_seq_len: int | None, span: int | None = None) -> int:
    """The split-KV factor: `num_splits` if given, else the heuristic (reads seq_lens.max() when
    `max_seq_len` is None, a device sync). `programs` is the grid's second axis (KV-head programs);
    `span` (a sliding window or a local-attention chunk) caps the tokens a sequence attends to."""
    if num_splits is not None:
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        return num_splits
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item()) if seq_lens.numel() else 0
    if span is not None:
        max_seq_len = min(max_seq_len, span)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
    return hp.num_kv_splits(q.shape[0], programs, max_seq_len, sms)


def output_buffers(q: torch.Tensor, num_splits: int, out: torch.Tensor | None, out_dim: int | None = None):
    """(out, target, lse, target strides (b, h, split), lse strides (b, h)) for a decode launch.

    Unsplit, the kernel writes `out` [B, Hq, Dv] directly; split, it writes fp32 partials to `target`.
    Dv is `out_dim` (MLA: the latent rank), by default q's last dimension.
    """
    if out is None:
        out = torch.empty_like(q) if out_dim is None else q.new_empty((*q.shape[:2], out_dim))
    if num_splits == 1:
        return out, out, out, (out.stride(0), out.stride(1), 0), (0, 0)
    part, lse = split_buffers(q, num_splits, out_dim)
    return out, part, lse, part.stride()[:3], lse.stride()[:2]
