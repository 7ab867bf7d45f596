"""Shared host memory: one /dev/shm segment mapped by every rank of a host, gone from /dev/shm once all have it.

A segment is named `cupyglm-<token>-<purpose>`, the token being a per-launch random string rank 0 broadcasts in
the handshake, so two jobs (or two tests) never meet. The file starts with a header (its layout:
`cupyglm.distributed.shm_header`).

The creator writes the magic last, so a half-made file has none. `open_local` (the protocol every rank of a
host runs) never leaves the name waiting on another process: local rank 0 creates the file, maps it, keeps one
descriptor open and unlinks the name at once; the other local ranks open that same file through
`/proc/<creator pid>/fd/<fd>` (Linux; the same user), map it and add one to `mapped` under the lock, and after the
host's barrier every rank checks that `mapped` equals `local size`. So the name lives only across the creator's
own create-map-unlink calls: a SIGKILL of any rank while the others map (or later) leaves nothing in /dev/shm,
and a creator killed inside those few calls leaves a file whose creator is gone, which the next segment made on
this host and `cupyglm-cleanup-shm` remove. A creation that fails partway unlinks its file. (`count_mapping`
on a named file still unlinks it on the last mapping, for segments opened by name.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import mmap
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cupyglm.distributed.shm_header import (  # noqa: F401  (re-exported: the segment's public names)
    FIELDS, HEADER_SIZE, MAGIC, MAPPED_OFFSET, PREFIX, VERSION, Header, ShmError, new_token, process_alive,
    process_start, read_header, segment_name, shm_dir)


class SharedSegment:
    """A mapped segment: `payload` is a writable memoryview of `payload_bytes` after the header."""

    def __init__(self, name: str, path: Path, mm: mmap.mmap, header: Header):
        self.name = name
        self.path = path
        self._mm = mm
        self.header = header
        self.payload = memoryview(mm)[HEADER_SIZE:HEADER_SIZE + header.payload_bytes]
        self.unlinked_here = False
        self.fd = -1                   # an open descriptor of the file (open_local), -1 when none
        self.barrier = lambda: None    # a barrier of the ranks that map it (open_local)

    @property
    def nbytes(self) -> int:
        return self.header.payload_bytes

    def array(self, dtype: Any, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """A numpy view of the payload."""
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.payload, dtype=dtype, count=count, offset=offset).reshape(shape)

    def mapped(self) -> int:
        return struct.unpack_from("<I", self._mm, MAPPED_OFFSET)[0]

    def hold(self) -> str:
        """Keep a descriptor of the file open; the path any process of this user opens it by, name or not."""
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDWR)
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.payload.release()
            self._mm.close()
        except BufferError:
            pass  # numpy views still use it; the mapping goes when they do

    # ---- the two halves of the protocol ----------------------------------------------------------------------
    @classmethod
    def create(cls, token: str, purpose: str, nbytes: int, *, local_size: int,
               fingerprint_hash: str = "") -> "SharedSegment":
        """Make and map the file (header written, `mapped` 0). A failure partway unlinks it."""
        if nbytes < 0 or local_size < 1:
            raise ShmError(f"bad segment size {nbytes} or local size {local_size}")
        name = segment_name(token, purpose)
        path = shm_dir() / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        mm = None
        try:
            total = HEADER_SIZE + nbytes
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            header = Header(MAGIC, VERSION, HEADER_SIZE, os.getpid(), process_start(os.getpid()), time.time_ns(),
                            nbytes, local_size, 0, socket.gethostname(), fingerprint_hash, purpose)
            blob = header.pack()
            mm[8:len(blob)] = blob[8:]
            mm[0:8] = MAGIC
            return cls(name, path, mm, header)
        except BaseException:
            if mm is not None:
                mm.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            raise
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, token: str, purpose: str, *, fingerprint_hash: str | None = None,
               via: str | None = None) -> "SharedSegment":
        """Open and map an existing segment, checking its header (and fingerprint when given). Not yet counted.
        `via`: a path to open it by instead of its name (a creator's /proc/<pid>/fd/<fd>); the descriptor stays
        open then (`fd`)."""
        name = segment_name(token, purpose)
        path = shm_dir() / name
        fd = os.open(via or path, os.O_RDWR)
        keep = via is not None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ShmError(f"{path}: {size} bytes, shorter than its header")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        if not keep:
            os.close(fd)
        try:
            header = Header.unpack(bytes(mm[:FIELDS.size]))
            if header.magic != MAGIC or header.version != VERSION:
                raise ShmError(f"{path}: not a version {VERSION} cupyglm segment")
            if HEADER_SIZE + header.payload_bytes != size:
                raise ShmError(f"{path}: {size} bytes, its header says {HEADER_SIZE + header.payload_bytes}")
            if fingerprint_hash is not None and header.fingerprint_hash != fingerprint_hash:
                raise ShmError(f"{path}: made for fingerprint {header.fingerprint_hash[:12]}, "
                               f"this rank's is {fingerprint_hash[:12]}")
        except BaseException:
            mm.close()
            if keep:
                os.close(fd)
            raise
        seg = cls(name, path, mm, header)
        if keep:
            seg.fd = fd
        return seg

    def count_mapping(self) -> bool:
        """Record this rank's mapping; the rank that completes the count unlinks the file (when it still has its
        name). True if it did. With a held descriptor (open_local) the count is kept under it, name or not."""
        held = self.fd >= 0
        try:
            fd = self.fd if held else os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise ShmError(f"{self.path} was unlinked before every rank mapped it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                mapped = self.mapped() + 1
                struct.pack_into("<I", self._mm, MAPPED_OFFSET, mapped)
                if mapped >= self.header.local_size and not held:
                    os.unlink(self.path)
                    self.unlinked_here = True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if not held:
                os.close(fd)
        return self.unlinked_here

    def remove_name(self) -> bool:
        """Unlink the file if it still has its name; True if this call did."""
        try:
            os.unlink(self.path)
            return True
        except FileNotFoundError:
            return False


def open_local(token: str, purpose: str, nbytes: int, *, local_rank: int, local_size: int,
               local_comm: Any = None, fingerprint_hash: str = "",
               before_map: Callable[[int, str], None] | None = None) -> SharedSegment:
    """The collective protocol on one host (module docstring): local rank 0 creates, holds and unlinks; every
    other local rank maps the held file through /proc and counts; all check the count after the barrier.

    `local_comm` is the node-local mpi4py communicator (None when local_size is 1). Every local rank calls this;
    all raise ShmError if any fails. The name is gone before any rank waits on another. `before_map(local rank,
    segment name)`, an observer (tests), runs on every rank once the file is made and before the rank maps it.
    """
    seg = None
    error, via = "", ""
    if local_rank == 0:
        try:
            sweep_stale()
            seg = SharedSegment.create(token, purpose, nbytes, local_size=local_size,
                                       fingerprint_hash=fingerprint_hash)
            via = seg.hold()
            seg.unlinked_here = seg.remove_name()
        except Exception as e:  # noqa: BLE001 - reported to every local rank
            error = f"local rank 0 could not create {segment_name(token, purpose)}: {type(e).__name__}: {e}"
            if seg is not None:
                seg.remove_name()
                seg.close()
                seg = None
    if local_comm is not None:
        error, via = local_comm.bcast((error, via), root=0)
    if error:
        raise ShmError(error)
    if before_map is not None:
        before_map(local_rank, segment_name(token, purpose))
    try:
        if seg is None:
            seg = SharedSegment.attach(token, purpose, fingerprint_hash=fingerprint_hash, via=via)
        seg.count_mapping()
        mine = ""
    except Exception as e:  # noqa: BLE001
        mine = f"local rank {local_rank} could not map {segment_name(token, purpose)}: {type(e).__name__}: {e}"
    errors = local_comm.allgather(mine) if local_comm is not None else [mine]
    failed = [m for m in errors if m]
    if not failed and seg.mapped() != local_size:
        failed = [f"{seg.name}: {seg.mapped()} mappings counted, the host has {local_size} ranks"]
    if failed:
        if seg is not None:
            seg.close()
        raise ShmError(failed[0])
    if local_comm is not None:
        local_comm.Barrier()                 # every rank's mapping and count are done before a descriptor closes
        seg.barrier = local_comm.Barrier
    if seg.fd >= 0:
        os.close(seg.fd)
        seg.fd = -1
    return seg


def sweep_stale() -> None:
    """Remove this host's segments whose creator is gone (a creator killed between creating and unlinking)."""
    for v in stale_segments():
        if v.stale:
            with contextlib.suppress(OSError):
                os.unlink(v.path)


