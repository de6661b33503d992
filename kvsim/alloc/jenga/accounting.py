"""The Jenga allocator's block tables, memory breakdown (in total and per group), fragmentation figure and
invariant recount. A mixin of `JengaAllocator` (kvsim/alloc/jenga/allocator.py).

The breakdown, in token slots (one slot = gcd(page bytes) / block_size bytes, kvsim/alloc/jenga/spec.py;
a page of group g is units[g] x block_size slots). Per group g, whose pages are units[g] slots per token:
- token_states: written tokens still held (T - nulls x block_size per sequence) x units[g]; a Mamba
  group's state pages are all token_states;
- reserved: slots of held pages the sequence will still write, min(F, E x block_size) - T, x units[g];
- internal_fragmentation: the rest of the held pages (never written), x units[g];
- external_fragmentation: FREE small pages inside large pages group g holds, x units[g] x block_size:
  memory no other group can use until the large page empties (Jenga's fragmentation between large and
  small pages; `large_page_waste` is its share of the pool);
- free: with prefix caching, its cached pages no sequence holds (evictable: free for the scheduler, as
  every kvsim allocator counts them; `cached_blocks` counts them in small pages);
and `capacity_tokens` of a group = its large pages x slots per large page. In total, `free` is the whole
free large pages plus the groups' cached pages; the groups' capacities plus the free large pages make
`capacity_tokens`. A page several sequences share through the prefix cache counts once. Blocks: in `stats()`
`used_blocks`/`free_blocks` count LARGE pages (held / free), in `group_stats()` the group's small pages
(held / free inside its large pages).
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.base import MemoryStats, with_groups
from kvsim.alloc.hybrid import NULL_BLOCK
from kvsim.alloc.hybrid.sequences import GroupedSequences


class JengaAccounting(GroupedSequences):
    """`stats`, `group_stats`, `large_page_waste`, `check_invariants` and the (disabled) fast-forward of
    `JengaAllocator` (block tables and lookups: `GroupedSequences`)."""

    _kind = "jenga"

    @property
    def num_free_large(self) -> int:
        """Large pages free now."""
        return self.pool.free_large

    def _group_parts(self, g: int) -> tuple[int, int, int, int, int, int]:
        """(held small pages, written, reserved, internal, external, cached) of group `g`, in slots."""
        bs, dup, u = self.block_size, self._dup[g], self.layout.units[g]
        held = self._held[g] - dup
        external = self.pool.free_small[g] * bs * u
        cached = 0 if self._cache is None else self._cache.evictable[g] * bs * u
        if self.rules[g].state_block:
            return held, held * bs * u, 0, 0, external, cached
        tokens = self._sum_tokens - (self._nulls[g] + dup) * bs
        reach = self._reach[g] - (self._nulls[g] + dup) * bs
        return held, tokens * u, (reach - tokens) * u, (held * bs - reach) * u, external, cached

    def group_stats(self) -> list[MemoryStats]:
        """One record per group over its large pages (capacity = its large pages in slots; free: its cached
        pages, 0 without prefix caching)."""
        out, per = [], self.layout.slots_per_large
        for g in range(len(self.rules)):
            held, tokens, reserved, internal, external, cached = self._group_parts(g)
            num_cached = cached // (self.block_size * self.layout.units[g])
            out.append(MemoryStats(self.pool.large_held[g] * per, tokens, reserved, internal, external, cached,
                                   held, self.pool.free_small[g] + num_cached, self._held[g], num_cached))
        return out

    def stats(self, head_tokens: int = 0, head_final_tokens: int = 0) -> MemoryStats:
        """The pool's breakdown in token slots (the groups summed, plus the free large pages); blocks are
        large pages. `head_*` is unused: stranded small pages count as external fragmentation always."""
        tokens = reserved = internal = external = cached = 0
        groups = [self._group_parts(g) for g in range(len(self.rules))]
        for parts in groups:
            tokens, reserved = tokens + parts[1], reserved + parts[2]
            internal, external, cached = internal + parts[3], external + parts[4], cached + parts[5]
        free = self.pool.free_large
        used = self.layout.num_large - free
        num_cached = 0 if self._cache is None else sum(self._cache.evictable)
        stats = MemoryStats(self.capacity_tokens, tokens, reserved, internal, external,
                            free * self.layout.slots_per_large + cached, used, free, used, num_cached)
        return with_groups(stats, [(*g[:4], f) for g, f in zip(groups, self._freed)]) if self.record_groups else stats

    def large_page_waste(self) -> float:
        """The share of the pool's usable bytes lost to Jenga's two-level fragmentation now: free small
        pages stranded inside large pages of another group (external_fragmentation / capacity_tokens)."""
        return sum(self.pool.free_small[g] * self.layout.units[g] for g in range(len(self.rules))) \
            * self.block_size / self.capacity_tokens

    # ---- the fast-forward: not offered ---------------------------------------------------------
    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """0: every decode step runs through `append_each` (windows move page by page)."""
        return 0

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """Never called (`decode_window` is 0); kept for the allocator protocol."""
        raise NotImplementedError("the jenga allocator has no fast-forward (decode_window is 0)")

    # ---- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Assert the pool, table shapes per kind, homes and counters (slow; tests only)."""
        bs, ng, pool = self.block_size, len(self.rules), self.pool
        pool.check()
        owner: dict[tuple[int, int], int] = {}        # held (group, page) -> holders
        held, nulls, reach = [0] * ng, [0] * ng, [0] * ng
        for seq_id, seq in self._seqs.items():
            assert 1 <= seq.tokens <= seq.final, f"seq {seq_id}: {seq.tokens} tokens, final {seq.final}"
            for g, (rules, table) in enumerate(zip(self.rules, seq.tables)):
                z, n, home = seq.nulls[g], self.layout.pages_per_large[g], {}
                assert len(table) == rules.entries_for(seq.tokens), f"seq {seq_id} group {g}: table length"
                assert all(b == NULL_BLOCK for b in table[:z]), f"seq {seq_id} group {g}: nulls not a prefix"
                assert z <= max(rules.skipped_entries(seq.tokens), 0), f"seq {seq_id} group {g}: too many nulls"
                for b in table[z:]:
                    large, index = divmod(b, n)
                    assert b >= 0 and pool.owner[large] == g, \
                        f"seq {seq_id} group {g}: page {b} not in the group's large pages"
                    assert index not in pool.free_slots(large), f"page {b} of group {g} is held and free"
                    assert self._cache is not None or (g, b) not in owner, f"page {b} of group {g} held twice"
                    owner[(g, b)] = owner.get((g, b), 0) + 1
                    home[large] = home.get(large, 0) + 1
                assert home == seq.homes[g], f"seq {seq_id} group {g}: home {seq.homes[g]} != {home}"
                held[g] += len(table) - z
                nulls[g] += z
                reach[g] += min(seq.final, len(table) * bs)
        dup = [0] * ng
        for (g, _), k in owner.items():
            dup[g] += k - 1
        cached = [0] * ng if self._cache is None else self._check_cache(owner)
        for g, n in enumerate(self.layout.pages_per_large):
            assert held[g] - dup[g] + cached[g] + pool.free_small[g] == pool.large_held[g] * n, \
                f"group {g}: small pages lost"
        assert dup == self._dup, f"shared page counters drifted: {self._dup} != {dup}"
        assert held == self._held and nulls == self._nulls and reach == self._reach, "group counters drifted"
        assert self._sum_tokens == sum(s.tokens for s in self._seqs.values()), "token counter drifted"
        stats, parts = self.stats(), self.group_stats()
        assert (stats.token_states + stats.reserved + stats.internal_fragmentation
                + stats.external_fragmentation + stats.free) == self.capacity_tokens, "categories do not sum"
        assert all(min(p) >= 0 for p in parts), f"negative category in {parts}"
        assert all(p.token_states + p.reserved + p.internal_fragmentation + p.external_fragmentation + p.free
                   == p.capacity_tokens for p in parts), "a group's categories do not sum"
        assert sum(p.capacity_tokens for p in parts) + pool.free_large * self.layout.slots_per_large \
            == self.capacity_tokens, "groups do not sum"
        if not self._seqs:
            assert not owner and pool.free_large + len({p for p in self._cached_large()}) \
                == self.layout.num_large, "pages leaked after every free"
