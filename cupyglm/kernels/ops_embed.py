"""Launchers of cuda_src/embed.cu: the token embedding gather."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "embed.cu"
THREADS = 128


def check_ids(kernel: str, param: str, ids, limit: int) -> None:
    """Host-side arrays: every id in [0, limit) (a device array is left to the kernel's guard)."""
    if isinstance(ids, np.ndarray) and ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= limit:
            raise ValueError(f"{kernel}: parameter {param} holds ids outside [0, {limit}): {lo}..{hi}")


@op("embed")
def embed(k: Kernels, table, ids):
    """[V, D] bf16, [T] int32 -> [T, D] bf16."""
    check("embed", "table", table, (None, None), np.float32)
    check("embed", "ids", ids, (None,), np.int32)
    v, d = table.shape
    check_ids("embed", "ids", ids, v)
    out = k.empty((ids.shape[0], d), np.float32)
    if ids.shape[0] and d:
        k.launch(SRC, "embed_rows", (ids.shape[0],), (THREADS,), (table, ids, out, i32(v), i32(d)))
    return out
