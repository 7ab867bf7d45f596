"""Weights kept in host memory and staged to the device into two slots, one unit at a time (the vision tower's
weights with CUPYGLM_VISION_HOST, cupyglm/vision/staging.py).

A stager owns one host array (the units' stored bytes back to back), two device slots and the copies between them:

    copy(slot, dst, lo, n)  start copying host elements [lo, lo + n) into the slot's device array `dst`; on cuda
                            the copy runs on the stager's own stream, after the slot's last release
    wait(slot)              the compute stream waits until the slot's latest copy has landed (an event wait, no
                            host sync)
    release(slot)           the compute stream's work so far is the last to read the slot: its next copy may start
                            after it (an event record)

CPU backends (numpy, sim): the host array is plain memory, a copy is one numpy copy done at once, wait and release
do nothing. cuda: the host array is pinned (cudaHostAlloc), a copy is one cudaMemcpyAsync on a copy stream, and
each slot has a ready event (recorded after its copy) and a free event (recorded by release), so the next unit's
copy overlaps the current unit's kernels.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, to_bits

CUDA_MEMCPY_DEFAULT = 4                 # cudaMemcpyDefault: the pointers say where the bytes are
CUDA_HOST_ALLOC_MAPPED = 2              # cudaHostAllocMapped: pinned, and valid as a copy source everywhere


def make_stager(ops, n_host: int, n_slot: int):
    """The stager of `ops`'s backend: `n_host` host elements and two slots of `n_slot` elements, bf16 storage."""
    if ops.xp is np:
        return HostStager(ops, n_host, n_slot)
    return CudaStager(ops, n_host, n_slot)


class HostStager:
    """numpy / sim: the same staging code with plain copies."""

    def __init__(self, ops, n_host: int, n_slot: int):
        dtype = np.dtype(BF16)
        self.host = np.zeros((n_host,), dtype)
        self.slots = [np.zeros((n_slot,), dtype) for _ in range(2)]

    def stored(self, array: np.ndarray) -> np.ndarray:
        """A bf16 tensor as the host array holds it (flat)."""
        return _bf16(array).reshape(-1)

    def copy(self, slot: int, lo: int, n: int) -> None:
        self.slots[slot][:n] = self.host[lo:lo + n]

    def wait(self, slot: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass


class CudaStager:
    """cuda: pinned host memory, a copy stream, a ready and a free event per slot."""

    def __init__(self, ops, n_host: int, n_slot: int):
        import cupy

        self.cupy, self.runtime = cupy, cupy.cuda.runtime
        self.host_ptr = int(self.runtime.hostAlloc(max(1, n_host) * 2, CUDA_HOST_ALLOC_MAPPED))
        self._free_host = self.runtime.freeHost
        buf = (np.ctypeslib.as_ctypes_type(np.uint8) * (max(1, n_host) * 2)).from_address(self.host_ptr)
        self.host = np.frombuffer(buf, np.uint16, count=n_host)
        self.slots = [cupy.zeros((n_slot,), cupy.uint16) for _ in range(2)]
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.ready = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self.free = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]

    def stored(self, array: np.ndarray) -> np.ndarray:
        return to_bits(_bf16(array)).reshape(-1)

    def copy(self, slot: int, lo: int, n: int) -> None:
        self.stream.wait_event(self.free[slot])
        self.runtime.memcpyAsync(int(self.slots[slot].data.ptr), self.host_ptr + 2 * lo, 2 * n,
                                 CUDA_MEMCPY_DEFAULT, self.stream.ptr)
        self.ready[slot].record(self.stream)

    def wait(self, slot: int) -> None:
        self.cupy.cuda.get_current_stream().wait_event(self.ready[slot])

    def release(self, slot: int) -> None:
        self.free[slot].record(self.cupy.cuda.get_current_stream())

    def __del__(self):
        try:
            if self.host_ptr:
                self._free_host(self.host_ptr)
                self.host_ptr = 0
        except Exception:           # interpreter shutdown: the driver may be gone already
            pass


def _bf16(array) -> np.ndarray:
    a = np.ascontiguousarray(array)
    if a.dtype != BF16:
        raise ValueError(f"staged weights are bf16 tensors, got {a.dtype}")
    return a
