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


class Kernels:
    """What a launcher needs: the backend's kernel modules (one per .cu file) and its array module.

    `defines` (planted controls only): compile every module with these extra -D macros.
    `bf16`: the dtype of a bf16 array on this backend (ml_dtypes.bfloat16 on sim, uint16 bit patterns on cuda);
    every launcher checks its bf16 parameters against it."""

    def __init__(self, backend: str, xp, order: str | None = None, defines: tuple[str, ...] = ()):
        self.backend, self.xp, self.order, self.defines = backend, xp, order, tuple(defines)
        self.bf16 = BF16_BITS if backend == "cuda" else BF16
        self._fns: dict[tuple[str, str], object] = {}

    def variant(self, *defines: str) -> "Kernels":
        """The same backend with every kernel file compiled with `-D<define>` (a mutated kernel)."""
        return Kernels(self.backend, self.xp, self.order, self.defines + tuple(defines))

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
        if self.backend == "sim" and self.order is not None:
            f(grid, block, args, shared_mem=shared_mem, order=self.order)
        else:
            f(grid, block, args, shared_mem=shared_mem)


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


def i32(v) -> np.int32:
    return np.int32(v)


def f32(v) -> np.float32:
    return np.float32(v)
