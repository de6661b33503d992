"""The allocator protocol every KV allocator implements, and the memory breakdown it reports.

Units: token slots throughout (one slot holds one token's K and V for every layer). Sequence ids are
ints chosen by the caller. Running out of memory is never an exception: callers ask `can_*` first.
Misuse (an unknown id, growing past a reservation) raises `AllocationError`.

Lengths a caller passes:
- `num_tokens`: KV slots the sequence needs written now (prompt, or prompt + tokens recomputed);
- `final_tokens`: KV slots it holds at its peak, prompt + output - 1 (the last token's KV is never
  written). It lets contiguous policies size their reservation and lets `stats()` tell slots the
  sequence will still fill (`reserved`) from slots it never will (`internal_fragmentation`).
"""

from __future__ import annotations

from collections import namedtuple
from itertools import chain
from typing import NamedTuple, Protocol, Sequence


class AllocationError(RuntimeError):
    """Misuse of an allocator: unknown or duplicate sequence id, growth past a reservation, etc."""


class MemoryStats(NamedTuple):
    """A snapshot of KV capacity, in token slots; the five categories sum to `capacity_tokens`.
    (A named tuple: one is made per engine step, and the step log reads them column-wise.)

    `used_blocks`/`free_blocks` are in the allocator's blocks (contiguous: one slot each).
    `unshared_blocks` is how many blocks the live sequences would hold without sharing (equals
    `used_blocks` when nothing is shared); `cached_blocks` are free blocks still holding reusable
    prefix-cache contents (counted in `free`).
    """

    capacity_tokens: int
    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    used_blocks: int
    free_blocks: int
    unshared_blocks: int
    cached_blocks: int = 0


class Snapshots:
    """A window's memory snapshots kept in another form than a list (`MemoryTable`; `TickRun` and
    `FillRun`, as counts): equal to any sequence of the same `MemoryStats`, unhashable as a list."""

    __slots__ = ()
    fields = MemoryStats._fields

    def __eq__(self, other) -> bool:
        try:
            return list(self) == list(other)
        except TypeError:
            return NotImplemented

    __hash__ = None

    @classmethod
    def concat(cls, runs: list) -> MemoryTable:
        """The snapshots of `runs` (of a kind kept as counts, with a `runs_table`) one after another, as
        one `MemoryTable`."""
        return MemoryTable(cls.runs_table(runs))


class MemoryTable(Snapshots):
    """The snapshots of consecutive steps as one table: `array` (numpy int64, one row per step, columns
    `MemoryStats._fields`), what a static batch's window of several segments gives
    (kvsim/engine/batching/static.py); the engine's step log folds it whole. Reads as a sequence of
    `MemoryStats`."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, j):
        """Step j's `MemoryStats`; a slice gives a `MemoryTable` of those steps."""
        if isinstance(j, slice):
            return MemoryTable(self.array[j])
        return MemoryStats._make(self.array[j].tolist())

    def __iter__(self):
        return map(MemoryStats._make, self.array.tolist())

    def __repr__(self) -> str:
        return f"MemoryTable({list(self)!r})"


#: Per-group parts an allocator with KV cache groups can add to its snapshot (`with_groups`), as fields
#: `group<j>_<part>`: blocks held, token slots written / reserved / internally fragmented, and the blocks
#: the group's sliding window or attention chunk has freed since the start (cumulative; `freed`).
GROUP_PARTS = ("blocks", "token_states", "reserved", "internal_fragmentation", "freed")
_GROUPED: dict[int, type] = {}


def grouped_record(num_groups: int) -> type:
    """The named tuple of MemoryStats' fields followed by `GROUP_PARTS` for each of `num_groups` groups
    (`group0_blocks`, ...), which the engine's step log time-averages per group."""
    cls = _GROUPED.get(num_groups)
    if cls is None:
        extra = [f"group{j}_{part}" for j in range(num_groups) for part in GROUP_PARTS]
        cls = _GROUPED[num_groups] = namedtuple("GroupedMemoryStats", MemoryStats._fields + tuple(extra))
    return cls


def with_groups(stats: MemoryStats, parts: Sequence[Sequence[int]]) -> tuple:
    """`stats` with each group's `GROUP_PARTS` appended (a `grouped_record`)."""
    return grouped_record(len(parts))._make((*stats, *chain.from_iterable(parts)))


class JoinsEach:
    """`tick_join_many` for an allocator whose sequences start ticking one by one (contiguous, hybrid;
    the paged allocator files a step's joins in one pass)."""

    def tick_join_many(self, seq_ids) -> None:
        """`tick_join` of each of `seq_ids`, in that order."""
        for seq_id in seq_ids:
            self.tick_join(seq_id)


class Allocator(Protocol):
    """What an allocator's user (the scheduler; tests and checks) calls. Only the scheduler calls an
    allocator during a run; the engine, metrics and the GPU harness ask the scheduler."""

    block_size: int          # slots per block (contiguous: 1)
    capacity_tokens: int     # total slots

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """Slots a request of `num_seqs` sequences (forked from one of `num_tokens`) takes when each
        holds `final_tokens`; more than `capacity_tokens` means it can never be served."""

    def can_allocate(self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """Whether a new sequence of `num_tokens` slots (peak `final_tokens`) fits whole now, its
        prefix-cache hits counted (`block_hashes`: content ids of its shareable full blocks; `seq_id`:
        the id it will have, which names its other blocks)."""

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """Leading tokens of such a sequence a prefix cache holds now (0 without one)."""

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Give `seq_id` room for a sequence of `num_tokens` slots, `hold_tokens` (default all) of them
        now, the rest by `append` (chunked prefill); returns how many leading tokens a prefix cache
        already holds (0 without prefix caching)."""

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` can grow by `num_tokens` slots now (a chunked prefill's next chunk)."""

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Grow `seq_id` by `num_tokens` slots (it must fit); returns the (src, dst) block copies
        that copy-on-write needs (empty when nothing shared was written into)."""

    def append_each(self, seq_ids: Sequence[int], start: int = 0,
                    copies: list[tuple[int, int]] | None = None) -> int:
        """One slot for each of `seq_ids[start:]` in order, stopping before the first that cannot
        grow; returns how many grew; copy-on-write pairs go to `copies` (the batched decode)."""

    def can_fork(self, parent_id: int) -> bool:
        """Whether `fork(parent_id, ...)` would succeed now."""

    def fork(self, parent_id: int, child_id: int) -> None:
        """Make `child_id` a copy of `parent_id` (paged: sharing its blocks)."""

    def refork(self, parent_id: int, child_id: int) -> int:
        """Make live `child_id` hold what live `parent_id` holds (beam search: a dead beam replaced
        by a fork of a survivor); paged: share the parent's blocks, freeing the child's unshared ones;
        contiguous: copy into the child's own reservation. Returns the slots copied now."""

    def free(self, seq_id: int) -> None:
        """Release everything `seq_id` holds."""

    def stats(self, head_tokens: int = 0, head_final_tokens: int = 0) -> MemoryStats:
        """The memory breakdown now; `head_*` describe the request waiting at the head of the queue
        (0 when none), so free space too fragmented to admit it counts as external fragmentation."""

    def check_invariants(self) -> None:
        """Assert the allocator's internal consistency (tests and `--check` runs)."""

    # the fast-forward (kvsim/engine/step.py windows): many decode steps of a steady batch in one call

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` can run at once through
        `append_steps`: all succeed, nothing is copied, no sequence passes its final length."""

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """Run `steps` steps of `append_each(seq_ids)`; returns `stats(head_*)` during each step."""
