"""Contiguous KV allocator (the Orca / FasterTransformer baselines of the vLLM paper): each sequence
reserves one address range at admission, sized by a reservation policy, placed by first fit or a
buddy allocator, so external fragmentation is measured rather than assumed.

Units: token slots (block_size 1); addresses in [0, capacity_tokens).

Invariants (checked by `check_invariants`):
- tokens <= final <= reservation <= placed length for every sequence;
- placed ranges and free extents are disjoint and together tile [0, capacity_tokens);
- `_sum_*` counters equal their sums over live sequences.
"""

from __future__ import annotations

from typing import Sequence

from kvsim.alloc.base import AllocationError, MemoryStats
from kvsim.alloc.contiguous.fill_runs import FillRun
from kvsim.alloc.contiguous.ticks import ContiguousTicks
from kvsim.alloc.contiguous.placement import Buddy, FirstFit

RESERVE_POLICIES = ("max", "pow2", "oracle")
PLACEMENTS = {"first-fit": FirstFit, "buddy": Buddy}


def reservation(policy: str, num_tokens: int, final_tokens: int, max_seq_len: int) -> int:
    """Slots to reserve for a sequence with `num_tokens` now and peak `final_tokens` (>= num_tokens):
    `max`: max(max_seq_len, final); `pow2`: num_tokens + the remaining output (final - num_tokens + 1)
    rounded up to a power of two, capped at max(max_seq_len, final); `oracle`: final."""
    if policy == "max":
        return max(max_seq_len, final_tokens)
    if policy == "pow2":
        return min(num_tokens + (1 << (final_tokens - num_tokens).bit_length()), max(max_seq_len, final_tokens))
    return final_tokens


