"""KV rows in host memory (CUPYGLM_KV_HOST=1): every KV layer's latent rows on host pages, and the gather
that brings a call's picked rows into device slots (op kv_gather, cuda_src/gather.cu).

cuda: the host rows are pinned host memory mapped into the device (`cudaHostAlloc` with
`cudaHostAllocMapped`), used through their device pointer, so the KV write, the gather and the kept-state copies
reach them like device memory; the flag words are mapped the same way, so the host reads them after the step's
synchronize without a copy. CPU backends: a separate host allocation through the same code.

Row cache: a segment of at most CACHED_ROWS rows (decode, verify) gathers through its layer's cache of
C direct-mapped entries that holds the rows of its recent segments (row r may only sit in entry r % C; a
segment's misses take their entries, hits stay);
only rows it lacks cross the bus. A cached row always holds its host row's bytes: the cache is forgotten
whenever a page changes hands (the pool's generation moves), and the rows every call writes leave its layer's
cache before its gather (a rejected draft's rows, rewritten by the next call, never hit).

What bounds a gather's distinct rows (checked: a gather past its slots raises its flag word, and the engine
refuses the request by name after the step): a gather covers one call segment, i.e. one sequence's rows
start..start+n-1; every id it lists is a position below start + n, one host row each, so it needs at most
start + n <= the window (`context`) slots, and the plan sizes the slots to the window. A test's observer
(engine.build.Observers.kv_host_slots) makes the slots fewer.

Shared rows (CUPYGLM_KV_HOST_SHARED=1, one /dev/shm copy per host): every rank of the host writes every row, and
the bytes are identical (kv_a and its norm are replicated, dsa.py), so a row written twice holds one value. Why
no rank reads a page that another rank has already reused, even when a page is released and leased again within
one step (every rank releases the cancelled requests' pages at the start of step N and leases them to step N's
rows, engine.py): a page's old owner reads it last in step N - 1 or earlier, so the hazard is a rank writing the
page in step N while another rank still runs step N - 1. The model's writes in step N come after step N's first
all-reduce (the first layers are KDA layers, each ending in one; the embedding is replicated), and no rank
passes that all-reduce before every rank has finished step N - 1, its kept-state copies included; on cuda the
all-reduce runs in stream order after step N - 1's kernels. The only writes before that all-reduce are kept
states restored into pages and MTP drafts proposed for verify groups: a step with either first passes
`fence()`, a barrier of the host's ranks after each has synchronized its device. Every rank decides the fence
from the step message alone, so all of them take it or none. A WriteHash observer (a test's, through the
constructor) makes each rank print a digest of the rows it wrote in each step, so the ranks' rows can be compared.
"""
from __future__ import annotations

import ctypes
import hashlib
import os

import numpy as np

from cupyglm.config import ModelConfig
from cupyglm.kv.copy_hooks import PinnedArena
from cupyglm.memory import ArraySpec, gather_arrays, host_latent_arrays, row_cache_rows, storage_of

CUDA_HOST_REGISTER_MAPPED = 2          # cudaHostRegisterMapped
FLAG_WORDS = 1024                      # segments one call may hold (a flag word each)
CACHED_ROWS = 16                       # segments of at most this many rows gather through the row cache
_NAN_BITS = 0x7FC0                     # bf16 quiet NaN as stored on cuda


def slots_message(slots: int) -> str:
    return f"kv host: a call picked more distinct rows than the gather's {slots} slots"


class KVHostSlots(RuntimeError):
    """A call segment needed more distinct rows than the gather has slots."""


def _mapped(shape, dtype, fill):
    """(a cupy array over mapped pinned host memory, a numpy view of the same bytes)."""
    import cupy

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    pin = PinnedArena(max(1, nbytes))
    host = np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(pin.host))[:nbytes]
    host = host.view(dtype).reshape(shape)
    host[...] = fill
    mem = cupy.cuda.UnownedMemory(pin.device, max(1, nbytes), pin)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(mem, 0)), host


def _layer(spec: ArraySpec) -> int:
    return int(spec.name.rsplit(".", 1)[1])


def shared_latent(shared, specs, storage, poison: bool, cpu: bool):
    """CUPYGLM_KV_HOST_SHARED=1: every layer's host rows in one /dev/shm segment that the ranks of this host
    map (`shared(nbytes)` is World.shared_segment: its name is gone once it is made, distributed/shm.py). Every rank
    writes the same (bit-identical) rows; the module docstring says why no rank reads a page another reused."""
    sizes = [s.nbytes(storage) for s in specs]
    seg = shared(sum(sizes))
    out, at = {}, 0
    for spec, n in zip(specs, sizes):
        view = seg.array(storage.dtype(spec.kind), spec.shape, offset=at)    # [rows, R] bf16 in the segment
        if poison and seg.header.creator_pid == os.getpid():            # the host's first rank fills it
            view[...] = _NAN_BITS if view.dtype.kind in "iu" else np.nan
        out[_layer(spec)] = view if cpu else _registered(view)
        at += n
    return seg, out


