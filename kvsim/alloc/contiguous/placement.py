"""Where a contiguous reservation goes in the KV pool: first fit over coalesced free extents, or a
buddy allocator. Both deal in token-slot addresses [0, capacity).

`place(length)` returns (start, placed_length) or None; placed_length - length is placement padding
(a buddy block's rounding up to a power of two; first fit has none). `release(start, placed_length)`
gives the range back.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class FirstFit:
    """A free-extent list sorted by address; places at the lowest extent that fits, coalesces
    neighbours on release.

    Invariants: extents are disjoint, inside [0, capacity), and never adjacent (always coalesced).
    """

    def __init__(self, capacity: int) -> None:
        self._starts = [0] if capacity else []        # sorted
        self._length = {0: capacity} if capacity else {}   # start -> length
        self.free_slots = capacity

    def fits(self, length: int) -> bool:
        """Whether some free extent holds `length` slots."""
        return any(free >= length for free in self._length.values())

    def place(self, length: int) -> tuple[int, int] | None:
        for i, start in enumerate(self._starts):
            free = self._length[start]
            if free >= length:
                del self._length[start]
                if free == length:
                    del self._starts[i]
                else:
                    self._starts[i] = start + length
                    self._length[start + length] = free - length
                self.free_slots -= length
                return start, length
        return None

    def release(self, start: int, length: int) -> None:
        self.free_slots += length
        i = bisect_left(self._starts, start)
        if i < len(self._starts) and start + length == self._starts[i]:   # merge the next extent
            length += self._length.pop(self._starts.pop(i))
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._length[prev] == start:                        # merge into the previous one
                self._length[prev] += length
                return
        self._starts.insert(i, start)
        self._length[start] = length

    def slots_in_extents_below(self, length: int) -> int:
        """Free slots in extents shorter than `length`."""
        return sum(free for free in self._length.values() if free < length)

    def extents(self) -> list[tuple[int, int]]:
        """Free (start, length) extents in address order."""
        return [(start, self._length[start]) for start in self._starts]

    def check(self, capacity: int) -> None:
        """Assert the class invariants."""
        extents = self.extents()
        assert self._starts == sorted(self._starts) and len(self._starts) == len(self._length), \
            "free-extent index out of order"
        for (s0, n0), (s1, _) in zip(extents, extents[1:]):
            assert s0 + n0 < s1, f"free extents at {s0} and {s1} overlap or were not coalesced"
        assert all(n > 0 and s >= 0 and s + n <= capacity for s, n in extents), "bad free extent"
        assert self.free_slots == sum(n for _, n in extents), "free-slot counter drifted"


class Buddy:
    """A buddy allocator. A pool that is not a power of two is split into arenas, one per set bit of
    the capacity, largest first from address 0 (15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 +
    16); each arena's base is then a multiple of its size, so the buddy of a block of size s at address
    a is a ^ s everywhere, and blocks never merge across arenas (the address after an arena starts a
    smaller one, which never holds a free block of the arena's size).

    Invariants: free blocks are disjoint, each aligned to its size inside one arena, and no two free
    buddies coexist (they would have merged).
    """

    def __init__(self, capacity: int) -> None:
        self._free: list[set[int]] = [set() for _ in range(max(capacity.bit_length(), 1))]  # order -> starts
        self.arenas: list[tuple[int, int]] = []      # (start, size), largest first
        start = 0
        for order in reversed(range(capacity.bit_length())):
            if capacity >> order & 1:
                self._free[order].add(start)
                self.arenas.append((start, 1 << order))
                start += 1 << order
        self.free_slots = capacity

    def fits(self, length: int) -> bool:
        """Whether a free block of at least `length` slots exists."""
        order = (length - 1).bit_length()
        return any(self._free[order:])

    def place(self, length: int) -> tuple[int, int] | None:
        want = (length - 1).bit_length()
        for order in range(want, len(self._free)):
            if self._free[order]:
                start = min(self._free[order])       # lowest address, for determinism
                self._free[order].remove(start)
                while order > want:                  # split, keeping the lower half
                    order -= 1
                    self._free[order].add(start + (1 << order))
                self.free_slots -= 1 << want
                return start, 1 << want
        return None

    def release(self, start: int, length: int) -> None:
        self.free_slots += length
        order = length.bit_length() - 1
        while order + 1 < len(self._free) and start ^ (1 << order) in self._free[order]:
            self._free[order].remove(start ^ (1 << order))
            start &= ~(1 << order)
            order += 1
        self._free[order].add(start)

    def slots_in_extents_below(self, length: int) -> int:
        """Free slots in blocks too small to hold `length` slots."""
        want = (length - 1).bit_length()
        return sum(len(starts) << order for order, starts in enumerate(self._free[:want]))

    def extents(self) -> list[tuple[int, int]]:
        """Free (start, length) blocks in address order."""
        return sorted((start, 1 << order) for order, starts in enumerate(self._free) for start in starts)

    def check(self, capacity: int) -> None:
        """Assert the class invariants."""
        for order, starts in enumerate(self._free):
            for start in starts:
                arena = next(((s, n) for s, n in self.arenas if s <= start < s + n), None)
                assert arena is not None and start + (1 << order) <= arena[0] + arena[1], \
                    f"free block {start}+{1 << order} straddles an arena"
                assert start % (1 << order) == 0, f"free block {start} not aligned to {1 << order}"
                if (1 << order) < arena[1]:
                    assert start ^ (1 << order) not in starts, f"free buddies at {start} were not merged"
        extents = self.extents()
        for (s0, n0), (s1, _) in zip(extents, extents[1:]):
            assert s0 + n0 <= s1, f"free blocks at {s0} and {s1} overlap"
        assert self.free_slots == sum(n for _, n in extents), "free-slot counter drifted"
