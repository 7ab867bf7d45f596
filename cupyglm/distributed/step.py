"""The lockstep message: what rank 0 broadcasts each step so every rank runs its shard of the same step.

Deltas only: a request's prompt and sampling parameters travel once, in the step that admits it; later steps
name it by its integer id. Stop strings stay on rank 0 (it alone detokenizes); stop token ids travel.
`cancelled` lists the requests every rank releases this step (cancelled, finished or refused).

Byte layout (little-endian, packed, no padding; VERSION is bumped on any change):

    header      magic 4s = b"CGST" | version u16 | flags u16 (bit 0: stop, shut down after this message;
                bit 1: a prompt-cache section follows the row groups; bit 2: a disk section follows that)
                | step u64 | n_new u32 | n_cancelled u32 | n_schedule u32                              28 bytes
    n_new x new request
                request_id u64 | n_prompt u32
                | sampling: temperature f64 | top_p f64 | top_k i32 | min_p f64 | seed u64
                            | max_tokens u32 | min_tokens u32 | sampling_flags u32 (bit 0: ignore_eos,
                            bit 1: seed given) | n_stop_ids u32                                        52 bytes
                | prompt token ids u32 x n_prompt | stop token ids u32 x n_stop_ids
    n_cancelled x request_id u64
    n_schedule x row group
                request_id u64 | start u32 (position of its first row: chunk start, or the decode position)
                | count u32 (rows this step) | flags u32 (engine-defined) | n_tokens u32
                | token ids u32 x n_tokens (tokens that not every rank knows yet, e.g. rank 0's sampled ones)
    prompt-cache section (flag bit 1 only)
                n_evict u32 | n_restore u32 | n_drop u32 | n_keep u32
                | n_evict x entry u64: drop kept entries before anything else of the step (room for its pages)
                | n_restore x (request_id u64 | entry u64 | length u32): fill a new request's state from a
                  kept entry before the step runs
                | n_drop x entry u64: drop kept entries after the step runs
                | n_keep x (request_id u64 | entry u64 | length u32): keep the request's state (at `length`)
                  under a new entry after the drops
    disk section (flag bit 2 only; cupyglm.engine.disk_tier applies it)
                n_spill u32 | n_load u32 | n_unlink u32 | ops u32 (bit 0: sync, every rank finishes its writes
                and the ranks agree; bit 1: clear, every rank deletes its state files)
                | n_spill x (entry u64 | salt 16s | key 16s): write a kept entry to disk before the drops
                | n_load x (entry u64 | length u32 | key 16s): read a state file into a new kept entry after the
                  drops, before the keeps (the ranks agree on the reads)
                | n_unlink x key 16s: delete a state file (after the queued writes)

The message must end exactly after the last row group (or the prompt-cache or disk section). `decode` refuses a wrong magic or version by name.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

import numpy as np

MAGIC = b"CGST"
VERSION = 4

_HEADER = struct.Struct("<4sHHQIII")
_REQUEST = struct.Struct("<QI")
_SAMPLING = struct.Struct("<ddidQIIII")
_CANCEL = struct.Struct("<Q")
_ENTRY = struct.Struct("<QIIII")
_CACHE = struct.Struct("<IIII")
_KEPT = struct.Struct("<QQI")
_DISK = struct.Struct("<IIII")
_SPILL = struct.Struct("<Q16s16s")
_LOAD = struct.Struct("<QI16s")
_KEY = struct.Struct("<16s")

FLAG_STOP = 1
FLAG_CACHE = 2
FLAG_DISK = 4
DISK_SYNC = 1
DISK_CLEAR = 2
SAMPLING_IGNORE_EOS = 1
SAMPLING_HAS_SEED = 2


class StepFormatError(ValueError):
    """A step message this rank cannot read."""


class StepVersionError(StepFormatError):
    """A step message of another layout version (the ranks run different builds)."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    """A request's sampling parameters as the step message carries them (stop strings stay on rank 0)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                        # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class NewRequest:
    request_id: int
    prompt: tuple[int, ...]
    sampling: Sampling = Sampling()


@dataclasses.dataclass(frozen=True)
class ScheduleEntry:
    """One row group of the step: `count` rows of request `request_id` starting at position `start`."""

    request_id: int
    start: int
    count: int
    tokens: tuple[int, ...] = ()
    flags: int = 0


