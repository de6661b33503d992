"""The memory snapshots after each tick of a window of lazy decode ticks (`PagedTicks.tick_steps`), worked
out from the counts before the first tick and the ticks that took blocks, as `stats()` would give them
tick by tick: one `MemoryTable` for a long window (numpy, a fixed cost of about a hundred named tuples,
measured with timeit), named tuples for a short one (`TABLE_MIN_STEPS`). Token slots and blocks.
"""

from __future__ import annotations

from .base import MemoryStats, MemoryTable

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
