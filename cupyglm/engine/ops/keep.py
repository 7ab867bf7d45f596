"""Keep: a request's state kept at `length` (a keep point its prompt chunk just reached) under a new entry, last
of the step: after the drops and loads, so every rank leases the same kept pages (lowest id first).

Apply: the state copied into kept pages; with a page store the entry holds the whole pages before the keep point;
with a disk tier the entry's tokens are noted (a later spill writes them into the file's header).
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import StepFormatError
from cupyglm.engine.ops.fields import entries, read_entries

TAG = 14
NAME = "keep"
LAYOUT = ("n u32 | n x (request_id u64 | entry u64 | length u32)",)
_ENTRY = struct.Struct("<QQI")


@dataclasses.dataclass(frozen=True)
class Keep:
    entries: tuple[tuple[int, int, int], ...]          # (request, new entry, length)

    def encode(self) -> bytes:
        return entries(_ENTRY, self.entries)

    @classmethod
    def decode(cls, payload) -> Keep:
        return cls(read_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        for rid, eid, length in self.entries:
            state = w.states[rid]
            if state.length != length:
                raise StepFormatError(f"rank {w.rank}: request {rid} is at position {state.length}, step {w.step} "
                                      f"keeps it at {length}")
            w.store.keep(eid, state, tuple(w.requests[rid].prompt[:length]))


OP = Keep
