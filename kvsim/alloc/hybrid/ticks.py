"""Lazy decode ticks of the hybrid allocator (the scheduler's lazy decode steps, kvsim/engine/batching/lazy_decode.py):
a tick grows every ticking sequence by one token and touches only those at one of their events (`_Seq.event`,
kvsim/alloc/hybrid/windows.py: the next one-token growth frees blocks that left a window, takes a block or
registers a full block in the prefix cache), in the order they started ticking (the batch's order), so the
blocks are freed and taken in the order `append_each` over the batch takes them, one step at a time.
A mixin of `HybridAllocator`.

A ticking sequence's `tokens` are as of tick `at`: it holds `tokens + _clock - at` tokens. It is filed in
`_due` under the tick at which it reaches min(event, final) tokens, as (join key, sequence); a tick sorts
its list by key. Any other use of a ticking sequence brings it up to date (`_seq`); growing or freeing it
another way stops its ticking (`_untick`: its filed entry goes stale and is skipped).

With a prefix cache, a ticking sequence's filled blocks are registered at its next event or when it is
brought up to date, not as each fills (so filling a block is no event of its own while it ticks, and its
`event` leaves that out: `_set_event`). Every block it fills while decoding is past its prompt's shareable
blocks, so its hash is salted by the sequence (kvsim/alloc/paged/prefix.py `unique_hashes`): no other
sequence's lookup can find it, it is registered before any window drops it or the sequence is freed (and
parked, then, as the per-sequence path parks it), and the cache shows the same contents to every reader.
"""

from __future__ import annotations

from kvsim.alloc.base import AllocationError, JoinsEach, MemoryStats
from kvsim.alloc.hybrid.groups import NEVER, NULL_BLOCK


