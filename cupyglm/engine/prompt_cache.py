"""Rank 0's index of kept prompt states: which prefixes are kept, under which salt, and what to evict.

Pure CPU data: the memory tier of `cupyglm.engine.prefix_store`. Every rank's `KeptStore` holds the bytes; this
index decides, and the step message carries its decisions (restore, drop, keep) to every rank.

- Lookup: per salt a radix tree over token ids (an image's placeholders as keys its bytes name:
  `cupyglm.engine.images.cache_tokens`); the longest kept prefix shorter than the prompt (at least one
  prompt token must run to give the first logits). A request only sees the states kept under its own salt.
- Budget: kept pages of the arena, which this index alone allocates (lowest id first): a keep or a load names
  the arena page ids every rank copies into (`cupyglm.engine.ops.keep`, `.load`). To keep a state, entries are
  evicted until its pages fit: first a conversation's superseded keep points (an entry a longer kept entry
  extends), least recently used first, then the least recently used of the rest; never an entry `protect`
  names (the states being resumed).
- With CUPYGLM_KV_SHARE=N at most N entries are kept (an entry's whole KV pages stay in the pool); the oldest go
  first the same way, and an admission short of KV pages evicts entries too (`cupyglm.engine.page_evict`).
- Miss reasons when nothing is restored: "cache off", "different cache_salt" (another salt holds a prefix),
  "evicted" (a prefix was kept and evicted), "no prefix".
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from cupyglm.engine.radix import RadixTree
from cupyglm.kv.pool import PagePool

MISS_OFF = "cache off"
MISS_SALT = "different cache_salt"
MISS_EVICTED = "evicted"
MISS_NONE = "no prefix"
MISS_PROMPT_LOGPROBS = "prompt logprobs need the whole prompt prefilled"
MISS_IMAGES = "prompts with an image without a digest are not kept or restored"
_GHOSTS = 4096                        # evicted keys remembered per salt, for the "evicted" reason


@dataclasses.dataclass
class Entry:
    entry_id: int
    salt: str
    tokens: tuple[int, ...]
    ids: tuple[int, ...]              # its arena pages
    used: int                         # LRU clock of the last keep or restore

    @property
    def pages(self) -> int:
        return len(self.ids)


@dataclasses.dataclass
class CacheStats:
    queries: int = 0                  # prompt tokens looked up
    hits: int = 0                     # prompt tokens restored
    evictions: int = 0
    kept: int = 0


class PromptCache:
    def __init__(self, total_pages: int, pages_for: Callable[[int], int], max_entries: int = 0):
        self.total_pages = total_pages
        self.pages_for = pages_for
        self.max_entries = max_entries            # 0: no bound on the count (CUPYGLM_KV_SHARE sets one)
        self.arena = PagePool(total_pages) if total_pages > 0 else None   # the arena's pages: this index leases them
        self.trees: dict[str, RadixTree] = {}
        self.ghosts: dict[str, collections.OrderedDict] = {}
        self.entries: dict[int, Entry] = {}
        self.stats = CacheStats()
        self.evicted: list[tuple[int, str, int, str]] = []     # (entry id, salt, length, why)
        self._clock = 0
        self._next_id = 0

    @property
    def on(self) -> bool:
        return self.total_pages > 0

    @property
    def free_pages(self) -> int:
        return self.arena.free_count if self.arena is not None else 0

    @property
    def held_pages(self) -> int:
        return self.total_pages - self.free_pages

    def ids_of(self, eid: int) -> tuple[int, ...]:
        """The arena pages entry `eid` holds."""
        return self.entries[eid].ids

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- lookup ---------------------------------------------------------------------------------------------------
    def lookup(self, salt: str, prompt: Sequence[int]) -> tuple[int | None, int, str | None]:
        """(entry id, length, None) of the longest kept prefix under `salt`, or (None, 0, miss reason)."""
        self.stats.queries += len(prompt)
        if not self.on:
            return None, 0, MISS_OFF
        tree = self.trees.get(salt)
        eid, length = tree.longest(prompt, len(prompt) - 1) if tree is not None else (None, 0)
        if eid is not None:
            return eid, length, None
        ghosts = self.ghosts.get(salt, {})
        if any(len(k) < len(prompt) and tuple(prompt[:len(k)]) == k for k in ghosts):
            return None, 0, MISS_EVICTED
        for other, t in self.trees.items():
            if other != salt and t.longest(prompt, len(prompt) - 1)[0] is not None:
                return None, 0, MISS_SALT
        return None, 0, MISS_NONE

    def peek(self, salt: str, prompt: Sequence[int]) -> tuple[int | None, int]:
        """(entry id, length) `lookup` would give now, counting nothing."""
        tree = self.trees.get(salt) if self.on else None
        return tree.longest(prompt, len(prompt) - 1) if tree is not None else (None, 0)

    def forget(self, eid: int) -> None:
        """Remove an entry no rank holds (a disk load the ranks could not all read, or a clear); not an eviction."""
        e = self.entries.pop(eid, None)
        if e is not None:
            self.trees[e.salt].remove(e.tokens)
            self.arena.release(list(e.ids))

    def restored(self, eid: int, length: int) -> None:
        self.entries[eid].used = self._tick()
        self.stats.hits += length

    # ---- keep and evict -------------------------------------------------------------------------------------------
    def plan_keep(self, salt: str, tokens: Sequence[int], protect: set[int]) -> tuple[int | None, list[int]]:
        """(new entry id or None, entry ids to drop first) for keeping `tokens` under `salt`. None: already kept
        (touched), or it cannot fit even with every unprotected entry gone."""
        tokens = tuple(tokens)
        tree = self.trees.setdefault(salt, RadixTree())
        same = tree.get(tokens)
        if same is not None:
            self.entries[same].used = self._tick()
            return None, []
        need = self.pages_for(len(tokens))
        spare = sum(e.pages for e in self.entries.values() if e.entry_id not in protect)
        if need > self.free_pages + spare:
            return None, []
        if self.max_entries and len(protect & self.entries.keys()) >= self.max_entries:
            return None, []
        drops = []
        while self.free_pages < need or self._full():
            victim = self._victim(protect, salt, tokens)
            drops.append(victim.entry_id)
            self._evict(victim, self._superseded(victim, salt, tokens))
        eid = self._next_id
        self._next_id += 1
        self.entries[eid] = Entry(eid, salt, tokens, tuple(self.arena.lease(need)), self._tick())
        tree.insert(tokens, eid)
        self.stats.kept += 1
        self.ghosts.get(salt, {}).pop(tokens, None)
        return eid, drops

    def _full(self) -> bool:
        return bool(self.max_entries) and len(self.entries) >= self.max_entries

    def _superseded(self, e: Entry, salt: str, tokens: tuple[int, ...]) -> bool:
        """A longer kept state (or the one being kept) extends e's prefix."""
        if e.salt == salt and len(e.tokens) < len(tokens) and tokens[:len(e.tokens)] == e.tokens:
            return True
        return self.trees[e.salt].has_longer(e.tokens)

    def _victim(self, protect: set[int], salt: str, tokens: tuple[int, ...]) -> Entry:
        live = [e for e in self.entries.values() if e.entry_id not in protect]
        superseded = [e for e in live if self._superseded(e, salt, tokens)]
        return min(superseded or live, key=lambda e: e.used)

    def evict(self, protect: set[int], among: set[int], why: str) -> int:
        """Evict the first victim among `among` (superseded keep points first, then least recently used)."""
        victim = self._victim(protect | (self.entries.keys() - among), "", ())
        self._evict(victim, False, why)
        return victim.entry_id

    def clear(self) -> list[int]:
        """Forget every entry (at stop); their ids."""
        ids = list(self.entries)
        for e in list(self.entries.values()):
            self.trees[e.salt].remove(e.tokens)
        self.entries.clear()
        self.arena = PagePool(self.total_pages) if self.total_pages > 0 else None
        return ids

    def _evict(self, e: Entry, superseded: bool, why: str = "") -> None:
        why = why or ("superseded" if superseded else "least recently used")
        self.trees[e.salt].remove(e.tokens)
        del self.entries[e.entry_id]
        self.arena.release(list(e.ids))
        self.stats.evictions += 1
        self.evicted.append((e.entry_id, e.salt, len(e.tokens), why))
        ghosts = self.ghosts.setdefault(e.salt, collections.OrderedDict())
        ghosts[e.tokens] = None
        while len(ghosts) > _GHOSTS:
            ghosts.popitem(last=False)
