"""The lockstep message's frame: what rank 0 broadcasts each step, as bytes, so every rank runs the same step.

The frame knows nothing of what a step does: it carries the step number, the stop flag and an ordered list of
records, each a tag and its payload. The engine gives the tags their meaning (`cupyglm.engine.ops`: one module
per operation, its payload's layout, and what every rank does with it, in the order the records come).

Byte layout (little-endian, packed, no padding; VERSION is bumped on any change, the operations' included):

    header      magic 4s = b"CGST" | version u16 | flags u16 (bit 0: stop, shut down after this message)
                | step u64 | n_ops u32                                                                  20 bytes
    n_ops x     tag u16 | n_bytes u32 | payload (n_bytes)

The message must end exactly after the last record. `decode` refuses a wrong magic or version by name.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

import numpy as np

MAGIC = b"CGST"
VERSION = 5

HEADER = struct.Struct("<4sHHQI")
RECORD = struct.Struct("<HI")

FLAG_STOP = 1


class StepFormatError(ValueError):
    """A step message this rank cannot read."""


class StepVersionError(StepFormatError):
    """A step message of another layout version (the ranks run different builds)."""


@dataclasses.dataclass(frozen=True)
class Frame:
    step: int = 0
    stop: bool = False
    records: tuple[tuple[int, bytes], ...] = ()        # (tag, payload), in the order every rank applies them


def ids(values: Sequence[int], what: str) -> bytes:
    """Token or page ids as u32 bytes; ValueError names `what` when one does not fit."""
    try:
        arr = np.asarray(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"step message: {what} holds a value that is not an id") from None
    if arr.ndim != 1:
        raise ValueError(f"step message: {what} must be a flat list of ids")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError(f"step message: {what} holds an id outside 0..2**32-1")
    return arr.astype("<u4").tobytes()


def pack(st: struct.Struct, *values) -> bytes:
    try:
        return st.pack(*values)
    except struct.error as err:
        raise ValueError(f"step message: a value does not fit its field ({err})") from None


class Reader:
    """Reads a payload field by field; running past its end is a StepFormatError naming the field."""

    def __init__(self, data, what: str = "the message"):
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def take(self, st: struct.Struct, what: str) -> tuple:
        end = self.pos + st.size
        if end > len(self.data):
            raise StepFormatError(f"step message truncated in {what} (byte {self.pos} of {len(self.data)} "
                                  f"in {self.what})")
        values = st.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def ids(self, n: int, what: str) -> tuple[int, ...]:
        end = self.pos + 4 * n
        if end > len(self.data):
            raise StepFormatError(f"step message truncated in {what} (byte {self.pos} of {len(self.data)} "
                                  f"in {self.what})")
        arr = np.frombuffer(self.data[self.pos:end], dtype="<u4")
        self.pos = end
        return tuple(arr.tolist())

    def rest(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise StepFormatError(f"step message truncated in {what} (byte {self.pos} of {len(self.data)})")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def done(self) -> None:
        if self.pos != len(self.data):
            raise StepFormatError(f"step message has {len(self.data) - self.pos} trailing bytes in {self.what}")


def encode(frame: Frame) -> bytes:
    out = bytearray(pack(HEADER, MAGIC, VERSION, FLAG_STOP if frame.stop else 0, frame.step, len(frame.records)))
    for tag, payload in frame.records:
        out += pack(RECORD, tag, len(payload))
        out += payload
    return bytes(out)


def decode(data: bytes) -> Frame:
    """The Frame in `data`; StepVersionError / StepFormatError name what is wrong."""
    if len(data) < 6:
        raise StepFormatError(f"step message too short ({len(data)} bytes)")
    magic = bytes(data[:4])
    if magic != MAGIC:
        raise StepFormatError(f"not a cupyglm step message (magic {magic!r}, expected {MAGIC!r})")
    (version,) = struct.unpack_from("<H", data, 4)
    if version != VERSION:
        raise StepVersionError(f"step message version {version} from rank 0 differs from this rank's version "
                               f"{VERSION} (the ranks run different cupyglm builds)")
    r = Reader(data)
    _, _, flags, step, n_ops = r.take(HEADER, "the header")
    if flags & ~FLAG_STOP:
        raise StepFormatError(f"step message has unknown flags {flags:#x}")
    records = []
    for i in range(n_ops):
        tag, n = r.take(RECORD, f"operation {i}'s frame")
        records.append((tag, bytes(r.rest(n, f"operation {i} (tag {tag})"))))
    r.done()
    return Frame(step, bool(flags & FLAG_STOP), tuple(records))
