"""The hybrid allocator's fast-forward (kvsim/engine/step.py windows): many decode steps of a steady batch
in one call, with blocks freed and taken in the same order, and the same memory after each step, as
`append_each` one step at a time. A mixin of `HybridAllocator` (kvsim/alloc/hybrid/allocator.py).

A sequence's blocks move only at its events (`_Seq.event`: the computed tokens at which its next
one-token growth frees blocks that left a window or needs a new entry); between events a step only counts
a token. Both methods walk the events of the window in (step, batch order), never the idle steps.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Sequence

from kvsim.alloc.base import MemoryStats
from kvsim.alloc.hybrid.groups import NEVER, NULL_BLOCK


class HybridWindows:
    """`_drop_skipped`, `_set_event`, `decode_window` / `append_steps` of `HybridAllocator`, and the async-scheduling lag
    of its window frees (`async_lag`, `_processed`, `hold_still`)."""

    #: vLLM's async scheduling (kvsim/engine/batching/settle.py sets it): windows free blocks only from
    #: the tokens whose batch has completed (`_processed`); events stay as without (early: safe)
    async_lag = False

    def _processed(self, seq) -> int:
        """Tokens of `seq` whose step has completed: all of them, or under async scheduling
        (`async_lag`) all but those of the batch still in flight, which vLLM 0.33's `allocate_slots`
        frees windows from (`total_computed_tokens - request.num_in_flight_tokens`): the tokens before
        its last growth if that was the previous step (`lag_to`; `hold_still` marks a step without
        one), else one less (a decode token each step)."""
        if not self.async_lag:
            return seq.tokens
        return seq.lag_from if seq.tokens == seq.lag_to else seq.tokens - 1

    def register_known(self, seq_id: int) -> None:
        """Async scheduling: `seq_id`'s last step completed (its outputs arrived), so its full blocks
        are cached (vLLM's `update_from_output` -> `cache_blocks`), e.g. before it is freed finished."""
        if self._cache is not None:
            self._register(self._seq(seq_id))

    def hold_still(self, seq_id: int) -> None:
        """Async scheduling: `seq_id` is running but grows by nothing in this step (a prefill chunk
        left without token budget), so at the next step none of its tokens is in flight."""
        seq = self._seq(seq_id)
        seq.lag_from = seq.lag_to = seq.tokens

    def _drop_skipped(self, seq) -> None:
        """Null and free the leading entries of `seq`'s tables that no later token reads (vLLM's
        `remove_skipped_blocks`, which `allocate_slots` runs before it counts free blocks): each group's
        freed blocks, newest first, go to the front of the free queue."""
        computed = seq.tokens if not self.async_lag else self._processed(seq)
        for g, rules in self._dropping:
            skip = rules.skipped_entries(computed)
            z = seq.nulls[g]
            if skip > z:
                table = seq.tables[g]
                skip = min(skip, len(table))
                dropped = table[z:skip]
                table[z:skip] = [NULL_BLOCK] * len(dropped)
                if rules.one_block:         # (align-mode Mamba: nulls between its state blocks)
                    dropped = [b for b in dropped if b != NULL_BLOCK]
                if self._cache is None:
                    self._free.extendleft(dropped)   # (so the front reads dropped[-1], ..., dropped[0])
                else:
                    self._release(g, dropped[::-1])
                self._held[g] -= len(dropped)
                self._nulls[g] += len(dropped)
                self._freed[g] += len(dropped)
                seq.nulls[g] = skip
        # (`seq.event` may now be early, never late: an early event only sends it down the slow path)

    def _give_blocks(self, seq, takers: list[int]) -> None:
        """Append a block from the pool to each of `seq`'s groups `takers` (as many free, checked)."""
        bs, final, held, reach, tables = self.block_size, seq.final, self._held, self._reach, seq.tables
        for g, block in zip(takers, self._take(len(takers))):
            table = tables[g]
            slots = len(table) * bs
            table.append(block)
            held[g] += 1
            reach[g] += min(final, slots + bs) - min(final, slots)

    def _set_event(self, seq) -> None:
        """File the computed tokens at which `seq`'s next one-token growth does more than count."""
        bs, tokens = self.block_size, seq.tokens
        event = tokens + NEVER
        if self._cache is not None and seq.at < 0:   # its next full block is registered (not ticking:
            # kvsim/alloc/hybrid/ticks.py registers a ticking sequence's blocks at its next event)
            event = -(-(tokens + 1) // bs) * bs - 1 if not self.async_lag else -(-tokens // bs) * bs
        tables, nulls = seq.tables, seq.nulls
        for g in self._take_ids:        # (`next_take` of every taking kind: entries x block_size)
            take = len(tables[g]) * bs
            if take < event:
                event = take
        for g, next_drop in self._drop_next:
            drop = next_drop(nulls[g])
            if drop < event:
                event = drop
        seq.event = event if event > tokens else tokens

    def _step_one(self, seq) -> bool:
        """Grow `seq` by one token at one of its events, as `_drop_skipped`, `_need` and `_grow(seq, 1)`
        do; False (its windows' blocks freed all the same) when a block it needs is not free. One token
        takes at most one block per attention group: exactly those whose entries x block_size <= C."""
        c, bs = seq.tokens, self.block_size
        if c >= seq.final:                   # its peak grows: the general path keeps the reach
            self._drop_skipped(seq)
            if self._need(seq, 1) > self.num_free_blocks:
                return False
            self._grow(seq, 1)
            return True
        nulls, tables = seq.nulls, seq.tables
        for g, next_drop in self._drop_next:
            if next_drop(nulls[g]) <= c:
                self._drop_skipped(seq)
                break
        takers = [g for g in self._take_ids if len(tables[g]) * bs <= c]
        if takers:
            if len(takers) > self.num_free_blocks:
                return False
            self._give_blocks(seq, takers)
        seq.tokens = c + 1
        self._sum_tokens += 1
        if self._cache is not None:      # (async: the token sampled last step is not known yet)
            self._register(seq, c if self.async_lag else None)
        self._set_event(seq)
        return True

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` `append_steps` can run at once: no
        sequence passes its final length and, at every step, the blocks free before it cover all the
        blocks the step takes (the blocks it frees are not counted: a safe, not always longest, window).
        When the free blocks cover every take of the window, a closed form says so; else the window's
        events are walked."""
        return self._window([self._seq(s) for s in seq_ids], max_steps)

    def _window(self, seqs: list, max_steps: int) -> int:
        """`decode_window` of the live sequences `seqs` (up to date; in any order)."""
        steps = min([max_steps, *(s.final - s.tokens for s in seqs)])
        if steps < 1 or not seqs:
            return max(steps, 0)
        # quick bound, frees ignored: table g of a sequence takes a block at steps room, room + bs, ...
        # (room = entries x bs - tokens); in each round of bs steps each table takes one, in order of room
        bs, free, taking = self.block_size, self.num_free_blocks, self._taking
        rooms = sorted(len(s.tables[g]) * bs - s.tokens for s in seqs for g, _ in taking)
        if not rooms or (free // len(rooms)) * bs + rooms[free % len(rooms)] >= steps:
            return steps
        rules, state, heap = self.rules, [], []
        ref = self._ref if self._cache is not None else None
        lag = self.async_lag
        for k, seq in enumerate(seqs):
            state.append(([len(t) for t in seq.tables], list(seq.nulls)))
            if seq.event - seq.tokens < steps:
                heappush(heap, (seq.event - seq.tokens, k))
        step, takes, drops = 0, 0, 0        # free before `step`, its takes, drops
        while heap:
            j, k = heappop(heap)
            if j > step:                      # step `step` is complete: did its takes fit?
                if takes > free:
                    return step
                free, step, takes, drops = free + drops - takes, j, 0, 0
            entries, nulls = state[k]
            computed = seqs[k].tokens + j
            # (async scheduling: frees counted from the processed tokens, as `_drop_skipped` frees)
            processed = computed if not lag else self._processed(seqs[k]) if j == 0 else computed - 1
            event = computed + 1 + steps
            for g, r in enumerate(rules):
                skip = r.skipped_entries(processed)
                if skip > nulls[g]:
                    if ref is None:
                        drops += skip - nulls[g]
                    else:        # a block shared through the prefix cache is not freed (counted safe)
                        table = seqs[k].tables[g]
                        drops += sum(i >= len(table) or ref.get(table[i]) == 1 for i in range(nulls[g], skip))
                    nulls[g] = skip
                more = r.entries_for(computed + 1) - entries[g]
                if more > 0:
                    takes += more
                    entries[g] += more
                event = min(event, r.next_take(entries[g]), r.next_drop(nulls[g]))
            nxt = max(event, computed + 1) - seqs[k].tokens
            if nxt < steps:
                heappush(heap, (nxt, k))
        return step if takes > free else steps

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` within what `decode_window` allowed (blocks freed and
        taken in the same order); returns `stats()` after each step."""
        seqs = [self._seq(s) for s in seq_ids]
        for seq in seqs:               # (not with ticks: they grow the same sequences)
            self._untick(seq)
        start = [s.tokens for s in seqs]
        heap = [(s.event - c, k) for k, (s, c) in enumerate(zip(seqs, start)) if s.event - c < steps]
        heap.sort()
        snapshots, num = [], len(seqs)
        for j in range(steps):
            moved = 0
            while heap and heap[0][0] == j:
                _, k = heappop(heap)
                seq = seqs[k]
                seq.tokens = start[k] + j
                if not self._step_one(seq):      # (counts its token, files its next event)
                    raise AssertionError("append_steps ran past its decode_window")
                moved += 1
                if seq.event - start[k] < steps:
                    heappush(heap, (seq.event - start[k], k))
            self._sum_tokens += num - moved
            snapshots.append(self.stats())
        for seq, c in zip(seqs, start):
            seq.tokens = c + steps
        return snapshots
