"""Paged KV allocator (vLLM's block manager): fixed-size blocks, a free list, one block table per
sequence, reference counts for sharing (fork, prefix caching) and copy-on-write.

Units: `num_blocks` blocks of `block_size` token slots; lengths in token slots.

Memory follows use, not capacity: blocks below the high-water mark `_top` have been used at least
once; a fresh block is taken at `_top` (ids in increasing order) until capacity is reached, then from
the FIFO `_free` of released blocks. That is the order a free list over all blocks, taken from the
left and refilled on the right, gives, without building it: `--num-blocks 10**12` costs nothing up front.

Invariants (checked by `check_invariants`):
- every block is exactly one of: used (reference count > 0), plain free (in `_free`, or never used:
  id >= `_top`), evictable (free but cached, in the prefix cache); `len(_ref) == _top`;
- `len(table) == ceil(tokens / block_size)` and `tokens <= final` for every sequence;
- a block's reference count equals the number of tables holding it;
- all holders of a block hold it at the same index with the same fill (copy-on-write keeps partly
  filled shared blocks unwritten), so only last blocks are partly filled;
- `_sum_tokens`, `_sum_reach` and `_sum_blocks` equal their sums over live sequences, where a
  sequence's reach is min(final, allocated slots): the slots it holds that it will have filled;
- `_excess` = sum over full blocks of (reference count - 1) x block_size (what those sums count twice),
  `_shared_partial` = the number of partly filled blocks with reference count > 1. A block's fill never
  changes while it is shared, so both are kept exactly at every reference-count change, and `stats()`
  is O(1) unless `_shared_partial` > 0 (a fork's last block before its first copy-on-write).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from .base import AllocationError
from .paged_stats import PagedStats
from .paged_window import PagedTicks, PagedWindows
from .prefix import PrefixCache


@dataclass(slots=True)
class _Seq:
    """A live sequence's mutable state: its block table, slots written, peak slots (>= tokens), the
    chained hashes of its shareable leading blocks (prefix caching only; never mutated, so forks share
    it) and the salt its other full blocks are hashed with (`prefix.unique_hashes`). A ticking
    sequence (`paged_window.PagedTicks`) holds `tokens` as of the allocator's clock `at` (-1: not
    ticking); `key` is its place in the order they started ticking."""

    table: list[int]
    tokens: int
    final: int
    hashes: list[int]
    salt: int = 0
    at: int = -1
    key: int = 0


class PagedAllocator(PagedStats, PagedWindows, PagedTicks):
    """Blocks of `block_size` slots taken from a free list exactly when a sequence's length crosses a
    block boundary; `fork` shares blocks, appending into a shared partly filled block copies it.
    Queries, memory accounting and checks are in `paged_stats.py`, the fast-forward in
    `paged_window.py` (with the lazy ticks of a decoding batch)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.capacity_tokens = num_blocks * block_size
        self._top = 0                      # blocks [0, _top) have been used; the rest never were
        self._free: deque[int] = deque()   # released plain free blocks below _top, taken from the left
        self._ref: list[int] = []          # block id (< _top) -> number of tables holding it
        self._seqs: dict[int, _Seq] = {}
        self._cache = PrefixCache() if prefix_caching else None
        self._sum_tokens = 0
        self._sum_reach = 0
        self._sum_blocks = 0
        self._excess = 0
        self._shared_partial = 0
        self._chained: tuple[object, list[int]] = ((), [])   # last content ids -> their chained hashes
        self._clock, self._ticking, self._joins, self._pending = 0, 0, 0, None   # PagedTicks
        self._due: dict[int, list[_Seq]] = {}
    # ---- allocate / fork / free ----------------------------------------------------------------

    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """Whether a sequence of `num_tokens` slots fits now, its prefix-cache hits counted (the blocks
        it misses plus the evictable blocks it hits must be free). `seq_id`: the id it will have (None: its
        own earlier blocks are not looked up)."""
        if self._cache is None:
            return -(-num_tokens // self.block_size) <= self.num_free_blocks
        return self._hits_cost(num_tokens, block_hashes, seq_id)[1] <= self.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Give `seq_id` blocks for a sequence of `num_tokens` slots, reusing the cached leading blocks
        `cached_tokens` finds (`block_hashes`: one content id per shareable full block; its other full
        blocks are its own, hashed by `seq_id`); returns the cached tokens. `hold_tokens` (chunked
        prefill, default `num_tokens`): slots taken now, the cached ones included; the rest come by
        `append`. Every full block it fills is registered in the prefix cache."""
        if seq_id in self._seqs:
            raise AllocationError(f"sequence id {seq_id} is already allocated")
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        bs = self.block_size
        cache = self._cache
        hashes, hits = self._prefix(num_tokens, block_hashes, seq_id) if cache is not None else ([], [])
        hold = num_tokens if hold_tokens is None else max(hold_tokens, len(hits) * bs)
        if hold < 1 or hold > num_tokens:
            raise AllocationError(f"sequence {seq_id}: hold_tokens {hold_tokens} outside 1..{num_tokens}")
        num_new = -(-hold // bs) - len(hits)
        evictable_hits = sum(cache.is_evictable(b) for b in hits) if hits else 0
        if num_new > self.num_free_blocks - evictable_hits:
            raise AllocationError(f"sequence {seq_id}: {num_new} blocks needed, "
                                  f"{self.num_free_blocks - evictable_hits} free")
        ref = self._ref
        for block in hits:               # hits are full blocks
            if ref[block] == 0:
                cache.reuse(block)
            else:
                self._excess += bs
            ref[block] += 1
        table = hits + self._take_many(num_new)
        final = max(final_tokens, num_tokens)
        seq = self._seqs[seq_id] = _Seq(table, hold, final, hashes, seq_id)
        if cache is not None:
            self._register(seq, len(hits), hold // bs)
        self._sum_tokens += hold
        self._sum_reach += min(final, len(table) * bs)
        self._sum_blocks += len(table)
        return len(hits) * bs

    def can_fork(self, parent_id: int) -> bool:
        """Forking shares every block, so it needs no free block (copy-on-write happens on append)."""
        return parent_id in self._seqs

    def fork(self, parent_id: int, child_id: int) -> None:
        """Make `child_id` share all of `parent_id`'s blocks (reference counts + 1); the blocks it
        fills from now on are its own (hashed by `child_id`)."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise AllocationError(f"sequence id {child_id} is already allocated")
        ref = self._ref
        for block in parent.table:
            ref[block] += 1
        num_full = parent.tokens // self.block_size
        self._excess += num_full * self.block_size
        if num_full < len(parent.table) and ref[parent.table[-1]] == 2:
            self._shared_partial += 1
        self._seqs[child_id] = _Seq(list(parent.table), parent.tokens, parent.final, parent.hashes, child_id)
        self._sum_tokens += parent.tokens
        self._sum_reach += min(parent.final, len(parent.table) * self.block_size)
        self._sum_blocks += len(parent.table)

    def refork(self, parent_id: int, child_id: int) -> int:
        """Make live `child_id` a fork of live `parent_id` (a dead beam replaced by a survivor's fork):
        it drops its blocks (those no one else holds are freed at once) and shares all the parent's.
        Returns 0 slots copied: a shared partly filled last block is copied on the next append."""
        self._seq(parent_id)
        self.free(child_id)
        self.fork(parent_id, child_id)
        return 0

    def free(self, seq_id: int) -> None:
        """Drop `seq_id`'s references; blocks no one holds become free (cached ones evictable, the
        sequence's last block first, so the tail of a prefix is evicted before its head)."""
        seq = self._seq(seq_id)
        if seq.at >= 0:
            self._untick(seq)
        del self._seqs[seq_id]
        ref, cache = self._ref, self._cache
        partial_last = seq.tokens % self.block_size != 0
        if cache is None and not self._excess and not self._shared_partial:   # nothing is shared
            for block in seq.table:
                ref[block] = 0
            self._free.extend(reversed(seq.table))
        else:
            self._release(seq.table, partial_last)
        self._sum_tokens -= seq.tokens
        self._sum_reach -= min(seq.final, len(seq.table) * self.block_size)
        self._sum_blocks -= len(seq.table)

    def _release(self, table: list[int], partial_last: bool) -> None:
        """Drop one reference to each block of `table`, last block first (see `free`)."""
        ref, cache, bs = self._ref, self._cache, self.block_size
        for block in reversed(table):
            ref[block] -= 1
            if ref[block] == 0:
                if cache is None or not cache.park(block):
                    self._free.append(block)
            elif partial_last:
                if ref[block] == 1:
                    self._shared_partial -= 1
            else:
                self._excess -= bs
            partial_last = False

    def _take_many(self, num: int) -> list[int]:
        """`num` blocks as `num` calls of `_take` give them."""
        fresh = min(num, self.num_blocks - self._top)
        blocks = list(range(self._top, self._top + fresh))
        self._top += fresh
        self._ref.extend([1] * fresh)
        rest = num - fresh
        if rest:
            free, ref = self._free, self._ref
            if rest <= len(free):              # released plain free blocks, from the left
                taken = [free.popleft() for _ in range(rest)]
                for block in taken:
                    ref[block] = 1
                blocks += taken
            else:
                blocks += [self._take() for _ in range(rest)]
        return blocks

    def _take(self) -> int:
        """A fresh block with reference count 1: a never used one, else a released plain free one, else
        the LRU evictable one."""
        if self._top < self.num_blocks:
            block = self._top
            self._top += 1
            self._ref.append(1)
            return block
        block = self._free.popleft() if self._free else self._cache.evict_lru()
        self._ref[block] = 1
        return block

    # ---- append (the per-step hot path) --------------------------------------------------------

    def _blocks_needed(self, seq: _Seq, num_tokens: int) -> int:
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
        except KeyError:
            bad = next(j for j in range(start, len(seq_ids)) if seq_ids[j] not in seqs)
            self._sum_tokens += bad - start
            raise AllocationError(f"unknown sequence id {seq_ids[bad]}") from None
        self._sum_tokens += len(seq_ids) - start
        return len(seq_ids) - start

    def _grow(self, seq_id: int, seq: _Seq, new_tokens: int) -> list[tuple[int, int]]:
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
