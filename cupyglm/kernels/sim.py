"""The `sim` backend: unmodified ``cuda_src/*.cu`` kernels run on the CPU.

    mod = SimModule("cuda_src/norm.cu")          # or load_module(path) (cached)
    fn = mod.get_function("rmsnorm_fwd")
    fn((rows,), (256,), (x, w, out, np.int32(rows)), shared_mem=0)

Call shape is cupy's ``RawKernel.__call__``: ``fn(grid, block, args,
shared_mem=0)``; grid/block are an int or a tuple of up to three ints; args is
a tuple of C-contiguous numpy arrays (passed as pointers) and numpy scalars
whose dtype matches the kernel parameter exactly (``np.int32`` for ``int``,
``np.uint32`` for ``unsigned``, ``np.float32`` for ``float``, ``np.int64`` for
``long long``, ``np.uint64`` for ``size_t``...).  Python ints/floats are refused
because cupy would silently pass them as 64-bit values.

Launches run in a guarded worker process (one per module, started on first
use and restarted after a crash).  Arrays are copied into a shared memory
arena with PROT_NONE guard pages around every buffer; arrays that are read-only
in numpy or bound to a ``const T*`` parameter are mapped read-only, so writes
past the end of a buffer or into an input crash reliably.  Results written by
the kernel are copied back into the caller's arrays.  Errors:

* ``SimCompileError`` - g++ diagnostics, naming the ``.cu`` file and line;
* ``SimDeadlock``     - divergent / unreachable ``__syncthreads`` or warp op;
* ``SimKernelError``  - a misuse the emulator detects (lane outside the mask,
                        shuffle from a lane not in the mask, bad width...);
* ``SimCrash``        - the kernel crashed the worker (signal name, block,
                        thread, and which buffer a bad address belongs to);
* ``SimTimeout``      - the launch exceeded the timeout (default 300 s, env
                        ``CUPYGLM_SIM_TIMEOUT``); e.g. a spin-wait on another block.

Thread order: the scheduler runs the threads of a block between barriers, and
the blocks of the grid, in ``"forward"``, ``"reverse"`` or ``"shuffled"``
(seeded) order.  Set it process-wide with :func:`set_thread_order` (initial
value from ``CUPYGLM_SIM_ORDER``, default forward) or per call with
``order=``/``seed=``.  A kernel whose output depends on the order has a race.
"""

from __future__ import annotations

from cupyglm import env
import atexit
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import sim_build
from .sim_build import SimCompileError, SimError

__all__ = [
    "SimError",
    "SimCompileError",
    "SimDeadlock",
    "SimKernelError",
    "SimLaunchError",
    "SimCrash",
    "SimTimeout",
    "SimModule",
    "SimFunction",
    "load_module",
    "set_thread_order",
    "get_thread_order",
]


class SimDeadlock(SimError):
    """Threads of a block wait at barriers / warp operations that can never complete."""


class SimKernelError(SimError):
    """The kernel misused a CUDA primitive in a way the emulator detects."""


class SimLaunchError(SimError):
    """The launch configuration is invalid (block too large, too much shared memory, ...)."""


class SimCrash(SimError):
    """The kernel crashed the worker process (segfault, abort, trap...)."""

    def __init__(self, message: str, kernel: str = "", signal_name: str = ""):
        super().__init__(message)
        self.kernel = kernel
        self.signal_name = signal_name


class SimTimeout(SimCrash):
    """The launch did not finish within the timeout; the worker was killed."""



# ---------------------------------------------------------------------------
# Thread order
# ---------------------------------------------------------------------------
_ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
_order_lock = threading.Lock()
_order: tuple[str, int] = (env.get_or("CUPYGLM_SIM_ORDER"), int(env.get_or("CUPYGLM_SIM_SEED")))
if _order[0] not in _ORDERS:
    raise ValueError(f"CUPYGLM_SIM_ORDER must be one of {sorted(_ORDERS)}, got {_order[0]!r}")


def set_thread_order(order: str, seed: int = 0) -> None:
    """Process-wide default order of threads (and blocks): forward, reverse or shuffled(seed)."""
    global _order
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {sorted(_ORDERS)}, got {order!r}")
    with _order_lock:
        _order = (order, int(seed))


