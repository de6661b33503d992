"""Jenga's allocator (SOSP 2025, arXiv 2503.18292) with the scheduler's allocator interface: KV cache groups
that keep their own page sizes in bytes, over one pool of LCM-sized large pages (kvsim/alloc/jenga/pool.py).

What a sequence holds in each group follows the same per-kind rules as vLLM's hybrid KV cache manager,
taken from the hybrid package (`kvsim.alloc.hybrid.groups.make_rules`): `entries_for(tokens)` table
entries, the leading `skipped_entries(computed)` ones nulled and freed as a window or chunk moves on
(before a growth is counted, as vLLM's `allocate_slots` does), one state page per sequence for Mamba,
and the same admission gates (`can_allocate`: the whole sequence, each recycling group capped per
request; `can_hold`: this step's first chunk). Only where the pages come from differs: small pages of the group's own
size, placed request-aware inside large pages (pool.py), so the gate asks whether the counts fit the
two-level pool (a group's free small pages, then whole free large pages).

Invariants (`check_invariants`): every small page of a held large page is free or held by exactly one
(sequence, group) entry of that large page's group; a table has `entries_for(tokens)` entries whose
nulls are a prefix; each sequence's `homes` count its pages per large page; the counters equal their
sums; with prefix caching, the cached pages' bookkeeping (kvsim/alloc/jenga/cache.py). Prefix caching
(`prefix_caching=True`) and Jenga's prefix-subset evictor: cache.py. Refused with ValueError: more than
one sequence per request (forks), prefix caching with a Mamba group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvsim.alloc.base import AllocationError
from kvsim.alloc.hybrid import NULL_BLOCK
from kvsim.alloc.hybrid.groups import make_rules
from kvsim.alloc.jenga.accounting import JengaAccounting
from kvsim.alloc.jenga.cache import JengaPrefix, PageCache
from kvsim.alloc.jenga.pool import LargePagePool
from kvsim.alloc.jenga.spec import JengaGroup, plan_pool


@dataclass(slots=True)
class _Seq:
    """A live sequence: per group its table (page ids, NULL_BLOCK for skipped entries), leading nulls and
    home (large page -> its pages there); its written tokens and peak tokens (>= tokens)."""

    tables: list[list[int]]
    nulls: list[int]
    homes: list[dict[int, int]]
    tokens: int
    final: int
    hashes: list[int] = None  # prefix caching: hashes of its full pages so far (shareable, then own)
    salt: int = 0             # its id: the key of its own pages' hashes
    cached: list[int] = None  # per group: leading entries registered in the prefix cache


class JengaAllocator(JengaAccounting, JengaPrefix):
    """Jenga's two-level allocator over `pool_bytes` of KV memory (one GPU) for `groups` (JengaGroup, each
    with its page bytes); `block_size` tokens per attention page. `max_model_len`, `max_in_flight_tokens`
    and `prefill_chunk_tokens` mean what they mean for `hybrid.HybridAllocator` (the admission cap of
    sliding and chunked groups, and the first allocation's size). `empty_first`: a request whose own
    large pages are full opens a free large page before filling other requests' (pool.py, step 2).
    `prefix_caching`: prefix caching across groups with Jenga's evictor (kvsim/alloc/jenga/cache.py)."""

    def __init__(self, pool_bytes: int, block_size: int, groups: Sequence[JengaGroup], max_model_len: int,
                 max_in_flight_tokens: int, prefill_chunk_tokens: int | None = None,
                 prefix_caching: bool = False, empty_first: bool = True) -> None:
        if max_model_len < 1 or max_in_flight_tokens < 1:
            raise ValueError(f"max_model_len and max_in_flight_tokens must be >= 1, "
                             f"got {max_model_len} and {max_in_flight_tokens}")
        if prefix_caching and any(g.kind == "mamba" for g in groups):
            raise ValueError("prefix caching with a Mamba group is not modelled (vLLM needs its 'align' "
                             "Mamba cache mode for it); run without prefix caching")
        self.layout = plan_pool(pool_bytes, block_size, groups)
        self.block_size = block_size
        self.capacity_tokens = self.layout.capacity_tokens
        self.groups = tuple(groups)
        self.rules = [make_rules(g.spec, block_size, max_model_len, max_in_flight_tokens) for g in groups]
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.pool = LargePagePool(self.layout.num_large, self.layout.pages_per_large, empty_first)
        self._seqs: dict[int, _Seq] = {}
        self._sum_tokens = 0
        ng = len(self.groups)
        self._held = [0] * ng                # per group: small pages held
        self._nulls, self._freed = [0] * ng, [0] * ng   # per group: NULL_BLOCK entries; pages windows freed
        self._reach = [0] * ng               # per group: sum of min(final, entries x block_size)
        self._dup = [0] * ng                 # per group: sum over held pages of (holders - 1)
        self._cache = PageCache(ng) if prefix_caching else None
        self._ref: dict[tuple[int, int], int] = {}   # prefix caching: held (group, page) -> holders
        self._chained: tuple[object, list[int]] = ((), [])   # last content ids -> chained hashes
        self._spec_groups_cached = self._spec_groups()

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """An upper bound on the slots one sequence holds at once, in whole large pages: group g's peak
        pages (as the hybrid rules bound them) fill ceil(peak / pages_per_large[g]) large pages when the
        sequence is alone, so it can be served iff this is at most `capacity_tokens`."""
        self._one_sequence(num_seqs)
        first, per = self._first(num_tokens), self.layout.pages_per_large
        large = sum(-(-r.peak_blocks(num_tokens, final_tokens, first) // n) for r, n in zip(self.rules, per))
        return large * self.layout.slots_per_large

    def _drop_skipped(self, seq: _Seq) -> None:
        """Null and free the leading entries no later token reads (as the hybrid allocator does)."""
        computed, t = seq.tokens, None
        for g, rules in enumerate(self.rules):
            skip, z = rules.skipped_entries(computed), seq.nulls[g]
            if skip > z:
                table = seq.tables[g]
                skip = min(skip, len(table))
                dropped = table[z:skip]
                table[z:skip] = [NULL_BLOCK] * len(dropped)
                if self._cache is None:
                    self.pool.release(g, dropped, seq.homes[g])
                else:
                    t = self._tick() if t is None else t
                    self._release_cached(g, dropped, z, seq.homes[g], t)
                self._held[g] -= len(dropped)
                self._nulls[g] += len(dropped)
                self._freed[g] += len(dropped)
                seq.nulls[g] = skip

    def _need(self, seq: _Seq, num_tokens: int) -> list[int]:
        """Small pages per group `seq` takes to grow by `num_tokens` (after `_drop_skipped`)."""
        new = seq.tokens + num_tokens
        return [max(0, r.entries_for(new) - len(t)) for r, t in zip(self.rules, seq.tables)]

    # ---- allocate / grow / free ----------------------------------------------------------------
    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """The hybrid manager's admission gate (vLLM's `full_sequence_must_fit`) counted in the two-level
        pool: the whole sequence's pages, recycling groups capped per request, must fit. The pages of this
        step's first chunk must fit too: `can_hold`."""
        counts = [r.admission_blocks(num_tokens) for r in self.rules]
        if self._cache is None:
            return self.pool.fits(counts)
        hit, tables = self.find_hits(num_tokens, block_hashes, seq_id)
        return self._fits(self._past_hits(counts, hit, tables), tables)

    def can_hold(self, hold_tokens: int, num_tokens: int, block_hashes: Sequence[int] = (),
                 seq_id: int | None = None) -> bool:
        """Whether `allocate(seq_id, num_tokens, ..., hold_tokens=hold_tokens)` fits now (the scheduler
        asks it after `can_allocate`, as for the hybrid allocator)."""
        if self._cache is None:
            return self.pool.fits([r.entries_for(hold_tokens) for r in self.rules])
        hit, tables = self.find_hits(num_tokens, block_hashes, seq_id)
        counts = [r.entries_for(max(hold_tokens, hit)) for r in self.rules]
        return self._fits(self._past_hits(counts, hit, tables), tables)

    def _past_hits(self, counts: list[int], hit: int, tables: list[list[int]]) -> list[int]:
        """Pages per group a new sequence takes for `counts` entries past its hits and skipped head."""
        return [max(k - max(r.skipped_entries(hit), len(t)), 0) for k, r, t in zip(counts, self.rules, tables)]

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Give new `seq_id` the pages of `hold_tokens` (default `num_tokens`) tokens in every group; the
        rest come by `append`; with prefix caching its hits first (at least the hits are held). Returns
        the tokens the prefix cache served."""
        hit, tables, hold = self._admit(seq_id, num_tokens, block_hashes, hold_tokens)
        ng = len(self.rules)
        counts = [r.entries_for(hold) for r in self.rules]
        if tables is not None:
            counts = self._past_hits(counts, hit, tables)
        if not self._fits(counts, tables):
            raise AllocationError(f"sequence {seq_id}: pages {counts} per group do not fit")
        final = max(final_tokens, num_tokens)
        seq = _Seq([[] for _ in range(ng)], [0] * ng, [{} for _ in range(ng)], hold, final)
        if tables is not None:
            seq.hashes, seq.salt = self._hashes(block_hashes, None, len(block_hashes)), seq_id
            seq.cached = [0] * ng
            self._adopt(seq, hit, tables)
            self._make_room(counts)
        taken = self.pool.take_all(counts, seq.homes)
        for g, k in enumerate(counts):
            seq.tables[g].extend(taken[g])
            self._held[g] += k
            self._reach[g] += min(final, len(seq.tables[g]) * self.block_size)
        self._seqs[seq_id] = seq
        self._sum_tokens += hold
        if tables is not None:
            self._taken(taken)
            self._register(seq)
        return hit

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` can grow by `num_tokens` now (its out-of-window pages are freed first)."""
        seq = self._seq(seq_id)
        self._drop_skipped(seq)
        return self._fits(self._need(seq, num_tokens))

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` (it must fit); returns [] (nothing is shared)."""
        seq = self._seq(seq_id)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        self._drop_skipped(seq)
        need = self._need(seq, num_tokens)
        if not self._fits(need):
            raise AllocationError(f"sequence {seq_id}: pages {need} per group do not fit")
        self._grow(seq, num_tokens, need)
        return []

    def append_each(self, seq_ids: Sequence[int], start: int = 0,
                    copies: list[tuple[int, int]] | None = None) -> int:
        """One token for each of `seq_ids[start:]` in order, stopping before the first that cannot grow
        (its windows' pages freed all the same); returns how many grew."""
        for k in range(start, len(seq_ids)):
            seq = self._seq(seq_ids[k])
            self._drop_skipped(seq)
            need = self._need(seq, 1)
            if not self._fits(need):
                return k - start
            self._grow(seq, 1, need)
        return len(seq_ids) - start

    def _grow(self, seq: _Seq, num_tokens: int, need: list[int]) -> None:
        """Take `need[g]` pages of every group g for `num_tokens` more tokens."""
        bs, new = self.block_size, seq.tokens + num_tokens
        final = max(seq.final, new)
        taken = None
        if any(need):
            if self._cache is not None:
                self._make_room(need)
            taken = self.pool.take_all(need, seq.homes)
        for g, more in enumerate(need):
            table = seq.tables[g]
            entries = len(table)
            if more:
                table.extend(taken[g])
                self._held[g] += more
            if more or final != seq.final:
                self._reach[g] += min(final, len(table) * bs) - min(seq.final, entries * bs)
        seq.tokens, seq.final = new, final
        self._sum_tokens += num_tokens
        if self._cache is not None:
            if taken is not None:
                self._taken(taken)
            self._register(seq)

    def free(self, seq_id: int) -> None:
        """Release all of `seq_id`'s pages, group by group; its emptied large pages go back to the pool."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        bs, t = self.block_size, None if self._cache is None else self._tick()
        for g, table in enumerate(seq.tables):
            held = table[seq.nulls[g]:]
            if t is None:
                self.pool.release(g, held, seq.homes[g])
            else:
                self._release_cached(g, held, seq.nulls[g], seq.homes[g], t)
            self._held[g] -= len(held)
            self._nulls[g] -= seq.nulls[g]
            self._reach[g] -= min(seq.final, len(table) * bs)
        self._sum_tokens -= seq.tokens