class ContiguousAllocator(ContiguousTicks):
    """One extent per sequence; `append` past the reservation raises, `fork` copies into a new extent.
    Decoding sequences can tick instead of appending (kvsim/alloc/contiguous/ticks.py)."""

    def __init__(self, capacity_tokens: int, max_seq_len: int, reserve: str = "max",
                 placement: str = "buddy") -> None:
        if capacity_tokens < 1 or max_seq_len < 1:
            raise ValueError(f"capacity_tokens and max_seq_len must be >= 1, got {capacity_tokens}, {max_seq_len}")
        if reserve not in RESERVE_POLICIES:
            raise ValueError(f"unknown reserve policy {reserve!r}; known: {', '.join(RESERVE_POLICIES)}")
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
        self.block_size = 1
        self.capacity_tokens = capacity_tokens
        self.max_seq_len = max_seq_len
        self.reserve = reserve
        self.placement = placement
        self._pool = PLACEMENTS[placement](capacity_tokens)
        self._extent: dict[int, tuple[int, int, int]] = {}   # seq -> (start, reservation, placed length)
        self._tokens: dict[int, int] = {}
        self._final: dict[int, int] = {}
        self._sum_tokens = 0
        self._sum_final = 0
        self._sum_reservation = 0
        self._sum_placed = 0
        self._moves = 0                 # places and releases so far: the pool's version
        self._stranded = (-1, 0, 0, 0)  # (`_moves`, head tokens, head final, free slots stranded): last stats
        self._init_ticks()

    def _reservation(self, num_tokens: int, final_tokens: int) -> int:
        return reservation(self.reserve, num_tokens, max(final_tokens, num_tokens), self.max_seq_len)

    def _check_id(self, seq_id: int) -> None:
        if seq_id not in self._extent:
            raise AllocationError(f"unknown sequence id {seq_id}")

    def peak_slots(self, num_tokens: int, final_tokens: int, num_seqs: int = 1) -> int:
        """Slots `num_seqs` sequences of `num_tokens` now and `final_tokens` at their peak take: each
        its own reservation (forks copy it), placed (a buddy block rounds it up to a power of two)."""
        reserved = self._reservation(num_tokens, final_tokens)
        placed = 1 << (reserved - 1).bit_length() if self.placement == "buddy" else reserved
        return num_seqs * placed

    def num_tokens(self, seq_id: int) -> int:
        """Slots `seq_id` holds written."""
        self._check_id(seq_id)
        self._sync(seq_id)
        return self._tokens[seq_id]

    def can_allocate(self, num_tokens: int, final_tokens: int, block_hashes: Sequence[int] = (),
                     seq_id: int | None = None) -> bool:
        """Whether the policy's reservation fits in one free extent now."""
        return self._pool.fits(self._reservation(num_tokens, final_tokens))

    def cached_tokens(self, num_tokens: int, block_hashes: Sequence[int] = (), seq_id: int | None = None) -> int:
        """0: prefix caching is not modelled for contiguous reservations."""
        return 0

    def allocate(self, seq_id: int, num_tokens: int, final_tokens: int,
                 block_hashes: Sequence[int] = (), hold_tokens: int | None = None) -> int:
        """Reserve one extent for a sequence of `num_tokens` slots (`hold_tokens` of them written now,
        the rest by `append`: chunked prefill); prefix caching is not modelled: returns 0."""
        if seq_id in self._extent:
            raise AllocationError(f"sequence id {seq_id} is already allocated")
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        hold = num_tokens if hold_tokens is None else hold_tokens
        if not 1 <= hold <= num_tokens:
            raise AllocationError(f"sequence {seq_id}: needs 1 <= hold_tokens ({hold}) <= num_tokens "
                                  f"({num_tokens})")
        final = max(final_tokens, num_tokens)
        self._place(seq_id, self._reservation(num_tokens, final), hold, final)
        return 0

    def _place(self, seq_id: int, reserved: int, tokens: int, final: int) -> None:
        placed = self._pool.place(reserved)
        if placed is None:
            raise AllocationError(f"sequence {seq_id}: no free extent of {reserved} slots")
        self._moves += 1
        self._extent[seq_id] = (placed[0], reserved, placed[1])
        self._tokens[seq_id] = tokens
        self._final[seq_id] = final
        self._sum_tokens += tokens
        self._sum_final += final
        self._sum_reservation += reserved
        self._sum_placed += placed[1]

    def can_fork(self, parent_id: int) -> bool:
        """Whether a copy of the parent's reservation fits in one free extent now."""
        return parent_id in self._extent and self._pool.fits(self._extent[parent_id][1])

    def fork(self, parent_id: int, child_id: int) -> None:
        """Give `child_id` its own extent holding a copy of the parent's tokens (no sharing)."""
        self._check_id(parent_id)
        if child_id in self._extent:
            raise AllocationError(f"sequence id {child_id} is already allocated")
        self._sync(parent_id)
        self._place(child_id, self._extent[parent_id][1], self._tokens[parent_id], self._final[parent_id])

    def refork(self, parent_id: int, child_id: int) -> int:
        """Make live `child_id` a copy of live `parent_id` (a dead beam replaced by a survivor's fork)
        inside its own reservation: the parent's written slots are copied into it; returns how many."""
        self._check_id(parent_id)
        self._check_id(child_id)
        self._sync(parent_id)
        self._untick(child_id)
        tokens, final = self._tokens[parent_id], self._final[parent_id]
        if final > self._extent[child_id][1]:
            raise AllocationError(f"sequence {child_id}: its reservation of {self._extent[child_id][1]} "
                                  f"slots cannot hold a copy of sequence {parent_id} (final {final})")
        self._sum_tokens += tokens - self._tokens[child_id]
        self._sum_final += final - self._final[child_id]
        self._tokens[child_id], self._final[child_id] = tokens, final
        return tokens

    def free(self, seq_id: int) -> None:
        """Return `seq_id`'s extent to the pool (first fit coalesces it with free neighbours)."""
        self._check_id(seq_id)
        self._untick(seq_id)
        start, reserved, placed = self._extent.pop(seq_id)
        self._pool.release(start, placed)
        self._moves += 1
        self._sum_tokens -= self._tokens.pop(seq_id)
        self._sum_final -= self._final.pop(seq_id)
        self._sum_reservation -= reserved
        self._sum_placed -= placed

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether `seq_id` stays inside its reservation after `num_tokens` more slots."""
        self._check_id(seq_id)
        self._sync(seq_id)
        return self._tokens[seq_id] + num_tokens <= self._extent[seq_id][1]

    def append(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Write `num_tokens` more slots inside the reservation; never copies (returns [])."""
        self._check_id(seq_id)
        if num_tokens < 1:
            raise AllocationError(f"sequence {seq_id}: num_tokens must be >= 1, got {num_tokens}")
        self._untick(seq_id)
        tokens = self._tokens[seq_id] + num_tokens
        if tokens > self._extent[seq_id][1]:
            raise AllocationError(f"sequence {seq_id}: {tokens} tokens past its reservation of "
                                  f"{self._extent[seq_id][1]} slots")
        self._tokens[seq_id] = tokens
        self._sum_tokens += num_tokens
        if tokens > self._final[seq_id]:
            self._sum_final += tokens - self._final[seq_id]
            self._final[seq_id] = tokens
        return []

    def append_each(self, seq_ids: Sequence[int], start: int = 0,
                    copies: list[tuple[int, int]] | None = None) -> int:
        """One slot for each of `seq_ids[start:]` in order, stopping before the first whose reservation
        is full; returns how many grew (contiguous memory never copies, so `copies` is untouched)."""
        for k in range(start, len(seq_ids)):
            if not self.can_append(seq_ids[k]):
                return k - start
            self.append(seq_ids[k])
        return len(seq_ids) - start

    def decode_window(self, seq_ids: Sequence[int], max_steps: int) -> int:
        """How many steps (<= `max_steps`) of `append_each(seq_ids)` `append_steps` can run at once:
        until the first sequence would pass its final length (its reservation is at least that)."""
        self._sync_all()
        tokens, final = self._tokens, self._final
        return max(0, min([max_steps, *(final[s] - tokens[s] for s in seq_ids)]))

    def append_steps(self, seq_ids: Sequence[int], steps: int, head_tokens: int = 0,
                     head_final_tokens: int = 0) -> list[MemoryStats]:
        """`steps` steps of `append_each(seq_ids)` within what `decode_window` allowed; returns
        `stats(head_tokens, head_final_tokens)` after each step (nothing moves, slots fill)."""
        for seq_id in seq_ids:
            self._untick(seq_id)
            self._tokens[seq_id] += steps
        grow = len(seq_ids)
        self._sum_tokens += grow * steps
        return FillRun(self.stats(head_tokens, head_final_tokens), steps, grow)

    def stats(self, head_tokens: int = 0, head_final_tokens: int = 0) -> MemoryStats:
        """Memory breakdown in slots. External fragmentation = placement padding plus free slots in
        extents too small for the head request's reservation (none when `head_tokens` is 0)."""
        free_slots = self._pool.free_slots
        stranded = 0
        if head_tokens > 0:         # (the pool's extents change only when a sequence is placed or freed)
            moves, tokens, final, stranded = self._stranded
            if moves != self._moves or tokens != head_tokens or final != head_final_tokens:
                stranded = self._pool.slots_in_extents_below(self._reservation(head_tokens, head_final_tokens))
                self._stranded = (self._moves, head_tokens, head_final_tokens, stranded)
        used = self.capacity_tokens - free_slots
        return tuple.__new__(MemoryStats, (                  # (made directly: the named tuple's __new__ is slow)
            self.capacity_tokens, self._sum_tokens, self._sum_final - self._sum_tokens,
            self._sum_reservation - self._sum_final, self._sum_placed - self._sum_reservation + stranded,
            free_slots - stranded, used, free_slots, used, 0))   # (MemoryStats' field order)

    def check_invariants(self) -> None:
        """Assert the module's invariants (slow; tests only)."""
        self._sync_all()
        self._pool.check(self.capacity_tokens)
        ranges = self._pool.extents() + [(start, placed) for start, _, placed in self._extent.values()]
        ranges.sort()
        end = 0
        for start, length in ranges:
            assert start == end, f"ranges overlap or leave a hole at address {end} (next starts at {start})"
            end = start + length
        assert end == self.capacity_tokens, f"ranges end at {end}, capacity is {self.capacity_tokens}"
        for seq_id, (_, reserved, placed) in self._extent.items():
            tokens, final = self._tokens[seq_id], self._final[seq_id]
            assert tokens <= final <= reserved <= placed, \
                f"seq {seq_id}: tokens {tokens}, final {final}, reserved {reserved}, placed {placed}"
        assert self._sum_tokens == sum(self._tokens.values()), "token counter drifted"
        assert self._sum_final == sum(self._final.values()), "final counter drifted"
        assert self._sum_reservation == sum(r for _, r, _ in self._extent.values()), "reservation counter drifted"
        assert self._sum_placed == sum(p for _, _, p in self._extent.values()), "placed counter drifted"
        s = self.stats()
        assert s.token_states + s.reserved + s.internal_fragmentation + s.external_fragmentation + s.free \
            == self.capacity_tokens, f"categories do not sum to capacity: {s}"
        if not self._extent:
            assert self._pool.free_slots == self.capacity_tokens, "slots leaked after every sequence was freed"
