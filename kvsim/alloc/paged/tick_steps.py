"""`tick_steps` of `PagedAllocator` (a mixin, beside `paged_window.PagedTicks`): many lazy decode ticks
at once, taking blocks in the same order as `tick` one tick at a time, and the memory snapshot after each
tick kept as the counts before the first and the ticks that took blocks (`kvsim.alloc.paged.tick_runs.TickRun`),
which read as what `stats()` would give tick by tick. Token slots and blocks.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Sequence

from kvsim.alloc.base import AllocationError, MemoryStats
from kvsim.alloc.paged.tick_runs import TickRun


class PagedTickSteps:
    """`tick_steps` (reads and updates `PagedTicks`' clock, due lists and counters)."""

    def tick_steps(self, steps: int, head_tokens: int = 0, head_final_tokens: int = 0) -> Sequence[MemoryStats]:
        """`steps` ticks within what `tick_window` allowed; `stats()` after each (a `TickRun`, worked out
        from the ticks that took blocks, unless a copy-on-write is pending). The head of the
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
        evict = cache.evict_lru if cache is not None else None
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
                    block = evict()
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
        run = TickRun(steps, crossings, self.capacity_tokens, bs, nb, self._sum_tokens - self._excess, ticking,
                      self._sum_reach - self._excess, self._sum_blocks, free_at_start, evictable_at_start)
        self._top, self._clock = top, end
        self._sum_tokens += ticking * steps
        self._sum_reach, self._sum_blocks = sum_reach, sum_blocks
        return run
