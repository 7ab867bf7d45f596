"""Evict: kept entries dropped before anything else of the step leases (room for its pages: CUPYGLM_KV_SHARE
admissions short of pages, `cupyglm.engine.page_evict`).

Apply: the entry's kept pages back to the arena and its KV pages to the pool (the page store lets go).
"""
from __future__ import annotations

import dataclasses

from cupyglm.engine.ops.fields import IdList

TAG = 4
NAME = "evict"
LAYOUT = ("n u32 | n x entry u64",)


@dataclasses.dataclass(frozen=True)
class Evict(IdList):
    WHAT = NAME

    entry_ids: tuple[int, ...]

    def apply(self, w, result) -> None:
        for eid in self.entry_ids:
            w.store.drop(eid)


OP = Evict
