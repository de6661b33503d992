"""The hybrid allocator's block tables, memory breakdown (in total and per KV cache group) and the slow
recount that checks its invariants (kvsim/alloc/hybrid/allocator.py). A mixin of `HybridAllocator`.

Per attention group, a sequence of T tokens (peak F) whose table has E entries, the first Z of them
null, holds E - Z blocks: T - Z x block_size written slots (`token_states`; slots of a block still held
whose tokens left the window count as written), min(F, E x block_size) - T slots it will still write
(`reserved`), the rest of its blocks never written (`internal_fragmentation`). A Mamba group's one
block per sequence is all state (`token_states`: its page padding is the model spec's business). Pool
blocks are never externally fragmented (0), free blocks belong to no group.
"""

from __future__ import annotations

from kvsim.alloc.base import MemoryStats, grouped_record
from kvsim.alloc.hybrid.groups import NULL_BLOCK
from kvsim.alloc.hybrid.sequences import GroupedSequences


class HybridAccounting(GroupedSequences):
    """`peak_slots`, `stats`, `group_stats` and `check_invariants` of `HybridAllocator`."""

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """An upper bound on the slots one sequence of `num_tokens` (peak `final_tokens`) holds at once:
        the sum over groups of each group's peak (they need not peak together; hits not counted)."""
        self._one_sequence(num_seqs)
        first = self._first(num_tokens)
        return self.block_size * sum(r.peak_blocks(num_tokens, final_tokens, first) for r in self.rules)

    def _group_parts(self, g: int) -> tuple[int, int, int, int]:
        """(held blocks, written, reserved, internal fragmentation) of group `g`, in slots; a block
        several sequences share through the prefix cache (always full) counts once."""
        bs, held = self.block_size, self._held[g] - self._dup[g]
        if self.rules[g].state_block:
            return held, held * bs, 0, 0
        tokens = self._sum_tokens - (self._nulls[g] + self._dup[g]) * bs
        reach = self._reach[g] - (self._nulls[g] + self._dup[g]) * bs
        return held, tokens, reach - tokens, held * bs - reach

    _spec_members: list | None = None   # the groups of each distinct group spec, once known

    def _specs(self) -> list[tuple[int, ...]]:
        """The groups of each distinct group spec, in order of first appearance: a spec's record sums
        its groups' parts (Gemma 3's six sliding groups: one record). Without prefix caching the groups
        of one spec hold the same blocks; with it they may not (a hit can find a block cached in one
        group whose twin in another was evicted), so the parts are summed, not multiplied."""
        groups: dict = {}
        for g, spec in enumerate(self.groups):
            groups.setdefault(spec, []).append(g)
        self._spec_members = [tuple(v) for v in groups.values()]
        return self._spec_members

    def group_stats(self) -> list[MemoryStats]:
        """One record per group: its share of the pool (`capacity_tokens` = its blocks x block_size)
        split into token_states, reserved and internal_fragmentation; free is the pool's, not a group's
        (0 here), so the groups' capacities plus `stats().free` make the whole pool."""
        out = []
        for g in range(len(self.rules)):
            held, tokens, reserved, internal = self._group_parts(g)
            out.append(MemoryStats(held * self.block_size, tokens, reserved, internal, 0, 0, held, 0,
                                   self._held[g], 0))
        return out

    def stats(self, head_tokens: int = 0, head_final_tokens: int = 0) -> MemoryStats:
        """Memory breakdown in token slots over the whole pool (the groups summed, plus the free blocks).
        Paged memory has no external fragmentation, so `head_*` is unused. (The engine asks once per
        step: `_group_parts` is inlined.)"""
        bs, total, held_all, dup, nulls, reach_all = (self.block_size, self._sum_tokens, self._held, self._dup,
                                                      self._nulls, self._reach)
        used = tokens = reserved = internal = 0
        groups = []
        for g, rules in enumerate(self.rules):
            held = held_all[g] - dup[g]
            if rules.state_block:
                parts = (held, held * bs, 0, 0)
            else:
                gone = (nulls[g] + dup[g]) * bs
                written, reach = total - gone, reach_all[g] - gone
                parts = (held, written, reach - written, held * bs - reach)
            groups.append(parts)
            used, tokens = used + parts[0], tokens + parts[1]
            reserved, internal = reserved + parts[2], internal + parts[3]
        free = self.num_free_blocks
        cached = self._cache.num_evictable if self._cache is not None else 0
        if not self.record_groups:
            return MemoryStats(self.capacity_tokens, tokens, reserved, internal, 0, free * bs,
                               used, free, sum(held_all), cached)
        specs = self._spec_members or self._specs()
        extra: list[int] = []
        freed = self._freed
        for gs in specs:                # (the engine asks once per step: kept flat)
            if len(gs) == 1:
                extra.extend(groups[gs[0]])
                extra.append(freed[gs[0]])
            else:
                extra.extend(sum(groups[g][i] for g in gs) for i in range(4))
                extra.append(sum(freed[g] for g in gs))
        return grouped_record(len(specs))(self.capacity_tokens, tokens, reserved, internal, 0, free * bs,
                                          used, free, sum(held_all), cached, *extra)

    # ---- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Assert pool conservation, table shapes per kind, sharing and the counters (slow; tests only)."""
        bs, ng, cache = self.block_size, len(self.rules), self._cache
        self._check_ticks()             # (and brings every ticking sequence up to date)
        free = list(self._free)
        evictable = cache.evictable_blocks() if cache is not None else []
        assert len(set(free)) == len(free), "a block appears twice in the free list"
        assert all(0 <= b < self._top <= self.num_blocks for b in free + evictable), \
            "a free block outside the used range"
        holders: dict[int, list[tuple[int, int, int]]] = {}   # block -> [(seq, group, index)]
        held, nulls, reach = [0] * ng, [0] * ng, [0] * ng
        for seq_id, seq in self._seqs.items():
            assert 1 <= seq.tokens <= seq.final, f"seq {seq_id}: {seq.tokens} tokens, final {seq.final}"
            assert len(seq.tables) == len(seq.nulls) == ng, f"seq {seq_id}: not one table per group"
            for g, (rules, table) in enumerate(zip(self.rules, seq.tables)):
                z = seq.nulls[g]
                assert len(table) == rules.entries_for(seq.tokens), \
                    f"seq {seq_id} group {g}: {len(table)} entries for {seq.tokens} tokens"
                assert all(b == NULL_BLOCK for b in table[:z]), f"seq {seq_id} group {g}: nulls not a prefix"
                inner = sum(b == NULL_BLOCK for b in table[z:])      # (align-mode Mamba only, and before its last)
                assert not inner or (rules.one_block and table[-1] != NULL_BLOCK), f"seq {seq_id} group {g}: inner null"
                assert z <= rules.most_nulls(seq.tokens), \
                    f"seq {seq_id} group {g}: {z} entries nulled, more than its window skips"
                for k, b in enumerate(table[z:], start=z):
                    if b == NULL_BLOCK:
                        continue
                    assert 0 <= b < self._top, f"seq {seq_id} group {g}: bad block {b}"
                    holders.setdefault(b, []).append((seq_id, g, k))
                held[g] += len(table) - z - inner
                nulls[g] += z + inner
                reach[g] += min(seq.final, len(table) * bs)
                for c in range(seq.tokens, min(seq.event, seq.tokens + 3 * bs)):   # nothing moves before it
                    assert rules.skipped_entries(c) <= z and rules.entries_for(c + 1) <= len(table), \
                        f"seq {seq_id}: its blocks move at {c} tokens, before its event {seq.event}"
            assert seq.event >= seq.tokens, f"seq {seq_id}: event {seq.event} behind its {seq.tokens} tokens"
        dup = [0] * ng
        for b, where in holders.items():
            assert len({(g, k) for _, g, k in where}) == 1, f"block {b} held at different places {where}"
            if len(where) > 1:
                assert cache is not None, f"block {b} in two tables without prefix caching: {where}"
                seq_id, g, k = where[0]
                assert all(self._seqs[s].tokens >= (k + 1) * bs for s, _, _ in where), f"shared block {b} not full"
                dup[g] += len(where) - 1
            if cache is not None:
                assert self._ref.get(b) == len(where), \
                    f"block {b}: reference count {self._ref.get(b)}, {len(where)} holders"
        if cache is not None:
            assert set(self._ref) == set(holders), "reference counts kept for blocks no one holds"
            cache.check({b: self._ref.get(b, 0) for b in range(self._top)})
        assert not set(holders) & set(free + evictable), "a held block is also free"
        assert len(holders) + len(free) + len(evictable) == self._top, \
            "a block is lost (free + held != blocks used so far)"
        assert (held, nulls, reach, dup) == (self._held, self._nulls, self._reach, self._dup), "group counters drifted"
        assert self._sum_tokens == sum(s.tokens for s in self._seqs.values()), "token counter drifted"
        stats = self.stats()
        assert stats.used_blocks + stats.free_blocks == self.num_blocks, "pool not conserved"
        assert (stats.token_states + stats.reserved + stats.internal_fragmentation
                + stats.external_fragmentation + stats.free) == self.capacity_tokens, "categories do not sum"
        parts = self.group_stats()
        assert all(min(p) >= 0 for p in parts), f"negative category in {parts}"
        same: dict = {}
        for spec, part in zip(self.groups, parts):   # (with prefix caching twins may differ: see _specs)
            assert cache is not None or same.setdefault(spec, part) == part, \
                f"groups of one spec {spec} hold different blocks"
        assert sum(p.capacity_tokens for p in parts) + stats.free == self.capacity_tokens, "groups do not sum"
        if not self._seqs:
            assert not holders and stats.free_blocks == self.num_blocks, "blocks leaked after every free"
