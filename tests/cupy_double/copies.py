"""`cupy.cuda.runtime`'s raw copies and pinned host memory in the double, with CuPy's signatures:

    hostAlloc(size_t size, unsigned int flags) -> intptr_t          freeHost(intptr_t ptr)
    pointerGetAttributes(intptr_t ptr) -> PointerAttributes(device, devicePointer, hostPointer, type)
    memcpyAsync(intptr_t dst, intptr_t src, size_t size, int kind, intptr_t stream)

Strict: a copy's both ranges must lie inside one live device allocation or one pinned host allocation (a
mapped one, for a device-side copy), the kind must be a cudaMemcpyKind, the stream an integer handle.
Counts `memcpys` and `memcpy_bytes`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import operator

import numpy as np

from . import capture
from .state import STATE

HOST_ALLOC_FLAGS = 0xF                      # Portable | Mapped | WriteCombined | (reserved)
MAPPED = 2
MEMORY_HOST, MEMORY_DEVICE = 1, 2
_PINNED: dict[int, tuple[np.ndarray, int]] = {}       # address -> (buffer, flags)


_ERROR: list = [RuntimeError]                # the runtime's CUDARuntimeError, set by install()


def _invalid(what: str) -> Exception:
    return _ERROR[0](1, f"cudaErrorInvalidValue: invalid argument ({what})")


def _int(v, what: str) -> int:
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"an integer is required ({what}: {type(v).__name__})") from None


def host_alloc(size, flags) -> int:
    size, flags = _int(size, "size"), _int(flags, "flags")
    if size < 0 or flags & ~HOST_ALLOC_FLAGS:
        raise _invalid(f"hostAlloc size {size} flags {flags:#x}")
    buf = np.zeros(max(size, 1), dtype=np.uint8)
    _PINNED[buf.ctypes.data] = (buf[:size], flags)
    return int(buf.ctypes.data)


def free_host(ptr) -> None:
    if _PINNED.pop(_int(ptr, "ptr"), None) is None:
        raise _invalid(f"freeHost of {ptr:#x}, not a hostAlloc pointer")


def _pinned(ptr: int, n: int) -> int | None:
    for a, (buf, flags) in _PINNED.items():
        if a <= ptr and ptr + n <= a + buf.size:
            return flags
    return None


def pinned_view(ptr: int, nbytes: int) -> np.ndarray:
    """The bytes [ptr, ptr + nbytes) of a mapped pinned allocation as a uint8 view (cupy.ndarray(memptr=))."""
    for a, (buf, flags) in _PINNED.items():
        if a <= ptr and ptr + nbytes <= a + buf.size:
            if not flags & MAPPED:
                raise _invalid(f"ndarray over pinned memory at {ptr:#x} that is not mapped into the device")
            return buf[ptr - a: ptr - a + nbytes]
    raise _invalid(f"ndarray(memptr=) at {ptr:#x}+{nbytes}: the double wraps mapped pinned memory only")


@dataclasses.dataclass(frozen=True)
class PointerAttributes:
    device: int
    devicePointer: int
    hostPointer: int
    type: int


def pointer_attributes(ptr) -> PointerAttributes:
    ptr = _int(ptr, "ptr")
    flags = _pinned(ptr, 1)
    if flags is not None:
        return PointerAttributes(0, ptr if flags & MAPPED else 0, ptr, MEMORY_HOST)
    if STATE.owns(ptr, 1):
        return PointerAttributes(0, ptr, 0, MEMORY_DEVICE)
    raise _invalid(f"pointerGetAttributes of {ptr:#x}, memory the runtime does not know")


def memcpy_async(dst, src, size, kind, stream) -> None:
    dst, src, size = _int(dst, "dst"), _int(src, "src"), _int(size, "size")
    kind, stream = _int(kind, "kind"), _int(stream, "stream")
    if size < 0 or not 0 <= kind <= 4:
        raise _invalid(f"memcpyAsync size {size} kind {kind}")
    for ptr, what in ((dst, "dst"), (src, "src")):
        flags = _pinned(ptr, size)
        if not (STATE.owns(ptr, size) or (flags is not None and flags & MAPPED)):
            raise _invalid(f"memcpyAsync {what} {ptr:#x}+{size} is in no allocation")
    if capture.record("graph_memcpys", "memcpyAsync", lambda: ctypes.memmove(dst, src, size)):
        return
    ctypes.memmove(dst, src, size)
    STATE.count("memcpys", what="memcpyAsync")
    STATE.count("memcpy_bytes", size)
    LAST_STREAMS.append(stream)
    del LAST_STREAMS[:-64]


LAST_STREAMS: list[int] = []                 # the stream handles of the latest copies


def install(runtime) -> None:
    _ERROR[0] = runtime.CUDARuntimeError
    runtime.hostAlloc = host_alloc
    runtime.freeHost = free_host
    runtime.pointerGetAttributes = pointer_attributes
    runtime.memcpyAsync = memcpy_async
    runtime.cudaMemcpyDefault = 4
    runtime.cudaHostAllocMapped = MAPPED
