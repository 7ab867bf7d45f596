"""Sync: every rank finishes its queued writes and the ranks agree that all succeeded (a save, or the stop).
No payload.

Apply: the agreed flag goes into the step's result under -1.
"""
from __future__ import annotations

import dataclasses

from cupyglm.distributed.step import Reader

TAG = 13
NAME = "sync"
LAYOUT = ("(no payload)",)


@dataclasses.dataclass(frozen=True)
class Sync:
    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload) -> Sync:
        Reader(payload, NAME).done()
        return cls()

    def apply(self, w, result) -> None:
        result.disk[-1] = w.store.sync()


OP = Sync
