"""Settle: verified requests and the position their next row group starts at (`cupyglm.engine.verify`).

Apply, before anything of the step leases or reads: the table cut to the pages that position needs and, when
a draft was rejected, the snapshot put back and the accepted rows replayed.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import NamedTuple

from cupyglm.engine.ops.fields import entries, read_entries

TAG = 3
NAME = "settle"
LAYOUT = ("n u32 | n x (request_id u64 | start u32)",)
_ENTRY = struct.Struct("<QI")


class Start(NamedTuple):
    request_id: int
    start: int                                  # where its next row group starts


@dataclasses.dataclass(frozen=True)
class Settle:
    entries: tuple[Start, ...]

    def encode(self) -> bytes:
        return entries(_ENTRY, self.entries)

    @classmethod
    def decode(cls, payload) -> Settle:
        return cls(tuple(Start(*e) for e in read_entries(payload, _ENTRY, NAME)))

    def apply(self, w, result) -> None:
        w.verifier.settle(self.entries, w.states)


OP = Settle
