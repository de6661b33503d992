"""vLLM 0.33's hybrid KV cache manager as a kvsim allocator: KV cache groups of different layer kinds
(full, sliding window, chunked local, Mamba) drawing blocks from ONE shared pool, one block table per
group per sequence (`vllm/v1/core/kv_cache_coordinator.py` over `single_type_kv_cache_manager.py`).

Units: `num_blocks` blocks of `block_size` token slots shared by every group (vLLM's page size is the same
for all groups); lengths in tokens. A token takes one slot in each attention group's blocks, so
`capacity_tokens` (blocks x block_size) counts slots, not tokens of context.

Each step, as vLLM's `KVCacheManager.allocate_slots` does for a sequence with `C` tokens computed growing
by `n`: every group nulls and frees its leading entries no later token reads (`skipped_entries(C)`, C less
the tokens in flight under async scheduling: windows.py `_processed`; freed newest first), then takes blocks
until its table has `entries_for(C + n)` entries (nulls count). A table is append-only; its skipped head
holds `NULL_BLOCK` entries (vLLM's null block), no pool block.

The free queue is vLLM 0.33's (`BlockPool.free_blocks`: uncached blocks prepended, last in first out;
cached ones appended): released uncached blocks `_free`, the never used ids `_top`.., then the evictable
cached blocks (least recently freed first), so block ids equal vLLM's minus one (its 0 is the null block).

Invariants (`check_invariants`): every pool block is exactly one of free (in `_free`, never used: id
>= `_top`, or evictable) or held; without prefix caching a held block is in exactly one (sequence, group)
entry, with it in as many entries of one group as its reference count (hits share full blocks); the
nulls of a table are a prefix (a Mamba group in align mode may also hold nulls between its two state
blocks: kvsim/alloc/hybrid/mamba.py); a table has `entries_for(tokens)` entries; the counters `_sum_tokens`,
`_held`, `_nulls` (null entries), `_reach`, `_dup` equal their sums over live sequences. Refused with
ValueError: more than one sequence per request (forks: parallel samples, beams).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from kvsim.alloc.base import AllocationError
from kvsim.alloc.paged.prefix import PrefixCache
from kvsim.alloc.hybrid.accounting import HybridAccounting
from kvsim.alloc.hybrid.groups import NEVER, NULL_BLOCK, GroupSpec, make_rules
from kvsim.alloc.hybrid.mamba import HybridMamba
from kvsim.alloc.hybrid.prefix import HybridPrefix
from kvsim.alloc.hybrid.retention import DEFAULT_RETENTION
from kvsim.alloc.hybrid.ticks import HybridTicks
from kvsim.alloc.hybrid.windows import HybridWindows


@dataclass(slots=True)
class _Seq:
    """A live sequence: one table per group, its written tokens and peak tokens (>= tokens); `event`:
    the computed tokens from which its next one-token growth frees or takes a block (`_set_event`)."""

    tables: list[list[int]]
    nulls: list[int]          # per group: leading NULL_BLOCK entries
    tokens: int
    final: int
    event: int = 0
    hashes: list[int] = None  # prefix caching: hashes of its full blocks so far (shareable, then own)
    salt: int = 0             # its id: the key of its own blocks' hashes
    cached: list[int] = None  # per group: leading entries registered in the prefix cache
    at: int = -1              # ticking (kvsim/alloc/hybrid/ticks.py): the tick `tokens` is as of; -1: not
    due: int = -1             # ticking: the tick of its next event
    key: int = 0              # ticking: its place in the order sequences started ticking
    marks: tuple = ()         # prefix caching: its reachable token boundaries (retention.py)
    lag_from: int = -1        # async scheduling: its last growth, from lag_from to lag_to tokens (`_processed`)
    lag_to: int = -1          # (hits count as grown-from: `allocate`)
    junction: int = 0         # prefix caching: vLLM's shared_prefix_boundary at its admission (0: none)
    prefill_end: int = 0      # align-mode Mamba: vLLM's prefill end (mamba.py `_prefill_end`)
    known: int = 0            # prefix caching: tokens known at its admission (prompt + outputs so far)


class HybridAllocator(HybridTicks, HybridAccounting, HybridPrefix, HybridWindows, HybridMamba):
    """One shared block pool under per-group block tables (vLLM's hybrid KV cache manager).

    `groups`: the KV cache groups in vLLM's order. `max_model_len` and `max_in_flight_tokens` (vLLM's
    `VllmConfig.max_in_flight_tokens`: concurrent batches x max_num_batched_tokens) set the sliding and
    chunked groups' admission cap. `prefill_chunk_tokens`: the most tokens a first allocation takes
    (None: a whole prompt), which bounds `peak_slots`. `prefix_caching`: vLLM's automatic prefix caching
    (prefix.py; Mamba groups then in vLLM's "align" mode, mamba.py), sliding and Mamba groups thinned by
    `retention_interval` (vLLM's --prefix-cache-retention-interval: 0, a multiple of block_size, or None;
    retention.py)."""

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[GroupSpec], max_model_len: int,
                 max_in_flight_tokens: int, prefill_chunk_tokens: int | None = None,
                 prefix_caching: bool = False, retention_interval: int | None = DEFAULT_RETENTION,
                 mamba_checkpoints: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        if not groups or not all(isinstance(g, GroupSpec) for g in groups):
            raise ValueError("groups must be a non-empty sequence of GroupSpec")
        if max_model_len < 1 or max_in_flight_tokens < 1:
            raise ValueError(f"max_model_len and max_in_flight_tokens must be >= 1, "
                             f"got {max_model_len} and {max_in_flight_tokens}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.capacity_tokens = num_blocks * block_size
        self.groups = tuple(groups)
        self.rules = [make_rules(g, block_size, max_model_len, max_in_flight_tokens, prefix_caching,
                                 mamba_checkpoints) for g in groups]
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # decode steps free blocks (a sliding or chunked group): a waiting request may fit after any
        # step, so the scheduler runs no fast-forward window while one waits (Scheduler.steady_decodes)
        self._dropping = [(g, r) for g, r in enumerate(self.rules) if r.next_drop(0) < NEVER]
        self.frees_while_decoding = bool(self._dropping)
        self._taking = [(g, r) for g, r in enumerate(self.rules) if r.takes]   # (hot-loop subsets)
        # the decode fast path's views: groups taking entries (`FullRules.next_take`), bound `next_drop`s
        self._take_ids = [g for g, _ in self._taking]
        self._drop_next = [(g, r.next_drop) for g, r in self._dropping]
        self._top = 0                        # blocks [0, _top) have been used; the rest never were
        self._free: deque[int] = deque()     # released blocks below _top: the free queue's front
        self._seqs: dict[int, _Seq] = {}
        self._sum_tokens = 0                 # tokens written, over sequences
        ng = len(self.groups)
        self._held = [0] * ng                # per group: pool blocks held
        self._nulls, self._freed = [0] * ng, [0] * ng   # per group: NULL_BLOCK entries; blocks windows freed
        self._reach = [0] * ng               # per group: sum of min(final, entries x block_size)
        self._dup = [0] * ng                 # per group: sum over held blocks of (holders - 1)
        self._cache = PrefixCache() if prefix_caching else None   # keys: (hash, group)
        self._ref: dict[int, int] = {}       # prefix caching: held block -> holders
        self._chained: tuple[object, list[int]] = ((), [])        # last content ids -> chained hashes
        self._spec_groups_cached = self._spec_groups()
        self._sparse = self._sparse_groups(retention_interval, prefix_caching)
        self._clock = self._ticking = self._joins = 0      # lazy decode ticks (HybridTicks)
        self._due, self._pending = {}, None    # tick -> [(join key, sequence)]; a tick left half done
        self._fresh, self.mamba_checkpoints = set(), mamba_checkpoints
        self._mamba_init()

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Pool blocks free now (evictable cached ones included)."""
        free = self.num_blocks - self._top + len(self._free)
        return free if self._cache is None else free + self._cache.num_evictable

    def _need(self, seq: _Seq, num_tokens: int) -> int:
        """Blocks `seq` takes to grow by `num_tokens` (after `_drop_skipped`)."""
        need, new, tables = 0, seq.tokens + num_tokens, seq.tables
        for g, rules in self._taking:
            more = rules.entries_for(new) - len(tables[g])
            if more > 0:
                need += (2 if self._checkpoint(seq.tokens, new, seq.prefill_end) else 1) if rules.one_block else more
        return need

    # ---- allocate / grow / free ----------------------------------------------------------------
    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """vLLM's admission gate (`full_sequence_must_fit`): the blocks of the whole sequence, each
        recycling group capped per request, less its prefix-cache hits, plus the evictable hit blocks,
        must be free. The blocks of this step's first chunk must fit too: `can_hold`."""
        if self._cache is None:
            return sum(r.admission_blocks(num_tokens) for r in self.rules) <= self.num_free_blocks
        hit, tables = self.find_hits(num_tokens, block_hashes, seq_id)
        return self._blocks_to_allocate(num_tokens, hit, tables, True, seq_id, num_tokens) <= self.num_free_blocks

    def can_hold(self, hold_tokens: int, num_tokens: int, block_hashes: Sequence[int] = (),
                 seq_id: int | None = None) -> bool:
        """Whether `allocate(seq_id, num_tokens, ..., block_hashes, hold_tokens)` fits now (vLLM's
        per-step check of `allocate_slots`: the blocks of the tokens this step computes, hits counted).
        The scheduler asks it after `can_allocate` (kvsim/engine/batching/scheduler.py `_admit`)."""
        if self._cache is None:
            return sum(r.entries_for(hold_tokens) for r in self.rules) <= self.num_free_blocks
        hit, tables = self.find_hits(num_tokens, block_hashes, seq_id)
        return (self._blocks_to_allocate(max(hold_tokens, hit), hit, tables, False, seq_id, num_tokens)
                <= self.num_free_blocks)

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Give new `seq_id` its prefix-cache hits and the blocks of `hold_tokens` (default
        `num_tokens`; at least the hits) tokens in every group (nothing skipped but the hits' head);
        the rest come by `append`. Returns the tokens the prefix cache served."""
        hit, hits, hold = self._admit(seq_id, num_tokens, block_hashes, hold_tokens)
        ng = len(self.rules)
        need = self._blocks_to_allocate(hold, hit, hits or [[]] * ng, False, seq_id, num_tokens)
        if need > self.num_free_blocks:
            raise AllocationError(f"sequence {seq_id}: {need} blocks needed, {self.num_free_blocks} free")
        final, bs = max(final_tokens, num_tokens), self.block_size
        seq = self._seqs[seq_id] = _Seq([[] for _ in range(ng)], [0] * ng, hold, final, lag_from=hit, lag_to=hold)
        if hits is not None:
            seq.hashes, seq.salt, seq.cached = self._hashes(block_hashes, None, len(block_hashes)), seq_id, [0] * ng
            seq.junction, seq.prefill_end = self._junction, self._prefill_end(seq_id, num_tokens)
            seq.known = num_tokens
            self._adopt_hits(seq, hit, hits, num_tokens)
        ckpt = self._checkpoint(hit, hold, seq.prefill_end)
        for g, rules in enumerate(self.rules):
            table = seq.tables[g]
            more = rules.entries_for(hold) - len(table)
            if more > 0:
                self._extend(table, g, rules, more, ckpt)
            self._reach[g] += min(final, len(table) * bs)
        self._sum_tokens += hold
        if hits is not None:
            self._register(seq)
        self._set_event(seq)
        return hit

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` can grow by `num_tokens` now. As in vLLM's `allocate_slots`, asking first
        frees the blocks that left its windows (never read again), so they count as free."""
        seq = self._seq(seq_id)
        self._untick(seq)
        self._drop_skipped(seq)
        return self._need(seq, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` (it must fit): free what left the windows, then take blocks.
        Returns [] (nothing is shared, so nothing is copied)."""
        seq = self._seq(seq_id)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        self._untick(seq)
        self._drop_skipped(seq)
        need = self._need(seq, num_tokens)
        if need > self.num_free_blocks:
            raise AllocationError(f"sequence {seq_id}: {need} blocks needed, {self.num_free_blocks} free")
        self._grow(seq, num_tokens)
        return []

    def append_each(self, seq_ids: Sequence[int], start: int = 0,
                    copies: list[tuple[int, int]] | None = None) -> int:
        """One token for each of `seq_ids[start:]` in order, stopping before the first that cannot
        grow (its window's blocks freed all the same, see `can_append`); returns how many grew
        (`copies` stays untouched: nothing is shared). A sequence before its `event` only counts."""
        seqs, quick = self._seqs, 0
        if self._ticking:                # (not with ticks: they grow the same sequences)
            for k in range(start, len(seq_ids)):
                self._untick(self._seq(seq_ids[k]))
        for k in range(start, len(seq_ids)):
            seq = seqs.get(seq_ids[k]) or self._seq(seq_ids[k])
            tokens = seq.tokens
            if tokens < seq.event and tokens < seq.final:    # no block moves, no new reach
                seq.tokens = tokens + 1
                quick += 1
                continue
            if not self._step_one(seq):
                self._sum_tokens += quick
                return k - start
        self._sum_tokens += quick
        return len(seq_ids) - start

    def _grow(self, seq: _Seq, num_tokens: int) -> None:
        """Take the blocks of `num_tokens` more tokens in every group (after `_drop_skipped`)."""
        bs, new = self.block_size, seq.tokens + num_tokens
        final = max(seq.final, new)
        ckpt = num_tokens > 1 and self._checkpoint(seq.tokens, new, seq.prefill_end)
        for g, rules in (self._taking if final == seq.final else enumerate(self.rules)):
            table = seq.tables[g]
            entries = len(table)
            more = rules.entries_for(new) - entries
            if more > 0:
                self._extend(table, g, rules, more, ckpt)
            if more > 0 or final != seq.final:
                self._reach[g] += min(final, len(table) * bs) - min(seq.final, entries * bs)
        # (async scheduling caches up to the known tokens: the prompt, and the outputs of the completed steps)
        known = new if not self.async_lag else min(new, max(seq.known, self._processed(seq) + 1))
        seq.lag_from, seq.lag_to, seq.tokens, seq.final = seq.tokens, new, new, final
        self._sum_tokens += num_tokens
        if self._cache is not None:
            self._register(seq, known)
        self._set_event(seq)

    def free(self, seq_id: int) -> None:
        """Release all of `seq_id`'s blocks, group by group, each table's last block to the front of the
        free queue first (vLLM 0.33 reuses uncached blocks last in, first out)."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        self._untick(seq)
        del self._seqs[seq_id]
        bs = self.block_size
        for g, table in enumerate(seq.tables):
            held = table[seq.nulls[g]:]
            if self.rules[g].one_block:
                held = [b for b in held if b != NULL_BLOCK]
                self._nulls[g] -= len(table) - seq.nulls[g] - len(held)
            if self._cache is None:
                self._free.extendleft(held)
            else:
                self._release(g, held[::-1])
            self._held[g] -= len(held)
            self._nulls[g] -= seq.nulls[g]
            self._reach[g] -= min(seq.final, len(table) * bs)
        self._sum_tokens -= seq.tokens

    def _take(self, num: int) -> list[int]:
        """`num` free blocks from the front of vLLM's free queue: released blocks (last released
        first), then never used ones in increasing order."""
        free = self._free
        reused = min(num, len(free))
        blocks = [free.popleft() for _ in range(reused)]
        fresh = min(num - reused, self.num_blocks - self._top)
        blocks.extend(range(self._top, self._top + fresh))
        self._top += fresh
        if self._cache is not None:       # then the evictable cached blocks, least recently freed first
            evict, ref = self._cache.evict_lru, self._ref
            for _ in range(num - len(blocks)):
                blocks.append(evict())
            for b in blocks:
                ref[b] = 1
        return blocks
