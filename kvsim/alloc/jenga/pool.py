"""Jenga's two-level pool: free large pages, and per group the small pages of the large pages it holds
(Jenga, SOSP 2025, section 4). A group that needs a small page and has none free takes a whole free
large page and splits it; a large page whose small pages are all free again goes back to the pool,
where any group may take it.

Request-aware placement (Jenga's request-aware allocation, so that a finished request frees whole large
pages): a request's small page of group g comes, in this order, from
  1. a large page of g that already holds pages of this request (the one it took first);
  2. (`empty_first`) a free large page (the last released, else the lowest never used), as long as
     enough stay free for the other groups' pages of the same allocation;
  3. any large page of g with a free small page (the one that has had one free longest);
  4. a free large page (the group has no free small page left).
So a request is refused only when its pages truly do not fit (`fits`). With `empty_first` False a group
opens only the large pages it must (filling those first), then packs other requests' partly used ones.
The paper states the preference (1); the order of the others is this module's reading. Within a large
page the lowest free small page is taken.

Page ids. A small page of group g is numbered as group g sees the pool, an array of its own pages:
id = large page x pages_per_large[g] + index within the large page (its byte offset / page_bytes[g]).
Free large pages: released ones first (last released first), then never used ones in increasing order.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence


class LargePagePool:
    """`num_large` large pages, each split into `pages_per_large[g]` small pages when group g takes it.

    A request's `home` (one dict per request and group) maps each large page holding its small pages of
    that group to how many; `take` and `release` keep it up to date."""

    def __init__(self, num_large: int, pages_per_large: Sequence[int], empty_first: bool = True) -> None:
        self.num_large, self.empty_first = num_large, empty_first
        self.pages_per_large = tuple(pages_per_large)
        ng = len(self.pages_per_large)
        self.owner = [-1] * num_large               # group holding each large page, -1: free
        self._slots: dict[int, list[int]] = {}      # held large page -> heap of its free small indices
        self._partial = [dict() for _ in range(ng)]  # per group: its large pages with a free small page
        self.free_small = [0] * ng                  # per group: free small pages in its large pages
        self.large_held = [0] * ng                  # per group: large pages it holds
        self._released: deque[int] = deque()        # released large pages (front: last released)
        self._top = 0                               # large pages [_top, num_large) were never used

    @property
    def free_large(self) -> int:
        """Large pages no group holds."""
        return self.num_large - self._top + len(self._released)

    def fits(self, counts: Sequence[int]) -> bool:
        """Whether `counts[g]` more small pages of every group g can be taken at once (free small pages of
        the group first, then whole free large pages)."""
        return sum(self._required(g, c) for g, c in enumerate(counts)) <= self.free_large

    def _required(self, g: int, count: int) -> int:
        """Free large pages group g must open to take `count` small pages (its free ones first)."""
        more = count - self.free_small[g]
        return -(-more // self.pages_per_large[g]) if more > 0 else 0

    def take_all(self, counts: Sequence[int], homes: Sequence[dict[int, int]]) -> list[list[int]]:
        """`counts[g]` small pages of every group g for one request whose pages of g lie in `homes[g]`
        (they must fit, see `fits`). A group opens a free large page before using another request's
        large page (with `empty_first`) only while enough stay free for the other groups' pages."""
        spare = self.free_large - sum(self._required(g, c) for g, c in enumerate(counts))
        out = []
        for g, c in enumerate(counts):
            need = self._required(g, c)
            opened, pages = self._take(g, c, homes[g], need + spare if self.empty_first else need)
            spare -= opened - need
            out.append(pages)
        return out

    def _take(self, g: int, num: int, home: dict[int, int], may_open: int) -> tuple[int, list[int]]:
        """`num` small pages of group g, opening at most `may_open` free large pages before using other
        requests' large pages of g (and more only when g has no free small page left); returns (large
        pages opened, page ids)."""
        n, out, opened, partial = self.pages_per_large[g], [], 0, self._partial[g]
        while len(out) < num:
            large = next((p for p in home if p in partial), None)
            if large is None:
                if partial and opened >= may_open:
                    large = next(iter(partial))
                else:
                    large, opened = self._open(g), opened + 1
            slots = self._slots[large]
            while slots and len(out) < num:
                out.append(large * n + heapq.heappop(slots))
                home[large] = home.get(large, 0) + 1
                self.free_small[g] -= 1
            if not slots:
                del partial[large]
        return opened, out

    def _open(self, g: int) -> int:
        """Give group g a free large page, all its small pages free."""
        if self._released:
            large = self._released.popleft()
        else:
            large, self._top = self._top, self._top + 1
        n = self.pages_per_large[g]
        self.owner[large] = g
        self._slots[large] = list(range(n))          # (a sorted list is a heap)
        self._partial[g][large] = None
        self.free_small[g] += n
        self.large_held[g] += 1
        return large

    def release(self, g: int, pages: Sequence[int], home: dict[int, int]) -> None:
        """Free small pages `pages` of group g (held by the request whose `home` this is); a large page
        left with no page held goes back to the pool."""
        n = self.pages_per_large[g]
        for page in pages:
            large = page // n
            left = home[large] - 1
            if left:
                home[large] = left
            else:
                del home[large]
            self.free_page(g, page)

    def free_page(self, g: int, page: int) -> bool:
        """Return small page `page` of group g to its large page's free slots (no request's home counts
        it any more); True when that emptied the large page, which went back to the pool."""
        large, index = divmod(page, self.pages_per_large[g])
        slots = self._slots[large]
        heapq.heappush(slots, index)
        self.free_small[g] += 1
        n = self.pages_per_large[g]
        if len(slots) == n:                       # empty: back to the pool
            del self._slots[large]
            self._partial[g].pop(large, None)     # (absent when it held one page, now freed)
            self.owner[large] = -1
            self.free_small[g] -= n
            self.large_held[g] -= 1
            self._released.appendleft(large)
            return True
        if len(slots) == 1:
            self._partial[g][large] = None
        return False

    def free_count(self, large: int) -> int:
        """Free small pages inside held large page `large` (0 for a free large page)."""
        slots = self._slots.get(large)
        return 0 if slots is None else len(slots)

    # ---- for the checks ------------------------------------------------------------------------
    def free_large_pages(self) -> list[int]:
        """Ids of the free large pages, in the order they would be taken."""
        return list(self._released) + list(range(self._top, self.num_large))

    def free_slots(self, large: int) -> list[int]:
        """Free small-page indices of held large page `large`."""
        return sorted(self._slots[large])

    def partial_pages(self, g: int) -> list[int]:
        """Large pages of group g with a free small page, in the order step 3 of `take` tries them."""
        return list(self._partial[g])

    def check(self) -> None:
        """Assert the pool's own consistency (free large pages, owners, slot heaps, counters)."""
        free = self.free_large_pages()
        assert len(set(free)) == len(free), "a large page is free twice"
        assert all(self.owner[p] == -1 for p in free), "a free large page has an owner"
        held = [p for p in range(self.num_large) if self.owner[p] != -1]
        assert len(held) + len(free) == self.num_large, "a large page is lost"
        assert set(held) == set(self._slots), "held large pages and slot heaps differ"
        for g, n in enumerate(self.pages_per_large):
            mine = [p for p in held if self.owner[p] == g]
            assert len(mine) == self.large_held[g], f"group {g}: large page count drifted"
            for p in mine:
                slots = self._slots[p]
                assert len(set(slots)) == len(slots) and all(0 <= s < n for s in slots), f"bad slots in {p}"
                assert len(slots) < n, f"large page {p} is empty but still held"
            assert set(self._partial[g]) == {p for p in mine if self._slots[p]}, f"group {g}: partial set drifted"
            assert self.free_small[g] == sum(len(self._slots[p]) for p in mine), f"group {g}: free count drifted"
