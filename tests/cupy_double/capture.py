"""Stream capture in the double: `Stream.begin_capture` / `end_capture` -> `Graph`, `Graph.launch`, as CuPy has them.

Between begin_capture and end_capture on a stream, device work issued there is recorded, not run: RawKernel
launches (function, grid, block, shared memory, the argument arrays and scalars), CuPy's own kernels (each an
operation over the same numpy views of the same allocations), raw device copies and NCCL calls. An array made by
a captured operation holds poison (0xFF bytes) until a launch of the graph writes it. `Graph.launch` runs the
recorded work in order against the current contents of the same allocations.

Allocations during capture come from the private pool (blocks a dead array held are reused by later allocations of
the same size, as CuPy's pool does), so graphs sharing a pool alias memory exactly where a GPU would.

Refused during capture, as the GPU refuses (CUDARuntimeError 900, cudaErrorStreamCaptureUnsupported; the capture is
invalidated and end_capture raises 901):
* a device-to-host read (int(), .get(), asnumpy, .item(), repr ...), a stream / device synchronize;
* a host-to-device upload from pageable memory (cupy.asarray of host data, .set, a host index array);
* work issued on another stream than the capturing one (the legacy null stream included);
* an operation whose result's shape depends on the data (nonzero, unique, a boolean mask index: CuPy syncs);
* an allocation in global / thread-local mode (it needs cudaMalloc); in relaxed mode (CuPy's default) an
  allocation outside a private memory pool (stricter than CuPy: a block of the default pool freed during capture
  goes back to eager work while the graph still writes it). Use
  `with cupy.cuda.using_allocator(pool.malloc):` around the capture; the graph keeps its pool's blocks alive.
A launch after an allocation the graph reads or writes was freed raises (the GPU would write freed memory).
Only the thread that began the capture is checked (relaxed mode: other threads' calls are not refused; the double
does not model global mode's cross-thread refusals).

Counters: `captured` (operations recorded), `graph_launches` (Graph.launch calls: one host launch each),
`graph_kernels` / `graph_ops` / `graph_memcpys` (RawKernels / CuPy kernels / copies run inside launches).
"""
from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np

from .state import STATE

MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED = 0, 1, 2
UNSUPPORTED, INVALIDATED = 900, 901
_LOCAL = threading.local()           # .allocator: the allocator of cupy.cuda.using_allocator (None: the default)


class _Capture:
    def __init__(self, stream, mode: int):
        self.stream, self.mode = stream, mode
        self.thread = threading.get_ident()
        self.ops: list[tuple[str, str, object]] = []      # (counter, name, thunk)
        self.pools: list = []                              # the memory pools allocations came from (kept alive)
        self.watched: dict[int, weakref.ref] = {}          # id(buffer) -> weakref: buffers made before capture
        self.invalid: str | None = None


ACTIVE: dict[str, _Capture | None] = {"capture": None}


def _error(status: int, msg: str) -> Exception:
    from .cuda import CUDARuntimeError

    return CUDARuntimeError(status, msg)


def _mine() -> "_Capture | None":
    """The active capture, seen from the thread that began it only: other threads' work runs eagerly (relaxed
    mode: their API calls are not checked against this capture)."""
    cap = ACTIVE["capture"]
    return cap if cap is not None and cap.thread == threading.get_ident() else None


def capturing() -> bool:
    return _mine() is not None


def refuse(what: str) -> None:
    """Raise (and invalidate the capture) if a capture is active: `what` is not permitted while capturing."""
    cap = _mine()
    if cap is None:
        return
    cap.invalid = cap.invalid or what
    raise _error(UNSUPPORTED, f"cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
                              f"capturing ({what})")


def _check_stream(what: str) -> _Capture:
    cap = _mine()
    from .cuda import get_current_stream

    cur = get_current_stream()
    if cur is not cap.stream:
        refuse(f"{what} issued on stream {cur.ptr:#x} while stream {cap.stream.ptr:#x} captures "
               "(issue the work inside `with stream:`)")
    return cap


def watch(buffers) -> None:
    """The allocations a captured operation touches: those made before the capture are checked at each launch."""
    cap = _mine()
    from .state import Buffer

    for b in buffers:
        if isinstance(b, Buffer):                          # a pool block is the pool's: freed only with it
            cap.watched.setdefault(id(b), weakref.ref(b))


