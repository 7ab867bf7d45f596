"""Unlink: state files deleted (evicted from rank 0's disk index, or unreadable), after the queued writes.

Apply: this rank deletes its own file of each key.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.engine.ops.fields import entries, read_entries

TAG = 10
NAME = "unlink"
LAYOUT = ("n u32 | n x key 16s",)
_KEY = struct.Struct("<16s")


@dataclasses.dataclass(frozen=True)
class Unlink:
    keys: tuple[bytes, ...]

    def encode(self) -> bytes:
        return entries(_KEY, self.keys)

    @classmethod
    def decode(cls, payload) -> Unlink:
        return cls(read_entries(payload, _KEY, NAME, bare=True))

    def apply(self, w, result) -> None:
        for key in self.keys:
            w.store.unlink(key)


OP = Unlink
