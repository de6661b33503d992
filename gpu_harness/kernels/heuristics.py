"""Every kernel launch parameter, as fixed heuristics in one place (no autotuning).

Fixed parameters keep calibration runs reproducible and free of tuning sweeps in the timed path (the same
choice as vLLM's `reshape_and_cache` kernels). The numbers follow vLLM/SGLang's grouped decode kernels.
"""

from __future__ import annotations

import triton

#: Query-head rows per decode program: tl.dot needs M >= 16, so small GQA groups are padded up to it.
DECODE_BLOCK_H = 16
#: Tokens per decode tile. A tile may span several pages (the page is looked up per token position).
DECODE_BLOCK_N = 32
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 2
#: Split-KV: aim for this many programs per streaming multiprocessor, and at least this many tokens
#: per split, with at most MAX_SPLITS splits (a power of two, so few kernel variants are compiled).
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_MIN_TOKENS = 256
MAX_SPLITS = 16
#: Elements of one token's K (or V) row copied per store_kv program, and of one block per copy program.
STORE_MAX_TILE = 2048
COPY_TILE = 1024
COPY_NUM_WARPS = 4


def head_dim_block(head_dim: int) -> int:
    """Head dimension padded to a power of two (masked), at least 16 for tl.dot."""
    return max(16, triton.next_power_of_2(head_dim))


def head_programs(group: int) -> int:
    """Decode programs per KV head: the group's query heads in chunks of DECODE_BLOCK_H."""
    return triton.cdiv(group, DECODE_BLOCK_H)


def num_kv_splits(batch: int, kv_programs: int, max_seq_len: int, num_sms: int) -> int:
    """Split-KV (flash-decoding) factor: 1 when batch x KV programs already fill the GPU, else a power of two."""
    programs = batch * kv_programs
    want = triton.cdiv(SPLIT_PROGRAMS_PER_SM * num_sms, max(programs, 1))
    by_len = max(1, max_seq_len // SPLIT_MIN_TOKENS)
    splits = min(want, by_len, MAX_SPLITS)
    return 1 if splits <= 1 else 1 << (splits.bit_length() - 1)


def store_tile(row_elems: int) -> int:
    """store_kv tile: one token's K row (kv_heads*head_dim elements) rounded to a power of two, capped."""
    return min(STORE_MAX_TILE, triton.next_power_of_2(row_elems))


def mla_num_stages(kv_lora_rank: int, elem_bytes: int) -> int:
    """Pipeline stages of the MLA decode kernel: vLLM's grouped decode (`_decode_grouped_att_m_fwd`)
    uses 2, and 1 once a latent tile row is 1024 bf16 values wide, where 2 stages overflow shared
    memory; here the same limit in bytes (2048 per row), so fp32 at rank 512 also gets 1 stage."""
    return 1 if head_dim_block(kv_lora_rank) * elem_bytes >= 2048 else DECODE_NUM_STAGES
