"""Contract cases of the row cache in cuda_src/gather.cu (op kv_gather_cached: mark, invalidate, copy_cached,
remap, evict, claim, keep, unmark): two decode (or verify) segments of one layer in a row, the second picking
many of the first's rows and writing a few of them.

To show where each row comes from, the case rewrites the store's rows between the two calls (a cached row
then differs from its store row, which the engine never lets happen except for the rows a call writes): the
second call's hits must read the first call's bytes, its misses and the rows it wrote the new store. Small
caches make the calls' misses clash and evict the first call's rows. Outputs are order-independent: the second
call's gathered rows, the hits and misses, every mark and cache mark after it (a cached row's entry names
it), the cached rows as a set. Controls: a neighbouring cache entry read (swapped slot), misses not kept (dropped
row), an evicted row left marked (stale mark), a written row left cached (stale hit).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import numpy_gather as ref
from cupyglm.backend.lanes import BF16, bf16
from cupyglm.contract.cases_gather import PAGE, R, _lists
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gather


def _make(t: int, w: int, num_pages: int, start: int, slots: int, cache: int):
    def make(rng):
        rows1, counts1 = _lists(rng, t, w, num_pages, start, False)
        rows2, counts2 = rows1.copy(), counts1.copy()
        rows2[:, ::3] = _lists(np.random.default_rng(5), t, w, num_pages, start, False)[0][:, ::3]   # some new rows
        n = num_pages * PAGE
        picked1 = np.unique(rows1[np.arange(w)[None, :] < counts1[:, None]])
        picked2 = np.unique(rows2[np.arange(w)[None, :] < counts2[:, None]])
        both = np.intersect1d(picked1, picked2)
        written = np.concatenate([both[-t:], np.setdiff1d(picked1, picked2)[:2]]).astype(np.int32)  # rewritten
        mk = lambda: bf16(rng.standard_normal((n, R)).astype(np.float32))           # noqa: E731
        return {"store1": mk(), "store2": mk(), "rows1": rows1, "counts1": counts1, "rows2": rows2,
                "counts2": counts2, "written1": np.zeros((0,), np.int32), "written2": written,
                "marks": np.full((n,), -1, np.int32), "slot_row": np.full((slots,), -7, np.int32),
                "slots": np.full((slots, R), np.nan, dtype=BF16), "flags": np.zeros((4,), np.int32),
                "cache": np.full((cache, R), np.nan, dtype=BF16), "cache_rows": np.full((cache,), -1, np.int32),
                "cmark": np.full((n,), -1, np.int32),
                "slot_miss": np.full((slots,), -7, np.int32), "stats": np.zeros((2,), np.int32)}
    return make


def _host(xp, a):
    return np.asarray(a if xp is np else xp.asnumpy(a))


def _out(d, ids, xp) -> dict:
    ids, slots = _host(xp, ids), _host(xp, d["slots"]).view(np.uint16)
    cache_rows, cmark = _host(xp, d["cache_rows"]), _host(xp, d["cmark"])
    held = np.flatnonzero(cmark >= 0)
    return {"gathered": np.where((ids >= 0)[..., None], slots[np.maximum(ids, 0)], np.uint16(0xFFFF)),
            "stats": _host(xp, d["stats"]), "marks": _host(xp, d["marks"]), "held": held.astype(np.int32),
            "named": (cache_rows[cmark[held]] == held).astype(np.int32),
            "cached": np.sort(cache_rows[cache_rows >= 0]),
            "cache": _host(xp, d["cache"]).view(np.uint16)[cmark[held]]}


def _two_calls(fn, d):
    ids = None
    for i in (1, 2):
        if i == 2:
            d["stats"][...] = 0
        ids = fn(d[f"store{i}"], d[f"rows{i}"], d[f"counts{i}"], d["marks"], d["slot_row"], d["slots"], d["flags"],
                 1, d[f"written{i}"], d["cache"], d["cache_rows"], d["cmark"], d["slot_miss"], d["stats"])
    return ids


def _run_k(k, d):
    return _out(d, _two_calls(lambda *a: ops_gather.kv_gather_cached(k, *a), d), k.xp)


def _replay(d):
    return _out(d, _two_calls(ref.GatherOps().kv_gather_cached, d), np)


def _variant(define: str):
    return lambda k, d: _run_k(k.variant(define), d)


def _cached(label, make, control):
    return case(Case(f"kv_gather_cached[{label}]", ("gather_mark", "gather_invalidate", "gather_copy_cached",
                                                      "gather_remap", "gather_evict", "gather_claim",
                                                      "gather_keep", "gather_unmark"),
                     make, _run_k, _replay, control))


#        label                   rows width pages start slots cache  control
_cached("decode",         _make(1,   35,  8,    90,   64, 256), _variant("GATHER_CONTROL_CACHE_SWAP"))
_cached("verify16",       _make(16,  35,  8,    96,  160, 256), _variant("GATHER_CONTROL_KEEP_DROP"))
_cached("decode-evict",   _make(1,   35,  8,    90,   64,  40), _variant("GATHER_CONTROL_EVICT_STALE"))
_cached("verify4-writes", _make(4,   35,  8,    60,   96,  96), _variant("GATHER_CONTROL_WRITTEN_HIT"))
