"""Launchers of cuda_src/gather.cu (KV rows in host memory), one per kernel, and the op `kv_gather` that runs
them in stream order for one call segment of one layer (NumpyOps.kv_gather's signature).

No host read of a device value: the slots a call claims stay on the device, so copy and unmark are launched
over `bound` = min(S, N, T * W) warps / threads, the most a call can use, and the ones past the count exit.
"""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "gather.cu"
THREADS = 128
WARPS = THREADS // 32


def _words(k: Kernels, kernel: str, name: str, a):
    """A bf16 [n, R] array as [n, R / 2] 32-bit words (the rows are copied as words)."""
    check(kernel, name, a, (None, None), k.bf16)
    if a.shape[1] % 2:
        raise ValueError(f"{kernel}: parameter {name} must have an even row width, got {a.shape[1]}")
    return a.view(np.uint32)


def launch_mark(k: Kernels, rows, counts, marks, slot_row, used, flags, which: int) -> None:
    t, w = check("gather_mark", "rows", rows, (None, None), np.int32).shape
    check("gather_mark", "counts", counts, (t,), np.int32)
    check("gather_mark", "marks", marks, (None,), np.int32)
    check("gather_mark", "slot_row", slot_row, (None,), np.int32)
    check("gather_mark", "used", used, (1,), np.int32)
    check("gather_mark", "flags", flags, (None,), np.int32)
    if not 0 <= which < flags.shape[0]:
        raise ValueError(f"gather_mark: parameter which={which} outside the {flags.shape[0]} flag words")
    if t and w:
        k.launch(SRC, "gather_mark", (t,), (THREADS,), (rows, counts, marks, slot_row, used, flags, i32(t), i32(w),
                                                        i32(marks.shape[0]), i32(slot_row.shape[0]), i32(which)))


