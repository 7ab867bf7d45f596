"""erf and exact GELU in float32: the NumPy twin of cuda_src/erf_f32.cuh (same steps, same constants), so the
reference and the kernels agree bit for bit. The .cuh says how erf is built."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import exp_f32

TAYLOR = tuple(np.float32(float.fromhex(h)) for h in (     # 2/sqrt(pi) * (-1)^n / (n! (2n + 1))
    "0x1.20dd76p+0", "-0x1.812746p-2", "0x1.ce2f22p-4", "-0x1.b82ce4p-6", "0x1.565bcep-8", "-0x1.c02db4p-11",
    "0x1.f9a326p-14", "-0x1.f4d25cp-17", "0x1.b9e6cap-20", "-0x1.5f742ep-23", "0x1.fcc572p-27", "-0x1.51d718p-30",
    "0x1.9e6ad6p-34", "-0x1.d8453cp-38", "0x1.f683aep-42", "-0x1.f56f08p-46", "0x1.d70b36p-50", "-0x1.a2007ap-54",
    "0x1.5f791ap-58", "-0x1.18cc8ap-62", "0x1.ab5cc4p-67", "-0x1.3676fcp-71", "0x1.af83c2p-76", "-0x1.1f690cp-80"))
CF_DEPTH = 60
_SPLIT, _ONE_AT = np.float32(1.5), np.float32(4.0)
_RSQRT_PI = np.float32(float.fromhex("0x1.20dd76p-1"))
_SQRT2 = np.float32(float.fromhex("0x1.6a09e6p+0"))


def erf_f32(x) -> np.ndarray:
    """erf of float32 x, elementwise: bit-identical to cuda_src/erf_f32.cuh."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        t = a * a
        p = np.full_like(a, TAYLOR[-1])
        for c in TAYLOR[-2::-1]:
            p = p * t + c
        small = a * p
        ac = np.where(a < _SPLIT, _SPLIT, a)                  # the fraction only where it is used
        d = ac.copy()
        for k in range(CF_DEPTH, 0, -1):
            d = ac + np.float32(0.5 * k) / d
        big = np.float32(1.0) - exp_f32(-(ac * ac)) * _RSQRT_PI / d
    y = np.where(a < _SPLIT, small, np.where(a >= _ONE_AT, np.float32(1.0), big))
    y = np.where(y > np.float32(1.0), np.float32(1.0), y)
    return np.where(x < np.float32(0.0), -y, y).astype(np.float32)


def gelu_f32(x) -> np.ndarray:
    """Exact GELU (x * 0.5) * (1 + erf(x / sqrt 2)), float32: cuda_src/erf_f32.cuh's gelu_f32."""
    x = np.asarray(x, dtype=np.float32)
    return ((x * np.float32(0.5)) * (np.float32(1.0) + erf_f32(x / _SQRT2))).astype(np.float32)
