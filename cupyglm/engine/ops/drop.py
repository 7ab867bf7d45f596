"""Drop: kept entries dropped after the step's rows ran (the memory cache's evictions and supersessions),
after the spills that write them to disk and before the keeps that may reuse their kept pages.

Apply: as evict.
"""
from __future__ import annotations

import dataclasses

from cupyglm.engine.ops.fields import U64, entries, read_entries

TAG = 9
NAME = "drop"
LAYOUT = ("n u32 | n x entry u64",)


@dataclasses.dataclass(frozen=True)
class Drop:
    entry_ids: tuple[int, ...]

    def encode(self) -> bytes:
        return entries(U64, self.entry_ids)

    @classmethod
    def decode(cls, payload) -> Drop:
        return cls(read_entries(payload, U64, NAME, bare=True))

    def apply(self, w, result) -> None:
        for eid in self.entry_ids:
            w.store.drop(eid)


OP = Drop