def get_thread_order() -> tuple[str, int]:
    return _order


# ---------------------------------------------------------------------------
# Argument types
# ---------------------------------------------------------------------------
_SCALAR_DTYPES: dict[str, np.dtype] = {
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "long": np.dtype(np.int64),
    "unsigned long long": np.dtype(np.uint64),
    "unsigned long": np.dtype(np.uint64),
    "short": np.dtype(np.int16),
    "unsigned short": np.dtype(np.uint16),
    "char": np.dtype(np.int8),
    "signed char": np.dtype(np.int8),
    "unsigned char": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
}


def _scalar_dtype(ctype: str) -> np.dtype:
    if ctype == "__nv_bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return _SCALAR_DTYPES[ctype]
    except KeyError:
        raise SimLaunchError(f"kernel parameter type {ctype!r} cannot be passed by value to the emulator") from None


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"numpy.ndarray (dtype {a.dtype}, shape {a.shape})"
    if isinstance(a, np.generic):
        return f"np.{a.dtype.name}"
    mod = type(a).__module__
    return type(a).__name__ if mod == "builtins" else f"{mod}.{type(a).__name__}"


def _dim3(v: Any, what: str) -> tuple[int, int, int]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        t = (int(v),)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v
    ):
        t = tuple(int(x) for x in v)
    else:
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints, got {v!r}")
    t = t + (1,) * (3 - len(t))
    if any(x < 1 or x > 0xFFFFFFFF for x in t):
        raise ValueError(f"{what} dimensions must be >= 1, got {v!r}")
    return t  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------
_PAGE = mmap.PAGESIZE
_WORKER_SCRIPT = str(Path(__file__).with_name("sim_worker.py"))
_live_workers: "weakref.WeakSet[_Worker]" = weakref.WeakSet()


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = struct.pack("<Q", len(data)) + data
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


class _WorkerDied(Exception):
    pass