class HybridTicks(JoinsEach):
    """`can_tick`, `tick_join`, `tick`, `tick_window` and `tick_steps` of `HybridAllocator`."""

    can_tick = True
    _tick_drops: list | None = None     # (group, window or 0, chunk or 0) of the groups that drop blocks

    def _seq(self, seq_id: int):
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        if seq.at >= 0:
            self._sync(seq)
        return seq

    def _sync(self, seq) -> None:
        """Bring ticking `seq` up to the clock, its filled blocks registered in the prefix cache."""
        seq.tokens += self._clock - seq.at
        seq.at = self._clock
        if self._cache is not None:
            self._register(seq)

    def _untick(self, seq) -> None:
        """Stop `seq` ticking (brought up to date, its per-sequence `event` back; its filed entry goes stale)."""
        if seq.at >= 0:
            self._sync(seq)
            seq.at = seq.due = -1
            self._ticking -= 1
            if self._cache is not None:
                self._set_event(seq)

    def _sync_all(self) -> None:
        if self._ticking:
            for seq in self._seqs.values():
                if seq.at >= 0:
                    self._sync(seq)

    def _file(self, seq, clock: int) -> None:
        """File ticking `seq` (tokens as of `clock`) under the tick of its next event."""
        gap = min(seq.event, seq.final) - seq.tokens
        seq.due = due = clock + (gap if gap > 0 else 0)
        filed = self._due.get(due)
        if filed is None:
            self._due[due] = [(seq.key, seq)]
        else:
            filed.append((seq.key, seq))

    def tick_join(self, seq_id: int) -> None:
        """Start growing `seq_id` by one token per `tick()`, after the sequences ticking now."""
        seq = self._seq(seq_id)
        if seq.at >= 0:
            raise AllocationError(f"sequence {seq_id} is already ticking")
        if self._tick_drops is None:
            self._tick_drops = [(g, getattr(r, "window", 0), getattr(r, "chunk", 0)) for g, r in self._dropping]
        seq.at, seq.key = self._clock, self._joins
        self._joins += 1
        self._ticking += 1
        if self._cache is not None:
            self._register(seq)
            self._set_event(seq)              # (ticking: filling a block is no event)
        self._file(seq, self._clock)

    def tick(self, copies: list | None = None, make_room=None) -> bool:
        """One token for every ticking sequence; those at an event grow as `append_each` grows them, in
        join order. When one finds no free block (its windows' blocks freed all the same): with
        `make_room`, that is called to free some (e.g. by `free`ing a ticking sequence) and the tick
        goes on from it; without, False: free some and call again to go on from it. True when complete.
        (`copies` stays untouched: nothing is shared, so nothing is copied.)"""
        clock, pending = self._clock, self._pending
        if pending is None:
            pending = self._due.pop(clock, None)
            if pending is None:
                self._clock = clock + 1
                self._sum_tokens += self._ticking
                return True
            if len(pending) > 1:
                pending.sort(key=_first)
        grow = self._grow_ticking
        for k, (key, seq) in enumerate(pending):
            if seq.due != clock or seq.key != key:
                continue                      # stale: it stopped ticking since it was filed
            c = seq.tokens + clock - seq.at
            seq.tokens, seq.at = c, clock
            if not grow(seq, c, clock):
                self._pending = pending[k:]
                if make_room is None:
                    return False
                while True:                   # free some, then on from it until the tick is complete
                    make_room()
                    if self.tick():
                        return True
        self._pending = None
        self._clock = clock + 1
        self._sum_tokens += self._ticking
        return True

    def _grow_ticking(self, seq, c: int, clock: int) -> bool:
        """Grow ticking `seq` from `c` tokens at tick `clock` as `_step_one` does (its filled blocks
        registered before a window drops them, so they are parked cached; inlined for the usual case,
        below its final length) and file its next event; its `tokens` stay as of `clock`. False (its windows' blocks freed
        all the same) when a block it needs is not free."""
        cache = self._cache
        if c >= seq.final:                    # its peak grows: the general path keeps the reach
            if cache is not None:
                self._register(seq)
            if not self._step_one(seq):
                return False
            self._file(seq, clock + 1)
            seq.tokens = c
            self._sum_tokens -= 1             # (the tick counts the token)
            return True
        bs, tables, nulls = self.block_size, seq.tables, seq.nulls
        for g, window, chunk in self._tick_drops:       # (`_drop_skipped`)
            if window:
                skip = (c - window + 1) // bs if c >= window else 0
            else:
                skip = c // chunk * chunk // bs
            z = nulls[g]
            if skip > z:
                if cache is not None:
                    self._register(seq)       # (the blocks it filled, before the window drops them)
                table = tables[g]
                if skip > len(table):
                    skip = len(table)
                dropped = table[z:skip]
                table[z:skip] = [NULL_BLOCK] * len(dropped)
                if NULL_BLOCK in dropped:     # (align-mode Mamba: nulls between its state blocks)
                    dropped = [b for b in dropped if b != NULL_BLOCK]
                if cache is None:
                    self._free.extendleft(dropped)
                else:
                    self._release(g, dropped[::-1])
                self._held[g] -= len(dropped)
                self._nulls[g] += len(dropped)
                self._freed[g] += len(dropped)
                nulls[g] = skip
        take_ids = self._take_ids
        takers = [g for g in take_ids if len(tables[g]) * bs <= c]
        if takers:
            if len(takers) > self.num_free_blocks:
                return False
            self._give_blocks(seq, takers)
        event = c + NEVER                     # (`_set_event` at c + 1 tokens, block fills left out)
        for g in take_ids:
            take = len(tables[g]) * bs
            if take < event:
                event = take
        for g, window, chunk in self._tick_drops:
            drop = (nulls[g] + 1) * bs + window - 1 if window else -(-(nulls[g] + 1) * bs // chunk) * chunk
            if drop < event:
                event = drop
        seq.event = event = event if event > c + 1 else c + 1
        gap = (event if event < seq.final else seq.final) - c - 1
        seq.due = due = clock + 1 + (gap if gap > 0 else 0)
        filed = self._due.get(due)
        if filed is None:
            self._due[due] = [(seq.key, seq)]
        else:
            filed.append((seq.key, seq))
        return True

    def tick_window(self, max_steps: int) -> int:
        """How many ticks (<= `max_steps`) `tick_steps` can run at once: `decode_window` of the ticking
        sequences."""
        if max_steps < 1 or not self._ticking:
            return max(max_steps, 0)
        self._sync_all()
        return self._window([s for s in self._seqs.values() if s.at >= 0], max_steps)

    def tick_steps(self, steps: int, head_tokens: int = 0, head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` ticks within what `tick_window` allowed; `stats()` after each (the head of the
        queue, `head_*`, is ignored: paged groups have no external fragmentation to judge)."""
        snapshots, stats, tick = [], self.stats, self.tick
        for _ in range(steps):
            if not tick():
                raise AllocationError("tick_steps ran out of free blocks")
            snapshots.append(stats())
        return snapshots


    def _check_ticks(self) -> None:
        """Assert the ticking sequences' count, due ticks and filing (between ticks), then sync them."""
        ticking = [s for s in self._seqs.values() if s.at >= 0]
        assert len(ticking) == self._ticking, "ticking count drifted"
        assert self._pending is None, "checked in the middle of a tick"
        for s in ticking:
            assert s.due == s.at + max(min(s.event, s.final) - s.tokens, 0), "a ticking sequence's due tick drifted"
            assert s.due >= self._clock, "a ticking sequence's event was passed"
            assert any(t is s and k == s.key for k, t in self._due.get(s.due, ())), "tick lost"
        assert all(s.due == -1 for s in self._seqs.values() if s.at < 0), "a sequence not ticking is due"
        self._sync_all()


def _first(entry: tuple) -> int:
    return entry[0]
