"""The disk tier under the memory prompt cache: rank 0 decides, the step message's disk section carries it, and
every rank applies it to its own shard's files (`cupyglm.kv.disk_store`).

Rank 0 (`DiskPlanner`, pure CPU): an index of the states on disk (a radix tree per salt digest, LRU by bytes
within `--prompt-cache-disk-gib`). A state the memory cache evicts (unless a longer kept state supersedes it)
spills; a request whose longest prefix is on disk and longer than any in memory first loads it into a new
kept entry (one step), then resumes from that entry through the memory cache's own restore (the next step).

Lockstep: every rank learns the same spills, loads and unlinks from the message, in the same order. A load is
the one place a rank's disk can disagree with another's: every rank reads and checks its own file, then the
ranks all-gather one ok flag per load (`cupyglm.engine.ops.load`) and take the kept pages rank 0's memory tier
leased for it only when every rank read its file;
otherwise every rank drops its read and rank 0 serves the request fresh (miss reason "disk state unreadable").
At startup the ranks all-gather the keys of their valid files and keep only the keys every rank holds.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from cupyglm.engine.radix import RadixTree
from cupyglm.kv import disk_file as df

MISS_DISK = "disk state unreadable"
DISK_SYNC = 1          # every rank finishes its writes and the ranks agree (ops.sync)
DISK_CLEAR = 2         # every rank deletes its state files (ops.clear)


@dataclasses.dataclass(frozen=True)
class DiskOps:
    """A step's disk work as rank 0 plans it (ops.spill, unlink, clear, load, sync carry it); salts and keys are
    16-byte digests (cupyglm.kv.disk_file)."""

    spills: tuple[tuple[int, bytes, bytes], ...] = ()   # (entry, salt, key)
    loads: tuple[tuple[int, int, bytes], ...] = ()      # (entry, length, key)
    unlinks: tuple[bytes, ...] = ()
    ops: int = 0                                         # DISK_SYNC | DISK_CLEAR
    kept_pages: tuple[tuple[int, tuple[int, ...]], ...] = ()   # (entry, the kept pages it was leased) per load

    @property
    def empty(self) -> bool:
        return not (self.spills or self.loads or self.unlinks or self.ops)


@dataclasses.dataclass
class DiskEntry:
    key: str
    salt: str                          # salt digest (hex)
    tokens: tuple[int, ...]
    nbytes: int
    used: int


class DiskIndex:
    """Rank 0's view of the states on disk (those every rank holds)."""

    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.entries: dict[str, DiskEntry] = {}
        self.trees: dict[str, RadixTree] = {}
        self._ids: dict[int, str] = {}
        self._id_of: dict[str, int] = {}
        self._next_id = itertools.count(1)
        self._clock = 0
        self.held = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def longest(self, salt: str, prompt, limit: int) -> tuple[str | None, int]:
        tree = self.trees.get(salt)
        if tree is None:
            return None, 0
        vid, n = tree.longest(prompt, limit)
        return (None, 0) if vid is None else (self._ids[vid], n)

    def add(self, key: str, salt: str, tokens, nbytes: int) -> list[str]:
        """Index a state (newest); returns the keys evicted, least recently used first, to stay in the budget."""
        if key in self.entries:
            self.entries[key].used = self._tick()
            return []
        vid = next(self._next_id)
        self._ids[vid], self._id_of[key] = key, vid
        self.entries[key] = DiskEntry(key, salt, tuple(tokens), nbytes, self._tick())
        self.trees.setdefault(salt, RadixTree()).insert(tuple(tokens), vid)
        self.held += nbytes
        out = []
        while self.held > self.budget and self.entries:
            victim = min(self.entries.values(), key=lambda e: e.used)
            self.remove(victim.key)
            out.append(victim.key)
        return out

    def touch(self, key: str) -> None:
        if key in self.entries:
            self.entries[key].used = self._tick()

    def remove(self, key: str) -> None:
        e = self.entries.pop(key, None)
        if e is None:
            return
        self.trees[e.salt].remove(e.tokens)
        del self._ids[self._id_of.pop(key)]
        self.held -= e.nbytes


