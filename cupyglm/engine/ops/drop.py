"""Drop: kept entries dropped after the step's rows ran (the memory cache's evictions and supersessions),
after the spills that write them to disk and before the keeps that may reuse their kept pages.

Apply: as evict.
"""
from __future__ import annotations

import dataclasses

from cupyglm.engine.ops.fields import IdList

TAG = 9
NAME = "drop"
LAYOUT = ("n u32 | n x entry u64",)


@dataclasses.dataclass(frozen=True)
class Drop(IdList):
    WHAT = NAME

    entry_ids: tuple[int, ...]

    def apply(self, w, result) -> None:
        for eid in self.entry_ids:
            w.store.drop(eid)


OP = Drop
