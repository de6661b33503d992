"""The paged allocator's decode fast paths, with the blocks taken in the same order and the same
memory after each step as `append_each` one step at a time: the fast-forward (many decode steps of
a steady batch at once) and lazy ticks (a decode step touches only the sequences that cross a block
boundary). Mixins of `PagedAllocator` (they read and update the allocator's sequences and counters).
"""

from __future__ import annotations

from bisect import insort
from operator import attrgetter
from typing import Callable, Sequence

from kvsim.alloc.base import AllocationError, MemoryStats


class PagedWindows:
    """`decode_window` / `append_steps` of `PagedAllocator` (see kvsim/engine/step.py for the windows)."""

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` `append_steps` can run at once:
        while the free blocks last, with no copy-on-write, no prefix block filled and no sequence
        passing its final length. 0 while a partly filled block is shared."""
        if self._shared_partial or max_steps < 1:
            return 0
        self._sync_all()
        bs, seqs = self.block_size, self._seqs
        steps, rooms = max_steps, []
        for seq_id in seq_ids:
            seq = seqs[seq_id]
            tokens = seq.tokens
            if tokens // bs < len(seq.hashes):
                return 0
            if seq.final - tokens < steps:
                steps = seq.final - tokens
            rooms.append(len(seq.table) * bs - tokens)    # appends before it needs a block: 0..bs-1
        if steps < 1 or not rooms:
            return max(steps, 0)
        # sequence s needs blocks at steps rooms[s], rooms[s] + bs, ...: in each round of bs steps
        # every sequence takes one, in order of room; the first step without a free block ends it
        rounds, rank = divmod(self.num_free_blocks, len(rooms))
        rooms.sort()
        return min(steps, rooms[rank] + rounds * bs)

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` (blocks taken in the same order), within what
        `decode_window` allowed; returns `stats()` after each step."""
        bs = self.block_size
        seqs = [self._seqs[s] for s in seq_ids]
        for seq in seqs:               # (not with ticks: they grow the same sequences)
            if seq.at >= 0:
                self._untick(seq)
        crossing: list[list] = [[] for _ in range(steps)]   # step -> sequences needing a block
        for seq in seqs:
            for j in range(len(seq.table) * bs - seq.tokens, steps, bs):
                crossing[j].append(seq)
        snapshots, num = [], len(seqs)
        for crossed in crossing:
            if crossed:
                for seq in crossed:
                    held = len(seq.table) * bs
                    seq.table.append(self._take())
                    self._sum_reach += min(seq.final, held + bs) - min(seq.final, held)
                self._sum_blocks += len(crossed)
            self._sum_tokens += num
            snapshots.append(self.stats())
        cache = self._cache
        for seq in seqs:
            if cache is not None and (seq.tokens + steps) // bs > seq.tokens // bs:
                self._register(seq, seq.tokens // bs, (seq.tokens + steps) // bs)   # order-free
            seq.tokens += steps
        return snapshots


class PagedTicks:
    """Lazy decode growth (`tick_join`, `tick`, `tick_window`; `tick_steps` in paged_tick_steps.py) of `PagedAllocator`.

    A ticking sequence grows by one slot at every `tick()` without being touched: its `tokens` are
    as of clock `at`, so it holds `tokens + (_clock - at)` slots. Each one is filed in `_due` under
    the clock value at whose tick it needs its next block; a tick takes blocks only for those, in
    the order they joined (`key`: the caller's batch order, the order vLLM's running queue has), so
    blocks are taken exactly as `append_each` over the batch in that order would take them. Each
    list in `_due` is in join order without sorting: a tick files the sequences it served, in order,
    `block_size` ticks ahead, before any sequence that joins later can be filed there. Any other use of a ticking sequence
    brings it up to date first (`_sync`); changing it another way than by ticks stops its ticking
    (`_untick`). A fork that joins sharing its partly filled last block (parallel samples after their
    prefill) is filed at the next tick, which copies that block (copy-on-write, as `append` does) and
    files it again in key order (`insort`). With a prefix cache, the blocks a ticking sequence fills (its own, past its shareable prompt blocks) are registered when it
    is brought up to date, at the latest when it is freed: their hashes are salted by the sequence, so
    no other sequence's lookup can find them while it lives, and only registered blocks are parked
    as evictable on `free` (the order of everything the cache shows is the same as registering at once)."""

    @property
    def can_tick(self) -> bool:
        """Whether sequences can tick (always: filled blocks are registered when a sequence syncs)."""
        return True

    def tick_join(self, seq_id: int) -> None:
        """Start growing `seq_id` by one slot per `tick()`, after the sequences ticking now."""
        self.tick_join_many((seq_id,))

    def tick_join_many(self, seq_ids) -> None:
        """`tick_join` of each of `seq_ids`, in that order (one call for a step's joins)."""
        seqs, bs, clock, due_at, ref, key = self._seqs, self.block_size, self._clock, self._due, self._ref, self._joins
        try:
            for seq_id in seq_ids:
                seq = seqs.get(seq_id)
                if seq is None:
                    raise AllocationError(f"unknown sequence id {seq_id}")
                if seq.at >= 0:
                    raise AllocationError(f"sequence {seq_id} is already ticking")
                tokens, table = seq.tokens, seq.table
                if tokens // bs < len(seq.hashes):
                    raise AllocationError(f"sequence {seq_id} cannot tick (shareable blocks unfilled)")
                seq.at, seq.key = clock, key
                key += 1
                if tokens % bs and ref[table[-1]] > 1:    # a fork sharing its partly filled last
                    seq.due = due = clock                  # block: copied at the next tick
                else:
                    seq.due = due = clock + len(table) * bs - tokens
                waiting = due_at.get(due)
                if waiting is None:
                    due_at[due] = [seq]
                else:
                    waiting.append(seq)
        finally:
            self._ticking += key - self._joins
            self._joins = key

    def _sync(self, seq) -> None:
        """Bring a ticking sequence's `tokens` up to the clock (its due tick does not change). The blocks
        it filled since are its own (its shareable blocks were full when it joined): registered when it
        is freed (`kvsim.alloc.paged.allocator._Seq.own`)."""
        seq.tokens += self._clock - seq.at
        seq.at = self._clock

    def _served_fill(self, seq) -> int:
        """`free` of ticking `seq` while a tick is left half done (a preemption: a sample of the victim
        may have grown before a later one found no block): 1 when this tick grew it (its slot counts as
        filled: a block it filled is registered, as the per-sequence path registered it), else 0."""
        return 1 if any(s is seq for s in self._pending[:self._resume] if s.due != self._clock) else 0

    def tick_leave(self, seq_id: int) -> None:
        """Stop `seq_id`'s ticks but keep its blocks (a finished request held one more step under async
        scheduling, kvsim/engine/batching/settle.py); no-op when it is not ticking."""
        seq = self._seqs[seq_id]
        if seq.at >= 0:
            self._untick(seq)

    def _untick(self, seq) -> None:
        """Stop a ticking sequence's growth (its stale `_due` entry is skipped when reached)."""
        self._sync(seq)
        seq.at = seq.due = -1
        self._ticking -= 1

    def _sync_all(self) -> None:
        if self._ticking:
            for seq in self._seqs.values():
                if seq.at >= 0:
                    self._sync(seq)

    def tick(self, copies: list | None = None, make_room: Callable[[], None] | None = None) -> bool:
        """One slot for every ticking sequence, taking a block for each that crosses a block boundary
        and copying the shared partly filled last block of a fork that joined since the last tick (in
        key order; the (src, dst) pairs added to `copies`, as `append_each` adds them). When one finds
        no free block: with `make_room`, that is called until it has freed some (e.g. by `free`ing a
        ticking sequence) or freed this one, and the tick goes on; without it, False: free some and
        call again to go on from it. True when the tick is complete."""
        pending, start = self._pending, self._resume
        if pending is None:
            pending = self._due.pop(self._clock, None)
            if pending is None:                 # no sequence crosses a boundary
                self._clock += 1
                self._sum_tokens += self._ticking
                return True
        clock, bs, released, cache = self._clock, self.block_size, self._free, self._cache
        free = taken = (self.num_blocks - self._top + len(released)       # (`num_free_blocks`, inlined)
                        + (cache.num_evictable if cache is not None else 0))
        nxt = self._due.setdefault(clock + bs, [])
        take, ref, reach = self._take, self._ref, 0
        fresh = self._top < self.num_blocks
        for k, seq in enumerate(pending[start:] if start else pending, start):
            if seq.due != clock:
                continue                        # stale: it stopped ticking since it was filed
            table = seq.table
            held = len(table) * bs
            room = held - seq.tokens - clock + seq.at
            if room and ref[table[-1]] == 1:    # a fork whose twins copied their shared block: in place
                seq.due = clock + room
                insort(self._due.setdefault(clock + room, []), seq, key=_key)
                continue
            if not free:
                self._pending, self._resume = pending, k     # (left half done: on from `k`)
                self._sum_blocks += taken - free
                self._sum_reach += reach
                if make_room is None:
                    return False
                reach = 0
                while not free and seq.due == clock:
                    make_room()
                    free = taken = self.num_free_blocks
                if seq.due != clock:
                    continue                    # it was freed to make room
                if room and ref[table[-1]] == 1:    # its twins were: in place after all (as above)
                    seq.due = clock + room
                    insort(self._due.setdefault(clock + room, []), seq, key=_key)
                    continue
            free -= 1
            if room:                            # copy-on-write of the shared partly filled last block
                taken -= 1                      # (the copy replaces a block the sequence held: not counted)
                src = table[-1]
                ref[src] -= 1
                if ref[src] == 1:
                    self._shared_partial -= 1
                table[-1] = dst = self._take()
                if copies is not None:
                    copies.append((src, dst))
                seq.due = clock + room
                insort(self._due.setdefault(clock + room, []), seq, key=_key)   # (a later join may be there)
                continue
            seq.due = clock + bs
            if fresh:
                table.append(take())
            else:                               # (`_take`, inlined: released blocks, else the LRU one)
                block = released.popleft() if released else cache.evict_lru()
                ref[block] = 1
                table.append(block)
            final = seq.final
            if final > held:
                reach += (final if final < held + bs else held + bs) - held
            nxt.append(seq)
        self._sum_blocks += taken - free
        self._sum_reach += reach
        self._pending, self._resume = None, 0
        self._clock = clock + 1
        self._sum_tokens += self._ticking
        return True

    def tick_window(self, max_steps: int) -> int:
        """How many ticks (<= `max_steps`) `tick_steps` can run before the free blocks run out (the
        same count `decode_window` gives for the ticking sequences)."""
        num = self._ticking
        if self._shared_partial:
            return 0                            # (as `decode_window`: a copy-on-write is pending)
        if max_steps < 1 or not num:
            return max(max_steps, 0)
        # in each round of bs ticks every sequence takes one block, in order of the ticks before it
        # needs one (its room, 0..bs-1): the first tick without a free block ends the window
        bs, clock, due = self.block_size, self._clock, self._due
        rounds, rank = divmod(self.num_free_blocks, num)
        for room in range(bs):
            for s in due.get(clock + room, ()):
                if s.due == clock + room:
                    rank -= 1
                    if rank < 0:
                        return min(max_steps, room + rounds * bs)
        raise AllocationError("a ticking sequence is missing from its tick")


_key = attrgetter("key")
