"""Kept prompts as KV pool pages (CUPYGLM_KV_SHARE=N): each kept entry holds the whole pool pages before its keep
point, as one more holder on the pool's ref count (`PagePool.share`), and a restored sequence holds them too.

Positions before a keep point are never rewritten, so the pages wholly before it (`shared_pages`) are shared as
they are. A last, partly filled page is copied (with the fixed parts, into the prompt-cache arena: the walk's
`from`), not copy-on-write: the live sequence writes its next position onto that very page, so sharing it would
need a copy-on-write check in every write path for a saving of at most one page per kept state.

What must stay true: every rank's PageStore holds the same pages per entry, because every rank's worker applies a
step message's evicts, restores, drops and keeps in its order (`cupyglm.engine.ops`); rank 0's scheduler keeps a
PageStore of its own over its planning pool and makes the same holds as it plans, before it leases the step's
pages.
"""
from __future__ import annotations

import collections

from cupyglm.kv.pool import PagePool


class PageStore:
    def __init__(self, pool: PagePool, page_tokens: int, limit: int, mtp: bool = False):
        if limit < 1:
            raise ValueError(f"a page store holds at least one kept prompt, got a limit of {limit}")
        self.pool, self.page_tokens, self.limit = pool, page_tokens, limit
        self.late = 1 if mtp else 0               # the MTP layer writes position L - 1 after a keep point at L
        self.entries: dict[int, tuple[int, ...]] = {}     # kept entry -> its pool pages, in sequence order
        self._holders: collections.Counter = collections.Counter()   # pool page -> entries holding it

    def shared_pages(self, length: int) -> int:
        """Pages a state kept at `length` shares: those no later write of the sequence touches."""
        return max(0, length - self.late) // self.page_tokens

    @property
    def held(self) -> int:
        """Distinct pool pages the kept entries hold."""
        return len(self._holders)

    def hold(self, entry_id: int, pages) -> None:
        """Entry `entry_id` holds `pages` (already held by the sequence kept)."""
        if entry_id in self.entries:
            raise ValueError(f"kept entry {entry_id} holds pages already")
        pages = tuple(int(p) for p in pages)
        self.pool.share(list(pages))
        self.entries[entry_id] = pages
        self._holders.update(pages)

    def lend(self, entry_id: int) -> list[int]:
        """The entry's pages for a sequence restored from it (the sequence becomes one more holder)."""
        pages = list(self.entries[entry_id])
        self.pool.share(pages)
        return pages

    def drop(self, entry_id: int) -> int:
        """Let go of an entry's pages; returns how many came free."""
        before, pages = self.pool.free_count, self.entries.pop(entry_id)
        self.pool.release(list(pages))
        self._holders.subtract(pages)
        for p in pages:
            if not self._holders[p]:
                del self._holders[p]
        return self.pool.free_count - before

    def freeable(self, protect: set[int]) -> set[int]:
        """Pages that come free when every entry outside `protect` is dropped (no sequence and no protected entry
        holds them)."""
        kept = {p for eid in protect if eid in self.entries for p in self.entries[eid]}
        return {p for p, n in self._holders.items() if p not in kept and self.pool.refcount(p) == n}


class NoPages:
    """The page store where kept prompts live in the arena only (no CUPYGLM_KV_SHARE): shares, holds and frees
    nothing."""

    entries: dict = {}
    held = 0
    limit = 0

    def shared_pages(self, length: int) -> int:
        return 0

    def hold(self, entry_id: int, pages) -> None:
        pass

    def lend(self, entry_id: int) -> list[int]:
        return []

    def drop(self, entry_id: int) -> int:
        return 0

    def freeable(self, protect: set[int]) -> set[int]:
        return set()


def stop_line(rank: int, pages: PageStore) -> str:
    """The line a rank prints at stop (every kept prompt dropped by then, so every page should be free)."""
    pool = pages.pool
    return f"rank {rank}: KV pages at stop: {pool.free_count} of {pool.num_pages} free, {pages.held} held by kept prompts"
