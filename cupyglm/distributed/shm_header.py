"""The header of a cupyglm shared-memory segment (cupyglm.distributed.shm), its name, and who made it.

A segment file starts with this header (little-endian):

    offset  size  field
    0       8     magic b"CUPYGLMS"
    8       4     version u32 (VERSION)
    12      4     header_size u32 (HEADER_SIZE; the payload starts there, page-aligned)
    16      8     creator pid u64
    24      8     creator start time u64 (clock ticks after boot, /proc/<pid>/stat field 22; 0 unknown)
    32      8     created at u64 (ns since the epoch)
    40      8     payload bytes u64
    48      4     local size u32 (mappings expected: the ranks of this host)
    52      4     mapped u32 (mappings so far; updated under fcntl.flock on the file)
    56      64    host name (utf-8, NUL-padded)
    120     64    fingerprint hash (hex, NUL-padded)
    184     32    purpose (ascii, NUL-padded)

The creator writes the magic last, so a half-made file has none; `read_header` refuses such a file.
"""
from __future__ import annotations

import dataclasses
import os
import re
import secrets
import struct
from pathlib import Path

from cupyglm import env

MAGIC = b"CUPYGLMS"
VERSION = 1
HEADER_SIZE = 4096
PREFIX = "cupyglm-"
FIELDS = struct.Struct("<8sIIQQQQII64s64s32s")
MAPPED_OFFSET = 52
_PURPOSE = re.compile(r"^[a-z0-9_]{1,32}$")


class ShmError(RuntimeError):
    pass


def shm_dir() -> Path:
    return Path(env.get("CUPYGLM_SHM_DIR") or "/dev/shm")


def new_token() -> str:
    """A per-launch token (rank 0 makes it; the handshake carries it to every rank)."""
    return secrets.token_hex(6)


def segment_name(token: str, purpose: str) -> str:
    if not re.fullmatch(r"[0-9a-z]{4,32}", token):
        raise ShmError(f"bad shared-memory token {token!r}")
    if not _PURPOSE.match(purpose):
        raise ShmError(f"bad shared-memory purpose {purpose!r} (use a-z, 0-9, _; at most 32)")
    return f"{PREFIX}{token}-{purpose}"


def process_start(pid: int) -> int:
    """Start time of `pid` in clock ticks after boot, 0 when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def process_alive(pid: int, start: int = 0) -> bool:
    """Whether `pid` runs and (when `start` is known) is the same process that had that start time."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start:
        now = process_start(pid)
        return now == 0 or now == start
    return True


@dataclasses.dataclass(frozen=True)
class Header:
    magic: bytes
    version: int
    header_size: int
    creator_pid: int
    creator_start: int
    created_ns: int
    payload_bytes: int
    local_size: int
    mapped: int
    host: str
    fingerprint_hash: str
    purpose: str

    def pack(self) -> bytes:
        return FIELDS.pack(self.magic, self.version, self.header_size, self.creator_pid, self.creator_start,
                            self.created_ns, self.payload_bytes, self.local_size, self.mapped,
                            self.host.encode()[:64], self.fingerprint_hash.encode()[:64], self.purpose.encode()[:32])

    @classmethod
    def unpack(cls, blob: bytes) -> "Header":
        if len(blob) < FIELDS.size:
            raise ShmError(f"header truncated ({len(blob)} bytes)")
        f = FIELDS.unpack_from(blob, 0)
        text = [x.rstrip(b"\0").decode(errors="replace") for x in f[9:]]
        return cls(f[0], *f[1:9], *text)


def read_header(path: str | Path) -> Header:
    """The header of a segment file; ShmError when it is not (or not yet) a cupyglm segment."""
    with open(path, "rb") as fh:
        blob = fh.read(FIELDS.size)
    h = Header.unpack(blob)
    if h.magic != MAGIC:
        raise ShmError("no cupyglm segment header (magic missing: made partway, or not ours)")
    if h.version != VERSION:
        raise ShmError(f"segment header version {h.version}, this build reads {VERSION}")
    return h
