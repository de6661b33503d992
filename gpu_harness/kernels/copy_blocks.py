"""Copy-on-write of whole KV blocks: cache[dst] = cache[src] for K and V, given (src, dst) pairs.

Grid (num_pairs, cdiv(block_size * H_kv * D, COPY_TILE)); block offsets in int64.
Destinations must be distinct and not also sources (the copy order is unspecified).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_harness.kernels import heuristics as hp


@triton.jit
def _copy_blocks_kernel(k_ptr, v_ptr, pairs_ptr, stride_kb, stride_vb, block_elems,
                        TILE: tl.constexpr):
    pair = tl.program_id(0)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)  # [TILE] within one block
    mask = offs < block_elems
    k = tl.load(k_ptr + src * stride_kb + offs, mask=mask)
    tl.store(k_ptr + dst * stride_kb + offs, k, mask=mask)
    v = tl.load(v_ptr + src * stride_vb + offs, mask=mask)
    tl.store(v_ptr + dst * stride_vb + offs, v, mask=mask)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """In place: k_cache[dst] = k_cache[src] and v_cache[dst] = v_cache[src] for each row (src, dst).

    k_cache, v_cache: [num_blocks, block_size, H_kv, D], each block contiguous;
    block_mapping: [num_pairs, 2] int64 (or int32), contiguous.
    """
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2 or not block_mapping.is_contiguous():
        raise ValueError(f"block_mapping must be a contiguous [num_pairs, 2] tensor, "
                         f"got {tuple(block_mapping.shape)}")
    if v_cache.shape != k_cache.shape or not (k_cache[0].is_contiguous() and v_cache[0].is_contiguous()):
        raise ValueError("k_cache and v_cache must have the same shape and contiguous blocks")
    if block_mapping.shape[0] == 0:
        return
    block_elems = k_cache[0].numel()
    _copy_blocks_kernel[(block_mapping.shape[0], triton.cdiv(block_elems, hp.COPY_TILE))](
        k_cache, v_cache, block_mapping, k_cache.stride(0), v_cache.stride(0), block_elems,
        TILE=hp.COPY_TILE, num_warps=hp.COPY_NUM_WARPS)
