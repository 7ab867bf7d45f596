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
the kernel are copied back into the caller's arrays (sim_arena, sim_process).
Errors (sim_errors; the first in sim_build):

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
(seeded) order.  Set it process-wide with :func:`sim_order.set_thread_order` (initial
value from ``CUPYGLM_SIM_ORDER``, default forward) or per call with
``order=``/``seed=``.  A kernel whose output depends on the order has a race.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Sequence

from cupyglm import env

from . import sim_arena, sim_build
from .sim_args import check_args, dim3
from .sim_errors import SimCrash, SimDeadlock, SimKernelError, SimLaunchError, SimTimeout
from .sim_order import launch_order
from .sim_process import Worker, send_message

__all__ = ["SimModule", "SimFunction", "load_module"]


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
        self._worker: Worker | None = None
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
    def _get_worker(self) -> Worker:
        w = self._worker
        if w is None or not w.alive():
            if w is not None and w.pid == os.getpid():
                w.close()
            self._worker = None
            self._worker = Worker(self.so_path)
        return self._worker

    def _signature(self, name: str) -> list[str]:
        with self._lock:
            return list(self._get_worker().signatures[name])

    def _launch(self, fn, grid, block, args, shared_mem, order, seed, timeout) -> None:
        g = dim3(grid, "grid")
        b = dim3(block, "block")
        smem = int(shared_mem)
        if smem < 0:
            raise ValueError("shared_mem must be >= 0")
        if smem > fn.max_dynamic_shared_size_bytes:
            raise SimLaunchError(
                f"kernel {fn.name}: shared_mem={smem} exceeds max_dynamic_shared_size_bytes="
                f"{fn.max_dynamic_shared_size_bytes} (raise it on the function, as with cupy's opt-in)"
            )
        order_code, seed = launch_order(order, seed)
        timeout = self.timeout if timeout is None else float(timeout)
        with self._lock:
            worker = self._get_worker()
            sig = worker.signatures[fn.name]
            check_args(fn.name, fn.param_names, args, sig)
            regions, msg_args, protect, total = sim_arena.layout(sig, args)
            worker._grow(total)
            arena = worker.arena_np
            assert arena is not None
            sim_arena.copy_in(arena, regions)
            msg = {
                "op": "launch",
                "kernel": fn.name,
                "grid": g,
                "block": b,
                "smem": smem,
                "order": order_code,
                "seed": seed,
                "arena_size": worker.arena_size,
                "protect": protect,
                "args": msg_args,
            }
            try:
                send_message(worker.req_w, msg)
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
                report = sim_arena.crash_report(arena)
                death = worker._death()
                worker.close()
                self._worker = None
                message = sim_arena.crash_message(fn.name, fn.param_names, self.path, death, report, regions, smem)
                raise SimCrash(message, fn.name, death) from None
            rc = reply["rc"]
            if rc == 0:
                sim_arena.copy_back(arena, regions)
                return
            err = reply["err"]
            if rc == 1:
                raise SimDeadlock(f"deadlock: {err}")
            if rc == 2:
                raise SimKernelError(err)
            raise SimLaunchError(err)


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
