"""The paged allocator's queries and accounting: free blocks, block tables, prefix-cache hits, a
request's peak footprint, the memory breakdown (`stats`) and the slow recount that checks every
invariant of kvsim/alloc/paged/allocator.py (`check_invariants`). A mixin of `PagedAllocator`.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.base import AllocationError, MemoryStats
from kvsim.alloc.paged.prefix import chain_hashes, unique_hash, unique_hashes


class PagedStats:
    """The queries, `stats` and `check_invariants` of `PagedAllocator`."""

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

    def _seq(self, seq_id: int):
        """The live sequence `seq_id`, brought up to date if it is ticking."""
        try:
            seq = self._seqs[seq_id]
        except KeyError:
            raise AllocationError(f"unknown sequence id {seq_id}") from None
        if seq.at >= 0:
            self._sync(seq)
        return seq

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """Slots `num_seqs` sequences forked from one of `num_tokens` hold at `final_tokens` each:
        the full blocks of the first `num_tokens` once (shared), the rest of each sequence's blocks."""
        bs = self.block_size
        shared = num_tokens // bs * bs
        return shared + num_seqs * (-(-max(final_tokens, num_tokens) // bs) * bs - shared)

    def _prefix(self, num_tokens: int, block_hashes: Sequence[int], salt: int | None) -> tuple[list[int], list[int]]:
        """(chained hashes of the shareable content ids, cache hits) for a sequence of `num_tokens` slots:
        the longest cached run of its full blocks' hashes (shareable ones, then its own by `salt`), at
        most floor((num_tokens - 1) / block_size) blocks (the last token is always computed)."""
        if self._cache is None:
            return [], []
        if block_hashes is not self._chained[0]:
            self._chained = (block_hashes, chain_hashes(block_hashes) if len(block_hashes) else [])
        hashes = self._chained[1]
        max_hits = (num_tokens - 1) // self.block_size
        cache = self._cache
        hits = cache.lookup(hashes, max_hits) if hashes else []
        start = len(hashes)
        if salt is not None and len(hits) == start < max_hits:   # then its own earlier blocks
            if cache.holds(unique_hash(salt, start)):          # (usually a miss: no list made)
                hits += cache.lookup(unique_hashes(salt, start, max_hits), max_hits - start)
        return hashes, hits

    def _hits_none(self, num_tokens: int, block_hashes: Sequence[int], salt: int | None) -> bool:
        """Whether a sequence of `num_tokens` slots surely hits nothing in the prefix cache: it has no
        shareable blocks (so the CPU tier holds none of them either), and its own first block is not
        cached (it was never freed short of finishing) or it may hit none (one block or less). One
        lookup at most: `_prefix` with nothing to chain."""
        return not len(block_hashes) and (salt is None or num_tokens <= self.block_size
                                          or not self._cache.holds(unique_hash(salt, 0)))

    def _hits_cost(self, num_tokens: int, block_hashes: Sequence[int], salt: int | None) -> tuple[int, int]:
        """(cached tokens, free blocks needed) to allocate a sequence of `num_tokens` slots now: a hit
        on an evictable block takes it out of the free blocks too (vLLM counts it the same way)."""
        hashes, hits = self._prefix(num_tokens, block_hashes, salt)
        evictable = sum(self._cache.is_evictable(b) for b in hits) if hits else 0
        loads = self._cpu_hits(hashes, hits, num_tokens) if self.cpu_tier is not None else 0
        return (len(hits) + loads) * self.block_size, -(-num_tokens // self.block_size) - len(hits) + evictable

    def _cpu_hits(self, hashes: list[int], hits: list[int], num_tokens: int) -> int:
        """Blocks after the GPU hits `hits` of shareable `hashes` that the CPU tier holds (loaded, not
        computed: each still takes a fresh GPU block), within the at most floor((num_tokens - 1) /
        block_size) blocks a sequence may hit."""
        stop = min(len(hashes), (num_tokens - 1) // self.block_size)
        return self.cpu_tier.count(hashes, len(hits), stop) if len(hits) < stop else 0

    def take_loaded_tokens(self) -> int:
        """Tokens loaded from the CPU tier since the last call (0 without one)."""
        return self.cpu_tier.take_loaded_tokens() if self.cpu_tier is not None else 0

    def admission(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                  seq_id: int | None = None) -> tuple[bool, int]:
        """(`can_allocate`, `cached_tokens`) of a sequence of `num_tokens` slots, from one lookup (the
        scheduler asks both of each request it admits)."""
        if self._cache is None:
            return self.can_allocate(num_tokens, final_tokens), 0
        if self._hits_none(num_tokens, block_hashes, seq_id):
            return -(-num_tokens // self.block_size) <= self.num_free_blocks, 0
        cached, needed = self._hits_cost(num_tokens, block_hashes, seq_id)
        return needed <= self.num_free_blocks, cached

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """Leading tokens of a sequence of `num_tokens` slots the prefix cache holds now (whole
        blocks, at most floor((num_tokens - 1) / block_size) of them). Changes nothing."""
        return self._hits_cost(num_tokens, block_hashes, seq_id)[0]

    def _register(self, seq, start: int, stop: int) -> None:
        """Cache `seq`'s full shareable blocks among `start..stop-1` under their hashes (its own blocks
        wait for `_register_own`: `kvsim.alloc.paged.allocator._Seq.own`)."""
        hashes = seq.hashes
        if start < len(hashes):
            table, register = seq.table, self._cache.register
            for k in range(start, min(stop, len(hashes))):
                register(hashes[k], table[k])

    def _register_own(self, seq, full: int) -> None:
        """Cache `seq`'s own full blocks `seq.own..full-1` under its salted hashes (`unique_hashes`),
        as it is freed: blocks already cached (prefix-cache hits) keep theirs."""
        first = seq.own
        if full > first:
            table, register = seq.table, self._cache.register
            for k, h in enumerate(unique_hashes(seq.salt, first, full), start=first):
                register(h, table[k])

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
        return tuple.__new__(MemoryStats, (self.capacity_tokens, tokens, reach - tokens, used * bs - reach, 0,
                                           num_free * bs, used, num_free, self._sum_blocks, num_cached))
        # (field order of MemoryStats; made directly, skipping the named tuple's slow `__new__`)

    def _shared_sums(self, used: int) -> tuple[int, int]:
        """(written slots, reached slots) over distinct used blocks. Only last blocks are partly
        filled; a shared one counts once, reached as far as its furthest-reaching holder."""
        bs = self.block_size
        self._sync_all()
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
        self._sync_all()
        ticking = [s for s in self._seqs.values() if s.at >= 0]
        assert len(ticking) == self._ticking, "ticking count drifted"
        for s in ticking:
            assert s.due == s.at + len(s.table) * bs - s.tokens or (s.due == s.at and s.tokens % bs), \
                "a ticking sequence's due tick drifted"
            assert any(t is s for t in self._due.get(s.due, ())), "tick lost"
        assert all(s.due == -1 for s in self._seqs.values() if s.at < 0), "a sequence not ticking is due"
        for clock, due in self._due.items():
            keys = [s.key for s in due if s.due == clock]
            assert keys == sorted(keys), "ticking sequences filed out of order"
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
