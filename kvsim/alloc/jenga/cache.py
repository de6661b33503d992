"""Prefix caching for Jenga's two-level pool with a prefix-subset evictor (Zhang et al., "Jenga: Effective
Memory Management for Serving LLM with Heterogeneity", SOSP 2025, arXiv 2503.18292). A mixin of
`JengaAllocator` (kvsim/alloc/jenga/allocator.py).

Caching and hits are the hybrid package's (kvsim/alloc/hybrid/prefix.py, vLLM 0.33): every full small
page a sequence holds is cached in its group under (chained hash, group); a hit is the longest prefix
every group can serve (`HybridPrefix.find_hits` with each kind's `find_hit`: full attention from the
start, a sliding window its last cdiv(W - 1, block_size) pages, a chunked group its current chunk's).
A page whose last holder lets go stays cached (evictable: counted free) until it is evicted.

The evictor. What the public text says (the arXiv abstract and summaries of the paper): a "prefix-subset
evictor" with caching and eviction tailored to each layer kind's token dependencies (a sliding window
needs only the last tokens), hit lengths kept balanced across kinds (any kind's miss recomputes the whole
model), and the LCM allocator hands a large page to another kind only when all its small pages are free.
It gives no exact order, so this module uses the simplest rule consistent with that:
  1. stamps: every page freed in one release (a sequence's free, or its window's pages dropped at one
     step) gets stamp (t, -k), t the release's number, k the page's index in the table: older releases
     first, and within one release a request's later pages before its earlier ones, in every group, so
     what stays cached is a prefix in each group. A sliding group's pages that left the window were
     released earlier (while the request ran) than its last window's, so they go first;
  2. whole large pages first: a held large page none of whose small pages is in use ("idle": all free
     or cached) is evicted whole, the one whose newest stamp is oldest first (on a tie the lower large
     page id), and goes back to the pool for any kind;
  3. only when no large page is idle, single cached pages of a group short of pages, oldest stamp first.
The gate (`_fits`) counts idle large pages as free large pages and other cached pages as free small
pages of their group (a slight underestimate: an idle large page's own free pages are not offered to its
group apart from the whole page); the eviction (`_make_room`) realises that count. Refused: Mamba groups.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from kvsim.alloc.hybrid.groups import NULL_BLOCK
from kvsim.alloc.hybrid.prefix import HybridPrefix
from kvsim.alloc.paged.prefix import unique_hashes


class PageCache:
    """(hash, group) -> cached small page, and the evictable (cached, unheld) pages with their stamps.
    Pages are (group, page id) pairs; `lookup` has `PrefixCache.lookup`'s form for `find_hits`."""

    def __init__(self, num_groups: int) -> None:
        self.page_of: dict[tuple[int, int], int] = {}          # (hash, group) -> page id
        self.key_of: dict[tuple[int, int], tuple] = {}         # (group, page) -> its (hash, group)
        self.stamp: dict[tuple[int, int], tuple] = {}          # evictable (group, page) -> stamp
        self.in_large: dict[int, set[int]] = {}               # large page -> its evictable page ids
        self.evictable = [0] * num_groups                     # per group: evictable pages
        self.idle: dict[int, tuple[int, int, int]] = {}        # idle large -> (group, free, cached)
        self.idle_free = [0] * num_groups                     # per group: free pages in idle large pages
        self.idle_cached = [0] * num_groups                   # per group: cached pages in idle large pages
        self.large_heap: list = []                            # (newest stamp, large), lazily checked
        self.small_heap: list[list] = [[] for _ in range(num_groups)]   # (stamp, page), lazily checked
        self.clock = 0

    def lookup(self, keys: Sequence[tuple[int, int]], max_blocks: int) -> list[int]:
        """[the page caching keys[0]] or [] (only one key is ever asked)."""
        page = self.page_of.get(keys[0])
        return [] if page is None else [page]


