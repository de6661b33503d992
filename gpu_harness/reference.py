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
                     block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                     window: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """Reference for `paged_decode`: out [B, Hq, D] in q's dtype. Shapes as in the launcher.

    With a sliding `window` W only positions [max(0, L-W), L) are gathered, with a local-attention
    `chunk` C only [(L-1) // C * C, L); one token at a time through `block_table[b, pos // block_size]`,
    so entries of blocks wholly before those positions are never read.
    """
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b, n in enumerate(seq_lens.tolist()):
        first = 0 if window is None else max(0, n - window)
        first = first if chunk is None else max(0, n - 1) // chunk * chunk
        pos = torch.arange(first, n, device=q.device)
        ids = block_table[b, pos // bs].long()
        k = k_cache[ids, pos % bs]  # [tokens, H_kv, D]
        v = v_cache[ids, pos % bs]
        out[b] = ref_attention(q[b], k, v, scale).to(q.dtype)
    return out


def ref_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                   seq_lens: torch.Tensor, kv_lora_rank: int, scale: float) -> torch.Tensor:
    """Reference for `mla_decode` in fp32, MQA over the latent: q [B, Hq, R_L + R_P] (absorbed), kv_cache
    [num_blocks, bs, R_L + R_P] -> out [B, Hq, R_L] in q's dtype (scores on the whole row, values = c_kv)."""
    bs = kv_cache.shape[1]
    out = q.new_empty((*q.shape[:2], kv_lora_rank))
    for b, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n, device=q.device)
        rows = kv_cache[block_table[b, pos // bs].long(), pos % bs].float()  # [n, R_L + R_P]
        weights = torch.softmax(q[b].float() @ rows.T * scale, dim=-1)  # [Hq, n]
        out[b] = (weights @ rows[:, :kv_lora_rank]).to(q.dtype)
    return out


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """MLA weight absorption (vLLM forward_mqa): ql_nope[b, h] = q_nope[b, h] @ W_UK[:, h, :]^T.

    q_nope [B, Hq, P], W_UK [R_L, Hq, P] -> [B, Hq, R_L] fp32."""
    return torch.einsum("bhp,lhp->bhl", q_nope.float(), w_uk.float())


def ref_mla_expanded(q_nope: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
                     w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """MLA decode for one sequence without absorption (vLLM's "compute friendly" forward_mha): per-head
    K = [c_kv @ W_UK | k_pe], V = c_kv @ W_UV, ordinary attention. q_nope [Hq, P], q_pe [Hq, R_P],
    c_kv [n, R_L], k_pe [n, R_P], W_UK [R_L, Hq, P], W_UV [R_L, Hq, V] -> [Hq, V] fp32."""
    k_nope = torch.einsum("tl,lhp->thp", c_kv.float(), w_uk.float())  # [n, Hq, P]
    v = torch.einsum("tl,lhv->thv", c_kv.float(), w_uv.float())  # [n, Hq, V]
    k = torch.cat([k_nope, k_pe.float()[:, None, :].expand(-1, q_nope.shape[0], -1)], dim=-1)
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)  # [Hq, P + R_P]
    weights = torch.softmax(torch.einsum("hd,thd->ht", q, k) * scale, dim=-1)  # [Hq, n]
    return torch.einsum("ht,thv->hv", weights, v)


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
