"""Write new tokens' K and V into the paged caches through a slot mapping (vLLM reshape_and_cache).

Grid (num_tokens, cdiv(H_kv * D, TILE)). Slots are loaded as int64 (so `block * block_stride` cannot
overflow int32); a negative slot marks a padding token and the program returns without writing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_harness.kernels import heuristics as hp


@triton.jit
def _store_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_key, stride_value, stride_kb, stride_kt, stride_vb, stride_vt,
                     row_elems, PAGE_SIZE: tl.constexpr, TILE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // PAGE_SIZE
    row = slot % PAGE_SIZE
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)  # [TILE] index into the H_kv*D row
    mask = offs < row_elems
    k = tl.load(key_ptr + token.to(tl.int64) * stride_key + offs, mask=mask)
    v = tl.load(value_ptr + token.to(tl.int64) * stride_value + offs, mask=mask)
    tl.store(k_cache_ptr + block * stride_kb + row * stride_kt + offs, k, mask=mask)
    tl.store(v_cache_ptr + block * stride_vb + row * stride_vt + offs, v, mask=mask)


def _row_contiguous(t: torch.Tensor) -> bool:
    """True when the last two dims of t (heads, head_dim) are packed, so one row is H_kv*D elements."""
    return t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k_cache/v_cache[slot // bs, slot % bs] = key/value[i] for every token i with slot >= 0 (in place).

    key, value: [num_tokens, H_kv, D]; k_cache, v_cache: [num_blocks, block_size, H_kv, D];
    slot_mapping: [num_tokens] int64 (-1 = padding). Dtypes of key and cache must match.
    """
    num_tokens, kv_heads, head_dim = key.shape
    if value.shape != key.shape or k_cache.shape[2:] != key.shape[1:] or v_cache.shape != k_cache.shape:
        raise ValueError(f"shape mismatch: key {tuple(key.shape)}, value {tuple(value.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    if key.dtype != k_cache.dtype or value.dtype != v_cache.dtype:
        raise ValueError(f"dtype mismatch: key {key.dtype}, cache {k_cache.dtype}")
    if not all(_row_contiguous(t) for t in (key, value, k_cache, v_cache)):
        raise ValueError("the (H_kv, D) part of key, value and the caches must be contiguous")
    if num_tokens == 0:
        return
    row_elems = kv_heads * head_dim
    tile = hp.store_tile(row_elems)
    _store_kv_kernel[(num_tokens, triton.cdiv(row_elems, tile))](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), value.stride(0), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), row_elems,
        PAGE_SIZE=k_cache.shape[1], TILE=tile)
