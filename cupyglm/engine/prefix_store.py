"""Rank 0's one store of kept prefixes: the tiers that hold kept prompt states behind one interface.

Tiers (pure CPU indexes; every rank's worker holds the bytes, `cupyglm.engine.worker`):
- memory: the kept-state arena (`cupyglm.engine.prompt_cache.PromptCache`), always present in a store;
- pool pages: kept prompts' whole KV pages shared with the pool (CUPYGLM_KV_SHARE, `cupyglm.kv.page_store`);
- disk: state files every rank holds (`cupyglm.engine.disk_tier.DiskPlanner`): an evicted state spills, a longer
  prefix on disk is loaded into a new memory entry first.
An absent tier is a null one here, and a server without a prompt cache gets `NullStore` (never hits), so the
scheduler asks one object and checks for none.

Operations, each returning what the plan and the step message carry: `lookup` (the longest kept prefix and its
tier), `restore`, `keep` (with the kept pages the memory tier leased: it alone allocates the arena), `evict`
(for KV pages), the step's `end_step` (drops and the disk section: spills,
loads, unlinks), `resolved` (the ranks' agreed loads), `stop` and `admin` (save / clear).

What must stay true: the calls come in the order the scheduler plans a step (evictions before any lease, keeps
after the step's leases), because rank 0's page store makes the holds every rank's worker will make.
"""
from __future__ import annotations

import dataclasses

from cupyglm.engine.page_evict import evict_for
from cupyglm.engine.prompt_cache import MISS_IMAGES, MISS_OFF, MISS_PROMPT_LOGPROBS, PromptCache
from cupyglm.kv.page_store import NoPages, PageStore

MEMORY = "memory"                   # restore from a memory entry now
DISK = "disk"                       # a load is planned: the request waits one step, then restores
ADMIN_OPS = ("save", "clear")


@dataclasses.dataclass(frozen=True)
class Found:
    """A lookup: the entry and length to restore (tier MEMORY), a planned load (DISK), or a miss ("")."""

    entry: int | None
    length: int
    miss: str | None                # the miss reason the request reports (None: a hit)
    tier: str = ""


def _check_op(op: str) -> None:
    if op not in ADMIN_OPS:
        raise ValueError(f"unknown cache operation {op!r} (save or clear)")


class _NoDisk:
    """The disk tier of a server without --prompt-cache-dir: loads nothing, spills nothing."""

    protected: frozenset = frozenset()
    busy = False

    def loading(self, request_id: int) -> bool:
        return False

    def note_keep(self, eid: int, salt: str, tokens) -> None:
        pass

    def plan_load(self, cache, r, memory_len: int, protect: set[int]) -> bool:
        return False

    def take_ready(self) -> list:
        return []

    def step_ops(self, cache, drops: tuple[int, ...], evicted_from: int):
        return drops, None

    def resolved(self, results: dict[int, bool]) -> list[int]:
        return []

    def save_ops(self, cache):
        return None

    def clear_ops(self):
        return None


