"""A strict CuPy double for tests: the `cuda` backend's Python glue runs end to end without a GPU.

    import cupy_double
    with cupy_double.installed(budget_bytes=None):       # sys.modules["cupy"] and cupy.cuda.* are the double
        ops = CudaOps()                                  # ... the cuda code path, kernels in the emulator
        with cupy_double.counting() as c:
            ...
        c.syncs, c.launches, c.kernels, c.h2d

What it is: `xp` (the cupy namespace), `array.ndarray` (CuPy's conversion rules), `raw` (RawModule /
RawKernel: real NVRTC cubins run by cupyglm/kernels/sim.py with CuPy's launch rules), `cuda` (devices,
runtime, memory), `nccl` (NCCL over MPI), `state` (counters, poisoned allocations, the memory budget),
`capture` (stream capture into cupy.cuda.Graph: recorded, not run; what a capturing stream refuses).
Never imported by the package; tests put tests/ on sys.path (pytest does), `run.py` for subprocesses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys

from . import state as _state
from .state import NAMES, STATE, OutOfMemoryError  # noqa: F401

_SAVED: dict = {}


def _clear_caches() -> None:
    """cupyglm's per-process caches that may hold real-cupy or double objects."""
    import cupyglm.kernels.cuda as kcuda
    import cupyglm.kernels.nvrtc_gate as gate
    import cupyglm.kernels.ops as kops

    kcuda._load.cache_clear()
    gate.nvrtc_module.cache_clear()
    kops._VARIANTS.clear()


def install(budget_bytes: int | None = None, device_count: int | None = None) -> None:
    """Put the double in sys.modules (cupy, cupy.cuda, .runtime, .memory, .nvrtc, .nccl)."""
    from . import cuda, xp

    if "cupy" in _SAVED:
        raise RuntimeError("cupy double already installed")
    mods = {"cupy": xp, **cuda.modules()}
    for name in mods:
        _SAVED[name] = sys.modules.get(name)
    sys.modules.update(mods)
    STATE.budget = budget_bytes
    if device_count is not None:
        cuda.CONFIG["device_count"] = device_count
    _clear_caches()


def uninstall() -> None:
    from . import capture, cuda

    capture.ACTIVE["capture"] = None
    del cuda._STREAMS[1:]
    for name, mod in _SAVED.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    _SAVED.clear()
    STATE.budget = None
    _clear_caches()


@contextlib.contextmanager
def installed(budget_bytes: int | None = None, device_count: int | None = None):
    install(budget_bytes, device_count)
    try:
        yield sys.modules["cupy"]
    finally:
        uninstall()


def set_budget(budget_bytes: int | None) -> None:
    """Device memory in bytes (allocations beyond it raise OutOfMemoryError); None: unlimited."""
    STATE.budget = budget_bytes


@dataclasses.dataclass
class Counts:
    syncs: int = 0
    d2h_bytes: int = 0
    h2d: int = 0
    h2d_bytes: int = 0
    launches: int = 0
    kernels: int = 0
    allocs: int = 0
    collectives: int = 0
    memcpys: int = 0
    memcpy_bytes: int = 0
    captured: int = 0
    graph_launches: int = 0
    graph_kernels: int = 0
    graph_ops: int = 0
    graph_memcpys: int = 0
    kernel_ns: int = 0
    where: dict = dataclasses.field(default_factory=dict)

    def line(self, per: int = 1) -> str:
        return " ".join(f"{n}={getattr(self, n) / per:g}" for n in NAMES)


@contextlib.contextmanager
def counting(trace: bool = False):
    """Counts of what ran inside the block (filled in when it exits); trace=True also keeps, per counter,
    how many came from each place (kernel name, 'int', 'asarray', ...)."""
    before = dict(STATE.counts)
    STATE.where.clear()
    STATE.trace = trace
    c = Counts()
    try:
        yield c
    finally:
        for n in NAMES:
            setattr(c, n, STATE.counts[n] - before.get(n, 0))
        c.where = {k: dict(v) for k, v in STATE.where.items()}
        STATE.trace = False


def in_use() -> int:
    """Device bytes live now."""
    return _state.STATE.in_use
