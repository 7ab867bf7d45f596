"""Contract cases of cuda_src/checks.cu (cupyglm/kernels/guards.py): the device-side launcher checks, each
on input with violations at the edges (an id equal to the limit, -1, adjacent and distant repeats, a pick row
needing exactly width + 1 slots) and on clean input.

Outputs are the flags buffer ([slots, 2] u32: count, ~first index); the replay computes it in NumPy.
Controls: on the input with violations, the kernel variant with the planted mistake (-DCHECKS_PLANT_*: the
limit passes / the neighbour is not compared / one slot too many passes); on clean input, one violation added.
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


def _pick(label: str, positions: list[int], p: int, npools: int, kpool: int, width: int, planted: bool) -> Case:
    def make(rng):
        return {"positions": np.asarray(positions, dtype=np.int32)}

    def run(k, d):
        f = _flags(k)
        guards.launch_pick_rows(k, d["positions"], f, p, npools, kpool, width, SLOT)
        return {"flags": f}

    def replay(d):
        q = np.asarray(d["positions"]).astype(np.int64)
        v = (q + 1) // kpool
        sparse = v > npools
        need = np.where(sparse, npools * kpool + (q + 1 - v * kpool), q + 1)
        neg = q < 0
        return _expect({SLOT: neg, SLOT + 1: ~neg & (need > width), SLOT + 2: ~neg & sparse & (v > p)})

    def ctl(k, d):
        f = _flags(k)
        if planted:
            guards.launch_pick_rows(k.variant("CHECKS_PLANT_PICK"), d["positions"], f, p, npools, kpool, width, SLOT)
        else:
            pos = d["positions"].copy()
            pos[0] = -1
            guards.launch_pick_rows(k, pos, f, p, npools, kpool, width, SLOT)
        return {"flags": f}

    return case(Case(f"check_pick_rows[{label}]", ("check_pick_rows",), make, run, replay, ctl))


#      label        n    limit  violations (an id equal to the limit first: the planted variant lets it pass)
_range("clean",     300,  64,   [])
_range("edges",     300,  64,   [64, -1, 64, 1 << 30])
_range("one",       1,    8,    [8])
#         label       n    repeats (index of the first, index of the repeat)
_distinct("clean",    200, [])
_distinct("repeats",  200, [(10, 11), (0, 150), (10, 199)])          # adjacent (the planted variant misses it)
#     label     positions                                      P   npools kpool width planted
_pick("clean",  [0, 5, 35, 36, 100, 139],                       40,  8,     4,    35,  False)
# width 35 = npools * kpool + kpool - 1; position 39 sees 10 pools of P = 9 (slot 3); -5 is negative (slot 1);
# a width-30 row at position 30 needs 31 = width + 1 slots (slot 2; the planted variant lets it pass)
_pick("edges",  [3, -5, 39, 12, 30, 7],                          9,  8,     4,    30,  True)
