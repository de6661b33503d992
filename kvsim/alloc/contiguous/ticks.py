"""Lazy decode growth for the contiguous allocator (`tick_join`, `tick`, `tick_window`, `tick_steps`),
the same interface as the paged allocator's ticks (kvsim/alloc/paged/window.py), so continuous batching
over contiguous reservations takes the engine's lazy decode path (kvsim/engine/batching/lazy_decode.py).

A contiguous sequence reserves at admission at least its final length (`reservation`: max, pow2 and
oracle all hold prompt + output - 1), so a decode step only writes one more slot inside its extent:
nothing is placed, nothing moves, no tick can fail. A ticking sequence's written slots are kept as of
clock `_at[seq]` (it holds `_tokens[seq] + _clock - _at[seq]`); the sum `_sum_tokens` grows by the
number of ticking sequences at each tick, so `stats()` is exact between ticks without visiting them.
Whoever reads or changes one sequence brings it up to date first (`_sync`); changing it another way
than by ticks (`append`, `free`) stops its ticking (`_untick`). A mixin of `ContiguousAllocator`:
it reads and updates that class's `_tokens`, `_final` and `_sum_tokens`. Units: token slots.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.base import AllocationError, JoinsEach, MemoryStats
from kvsim.alloc.contiguous.fill_runs import FillRun


class ContiguousTicks(JoinsEach):
    """Ticks of `ContiguousAllocator` (see the module docstring)."""

    def _init_ticks(self) -> None:
        self._clock = 0
        self._at: dict[int, int] = {}          # ticking sequence -> clock its `_tokens` is as of

    @property
    def can_tick(self) -> bool:
        """Whether sequences can tick (a decode slot always lies inside the reservation)."""
        return True

    def tick_join(self, seq_id: int) -> None:
        """Start growing `seq_id` by one slot per `tick()`."""
        self._check_id(seq_id)
        if seq_id in self._at:
            raise AllocationError(f"sequence {seq_id} is already ticking")
        if self._final[seq_id] > self._extent[seq_id][1]:
            raise AllocationError(f"sequence {seq_id} cannot tick: its final length passes its reservation")
        self._at[seq_id] = self._clock

    def _sync(self, seq_id: int) -> None:
        """Bring ticking `seq_id`'s written slots up to the clock."""
        at = self._at.get(seq_id)
        if at is not None:
            self._tokens[seq_id] += self._clock - at
            self._at[seq_id] = self._clock

    def _untick(self, seq_id: int) -> None:
        """Stop `seq_id`'s ticking (if it ticks), its slots brought up to date."""
        at = self._at.pop(seq_id, None)
        if at is not None:
            self._tokens[seq_id] += self._clock - at

    def tick_leave(self, seq_id: int) -> None:
        """Stop `seq_id`'s ticks but keep its reservation (a finished request held one more step under
        async scheduling, kvsim/engine/batching/settle.py)."""
        self._untick(seq_id)

    def _sync_all(self) -> None:
        for seq_id in self._at:
            self._sync(seq_id)

    def tick(self, copies: list | None = None, make_room=None) -> bool:
        """One slot for every ticking sequence (contiguous memory never copies nor runs short: no
        `make_room`); always True."""
        self._clock += 1
        self._sum_tokens += len(self._at)
        return True

    def tick_window(self, max_steps: int) -> int:
        """How many ticks (<= `max_steps`) `tick_steps` can run: all of them (no tick takes memory)."""
        return max(max_steps, 0)

    def tick_steps(self, steps: int, head_tokens: int = 0, head_final_tokens: int = 0) -> Sequence[MemoryStats]:
        """`steps` ticks; `stats(head_tokens, head_final_tokens)` after each (only the written and
        reserved slots change: one per ticking sequence and tick, `FillRun`)."""
        grow = len(self._at)
        self._clock += steps
        self._sum_tokens += grow * steps
        return FillRun(self.stats(head_tokens, head_final_tokens), steps, grow)
