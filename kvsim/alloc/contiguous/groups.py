"""Contiguous reservations per KV cache group, for models whose layers are not all full attention: the
Orca-style baseline of issue 23 (a sliding-window group reserves its window, not the maximum length).

One extent per sequence, as `ContiguousAllocator`, but its size is the sum of each group's share: full
and MLA groups keep every token of the policy's reservation R (tokens), a sliding group a ring buffer of
min(R, W) tokens, a chunked group min(R, C), a Mamba group its fixed state. Written KV grows the same
way: a sliding group's part stops growing at W tokens.

Units: slots of `unit_bytes` (the gcd of the groups' bytes per token and per state), so every share is
a whole number of slots; the caller passes lengths in tokens, as to any allocator. `stats()` counts
slots; `num_tokens` answers in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvsim.alloc.base import AllocationError, MemoryStats
from kvsim.alloc.contiguous.allocator import ContiguousAllocator, reservation


@dataclass(frozen=True, slots=True)
class GroupShare:
    """One group's share of a sequence's extent: `kind` ("full", "sliding", "chunked" or "mamba"),
    `span` (tokens kept: the window or chunk; 0 for full and mamba) and `units` (slots per token, or per
    sequence for mamba)."""

    kind: str
    span: int
    units: int

    def __post_init__(self) -> None:
        if self.kind not in ("full", "sliding", "chunked", "mamba") or self.units < 1 or self.span < 0:
            raise ValueError(f"GroupShare: bad group {self.kind!r} (span {self.span}, units {self.units})")
        if (self.kind in ("sliding", "chunked")) != (self.span > 0):
            raise ValueError(f"GroupShare {self.kind}: a span (tokens) is given for sliding and chunked only")


class GroupedContiguousAllocator(ContiguousAllocator):
    """`ContiguousAllocator` whose extents hold every KV cache group of a hybrid model (see module)."""

    def __init__(self, capacity_slots: int, max_seq_len: int, shares: Sequence[GroupShare],
                 reserve: str = "max", placement: str = "buddy", unit_bytes: int = 1) -> None:
        """`capacity_slots` slots of `unit_bytes` bytes (one GPU's KV memory); `shares` per group."""
        if not shares:
            raise ValueError("GroupedContiguousAllocator needs at least one group share")
        if unit_bytes < 1:
            raise ValueError(f"unit_bytes must be >= 1, got {unit_bytes}")
        self.shares, self.unit_bytes = tuple(shares), unit_bytes
        super().__init__(capacity_slots, max_seq_len, reserve, placement)
        self._real: dict[int, int] = {}        # seq -> tokens written (the base class counts slots)
        self._real_final: dict[int, int] = {}  # seq -> its final length in tokens

    @property
    def can_tick(self) -> bool:
        """False: a sliding or chunked group's share stops growing at its span, so a decode step does
        not always write one more slot (such sequences take the per-sequence path)."""
        return False

    def slots(self, tokens: int) -> int:
        """Slots a sequence of `tokens` tokens takes over all groups."""
        total = 0
        for s in self.shares:
            if s.kind == "mamba":
                total += s.units
            else:
                total += s.units * (tokens if not s.span or tokens < s.span else s.span)
        return total

    def _reservation(self, num_tokens: int, final_tokens: int) -> int:
        """(Tokens in, slots out.) The policy's reservation in tokens, as slots of every group."""
        return self.slots(reservation(self.reserve, num_tokens, max(final_tokens, num_tokens), self.max_seq_len))

    def num_tokens(self, seq_id: int) -> int:
        """Tokens `seq_id` holds written."""
        self._check_id(seq_id)
        return self._real[seq_id]

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Reserve one extent holding every group's share (`hold_tokens` written now); returns 0."""
        if seq_id in self._extent:
            raise AllocationError(f"sequence id {seq_id} is already allocated")
        hold = num_tokens if hold_tokens is None else hold_tokens
        if not 1 <= hold <= num_tokens:
            raise AllocationError(f"sequence {seq_id}: needs 1 <= hold_tokens ({hold}) <= num_tokens ({num_tokens})")
        final = max(final_tokens, num_tokens)
        self._place(seq_id, self._reservation(num_tokens, final), self.slots(hold), self.slots(final))
        self._real[seq_id], self._real_final[seq_id] = hold, final
        return 0

    def fork(self, parent_id: int, child_id: int) -> None:
        super().fork(parent_id, child_id)
        self._real[child_id], self._real_final[child_id] = self._real[parent_id], self._real_final[parent_id]

    def refork(self, parent_id: int, child_id: int) -> int:
        copied = super().refork(parent_id, child_id)
        self._real[child_id], self._real_final[child_id] = self._real[parent_id], self._real_final[parent_id]
        return copied

    def free(self, seq_id: int) -> None:
        super().free(seq_id)
        del self._real[seq_id], self._real_final[seq_id]

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        self._check_id(seq_id)
        return self.slots(self._real[seq_id] + num_tokens) <= self._extent[seq_id][1]

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Write `num_tokens` more tokens: each group's slots grow up to its span; never copies."""
        self._check_id(seq_id)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        real = self._real[seq_id]
        grow = self.slots(real + num_tokens) - self.slots(real)
        if grow:
            super().append(seq_id, grow)
        self._real[seq_id] = real + num_tokens
        if real + num_tokens > self._real_final[seq_id]:
            self._real_final[seq_id] = real + num_tokens
        return []

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """Steps until the first sequence would pass its final length, in tokens."""
        ends = [self._real_final[s] - self._real[s] for s in seq_ids]
        return max(0, min([max_steps, *ends]))

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` (within `decode_window`), `stats` after each."""
        out = []
        for _ in range(steps):
            for s in seq_ids:
                self.append(s)
            out.append(self.stats(head_tokens, head_final_tokens))
        return out

    def check_invariants(self) -> None:
        super().check_invariants()
        assert set(self._real) == set(self._real_final) == set(self._extent), "token counts for unknown sequences"
        for seq_id, real in self._real.items():
            assert self.slots(real) == self._tokens[seq_id], f"seq {seq_id}: slots drifted from its tokens"
            assert real <= self._real_final[seq_id] and self.slots(self._real_final[seq_id]) == self._final[seq_id], \
                f"seq {seq_id}: final length drifted"
