"""Contract cases of cuda_src/checks.cu (cupyglm/kernels/guards.py): the device-side launcher checks, each
on input with violations at the edges (an id equal to the limit, -1, adjacent and distant repeats) and on clean
input. (The pick's rows are checked by dsa_pick itself: cases_pick.py.)

Outputs are the flags buffer ([slots, 2] u32: count, ~first index); the replay computes it in NumPy.
Controls: on the input with violations, the kernel variant with the planted mistake (-DCHECKS_PLANT_*: the
limit passes / the neighbour is not compared); on clean input, one violation added.
"""
from __future__ import annotations

import numpy as np

from cupyglm.contract.registry import Case, case
from cupyglm.kernels import guards

SLOTS = 4
SLOT = 1                   # the checks write from slot 1 (slot 0 must stay clear: the slot argument is honoured)


def _flags(k):
    return k.xp.zeros((SLOTS, 2), dtype=np.uint32)


def _expect(bad_by_slot: dict[int, np.ndarray]) -> dict:
    f = np.zeros((SLOTS, 2), dtype=np.uint32)
    for s, bad in bad_by_slot.items():
        idx = np.flatnonzero(bad)
        if idx.size:
            f[s] = (idx.size, ~np.uint32(idx.min()))
    return {"flags": f}


def _range(label: str, n: int, limit: int, bad: list[int]) -> Case:
    def make(rng):
        ids = rng.integers(0, limit, n).astype(np.int32)
        for j, v in enumerate(bad):
            ids[(7 * j + 3) % n] = v
        return {"ids": ids}

    def run(k, d):
        f = _flags(k)
        guards.launch_range(k, d["ids"], f, limit, SLOT)
        return {"flags": f}

    def replay(d):
        ids = np.asarray(d["ids"])
        return _expect({SLOT: (ids < 0) | (ids >= limit)})

    def ctl(k, d):
        f = _flags(k)
        if bad:
            guards.launch_range(k.variant("CHECKS_PLANT_RANGE"), d["ids"], f, limit, SLOT)
        else:
            ids = d["ids"].copy()
            ids[n // 2] = limit
            guards.launch_range(k, ids, f, limit, SLOT)
        return {"flags": f}

    return case(Case(f"check_ids_range[{label}]", ("check_ids_range",), make, run, replay, ctl))


def _distinct(label: str, n: int, repeats: list[tuple[int, int]]) -> Case:
    def make(rng):
        ids = rng.permutation(4 * n)[:n].astype(np.int32)
        for a, b in repeats:
            ids[b] = ids[a]
        return {"ids": ids}

    def run(k, d):
        f = _flags(k)
        guards.launch_distinct(k, d["ids"], f, SLOT)
        return {"flags": f}

    def replay(d):
        ids = np.asarray(d["ids"])
        first = np.array([ids[i] in ids[:i] for i in range(ids.size)], dtype=bool)
        return _expect({SLOT: first})

    def ctl(k, d):
        f = _flags(k)
        if repeats:
            guards.launch_distinct(k.variant("CHECKS_PLANT_DISTINCT"), d["ids"], f, SLOT)
        else:
            ids = d["ids"].copy()
            ids[-1] = ids[0]
            guards.launch_distinct(k, ids, f, SLOT)
        return {"flags": f}

    return case(Case(f"check_ids_distinct[{label}]", ("check_ids_distinct",), make, run, replay, ctl))


#      label        n    limit  violations (an id equal to the limit first: the planted variant lets it pass)
_range("clean",     300,  64,   [])
_range("edges",     300,  64,   [64, -1, 64, 1 << 30])
_range("one",       1,    8,    [8])
#         label       n    repeats (index of the first, index of the repeat)
_distinct("clean",    200, [])
_distinct("repeats",  200, [(10, 11), (0, 150), (10, 199)])          # adjacent (the planted variant misses it)
