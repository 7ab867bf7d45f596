"""Payload helpers the operations share: a count, then fixed-size entries; a count, then entries that each end in
a list of ids; and `IdList`, the codec of an operation that is a list of u64 ids (cancel, evict, drop)."""
from __future__ import annotations

import dataclasses
import struct

from cupyglm.distributed.step import Reader, ids, pack

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


def id_entries(st: struct.Struct, items, what: str) -> bytes:
    """n u32 | n x (st's fields, its last the id count | ids u32 x that count); each item: (fields..., ids)."""
    out = bytearray(pack(COUNT, len(items)))
    for *head, values in items:
        out += pack(st, *head, len(values)) + ids(values, f"{what} {head[0]}'s page ids")
    return bytes(out)


def read_id_entries(payload, st: struct.Struct, what: str) -> tuple:
    """The (fields..., ids) items `id_entries` wrote."""
    r = Reader(payload, what)
    (n,) = r.take(COUNT, f"the {what} count")
    out = []
    for _ in range(n):
        *head, count = r.take(st, what)
        out.append((*head, r.ids(count, f"{what} {head[0]}'s page ids")))
    r.done()
    return tuple(out)


class IdList:
    """An operation whose payload is n u32 | n x u64 (its one field: the ids); `WHAT` names it in refusals."""

    WHAT = ""

    def encode(self) -> bytes:
        return entries(U64, getattr(self, dataclasses.fields(self)[0].name))

    @classmethod
    def decode(cls, payload):
        return cls(read_entries(payload, U64, cls.WHAT, bare=True))