def _registered(view: np.ndarray):
    """A host view registered as mapped pinned memory (`cudaHostRegister`), as a cupy array on its device pointer."""
    import cupy

    rt = cupy.cuda.runtime
    ptr = int(view.ctypes.data)
    rt.hostRegister(ptr, view.nbytes, CUDA_HOST_REGISTER_MAPPED)
    dev = int(rt.pointerGetAttributes(ptr).devicePointer)
    mem = cupy.cuda.UnownedMemory(dev, view.nbytes, view)
    return cupy.ndarray(view.shape, view.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def early_writes(host, writes: bool) -> None:
    """Every rank, before a step's restores and drafts: when the step writes host rows before its first all-reduce
    (`writes`, decided from the step message), the shared rows' fence (module docstring)."""
    if host is not None and writes:
        host.fence()


def log_writes(host, log, rank: int, step: int) -> None:
    """With a WriteHash observer, after a step: this rank's line for the rows it wrote in `step`."""
    if host is not None and host.write_hash is not None and log is not None:
        rows, sha, reused = host.write_hash.take(step)
        log(f"rank {rank}: kv host step {step} wrote {rows} rows sha {sha}; {reused} pages another request "
            f"wrote in step {step - 1}; pages free {host.pool.free_count}")


class WriteHash:
    """An observer (tests): a digest of the (layer, row ids, row bytes) this rank writes, and how many pages a
    request wrote in the step right after another request last wrote them (released and leased again within one
    step)."""

    def __init__(self, xp):
        self.xp, self.sha, self.rows = xp, hashlib.sha256(), 0
        self._serial: dict[int, tuple[object, int]] = {}     # id(state) -> (state, serial); the ref keeps ids unique
        self._owner: dict[int, tuple[int, int]] = {}         # page -> (writer serial, step it last wrote)
        self._touched: dict[int, int] = {}                   # this step: page -> writer serial

    def note(self, layer: int, rows, values, state) -> None:
        host = (lambda a: a) if self.xp is np else self.xp.asnumpy
        self.sha.update(np.int32(layer).tobytes() + host(rows).tobytes() + host(values).tobytes())
        self.rows += int(rows.shape[0])
        serial = self._serial.setdefault(id(state), (state, len(self._serial)))[1]
        self._touched.update((int(p), serial) for p in state.pages)

    def take(self, step: int) -> tuple[int, str, int]:
        reused = sum(1 for p, w in self._touched.items()
                     if p in self._owner and self._owner[p][0] != w and self._owner[p][1] == step - 1)
        self._owner.update((p, (w, step)) for p, w in self._touched.items())
        out = (self.rows, self.sha.hexdigest()[:16], reused)
        self.sha, self.rows, self._touched = hashlib.sha256(), 0, {}
        return out


class HostRows:
    """One rank's host latent rows (per KV layer [rows, R] bf16), the gather's device buffers and flag words."""

    def __init__(self, cfg: ModelConfig, ops, rows: int, slots: int, poison: bool = False, pool=None,
                 shared=None, writes: WriteHash | None = None):
        if slots < 1:
            raise ValueError(f"kv host: the gather needs at least one slot, got {slots}")
        self.ops, self.rows, self.num_slots, self.pool = ops, rows, slots, pool
        self.row_bytes = cfg.kv_lora_rank * storage_of(ops).itemsize("bf16")
        xp, storage = ops.xp, storage_of(ops)
        cpu = xp is np
        specs = host_latent_arrays(cfg, 1, rows)                # kv.latent.<layer>: [rows, R] bf16, host memory
        self.segment = None
        if shared is not None:                                   # CUPYGLM_KV_HOST_SHARED: one file per host
            self.segment, self.latent = shared_latent(shared, specs, storage, poison, cpu)
        else:
            self.latent = {_layer(spec): self._host(spec, storage, poison, cpu) for spec in specs}
        slots_spec = gather_arrays(cfg, rows, slots)[0]
        dtype = storage.dtype(slots_spec.kind)
        self.slots = xp.zeros(slots_spec.shape, dtype=dtype)     # [slots, R] bf16, device
        self.slot_row = xp.full((slots,), -1, dtype=np.int32)    # [slots] i32, device
        self.marks = xp.full((rows,), -1, dtype=np.int32)        # [rows] i32, -1 between calls, device
        c = row_cache_rows(cfg)
        self.cache = {l: xp.zeros((c, cfg.kv_lora_rank), dtype=dtype) for l in cfg.kv_layers}   # [C, R] bf16
        self.cache_rows = {l: xp.full((c,), -1, dtype=np.int32) for l in cfg.kv_layers}        # [C] i32
        self.cmark = {l: xp.full((rows,), -1, dtype=np.int32) for l in cfg.kv_layers}          # [rows] i32
        self.slot_miss = xp.zeros((slots,), dtype=np.int32)      # [slots] i32 1 where the slot's row missed, device
        self.stats = {l: xp.zeros((2,), dtype=np.int32) for l in cfg.kv_layers}                # [2] hits, misses
        self._generation = {l: -1 for l in cfg.kv_layers}        # the pool's generation the cache was filled at
        self.hits = self.misses = self.decode_rows = 0           # since startup (take_stats)
        self.write_hash = writes                                  # None: nothing observes the writes
        if cpu:
            self.flags = np.zeros((FLAG_WORDS,), dtype=np.int32)    # [F] i32 a word per call segment
            self._flags_host = self.flags
        else:
            self.flags, self._flags_host = _mapped((FLAG_WORDS,), np.int32, 0)

    def fence(self) -> None:
        """Shared rows: wait until every rank of the host has finished the step before (module docstring)."""
        if self.segment is None:
            return
        if self.ops.xp is not np:
            self.ops.xp.cuda.get_current_stream().synchronize()
        self.segment.barrier()

    @staticmethod
    def _host(spec: ArraySpec, storage, poison: bool, cpu: bool):
        dtype = storage.dtype(spec.kind)
        if cpu:
            return np.full(spec.shape, np.nan, dtype=dtype) if poison else np.zeros(spec.shape, dtype=dtype)
        fill = (_NAN_BITS if dtype.kind in "iu" else np.nan) if poison else 0
        dev, _ = _mapped(spec.shape, dtype, fill)
        return dev

    @property
    def message(self) -> str:
        return slots_message(self.num_slots)

    def gather(self, layer: int, rows, counts, which: int, written):
        """Slot ids [T, W] int32 for one segment's store rows [T, W] (-1 padded); the slots hold the rows.
        written: [n] int32 the store rows this segment wrote to the layer (they leave its row cache)."""
        if which >= FLAG_WORDS:
            raise ValueError(f"kv host: a call of more than {FLAG_WORDS} sequences")
        generation = -2 if self.pool is None else self.pool.generation
        if generation != self._generation[layer] or self.pool is None:   # pages changed hands: forget
            self.cmark[layer].fill(-1)
            self.cache_rows[layer].fill(-1)
            self._generation[layer] = generation
        if rows.shape[0] > CACHED_ROWS:                           # a prompt chunk: the union once, no cache
            self.ops.kv_cache_invalidate(written, self.cache_rows[layer], self.cmark[layer])
            return self.ops.kv_gather(self.latent[layer], rows, counts, self.marks, self.slot_row, self.slots,
                                      self.flags, which)
        self.decode_rows += rows.shape[0]
        return self.ops.kv_gather_cached(self.latent[layer], rows, counts, self.marks, self.slot_row, self.slots,
                                         self.flags, which, written, self.cache[layer], self.cache_rows[layer],
                                         self.cmark[layer], self.slot_miss, self.stats[layer])

    def take_stats(self) -> dict:
        """After the step's synchronize: the row cache's totals since startup (the per-layer counters added in
        and cleared); bytes_per_decode_token counts the rows that crossed the bus per decode row and layer sum."""
        xp = self.ops.xp
        for st in self.stats.values():
            h = st if xp is np else xp.asnumpy(st)
            self.hits += int(h[0])
            self.misses += int(h[1])
            st.fill(0)
        layers = max(1, len(self.stats))
        tokens = self.decode_rows / layers
        return {"hits": self.hits, "misses": self.misses,
                "bytes_per_decode_token": self.misses * self.row_bytes / tokens if tokens else 0.0}

    def take_refused(self) -> list[int]:
        """After the step's synchronize: the call segments that ran out of slots (their flag words cleared)."""
        xp = self.ops.xp
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()            # a no-op after the step's read-back
        hit = np.flatnonzero(self._flags_host)
        if hit.size:
            self._flags_host[hit] = 0
        return [int(i) for i in hit]
