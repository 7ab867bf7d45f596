"""Load: state files read into new kept entries after the drops, before the keeps. The one place a rank's disk
can disagree with another's: every rank reads and checks its own file, then the ranks all-gather one ok flag per
load and lease kept pages only when every rank read its file (`cupyglm.engine.disk_tier`).

Apply: the agreed outcome per entry goes into the step's result (rank 0's planner resolves its loads by it).
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.engine.ops.fields import entries, read_entries

TAG = 12
NAME = "load"
LAYOUT = ("n u32 | n x (entry u64 | length u32 | key 16s)",)
_ENTRY = struct.Struct("<QI16s")


@dataclasses.dataclass(frozen=True)
class Load:
    entries: tuple[tuple[int, int, bytes], ...]        # (entry, length, key)

    def encode(self) -> bytes:
        return entries(_ENTRY, self.entries)

    @classmethod
    def decode(cls, payload) -> Load:
        return cls(read_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        result.disk.update(w.store.load(self.entries))    # collective: every rank, every step with loads


OP = Load