class _Worker:
    """One guarded worker process serving one emulator library."""

    def __init__(self, so_path: Path):
        self.so_path = so_path
        self.arena_fd = os.memfd_create("cupyglm-sim-arena", os.MFD_CLOEXEC)
        self.arena_size = 0
        self.arena: mmap.mmap | None = None
        self.arena_np: np.ndarray | None = None
        self._grow(1 << 20)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _WORKER_SCRIPT, str(so_path), str(self.arena_fd), str(req_r), str(resp_w)],
            pass_fds=(self.arena_fd, req_r, resp_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(req_r)
        os.close(resp_w)
        self.pid = os.getpid()
        _live_workers.add(self)
        hello = self.recv(timeout=120.0)
        if hello is None:
            raise SimCrash(f"emulator worker for {so_path} died while loading the library ({self._death()})")
        if not hello.get("ok"):
            self.close()
            raise SimError(f"emulator worker could not load {so_path}: {hello.get('error')}")
        self.signatures: dict[str, list[str]] = hello["kernels"]

    def _grow(self, need: int) -> None:
        if need <= self.arena_size:
            return
        size = max(need, 2 * self.arena_size, 1 << 20)
        size = _round_up(size, _PAGE)
        os.ftruncate(self.arena_fd, size)
        self.arena_np = None
        if self.arena is not None:
            self.arena.close()
        self.arena = mmap.mmap(self.arena_fd, size)
        self.arena_np = np.frombuffer(self.arena, dtype=np.uint8)
        self.arena_size = size

    def alive(self) -> bool:
        return self.proc.poll() is None and self.pid == os.getpid()

    def recv(self, timeout: float | None) -> Any:
        """Next message, or None if the worker died.  Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = bytearray()
        need = 8
        length = None
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                r, _, _ = select.select([self.resp_r], [], [], left)
                if not r:
                    raise TimeoutError
            chunk = os.read(self.resp_r, need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if len(buf) == need:
                if length is None:
                    (length,) = struct.unpack("<Q", buf)
                    buf = bytearray()
                    need = length
                    if need == 0:
                        return pickle.loads(b"")
                else:
                    return pickle.loads(bytes(buf))

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if rc < 0:
            try:
                return signal.Signals(-rc).name
            except ValueError:
                return f"signal {-rc}"
        return f"exit status {rc}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        if self.pid != os.getpid():
            return
        if getattr(self, "req_w", -1) >= 0:
            try:
                if self.proc.poll() is None:
                    _send(self.req_w, {"op": "exit"})
            except OSError:
                pass
            for fd in (self.req_w, self.resp_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.req_w = self.resp_r = -1
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.arena_np = None
        if self.arena is not None:
            try:
                self.arena.close()
            except BufferError:
                pass
            self.arena = None
        if self.arena_fd >= 0:
            os.close(self.arena_fd)
            self.arena_fd = -1


@atexit.register
def _close_all_workers() -> None:
    for w in list(_live_workers):
        try:
            w.close()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------
# Module / function
# ---------------------------------------------------------------------------
class SimFunction:
    """A kernel of a :class:`SimModule`; call like ``cupy.RawKernel``."""

    def __init__(self, module: "SimModule", name: str, param_names: Sequence[str]):
        self.module = module
        self.name = name
        self.param_names = tuple(param_names)
        # Mirrors cupy.RawKernel.max_dynamic_shared_size_bytes: launches asking for more
        # dynamic shared memory than this are refused, as on the GPU without the opt-in.
        self.max_dynamic_shared_size_bytes = 48 * 1024

    @property
    def param_types(self) -> list[str]:
        return self.module._signature(self.name)

    def __repr__(self) -> str:
        return f"<SimFunction {self.name}({', '.join(self.param_types)}) of {self.module.path}>"

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        order: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self.module._launch(self, grid, block, args, shared_mem, order, seed, timeout)


class SimModule:
    """One ``.cu`` file compiled for the CPU emulator (the sim analogue of ``cupy.RawModule``)."""

    def __init__(self, path: str | os.PathLike, *, timeout: float | None = None, extra_flags: Sequence[str] = ()):
        built = sim_build.build(path, tuple(extra_flags))
        self.path = built.source_path
        self.so_path = built.so_path
        self.key = built.key
        self._decls = {k.name: k for k in built.kernels}
        self.timeout = float(timeout if timeout is not None else env.get_or("CUPYGLM_SIM_TIMEOUT"))
        self._worker: _Worker | None = None
        self._lock = threading.RLock()
        self._functions: dict[str, SimFunction] = {}

    # -- public -----------------------------------------------------------------
    @property
    def kernel_names(self) -> list[str]:
        return list(self._decls)

    def get_function(self, name: str) -> SimFunction:
        if name not in self._decls:
            raise KeyError(
                f'kernel {name!r} not found in {self.path} (extern "C" __global__ kernels: {", ".join(self._decls)})'
            )
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = SimFunction(self, name, self._decls[name].param_names)
        return fn

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- internals -------------------------------------------------------------
    def _get_worker(self) -> _Worker:
        w = self._worker
        if w is None or not w.alive():
            if w is not None and w.pid == os.getpid():
                w.close()
            self._worker = None
            self._worker = _Worker(self.so_path)
        return self._worker

    def _signature(self, name: str) -> list[str]:
        with self._lock:
            return list(self._get_worker().signatures[name])

    def _check_args(self, fn: SimFunction, args: Sequence[Any], sig: list[str]) -> None:
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"kernel {fn.name}: args must be a tuple, got {_describe(args)}")
        names = fn.param_names if len(fn.param_names) == len(sig) else tuple(f"arg{i}" for i in range(len(sig)))
        if len(args) != len(sig):
            params = ", ".join(f"{t} {n}" for t, n in zip(sig, names))
            raise ValueError(f"kernel {fn.name} takes {len(sig)} arguments ({params}), got {len(args)}")
        for i, (ctype, a) in enumerate(zip(sig, args)):
            where = f"kernel {fn.name} parameter {i} '{names[i]}'"
            if ctype.endswith("*"):
                if not isinstance(a, np.ndarray):
                    raise ValueError(f"{where} expects a pointer ({ctype}): a C-contiguous numpy array, got {_describe(a)}")
                if not a.flags.c_contiguous:
                    raise ValueError(f"{where} ({ctype}): the numpy array must be C-contiguous (use np.ascontiguousarray)")
            else:
                dt = _scalar_dtype(ctype)
                if not (isinstance(a, np.generic) and a.dtype == dt):
                    raise ValueError(f"{where} expects {ctype} (np.{dt.name}), got {_describe(a)}")

    def _launch(self, fn, grid, block, args, shared_mem, order, seed, timeout) -> None:
        g = _dim3(grid, "grid")
        b = _dim3(block, "block")
        smem = int(shared_mem)
        if smem < 0:
            raise ValueError("shared_mem must be >= 0")
        if smem > fn.max_dynamic_shared_size_bytes:
            raise SimLaunchError(
                f"kernel {fn.name}: shared_mem={smem} exceeds max_dynamic_shared_size_bytes="
                f"{fn.max_dynamic_shared_size_bytes} (raise it on the function, as with cupy's opt-in)"
            )
        default_order, default_seed = _order
        order = default_order if order is None else order
        if order not in _ORDERS:
            raise ValueError(f"order must be one of {sorted(_ORDERS)}, got {order!r}")
        seed = default_seed if seed is None else int(seed)
        timeout = self.timeout if timeout is None else float(timeout)
        with self._lock:
            worker = self._get_worker()
            sig = worker.signatures[fn.name]
            self._check_args(fn, args, sig)
            layout, msg_args, protect, total = self._layout(sig, args)
            worker._grow(total)
            arena = worker.arena_np
            assert arena is not None
            arena[:_PAGE] = 0  # crash report area
            for region in layout:
                a = region["array"]
                if a.nbytes:
                    arena[region["off"] : region["off"] + a.nbytes] = a.reshape(-1).view(np.uint8)
            msg = {
                "op": "launch",
                "kernel": fn.name,
                "grid": g,
                "block": b,
                "smem": smem,
                "order": _ORDERS[order],
                "seed": seed & 0xFFFFFFFFFFFFFFFF,
                "arena_size": worker.arena_size,
                "protect": protect,
                "args": msg_args,
            }
            try:
                _send(worker.req_w, msg)
                reply = worker.recv(timeout)
            except TimeoutError:
                worker.kill()
                self._worker = None
                raise SimTimeout(
                    f"kernel {fn.name} did not finish within {timeout:g} s (infinite loop, or a spin-wait on "
                    "another block/thread, which the cooperative emulator cannot run); the worker was killed",
                    fn.name,
                    "timeout",
                ) from None
            except BrokenPipeError:
                reply = None
            if reply is None:
                report = bytes(arena[:_PAGE]).split(b"\0", 1)[0].decode(errors="replace")
                death = worker._death()
                worker.close()
                self._worker = None
                raise SimCrash(self._crash_message(fn, death, report, layout, smem), fn.name, death) from None
            rc = reply["rc"]
            if rc == 0:
                for region in layout:
                    if region["copy_back"]:
                        a = region["array"]
                        a.reshape(-1).view(np.uint8)[:] = arena[region["off"] : region["off"] + a.nbytes]
                return
            err = reply["err"]
            if rc == 1:
                raise SimDeadlock(f"deadlock: {err}")
            if rc == 2:
                raise SimKernelError(err)
            raise SimLaunchError(err)

    @staticmethod
    def _layout(sig: list[str], args: Sequence[Any]):
        """Arena layout: [crash page][guard][..data|][guard][..data|][guard]... data ends flush with a guard."""
        regions: list[dict] = []
        msg_args: list[tuple[str, Any]] = []
        protect: list[tuple[int, int, int]] = []
        cursor = _PAGE  # page 0: crash report
        for i, (ctype, a) in enumerate(zip(sig, args)):
            if not ctype.endswith("*"):
                msg_args.append(("s", a.tobytes()))
                continue
            is_const = ctype.startswith("const ")
            # Same buffer passed twice: share one region (aliasing preserved).
            same = next(
                (r for r in regions
                 if r["array"].__array_interface__["data"][0] == a.__array_interface__["data"][0]
                 and r["array"].nbytes == a.nbytes),
                None,
            )
            if same is not None:
                same["writable"] = same["writable"] or (not is_const and a.flags.writeable)
                same["copy_back"] = same["writable"] and a.flags.writeable and same["array"].flags.writeable
                msg_args.append(("p", same["off"]))
                continue
            for r in regions:
                if np.may_share_memory(r["array"], a):
                    raise SimLaunchError(
                        f"parameter {i}: partially overlapping arrays are not supported by the emulator"
                    )
            span = _round_up(max(a.nbytes, 1), _PAGE)
            protect.append((cursor, _PAGE, 0))  # guard page before
            data_end = cursor + _PAGE + span
            off = data_end - _round_up(a.nbytes, 16)
            writable = (not is_const) and a.flags.writeable
            regions.append({"index": i, "array": a, "off": off, "start": cursor + _PAGE, "end": data_end,
                            "writable": writable, "copy_back": writable})
            msg_args.append(("p", off))
            cursor = data_end
        protect.append((cursor, _PAGE, 0))  # guard after the last buffer
        total = cursor + _PAGE
        for r in regions:
            if not r["writable"]:
                protect.append((r["start"], r["end"] - r["start"], 1))  # PROT_READ
        return regions, msg_args, protect, total

    def _crash_message(self, fn: SimFunction, death: str, report: str, layout, smem: int) -> str:
        info = dict(kv.split("=", 1) for kv in report.split(";") if "=" in kv)
        where = ""
        if "block" in info:
            where += f" in block ({info['block']})"
        if "thread" in info:
            where += f" thread ({info['thread']})"
        detail = ""
        names = fn.param_names
        if "stack_overflow" in info:
            kb = env.get_or("CUEMU_STACK_KB")
            detail = f"fiber stack overflow (per-thread stack is {kb} KiB; set CUEMU_STACK_KB to raise it)"
        elif "arena_off" in info:
            off = int(info["arena_off"])
            for r in layout:
                i = r["index"]
                pname = names[i] if i < len(names) else f"arg{i}"
                a = r["array"]
                if r["start"] - _PAGE <= off < r["start"]:
                    detail = f"address is {r['off'] - off} bytes before parameter {i} '{pname}' (guard page)"
                elif r["end"] <= off < r["end"] + _PAGE:
                    detail = (f"address is {off - (r['off'] + a.nbytes)} bytes past the end of parameter {i} "
                              f"'{pname}' ({a.nbytes} bytes): out-of-bounds access")
                elif r["off"] <= off < r["end"] and not r["writable"]:
                    detail = f"write into read-only parameter {i} '{pname}' (const pointer or read-only array)"
                elif r["start"] <= off < r["off"]:
                    detail = f"address is {r['off'] - off} bytes before parameter {i} '{pname}'"
                if detail:
                    break
        elif "dyn_smem_off" in info:
            detail = f"dynamic shared memory access at byte {info['dyn_smem_off']} (shared_mem={smem})"
        elif "addr" in info and int(info["addr"], 16) < 65536:
            detail = f"null pointer dereference (address {info['addr']})"
        elif "addr" in info:
            detail = f"bad address {info['addr']}"
        elif death == "SIGILL":
            detail = "illegal instruction (__trap() or __builtin_trap)"
        elif death == "SIGABRT":
            detail = "abort (failed assert?)"
        msg = f"kernel {fn.name} crashed with {death}{where}"
        return msg + (f": {detail}" if detail else "") + f" [{self.path}]"


# ---------------------------------------------------------------------------
# Cached loading
# ---------------------------------------------------------------------------
_modules: dict[Path, SimModule] = {}
_modules_lock = threading.Lock()


def load_module(path: str | os.PathLike) -> SimModule:
    """A process-wide cached :class:`SimModule` for path (rebuilt when the source or its includes change)."""
    p = Path(path).resolve()
    key = sim_build.prepare(p)[0]
    with _modules_lock:
        mod = _modules.get(p)
        if mod is None or mod.key != key:
            if mod is not None:
                mod.close()
            mod = _modules[p] = SimModule(p)
        return mod