@dataclasses.dataclass(frozen=True)
class DiskOps:
    """The disk section: salts and keys are 16-byte digests (cupyglm.kv.disk_file)."""

    spills: tuple[tuple[int, bytes, bytes], ...] = ()   # (entry, salt, key)
    loads: tuple[tuple[int, int, bytes], ...] = ()      # (entry, length, key)
    unlinks: tuple[bytes, ...] = ()
    ops: int = 0                                         # DISK_SYNC | DISK_CLEAR

    @property
    def empty(self) -> bool:
        return not (self.spills or self.loads or self.unlinks or self.ops)


@dataclasses.dataclass(frozen=True)
class StepMessage:
    step: int = 0
    new: tuple[NewRequest, ...] = ()
    cancelled: tuple[int, ...] = ()
    schedule: tuple[ScheduleEntry, ...] = ()
    stop: bool = False
    restores: tuple[tuple[int, int, int], ...] = ()    # (request_id, entry, length)
    drops: tuple[int, ...] = ()                         # entries
    keeps: tuple[tuple[int, int, int], ...] = ()       # (request_id, entry, length)
    evicts: tuple[int, ...] = ()                        # entries dropped before the step's restores and leases
    disk: DiskOps | None = None

    @property
    def has_cache(self) -> bool:
        return bool(self.evicts or self.restores or self.drops or self.keeps)


def _ids(values: Sequence[int], what: str) -> bytes:
    try:
        arr = np.asarray(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"step message: {what} holds a value that is not a token id") from None
    if arr.ndim != 1:
        raise ValueError(f"step message: {what} must be a flat list of token ids")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError(f"step message: {what} holds a token id outside 0..2**32-1")
    return arr.astype("<u4").tobytes()


def encode(msg: StepMessage) -> bytes:
    """The bytes of `msg` (layout in the module docstring)."""
    out = bytearray()
    try:
        disk = msg.disk is not None and not msg.disk.empty
        flags = (FLAG_STOP if msg.stop else 0) | (FLAG_CACHE if msg.has_cache else 0) | (FLAG_DISK if disk else 0)
        out += _HEADER.pack(MAGIC, VERSION, flags, msg.step, len(msg.new),
                            len(msg.cancelled), len(msg.schedule))
        for req in msg.new:
            s = req.sampling
            flags = (SAMPLING_IGNORE_EOS if s.ignore_eos else 0) | (SAMPLING_HAS_SEED if s.seed is not None else 0)
            out += _REQUEST.pack(req.request_id, len(req.prompt))
            out += _SAMPLING.pack(float(s.temperature), float(s.top_p), s.top_k, float(s.min_p),
                                  0 if s.seed is None else s.seed, s.max_tokens, s.min_tokens, flags,
                                  len(s.stop_token_ids))
            out += _ids(req.prompt, f"request {req.request_id}'s prompt")
            out += _ids(s.stop_token_ids, f"request {req.request_id}'s stop_token_ids")
        for rid in msg.cancelled:
            out += _CANCEL.pack(rid)
        for e in msg.schedule:
            out += _ENTRY.pack(e.request_id, e.start, e.count, e.flags, len(e.tokens))
            out += _ids(e.tokens, f"request {e.request_id}'s scheduled tokens")
        if msg.has_cache:
            out += _CACHE.pack(len(msg.evicts), len(msg.restores), len(msg.drops), len(msg.keeps))
            out += b"".join(_CANCEL.pack(d) for d in msg.evicts)
            out += b"".join(_KEPT.pack(*r) for r in msg.restores)
            out += b"".join(_CANCEL.pack(d) for d in msg.drops)
            out += b"".join(_KEPT.pack(*k) for k in msg.keeps)
        if disk:
            d = msg.disk
            out += _DISK.pack(len(d.spills), len(d.loads), len(d.unlinks), d.ops)
            out += b"".join(_SPILL.pack(*x) for x in d.spills)
            out += b"".join(_LOAD.pack(*x) for x in d.loads)
            out += b"".join(_KEY.pack(k) for k in d.unlinks)
    except struct.error as err:
        raise ValueError(f"step message: a value does not fit its field ({err})") from None
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def take(self, st: struct.Struct, what: str) -> tuple:
        end = self.pos + st.size
        if end > len(self.data):
            raise StepFormatError(f"step message truncated in {what} (byte {self.pos} of {len(self.data)})")
        values = st.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def ids(self, n: int, what: str) -> tuple[int, ...]:
        end = self.pos + 4 * n
        if end > len(self.data):
            raise StepFormatError(f"step message truncated in {what} (byte {self.pos} of {len(self.data)})")
        arr = np.frombuffer(self.data[self.pos:end], dtype="<u4")
        self.pos = end
        return tuple(arr.tolist())


