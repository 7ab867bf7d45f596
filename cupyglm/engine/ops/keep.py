"""Keep: a request's state kept at `length` (a keep point its prompt chunk just reached) under a new entry on the
kept (arena) pages rank 0's prompt cache leased, last of the step: after the drops and loads that free pages.

Apply: the state copied into those kept pages (refused when one is not free here); with a page store the entry holds the whole pages before the keep point;
with a disk tier the entry's tokens are noted as the prompt cache keys them (`images.held_key`: an image's
placeholders as its tag's keys), and a later spill writes them into the file's header.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.images import held_key
from cupyglm.engine.ops.fields import id_entries, read_id_entries

TAG = 14
NAME = "keep"
LAYOUT = ("n u32 | n x (request_id u64 | entry u64 | length u32 | n_pages u32 | kept page ids u32 x n_pages)",)
_ENTRY = struct.Struct("<QQII")


@dataclasses.dataclass(frozen=True)
class Keep:
    entries: tuple[tuple[int, int, int, tuple[int, ...]], ...]     # (request, new entry, length, kept pages)

    def encode(self) -> bytes:
        return id_entries(_ENTRY, self.entries, "request")

    @classmethod
    def decode(cls, payload) -> Keep:
        return cls(read_id_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        for rid, eid, length, pages in self.entries:
            state = w.states[rid]
            if state.length != length:
                raise StepFormatError(f"rank {w.rank}: request {rid} is at position {state.length}, step {w.step} "
                                      f"keeps it at {length}")
            key = held_key(w.requests[rid].prompt, w.images.get(rid, ()))
            if key is None:
                raise StepFormatError(f"rank {w.rank}: step {w.step} keeps request {rid}, whose image has no tag")
            w.store.keep(eid, state, key[:length], pages)


OP = Keep
