"""Kernel loading for cupyglm: the same ``cuda_src/*.cu`` files on the GPU and on the CPU.

    from cupyglm.kernels import load_module, kernel_names, CUDA_SRC
    mod = load_module("sim", CUDA_SRC / "selftest.cu")   # or "cuda"
    fn = mod.get_function("block_reduce_sum")
    fn(grid, block, args, shared_mem=0)

* backend ``"cuda"``: :class:`cupyglm.kernels.cuda.CudaModule` (NVRTC + cupy.RawModule);
  ``get_function`` returns a ``cupy.RawKernel``.
* backend ``"sim"``: :class:`cupyglm.kernels.sim.SimModule` (CPU emulator);
  ``get_function`` returns a :class:`cupyglm.kernels.sim.SimFunction` with the
  same call shape, taking numpy arrays and exactly-typed numpy scalars.

Both modules are cached per process and per source version.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"
BACKENDS = ("cuda", "sim")

__all__ = ["CUDA_SRC", "BACKENDS", "KernelModule", "load_module", "kernel_names", "source_path"]


class KernelModule(Protocol):
    def get_function(self, name: str): ...


def source_path(name: str) -> Path:
    """``cuda_src/<name>`` (``.cu`` appended when missing)."""
    p = CUDA_SRC / name
    return p if p.suffix else p.with_suffix(".cu")


def load_module(backend: str, path: str | os.PathLike) -> KernelModule:
    """Load a kernel file for backend ``"cuda"`` or ``"sim"``."""
    if backend == "sim":
        from . import sim

        return sim.load_module(path)
    if backend == "cuda":
        from . import cuda

        return cuda.load_module(path)
    raise ValueError(f"unknown kernel backend {backend!r} (expected one of {BACKENDS})")


def kernel_names(path: str | os.PathLike) -> list[str]:
    """The ``extern "C" __global__`` kernel names defined in a .cu file, in source order."""
    from .sim_build import find_kernels

    return [k.name for k in find_kernels(Path(path).read_text(encoding="utf-8"))]