def decode(data: bytes) -> StepMessage:
    """The StepMessage in `data`; StepVersionError / StepFormatError name what is wrong."""
    if len(data) < 6:
        raise StepFormatError(f"step message too short ({len(data)} bytes)")
    magic = bytes(data[:4])
    if magic != MAGIC:
        raise StepFormatError(f"not a cupyglm step message (magic {magic!r}, expected {MAGIC!r})")
    (version,) = struct.unpack_from("<H", data, 4)
    if version != VERSION:
        raise StepVersionError(f"step message version {version} from rank 0 differs from this rank's version "
                               f"{VERSION} (the ranks run different cupyglm builds)")
    r = _Reader(data)
    _, _, flags, step, n_new, n_cancel, n_sched = r.take(_HEADER, "the header")
    if flags & ~(FLAG_STOP | FLAG_CACHE | FLAG_DISK):
        raise StepFormatError(f"step message has unknown flags {flags:#x}")
    new = []
    for _ in range(n_new):
        rid, n_prompt = r.take(_REQUEST, "a new request")
        t, p, k, mp, seed, mx, mn, sflags, n_stop = r.take(_SAMPLING, f"request {rid}'s sampling")
        prompt = r.ids(n_prompt, f"request {rid}'s prompt")
        stop_ids = r.ids(n_stop, f"request {rid}'s stop_token_ids")
        sampling = Sampling(temperature=t, top_p=p, top_k=k, min_p=mp,
                            seed=seed if sflags & SAMPLING_HAS_SEED else None, max_tokens=mx, min_tokens=mn,
                            ignore_eos=bool(sflags & SAMPLING_IGNORE_EOS), stop_token_ids=stop_ids)
        new.append(NewRequest(rid, prompt, sampling))
    cancelled = tuple(r.take(_CANCEL, "the cancelled ids")[0] for _ in range(n_cancel))
    schedule = []
    for _ in range(n_sched):
        rid, start, count, eflags, n_tok = r.take(_ENTRY, "a row group")
        schedule.append(ScheduleEntry(rid, start, count, r.ids(n_tok, f"request {rid}'s scheduled tokens"), eflags))
    evicts, restores, drops, keeps = (), (), (), ()
    if flags & FLAG_CACHE:
        n_evict, n_res, n_drop, n_keep = r.take(_CACHE, "the prompt-cache section")
        evicts = tuple(r.take(_CANCEL, "an evict")[0] for _ in range(n_evict))
        restores = tuple(r.take(_KEPT, "a restore") for _ in range(n_res))
        drops = tuple(r.take(_CANCEL, "a drop")[0] for _ in range(n_drop))
        keeps = tuple(r.take(_KEPT, "a keep") for _ in range(n_keep))
    disk = None
    if flags & FLAG_DISK:
        n_spill, n_load, n_unlink, ops = r.take(_DISK, "the disk section")
        disk = DiskOps(tuple(r.take(_SPILL, "a spill") for _ in range(n_spill)),
                       tuple(r.take(_LOAD, "a load") for _ in range(n_load)),
                       tuple(r.take(_KEY, "an unlink")[0] for _ in range(n_unlink)), ops)
    if r.pos != len(data):
        raise StepFormatError(f"step message has {len(data) - r.pos} trailing bytes")
    return StepMessage(step=step, new=tuple(new), cancelled=cancelled, schedule=tuple(schedule),
                       stop=bool(flags & FLAG_STOP), restores=restores, drops=drops, keeps=keeps,
                       evicts=evicts, disk=disk)


class Mirror:
    """The requests every rank knows, kept in step by applying each message; refuses messages that break the deltas."""

    def __init__(self) -> None:
        self.requests: dict[int, NewRequest] = {}
        self.step = -1

    def apply(self, msg: StepMessage) -> None:
        if msg.step <= self.step:
            raise StepFormatError(f"step {msg.step} after step {self.step}: the ranks are out of step")
        for req in msg.new:
            if req.request_id in self.requests:
                raise StepFormatError(f"step {msg.step}: request {req.request_id} admitted twice")
        known = set(self.requests) | {req.request_id for req in msg.new}
        for rid in msg.cancelled:
            if rid not in known:
                raise StepFormatError(f"step {msg.step}: cancels unknown request {rid}")
        for e in msg.schedule:
            if e.request_id not in known or e.request_id in msg.cancelled:
                raise StepFormatError(f"step {msg.step}: schedules unknown request {e.request_id}")
        self.step = msg.step
        for req in msg.new:
            self.requests[req.request_id] = req
        for rid in msg.cancelled:
            self.requests.pop(rid, None)