class PrefixStore:
    """Kept prefixes in memory, optionally as pool pages and on disk; `cache`, `pages`, `disk` are the tiers
    (None where absent) for observers."""

    def __init__(self, cache: PromptCache, pages=None, disk=None, page_bytes: int = 0):
        self.cache, self.pages, self.disk = cache, pages, disk
        self.page_bytes = page_bytes                # one kept page's bytes (for `held`)
        self._pages = pages if pages is not None else NoPages()
        self._disk = disk if disk is not None else _NoDisk()
        self._evicted_from = 0

    @property
    def pages_held(self) -> int | None:
        """KV pages kept prompts hold in the plan; None without a pool-pages tier."""
        return None if self.pages is None else self.pages.held

    def held(self) -> tuple[int, int]:
        """(bytes of kept states in the memory tier, evictions so far)."""
        return self.cache.held_pages * self.page_bytes, self.cache.stats.evictions

    @property
    def keeps(self) -> bool:
        """Keep points are kept (the arena has room for any)."""
        return self.cache.on

    # ---- admission ---------------------------------------------------------------------------------------------
    def shares(self, r, protect: set[int]) -> int:
        """Pool pages `r` will share from the entry it resumes from (that entry joins `protect`)."""
        if r.params.prompt_logprobs is not None or r.key is None:
            return 0
        eid, length = self.cache.peek(r.salt, r.key)
        if eid is None:
            return 0
        protect.add(eid)
        return self._pages.shared_pages(length)

    def evict(self, short: int, protect: set[int]) -> list[int] | None:
        """Entries evicted (their pool pages let go at once) until `short` more KV pages are free; None, and
        nothing evicted, when that cannot be done."""
        return evict_for(self.cache, self._pages, short, protect)

    def lookup(self, r, protect: set[int]) -> Found:
        """The longest kept prefix of r's prompt and the tier that holds it; a longer one on disk has its load
        planned (into a new memory entry, outside `protect`)."""
        if r.params.prompt_logprobs is not None:     # every prompt row's logits are needed: restore nothing
            return Found(None, 0, MISS_PROMPT_LOGPROBS)
        if r.key is None:                             # an image without a digest: nothing names its rows
            return Found(None, 0, MISS_IMAGES)
        eid, length, miss = self.cache.lookup(r.salt, r.key)
        if self._disk.plan_load(self.cache, r, length, protect):
            return Found(None, length, miss, DISK)
        return Found(eid, length, miss, MEMORY if eid is not None else "")

    def restore(self, eid: int, length: int) -> list[int]:
        """Entry `eid` is restored at `length`; the pool pages the sequence shares (its table's first ids)."""
        self.cache.restored(eid, length)
        return self._pages.lend(eid)

    # ---- the step ----------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        self._evicted_from = len(self.cache.evicted)

    def loading(self, request_id: int) -> bool:
        """The request waits for its disk load."""
        return self._disk.loading(request_id)

    def loaded(self) -> list[tuple[int, int, int]]:
        """(request, entry, length) whose loads every rank completed: restore them now; taken once."""
        return self._disk.take_ready()

    def keep(self, r, length: int, protect: set[int]) -> tuple[int | None, tuple[int, ...], list[int]]:
        """(new entry or None, the kept pages it was leased, entries dropped for it) for keeping r's state at
        `length`, after the step's leases: the new entry holds r's whole pages before the keep point."""
        if r.key is None:                             # never kept: nothing names the image's rows
            return None, (), []
        tokens = r.key[:length]
        eid, evict = self.cache.plan_keep(r.salt, tokens, protect | self._disk.protected)
        for d in evict:
            self._pages.drop(d)
        if eid is None:
            return None, (), evict
        self._pages.hold(eid, r.pages[:self._pages.shared_pages(length)])
        self._disk.note_keep(eid, r.salt, tokens)
        return eid, self.cache.ids_of(eid), evict

    def end_step(self, drops: tuple[int, ...]):
        """(the step's drops, its disk section or None): the loads' evictions first, spills of what the step
        evicted."""
        return self._disk.step_ops(self.cache, drops, self._evicted_from)

    def resolved(self, results: dict[int, bool]) -> None:
        """The ranks' agreed loads (entry -> every rank read it); a failed load's entry is forgotten."""
        for eid in self._disk.resolved(results):
            self.cache.forget(eid)

    # ---- stop and admin ----------------------------------------------------------------------------------------
    def drop_all(self) -> tuple[int, ...]:
        """Forget every kept entry and let go of its pool pages; their ids, for every rank to drop."""
        ids = tuple(self.cache.clear())
        for eid in ids:
            self._pages.drop(eid)
        return ids

    def stop(self):
        """(drops, disk section) of the stop message: pool pages all let go, memory states saved to disk."""
        drops = self.drop_all() if self.pages is not None else ()
        return drops, self._disk.save_ops(self.cache)

    def admin(self, op: str):
        """(drops, disk section) of POST /v1/cache/save or clear; ValueError when this server cannot."""
        _check_op(op)
        if op == "save" and self.disk is None:
            raise ValueError("this server keeps no states on disk (no --prompt-cache-dir)")
        if self._disk.busy:
            raise ValueError("a state is being loaded from disk; retry in a moment")
        if op == "save":
            return (), self._disk.save_ops(self.cache)
        drops = tuple(sorted(self.cache.entries))
        for eid in drops:
            self.cache.forget(eid)
            self._pages.drop(eid)              # rank 0's planning pool lets go as every worker's does
        return drops, self._disk.clear_ops()


class NullStore:
    """No prompt cache: the same interface, never a hit, nothing kept."""

    cache = pages = disk = pages_held = None
    keeps = False

    def held(self) -> None:
        return None

    def shares(self, r, protect: set[int]) -> int:
        return 0

    def evict(self, short: int, protect: set[int]) -> None:
        return None

    def lookup(self, r, protect: set[int]) -> Found:
        return Found(None, 0, MISS_OFF)

    def begin_step(self) -> None:
        pass

    def loading(self, request_id: int) -> bool:
        return False

    def loaded(self) -> list:
        return []

    def end_step(self, drops: tuple[int, ...]):
        return drops, None

    def resolved(self, results: dict[int, bool]) -> None:
        pass

    def drop_all(self) -> tuple[int, ...]:
        return ()

    def stop(self):
        return (), None

    def admin(self, op: str):
        _check_op(op)
        raise ValueError("this server has no prompt cache (--prompt-cache-gib 0)")


def prefix_store(cache: PromptCache | None, pages=None, disk=None) -> PrefixStore | NullStore:
    """The store over these tiers; a NullStore without a memory tier."""
    return NullStore() if cache is None else PrefixStore(cache, pages, disk)


def store_for(kept, pool, disk=None) -> PrefixStore | NullStore:
    """Rank 0's store mirroring a rank's `KeptStore` (None: no prompt cache): the arena's index, and with
    CUPYGLM_KV_SHARE a page store of its own over the scheduler's planning `pool`."""
    if kept is None:
        return NullStore()
    p = kept.pages
    pages = PageStore(pool, p.page_tokens, p.limit, bool(p.late)) if p is not None else None
    cache = PromptCache(kept.pool.num_pages, kept.pages_for, p.limit if p is not None else 0)
    return PrefixStore(cache, pages, disk, kept.page_bytes)
