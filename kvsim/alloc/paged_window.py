"""The paged allocator's fast-forward: many decode steps of a steady batch at once, with the blocks
taken in the same order and the same memory after each step as `append_each` one step at a time.
A mixin of `PagedAllocator` (it reads and updates the allocator's sequences and counters).
"""

from __future__ import annotations

from typing import Sequence

from .base import MemoryStats


class PagedWindows:
    """`decode_window` / `append_steps` of `PagedAllocator` (see kvsim/step.py for the windows)."""

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` `append_steps` can run at once:
        while the free blocks last, with no copy-on-write, no prefix block filled and no sequence
        passing its final length. 0 while a partly filled block is shared."""
        if self._shared_partial or max_steps < 1:
            return 0
        bs, seqs = self.block_size, self._seqs
        steps, rooms = max_steps, []
        for seq_id in seq_ids:
            seq = seqs[seq_id]
            tokens = seq.tokens
            if tokens // bs < len(seq.hashes):
                return 0
            if seq.final - tokens < steps:
                steps = seq.final - tokens
            rooms.append(len(seq.table) * bs - tokens)    # appends before it needs a block: 0..bs-1
        if steps < 1 or not rooms:
            return max(steps, 0)
        # sequence s needs blocks at steps rooms[s], rooms[s] + bs, ...: in each round of bs steps
        # every sequence takes one, in order of room; the first step without a free block ends it
        rounds, rank = divmod(self.num_free_blocks, len(rooms))
        rooms.sort()
        return min(steps, rooms[rank] + rounds * bs)

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` (blocks taken in the same order), within what
        `decode_window` allowed; returns `stats()` after each step."""
        bs = self.block_size
        seqs = [self._seqs[s] for s in seq_ids]
        crossing: list[list] = [[] for _ in range(steps)]   # step -> sequences needing a block
        for seq in seqs:
            for j in range(len(seq.table) * bs - seq.tokens, steps, bs):
                crossing[j].append(seq)
        snapshots, num = [], len(seqs)
        for crossed in crossing:
            if crossed:
                for seq in crossed:
                    held = len(seq.table) * bs
                    seq.table.append(self._take())
                    self._sum_reach += min(seq.final, held + bs) - min(seq.final, held)
                self._sum_blocks += len(crossed)
            self._sum_tokens += num
            snapshots.append(self.stats())
        cache = self._cache
        for seq in seqs:
            if cache is not None and (seq.tokens + steps) // bs > seq.tokens // bs:
                self._register(seq, seq.tokens // bs, (seq.tokens + steps) // bs)   # order-free
            seq.tokens += steps
        return snapshots
