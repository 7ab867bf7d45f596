"""Kept prompt states on disk, one rank's shard: the index of its files, the writer thread, spill and load.

Every copy goes through `cupyglm.kv.walk.each`: a spill walks a kept entry's arena pages into a host buffer
(a disk `Kept`: one buffer) that the writer thread then writes; a load reads a file into a host buffer and walks
it into the arena pages rank 0's step message names, after which the state is an ordinary kept entry (restored by the memory
cache's own walk). The arena side of both is the entry's kept pages, one fixed part per run of consecutive pages.

What must stay true: this rank takes or releases arena pages only where rank 0's step message says so and
every rank agreed (`cupyglm.engine.disk_tier`), so the kept pools stay identical on every rank; a failed write
or read changes nothing but this rank's files and the log.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import queue
import threading
import time
from pathlib import Path

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.kv import disk_file as df
from cupyglm.kv.copy_hooks import address_of
from cupyglm.kv.kept import KeptEntry, indexed_layers
from cupyglm.kv.walk import Kept, Part, each
from cupyglm.memory import BF16, kda_state_arrays

LOG = "prompt-cache disk"


def layout(cfg: ModelConfig, tp: int, storage, length: int, mtp: bool = False) -> list[tuple[str, int]]:
    """(part name, kept bytes) of a kept state at `length`, in the order `KeptStore.parts` walks them."""
    out = []
    for layer in cfg.kda_layers:
        out += [(a.name, a.nbytes(storage)) for a in kda_state_arrays(cfg, tp, layer)]
    bf = storage.itemsize(BF16)
    rows = length % cfg.index_kpool
    layers = indexed_layers(cfg, mtp)
    for layer in layers:
        tail = rows * cfg.index_head_dim * bf
        out += [(f"tail_ik.{layer}", tail), (f"tail_ig.{layer}", tail)]
    for layer in layers:
        out += [(f"latent.{layer}", length * cfg.kv_lora_rank * bf),
                (f"pooled.{layer}", (length // cfg.index_kpool) * cfg.index_head_dim * bf)]
    if mtp and length:
        out.append(("mtp_pending", cfg.hidden_size * bf))
    return out


@dataclasses.dataclass(frozen=True)
class DiskState:
    key: str
    path: Path
    header: df.Header


@dataclasses.dataclass
class DiskStats:
    hits: int = 0                        # states loaded from disk
    hit_tokens: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    files_written: int = 0
    refused: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class DiskStore:
    def __init__(self, directory: str | Path, fp: dict, kept, rank: int, tp: int, log, pause_s: float = 0.0):
        self.dir = Path(directory)
        self.fp, self.kept, self.rank, self.tp, self.log = fp, kept, rank, tp, log
        self.pause_s = pause_s
        self.states: dict[str, DiskState] = {}     # key -> a file valid at index time or written by this run
        self.tokens_of: dict[int, tuple[int, ...]] = {}   # kept entry -> the token ids it holds
        self.stats = DiskStats()
        self.failed: str | None = None             # why spilling stopped on this rank (None: it works)
        self._loaded: dict[int, np.ndarray] = {}   # entry -> body read this step, until the ranks agree
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name=f"cupyglm-disk-writer-{rank}", daemon=True)
        self._writer.start()

    # ---- startup: the index (headers only) ----------------------------------------------------------------------
    def index(self) -> list[DiskState]:
        """Clean torn temp files of dead writers, then read every header of this rank's files."""
        self.dir.mkdir(parents=True, exist_ok=True)
        suffix = f"-r{self.rank}{df.SUFFIX}"
        for p in sorted(self.dir.iterdir()):
            if (p.name.startswith(df.TMP_PREFIX) and suffix in p.name or p.name.endswith(suffix)) \
                    and not df.is_regular(p):
                self.log(f"{LOG}: rank {self.rank} skipped {p.name}: not a regular file")
                continue
            if p.name.startswith(df.TMP_PREFIX) and suffix in p.name:
                pid = p.name.rsplit("-", 1)[-1]
                if not (pid.isdigit() and _alive(int(pid))):
                    p.unlink(missing_ok=True)
                    self.log(f"{LOG}: removed the torn temp file {p.name} (its writer is gone)")
        for p in sorted(self.dir.glob(f"*{suffix}")):
            if not df.is_regular(p):
                continue                              # said above
            try:
                h = df.read_header(p, self.fp)
            except df.StateRefused as e:
                self.refuse(p, e)
                continue
            key = df.state_key(h.salt, h.tokens)
            if p.name != df.file_name(self.fp, key, self.rank):
                self.refuse(p, df.StateRefused(df.UNREADABLE, "its name does not match its tokens"))
                continue
            self.states[key] = DiskState(key, p, h)
        return list(self.states.values())

    def refuse(self, path: Path, e: df.StateRefused) -> None:
        self.stats.refused[e.reason] += 1
        gone = ""
        if e.corrupt and df.is_regular(path):
            path.unlink(missing_ok=True)
            gone = "; deleted"
        self.log(f"{LOG}: rank {self.rank} refused {path.name}: {e}{gone}")

    def forget_except(self, keys: set[str]) -> None:
        """Keep only the states every rank holds (the agreed index)."""
        self.states = {k: s for k, s in self.states.items() if k in keys}

    # ---- spill: arena -> host buffer (walk) -> writer thread ----------------------------------------------------
    def _arena_parts(self, entry: KeptEntry) -> list[Part]:
        """The entry's kept bytes in the arena: one fixed part per run of consecutive kept pages (rank 0 leases
        lowest id first, so a state is mostly one run: few pieces for the walk)."""
        pb, pages, out = self.kept.page_bytes, entry.kept.pages, []
        start = 0
        for j in range(1, len(pages) + 1):
            if j == len(pages) or pages[j] != pages[j - 1] + 1:
                n = min(entry.nbytes, j * pb) - start * pb
                out.append(Part(self.kept.base + pages[start] * pb, n))
                start = j
        return out

    def spill(self, entry_id: int, key: str, salt: str) -> None:
        """Copy a kept entry's bytes to a host buffer (before its pages go back) and queue the file write."""
        if self.failed is not None or key in self.states:
            return
        entry = self.kept.entries[entry_id]
        tokens = self.tokens_of[entry_id]
        body = np.empty(entry.nbytes, dtype=np.uint8)          # [state bytes] u8, host
        each(self._arena_parts(entry), Kept(address_of(body), size=body.size), self.kept.hook)
        _sync(self.kept.ops)                                   # the copy is done before another thread reads it
        lay = layout(self.kept.cfg, self.tp, self.kept.storage, entry.length, self.kept.mtp)
        self._queue.put(("write", key, salt, tokens, lay, body))

    def unlink(self, key: str) -> None:
        self._queue.put(("unlink", key))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item[0] == "write":
                    self._write(*item[1:])
                elif item[0] == "unlink":
                    with self._lock:
                        s = self.states.pop(item[1], None)
                    if s is not None:
                        s.path.unlink(missing_ok=True)
            except Exception as e:  # noqa: BLE001 - the writer must outlive any one file (flush waits on it)
                self._stop_spilling(f"{type(e).__name__}: {e}")
            finally:
                self._queue.task_done()

    def _write(self, key, salt, tokens, lay, body) -> None:
        if self.failed is not None:
            return
        name = df.file_name(self.fp, key, self.rank)
        pause = (lambda: time.sleep(self.pause_s)) if self.pause_s else None
        try:
            n = df.write_state(self.dir, name, self.fp, salt, tokens, lay, body, pause=pause)
            header = df.read_header(self.dir / name, self.fp)
        except (OSError, df.StateRefused) as e:
            self._stop_spilling(f"{getattr(e, 'strerror', None) or e} writing {name}")
            return
        with self._lock:
            self.states[key] = DiskState(key, self.dir / name, header)
        self.stats.bytes_written += n
        self.stats.files_written += 1

    def _stop_spilling(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            self.log(f"{LOG}: rank {self.rank}: {why}; spilling to disk stopped, serving continues")

    def flush(self) -> None:
        """Wait until every queued write and unlink is done."""
        self._queue.join()

    # ---- load: file -> host buffer, then (once every rank read its own) host buffer -> arena (walk) -------------
    def read(self, entry_id: int, key: str, length: int) -> bool:
        """Read and check this rank's file of `key`; True when it can be restored. Leases nothing."""
        s = self.states.get(key)
        if s is None:
            self.log(f"{LOG}: rank {self.rank} has no file for a state of {length} tokens")
            return False
        want = layout(self.kept.cfg, self.tp, self.kept.storage, length, self.kept.mtp)
        if s.header.layout != tuple(want) or len(s.header.tokens) != length:
            self._drop_bad(s, df.StateRefused(df.UNREADABLE, "its part layout differs from this server's"))
            return False
        body = np.empty(s.header.body_len, dtype=np.uint8)     # [state bytes] u8, host
        try:
            df.read_body(s.path, s.header, body)
        except df.StateRefused as e:
            self._drop_bad(s, e)
            return False
        self._loaded[entry_id] = body
        self.tokens_of[entry_id] = s.header.tokens
        return True

    def _drop_bad(self, s: DiskState, e: df.StateRefused) -> None:
        with self._lock:
            self.states.pop(s.key, None)
        self.refuse(s.path, e)

    def commit(self, entry_id: int, length: int, pages) -> None:
        """Every rank read its file: walk the body into the kept pages rank 0 named (a kept entry from now on);
        ValueError when they do not fit the body or are not free."""
        body = self._loaded.pop(entry_id)
        kept = self.kept
        entry = kept.take(entry_id, length, body.size, pages)
        each(self._arena_parts(entry), Kept(address_of(body), size=body.size), kept.hook, restore=True)
        _sync(kept.ops)                                       # the host buffer is freed after this
        self.stats.hits += 1
        self.stats.hit_tokens += length
        self.stats.bytes_read += body.size

    def discard(self, entry_id: int) -> None:
        """Another rank could not read its file: forget this rank's read."""
        self._loaded.pop(entry_id, None)
        self.tokens_of.pop(entry_id, None)

    def clear(self) -> int:
        """Delete every state file of this rank's fingerprint (after the queued writes); returns how many."""
        self.flush()
        n = 0
        for p in self.dir.glob(f"{df.fingerprint_tag(self.fp)}-*-r{self.rank}{df.SUFFIX}"):
            if df.is_regular(p):
                p.unlink(missing_ok=True)
                n += 1
        with self._lock:
            self.states.clear()
        return n


def _sync(ops) -> None:
    """Wait for the step stream's copies (cuda); CPU hooks copy at once."""
    if ops.xp is not np:
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _alive(pid: int) -> bool:
    """Whether the writer `pid` still runs; a zombie (killed, not yet reaped by its parent) has stopped writing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
                return False
    except (OSError, IndexError):
        pass
    return pid != os.getpid()
