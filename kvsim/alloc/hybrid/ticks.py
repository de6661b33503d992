"""Lazy decode ticks of the hybrid allocator (the scheduler's lazy decode steps, kvsim/engine/lazy_decode.py):
a tick grows every ticking sequence by one token and touches only those at one of their events (`_Seq.event`,
kvsim/alloc/hybrid/windows.py: the next one-token growth frees blocks that left a window, takes a block or
registers a full block in the prefix cache), in the order they started ticking (the batch's order), so the
blocks are freed and taken in the order `append_each` over the batch takes them, one step at a time.
A mixin of `HybridAllocator`.

A ticking sequence's `tokens` are as of tick `at`: it holds `tokens + _clock - at` tokens. It is filed in
`_due` under the tick at which it reaches min(event, final) tokens, as (join key, sequence); a tick sorts
its list by key. Any other use of a ticking sequence brings it up to date (`_seq`); growing or freeing it
another way stops its ticking (`_untick`: its filed entry goes stale and is skipped).
"""

from __future__ import annotations

from ..base import AllocationError, MemoryStats


class HybridTicks:
    """`can_tick`, `tick_join`, `tick`, `tick_window` and `tick_steps` of `HybridAllocator`."""

    can_tick = True

    def _seq(self, seq_id: int):
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise AllocationError(f"unknown sequence id {seq_id}")
        if seq.at >= 0:                       # ticking: bring it up to the clock
            seq.tokens += self._clock - seq.at
            seq.at = self._clock
        return seq

    def _untick(self, seq) -> None:
        """Stop `seq` ticking (brought up to date; its filed entry goes stale)."""
        if seq.at >= 0:
            seq.tokens += self._clock - seq.at
            seq.at = seq.due = -1
            self._ticking -= 1

    def _sync_all(self) -> None:
        if self._ticking:
            clock = self._clock
            for seq in self._seqs.values():
                if seq.at >= 0:
                    seq.tokens += clock - seq.at
                    seq.at = clock

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
        seq.at, seq.key = self._clock, self._joins
        self._joins += 1
        self._ticking += 1
        self._file(seq, self._clock)

    def tick(self) -> bool:
        """One token for every ticking sequence; those at an event grow as `append_each` grows them, in
        join order. False when one found no free block (its windows' blocks freed all the same): free
        some (e.g. `free` a ticking sequence) and call again to go on from it; True when complete."""
        clock, pending = self._clock, self._pending
        if pending is None:
            pending = self._due.pop(clock, None)
            if pending is None:
                self._clock = clock + 1
                self._sum_tokens += self._ticking
                return True
            if len(pending) > 1:
                pending.sort(key=_first)
        step_one = self._step_one
        for k, (key, seq) in enumerate(pending):
            if seq.due != clock or seq.key != key:
                continue                      # stale: it stopped ticking since it was filed
            c = seq.tokens + clock - seq.at
            seq.tokens, seq.at = c, clock
            if not step_one(seq):
                self._pending = pending[k:]
                return False
            self._file(seq, clock + 1)        # (c + 1 tokens as of the tick after this one)
            seq.tokens = c                    # as of `clock` again: the tick's end counts the token
            self._sum_tokens -= 1
        self._pending = None
        self._clock = clock + 1
        self._sum_tokens += self._ticking
        return True

    def tick_window(self, max_steps: int) -> int:
        """How many ticks (<= `max_steps`) `tick_steps` can run at once: `decode_window` of the ticking
        sequences."""
        if max_steps < 1 or not self._ticking:
            return max(max_steps, 0)
        self._sync_all()
        return self._window([s for s in self._seqs.values() if s.at >= 0], max_steps)

    def tick_steps(self, steps: int) -> list[MemoryStats]:
        """`steps` ticks within what `tick_window` allowed; `stats()` after each."""
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
