"""The free list of `kvsim.alloc.paged.allocator.PagedAllocator`: taking blocks (a never used one, else a released
plain free one from the left, else the least recently freed evictable one) and releasing a table's
blocks. A mixin; the allocator's module docstring says how `_top`, `_free` and `_ref` fit together.
"""

from __future__ import annotations


class PagedFreeList:
    """`_take`, `_take_many` and `_release` of `PagedAllocator`."""

    def _release(self, table: list[int], partial_last: bool) -> None:
        """Drop one reference to each block of `table`, last block first (see `free`)."""
        ref, cache, bs = self._ref, self._cache, self.block_size
        for block in reversed(table):
            ref[block] -= 1
            if ref[block] == 0:
                if cache is None or not cache.park(block):
                    self._free.append(block)
            elif partial_last:
                if ref[block] == 1:
                    self._shared_partial -= 1
            else:
                self._excess -= bs
            partial_last = False

    def _take_many(self, num: int) -> list[int]:
        """`num` blocks as `num` calls of `_take` give them."""
        top = self._top
        fresh = min(num, self.num_blocks - top)
        if fresh:
            self._top = top + fresh
            self._ref.extend([1] * fresh)
            if fresh == num:
                return list(range(top, top + num))
        rest = num - fresh
        free, ref = self._free, self._ref
        if rest <= len(free):              # released plain free blocks, from the left
            popleft = free.popleft
            if rest <= 32:                 # (one loop: fewer steps than a comprehension for a few)
                taken = []
                for _ in range(rest):
                    block = popleft()
                    ref[block] = 1
                    taken.append(block)
            else:
                taken = [popleft() for _ in range(rest)]
                for block in taken:
                    ref[block] = 1
            return list(range(top, top + fresh)) + taken if fresh else taken
        # every released block, then the least recently freed cached ones (`_take`'s order)
        taken = list(range(top, top + fresh)) + list(free)
        free.clear()
        taken += self._cache.evict_many(num - len(taken))
        for block in taken[fresh:]:
            ref[block] = 1
        return taken

    def _take(self) -> int:
        """A fresh block with reference count 1: a never used one, else a released plain free one, else
        the LRU evictable one."""
        if self._top < self.num_blocks:
            block = self._top
            self._top += 1
            self._ref.append(1)
            return block
        block = self._free.popleft() if self._free else self._cache.evict_lru()
        self._ref[block] = 1
        return block
