"""Plain torch references for every kernel (vLLM's `ref_paged_attn` approach): gather K/V by block
table, `repeat_interleave` for GQA, fp32 softmax; Python loops for the cache writes. Slow and obvious."""

from __future__ import annotations

import math

import torch


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
                  ) -> torch.Tensor:
    """One sequence's decode attention in fp32: q [Hq, D], k and v [L, H_kv, D] -> [Hq, D] fp32."""
    group = q.shape[0] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kf = k.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    if k.shape[0] == 0:
        return torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    logits = torch.einsum("hd,lhd->hl", q.float(), kf) * scale  # [Hq, L]
    return torch.einsum("hl,lhd->hd", torch.softmax(logits, dim=-1), vf)


def ref_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None
                     ) -> torch.Tensor:
    """Reference for `paged_decode`: out [B, Hq, D] in q's dtype. Shapes as in the launcher."""
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b, n in enumerate(seq_lens.tolist()):
        ids = block_table[b, : math.ceil(n / bs)].long()
        k = k_cache[ids].flatten(0, 1)[:n]  # [n, H_kv, D]
        v = v_cache[ids].flatten(0, 1)[:n]
        out[b] = ref_attention(q[b], k, v, scale).to(q.dtype)
    return out


def ref_contiguous_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                          scale: float | None = None) -> torch.Tensor:
    """Reference for `contiguous_decode`: q [B, Hq, D], k/v [B, S_max, H_kv, D] -> [B, Hq, D]."""
    out = torch.empty_like(q)
    for b, n in enumerate(seq_lens.tolist()):
        out[b] = ref_attention(q[b], k[b, :n], v[b, :n], scale).to(q.dtype)
    return out


def ref_store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Reference for `store_kv`, in place: a Python loop over tokens, skipping negative slots."""
    bs = k_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            k_cache[slot // bs, slot % bs] = key[i]
            v_cache[slot // bs, slot % bs] = value[i]


def ref_copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Reference for `copy_blocks`, in place: a Python loop over (src, dst) pairs."""
    for src, dst in block_mapping.tolist():
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
