"""Random bf16 inputs and bit patterns for the kernel tests' bit-for-bit comparisons."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16


def bf(rng, shape, std=1.0) -> np.ndarray:
    """Standard normal values times std, rounded to bf16 (the backend's bf16 array)."""
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def bits(a) -> np.ndarray:
    """Bit patterns: uint16 of a 2-byte array (bf16), else uint32 of its float32 values."""
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