# ---- cleanup ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Verdict:
    path: Path
    stale: bool
    reason: str
    nbytes: int


def judge(path: Path, *, min_age_s: float = 60.0, now: float | None = None) -> Verdict:
    """Whether a `cupyglm-*` file is stale: its creator is gone, or it was left half-made over min_age_s ago."""
    now = time.time() if now is None else now
    try:
        st = path.stat()
    except FileNotFoundError:
        return Verdict(path, False, "gone already", 0)
    try:
        h = read_header(path)
    except (ShmError, OSError) as e:
        age = now - st.st_mtime
        if age >= min_age_s:
            return Verdict(path, True, f"{e}; {age:.0f} s old", st.st_size)
        return Verdict(path, False, f"{e}; only {age:.0f} s old, may be being made", st.st_size)
    if h.host and h.host != socket.gethostname():
        return Verdict(path, False, f"made on host {h.host}, not judged here", st.st_size)
    if process_alive(h.creator_pid, h.creator_start):
        return Verdict(path, False, f"creator pid {h.creator_pid} alive", st.st_size)
    return Verdict(path, True, f"creator pid {h.creator_pid} gone, {h.mapped}/{h.local_size} ranks had mapped it",
                   st.st_size)


def stale_segments(directory: Path | None = None, *, min_age_s: float = 60.0) -> list[Verdict]:
    directory = shm_dir() if directory is None else directory
    try:
        names = sorted(p for p in directory.iterdir() if p.name.startswith(PREFIX))
    except FileNotFoundError:
        return []
    return [judge(p, min_age_s=min_age_s) for p in names]
