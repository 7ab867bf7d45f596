"""What the double counts and the device memory it pretends to have (one process = one device).

Counters (reset per test through `cupy_double.counting()`):
  syncs      device-to-host syncs: int(), float(), bool(), .item(), .get(), asnumpy, .tolist(), repr
  d2h_bytes  bytes those syncs copied to the host
  h2d        host-to-device copies (cupy.asarray / array / ndarray.set of host data, a host index array)
  h2d_bytes  bytes uploaded
  launches   RawKernel launches (through the emulator)
  kernels    CuPy's own kernels: each elementwise op, reduction, copy, fill, gather/scatter, sort, concatenate
  allocs     device allocations; peak_bytes the most bytes live at once
  collectives NCCL calls
  memcpys    raw runtime copies (memcpyAsync); memcpy_bytes their bytes
  captured   operations recorded into a graph by stream capture (capture.py), not run
  graph_launches  Graph.launch calls (one host launch each); graph_kernels / graph_ops / graph_memcpys the
             RawKernels / CuPy kernels / raw copies those launches ran
  event_records / event_waits  Event.record and Stream.wait_event calls (ordering between streams, no host sync)
  kernel_ns  nanoseconds the emulator spent running RawKernels (eager or replayed): what a GPU would do, so
             host time less this is the host's own work
"""
from __future__ import annotations

import collections
import threading
import weakref

import numpy as np

NAMES = ("syncs", "d2h_bytes", "h2d", "h2d_bytes", "launches", "kernels", "allocs", "collectives", "memcpys",
         "memcpy_bytes", "captured", "graph_launches", "graph_kernels", "graph_ops", "graph_memcpys", "kernel_ns",
         "event_records", "event_waits")


class OutOfMemoryError(MemoryError):
    """As cupy.cuda.memory.OutOfMemoryError: an allocation beyond the device's memory."""

    def __init__(self, size: int, total: int, limit: int = 0):
        self.size, self.total, self.limit = size, total, limit
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, "
                         f"limit set to: {limit:,} bytes).")


class State:
    def __init__(self):
        self.lock = threading.RLock()
        self.counts: collections.Counter = collections.Counter()
        self.budget: int | None = None           # device bytes; None = DEFAULT_TOTAL reported, not enforced
        self.in_use = 0
        self.peak = 0
        self.live: dict[int, tuple[int, int]] = {}   # id(buffer) -> (address, nbytes)
        self.where: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.trace = False

    def count(self, name: str, n: int = 1, what: str | None = None) -> None:
        with self.lock:
            self.counts[name] += n
            if self.trace and what is not None:
                self.where[name][what] += n

    def reserve(self, buf, nbytes: int, addr: int) -> None:
        with self.lock:
            if self.budget is not None and self.in_use + nbytes > self.budget:
                raise OutOfMemoryError(nbytes, self.in_use, self.budget)
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
            self.counts["allocs"] += 1
            key = id(buf)
            self.live[key] = (addr, nbytes)
        weakref.finalize(buf, self._release, key, nbytes)

    def _release(self, key: int, nbytes: int) -> None:
        with self.lock:
            self.in_use -= nbytes
            self.live.pop(key, None)

    def owns(self, ptr: int, nbytes: int) -> bool:
        """Is [ptr, ptr + nbytes) inside one live device allocation?"""
        with self.lock:
            return any(a <= ptr and ptr + nbytes <= a + n for a, n in self.live.values())


DEFAULT_TOTAL = 80 * 2**30        # what memGetInfo reports without a budget
STATE = State()


class Buffer:
    """One device allocation: a host numpy array standing for device memory."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array: np.ndarray):
        from .capture import on_alloc

        self.array = array
        on_alloc(self)                     # refused, or kept alive by the graph, while a capture is active
        STATE.reserve(self, int(array.nbytes), int(array.__array_interface__["data"][0]))
