"""`cupy.cuda` of the double: devices, streams, runtime, memory errors, the real NVRTC (recorded), NCCL.

Visible devices: CUDA_VISIBLE_DEVICES (a comma list) when set, else `cupy_double.configure(device_count=)`
(default 8). Device(i).use() with i outside them raises cudaErrorInvalidDevice, as the runtime does.
"""
from __future__ import annotations

import os
import sys
import types

from . import capture as _capture
from . import copies as _copies
from .state import DEFAULT_TOTAL, STATE, OutOfMemoryError

CONFIG = {"device_count": 8, "compute_capability": "90", "name": "cupy double (emulated H100)",
          "shared_optin": 232_448}      # cudaDevAttrMaxSharedMemoryPerBlockOptin of the emulated card
_CURRENT = {"device": 0}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int, msg: str):
        self.status = status
        super().__init__(msg)


def is_available() -> bool:
    return True


def _physical() -> list[int]:
    """The physical ids of the visible devices (CUDA_VISIBLE_DEVICES as integers, else 0..device_count-1)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [int(v) for v in vis.split(",") if v.strip() != ""]
    return list(range(int(CONFIG["device_count"])))


def _visible() -> int:
    return len(_physical())


def _check(i: int) -> int:
    if not 0 <= int(i) < _visible():
        raise CUDARuntimeError(101, "cudaErrorInvalidDevice: invalid device ordinal")
    return int(i)


class Device:
    def __init__(self, device=None):
        self.id = _CURRENT["device"] if device is None else _check(device)
        self.compute_capability = CONFIG["compute_capability"]

    @property
    def attributes(self) -> dict:
        return {"MaxSharedMemoryPerBlockOptin": int(CONFIG["shared_optin"]), "MaxSharedMemoryPerBlock": 48 * 1024}

    def use(self):
        _CURRENT["device"] = self.id

    def synchronize(self):
        _capture.refuse("Device.synchronize")

    def __enter__(self):
        self._prev = _CURRENT["device"]
        self.use()
        return self

    def __exit__(self, *exc):
        _CURRENT["device"] = self._prev

    def __int__(self):
        return self.id


class Stream:
    """cupy.cuda.Stream: `with stream:` makes it the current stream; Stream.null is the legacy null stream."""

    null = None
    _next = [0x1000]

    def __init__(self, null=False, non_blocking=False, ptr=0):
        self.is_null = bool(null)
        if null:
            self.ptr = 0
        else:
            self.ptr = Stream._next[0]
            Stream._next[0] += 0x10

    def synchronize(self):
        _capture.refuse("Stream.synchronize")

    def use(self):
        _STREAMS[-1] = self
        return self

    def __enter__(self):
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _STREAMS.pop()

    def begin_capture(self, mode=None):
        _capture.begin(self, mode)

    def end_capture(self):
        return _capture.end(self)

    def is_capturing(self):
        return _capture.is_capturing(self)

    def wait_event(self, event):
        """The stream's later work waits for the event (no host sync); counted as event_waits."""
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a cupy.cuda.Event, got {type(event).__name__}")
        STATE.count("event_waits", what=f"stream {self.ptr:#x}")


