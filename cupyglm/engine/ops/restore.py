"""Restore: a new request starts from a kept entry; the message names its whole page table after the restore.

Apply: with a page store the entry's shared pages are lent first (they must be the table's leading ids), the
rest of the named ids are taken from this rank's pool, then the kept bytes are copied into the state.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.ops.fields import id_entries, read_id_entries

TAG = 5
NAME = "restore"
LAYOUT = ("n u32 | n x (request_id u64 | entry u64 | length u32 | n_pages u32 | page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QQII")


@dataclasses.dataclass(frozen=True)
class Restore:
    entries: tuple[tuple[int, int, int, tuple[int, ...]], ...]     # (request, entry, length, page table)

    def encode(self) -> bytes:
        return id_entries(_ENTRY, self.entries, "request")

    @classmethod
    def decode(cls, payload) -> Restore:
        return cls(read_id_entries(payload, _ENTRY, NAME))

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
