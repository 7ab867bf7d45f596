"""Launchers of cuda_src/kv.cu: rows written and read through row ids (KV pages; the embedding gather)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "kv.cu"
THREADS = 128


@op("write_rows", inplace=(0,))
def write_rows(k: Kernels, store, rows, values) -> None:
    """store[rows[i]] = values[i], in place. store: [N, C] bf16, rows: [n] int32 (distinct), values: [n, C] bf16."""
    check("write_rows", "store", store, (None, None), k.bf16)
    check("write_rows", "rows", rows, (None,), np.int32)
    check("write_rows", "values", values, (rows.shape[0], store.shape[1]), k.bf16)
    if not getattr(store.flags, "writeable", True):
        raise ValueError("write_rows: parameter store must be writeable")
    guard = guards.range_slot(k, "write_rows", "rows", rows, store.shape[0])   # the kernel counts bad ids itself
    guards.ids_distinct(k, "write_rows", "rows", rows)
    launch_write(k, store, rows, values, guard)


def launch_write(k: Kernels, store, rows, values, guard) -> None:
    """kv_write_rows: rows outside [0, N) write nothing and are counted into guard = (flags, slot) by the kernel
    (slot -1: nothing counted). Also the contract's entry point."""
    check("kv_write_rows", "flags", guard[0], (None, 2), np.uint32)
    n_store, c = store.shape
    if rows.shape[0] and c:
        k.launch(SRC, "kv_write_rows", (rows.shape[0],), (THREADS,),
                 (store, rows, values, i32(n_store), i32(c), guard[0], i32(guard[1])))


@op("write_rows_rmsnorm_keys", inplace=(0,))
def write_rows_rmsnorm_keys(k: Kernels, store, rows, x, w, eps: float, keys, kw, kb, keps: float,
                            distinct_on_host: bool = False):
    """store[rows[i]] = rmsnorm(x[i], w, eps), in place, and the call rows' index keys layer-normed, in one launch.
    store: [N, C] bf16, rows: [n] int32 (distinct), x: [n, C] bf16, w: [C] bf16; keys: [n, I] bf16, kw, kb: [I]
    bf16 -> layernorm(keys, kw, kb, keps) [n, I] bf16. distinct_on_host: the caller built the ids on the host and
    refused repeats there (model/seg_device.CallMaps), so no device check runs."""
    name = "write_rows_rmsnorm_keys"
    check(name, "store", store, (None, None), k.bf16)
    check(name, "rows", rows, (None,), np.int32)
    check(name, "x", x, (rows.shape[0], store.shape[1]), k.bf16)
    check(name, "w", w, (store.shape[1],), k.bf16)
    check(name, "keys", keys, (rows.shape[0], None), k.bf16)
    check(name, "kw", kw, (keys.shape[1],), k.bf16)
    check(name, "kb", kb, (keys.shape[1],), k.bf16)
    if not getattr(store.flags, "writeable", True):
        raise ValueError(f"{name}: parameter store must be writeable")
    guard = guards.range_slot(k, name, "rows", rows, store.shape[0])   # counted by the kernel
    if not distinct_on_host:
        guards.ids_distinct(k, name, "rows", rows)
    return launch_write_rmsnorm_keys(k, store, rows, x, w, eps, keys, kw, kb, keps, guard)


def launch_write_rmsnorm_keys(k: Kernels, store, rows, x, w, eps: float, keys, kw, kb, keps: float, guard):
    """kv_write_rows_rmsnorm_keys: launch_write's guard, each row normed before it is written (grid.y = 0), the
    keys' rows layer-normed into the returned [n, I] bf16 (grid.y = 1). Also the contract's entry point."""
    check("kv_write_rows_rmsnorm_keys", "flags", guard[0], (None, 2), np.uint32)
    n_store, c = store.shape
    n, i = keys.shape
    out = k.empty((n, i), k.bf16)                                  # [n, I] bf16 normed index keys
    if n:
        k.launch(SRC, "kv_write_rows_rmsnorm_keys", (n, 2), (THREADS,),
                 (store, rows, x, w, i32(n_store), i32(c), f32(eps), keys, kw, kb, out, i32(i), f32(keps),
                  guard[0], i32(guard[1])))
    return out


@op("read_rows")
def read_rows(k: Kernels, store, rows):
    """store[rows] -> [n, C]; store: [N, C] bf16 -> bf16."""
    check("read_rows", "store", store, (None, None), k.bf16)
    check("read_rows", "rows", rows, (None,), np.int32)
    return launch_read(k, store, rows, guards.range_slot(k, "read_rows", "rows", rows, store.shape[0]))


def launch_read(k: Kernels, store, rows, guard):
    """kv_read_rows: a row id outside [0, N) gives a NaN row and is counted into guard = (flags, slot) by the
    kernel (slot -1: nothing counted). Also the contract's entry point."""
    check("kv_read_rows", "flags", guard[0], (None, 2), np.uint32)
    n_store, c = store.shape
    out = k.empty((rows.shape[0], c), k.bf16)
    if rows.shape[0] and c:
        k.launch(SRC, "kv_read_rows", (rows.shape[0],), (THREADS,),
                 (store, rows, out, i32(n_store), i32(c), guard[0], i32(guard[1])))
    return out
