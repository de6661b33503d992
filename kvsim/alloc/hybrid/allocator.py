"""vLLM 0.33's hybrid KV cache manager as a kvsim allocator: KV cache groups of different layer kinds
(full, sliding window, chunked local, Mamba) drawing blocks from ONE shared pool, one block table per
group per sequence (`vllm/v1/core/kv_cache_coordinator.py` over `single_type_kv_cache_manager.py`).

Units: `num_blocks` blocks of `block_size` token slots shared by every group (the caller sizes the
pool: vLLM's page size is the same for all groups); lengths in tokens. A token of a sequence takes one
slot in each attention group's blocks, so `capacity_tokens` (blocks x block_size) counts slots, not
tokens of context.

Each step, as vLLM's `KVCacheManager.allocate_slots` does for a sequence that has `C` tokens computed
and grows by `n`: first every group nulls and frees its leading entries no later token reads
(`skipped_entries(C)`; the freed blocks of a group go back newest first), then each group takes blocks
until its table has `entries_for(C + n)` entries (null ones count). A table is append-only; its skipped
head holds `NULL_BLOCK` entries (vLLM's null block) that hold no pool block.

The free queue is vLLM 0.33's without prefix caching (`BlockPool.free_blocks`: uncached blocks are
prepended, last in first out): released blocks `_free`, then the never used ids `_top`.. in order, so block
ids equal vLLM's minus one (its block 0 is the null block).

Invariants (`check_invariants`): every pool block is exactly one of free (in `_free`, or never used: id
>= `_top`) or held by exactly one (sequence, group) entry; the nulls of a table are a prefix; a table
has `entries_for(tokens)` entries; the counters `_sum_tokens`, `_held`, `_nulls`, `_reach` equal their
sums over live sequences. Not supported, refused with ValueError: prefix caching, more than one
sequence per request (forks: parallel samples, beams).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ..base import AllocationError
from .accounting import HybridAccounting
from .groups import NEVER, NULL_BLOCK, GroupSpec, make_rules
from .windows import HybridWindows


@dataclass(slots=True)
class _Seq:
    """A live sequence: one table per group, its written tokens and peak tokens (>= tokens); `event`:
    the computed tokens from which its next one-token growth frees or takes a block (`_set_event`)."""

    tables: list[list[int]]
    nulls: list[int]          # per group: leading NULL_BLOCK entries
    tokens: int
    final: int
    event: int = 0


class HybridAllocator(HybridAccounting, HybridWindows):
    """One shared block pool under per-group block tables (vLLM's hybrid KV cache manager).

    `groups`: the KV cache groups in vLLM's group order. `max_model_len` and `max_in_flight_tokens`
    (vLLM's `VllmConfig.max_in_flight_tokens`: concurrent batches x max_num_batched_tokens) set the
    per-request admission cap of sliding and chunked groups. `prefill_chunk_tokens`: the most tokens a
    sequence's first allocation takes (max_num_batched_tokens with chunked prefill; None: a whole
    prompt at once), which bounds `peak_slots`."""

    def __init__(self, num_blocks: int, block_size: int, groups: Sequence[GroupSpec], max_model_len: int,
                 max_in_flight_tokens: int, prefill_chunk_tokens: int | None = None,
                 prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        if not groups or not all(isinstance(g, GroupSpec) for g in groups):
            raise ValueError("groups must be a non-empty sequence of GroupSpec")
        if max_model_len < 1 or max_in_flight_tokens < 1:
            raise ValueError(f"max_model_len and max_in_flight_tokens must be >= 1, "
                             f"got {max_model_len} and {max_in_flight_tokens}")
        if prefix_caching:
            raise ValueError("the hybrid allocator does not model prefix caching yet; run without it")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.capacity_tokens = num_blocks * block_size
        self.groups = tuple(groups)
        self.rules = [make_rules(g, block_size, max_model_len, max_in_flight_tokens) for g in groups]
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # decode steps free blocks (a sliding or chunked group): a waiting request may fit after any
        # step, so the scheduler runs no fast-forward window while one waits (Scheduler.steady_decodes)
        self.frees_while_decoding = any(g.kind in ("sliding", "chunked") for g in self.groups)
        self._top = 0                        # blocks [0, _top) have been used; the rest never were
        self._free: deque[int] = deque()     # released blocks below _top: the free queue's front
        self._seqs: dict[int, _Seq] = {}
        self._sum_tokens = 0                 # tokens written, over sequences
        ng = len(self.groups)
        self._held = [0] * ng                # per group: pool blocks held
        self._nulls = [0] * ng               # per group: NULL_BLOCK entries
        self._reach = [0] * ng               # per group: sum of min(final, entries x block_size)

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Pool blocks free now."""
        return self.num_blocks - self._top + len(self._free)

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise AllocationError(f"unknown sequence id {seq_id}") from None

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """0: no prefix caching."""
        return 0

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """An upper bound on the slots one sequence of `num_tokens` (peak `final_tokens`) holds at once:
        the sum over groups of each group's peak (they need not peak together)."""
        if num_seqs != 1:
            raise ValueError(f"the hybrid allocator serves one sequence per request, got {num_seqs} "
                             f"(parallel samples / beam search are not supported)")
        chunk = self.prefill_chunk_tokens
        first = num_tokens if chunk is None else min(num_tokens, chunk)
        return self.block_size * sum(r.peak_blocks(num_tokens, final_tokens, first) for r in self.rules)

    def _need(self, seq: _Seq, num_tokens: int) -> int:
        """Blocks `seq` takes to grow by `num_tokens` (after `_drop_skipped`)."""
        need, new = 0, seq.tokens + num_tokens
        for rules, table in zip(self.rules, seq.tables):
            more = rules.entries_for(new) - len(table)
            if more > 0:
                need += more
        return need

    def _drop_skipped(self, seq: _Seq) -> None:
        """Null and free the leading entries of `seq`'s tables that no later token reads (vLLM's
        `remove_skipped_blocks`, which `allocate_slots` runs before it counts free blocks): each group's
        freed blocks, newest first, go to the front of the free queue."""
        computed = seq.tokens
        for g, rules in enumerate(self.rules):
            skip = rules.skipped_entries(computed)
            z = seq.nulls[g]
            if skip > z:
                table = seq.tables[g]
                skip = min(skip, len(table))
                dropped = table[z:skip]
                table[z:skip] = [NULL_BLOCK] * len(dropped)
                self._free.extendleft(dropped)       # (so the front reads dropped[-1], ..., dropped[0])
                self._held[g] -= len(dropped)
                self._nulls[g] += len(dropped)
                seq.nulls[g] = skip
        # (`seq.event` may now be early, never late: an early event only sends it down the slow path)

    def _set_event(self, seq: _Seq) -> None:
        """File the computed tokens at which `seq`'s next one-token growth does more than count."""
        event = seq.tokens + NEVER
        for rules, table, z in zip(self.rules, seq.tables, seq.nulls):
            take, drop = rules.next_take(len(table)), rules.next_drop(z)
            if take < event:
                event = take
            if drop < event:
                event = drop
        seq.event = event if event > seq.tokens else seq.tokens

    # ---- allocate / grow / free ----------------------------------------------------------------
    def can_allocate(self, num_tokens: int, final_tokens: int = 0, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """vLLM's admission: the whole sequence's blocks, each recycling group capped per request, must
        be free, and so must the blocks of its first allocation (the first chunk, or all of it)."""
        chunk = self.prefill_chunk_tokens
        first = num_tokens if chunk is None else min(num_tokens, chunk)
        free = self.num_free_blocks
        return (sum(r.admission_blocks(num_tokens) for r in self.rules) <= free
                and sum(r.entries_for(first) for r in self.rules) <= free)

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Give new `seq_id` the blocks of `hold_tokens` (default `num_tokens`) tokens in every group
        (nothing is computed yet, so nothing is skipped); the rest come by `append`. Returns 0."""
        if seq_id in self._seqs:
            raise AllocationError(f"sequence id {seq_id} is already allocated")
        hold = num_tokens if hold_tokens is None else hold_tokens
        if not 1 <= hold <= num_tokens:
            raise AllocationError(f"sequence {seq_id}: hold_tokens {hold_tokens} outside 1..{num_tokens}")
        counts = [r.entries_for(hold) for r in self.rules]
        if sum(counts) > self.num_free_blocks:
            raise AllocationError(f"sequence {seq_id}: {sum(counts)} blocks needed, {self.num_free_blocks} free")
        final = max(final_tokens, num_tokens)
        seq = self._seqs[seq_id] = _Seq([self._take(k) for k in counts], [0] * len(counts), hold, final)
        self._set_event(seq)
        self._sum_tokens += hold
        bs = self.block_size
        for g, k in enumerate(counts):
            self._held[g] += k
            self._reach[g] += min(final, k * bs)
        return 0

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` can grow by `num_tokens` now. As in vLLM's `allocate_slots`, asking first
        frees the blocks that left its windows (never read again), so they count as free."""
        seq = self._seq(seq_id)
        self._drop_skipped(seq)
        return self._need(seq, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` (it must fit): free what left the windows, then take blocks.
        Returns [] (nothing is shared, so nothing is copied)."""
        seq = self._seq(seq_id)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
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
        for k in range(start, len(seq_ids)):
            seq = seqs.get(seq_ids[k]) or self._seq(seq_ids[k])
            tokens = seq.tokens
            if tokens < seq.event and tokens < seq.final:    # no block moves, no new reach
                seq.tokens = tokens + 1
                quick += 1
                continue
            self._drop_skipped(seq)
            if self._need(seq, 1) > self.num_free_blocks:
                self._sum_tokens += quick
                return k - start
            self._grow(seq, 1)
        self._sum_tokens += quick
        return len(seq_ids) - start

    def _grow(self, seq: _Seq, num_tokens: int) -> None:
        """Take the blocks of `num_tokens` more tokens in every group (after `_drop_skipped`)."""
        bs, new = self.block_size, seq.tokens + num_tokens
        final = max(seq.final, new)
        for g, rules in enumerate(self.rules):
            table = seq.tables[g]
            entries = len(table)
            more = rules.entries_for(new) - entries
            if more > 0:
                table.extend(self._take(more))
                self._held[g] += more
            if more > 0 or final != seq.final:
                self._reach[g] += min(final, len(table) * bs) - min(seq.final, entries * bs)
        seq.tokens, seq.final = new, final
        self._sum_tokens += num_tokens
        self._set_event(seq)

    def free(self, seq_id: int) -> None:
        """Release all of `seq_id`'s blocks, group by group, each table's last block to the front of the
        free queue first (vLLM 0.33 reuses uncached blocks last in, first out)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        bs = self.block_size
        for g, table in enumerate(seq.tables):
            held = table[seq.nulls[g]:]
            self._free.extendleft(held)
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
        fresh = num - reused
        blocks.extend(range(self._top, self._top + fresh))
        self._top += fresh
        return blocks

    # ---- sharing: not supported ----------------------------------------------------------------
    def can_fork(self, parent_id: int) -> bool:
        """False: the hybrid allocator holds one sequence per request."""
        return False

    def fork(self, parent_id: int, child_id: int) -> None:
        raise ValueError("the hybrid allocator does not fork sequences (parallel samples / beam search)")

    def refork(self, parent_id: int, child_id: int) -> int:
        raise ValueError("the hybrid allocator does not fork sequences (parallel samples / beam search)")
