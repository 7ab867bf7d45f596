"""Load: state files read into new kept entries, on the kept pages rank 0's prompt cache leased, after the drops,
before the keeps. The one place a rank's disk can disagree with another's: every rank reads and checks its own
file, then the ranks all-gather one ok flag per load and take the kept pages only when every rank read its file
(`cupyglm.engine.disk_tier`).

Apply: the agreed outcome per entry goes into the step's result (rank 0's planner resolves its loads by it).
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.engine.ops.fields import id_entries, read_id_entries

TAG = 12
NAME = "load"
LAYOUT = ("n u32 | n x (entry u64 | length u32 | key 16s | n_pages u32 | kept page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QI16sI")


@dataclasses.dataclass(frozen=True)
class Load:
    entries: tuple[tuple[int, int, bytes, tuple[int, ...]], ...]      # (entry, length, key, kept pages)

    def encode(self) -> bytes:
        return id_entries(_ENTRY, self.entries, "entry")

    @classmethod
    def decode(cls, payload) -> Load:
        return cls(read_id_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        result.disk.update(w.store.load(self.entries))    # collective: every rank, every step with loads


OP = Load
