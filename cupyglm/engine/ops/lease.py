"""Lease: the pages each row group writes, by id, as rank 0's scheduler leased them (the only allocator).

Apply: the ids taken from this rank's pool (refused when one is not free here) and appended to the table.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import Reader, ids, pack
from cupyglm.engine.ops.fields import COUNT

TAG = 6
NAME = "lease"
LAYOUT = ("n u32 | n x (request_id u64 | n_pages u32 | page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QI")


@dataclasses.dataclass(frozen=True)
class Lease:
    entries: tuple[tuple[int, tuple[int, ...]], ...]        # (request, page ids appended to its table)

    def encode(self) -> bytes:
        out = bytearray(pack(COUNT, len(self.entries)))
        for rid, pages in self.entries:
            out += pack(_ENTRY, rid, len(pages)) + ids(pages, f"request {rid}'s leased pages")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> Lease:
        r = Reader(payload, NAME)
        (n,) = r.take(COUNT, "the lease count")
        out = []
        for _ in range(n):
            rid, n_pages = r.take(_ENTRY, "a lease")
            out.append((rid, r.ids(n_pages, f"request {rid}'s leased pages")))
        r.done()
        return cls(tuple(out))

    def apply(self, w, result) -> None:
        for rid, pages in self.entries:
            w.take(w.states[rid], pages)


OP = Lease