class Event:
    """cupy.cuda.Event: record(stream) marks the stream's work so far (counted as event_records); the double runs
    every operation at once, so a recorded event is always done."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = get_current_stream() if stream is None else stream
        STATE.count("event_records", what=f"stream {self.recorded_on.ptr:#x}")

    def synchronize(self):
        _capture.refuse("Event.synchronize")
        STATE.count("syncs", what="Event.synchronize")

    @property
    def done(self):
        return True


Stream.null = Stream(null=True)
_STREAMS: list = [Stream.null]            # the current stream is the last one entered
Graph, MemoryPool, using_allocator = _capture.Graph, _capture.MemoryPool, _capture.using_allocator


def get_current_stream(device_id=-1):
    return _STREAMS[-1]


def get_device_id() -> int:
    return _CURRENT["device"]


# -- cupy.cuda.runtime ------------------------------------------------------------------------------------
runtime = types.ModuleType("cupy.cuda.runtime")
runtime.CUDARuntimeError = CUDARuntimeError
_copies.install(runtime)


def _mem_get_info():
    total = STATE.budget if STATE.budget is not None else DEFAULT_TOTAL
    return max(0, total - STATE.in_use), total


def _properties(i=None):
    _check(_CURRENT["device"] if i is None else i)
    cc = CONFIG["compute_capability"]
    i = _CURRENT["device"] if i is None else int(i)
    return {"name": CONFIG["name"].encode(), "totalGlobalMem": _mem_get_info()[1], "major": int(cc[:-1]),
            "pciDomainID": 0, "pciBusID": 0x10 + _physical()[i], "pciDeviceID": 0,
            "minor": int(cc[-1]), "sharedMemPerBlock": 48 * 1024, "maxThreadsPerBlock": 1024,
            "multiProcessorCount": 132, "warpSize": 32}


runtime.memGetInfo = _mem_get_info
runtime.getDeviceCount = _visible
runtime.getDeviceProperties = _properties
runtime.getDevice = get_device_id
runtime.deviceSynchronize = lambda: _capture.refuse("cudaDeviceSynchronize")
runtime.streamCaptureModeGlobal = _capture.MODE_GLOBAL
runtime.streamCaptureModeThreadLocal = _capture.MODE_THREAD_LOCAL
runtime.streamCaptureModeRelaxed = _capture.MODE_RELAXED
runtime.setDevice = lambda i: Device(i).use()

# -- cupy.cuda.memory -------------------------------------------------------------------------------------
memory = types.ModuleType("cupy.cuda.memory")
memory.OutOfMemoryError = OutOfMemoryError
memory.MemoryPool, memory.using_allocator = _capture.MemoryPool, _capture.using_allocator


def _nvrtc():
    """The real NVRTC binding (cupy_backends; no GPU needed) behind a recorder of (program name, options)."""
    from cupy_backends.cuda.libs import nvrtc as real

    from .raw import record_cubin

    real.getVersion()              # loads libnvrtc through the real cupy (its loader), before cupy is replaced
    mod = types.ModuleType("cupy.cuda.nvrtc")
    for k in dir(real):
        if not k.startswith("__"):
            setattr(mod, k, getattr(real, k))
    programs: dict[int, list] = {}

    def createProgram(src, name, headers, include_names):
        prog = real.createProgram(src, name, headers, include_names)
        programs[int(prog)] = [name, ()]
        return prog

    def compileProgram(prog, options):
        programs.setdefault(int(prog), ["", ()])[1] = tuple(options)
        return real.compileProgram(prog, options)

    def getCUBIN(prog):
        cubin = real.getCUBIN(prog)
        name, opts = programs.get(int(prog), ("", ()))
        record_cubin(bytes(cubin), name, opts)
        return cubin

    def destroyProgram(prog):
        programs.pop(int(prog), None)
        return real.destroyProgram(prog)

    mod.createProgram, mod.compileProgram, mod.getCUBIN = createProgram, compileProgram, getCUBIN
    mod.destroyProgram = destroyProgram
    return mod


class UnownedMemory:
    """cupy.cuda.UnownedMemory(ptr, size, owner): memory cupy does not allocate (the double: mapped pinned
    host memory only, see copies.pinned_view)."""

    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner


class MemoryPointer:
    """cupy.cuda.MemoryPointer(mem, offset), for cupy.ndarray(shape, dtype, memptr=)."""

    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, int(mem.ptr) + int(offset)


def modules() -> dict[str, types.ModuleType]:
    """The sys.modules entries of cupy.cuda and its submodules."""
    from . import nccl

    me = sys.modules[__name__]
    me.nvrtc = _nvrtc()
    me.nccl = nccl
    return {"cupy.cuda": me, "cupy.cuda.runtime": runtime, "cupy.cuda.memory": memory,
            "cupy.cuda.nvrtc": me.nvrtc, "cupy.cuda.nccl": nccl}
