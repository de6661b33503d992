"""Prefix caching across KV cache groups for the hybrid allocator (vLLM 0.33's `HybridKVCacheCoordinator`
over its single-type managers), a mixin of `HybridAllocator` (kvsim/alloc/hybrid/allocator.py).

Every full block a sequence holds is cached in its group under (chained hash, group): vLLM keys its
cache by `BlockHashWithGroupId`. Full-attention and chunked groups cache every full block; sliding groups
only the blocks a later hit can end on, under the prefix cache retention interval (vLLM 0.33's default 0:
the replay boundary and shared-prefix junctions; kvsim/alloc/hybrid/retention.py). A hit is the longest
prefix every group can serve (`find_hits`): groups of equal spec are looked up together, full attention
first, and each kind (`rules.find_hit`) shortens the candidate until all agree (one pass for one full +
one other group); a sliding window needs only its last cdiv(window - 1, block_size) blocks, a chunked
group only the current chunk's. Where a group served more than the agreed hit, that longer hit is the
sequence's junction (vLLM's `shared_prefix_boundary`), whose sliding blocks it then caches. Hashes: the trace's chained content ids for shareable prompt blocks, then blocks keyed
by the sequence id (kvsim/alloc/paged/prefix.py `unique_hashes`), as the paged allocator does.
Freed cached blocks stay cached at the end of the free queue (evicted least recently freed first);
uncached ones go to its front (vLLM 0.33's `BlockPool.free_blocks`). Mamba groups run vLLM's "align" mode
(kvsim/alloc/hybrid/mamba.py): a hit is the latest cached state at or before the candidate, and their
state blocks are thinned by the retention interval too (retention.py `mamba_mask`).
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.paged.prefix import chain_hashes, unique_hashes
from kvsim.alloc.hybrid.groups import NULL_BLOCK
from kvsim.alloc.hybrid.retention import check_retention, mamba_mask, reachable_mask


class HybridPrefix:
    """`cached_tokens` and the hit / registration helpers of `HybridAllocator` (`_cache` not None)."""

    def _sparse_groups(self, interval: int | None, caching: bool) -> list[int]:
        """Check `interval` as vLLM does (ValueError) and keep it; the sliding and Mamba groups it thins
        when caching."""
        check_retention(interval, self.block_size, [g.kind for g in self.groups])
        self.retention_interval, self._prompts = interval, {}     # (_prompts: sequence id -> first tokens)
        sparse = caching and interval is not None
        return [g for g, spec in enumerate(self.groups) if sparse and spec.kind in ("sliding", "mamba")]

    def _spec_groups(self) -> list[list[int]]:
        """Group indices by equal spec, full attention first (vLLM's `verify_and_split_kv_cache_groups`)."""
        members: dict = {}
        for g, spec in enumerate(self.groups):
            members.setdefault(spec, []).append(g)
        return sorted(members.values(), key=lambda ids: self.groups[ids[0]].kind != "full")

    def _hashes(self, block_hashes: Sequence[int], salt: int | None, num: int) -> list[int]:
        """Hashes of a sequence's first `num` full blocks (fewer without a salt: its own blocks unknown)."""
        if block_hashes is not self._chained[0]:
            self._chained = (block_hashes, chain_hashes(block_hashes) if len(block_hashes) else [])
        hashes = self._chained[1][:num]
        if salt is not None and len(hashes) < num:
            hashes = hashes + unique_hashes(salt, len(hashes), num)
        return hashes

    _hits_memo: tuple | None = None     # (num_tokens, block_hashes, seq_id, cache version, answer)
    _junction = 0                       # the last `find_hits`'s junction (0: none)

    def find_hits(self, num_tokens: int, block_hashes: Sequence[int] = (),
                  seq_id: int | None = None) -> tuple[int, list[list[int]]]:
        """(hit tokens, per group the hit table: cached blocks, NULL_BLOCK where no block is needed) for
        a new sequence of `num_tokens`, at most num_tokens - 1 of them (the last is always computed).
        The scheduler asks up to four times per admission with the cache unchanged: the last answer is
        kept while the cache's `version` stays (a cache without one: never kept). Callers only read it."""
        version, memo = getattr(self._cache, "version", None), self._hits_memo
        if (version is not None and memo is not None and memo[3] == version and memo[0] == num_tokens
                and memo[2] == seq_id and memo[1] is block_hashes):
            self._junction = memo[5]
            return memo[4]
        hit, tables, longest = self._find_hits(num_tokens, block_hashes, seq_id)
        answer, self._junction = (hit, tables), longest if longest > hit else 0
        if version is not None:
            self._hits_memo = (num_tokens, block_hashes, seq_id, version, answer, self._junction)
        return answer

    def _find_hits(self, num_tokens: int, block_hashes: Sequence[int] = (),
                   seq_id: int | None = None) -> tuple[int, list, int]:
        """`find_hits`, worked out, with the longest hit any group served on the way (vLLM's
        `longest_hit_length`: the agreed hit plus `num_uncached_common_prefix_tokens`)."""
        bs, cache = self.block_size, self._cache
        hashes = self._hashes(block_hashes, seq_id, (num_tokens - 1) // bs)

        def lookup_in(members):
            def lookup(k):
                if k >= len(hashes):
                    return None
                found = []
                for g in members:
                    block = cache.lookup(((hashes[k], g),), 1)
                    if not block:
                        return None
                    found.append(block[0])
                return found
            return lookup
        spec_groups = self._spec_groups_cached
        simple = len(spec_groups) == 2 and self.groups[spec_groups[0][0]].kind == "full"
        hit, results, longest = num_tokens - 1, {}, 0
        while True:
            curr = hit
            for idx, members in enumerate(spec_groups):
                rules = self.rules[members[0]]
                if idx in results and self.groups[members[0]].kind == "full":
                    curr = min(curr, results[idx][1])     # (full attention: downward closed)
                    continue
                results[idx] = rules.find_hit(lookup_in(members), curr)
                curr = results[idx][1]
                longest = max(longest, curr)
            if curr >= hit or simple:
                break
            hit = curr
        tables: list[list[int]] = [[] for _ in self.groups]
        for idx, members in enumerate(spec_groups):
            found = results[idx][0]
            if self.groups[members[0]].kind == "full":
                found = found[:-(-curr // bs)]
            for m, g in enumerate(members):
                tables[g] = [NULL_BLOCK if x == NULL_BLOCK else x[m] for x in found]
        return curr, tables, longest

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """Leading tokens of a new sequence of `num_tokens` the prefix cache serves now (0 without one)."""
        return 0 if self._cache is None else self.find_hits(num_tokens, block_hashes, seq_id)[0]

    def _blocks_to_allocate(self, num_tokens: int, hit: int, tables: list[list[int]], capped: bool,
                            seq_id: int | None = None, full: int = 0) -> int:
        """Blocks a new sequence with these hits takes from the free blocks to hold `num_tokens` (vLLM's
        `get_num_blocks_to_allocate` summed over groups): new blocks past its hits and skipped head, plus
        the hit blocks now evictable (a hit takes them out of the free queue). `seq_id`, `full`: the
        sequence and its tokens (align-mode Mamba's prefill checkpoint depends on them)."""
        total, evictable = 0, self._cache.is_evictable if self._cache is not None else None
        if self._fresh and self._fresh_hit(tables):
            return self.num_blocks + 1          # (vLLM: num_gpu_blocks + 1, so the request waits a step)
        one = 2 if self._checkpoint(hit, num_tokens, self._prefill_end(seq_id, full)) else 1
        for rules, found in zip(self.rules, tables):
            need = rules.admission_blocks(num_tokens) if capped else rules.entries_for(num_tokens)
            skipped = rules.skipped_entries(hit)
            more = need - max(skipped, len(found))
            total += (one if rules.one_block else more) if more > 0 else 0
            if evictable is not None:
                total += sum(1 for b in found[skipped:] if b != NULL_BLOCK and evictable(b))
        return total

    def _adopt_hits(self, seq, hit: int, tables: list[list[int]], num_tokens: int) -> None:
        """Give new `seq` of `num_tokens` its hit blocks (vLLM's `add_local_computed_blocks`): the skipped
        head null, each hit block one more holder (an evictable one leaves the free queue); keep its
        reachable boundaries (vLLM's replay boundary: its first admission's tokens - 1; the junction)."""
        prompt = self._prompts.setdefault(seq.salt, num_tokens)
        seq.marks = (prompt - 1, self._junction) if self._junction else (prompt - 1,)
        cache, ref = self._cache, self._ref
        for g, (rules, found) in enumerate(zip(self.rules, tables)):
            skipped = rules.skipped_entries(hit)
            kept = [b for b in found[skipped:] if b != NULL_BLOCK]   # (a chunk not a multiple of blocks)
            skipped = len(found) - len(kept) if len(found) > skipped else skipped
            for b in kept:
                if ref.get(b, 0) == 0:
                    cache.reuse(b)
                    ref[b] = 1
                else:
                    ref[b] += 1
                    self._dup[g] += 1
            seq.tables[g] = [NULL_BLOCK] * skipped + kept
            seq.nulls[g] = skipped
            seq.cached[g] = len(seq.tables[g])
            self._held[g] += len(kept)
            self._nulls[g] += skipped

    def _register(self, seq, tokens: int | None = None) -> None:
        """Cache `seq`'s full blocks not cached yet in every group (vLLM's `cache_blocks`, called after
        each allocation with the tokens it covers; `tokens`: only those of the first so many, default
        all: async scheduling caches a decoding sequence's blocks up to its known tokens, one less)."""
        full = (seq.tokens if tokens is None else tokens) // self.block_size
        first = min(seq.cached)
        if first >= full:
            return
        hashes = seq.hashes
        if len(hashes) < full:
            hashes = seq.hashes = hashes + unique_hashes(seq.salt, len(hashes), full)
        register = self._cache.register
        for g, table in enumerate(seq.tables):
            mask = None
            if g in self._sparse:
                mask = (mamba_mask(seq.cached[g], full, self.block_size, self.retention_interval, seq.marks)
                        if self.rules[g].one_block else reachable_mask(seq.cached[g], full, self.block_size,
                                                                       self.groups[g].window, self.retention_interval, seq.marks))
            for k in range(seq.cached[g], full):
                if table[k] != NULL_BLOCK and (mask is None or mask[k - seq.cached[g]]):
                    register((hashes[k], g), table[k])
                    if self.rules[g].one_block:
                        self._fresh.add((hashes[k], g))
            seq.cached[g] = full

    def _release(self, g: int, blocks: list[int]) -> None:
        """Drop one holder of each of group `g`'s `blocks`, given in vLLM's freeing order: the blocks
        no one holds are free, cached ones at the end of the free queue in that order, the others at
        its front in that order."""
        ref, park, front = self._ref, self._cache.park, []
        for b in blocks:
            ref[b] -= 1
            if ref[b] == 0:
                del ref[b]
                if not park(b):
                    front.append(b)
            else:
                self._dup[g] -= 1
        self._free.extendleft(reversed(front))
