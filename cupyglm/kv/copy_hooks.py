"""What a backend gives the kept-state walk: the address of an array, the copy hook, and a host arena.

CPU backends (numpy, sim): addresses are host pointers and the hook is one memmove. cuda: device pointers and
one `cudaMemcpyAsync` (kind default) on the current stream, the step's stream; the host arena is pinned host
memory mapped into the device (`cudaHostAllocMapped`), copied through its device pointer (from
`cudaPointerGetAttributes`).
"""
from __future__ import annotations

import ctypes

import numpy as np

CUDA_MEMCPY_DEFAULT = 4                 # cudaMemcpyDefault: the pointers say where the bytes are
CUDA_HOST_ALLOC_MAPPED = 2              # cudaHostAllocMapped


def _is_cpu(ops) -> bool:
    return ops.xp is np


def address_of(arr) -> int:
    """The address of an array's first byte (host pointer on CPU backends, device pointer on cuda)."""
    if isinstance(arr, np.ndarray):
        return int(arr.ctypes.data)
    return int(arr.data.ptr)


def hook_for(ops):
    """The copy hook `(dst, src, nbytes)` of a backend."""
    if _is_cpu(ops):
        return lambda dst, src, n: ctypes.memmove(dst, src, n)
    import cupy

    runtime = cupy.cuda.runtime

    def cuda_copy(dst: int, src: int, n: int) -> None:
        runtime.memcpyAsync(dst, src, n, CUDA_MEMCPY_DEFAULT, cupy.cuda.get_current_stream().ptr)

    return cuda_copy


class PinnedArena:
    """Pinned host memory mapped into the device: `nbytes` at host pointer `host`, device pointer `device`."""

    def __init__(self, nbytes: int):
        import cupy

        self._runtime = cupy.cuda.runtime
        self.nbytes = nbytes
        self.host = int(self._runtime.hostAlloc(nbytes, CUDA_HOST_ALLOC_MAPPED))
        self.device = int(self._runtime.pointerGetAttributes(self.host).devicePointer)

    def close(self) -> None:
        if self.host:
            self._runtime.freeHost(self.host)
            self.host = 0

    def __del__(self):
        try:
            self.close()
        except Exception:           # interpreter shutdown: the driver may be gone already
            pass


def host_arena(ops, spec):
    """A host arena of `spec`'s bytes apart from the device arena: (holder, the address the hook copies with)."""
    nbytes = int(np.prod(spec.shape))
    if _is_cpu(ops):
        arena = np.zeros(spec.shape, dtype=np.uint8)          # [kept pages, page bytes] u8, its own allocation
        return arena, address_of(arena)
    arena = PinnedArena(nbytes)
    return arena, arena.device
