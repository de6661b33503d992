"""KV-cache layout and kernel inputs built from allocator state (block ids per sequence), including
the one place a kvsim step plan (`kvsim.engine.step.StepPlan`) becomes kernel inputs (`plan_writes`,
`plan_decodes`, `copy_mapping`).

Caches are NHD: `[num_blocks, block_size, kv_heads, head_dim]`, one tensor for K and one for V (as vLLM's
Triton backends and nano-vllm). Block tables are int32 padded with -1; slot mappings are int64 with
`slot = block_id * block_size + offset` and -1 for padding tokens (skipped by `store_kv`).

A hybrid model has one table per KV cache group (`group_block_tables`). A sliding-window group's table
(`null_out_of_window`) holds a null entry, -1 (as kvsim's hybrid allocator, NULL_BLOCK), for each block
wholly before the window, where vLLM's hybrid KV cache manager puts its null block (id 0); the
sliding-window decode never reads such entries, so either convention works with it, and
`check_window_tables` says whether a table nulls only blocks the window no longer reads.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

PAD = -1


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
    return math.ceil(num_tokens / block_size)


def alloc_paged_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype, device: str | torch.device,
                      fill: str = "empty") -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches, each [num_blocks, block_size, num_kv_heads, head_dim]; fill "empty", "zeros" or "randn"."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    make = {"empty": torch.empty, "zeros": torch.zeros, "randn": torch.randn}[fill]
    return make(shape, dtype=dtype, device=device), make(shape, dtype=dtype, device=device)


def make_block_table(tables: Sequence[Sequence[int]], device: str | torch.device,
                     max_blocks: int | None = None) -> torch.Tensor:
    """Block table [num_seqs, max_blocks] int32 from per-sequence block ids, padded with -1.

    `max_blocks` defaults to the longest table (at least 1); a longer table raises ValueError.
    """
    width = max([len(t) for t in tables] + [1]) if max_blocks is None else max_blocks
    rows = []
    for i, t in enumerate(tables):
        if len(t) > width:
            raise ValueError(f"sequence {i} has {len(t)} blocks, more than max_blocks={width}")
        rows.append(list(t) + [PAD] * (width - len(t)))
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(tables), width)


def window_start(seq_len: int, window: int) -> int:
    """First token position a decode with context `seq_len` attends to under a sliding window of
    `window` tokens: max(0, seq_len - window) (vLLM: query position L-1 sees keys with L-1 - pos < W)."""
    return max(0, seq_len - window)


def chunk_start(seq_len: int, chunk: int) -> int:
    """First token position a decode with context `seq_len` attends to under chunked local attention
    with chunks of `chunk` tokens: its own chunk's start, (seq_len - 1) // chunk * chunk (vLLM:
    ChunkedLocalAttentionManager.get_num_skipped_tokens of the seq_len - 1 computed tokens)."""
    return max(seq_len - 1, 0) // chunk * chunk


def null_out_of_window(tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int,
                       window: int, null: int = PAD, chunked: bool = False) -> list[list[int]]:
    """Tables as a sliding-window KV cache group holds them at decode: the entries of blocks wholly
    before each sequence's window (block index < window_start // block_size) replaced by `null`.
    With `chunked`, `window` is a local-attention chunk size and the start is `chunk_start`."""
    if window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    out = []
    for ids, n in zip(tables, seq_lens, strict=True):
        first = (chunk_start(n, window) if chunked else window_start(n, window)) // block_size
        out.append([null if j < first else b for j, b in enumerate(ids)])
    return out


def check_window_tables(tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int,
                        window: int, chunked: bool = False) -> None:
    """ValueError naming the sequence and block when a table nulls (negative entry) a block that holds a
    token of its window [max(0, L-W), L) (with `chunked`: of its chunk, from `chunk_start`), which the
    decode would read, or has too few entries for its L tokens. Null entries before are fine."""
    for i, (ids, n) in enumerate(zip(tables, seq_lens, strict=True)):
        if len(ids) < blocks_needed(n, block_size):
            raise ValueError(f"sequence {i}: {len(ids)} blocks cannot hold its {n} tokens")
        start = chunk_start(n, window) if chunked else window_start(n, window)
        for j in range(start // block_size, blocks_needed(n, block_size)):
            if ids[j] < 0:
                raise ValueError(f"sequence {i}: block {j} is null but holds tokens of the window "
                                 f"[{start}, {n})")


def group_block_tables(seq_tables: Sequence[Sequence[Sequence[int]]], device: str | torch.device,
                       max_blocks: Sequence[int] | None = None) -> list[torch.Tensor]:
    """One block table per KV cache group (vLLM's hybrid manager: one table per group and request).

    seq_tables[i][g] are sequence i's block ids in group g (as `HybridAllocator.group_block_tables`
    gives them, null entries -1); returns, per group, `make_block_table` of its rows: [num_seqs,
    max_blocks[g]] int32 with null entries kept and the tail padded with -1 (PAD). Every sequence must
    have the same number of groups; with no sequences there are no groups.
    """
    groups = {len(t) for t in seq_tables}
    if len(groups) > 1:
        raise ValueError(f"sequences have different numbers of KV cache groups: {sorted(groups)}")
    num_groups = groups.pop() if groups else 0
    if max_blocks is not None and len(max_blocks) != num_groups:
        raise ValueError(f"max_blocks has {len(max_blocks)} entries for {num_groups} groups")
    return [make_block_table([t[g] for t in seq_tables], device, None if max_blocks is None else max_blocks[g])
            for g in range(num_groups)]


def make_seq_lens(lengths: Sequence[int], device: str | torch.device) -> torch.Tensor:
    """Context lengths [num_seqs] int32 (tokens whose K/V the decode step reads, the new one included)."""
    return torch.tensor(list(lengths), dtype=torch.int32, device=device)


def slots_for(block_ids: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of token positions [start, end) of a sequence with table `block_ids`: id*bs + pos % bs.

    A position whose entry is null (negative: a block a sliding window skipped) raises ValueError.
    """
    if end > len(block_ids) * block_size:
        raise ValueError(f"position {end - 1} is past the {len(block_ids)} blocks of the table")
    if end > start:
        first = start // block_size
        nulls = [j for j, b in enumerate(block_ids[first:(end - 1) // block_size + 1], first) if b < 0]
        if nulls:
            raise ValueError(f"positions [{start}, {end}) reach block {nulls[0]} of the table, a null entry")
    return [block_ids[p // block_size] * block_size + p % block_size for p in range(start, end)]


def make_slot_mapping(spans: Sequence[tuple[Sequence[int], int, int]], block_size: int,
                      device: str | torch.device, pad_to: int | None = None) -> torch.Tensor:
    """Slot mapping [num_tokens] int64 for new tokens; each span is (block_ids, start, end) of one sequence.

    Tokens are in span order; `pad_to` appends -1 entries up to that length (padding, a no-op in store_kv).
    """
    slots = [s for ids, start, end in spans for s in slots_for(ids, start, end, block_size)]
    if pad_to is not None:
        if pad_to < len(slots):
            raise ValueError(f"pad_to={pad_to} is shorter than the {len(slots)} tokens")
        slots += [PAD] * (pad_to - len(slots))
    return torch.tensor(slots, dtype=torch.int64, device=device)


def sequential_tables(seq_lens: Sequence[int], block_size: int) -> list[list[int]]:
    """Block ids 0, 1, 2, ... handed out in sequence order (what a fresh allocator would give)."""
    tables, nxt = [], 0
    for n in seq_lens:
        k = blocks_needed(n, block_size)
        tables.append(list(range(nxt, nxt + k)))
        nxt += k
    return tables


def permuted_tables(seq_lens: Sequence[int], block_size: int, generator: torch.Generator,
                    num_blocks: int | None = None) -> list[list[int]]:
    """Unique block ids drawn from a random permutation of range(num_blocks) (default: exactly enough)."""
    need = sum(blocks_needed(n, block_size) for n in seq_lens)
    num_blocks = need if num_blocks is None else num_blocks
    if num_blocks < need:
        raise ValueError(f"{need} blocks needed, only {num_blocks} in the cache")
    perm = torch.randperm(num_blocks, generator=generator)[:need].tolist()
    tables, nxt = [], 0
    for n in seq_lens:
        k = blocks_needed(n, block_size)
        tables.append(perm[nxt:nxt + k])
        nxt += k
    return tables


def scatter_to_paged(k: torch.Tensor, seq_lens: Sequence[int], tables: Sequence[Sequence[int]],
                     cache: torch.Tensor) -> None:
    """Copy contiguous per-sequence K (or V) into a paged cache in place.

    k: [num_seqs, S_max, kv_heads, head_dim]; cache: [num_blocks, block_size, kv_heads, head_dim].
    """
    bs = cache.shape[1]
    flat = cache.view(-1, cache.shape[2], cache.shape[3])  # [num_blocks*bs, kv_heads, head_dim]
    for i, (n, ids) in enumerate(zip(seq_lens, tables)):
        slots = torch.tensor(slots_for(ids, 0, n, bs), dtype=torch.int64, device=cache.device)
        flat[slots] = k[i, :n]


def gather_contiguous(cache: torch.Tensor, seq_lens: Sequence[int], tables: Sequence[Sequence[int]]
                      ) -> torch.Tensor:
    """The inverse of `scatter_to_paged`: [num_seqs, max(seq_lens), kv_heads, head_dim], zero padded."""
    bs = cache.shape[1]
    flat = cache.view(-1, cache.shape[2], cache.shape[3])  # [num_blocks*bs, kv_heads, head_dim]
    out = cache.new_zeros((len(seq_lens), max(seq_lens, default=0), cache.shape[2], cache.shape[3]))
    for i, (n, ids) in enumerate(zip(seq_lens, tables)):
        slots = torch.tensor(slots_for(ids, 0, n, bs), dtype=torch.int64, device=cache.device)
        out[i, :n] = flat[slots]
    return out


# ---- a kvsim step plan as kernel inputs ------------------------------------------------------------

def plan_writes(plan, seq_ids: Callable[[int], Sequence[int]], computed: Callable[[int], int]
                ) -> list[tuple[int, int, int, bool]]:
    """The K/V writes of one step as (seq, start, end, fresh) token ranges: each prefill chunk (into
    the request's first sequence; samples fork from it), each swapped-in sequence's earlier tokens
    (restored, not fresh), each decoding sequence's new token. `seq_ids(request)` are its sequences,
    `computed(request)` its tokens computed once the step's chunk or token is in."""
    writes = []
    for r, chunk in plan.prefills:
        end = computed(r)
        writes.append((seq_ids(r)[0], end - chunk, end, True))
    swapped_in = set(plan.swapped_in)
    for r in plan.decodes:
        kv = computed(r)
        for seq in seq_ids(r):
            if r in swapped_in:
                writes.append((seq, 0, kv - 1, False))
            writes.append((seq, kv - 1, kv, True))
    return writes


def writes_slot_mapping(writes: Sequence[tuple[int, int, int, bool]], tables: dict[int, Sequence[int]],
                        block_size: int, device: str | torch.device) -> torch.Tensor:
    """Slot mapping [T] int64 of `plan_writes`' tokens, in order, through the plan's block tables."""
    return make_slot_mapping([(tables[seq], a, b) for seq, a, b, _ in writes], block_size, device)


def plan_decodes(plan, seq_ids: Callable[[int], Sequence[int]], computed: Callable[[int], int],
                 tables: dict[int, Sequence[int]], device: str | torch.device
                 ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(decoding sequences, block table [B, max_blocks] int32, context lengths [B] int32) of one step."""
    seqs, lens = [], []
    for r in plan.decodes:
        for seq in seq_ids(r):
            seqs.append(seq)
            lens.append(computed(r))
    return seqs, make_block_table([tables[s] for s in seqs], device), make_seq_lens(lens, device)


def copy_mapping(pairs: Sequence[tuple[int, int]], device: str | torch.device) -> torch.Tensor:
    """The plan's copy-on-write pairs as the `copy_blocks` mapping [P, 2] int64 (src, dst)."""
    return torch.tensor(list(pairs), dtype=torch.int64, device=device).reshape(-1, 2)
