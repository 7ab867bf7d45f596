"""Launchers of cuda_src/kv.cu: rows written and read through row ids (KV pages; the embedding gather)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "kv.cu"
THREADS = 128


def check_ids(kernel: str, param: str, ids, limit: int) -> None:
    """Host-side arrays: every id in [0, limit) (a device array is left to the kernel's guard)."""
    if isinstance(ids, np.ndarray) and ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= limit:
            raise ValueError(f"{kernel}: parameter {param} holds ids outside [0, {limit}): {lo}..{hi}")


@op("write_rows", inplace=(0,))
def write_rows(k: Kernels, store, rows, values) -> None:
    """store[rows[i]] = values[i], in place. store: [N, C] bf16, rows: [n] int32 (distinct), values: [n, C] bf16."""
    check("write_rows", "store", store, (None, None), k.bf16)
    check("write_rows", "rows", rows, (None,), np.int32)
    check("write_rows", "values", values, (rows.shape[0], store.shape[1]), k.bf16)
    if not getattr(store.flags, "writeable", True):
        raise ValueError("write_rows: parameter store must be writeable")
    n_store, c = store.shape
    check_ids("write_rows", "rows", rows, n_store)
    if isinstance(rows, np.ndarray) and np.unique(rows).size != rows.size:
        raise ValueError("write_rows: parameter rows repeats a row id (the write order would decide it)")
    if rows.shape[0] and c:
        k.launch(SRC, "kv_write_rows", (rows.shape[0],), (THREADS,), (store, rows, values, i32(n_store), i32(c)))


@op("read_rows")
def read_rows(k: Kernels, store, rows):
    """store[rows] -> [n, C]; store: [N, C] bf16 -> bf16."""
    check("read_rows", "store", store, (None, None), k.bf16)
    check("read_rows", "rows", rows, (None,), np.int32)
    n_store, c = store.shape
    check_ids("read_rows", "rows", rows, n_store)
    out = k.empty((rows.shape[0], c), k.bf16)
    if rows.shape[0] and c:
        k.launch(SRC, "kv_read_rows", (rows.shape[0],), (THREADS,), (store, rows, out, i32(n_store), i32(c)))
    return out
