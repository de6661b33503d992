"""The paged allocator's growth path: `can_append`, `append` and the batched `append_each` (the
per-sequence decode step), with copy-on-write of a shared partly filled last block and prefix-cache
registration of filled blocks. A mixin of `PagedAllocator` (kvsim/alloc/paged/allocator.py has the invariants).
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.base import AllocationError


class PagedAppends:
    """`can_append`, `append`, `append_each` of `PagedAllocator`."""

    # ---- append (the per-step hot path) --------------------------------------------------------

    def _blocks_needed(self, seq, num_tokens: int) -> int:
        bs = self.block_size
        need = (seq.tokens + num_tokens + bs - 1) // bs - len(seq.table)
        if seq.tokens % bs and self._ref[seq.table[-1]] > 1:
            need += 1     # copy-on-write of the shared, partly filled last block
        return need

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` can grow by `num_tokens` slots: new blocks plus a copy-on-write copy fit."""
        seq = self._seq(seq_id)
        table = seq.table
        if seq.tokens + num_tokens < len(table) * self.block_size and self._ref[table[-1]] == 1:
            return True   # fast path: room left in an unshared last block
        return self._blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` slots; returns [(src, dst)] when its shared, partly filled last
        block had to be copied first, else []."""
        seq = self._seq(seq_id)
        if seq.at >= 0:
            self._untick(seq)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        new_tokens = seq.tokens + num_tokens
        table = seq.table
        if new_tokens < len(table) * self.block_size and self._ref[table[-1]] == 1:
            # fast path: no new block, no copy, no block filled (that may register a prefix hash);
            # reach grows only past the old final length
            seq.tokens = new_tokens
            self._sum_tokens += num_tokens
            if new_tokens > seq.final:
                self._sum_reach += new_tokens - seq.final
                seq.final = new_tokens
            return []
        return self._grow(seq_id, seq, new_tokens)

    def append_each(self, seq_ids: Sequence[int], start: int = 0,
                    copies: list[tuple[int, int]] | None = None) -> int:
        """One slot for each of `seq_ids[start:]` in order, stopping before the first that cannot grow
        (no free block); returns how many grew. Copy-on-write pairs are added to `copies` when given.
        The same as `can_append` + `append` per sequence, in one call (the engine's hot loop)."""
        if self._ticking:                # (not with ticks: they grow the same sequences)
            for seq in map(self._seq, seq_ids):
                if seq.at >= 0:
                    self._untick(seq)
        if not self._shared_partial:     # no partly filled block is shared: no copy-on-write
            return self._append_unshared(seq_ids, start)
        for k in range(start, len(seq_ids)):
            if not self.can_append(seq_ids[k]):
                return k - start
            pairs = self.append(seq_ids[k])
            if pairs and copies is not None:
                copies.extend(pairs)
        return len(seq_ids) - start

    def _append_unshared(self, seq_ids: Sequence[int], start: int) -> int:
        """`append_each` while no partly filled block is shared (so none is copied): the same steps
        with fewer checks, in the order of `seq_ids`."""
        seqs, bs, cache, free, k = self._seqs, self.block_size, self._cache, -1, start
        try:
            for k, seq in enumerate(map(seqs.__getitem__, seq_ids[start:]), start):
                new_tokens = seq.tokens + 1
                room = len(seq.table) * bs - new_tokens
                if room >= 0:
                    seq.tokens = new_tokens
                    if new_tokens > seq.final:
                        self._sum_reach += 1
                        seq.final = new_tokens
                    if not room and cache is not None:         # filled its last block
                        self._register(seq, new_tokens // bs - 1, new_tokens // bs)
                    continue
                if free < 0:
                    free = self.num_free_blocks
                if not free:
                    self._sum_tokens += k - start
                    return k - start
                free -= 1
                held = len(seq.table) * bs
                seq.table.append(self._take())
                seq.tokens = new_tokens
                final = seq.final
                if new_tokens > final:
                    seq.final = final = new_tokens
                self._sum_reach += min(final, held + bs) - min(final, held)
                self._sum_blocks += 1
                if new_tokens == held + bs and cache is not None:   # filled the new block (one-slot blocks)
                    self._register(seq, new_tokens // bs - 1, new_tokens // bs)
        except KeyError:
            bad = next(j for j in range(start, len(seq_ids)) if seq_ids[j] not in seqs)
            self._sum_tokens += bad - start
            raise AllocationError(f"unknown sequence id {seq_ids[bad]}") from None
        self._sum_tokens += len(seq_ids) - start
        return len(seq_ids) - start

    def _grow(self, seq_id: int, seq, new_tokens: int) -> list[tuple[int, int]]:
        """`append` past the fast path: takes blocks past a block boundary, copies a shared partly
        filled last block, registers filled prompt blocks in the prefix cache."""
        bs = self.block_size
        tokens, table = seq.tokens, seq.table
        need = self._blocks_needed(seq, new_tokens - tokens)
        if need > self.num_free_blocks:
            raise AllocationError(f"sequence {seq_id}: {need} blocks needed, {self.num_free_blocks} free")
        reach_before = min(seq.final, len(table) * bs)
        copies = []
        if tokens % bs and self._ref[table[-1]] > 1:
            src = table[-1]
            self._ref[src] -= 1
            if self._ref[src] == 1:
                self._shared_partial -= 1
            table[-1] = dst = self._take()
            copies.append((src, dst))
            need -= 1
        self._sum_blocks += need
        for _ in range(need):
            table.append(self._take())
        seq.tokens = new_tokens
        seq.final = max(seq.final, new_tokens)
        self._sum_tokens += new_tokens - tokens
        self._sum_reach += min(seq.final, len(table) * bs) - reach_before
        if self._cache is not None and new_tokens // bs > tokens // bs:
            self._register(seq, tokens // bs, new_tokens // bs)
        return copies
