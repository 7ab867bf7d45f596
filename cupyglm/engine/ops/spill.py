"""Spill: kept entries written to disk (`cupyglm.kv.disk_store`) before the drops let go of them; salt and key
are 16-byte digests (`cupyglm.kv.disk_file`).

Apply: the entry's kept bytes copied into a host buffer this rank's writer thread writes to its own file.
"""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.engine.ops.fields import entries, read_entries

TAG = 8
NAME = "spill"
LAYOUT = ("n u32 | n x (entry u64 | salt 16s | key 16s)",)
_ENTRY = struct.Struct("<Q16s16s")


@dataclasses.dataclass(frozen=True)
class Spill:
    entries: tuple[tuple[int, bytes, bytes], ...]      # (entry, salt, key)

    def encode(self) -> bytes:
        return entries(_ENTRY, self.entries)

    @classmethod
    def decode(cls, payload) -> Spill:
        return cls(read_entries(payload, _ENTRY, NAME))

    def apply(self, w, result) -> None:
        for eid, salt, key in self.entries:
            w.store.spill(eid, key, salt)


OP = Spill