def launch_copy(k: Kernels, store, slot_row, used, slots, bound: int) -> None:
    src, dst = _words(k, "gather_copy", "store", store), _words(k, "gather_copy", "slots", slots)
    check("gather_copy", "slot_row", slot_row, (slots.shape[0],), np.int32)
    check("gather_copy", "used", used, (1,), np.int32)
    if store.shape[1] != slots.shape[1]:
        raise ValueError(f"gather_copy: store rows hold {store.shape[1]} values, slots {slots.shape[1]}")
    if bound > 0 and src.shape[1]:
        k.launch(SRC, "gather_copy", (-(-bound // WARPS),), (THREADS,),
                 (src, slot_row, used, dst, i32(store.shape[0]), i32(slots.shape[0]), i32(src.shape[1])))


def launch_remap(k: Kernels, rows, counts, marks):
    t, w = check("gather_remap", "rows", rows, (None, None), np.int32).shape
    check("gather_remap", "counts", counts, (t,), np.int32)
    check("gather_remap", "marks", marks, (None,), np.int32)
    out = k.empty((t, w), np.int32)
    if t and w:
        k.launch(SRC, "gather_remap", (t,), (THREADS,), (rows, counts, marks, out, i32(t), i32(w), i32(marks.shape[0])))
    return out


def launch_unmark(k: Kernels, slot_row, used, marks, bound: int) -> None:
    check("gather_unmark", "slot_row", slot_row, (None,), np.int32)
    check("gather_unmark", "used", used, (1,), np.int32)
    check("gather_unmark", "marks", marks, (None,), np.int32)
    if bound > 0:
        k.launch(SRC, "gather_unmark", (-(-bound // THREADS),), (THREADS,),
                 (slot_row, used, marks, i32(marks.shape[0]), i32(slot_row.shape[0])))


def bound_of(rows, marks, slot_row) -> int:
    """The most slots one call can claim: its listed ids, the store's rows and the slots bound it."""
    return min(slot_row.shape[0], marks.shape[0], rows.shape[0] * rows.shape[1])


@op("kv_gather", inplace=(0, 3, 4, 5, 6))
def kv_gather(k: Kernels, store, rows, counts, marks, slot_row, slots, flags, which):
    """NumpyOps.kv_gather on the kernels: mark, copy, remap, unmark; -> [T, W] int32 slot ids."""
    if slots.shape[0] < 1:
        raise ValueError("kv_gather: parameter slots must hold at least one slot")
    if marks.shape[0] != store.shape[0]:
        raise ValueError(f"kv_gather: marks has {marks.shape[0]} rows, the store {store.shape[0]}")
    used = k.xp.zeros((1,), dtype=np.int32)                 # [1] i32 slots claimed by this call
    bound = bound_of(rows, marks, slot_row)
    launch_mark(k, rows, counts, marks, slot_row, used, flags, int(which))
    launch_copy(k, store, slot_row, used, slots, bound)
    out = launch_remap(k, rows, counts, marks)
    launch_unmark(k, slot_row, used, marks, bound)
    return out


# ---- the row cache of decode and verify segments -------------------------------------------------------------

def launch_invalidate(k: Kernels, written, cache_rows, cmark) -> None:
    n = check("gather_invalidate", "written", written, (None,), np.int32).shape[0]
    check("gather_invalidate", "cache_rows", cache_rows, (None,), np.int32)
    check("gather_invalidate", "cmark", cmark, (None,), np.int32)
    if n:
        k.launch(SRC, "gather_invalidate", (-(-n // THREADS),), (THREADS,),
                 (written, cache_rows, cmark, i32(n), i32(cmark.shape[0]), i32(cache_rows.shape[0])))


def launch_copy_cached(k: Kernels, store, slot_row, used, cache, cmark, slots, stats, slot_miss, bound: int) -> None:
    src, dst = _words(k, "gather_copy_cached", "store", store), _words(k, "gather_copy_cached", "slots", slots)
    cw = _words(k, "gather_copy_cached", "cache", cache)
    check("gather_copy_cached", "slot_row", slot_row, (slots.shape[0],), np.int32)
    check("gather_copy_cached", "used", used, (1,), np.int32)
    check("gather_copy_cached", "cmark", cmark, (store.shape[0],), np.int32)
    check("gather_copy_cached", "stats", stats, (2,), np.int32)
    check("gather_copy_cached", "slot_miss", slot_miss, (slots.shape[0],), np.int32)
    if not store.shape[1] == slots.shape[1] == cache.shape[1]:
        raise ValueError("gather_copy_cached: store, cache and slots rows must hold the same values")
    if bound > 0 and src.shape[1]:
        k.launch(SRC, "gather_copy_cached", (-(-bound // WARPS),), (THREADS,),
                 (src, slot_row, used, cw, cmark, dst, stats, slot_miss, i32(store.shape[0]), i32(slots.shape[0]),
                  i32(cache.shape[0]), i32(src.shape[1])))


def _per_miss(kernel: str, slot_row, used, slot_miss, cache_rows, cmark) -> None:
    check(kernel, "slot_row", slot_row, (None,), np.int32)
    check(kernel, "used", used, (1,), np.int32)
    check(kernel, "slot_miss", slot_miss, (slot_row.shape[0],), np.int32)
    check(kernel, "cache_rows", cache_rows, (None,), np.int32)
    check(kernel, "cmark", cmark, (None,), np.int32)


def launch_evict(k: Kernels, slot_row, used, slot_miss, cache_rows, cmark, bound: int) -> None:
    _per_miss("gather_evict", slot_row, used, slot_miss, cache_rows, cmark)
    if bound > 0 and cache_rows.shape[0]:
        k.launch(SRC, "gather_evict", (-(-bound // THREADS),), (THREADS,),
                 (slot_row, used, slot_miss, cache_rows, cmark, i32(cmark.shape[0]), i32(slot_row.shape[0]),
                  i32(cache_rows.shape[0])))


def launch_claim(k: Kernels, slot_row, used, slot_miss, cache_rows, cmark, bound: int) -> None:
    _per_miss("gather_claim", slot_row, used, slot_miss, cache_rows, cmark)
    if bound > 0 and cache_rows.shape[0]:
        k.launch(SRC, "gather_claim", (-(-bound // THREADS),), (THREADS,),
                 (slot_row, used, slot_miss, cache_rows, i32(cmark.shape[0]), i32(slot_row.shape[0]),
                  i32(cache_rows.shape[0])))


def launch_keep(k: Kernels, slots, slot_row, used, slot_miss, cache, cache_rows, cmark, bound: int) -> None:
    src, dst = _words(k, "gather_keep", "slots", slots), _words(k, "gather_keep", "cache", cache)
    _per_miss("gather_keep", slot_row, used, slot_miss, cache_rows, cmark)
    check("gather_keep", "slot_row", slot_row, (slots.shape[0],), np.int32)
    check("gather_keep", "cache_rows", cache_rows, (cache.shape[0],), np.int32)
    if bound > 0 and src.shape[1] and cache.shape[0]:
        k.launch(SRC, "gather_keep", (-(-bound // WARPS),), (THREADS,),
                 (src, slot_row, used, slot_miss, dst, cache_rows, cmark, i32(cmark.shape[0]), i32(slots.shape[0]),
                  i32(cache.shape[0]), i32(src.shape[1])))


@op("kv_gather_cached", inplace=(0, 3, 4, 5, 6, 9, 10, 11, 12, 13))
def kv_gather_cached(k: Kernels, store, rows, counts, marks, slot_row, slots, flags, which, written, cache,
                     cache_rows, cmark, slot_miss, stats):
    """NumpyOps.kv_gather_cached on the kernels: mark, invalidate, copy_cached, remap, evict, claim, keep,
    unmark."""
    if slots.shape[0] < 1:
        raise ValueError("kv_gather_cached: parameter slots must hold at least one slot")
    used = k.xp.zeros((1,), dtype=np.int32)
    bound = bound_of(rows, marks, slot_row)
    launch_mark(k, rows, counts, marks, slot_row, used, flags, int(which))
    launch_invalidate(k, written, cache_rows, cmark)
    launch_copy_cached(k, store, slot_row, used, cache, cmark, slots, stats, slot_miss, bound)
    out = launch_remap(k, rows, counts, marks)
    launch_evict(k, slot_row, used, slot_miss, cache_rows, cmark, bound)
    launch_claim(k, slot_row, used, slot_miss, cache_rows, cmark, bound)
    launch_keep(k, slots, slot_row, used, slot_miss, cache, cache_rows, cmark, bound)
    launch_unmark(k, slot_row, used, marks, bound)
    return out


@op("kv_cache_invalidate", inplace=(1, 2))
def kv_cache_invalidate(k: Kernels, written, cache_rows, cmark):
    """NumpyOps.kv_cache_invalidate on the kernel: a prompt chunk's written rows leave one layer's row cache."""
    launch_invalidate(k, written, cache_rows, cmark)
