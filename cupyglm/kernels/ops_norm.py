"""Launchers of cuda_src/norm.cu: rmsnorm and layernorm over the last axis, lane-16 sums; bf16 in and out."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "norm.cu"
THREADS = 128


def _rows(k: Kernels, name: str, x, w):
    check(name, "x", x, None, k.bf16)
    if x.ndim < 1:
        raise ValueError(f"{name}: parameter x must have at least one axis, got a scalar")
    d = x.shape[-1]
    check(name, "w", w, (d,), k.bf16)
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    return d, rows


@op("rmsnorm")
def rmsnorm(k: Kernels, x, w, eps: float):
    """Llama form per row: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))). x: [..., D]."""
    d, rows = _rows(k, "rmsnorm", x, w)
    out = k.empty(x.shape, k.bf16)
    if rows and d:
        k.launch(SRC, "rmsnorm_rows", (rows,), (THREADS,), (x, w, out, i32(d), f32(eps)))
    return out


@op("layernorm")
def layernorm(k: Kernels, x, w, b, eps: float):
    """bf16(((x - mean) * rsqrt(var + eps)) * w + b), population variance, per row. x: [..., D]."""
    d, rows = _rows(k, "layernorm", x, w)
    check("layernorm", "b", b, (d,), k.bf16)
    out = k.empty(x.shape, k.bf16)
    if rows and d:
        k.launch(SRC, "layernorm_rows", (rows,), (THREADS,), (x, w, b, out, i32(d), f32(eps)))
    return out