class DiskPlanner:
    """Rank 0's decisions for the disk tier, asked through `cupyglm.engine.prefix_store` while a step is planned;
    `cache` is the memory tier (`PromptCache`) a load keeps into and a spill reads from."""

    def __init__(self, index: DiskIndex, state_bytes, can_spill=lambda: True):
        self.index = index
        self.state_bytes = state_bytes          # length -> bytes of this rank's kept state
        self.can_spill = can_spill              # rank 0's own writer still works
        self.meta: dict[int, tuple[str, tuple[int, ...]]] = {}   # memory entry -> (salt digest, tokens)
        self.pending: dict[int, tuple[int, int, str, object]] = {}   # request -> (entry, length, key, request)
        self.ready: list[tuple[int, int, int]] = []              # (request, entry, length) loaded, to restore
        self._loads: list[tuple[int, int, bytes]] = []
        self._load_pages: list[tuple[int, tuple[int, ...]]] = []
        self._drops: list[int] = []
        self._unlinks: list[str] = []

    @property
    def protected(self) -> set[int]:
        return {p[0] for p in self.pending.values()} | {e for _, e, _ in self.ready}

    @property
    def busy(self) -> bool:
        """A load is in flight or not yet resumed."""
        return bool(self.pending or self.ready)

    def loading(self, request_id: int) -> bool:
        return request_id in self.pending

    def note_keep(self, eid: int, salt: str, tokens) -> None:
        self.meta[eid] = (df.salt_digest(salt), tuple(tokens))

    def plan_load(self, cache, r, memory_len: int, protect: set[int]) -> bool:
        """Load r's longest prefix from disk when it is longer than the memory cache's; True when planned."""
        salt = df.salt_digest(r.salt)
        key, length = self.index.longest(salt, r.key, len(r.key) - 1)
        if key is None or length <= memory_len:
            return False
        eid, drops = cache.plan_keep(r.salt, r.key[:length], protect | self.protected)
        if eid is None:
            return False
        self.index.touch(key)
        self.note_keep(eid, r.salt, r.key[:length])
        self.pending[r.id] = (eid, length, key, r)
        self._drops += drops
        self._loads.append((eid, length, bytes.fromhex(key)))
        self._load_pages.append((eid, cache.ids_of(eid)))
        return True

    def take_ready(self) -> list[tuple[int, int, int]]:
        """(request, entry, length) of the loads every rank completed, to restore now; taken once."""
        ready, self.ready = self.ready, []
        return ready

    def step_ops(self, cache, drops: tuple[int, ...], evicted_from: int) -> tuple[tuple[int, ...], DiskOps]:
        """This step's drops (the loads' evictions first) and disk section: spill every evicted entry that no
        longer kept state supersedes."""
        why = {eid: w for eid, _, _, w in cache.evicted[evicted_from:]}
        drops = tuple(self._drops) + drops
        spills = [self._spill(eid) for eid in drops if why.get(eid) != "superseded" and eid in self.meta]
        for eid in drops:
            self.meta.pop(eid, None)
        ops = self._ops([s for s in spills if s is not None])
        self._drops = []
        return drops, ops

    def _spill(self, eid: int):
        salt, tokens = self.meta[eid]
        if not self.can_spill():
            return None
        key = df.state_key(salt, tokens)
        if key in self.index.entries:
            self.index.touch(key)
            return None
        self._unlinks += self.index.add(key, salt, tokens, self.state_bytes(len(tokens)))
        return eid, bytes.fromhex(salt), bytes.fromhex(key)

    def _ops(self, spills, flags: int = 0) -> DiskOps:
        ops = DiskOps(tuple(spills), tuple(self._loads), tuple(bytes.fromhex(k) for k in self._unlinks), flags,
                      tuple(self._load_pages))
        self._loads, self._unlinks, self._load_pages = [], [], []
        return ops

    def resolved(self, results: dict[int, bool]) -> list[int]:
        """The ranks' agreed outcome of this step's loads (entry -> every rank read its file); returns the
        entries of the failed loads, which no rank holds (the memory tier forgets them)."""
        failed = []
        for rid, (eid, length, key, r) in list(self.pending.items()):
            if eid not in results:
                continue
            del self.pending[rid]
            if results[eid]:
                self.ready.append((rid, eid, length))
                continue
            r.miss_reason = MISS_DISK
            self.index.remove(key)
            self._unlinks.append(key)
            self.meta.pop(eid, None)
            failed.append(eid)
        return failed

    def save_ops(self, cache, flags: int = DISK_SYNC) -> DiskOps:
        """Spill every memory state that no longer kept state supersedes (a save, or the stop)."""
        spills = []
        for e in cache.entries.values():
            if e.entry_id in self.meta and not cache.trees[e.salt].has_longer(e.tokens):
                s = self._spill(e.entry_id)
                if s is not None:
                    spills.append(s)
        return self._ops(spills, flags)

    def clear_ops(self) -> DiskOps:
        """Forget every state on disk; the section that has every rank delete its files."""
        self.meta.clear()
        self._unlinks.clear()
        for key in list(self.index.entries):
            self.index.remove(key)
        return DiskOps(ops=DISK_CLEAR | DISK_SYNC)


