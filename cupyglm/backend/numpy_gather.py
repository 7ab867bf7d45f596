"""The NumPy twin of cuda_src/gather.cu (KV rows in host memory): mark, copy, remap, unmark (op kv_gather), and
the row cache's invalidate, copy_cached, keep (op kv_gather_cached; the kernels' evict, claim and keep), for
one call segment of one layer.

Slots are numbered in first-occurrence order of the flat token lists (the kernels number them in their
atomics' order); every output a caller reads through (slots[ids[t, j]], the marks after the call, the flag)
is the same either way. What must stay true: between calls every mark is -1; each picked row is copied
once; a call past the slots raises its flag word, leaves no row marked and names slot 0 for rows it could
not place (the call is refused after the step).
"""
from __future__ import annotations

import numpy as np

FREE = -1


def mark(rows: np.ndarray, counts: np.ndarray, marks: np.ndarray, slot_row: np.ndarray, flags: np.ndarray,
         which: int) -> int:
    """Claim a slot for every distinct listed row (first occurrence first); returns the slots claimed (may
    exceed len(slot_row): then flags[which] = 1 and the rows past the slots stay free)."""
    t, w = rows.shape
    listed = np.arange(w)[None, :] < np.minimum(counts, w)[:, None]
    ids = rows[listed]
    ids = ids[(ids >= 0) & (ids < marks.shape[0])]
    ids = ids[marks[ids] == FREE]
    _, first = np.unique(ids, return_index=True)
    distinct = ids[np.sort(first)]
    s = min(distinct.size, slot_row.shape[0])
    slot_row[:s] = distinct[:s]
    marks[distinct[:s]] = np.arange(s, dtype=np.int32)
    if distinct.size > s:
        flags[which] = 1
    return int(distinct.size)


def copy(store: np.ndarray, slot_row: np.ndarray, used: int, slots: np.ndarray) -> None:
    """slots[s] = store[slot_row[s]] for every used slot (bytes as they are)."""
    n = min(used, slot_row.shape[0])
    slots[:n] = store[slot_row[:n]]


def remap(rows: np.ndarray, counts: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """[T, W] int32: each listed row's slot (0 for a row without one), -1 past counts."""
    t, w = rows.shape
    listed = np.arange(w)[None, :] < np.minimum(counts, w)[:, None]
    ok = (rows >= 0) & (rows < marks.shape[0])
    s = np.where(ok, marks[np.clip(rows, 0, marks.shape[0] - 1)], FREE)
    return np.where(listed, np.maximum(s, 0), FREE).astype(np.int32)


def unmark(slot_row: np.ndarray, used: int, marks: np.ndarray) -> None:
    n = min(used, slot_row.shape[0])
    marks[slot_row[:n]] = FREE


# ---- the row cache (decode and verify segments): C direct-mapped entries per layer -----------------------------

def invalidate(written, cache_rows, cmark) -> None:
    """The rows a call wrote leave the cache (they never hit)."""
    w = written[(written >= 0) & (written < cmark.shape[0])]
    c = cmark[w]
    cache_rows[c[c >= 0]] = FREE
    cmark[w] = FREE


def copy_cached(store, slot_row, used: int, cache, cmark, slots, stats) -> np.ndarray:
    """Like copy, but rows the cache holds (cmark[row] >= 0) come from the cache; stats += (hits, misses);
    -> the used slots' miss flags [n] bool."""
    n = min(used, slot_row.shape[0])
    r = slot_row[:n]
    c = cmark[r]
    hit = c >= 0
    slots[:n] = np.where(hit[:, None], cache[np.maximum(c, 0)], store[r])
    stats[0] += int(hit.sum())
    stats[1] += int(n - hit.sum())
    return ~hit


def keep(slots, slot_row, miss, cache, cache_rows, cmark) -> None:
    """Direct-mapped: each miss takes entry row % C (of a clash the largest row wins), evicting its row; hits stay."""
    c = cache.shape[0]
    r = slot_row[:miss.size][miss]
    e = r % c
    old = cache_rows[e]
    cmark[old[old >= 0]] = FREE
    cache_rows[e] = FREE
    win = np.full((c,), FREE, dtype=np.int32)
    np.maximum.at(win, e, r)
    k = win[e] == r
    cache[e[k]] = slots[:miss.size][miss][k]
    cache_rows[e[k]] = r[k]
    cmark[r[k]] = e[k].astype(np.int32)


class GatherOps:
    """The ops interface's gathers (NumpyOps inherits them; sim and cuda replace them with the kernels)."""

    def kv_gather(self, store, rows, counts, marks, slot_row, slots, flags, which: int):
        """One segment's rows of one layer gathered into device slots. store: [N, R] bf16 (host rows),
        rows: [T, W] int32 store row ids (-1 padded), counts: [T] int32, marks: [N] int32 (all -1, left so),
        slot_row: [S] int32, slots: [S, R] bf16 (written), flags: [F] int32 (flags[which] = 1 when the
        segment needs more than S slots) -> [T, W] int32 slot ids, -1 padded."""
        used = mark(rows, counts, marks, slot_row, flags, which)
        copy(store, slot_row, used, slots)
        out = remap(rows, counts, marks)
        unmark(slot_row, used, marks)
        return out

    def kv_gather_cached(self, store, rows, counts, marks, slot_row, slots, flags, which: int, written, cache,
                         cache_rows, cmark, slot_miss, stats):
        """kv_gather for a decode or verify segment through one layer's row cache. written: [n] int32 the store
        rows this call wrote (they leave the cache first), cache: [C, R] bf16, cache_rows: [C] int32, cmark: [N]
        int32, slot_miss: [S] int32 (the kernels' scratch), stats: [2] int32 (+= hits, misses); afterwards each
        miss holds its entry row % C (the largest row of a clash)."""
        used = mark(rows, counts, marks, slot_row, flags, which)
        invalidate(written, cache_rows, cmark)
        miss = copy_cached(store, slot_row, used, cache, cmark, slots, stats)
        out = remap(rows, counts, marks)
        keep(slots, slot_row, miss, cache, cache_rows, cmark)
        unmark(slot_row, used, marks)
        return out

    def kv_cache_invalidate(self, written, cache_rows, cmark):
        """A prompt chunk's written store rows [n] int32 leave one layer's row cache."""
        invalidate(written, cache_rows, cmark)
