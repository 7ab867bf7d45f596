"""The file of one rank's shard of one kept prompt state on disk: a versioned header, then the body.

Byte layout (little-endian; VERSION is bumped on any change):

    prefix      magic 8s = b"CGKVDISK" | version u16 | reserved u16 | meta_len u32 | body_len u64
                | meta_crc u32 | body_crc u32                                                          32 bytes
    meta        meta_len bytes of UTF-8 JSON: {"fingerprint": {...}, "salt": hex, "tokens": [ids...],
                "layout": [[part name, bytes], ...]}
    body        body_len bytes: the kept bytes of the state's parts, back to back in layout order

The fingerprint names every setting that changes a state's bytes (`state_fingerprint`); the checksums are
zlib.crc32 (stdlib, hardware-assisted where zlib is). A file is restored only when its version is this build's,
its fingerprint equals the running rank's, its size is exactly prefix + meta + body and both checksums match.
Files are written atomically: a temp file `.tmp-<name>-<pid>` in the same directory, fsync, rename, fsync of
the directory, so a reader never sees a torn file under a state's name.

Only regular files are state files: `is_regular` (lstat, no link followed) picks them when the directory is
listed, and every read opens with O_NONBLOCK | O_NOFOLLOW and checks the opened file is regular, so a directory,
FIFO, socket, device or symlink under a state's name is never read, never blocks an open, never stops a start.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cupyglm.checkpoint.quant import HF_QUANT_FILE

MAGIC = b"CGKVDISK"
VERSION = 1
SUFFIX = ".cgkv"
TMP_PREFIX = ".tmp-"
_PREFIX = struct.Struct("<8sHHIQII")
PREFIX_BYTES = _PREFIX.size

# Refusal reasons (the log line and the metric label name one of these).
FINGERPRINT = "fingerprint"
CHECKSUM = "checksum"
TRUNCATED = "truncated"
NEWER = "newer header version"
UNREADABLE = "unreadable"
CORRUPT = (CHECKSUM, TRUNCATED, UNREADABLE)          # deleted when found; the others belong to other builds


class StateRefused(Exception):
    """A state file this rank must not restore; `reason` is one of the names above."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail

    @property
    def corrupt(self) -> bool:
        return self.reason in CORRUPT


@dataclasses.dataclass(frozen=True)
class Header:
    fingerprint: dict
    salt: str                            # hex digest of the cache_salt the state was kept under
    tokens: tuple[int, ...]              # the prefix the state holds
    layout: tuple[tuple[str, int], ...]  # (part name, kept bytes) in body order
    body_len: int
    body_crc: int
    meta_len: int

    @property
    def body_offset(self) -> int:
        return PREFIX_BYTES + self.meta_len

    @property
    def file_bytes(self) -> int:
        return self.body_offset + self.body_len


def salt_digest(salt: str) -> str:
    return hashlib.blake2b(salt.encode(), digest_size=16).hexdigest()


def state_key(salt_hex: str, tokens) -> str:
    """The name part of a state: a digest of its salt and token ids (hex, 32 characters)."""
    h = hashlib.blake2b(bytes.fromhex(salt_hex), digest_size=16)
    h.update(np.asarray(tokens, dtype="<u4").tobytes())
    return h.hexdigest()


def fingerprint_tag(fp: dict) -> str:
    """A short digest of a state fingerprint, in file names (files of different settings never collide)."""
    return hashlib.blake2b(json.dumps(fp, sort_keys=True).encode(), digest_size=6).hexdigest()


def file_name(fp: dict, key: str, rank: int) -> str:
    return f"{fingerprint_tag(fp)}-{key}-r{rank}{SUFFIX}"


