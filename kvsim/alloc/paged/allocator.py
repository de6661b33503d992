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

from kvsim.alloc.base import AllocationError
from kvsim.alloc.cpu_tier import CpuTier
from kvsim.alloc.paged.append import PagedAppends
from kvsim.alloc.paged.free_list import PagedFreeList
from kvsim.alloc.paged.stats import PagedStats
from kvsim.alloc.paged.tick_steps import PagedTickSteps
from kvsim.alloc.paged.window import PagedTicks, PagedWindows
from kvsim.alloc.paged.prefix import PrefixCache


@dataclass(slots=True)
class _Seq:
    """A live sequence's mutable state: its block table, slots written, peak slots (>= tokens), the
    chained hashes of its shareable leading blocks (prefix caching only; never mutated, so forks share
    it) and the salt its other full blocks are hashed with (`prefix.unique_hashes`). Its own blocks from
    index `own` on (past its shareable blocks, hits and a fork's parent's blocks) are registered when it
    is freed: only its own re-admission could look them up (`free`; `free_finished`: never). A ticking
    sequence (`paged_window.PagedTicks`) holds `tokens` as of the allocator's clock `at` (-1: not
    ticking) and takes its next block at the tick `due` (at + blocks x block_size - tokens; -1: not
    ticking); `key` is its place in the order they started ticking."""

    table: list[int]
    tokens: int
    final: int
    hashes: list[int]
    salt: int = 0
    at: int = -1
    key: int = 0
    due: int = -1
    own: int = 0


