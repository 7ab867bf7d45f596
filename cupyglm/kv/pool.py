"""Page accounting: plain CPU data. Pages are leased lowest id first, released, and ref-counted.

What must stay true: a page is either on the free list (refcount 0) or held (refcount > 0), never both.
"""
from __future__ import annotations

import heapq


class OutOfPages(RuntimeError):
    pass


class PagePool:
    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages))        # min-heap of free page ids
        self._refs = [0] * num_pages
        self.generation = 0                        # + 1 whenever a page changes hands (lease, share, release)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def free_ids(self) -> list[int]:
        return sorted(self._free)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def lease(self, n: int) -> list[int]:
        """n fresh pages, lowest ids first; all or nothing."""
        if n > len(self._free):
            raise OutOfPages(f"need {n} KV pages, {len(self._free)} free of {self.num_pages}")
        self.generation += 1
        pages = [heapq.heappop(self._free) for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def take(self, pages) -> None:
        """Hold exactly these free pages: a lease the scheduler decided (workers apply its explicit ids)."""
        want = [int(p) for p in pages]
        bad = [p for p in want if not 0 <= p < self.num_pages or self._refs[p] != 0]
        if bad or len(set(want)) != len(want):
            raise ValueError(f"pages {bad or want} are not free to take (held, repeated or past {self.num_pages})")
        if not want:
            return
        self.generation += 1
        for p in want:
            self._refs[p] = 1
        taken = set(want)
        self._free = [p for p in self._free if p not in taken]
        heapq.heapify(self._free)

    def share(self, pages: list[int]) -> None:
        """One more holder for pages already held."""
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"page {p} is free; only held pages can be shared")
        self.generation += 1
        for p in pages:
            self._refs[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"page {p} released while free")
        self.generation += 1
        for p in pages:
            self._refs[p] -= 1
            if self._refs[p] == 0:
                heapq.heappush(self._free, p)