def checkpoint_identity(path: str | Path, builtin: bool = False) -> str:
    """SHA-256 over config.json, hf_quant_config.json where present, each safetensors file's name, size and header
    (shapes, dtypes, offsets), and for the built-in tiny checkpoint its directory name (generator version and
    seed); weights rewritten in place under identical headers are not told apart (reading every weight byte at
    startup would be)."""
    root = Path(path)
    h = hashlib.sha256((root / "config.json").read_bytes())
    if (root / HF_QUANT_FILE).is_file():
        h.update(f"\0{HF_QUANT_FILE}\0".encode() + (root / HF_QUANT_FILE).read_bytes())
    for f in sorted(root.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            h.update(f"{f.name}:{os.fstat(fh.fileno()).st_size}:".encode())
            h.update(fh.read(n))
    if builtin:
        h.update(root.name.encode())
    return h.hexdigest()


def state_fingerprint(*, model: str, backend: str, arithmetic: str, tp: int, rank: int, page_tokens: int,
                      kv_cache: str, storage: str, mtp: bool) -> dict:
    """Every setting that changes the bytes of a rank's kept state (or how they are read back); `arithmetic`
    (backend/arithmetic.identity) refuses a state computed under other reduction orders or another tensor core."""
    return {"model": model, "backend": backend, "arithmetic": arithmetic, "tp": tp, "rank": rank,
            "page_tokens": page_tokens, "kv_cache": kv_cache, "storage": storage, "mtp": bool(mtp)}


def _differs(have: dict, want: dict) -> str:
    keys = [k for k in list(want) + list(have) if have.get(k) != want.get(k)]
    k = keys[0]
    return f"{k} {have.get(k)!r}, this server {want.get(k)!r}"


def write_state(directory: Path, name: str, fp: dict, salt_hex: str, tokens, layout, body: np.ndarray,
                pause: Callable[[], None] | None = None) -> int:
    """Write one state file atomically; returns its bytes. `pause` runs half way through the body (test hook)."""
    body = np.ascontiguousarray(body).view(np.uint8).reshape(-1)
    if sum(n for _, n in layout) != body.size:
        raise ValueError(f"the layout covers {sum(n for _, n in layout)} bytes, the body holds {body.size}")
    meta = json.dumps({"fingerprint": fp, "salt": salt_hex, "tokens": [int(t) for t in tokens],
                       "layout": [[str(a), int(n)] for a, n in layout]}, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, 0, len(meta), body.size, zlib.crc32(meta), zlib.crc32(body))
    final = directory / name
    tmp = directory / f"{TMP_PREFIX}{name}-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(body)
        half = body.size // 2
        os.write(fd, prefix + meta)
        _write_all(fd, view[:half])
        if pause is not None:
            pause()
        _write_all(fd, view[half:])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.rename(tmp, final)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return PREFIX_BYTES + len(meta) + body.size


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        n = os.write(fd, view)
        view = view[n:]


def is_regular(path: Path) -> bool:
    """A regular file itself (not through a link); False when it is anything else or gone."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _open_regular(path: Path):
    """`path` opened for reading, never blocking (a FIFO) and never through a link; OSError when it is not a
    regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_header(path: Path, want: dict) -> Header:
    """The header of `path`, checked against the running rank's fingerprint `want` (the body is not read)."""
    try:
        with _open_regular(path) as f:
            head = f.read(PREFIX_BYTES)
            if len(head) < PREFIX_BYTES:
                raise StateRefused(TRUNCATED, f"{len(head)} bytes, the header prefix alone is {PREFIX_BYTES}")
            magic, version, _, meta_len, body_len, meta_crc, body_crc = _PREFIX.unpack(head)
            if magic != MAGIC:
                raise StateRefused(UNREADABLE, f"magic {magic!r}, expected {MAGIC!r}")
            if version > VERSION:
                raise StateRefused(NEWER, f"header version {version}, this build reads {VERSION}")
            if version != VERSION:
                raise StateRefused(UNREADABLE, f"header version {version}, this build reads {VERSION}")
            meta = f.read(meta_len)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise StateRefused(UNREADABLE, e.strerror or str(e)) from None
    if len(meta) < meta_len or size < PREFIX_BYTES + meta_len + body_len:
        raise StateRefused(TRUNCATED, f"{size} bytes, the header says {PREFIX_BYTES + meta_len + body_len}")
    if size > PREFIX_BYTES + meta_len + body_len:
        raise StateRefused(UNREADABLE, f"{size} bytes, the header says {PREFIX_BYTES + meta_len + body_len}")
    if zlib.crc32(meta) != meta_crc:
        raise StateRefused(CHECKSUM, "the header's checksum does not match")
    try:
        m = json.loads(meta)
        h = Header(dict(m["fingerprint"]), str(m["salt"]), tuple(int(t) for t in m["tokens"]),
                   tuple((str(a), int(n)) for a, n in m["layout"]), body_len, body_crc, meta_len)
    except (ValueError, KeyError, TypeError) as e:
        raise StateRefused(UNREADABLE, f"header JSON: {e}") from None
    if h.fingerprint != want:
        raise StateRefused(FINGERPRINT, _differs(h.fingerprint, want))
    if sum(n for _, n in h.layout) != body_len:
        raise StateRefused(UNREADABLE, "the layout does not cover the body")
    return h


def read_body(path: Path, header: Header, out: np.ndarray) -> None:
    """Read the body of `path` into `out` ([body_len] u8) and check its checksum; StateRefused names a failure."""
    if out.size != header.body_len:
        raise ValueError(f"the buffer holds {out.size} bytes, the body {header.body_len}")
    try:
        with _open_regular(path) as f:
            f.seek(header.body_offset)
            view, got = memoryview(out), 0
            while got < out.size:
                n = f.readinto(view[got:])
                if not n:
                    raise StateRefused(TRUNCATED, f"the body ends after {got} of {out.size} bytes")
                got += n
    except OSError as e:
        raise StateRefused(UNREADABLE, e.strerror or str(e)) from None
    if zlib.crc32(out) != header.body_crc:
        raise StateRefused(CHECKSUM, "the body's checksum does not match")