def record(counter: str, name: str, thunk, buffers=()) -> bool:
    """Capturing: record thunk (counted `captured`) and return True; else return False (the caller runs it)."""
    cap = _mine()
    if cap is None:
        return False
    _check_stream(name)
    watch(buffers)
    cap.ops.append((counter, name, thunk))
    STATE.count("captured", what=name)
    return True


def kernel(name: str, thunk, buffers=()) -> None:
    """A CuPy kernel with side effects only (a fill, an in-place op, a setitem): run now or recorded."""
    if not record("graph_ops", name, thunk, buffers):
        thunk()
        STATE.count("kernels", what=name)


def probe(fn):
    """fn() evaluated during capture for its result's shape and dtype only (the data may be poison)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return fn()
        except (IndexError, ValueError) as e:
            raise RuntimeError(f"cupy double: a captured operation could not be shaped on the capture-time data "
                               f"({e})") from e


def deferred_result(res: np.ndarray, fn, name: str, buffers):
    """During capture: a poisoned allocation shaped like res, written by fn() at each launch."""
    from .array import alloc

    out = alloc(res.shape, res.dtype)
    target = out._a

    def run():
        r = fn()
        if np.shape(r) != target.shape:
            raise RuntimeError(f"cupy double: captured {name} produced shape {np.shape(r)} at launch, "
                               f"{target.shape} at capture")
        target[...] = r
    record("graph_ops", name, run, buffers)
    return out


def compute(fn, sources=(), what: str = "op", inputs=()):
    """fn() -> a numpy result, wrapped (a view of one of `sources`' allocations stays a view). While a stream
    captures, fn runs only to shape the result: new arrays are poisoned allocations that fn() fills at each
    launch of the graph. `inputs`: the operands (their allocations are watched by the graph)."""
    if not capturing():
        from .array import wrap

        return wrap(fn(), sources, what)
    res = probe(fn)
    from .array import buffers_of

    bufs = list(sources) + buffers_of(list(inputs))
    return _captured(res, fn, sources, what, bufs)


def _captured(res, fn, sources, what, bufs):
    from .array import view_of

    if isinstance(res, (tuple, list)):
        out = [_captured(r, (lambda i=i: fn()[i]), sources, what, bufs) for i, r in enumerate(res)]
        return tuple(out) if isinstance(res, tuple) else out
    res = view_of(res, sources)
    return deferred_result(res, fn, what, bufs) if isinstance(res, np.ndarray) else res


def _keys(key) -> list:
    return list(key) if isinstance(key, tuple) else [key]


def _refuse_mask(key) -> None:
    """A boolean mask index: CuPy reads the mask's count back (a sync), refused while capturing."""
    from .array import ndarray

    if capturing() and any(isinstance(k, ndarray) and k.dtype == np.bool_ for k in _keys(key)):
        refuse("a boolean mask index (its result's shape is read back)")


def on_alloc(buf) -> None:
    """An allocation outside `pool_block` while a capture is active is one the double cannot place: refused."""
    refuse("an allocation outside the capture's memory pool")


def capture_pool() -> "MemoryPool":
    """During capture: a block of the private pool of `cupy.cuda.using_allocator(pool.malloc)`, refused
    without one or outside relaxed mode. Blocks freed during capture are reused by later allocations of the same
    size (this capture's or a later one's through the same pool), as CuPy's pool reuses them."""
    cap = _mine()
    if cap.mode != MODE_RELAXED:
        refuse("an allocation needs cudaMalloc, not permitted in global / thread-local capture mode")
    pool = getattr(getattr(_LOCAL, "allocator", None), "__self__", None)
    if not isinstance(pool, MemoryPool):
        refuse("an allocation outside a private memory pool: wrap the capture in "
               "`cupy.cuda.using_allocator(pool.malloc)` so eager work never reuses the graph's blocks")
    if pool not in cap.pools:
        cap.pools.append(pool)
    return pool


class Graph:
    """cupy.cuda.Graph: made only by Stream.end_capture."""

    def __init__(self, cap: _Capture):
        self._ops, self._pools, self._watched = cap.ops, cap.pools, list(cap.watched.values())

    def launch(self, stream=None):
        if capturing():
            refuse("launching a graph inside a capture (the double does not nest graphs)")
        for ref in self._watched:
            if ref() is None:
                raise _error(700, "cudaErrorIllegalAddress: a graph launch touches an allocation freed after "
                                  "its capture")
        STATE.count("graph_launches")
        for counter, name, thunk in self._ops:
            thunk()
            STATE.count(counter, what=name)

    def upload(self, stream=None):
        pass

    @property
    def sizes(self) -> dict:
        """How many recorded operations of each kind (for tests): {'graph_kernels': n, ...}."""
        out: dict = {}
        for counter, _, _ in self._ops:
            out[counter] = out.get(counter, 0) + 1
        return out


def begin(stream, mode) -> None:
    if stream.is_null:
        raise _error(UNSUPPORTED, "cudaErrorStreamCaptureUnsupported: the legacy null stream cannot capture")
    if ACTIVE["capture"] is not None:
        raise _error(UNSUPPORTED, "cudaErrorStreamCaptureUnsupported: a capture is already active")
    mode = MODE_RELAXED if mode is None else int(mode)
    if mode not in (MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED):
        raise _error(1, f"cudaErrorInvalidValue: capture mode {mode}")
    ACTIVE["capture"] = _Capture(stream, mode)


def end(stream) -> Graph:
    cap = ACTIVE["capture"]
    if cap is None or cap.stream is not stream:
        raise _error(UNSUPPORTED, "cudaErrorIllegalState: end_capture on a stream that is not capturing")
    ACTIVE["capture"] = None
    if cap.invalid is not None:
        raise _error(INVALIDATED, f"cudaErrorStreamCaptureInvalidated: the capture was invalidated by "
                                  f"{cap.invalid}")
    return Graph(cap)


def is_capturing(stream) -> bool:
    cap = ACTIVE["capture"]
    return cap is not None and cap.stream is stream


class _Block:
    """Device memory a pool holds (counted in the device budget until the pool goes)."""

    __slots__ = ("array", "nbytes", "__weakref__")


class PoolBuffer:
    """The buffer of an array allocated from a pool: its block goes back to the pool's free list when it dies."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array: np.ndarray, pool: "MemoryPool", block: _Block):
        self.array = array
        weakref.finalize(self, pool._give_back, block)


class MemoryPool:
    """cupy.cuda.MemoryPool: in the double, the allocator of arrays made while a capture is active."""

    def __init__(self, allocator=None):
        self._blocks: list[_Block] = []
        self._free: dict[int, list[_Block]] = {}

    def malloc(self, size):
        raise NotImplementedError("cupy double: MemoryPool.malloc is only an allocator for using_allocator")

    def array(self, shape, dt: np.dtype) -> tuple[np.ndarray, PoolBuffer]:
        """A poisoned array [shape] dt in a free block of its size, or a new block."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        free = self._free.get(nbytes)
        if free:
            block = free.pop()
        else:
            block = _Block()
            block.array, block.nbytes = np.empty(max(nbytes, 1), np.uint8), nbytes
            STATE.reserve(block, nbytes, int(block.array.ctypes.data))
            self._blocks.append(block)
        a = block.array[:nbytes].view(dt).reshape(shape)
        block.array.fill(0xFF)
        return a, PoolBuffer(a, self, block)

    def _give_back(self, block: _Block) -> None:
        if any(b is block for b in self._blocks):
            self._free.setdefault(block.nbytes, []).append(block)

    def used_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks) - sum(b.nbytes for f in self._free.values() for b in f)

    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    def free_all_blocks(self, stream=None) -> None:
        for f in self._free.values():
            for b in f:
                self._blocks.remove(b)
        self._free.clear()


class using_allocator:
    """cupy.cuda.using_allocator(allocator): a thread-local allocator inside the block."""

    def __init__(self, allocator=None):
        self.allocator = allocator

    def __enter__(self):
        self._prev = getattr(_LOCAL, "allocator", None)
        _LOCAL.allocator = self.allocator
        return self

    def __exit__(self, *exc):
        _LOCAL.allocator = self._prev
