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

from .base import AllocationError, MemoryStats
from .prefix import PrefixCache, chain_hashes, unique_hashes


@dataclass(slots=True)
class _Seq:
    """A live sequence's mutable state: its block table, slots written, peak slots (>= tokens), the
    chained hashes of its shareable leading blocks (prefix caching only; never mutated, so forks share
    it) and the salt its other full blocks are hashed with (`prefix.unique_hashes`)."""

    table: list[int]
    tokens: int
    final: int
    hashes: list[int]
    salt: int = 0


class PagedAllocator:
    """Blocks of `block_size` slots taken from a free list exactly when a sequence's length crosses a
    block boundary; `fork` shares blocks, appending into a shared partly filled block copies it."""

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

    # ---- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can take now: plain free plus evictable cached blocks."""
        cache = self._cache
        return (self.num_blocks - self._top + len(self._free)
                + (cache.num_evictable if cache is not None else 0))

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of `seq_id`'s block ids, in token order."""
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id: int) -> int:
        """Slots `seq_id` holds written."""
        return self._seq(seq_id).tokens

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise AllocationError(f"unknown sequence id {seq_id}") from None

    # ---- allocate / fork / free ----------------------------------------------------------------

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """Slots `num_seqs` sequences forked from one of `num_tokens` hold at `final_tokens` each:
        the full blocks of the first `num_tokens` once (shared), the rest of each sequence's blocks."""
        bs = self.block_size
        shared = num_tokens // bs * bs
        return shared + num_seqs * (-(-max(final_tokens, num_tokens) // bs) * bs - shared)

    def _prefix(self, num_tokens: int, block_hashes: Sequence[int], salt: int) -> tuple[list[int], list[int]]:
        """(chained hashes of the shareable content ids, cache hits) for a sequence of `num_tokens` slots:
        the longest cached run of its full blocks' hashes (shareable ones, then its own by `salt`), at
        most floor((num_tokens - 1) / block_size) blocks (the last token is always computed)."""
        if self._cache is None:
            return [], []
        if block_hashes is not self._chained[0]:
            self._chained = (block_hashes, chain_hashes(block_hashes) if len(block_hashes) else [])
        hashes = self._chained[1]
        max_hits = (num_tokens - 1) // self.block_size
        hits = self._cache.lookup(hashes, max_hits)
        if len(hits) == len(hashes) < max_hits:   # past the shareable blocks: its own earlier blocks
            hits += self._cache.lookup(unique_hashes(salt, len(hashes), max_hits), max_hits - len(hashes))
        return hashes, hits

    def _hits_cost(self, num_tokens: int, block_hashes: Sequence[int], salt: int) -> tuple[int, int]:
        """(cached tokens, free blocks needed) to allocate a sequence of `num_tokens` slots now: a hit
        on an evictable block takes it out of the free blocks too (vLLM counts it the same way)."""
        _, hits = self._prefix(num_tokens, block_hashes, salt)
        evictable = sum(self._cache.is_evictable(b) for b in hits) if hits else 0
        return len(hits) * self.block_size, -(-num_tokens // self.block_size) - len(hits) + evictable

    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int = 0) -> bool:
        """Whether a sequence of `num_tokens` slots fits now, its prefix-cache hits counted (the blocks
        it misses plus the evictable blocks it hits must be free). `seq_id`: the id it will have."""
        return self._hits_cost(num_tokens, block_hashes, seq_id)[1] <= self.num_free_blocks

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int = 0) -> int:
        """Leading tokens of a sequence of `num_tokens` slots the prefix cache holds now (whole
        blocks, at most floor((num_tokens - 1) / block_size) of them). Changes nothing."""
        return self._hits_cost(num_tokens, block_hashes, seq_id)[0]

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
        hashes, hits = self._prefix(num_tokens, block_hashes, seq_id)
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
        table = hits + [self._take() for _ in range(num_new)]
        final = max(final_tokens, num_tokens)
        seq = self._seqs[seq_id] = _Seq(table, hold, final, hashes, seq_id)
        if cache is not None:
            self._register(seq, len(hits), hold // bs)
        self._sum_tokens += hold
        self._sum_reach += min(final, len(table) * bs)
        self._sum_blocks += len(table)
        return len(hits) * bs

    def _register(self, seq: _Seq, start: int, stop: int) -> None:
        """Cache `seq`'s full blocks `start..stop-1` under their hashes (shareable, then its own)."""
        hashes, table, register = seq.hashes, seq.table, self._cache.register
        for k in range(start, min(stop, len(hashes))):
            register(hashes[k], table[k])
        if stop > len(hashes):
            first = max(start, len(hashes))
            for k, h in enumerate(unique_hashes(seq.salt, first, stop), start=first):
                register(h, table[k])

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

    def free(self, seq_id: int) -> None:
        """Drop `seq_id`'s references; blocks no one holds become free (cached ones evictable, the
        sequence's last block first, so the tail of a prefix is evicted before its head)."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        ref = self._ref
        cache = self._cache
        bs = self.block_size
        partial_last = seq.tokens % bs != 0
        for block in reversed(seq.table):
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
        self._sum_tokens -= seq.tokens
        self._sum_reach -= min(seq.final, len(seq.table) * self.block_size)
        self._sum_blocks -= len(seq.table)

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
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        table = seq.table
        if seq.tokens + num_tokens < len(table) * self.block_size and self._ref[table[-1]] == 1:
            return True   # fast path: room left in an unshared last block
        return self._blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` slots; returns [(src, dst)] when its shared, partly filled last
        block had to be copied first, else []."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
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
        seqs, ref, bs = self._seqs, self._ref, self.block_size
        fast = 0
        k = start
        try:
            for k in range(start, len(seq_ids)):
                seq = seqs[seq_ids[k]]
                new_tokens = seq.tokens + 1
                table = seq.table
                if new_tokens < len(table) * bs and ref[table[-1]] == 1:
                    seq.tokens = new_tokens
                    fast += 1
                    if new_tokens > seq.final:
                        self._sum_reach += 1
                        seq.final = new_tokens
                elif self._blocks_needed(seq, 1) <= self.num_free_blocks:
                    pairs = self._grow(seq_ids[k], seq, new_tokens)
                    if pairs and copies is not None:
                        copies.extend(pairs)
                else:
                    return k - start
        except KeyError:
            raise AllocationError(f"unknown sequence id {seq_ids[k]}") from None
        finally:
            self._sum_tokens += fast
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

    # ---- many decode steps at once (the engine's fast-forward) -----------------------------------

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` `append_steps` can run at once:
        while the free blocks last, with no copy-on-write, no prefix block filled and no sequence
        passing its final length. 0 while a partly filled block is shared."""
        if self._shared_partial or max_steps < 1:
            return 0
        bs, seqs = self.block_size, self._seqs
        tokens, held = [], 0
        steps = max_steps
        for seq_id in seq_ids:
            seq = seqs[seq_id]
            if seq.tokens // bs < len(seq.hashes):
                return 0
            steps = min(steps, seq.final - seq.tokens)
            tokens.append(seq.tokens)
            held += len(seq.table)
        free = self.num_free_blocks

        def fits(k: int) -> bool:
            return sum((t + k + bs - 1) // bs for t in tokens) - held <= free

        if steps < 1 or fits(steps):
            return max(steps, 0)
        lo, hi = 0, steps                  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` (blocks taken in the same order), within what
        `decode_window` allowed; returns `stats()` after each step."""
        bs = self.block_size
        seqs = [self._seqs[s] for s in seq_ids]
        crossing: list[list[_Seq]] = [[] for _ in range(steps)]   # step -> sequences needing a block
        for seq in seqs:
            for j in range(len(seq.table) * bs - seq.tokens, steps, bs):
                crossing[j].append(seq)
        snapshots = []
        for j in range(steps):
            for seq in crossing[j]:
                held = len(seq.table) * bs
                seq.table.append(self._take())
                self._sum_reach += min(seq.final, held + bs) - min(seq.final, held)
            self._sum_blocks += len(crossing[j])
            self._sum_tokens += len(seqs)
            snapshots.append(self.stats())
        cache = self._cache
        for seq in seqs:
            if cache is not None and (seq.tokens + steps) // bs > seq.tokens // bs:
                self._register(seq, seq.tokens // bs, (seq.tokens + steps) // bs)   # order-free
            seq.tokens += steps
        return snapshots

    # ---- accounting ----------------------------------------------------------------------------

    def stats(self, head_tokens: int = 0, head_final_tokens: int = 0) -> MemoryStats:
        """Memory breakdown in token slots, shared blocks counted once; O(1) unless a partly filled
        block is shared (then O(live sequences)). Paged memory has no external fragmentation, so `head_*` is unused."""
        bs = self.block_size
        num_cached = self._cache.num_evictable if self._cache is not None else 0
        num_free = self.num_blocks - self._top + len(self._free) + num_cached
        used = self.num_blocks - num_free
        if not self._shared_partial:
            tokens, reach = self._sum_tokens - self._excess, self._sum_reach - self._excess
        else:
            tokens, reach = self._shared_sums(used)
        return MemoryStats(
            capacity_tokens=self.capacity_tokens, token_states=tokens, reserved=reach - tokens,
            internal_fragmentation=used * bs - reach, external_fragmentation=0, free=num_free * bs,
            used_blocks=used, free_blocks=num_free, unshared_blocks=self._sum_blocks,
            cached_blocks=num_cached)

    def _shared_sums(self, used: int) -> tuple[int, int]:
        """(written slots, reached slots) over distinct used blocks. Only last blocks are partly
        filled; a shared one counts once, reached as far as its furthest-reaching holder."""
        bs = self.block_size
        partial: dict[int, tuple[int, int]] = {}   # block -> (fill, reach within block)
        for seq in self._seqs.values():
            allocated = len(seq.table) * bs
            if seq.tokens < allocated:
                base = allocated - bs
                reach = min(seq.final, allocated) - base
                block = seq.table[-1]
                if block not in partial or reach > partial[block][1]:
                    partial[block] = (seq.tokens - base, reach)
        unwritten = sum(bs - fill for fill, _ in partial.values())
        unreached = sum(bs - reach for _, reach in partial.values())
        return used * bs - unwritten, used * bs - unreached

    def check_invariants(self) -> None:
        """Assert the module's invariants and recompute `stats()` slot by slot (slow; tests only)."""
        bs = self.block_size
        free = set(self._free)
        assert len(free) == len(self._free), "a block appears twice in the free list"
        evictable = set(self._cache.evictable_blocks()) if self._cache is not None else set()
        assert len(self._ref) == self._top <= self.num_blocks, "high-water mark and reference counts disagree"
        assert all(b < self._top for b in free), "a released block lies above the high-water mark"
        counts = [0] * self._top
        holders: dict[int, set[tuple[int, int]]] = {}    # block -> {(index, fill)}
        reach_of: dict[int, int] = {}                      # block -> furthest slot a holder will fill in it
        for seq_id, seq in self._seqs.items():
            tokens, final, table = seq.tokens, seq.final, seq.table
            assert len(table) == -(-tokens // bs), f"seq {seq_id}: {len(table)} blocks for {tokens} tokens"
            assert tokens <= final, f"seq {seq_id}: {tokens} tokens past its final {final}"
            for k, block in enumerate(table):
                counts[block] += 1
                holders.setdefault(block, set()).add((k, min(bs, tokens - k * bs)))
                reach = min(bs, min(final, len(table) * bs) - k * bs)
                reach_of[block] = max(reach_of.get(block, 0), reach)
        assert counts == self._ref, "reference counts differ from the number of tables holding blocks"
        used = {b for b in range(self._top) if counts[b]}
        assert not used & free and not used & evictable and not free & evictable, "block sets overlap"
        assert len(used) + len(free) + len(evictable) == self._top, "a block is lost"
        for block, positions in holders.items():
            assert len(positions) == 1, f"block {block} held at different (index, fill): {positions}"
        if self._cache is not None:
            self._cache.check(self._ref)
            for block in used:
                if self._cache.cached_hash(block) is not None:
                    assert next(iter(holders[block]))[1] == bs, f"cached block {block} is not full"
        seqs = self._seqs.values()
        assert self._sum_tokens == sum(s.tokens for s in seqs), "token counter drifted"
        assert self._sum_blocks == sum(len(s.table) for s in seqs), "block counter drifted"
        assert self._sum_reach == sum(min(s.final, len(s.table) * bs) for s in seqs), "reach counter drifted"
        fills = {block: next(iter(positions))[1] for block, positions in holders.items()}
        assert self._excess == sum((counts[b] - 1) * bs for b, fill in fills.items() if fill == bs), \
            "shared full-block counter drifted"
        assert self._shared_partial == sum(counts[b] > 1 for b, fill in fills.items() if fill < bs), \
            "shared partial-block counter drifted"
        written = sum(next(iter(positions))[1] for positions in holders.values())
        reached = sum(reach_of.values())
        stats = self.stats()
        assert (stats.token_states, stats.reserved, stats.internal_fragmentation) == \
            (written, reached - written, len(used) * bs - reached), f"stats {stats} disagree with a recount"
        assert stats.token_states + stats.reserved + stats.internal_fragmentation + \
            stats.external_fragmentation + stats.free == self.capacity_tokens, "categories do not sum to capacity"
        if not self._seqs:
            assert not used, "blocks leaked after every sequence was freed"
