"""Kernel-backed ops: each `cupyglm/kernels/ops_<family>.py` registers typed launchers under the name of the
NumpyOps method they replace. SimOps and CudaOps (cupyglm/backend/) dispatch every registered name to its
launcher; an op nobody registered falls back to NumPy only where `KERNEL_FREE` says it is not compute.

A launcher is `fn(k: Kernels, *args like the NumpyOps method) -> result like the NumpyOps method`.
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Callable

import numpy as np

from cupyglm.backend.lanes import BF16, BF16_BITS
from cupyglm.kernels import CUDA_SRC, load_module

OPS: dict[str, Callable] = {}
# op name -> positions of the array arguments the op writes in place (e.g. write_rows' store). SimOps/CudaOps
# may copy other array arguments (to make them contiguous or move them to the device), never these.
INPLACE: dict[str, tuple[int, ...]] = {}
# NumpyOps methods that are storage, not compute: a backend without a kernel for them may run them as is.
KERNEL_FREE = frozenset({"weight", "asnumpy", "bf16_full", "raise_device_errors", "asnumpy_checked"})


def op(name: str, inplace: tuple[int, ...] = ()):
    """Register a launcher as the kernel implementation of the NumpyOps method `name`."""
    def deco(fn):
        if name in OPS:
            raise ValueError(f"op {name!r} registered twice")
        OPS[name] = fn
        INPLACE[name] = tuple(inplace)
        return fn
    return deco


def load_all() -> dict[str, Callable]:
    """Import every ops_<family> module so its launchers register."""
    pkg = Path(__file__).parent
    for m in pkgutil.iter_modules([str(pkg)]):
        if m.name.startswith("ops_"):
            importlib.import_module(f"cupyglm.kernels.{m.name}")
    return OPS


_VARIANTS: dict[tuple, object] = {}


def _load_variant(backend: str, path: Path, defines: tuple[str, ...]):
    """A kernel module compiled with extra -D defines (planted controls of the contract); cached per process."""
    key = (backend, str(path), defines)
    mod = _VARIANTS.get(key)
    if mod is not None:
        return mod
    flags = tuple(f"-D{d}" for d in defines)
    if backend == "sim":
        from cupyglm.kernels.sim import SimModule
        mod = SimModule(path, extra_flags=flags)
    elif backend == "cuda":
        from cupyglm.kernels import cuda
        mod = cuda.CudaModule(path, extra_options=flags)      # cached on disk by (source, flags): no temp file
    else:
        raise ValueError(f"unknown kernel backend {backend!r}")
    _VARIANTS[key] = mod
    return mod


# A block's opt-in maximum of dynamic shared memory (bytes) by architecture; sim defaults to sm_90's.
SHARED_OPTIN = {"sm_80": 166_912, "sm_86": 101_376, "sm_89": 101_376, "sm_90": 232_448, "sm_100": 232_448,
                "sm_120": 101_376}


class Kernels:
    """What a launcher needs: the backend's kernel modules (one per .cu file) and its array module.

    `defines` (planted controls only): compile every module with these extra -D macros.
    `bf16`: the dtype of a bf16 array on this backend (ml_dtypes.bfloat16 on sim, uint16 bit patterns on cuda);
    every launcher checks its bf16 parameters against it.
    `shared_optin`: the most dynamic shared memory a block may opt in to (launchers pick their tile by it); on cuda
    the device's attribute unless given, on sim sm_90's unless given (the emulator refuses a launch above it)."""

    def __init__(self, backend: str, xp, order: str | None = None, defines: tuple[str, ...] = (),
                 shared_optin: int | None = None):
        self.backend, self.xp, self.order, self.defines = backend, xp, order, tuple(defines)
        self.bf16 = BF16_BITS if backend == "cuda" else BF16
        self._optin = shared_optin
        self._fns: dict[tuple[str, str], object] = {}
        self._variants: dict[tuple[str, ...], "Kernels"] = {}

    @property
    def shared_optin(self) -> int:
        if self._optin is None:
            if self.backend == "cuda":
                self._optin = int(self.xp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])
            else:
                self._optin = SHARED_OPTIN["sm_90"]
        return self._optin

    def variant(self, *defines: str) -> "Kernels":
        """The same backend with every kernel file compiled with `-D<define>` (a mutated kernel, or a smaller
        tile); one per set of defines."""
        v = self._variants.get(defines)
        if v is None:
            v = self._variants[defines] = Kernels(self.backend, self.xp, self.order, self.defines + tuple(defines),
                                                  self._optin)
        return v

    def fitting(self, what: str, builds: tuple[tuple[int, tuple[str, ...]], ...]) -> tuple["Kernels", int]:
        """(kernels, i) of the first of `builds` ((shared bytes a block, its -D defines), largest first) that the
        device's opt-in limit takes; none fits: a ValueError naming `what` and the bytes."""
        for i, (nbytes, defines) in enumerate(builds):
            if nbytes <= self.shared_optin:
                return (self.variant(*defines) if defines else self), i
        raise ValueError(f"{what}: the device's {self.shared_optin} B of shared memory a block hold no tile "
                         f"(the smallest takes {min(b for b, _ in builds)} B)")

    def with_shared_optin(self, limit: int) -> "Kernels":
        """The same backend as if the device let a block opt in to `limit` bytes (a smaller GPU's tiles)."""
        return Kernels(self.backend, self.xp, self.order, self.defines, int(limit))

    def fn(self, source: str, name: str):
        f = self._fns.get((source, name))
        if f is None:
            if self.defines:
                mod = _load_variant(self.backend, CUDA_SRC / source, self.defines)
            else:
                mod = load_module(self.backend, CUDA_SRC / source)
            f = self._fns[(source, name)] = mod.get_function(name)   # (a new Kernels sees edited sources)
        return f

    def empty(self, shape, dtype=np.float32):
        """An output buffer. On sim it is poisoned (NaN, or INT32_MIN for integers) so an element the kernel
        fails to write shows; on cuda it is uninitialised device memory."""
        if self.backend == "sim":
            dt = np.dtype(dtype)
            return np.full(shape, np.nan if dt.kind == "f" or dt == BF16 else np.iinfo(dt).min, dtype=dt)
        return self.xp.empty(shape, dtype=dtype)

    def launch(self, source: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        f = self.fn(source, name)
        if self.backend == "sim" and shared_mem > self.shared_optin:    # as the GPU's launch would fail
            from cupyglm.kernels.sim_errors import SimLaunchError
            raise SimLaunchError(f"{name}: {shared_mem} B of dynamic shared memory exceed the device's opt-in maximum "
                             f"of {self.shared_optin} B")
        if self.backend == "sim" and self.order is not None:
            f(grid, block, args, shared_mem=shared_mem, order=self.order)
        else:
            f(grid, block, args, shared_mem=shared_mem)

    def launch_opted(self, source: str, name: str, grid, block, args, shared_mem: int) -> None:
        """launch with `shared_mem` bytes of dynamic shared memory, the kernel's opt-in attribute raised to it first
        (a launch past 48 KiB needs it)."""
        f = self.fn(source, name)
        if f.max_dynamic_shared_size_bytes < shared_mem:
            f.max_dynamic_shared_size_bytes = shared_mem
        self.launch(source, name, grid, block, args, shared_mem=shared_mem)


def check(kernel: str, param: str, a, shape: tuple | None = None, dtype=None):
    """Refuse a wrong argument before launch, naming the kernel and parameter. Returns a."""
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise ValueError(f"{kernel}: parameter {param} must be {np.dtype(dtype)}, got {a.dtype}")
    if shape is not None:
        if len(shape) != a.ndim or any(s is not None and s != d for s, d in zip(shape, a.shape)):
            raise ValueError(f"{kernel}: parameter {param} must have shape {shape}, got {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{kernel}: parameter {param} must be C-contiguous")
    return a


def aligned16(k: Kernels, a):
    """a, or a copy of it when its data does not start on a 16-byte boundary (a view's offset)."""
    ptr = a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr
    return a if ptr % 16 == 0 else k.xp.array(a, copy=True)


def i32(v) -> np.int32:
    return np.int32(v)


def f32(v) -> np.float32:
    return np.float32(v)