# ---- every rank -------------------------------------------------------------------------------------------------

def agree(comm, flags: np.ndarray) -> np.ndarray:
    """The element-wise minimum of every rank's flags (an all-gather on the host communicator)."""
    if comm is None or getattr(comm, "size", 1) == 1:
        return flags
    return comm.allgather(flags).min(axis=0)


def agree_index(disk, comm) -> set[str]:
    """Startup, every rank: the keys of the states every rank holds a valid file for; the rest are set aside."""
    mine = sorted(disk.states)
    raw = np.frombuffer(b"".join(bytes.fromhex(k) for k in mine), dtype=np.uint8).reshape(-1, 16)
    if comm is None or getattr(comm, "size", 1) == 1:
        common = set(mine)
    else:
        counts = comm.allgather(np.array([len(mine)], dtype=np.int64)).reshape(-1)
        padded = np.zeros((int(counts.max()), 16), dtype=np.uint8)
        padded[:len(mine)] = raw
        every = comm.allgather(padded)
        sets = [{bytes(row).hex() for row in every[i][:int(counts[i])]} for i in range(len(counts))]
        common = set.intersection(*sets)
    disk.forget_except(common)
    return common


def planner_from(disk, budget_bytes: int, state_bytes) -> DiskPlanner:
    """Rank 0: the index of the agreed states, oldest file first (LRU); over-budget ones are unlinked first."""
    index = DiskIndex(budget_bytes)
    planner = DiskPlanner(index, state_bytes, can_spill=lambda: disk.failed is None)
    for s in sorted(disk.states.values(), key=lambda s: s.path.stat().st_mtime_ns):
        planner._unlinks += index.add(s.key, s.header.salt, s.header.tokens, s.header.body_len)
    return planner


# ---- rank 0: the admin messages (POST /v1/cache/save and /v1/cache/clear) ---------------------------------------

def admin_result(msg, results: dict[int, bool]) -> dict:
    """The reply of an admin message (`msg`: its StepPlan) from the ranks' agreed disk results."""
    out = {"memory_states_dropped": len(msg.drops)}
    if msg.disk is not None:
        out["states_written"] = len(msg.disk.spills)
        out["disk_ok"] = results.get(-1, True)
        out["disk_cleared"] = bool(msg.disk.ops & DISK_CLEAR)
    return out
