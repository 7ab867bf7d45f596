"""Backends behind one ops interface (DESIGN §2): numpy (the reference), sim (cuda_src on the CPU
emulator), cuda (cuda_src through cupy.RawModule).
"""
from __future__ import annotations


class BackendError(RuntimeError):
    pass


def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.is_available()
    except Exception:       # no cupy, no driver, no device: all mean "not available"
        return False


def resolve(name: str) -> tuple[str, str]:
    """The backend to run and a one-line note for the startup log."""
    if name == "auto":
        if cuda_available():
            return "cuda", "backend auto: CUDA device found, using cuda"
        return "numpy", "backend auto: no CUDA device, using numpy"
    if name == "cuda" and not cuda_available():
        raise BackendError("--backend cuda: no CUDA device (cupy is missing or sees no GPU); "
                           "use --backend numpy or sim on this machine")
    if name not in ("numpy", "sim", "cuda"):
        raise BackendError(f"unknown backend {name!r} (auto, numpy, sim, cuda)")
    return name, f"backend {name}"


def make_ops(name: str):
    """The ops object of a resolved backend name."""
    if name == "numpy":
        from cupyglm.backend.numpy_ops import NumpyOps
        return NumpyOps()
    if name == "sim":
        from cupyglm.backend.sim_ops import SimOps
        return SimOps()
    if name == "cuda":
        from cupyglm.backend.cuda_ops import CudaOps
        return CudaOps()
    raise BackendError(f"unknown backend {name!r}")