class PagedAllocator(PagedFreeList, PagedAppends, PagedStats, PagedWindows, PagedTicks, PagedTickSteps):
    """Blocks of `block_size` slots taken from a free list exactly when a sequence's length crosses a
    block boundary; `fork` shares blocks, appending into a shared partly filled block copies it.
    Taking and releasing blocks is in `paged_free_list.py`, growth (`append`, `append_each`) in
    `paged_append.py`, queries, memory accounting and checks in `paged_stats.py`, the fast-forward
    and the lazy ticks of a decoding batch in `paged_window.py`."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 cpu_tier_blocks: int = 0) -> None:
        """`cpu_tier_blocks`: blocks of a CPU tier keeping what the prefix cache evicts (kvsim/alloc/cpu_tier.py)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.capacity_tokens = num_blocks * block_size
        self._top = 0                      # blocks [0, _top) have been used; the rest never were
        self._free: deque[int] = deque()   # released plain free blocks below _top, taken from the left
        self._ref: list[int] = []          # block id (< _top) -> number of tables holding it
        self._seqs: dict[int, _Seq] = {}
        self.cpu_tier = CpuTier(cpu_tier_blocks) if prefix_caching and cpu_tier_blocks else None
        self._cache = PrefixCache(self.cpu_tier) if prefix_caching else None
        self._sum_tokens = 0
        self._sum_reach = 0
        self._sum_blocks = 0
        self._excess = 0
        self._shared_partial = 0
        self._chained: tuple[object, list[int]] = ((), [])   # last content ids -> their chained hashes
        self._clock, self._ticking, self._joins, self._pending, self._resume = 0, 0, 0, None, 0   # PagedTicks
        self._due: dict[int, list[_Seq]] = {}
    # ---- allocate / fork / free ----------------------------------------------------------------

    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """Whether a sequence of `num_tokens` slots fits now, its prefix-cache hits counted (the blocks
        it misses plus the evictable blocks it hits must be free). `seq_id`: the id it will have (None: its
        own earlier blocks are not looked up)."""
        if self._cache is None:      # (`num_free_blocks` without a cache, inlined)
            return -(-num_tokens // self.block_size) <= self.num_blocks - self._top + len(self._free)
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
        if cache is None or self._hits_none(num_tokens, block_hashes, seq_id):   # (no hit: fewer steps)
            if hold_tokens is None or hold_tokens == num_tokens:
                hold = num_tokens
            elif 1 <= hold_tokens < num_tokens:
                hold = hold_tokens
            else:
                raise AllocationError(f"sequence {seq_id}: hold_tokens {hold_tokens} outside 1..{num_tokens}")
            num_new = -(-hold // bs)
            free = self.num_blocks - self._top + len(self._free)           # (`num_free_blocks`, inlined)
            if num_new > free and (cache is None or num_new > free + cache.num_evictable):
                raise AllocationError(f"sequence {seq_id}: {num_new} blocks needed, {self.num_free_blocks} free")
            table = self._take_many(num_new)
            final = final_tokens if final_tokens > num_tokens else num_tokens
            self._seqs[seq_id] = _Seq(table, hold, final, [], seq_id)
            self._sum_tokens += hold
            self._sum_reach += final if final < num_new * bs else num_new * bs
            self._sum_blocks += num_new
            return 0
        hashes, hits = self._prefix(num_tokens, block_hashes, seq_id)
        loads = self._cpu_hits(hashes, hits, num_tokens) if self.cpu_tier is not None else 0
        cached = (len(hits) + loads) * bs
        hold = num_tokens if hold_tokens is None else max(hold_tokens, cached)
        if hold < 1 or hold > num_tokens:
            raise AllocationError(f"sequence {seq_id}: hold_tokens {hold_tokens} outside 1..{num_tokens}")
        num_new = -(-hold // bs) - len(hits)
        evictable_hits = sum(cache.is_evictable(b) for b in hits) if hits else 0
        if num_new > self.num_free_blocks - evictable_hits:
            raise AllocationError(f"sequence {seq_id}: {num_new} blocks needed, "
                                  f"{self.num_free_blocks - evictable_hits} free")
        if loads:                        # (before taking blocks: evictions then land in the tier too)
            self.cpu_tier.load(hashes, len(hits), loads, bs)
        ref = self._ref
        for block in hits:               # hits are full blocks
            if ref[block] == 0:
                cache.reuse(block)
            else:
                self._excess += bs
            ref[block] += 1
        table = hits + self._take_many(num_new)
        final = max(final_tokens, num_tokens)
        own = len(hits) if len(hits) > len(hashes) else len(hashes)
        seq = self._seqs[seq_id] = _Seq(table, hold, final, hashes, seq_id, own=own)
        if len(hits) < len(hashes):
            self._register(seq, len(hits), hold // bs)
        self._sum_tokens += hold
        self._sum_reach += min(final, len(table) * bs)
        self._sum_blocks += len(table)
        return cached

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
        own = max(len(parent.hashes), num_full)        # (blocks before: the parent's, registered by it)
        self._seqs[child_id] = _Seq(list(parent.table), parent.tokens, parent.final, parent.hashes, child_id,
                                    own=own)
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
        sequence's last block first, so the tail of a prefix is evicted before its head). Its own full
        blocks are registered first (`_Seq.own`): a preempted sequence's re-admission may hit them."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        filled = 0                        # (a half-done tick's slot: `_served_fill`)
        if seq.at >= 0:                   # `_untick`, inlined
            seq.tokens += self._clock - seq.at
            if self._cache is not None and self._pending is not None:
                filled = self._served_fill(seq)
            seq.at = seq.due = -1
            self._ticking -= 1
        if self._cache is not None:
            self._register_own(seq, (seq.tokens + filled) // self.block_size)
        table, ref = seq.table, self._ref
        if self._cache is None and not self._excess and not self._shared_partial:   # nothing is shared
            for block in table:
                ref[block] = 0
            self._free.extend(reversed(table))
        else:
            self._release(table, seq.tokens % self.block_size != 0)
        held = len(table) * self.block_size
        self._sum_tokens -= seq.tokens
        self._sum_reach -= seq.final if seq.final < held else held
        self._sum_blocks -= len(table)

    def free_finished(self, seq_id: int) -> None:
        """`free` of a sequence done for good (its request finished, or its sample ended): its id is never
        allocated again, so no lookup will ask for its own blocks' hashes (salted by its id). A ticking (or
        held: `tick_leave`) sequence's own full blocks (`_Seq.own`) are then parked nameless (`park_nameless`) rather than
        registered first: the same evictable blocks in the same LRU order, so every count and every
        block taken is `free`'s. Where a CPU tier keeps evicted hashes, or blocks are shared: `free`."""
        seq, cache = self._seqs.get(seq_id), self._cache
        if (seq is None or cache is None or self.cpu_tier is not None or self._pending is not None
                or self._excess or self._shared_partial):
            self.free(seq_id)
            return
        bs, table, ref = self.block_size, seq.table, self._ref
        if seq.at >= 0:
            tokens = seq.tokens + self._clock - seq.at
        else:       # (ticks stopped, blocks kept: held by async scheduling, `tick_leave`)
            tokens = seq.tokens
        first, full = seq.own, tokens // bs               # (a ticking sequence's shareable blocks are full)
        if first > full or len(table) > full + 1:
            self.free(seq_id)                             # (blocks past its tokens, or a prompt unfilled)
            return
        del self._seqs[seq_id]
        if seq.at >= 0:
            seq.at = seq.due = -1
            self._ticking -= 1
        for block in table:                                # (nothing is shared: each held once)
            ref[block] = 0
        if full < len(table):
            self._free.append(table[-1])                  # the partly filled last block
        if full > first:
            cache.park_nameless(reversed(table[first:full]))
        if first:
            for block in reversed(table[:first]):         # shareable (registered when filled) and hits
                if not cache.park(block):
                    self._free.append(block)
        held = len(table) * bs
        self._sum_tokens -= tokens
        self._sum_reach -= seq.final if seq.final < held else held
        self._sum_blocks -= len(table)
