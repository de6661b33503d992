"""The memory snapshots of a window whose steps only write slots into room already held (a contiguous
allocator's decode window: nothing is taken or freed, `ContiguousAllocator.append_steps` and
`tick_steps`), kept as the last snapshot and the slots each step writes (`FillRun`), not as a snapshot
per step: the engine's step log expands many windows' runs into one numpy table at once (`runs_table`),
as it does the paged allocator's `kvsim.alloc.paged.tick_runs.TickRun`. Units: token slots.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

from kvsim.alloc.base import MemoryStats, Snapshots


class FillRun(Snapshots):
    """The snapshots after each of `steps` steps that each write `grow` more slots, the last being `last`
    (a `MemoryStats`): step j has `grow * (steps - 1 - j)` fewer `token_states` and as many more
    `reserved`, every other field as `last`. Reads as a sequence of `MemoryStats`."""

    __slots__ = ("steps", "grow", "last")

    def __init__(self, last: MemoryStats, steps: int, grow: int):
        if steps < 0 or grow < 0:
            raise ValueError(f"a fill run needs steps >= 0 and grow >= 0, got {steps} and {grow}")
        self.last, self.steps, self.grow = last, steps, grow

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, j):
        if isinstance(j, slice):
            return list(self)[j]
        if j < 0:
            j += self.steps
        if not 0 <= j < self.steps:
            raise IndexError("fill run index out of range")
        return self._before(self.grow * (self.steps - 1 - j))

    def __iter__(self):
        if not self.grow:
            return iter([self.last] * self.steps)
        return map(self._before, range(self.grow * (self.steps - 1), -1, -self.grow))

    def _before(self, back: int) -> MemoryStats:
        """The snapshot `back` slots before `last` (as many fewer written, as many more reserved)."""
        capacity, tokens, reserved, *rest = self.last
        return tuple.__new__(MemoryStats, (capacity, tokens - back, reserved + back, *rest))   # (made directly)

    def __repr__(self) -> str:
        return f"FillRun({self.last!r}, steps={self.steps}, grow={self.grow})"

    @staticmethod
    def runs_table(runs: list[FillRun]):
        """The snapshots of `runs`, one after another, as one numpy int64 table (a row per step,
        columns `MemoryStats._fields`)."""
        import numpy as np

        width = len(MemoryStats._fields)
        lasts = np.fromiter(chain.from_iterable(map(_LAST, runs)), np.int64, len(runs) * width)
        heads = np.fromiter(chain.from_iterable(map(_HEAD, runs)), np.int64, 2 * len(runs)).reshape(-1, 2)
        steps = heads[:, 0]
        out = np.repeat(lasts.reshape(len(runs), width), steps, axis=0)
        after = np.repeat(np.cumsum(steps), steps)       # each row's run ends before this row
        back = (after - 1 - np.arange(len(out), dtype=np.int64)) * np.repeat(heads[:, 1], steps)
        out[:, 1] -= back
        out[:, 2] += back
        return out


_LAST = attrgetter("last")
_HEAD = attrgetter("steps", "grow")