class JengaPrefix:
    """`cached_tokens`, the gate with evictable pages, registration, release and eviction."""

    def find_hits(self, num_tokens: int, block_hashes=(), seq_id: int | None = None):
        """`HybridPrefix._find_hits` worked out at each call (no answer kept): (hit tokens, tables)."""
        return HybridPrefix._find_hits(self, num_tokens, block_hashes, seq_id)[:2]
    _hashes = HybridPrefix._hashes
    _spec_groups = HybridPrefix._spec_groups

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """Leading tokens of a new sequence of `num_tokens` the prefix cache serves now (0 without one)."""
        return 0 if self._cache is None else self.find_hits(num_tokens, block_hashes, seq_id)[0]

    def _tick(self) -> int:
        """The number of a new release (stamps' first part)."""
        self._cache.clock += 1
        return self._cache.clock

    def _fits(self, counts: Sequence[int], hits: list[list[int]] | None = None) -> bool:
        """Whether `counts[g]` more pages of each group g can be had, evicting cached pages if need be,
        after adopting the hit pages `hits` (per group; None: none): idle large pages count as free large
        pages, other cached pages as free pages of their group; an idle large page holding a hit page is
        no longer idle (its other pages count for its group), and a hit page is no longer evictable."""
        pool, c = self.pool, self._cache
        if pool.fits(counts):
            return True
        if c is None:
            return False
        large = pool.free_large + len(c.idle)
        small = [pool.free_small[g] - c.idle_free[g] + c.evictable[g] - c.idle_cached[g]
                 for g in range(len(counts))]
        busy: set[int] = set()
        for g, table in enumerate(hits or ()):
            n = pool.pages_per_large[g]
            for p in table:
                if p == NULL_BLOCK or (g, p) not in c.stamp:
                    continue
                small[g] -= 1
                idle = c.idle.get(p // n)
                if idle is not None and p // n not in busy:
                    busy.add(p // n)
                    large -= 1
                    small[g] += idle[1] + idle[2]
        for count, free, n in zip(counts, small, pool.pages_per_large):
            if count > free:
                large -= -(-(count - free) // n)
        return large >= 0

    def _make_room(self, counts: Sequence[int]) -> None:
        """Evict (the module's rule) until `pool.fits(counts)`; `_fits(counts)` must hold."""
        pool, c = self.pool, self._cache
        while not pool.fits(counts):
            large = self._pop_idle()
            if large is not None:
                g = c.idle[large][0]
                for page in list(c.in_large[large]):
                    self._evict(g, page)
                continue
            g = next((g for g, k in enumerate(counts) if k > pool.free_small[g] and c.evictable[g]), None)
            if g is None:
                raise AssertionError(f"pages {list(counts)} per group do not fit although the gate said so")
            heap = c.small_heap[g]
            while True:
                stamp, page = heapq.heappop(heap)
                if c.stamp.get((g, page)) == stamp:
                    break
            self._evict(g, page)

    def _pop_idle(self) -> int | None:
        """The idle large page whose newest stamp is oldest (None when none is idle)."""
        c = self._cache
        while c.idle:
            rank, large = heapq.heappop(c.large_heap)
            if large in c.idle and self._rank(large) == rank:
                return large
        return None

    def _rank(self, large: int) -> tuple:
        c = self._cache
        g = self.pool.owner[large]
        return max(c.stamp[(g, p)] for p in c.in_large[large])

    def _evict(self, g: int, page: int) -> None:
        """Forget cached evictable `page` of group `g` and free it."""
        c, large = self._cache, page // self.pool.pages_per_large[g]
        del c.page_of[c.key_of.pop((g, page))]
        del c.stamp[(g, page)]
        c.in_large[large].discard(page)
        if not c.in_large[large]:
            del c.in_large[large]
        c.evictable[g] -= 1
        self.pool.free_page(g, page)
        self._refresh(large)

    def _refresh(self, large: int) -> None:
        """Recount whether held `large` is idle (no page in use, some cached) and its share of the counts."""
        c, pool = self._cache, self.pool
        old = c.idle.pop(large, None)
        if old is not None:
            c.idle_free[old[0]] -= old[1]
            c.idle_cached[old[0]] -= old[2]
        g = pool.owner[large]
        cached = len(c.in_large.get(large, ()))
        if g < 0 or not cached:
            return
        free = pool.free_count(large)
        if free + cached == pool.pages_per_large[g]:
            c.idle[large] = (g, free, cached)
            c.idle_free[g] += free
            c.idle_cached[g] += cached
            if old is None or old[2] != cached:
                heapq.heappush(c.large_heap, (self._rank(large), large))

    # ---- holders ---------------------------------------------------------------------------------
    def _adopt(self, seq, hit: int, tables: list[list[int]]) -> None:
        """Give new `seq` its hit pages: the skipped head null, each hit page one more holder (an evictable
        one leaves the evictable pages)."""
        c, ref, pool = self._cache, self._ref, self.pool
        for g, (rules, found) in enumerate(zip(self.rules, tables)):
            skipped = rules.skipped_entries(hit)
            kept = [p for p in found[skipped:] if p != NULL_BLOCK]
            skipped = len(found) - len(kept) if len(found) > skipped else skipped
            n, home = pool.pages_per_large[g], seq.homes[g]
            for p in kept:
                large = p // n
                home[large] = home.get(large, 0) + 1
                if ref.get((g, p), 0) == 0:
                    del c.stamp[(g, p)]
                    c.in_large[large].discard(p)
                    if not c.in_large[large]:
                        del c.in_large[large]
                    c.evictable[g] -= 1
                    ref[(g, p)] = 1
                    self._refresh(large)
                else:
                    ref[(g, p)] += 1
                    self._dup[g] += 1
            seq.tables[g] = [NULL_BLOCK] * skipped + kept
            seq.nulls[g] = skipped
            seq.cached[g] = len(seq.tables[g])
            self._held[g] += len(kept)
            self._nulls[g] += skipped

    def _taken(self, taken: list[list[int]]) -> None:
        """Pages just taken from the pool: one holder each; their large pages are no longer idle."""
        ref, idle, n = self._ref, self._cache.idle, self.pool.pages_per_large
        for g, pages in enumerate(taken):
            for p in pages:
                ref[(g, p)] = 1
                if p // n[g] in idle:
                    self._refresh(p // n[g])

    def _register(self, seq) -> None:
        """Cache `seq`'s full pages not cached yet in every group (a key cached already keeps its page)."""
        full = seq.tokens // self.block_size
        if min(seq.cached) >= full:
            return
        if len(seq.hashes) < full:
            seq.hashes = seq.hashes + unique_hashes(seq.salt, len(seq.hashes), full)
        c = self._cache
        for g, table in enumerate(seq.tables):
            for k in range(seq.cached[g], full):
                key = (seq.hashes[k], g)
                if table[k] != NULL_BLOCK and key not in c.page_of and (g, table[k]) not in c.key_of:
                    c.page_of[key] = table[k]
                    c.key_of[(g, table[k])] = key
            seq.cached[g] = full

    def _release_cached(self, g: int, pages: Sequence[int], first: int, home: dict[int, int], t: int) -> None:
        """Drop one holder of each of group `g`'s `pages` (table entries first, first + 1, ...): a page no
        one holds stays cached (evictable, stamp (t, -index)) or, uncached, is freed."""
        c, ref, n = self._cache, self._ref, self.pool.pages_per_large[g]
        for k, p in enumerate(pages, first):
            large = p // n
            left = home[large] - 1
            if left:
                home[large] = left
            else:
                del home[large]
            ref[(g, p)] -= 1
            if ref[(g, p)]:
                self._dup[g] -= 1
                continue
            del ref[(g, p)]
            if (g, p) in c.key_of:
                c.stamp[(g, p)] = stamp = (t, -k)
                c.in_large.setdefault(large, set()).add(p)
                c.evictable[g] += 1
                heapq.heappush(c.small_heap[g], (stamp, p))
                self._refresh(large)
            elif not self.pool.free_page(g, p):
                self._refresh(large)

    # ---- checks ------------------------------------------------------------------------------------
    def _cached_large(self) -> list[int]:
        """Held large pages with a cached evictable page (none without prefix caching)."""
        return [] if self._cache is None else list(self._cache.in_large)

    def _check_cache(self, holders: dict[tuple[int, int], int]) -> list[int]:
        """Assert the cache's bookkeeping against `holders` ((group, page) -> live table entries holding
        it); returns the evictable pages per group."""
        c, pool, ng = self._cache, self.pool, len(self.rules)
        assert holders == self._ref, "holder counts drifted"
        assert all(c.page_of.get(key) == page for (g, page), key in c.key_of.items()), "cache maps disagree"
        assert len(c.page_of) == len(c.key_of), "cache maps disagree"
        evictable, idle = [0] * ng, {}
        for (g, page), stamp in c.stamp.items():
            large = page // pool.pages_per_large[g]
            assert (g, page) in c.key_of and (g, page) not in holders, f"evictable page {page} of group {g}"
            assert pool.owner[large] == g and page % pool.pages_per_large[g] not in pool.free_slots(large)
            assert page in c.in_large[large], f"page {page} of group {g} missing from its large page's set"
            evictable[g] += 1
        assert sum(map(len, c.in_large.values())) == len(c.stamp), "large page sets drifted"
        assert evictable == c.evictable, "evictable counters drifted"
        for (g, page) in c.key_of:
            assert (g, page) in holders or (g, page) in c.stamp, f"cached page {page} of group {g} lost"
        for large, pages in c.in_large.items():
            g = pool.owner[large]
            if pool.free_count(large) + len(pages) == pool.pages_per_large[g]:
                idle[large] = (g, pool.free_count(large), len(pages))
        assert idle == c.idle, f"idle large pages drifted: {c.idle} != {idle}"
        assert [sum(v[1] for v in idle.values() if v[0] == g) for g in range(ng)] == c.idle_free
        assert [sum(v[2] for v in idle.values() if v[0] == g) for g in range(ng)] == c.idle_cached
        return evictable
