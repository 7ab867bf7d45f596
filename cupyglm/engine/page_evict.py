"""Rank 0's evictions for KV pages (CUPYGLM_KV_SHARE): an admission short of free pages drops kept entries whose
pages only the store holds, before the step leases anything (asked through `cupyglm.engine.prefix_store`).

The chosen entries travel in the step message's evict section, which every rank applies before the step's
restores and leases; rank 0 lets go of their pages here, at once, so its leases see the same free pages.
"""
from __future__ import annotations

from cupyglm.engine.prompt_cache import PromptCache
from cupyglm.kv.page_store import PageStore

WHY = "KV pages for a new request"


def evict_for(cache: PromptCache, pages: PageStore, short: int, protect: set[int]) -> list[int] | None:
    """Kept entries dropped (in this order, their pages released) until `short` more KV pages are free; None, and
    nothing dropped, when every entry outside `protect` together frees fewer."""
    freeable = pages.freeable(protect)
    if len(freeable) < short:
        return None
    among = {eid for eid, held in pages.entries.items() if eid not in protect and freeable.intersection(held)}
    drops, gained = [], 0
    while gained < short:
        eid = cache.evict(protect, among, WHY)
        among.discard(eid)
        gained += pages.drop(eid)
        drops.append(eid)
    return drops
