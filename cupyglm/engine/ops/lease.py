"""Lease: the pages each row group writes, by id, as rank 0's scheduler leased them (the only allocator).

Apply: the ids taken from this rank's pool (refused when one is not free here) and appended to the table.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.engine.ops.fields import id_entries, read_id_entries

TAG = 6
NAME = "lease"
LAYOUT = ("n u32 | n x (request_id u64 | n_pages u32 | page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QI")


@dataclasses.dataclass(frozen=True)
class Lease:
    entries: tuple[tuple[int, tuple[int, ...]], ...]        # (request, page ids appended to its table)

    def encode(self) -> bytes:
        return id_entries(_ENTRY, self.entries, "request")

    @classmethod
    def decode(cls, payload) -> Lease:
        return cls(read_id_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        for rid, pages in self.entries:
            w.take(w.states[rid], pages)


OP = Lease
