"""The arithmetic identity of a rank: which bits its kernels produce. ARITHMETIC names the project's reduction
orders and roundings (bump it whenever any backend's order or rounding changes: kept states and ranks of another
arithmetic are refused by name); the tensor core's architecture names the mma model the bits follow: on cuda
the device's own (its hardware), on numpy and sim the model the CPU runs (tensor_core.DEFAULT_ARCH).

    identity("numpy")  -> "arithmetic 3, tensor core sm_90"
"""
from __future__ import annotations

from cupyglm.backend.tensor_core import DEFAULT_ARCH, model_for

ARITHMETIC = 3


def tc_arch(backend: str) -> str:
    """The tensor core whose arithmetic `backend` follows: the current cupy device's sm on cuda."""
    if backend != "cuda":
        return DEFAULT_ARCH
    try:
        import cupy
        return f"sm_{cupy.cuda.Device().compute_capability}"
    except Exception:               # no cupy or no device: no tensor core this rank could name
        return "sm_none"


def identity(backend: str) -> str:
    return f"arithmetic {ARITHMETIC}, tensor core {tc_arch(backend)}"


def unconfirmed_note(backend: str) -> str | None:
    """One startup line where the tensor core of `backend` has no confirmed model, else None."""
    arch = tc_arch(backend)
    m = model_for(arch)
    if m is not None and m.confirmed:
        return None
    why = "no model of its tensor core" if m is None else f"an unconfirmed model of its tensor core ({m.source})"
    return (f"tensor core: {arch} has {why}; the cuda contract there is GPU against GPU (row invariance, "
            f"determinism) and numpy's bits are a tolerance away, not equal")
