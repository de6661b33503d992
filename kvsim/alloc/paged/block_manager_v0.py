"""What vLLM 0.1.4's `BlockSpaceManager` (vllm/core/block_manager.py, August 2023) does that the paged
allocator's own interface lacks, as functions over a `kvsim.alloc.paged.allocator.PagedAllocator` without a
prefix cache. Plain Python, no SimPy. Units: blocks and token slots.

- Swap keeps sharing: `swap_out` moves a request's distinct blocks to CPU memory once (its samples'
  shared prompt blocks are one copy) and `swap_in` takes as many GPU blocks and rebuilds every
  sequence's table with the same sharing (0.1.4 `swap_out` / `swap_in` map each physical block once).
- `reserve_window`: how many decode steps a batch runs while the free list keeps at least one block per
  running sequence at every step's start (what `can_append_slot` asks of each group in turn; a sufficient
  condition, so a fast-forward window never runs a step at which vLLM would preempt).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class SwapImage:
    """A swapped-out request in CPU memory: per sequence (tokens, final tokens, table as indices into
    its `blocks` distinct blocks)."""

    blocks: int
    seqs: tuple[tuple[int, int, tuple[int, ...]], ...]


def swap_out(alloc, seq_ids: Sequence[int]) -> SwapImage:
    """Free `seq_ids` (one request's live sequences) from the GPU, keeping their tables' sharing."""
    index: dict[int, int] = {}
    seqs = []
    for s in seq_ids:
        seq = alloc._seq(s)
        table = tuple(index.setdefault(b, len(index)) for b in seq.table)
        seqs.append((seq.tokens, seq.final, table))
    for s in seq_ids:
        alloc.free(s)
    return SwapImage(len(index), tuple(seqs))


def distinct_blocks(alloc, seq_ids: Sequence[int]) -> int:
    """Distinct GPU blocks `seq_ids` hold together (a shared block once: 0.1.4 `_get_physical_blocks`)."""
    return len({b for s in seq_ids for b in alloc._seq(s).table})


def swap_in(alloc, seq_ids: Sequence[int], image: SwapImage) -> None:
    """Give `seq_ids` back their tables from `image`: `image.blocks` fresh blocks, shared as before."""
    from kvsim.alloc.paged.allocator import _Seq

    if alloc._cache is not None:
        raise ValueError("swap with shared tables needs the paged allocator without a prefix cache")
    bs, ref = alloc.block_size, alloc._ref
    blocks = alloc._take_many(image.blocks)
    holders = [0] * image.blocks
    full = [True] * image.blocks
    for (tokens, final, table), s in zip(image.seqs, seq_ids):
        for k, j in enumerate(table):
            holders[j] += 1
            full[j] = (k + 1) * bs <= tokens
        alloc._seqs[s] = _Seq([blocks[j] for j in table], tokens, final, [], s)
        alloc._sum_tokens += tokens
        alloc._sum_reach += min(final, len(table) * bs)
        alloc._sum_blocks += len(table)
    for j, count in enumerate(holders):
        ref[blocks[j]] = count
        if count > 1:
            if full[j]:
                alloc._excess += (count - 1) * bs
            else:
                alloc._shared_partial += 1


def reserve_window(alloc, seq_ids: Sequence[int], max_steps: int) -> int:
    """How many (<= `max_steps`) decode steps of `seq_ids` (unshared last blocks) start with at least
    len(seq_ids) free blocks, the blocks earlier steps take counted (`decode_window`'s rule with that
    many blocks held back)."""
    if alloc._shared_partial or max_steps < 1 or not seq_ids:
        return 0
    bs, seqs = alloc.block_size, alloc._seqs
    spare = alloc.num_free_blocks - len(seq_ids)      # blocks the window's steps may take
    if spare < 0:
        return 0
    rooms = sorted(len(seqs[s].table) * bs - seqs[s].tokens for s in seq_ids)
    rounds, rank = divmod(spare, len(rooms))
    return min(max_steps, rooms[rank] + rounds * bs)
