"""Restore: a new request starts from a kept entry; the message names its whole page table after the restore.

Apply: with a page store the entry's shared pages are lent first (they must be the table's leading ids), the
rest of the named ids are taken from this rank's pool, then the kept bytes are copied into the state.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import Reader, StepFormatError, ids, pack
from cupyglm.engine.ops.fields import COUNT

TAG = 5
NAME = "restore"
LAYOUT = ("n u32 | n x (request_id u64 | entry u64 | length u32 | n_pages u32 | page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QQII")


@dataclasses.dataclass(frozen=True)
class Restore:
    entries: tuple[tuple[int, int, int, tuple[int, ...]], ...]     # (request, entry, length, page table)

    def encode(self) -> bytes:
        out = bytearray(pack(COUNT, len(self.entries)))
        for rid, eid, length, pages in self.entries:
            out += pack(_ENTRY, rid, eid, length, len(pages)) + ids(pages, f"request {rid}'s restored pages")
        return bytes(out)

    @classmethod
    def decode(cls, payload) -> Restore:
        r = Reader(payload, NAME)
        (n,) = r.take(COUNT, "the restore count")
        out = []
        for _ in range(n):
            rid, eid, length, n_pages = r.take(_ENTRY, "a restore")
            out.append((rid, eid, length, r.ids(n_pages, f"request {rid}'s restored pages")))
        r.done()
        return cls(tuple(out))

    def apply(self, w, result) -> None:
        for rid, eid, length, pages in self.entries:
            state = w.states[rid]
            state.pages.extend(w.store.lend(eid))
            held = len(state.pages)
            if tuple(state.pages) != tuple(pages[:held]):
                raise StepFormatError(f"rank {w.rank}: request {rid}'s shared pages {state.pages} differ from "
                                      f"rank 0's table {list(pages)} (step {w.step})")
            w.take(state, pages[held:])
            w.store.restore(eid, state)


OP = Restore
