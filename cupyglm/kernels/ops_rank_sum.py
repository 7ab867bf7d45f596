"""Launcher of cuda_src/rank_sum.cu: a collective's gathered partials added in rank order, one kernel."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "rank_sum.cu"
THREADS = 256
MAX_BLOCKS = 1024          # a grid-stride loop covers the rest; each element is its own chain, so no bit moves


@op("rank_sum")
def rank_sum(k: Kernels, parts):
    """parts [R, ...] fp32 or bf16 (R >= 1, rank r's partial at row r) -> [...] in parts' dtype: ((p0 + p1) + p2)
    + ..., bf16 rounded after every add (NumpyOps.rank_sum)."""
    if parts.ndim < 1 or parts.shape[0] < 1:
        raise ValueError(f"rank_sum: parameter parts must be [ranks, ...] with ranks >= 1, got {tuple(parts.shape)}")
    if parts.dtype == np.float32:
        name = "rank_sum_f32"
    elif parts.dtype == k.bf16:
        name = "rank_sum_bf16"
    else:
        raise ValueError(f"rank_sum: parameter parts must be float32 or bf16 ({k.bf16}), got {parts.dtype}")
    check(name, "parts", parts)
    ranks = int(parts.shape[0])
    n = int(np.prod(parts.shape[1:], dtype=np.int64))
    if n >= 2**31:
        raise ValueError(f"rank_sum: a part of {n} elements does not fit the kernel's int32 index")
    out = k.empty(parts.shape[1:], parts.dtype)
    if n:
        blocks = min(MAX_BLOCKS, -(-n // THREADS))
        k.launch(SRC, name, (blocks,), (THREADS,), (parts, out, i32(ranks), i32(n)))
    return out
