"""The memory snapshots of a window of lazy decode ticks (`PagedTickSteps.tick_steps`), kept as the counts
before its first tick and the ticks that took blocks (`TickRun`), not as a snapshot per tick: the engine's
step log expands many windows' runs into one numpy table at once (`runs_table`), which costs less than
making a named tuple per tick (a short window) or a numpy table per window (numpy's fixed cost per call).
Read one by one, a run gives the `MemoryStats` that `stats()` would give after each tick. Units: token
slots and blocks.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

from kvsim.alloc.base import MemoryStats, Snapshots


class TickRun(Snapshots):
    """`stats()` after each of `steps` ticks, from the counts before the first (`tokens` written, `reach`:
    slots the sequences will fill, `blocks` held unshared, `free` and `cached` blocks; `capacity` slots,
    `block_size`, `num_blocks`) and the `crossings` (tick, blocks taken, reach added, cached blocks
    evicted; ticks in increasing order): each tick writes `ticking` more slots; each block taken is one
    less free. Reads as a sequence of `MemoryStats`."""

    __slots__ = ("steps", "crossings", "capacity", "block_size", "num_blocks", "tokens", "ticking", "reach",
                 "blocks", "free", "cached", "_rows")

    def __init__(self, steps: int, crossings: list[tuple[int, int, int, int]], capacity: int, block_size: int,
                 num_blocks: int, tokens: int, ticking: int, reach: int, blocks: int, free: int, cached: int):
        self.steps, self.crossings, self.capacity = steps, crossings, capacity
        self.block_size, self.num_blocks = block_size, num_blocks
        self.tokens, self.ticking, self.reach = tokens, ticking, reach
        self.blocks, self.free, self.cached = blocks, free, cached
        self._rows: list[MemoryStats] | None = None

    def rows(self) -> list[MemoryStats]:
        """The snapshot after each tick, as named tuples (made once)."""
        if self._rows is None:
            self._rows = _rows(self)
        return self._rows

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, j):
        return self.rows()[j]

    def __iter__(self):
        return iter(self.rows())

    def __repr__(self) -> str:
        return f"TickRun({self.rows()!r})"

    @staticmethod
    def runs_table(runs: list[TickRun]):
        """`runs_table(runs)` (the step log, which knows no allocator module, finds it here)."""
        return runs_table(runs)


def _rows(run: TickRun) -> list[MemoryStats]:
    bs, nb, capacity, ticking, crossings = run.block_size, run.num_blocks, run.capacity, run.ticking, run.crossings
    tokens, reach, blocks, free, cached = run.tokens, run.reach, run.blocks, run.free, run.cached
    out, make, k = [], tuple.__new__, 0
    due = crossings[0][0] if crossings else run.steps
    for j in range(run.steps):
        tokens += ticking
        if j == due:
            _, taken, reached, evicted = crossings[k]
            reach, free, blocks, cached = reach + reached, free - taken, blocks + taken, cached - evicted
            k += 1
            due = crossings[k][0] if k < len(crossings) else run.steps
        used = nb - free
        out.append(make(MemoryStats, (capacity, tokens, reach - tokens, used * bs - reach, 0, free * bs, used, free,
                                      blocks, cached)))   # (a named tuple made directly)
    return out


#: a run's counts, read from every run in one pass
_HEAD_FIELDS = ("steps", "capacity", "block_size", "num_blocks", "tokens", "ticking", "reach", "blocks", "free",
                "cached")
_HEAD = attrgetter(*_HEAD_FIELDS)
_CROSSINGS = attrgetter("crossings")


def runs_table(runs: list[TickRun]):
    """The snapshots of `runs`, one after another, as one numpy int64 table (a row per tick, columns
    `MemoryStats._fields`): the rows `rows()` gives, worked out for every run at once."""
    import numpy as np

    heads = np.fromiter(chain.from_iterable(map(_HEAD, runs)), np.int64, len(runs) * len(_HEAD_FIELDS))
    heads = heads.reshape(len(runs), len(_HEAD_FIELDS))     # (every run's counts in one pass)
    steps = heads[:, 0]
    total = int(steps.sum())
    first = np.zeros(len(runs), np.int64)                # each run's first row
    np.cumsum(steps[:-1], out=first[1:])

    def per_run(name: str):
        return np.repeat(heads[:, _HEAD_FIELDS.index(name)], steps)

    tick = np.arange(total, dtype=np.int64) - np.repeat(first, steps)      # tick within its run
    added = np.zeros((3, total), np.int64)                # blocks taken, reach added, evicted, at each tick
    counts = np.fromiter(map(len, map(_CROSSINGS, runs)), np.int64, len(runs))
    if counts.any():
        at, taken, reached, evicted = np.fromiter(
            chain.from_iterable(chain.from_iterable(map(_CROSSINGS, runs))), np.int64,
            4 * int(counts.sum())).reshape(-1, 4).T
        at = at + np.repeat(first, counts)
        added[0, at], added[1, at], added[2, at] = taken, reached, evicted
    added = added.cumsum(axis=1)
    before = np.zeros((3, len(runs)), np.int64)           # the sums before each run's first tick
    before[:, 1:] = added[:, first[1:] - 1]
    added -= np.repeat(before, steps, axis=1)
    bs, nb = per_run("block_size"), per_run("num_blocks")
    written = per_run("tokens") + per_run("ticking") * (tick + 1)
    reach = per_run("reach") + added[1]
    free = per_run("free") - added[0]
    used = nb - free
    out = np.empty((total, len(MemoryStats._fields)), np.int64)
    for col, values in enumerate((per_run("capacity"), written, reach - written, used * bs - reach, 0, free * bs,
                                  used, free, per_run("blocks") + added[0], per_run("cached") - added[2])):
        out[:, col] = values
    return out
