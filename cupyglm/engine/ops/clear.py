"""Clear: every rank deletes all its state files (POST /v1/cache/clear). No payload.

Apply: after the unlinks, before any load.
"""
from __future__ import annotations

import dataclasses

from cupyglm.distributed.step import Reader

TAG = 11
NAME = "clear"
LAYOUT = ("(no payload)",)


@dataclasses.dataclass(frozen=True)
class Clear:
    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload) -> Clear:
        Reader(payload, NAME).done()
        return cls()

    def apply(self, w, result) -> None:
        w.store.clear()


OP = Clear
