"""Payload helpers the operations share: a count, then fixed-size entries."""
from __future__ import annotations

import struct

from cupyglm.distributed.step import Reader, pack

COUNT = struct.Struct("<I")
U64 = struct.Struct("<Q")


def entries(st: struct.Struct, items) -> bytes:
    """n u32 | n x st."""
    return pack(COUNT, len(items)) + b"".join(pack(st, *(it if isinstance(it, tuple) else (it,))) for it in items)


def read_entries(payload, st: struct.Struct, what: str, bare: bool = False) -> tuple:
    """The entries `entries` wrote (`bare`: a one-field struct's values, not 1-tuples)."""
    r = Reader(payload, what)
    (n,) = r.take(COUNT, f"the {what} count")
    out = tuple(r.take(st, what) for _ in range(n))
    r.done()
    return tuple(v[0] for v in out) if bare else out
