"""`tick_steps` of `PagedAllocator` (a mixin, beside `paged_window.PagedTicks`): many lazy decode ticks
at once, taking blocks in the same order as `tick` one tick at a time, and the memory snapshot after each
tick worked out from the counts before the first and the ticks that took blocks, as `stats()` would give
them tick by tick: one `MemoryTable` for a long window (numpy: a fixed cost of about a hundred named
tuples, timed with timeit), named tuples for a short one (`TABLE_MIN_STEPS`). Token slots and blocks.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Sequence

from .base import AllocationError, MemoryStats, MemoryTable


class PagedTickSteps:
    """`tick_steps` (reads and updates `PagedTicks`' clock, due lists and counters)."""

    def tick_steps(self, steps: int, head_tokens: int = 0, head_final_tokens: int = 0) -> Sequence[MemoryStats]:
        """`steps` ticks within what `tick_window` allowed; `stats()` after each (worked out from the
        ticks that took blocks, `tick_snapshots`: a `MemoryTable` for a long window). The head of the
        queue (`head_*`, tokens) is ignored: paged memory has no external fragmentation to judge."""
        if self._shared_partial or self._pending is not None:
            snapshots = []
            for _ in range(steps):
                if not self.tick():
                    raise AllocationError("tick_steps ran out of free blocks")
                snapshots.append(self.stats())
            return snapshots
        # `tick` inlined (nothing partly filled shared, every block taken fits), visiting only the
        # ticks at which a sequence is due (those filed now, then each `bs` ticks after one that took)
        bs, due, nb, ticking = self.block_size, self._due, self.num_blocks, self._ticking
        cache = self._cache
        evictable = evictable_at_start = cache.num_evictable if cache is not None else 0
        top, free_list, ref = self._top, self._free, self._ref
        sum_reach, sum_blocks = self._sum_reach, self._sum_blocks
        start, end = self._clock, self._clock + steps
        free_at_start = nb - top + len(free_list) + evictable
        clocks = [c for c in due if start <= c < end]
        heapify(clocks)
        crossings = []                              # (tick - start, blocks taken, reach added, evicted)
        while clocks:
            clock = heappop(clocks)
            crossing = due.pop(clock, None)
            if not crossing:
                continue
            then = clock + bs                       # (one int for every sequence's next due tick)
            nxt = due.get(then)
            if nxt is None:
                if then < end:
                    heappush(clocks, then)
                nxt = due[then] = []
            taken = reach = evicted = 0
            for seq in crossing:
                if seq.due != clock:
                    continue                        # stale
                table = seq.table
                held = len(table) * bs
                seq.due = then
                if top < nb:                        # `_take`
                    table.append(top)
                    top += 1
                    ref.append(1)
                elif free_list:
                    block = free_list.popleft()
                    ref[block] = 1
                    table.append(block)
                elif evictable:                     # the least recently freed cached block
                    block = cache.evict_lru()
                    evictable -= 1
                    evicted += 1
                    ref[block] = 1
                    table.append(block)
                else:
                    raise AllocationError("tick_steps ran out of free blocks")
                final = seq.final
                if final > held:
                    reach += (final if final < held + bs else held + bs) - held
                taken += 1
                nxt.append(seq)
            if taken:
                crossings.append((clock - start, taken, reach, evicted))
                sum_reach += reach
                sum_blocks += taken
        table = tick_snapshots(
            steps, crossings, self.capacity_tokens, bs, nb, self._sum_tokens - self._excess, ticking,
            self._sum_reach - self._excess, self._sum_blocks, free_at_start, evictable_at_start)
        self._top, self._clock = top, end
        self._sum_tokens += ticking * steps
        self._sum_reach, self._sum_blocks = sum_reach, sum_blocks
        return table


#: Windows of this many ticks or more get one `MemoryTable`; shorter ones a list of `MemoryStats`.
TABLE_MIN_STEPS = 64


def tick_snapshots(steps: int, crossings: list[tuple[int, int, int, int]], capacity: int, bs: int, num_blocks: int,
                   tokens: int, ticking: int, reach: int, blocks: int, free: int, cached: int):
    """`stats()` after each of `steps` ticks (arguments as `tick_table`): a table or tuples by length."""
    make = tick_table if steps >= TABLE_MIN_STEPS else tick_rows
    return make(steps, crossings, capacity, bs, num_blocks, tokens, ticking, reach, blocks, free, cached)


def tick_rows(steps: int, crossings: list[tuple[int, int, int, int]], capacity: int, bs: int, num_blocks: int,
              tokens: int, ticking: int, reach: int, blocks: int, free: int, cached: int) -> list[MemoryStats]:
    """`tick_table`'s snapshots as a list of named tuples (cheaper for a few ticks)."""
    out, make, k = [], tuple.__new__, 0
    due = crossings[0][0] if crossings else steps
    for j in range(steps):
        tokens += ticking
        if j == due:
            _, taken, reached, evicted = crossings[k]
            reach, free, blocks, cached = reach + reached, free - taken, blocks + taken, cached - evicted
            k += 1
            due = crossings[k][0] if k < len(crossings) else steps
        used = num_blocks - free
        out.append(make(MemoryStats, (capacity, tokens, reach - tokens, used * bs - reach, 0, free * bs, used, free,
                                      blocks, cached)))   # (a named tuple made directly)
    return out


def tick_table(steps: int, crossings: list[tuple[int, int, int, int]], capacity: int, bs: int, num_blocks: int,
               tokens: int, ticking: int, reach: int, blocks: int, free: int, cached: int) -> MemoryTable:
    """`stats()` after each of `steps` ticks, from the counts before the first (`tokens` written,
    `reach`: slots the sequences will fill, `blocks` held unshared, `free` and `cached` blocks) and the
    `crossings` (tick, blocks taken, reach added, cached blocks evicted): each tick writes `ticking`
    more slots; each block taken is one less free."""
    import numpy as np
    added = np.zeros((3, steps), np.int64)
    if crossings:
        at, taken, reached, evicted = np.array(crossings, np.int64).T
        added[0, at], added[1, at], added[2, at] = taken, reached, evicted
    added = added.cumsum(axis=1)
    written = np.arange(tokens + ticking, tokens + ticking * (steps + 1), ticking, np.int64) if ticking \
        else np.full(steps, tokens, np.int64)
    reach_now, num_free = reach + added[1], free - added[0]
    used = num_blocks - num_free
    out = np.empty((steps, len(MemoryTable.fields)), np.int64)
    for col, values in enumerate((capacity, written, reach_now - written, used * bs - reach_now, 0, num_free * bs,
                                  used, num_free, blocks + added[0], cached - added[2])):
        out[:, col] = values
    return MemoryTable(out)
