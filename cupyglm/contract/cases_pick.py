"""Contract cases of cuda_src/pick.cu (op pick): rows on both sides of the dense limit, tied and zero scores
(relu makes many exact zeros; -0.0 ties +0.0), pools a row cannot see yet poisoned with NaN, and a window past
any shared-memory cap (the radix select keeps no per-pool state).

Control: a stale score row (the scores of an earlier step, as if the pick read scores before they were
updated).

pick.flags: the kernel counting its rows' failed preconditions into guard slots itself (a negative position, a
list one slot longer than width, a sparse row seeing more pools than P), staying inside its rows (sim checks
every address); outputs the flags and the lists of the rows that pass. Control: the variant PICK_PLANT_FLAG
(a list exactly one slot too long is not counted)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_pick

REF = NumpyOps()


def _scores(rng, positions, pools, kpool):
    s = np.maximum(rng.standard_normal((len(positions), pools)), 0).astype(np.float32)
    s = np.round(s * 4) / 4                                          # few values: ties
    s = s.astype(np.float32)
    s[:, 1::7] *= -1                                                 # -0.0 ties +0.0; negative scores
    for r, q in enumerate(positions):
        s[r, (q + 1) // kpool:] = np.nan                             # not visible to this row: never read
    return s


def _pick(label: str, positions, pools: int, npools: int, kpool: int = 4) -> Case:
    positions = np.asarray(positions, dtype=np.int64)
    width = npools * kpool + kpool - 1

    def make(rng):
        return {"scores": _scores(rng, positions, pools, kpool), "positions": positions.copy(),
                "stale": _scores(rng, positions, pools, kpool)}

    def run(k, d):
        tok, cnt = ops_pick.pick(k, d["scores"], d["positions"], npools, kpool, width)
        return {"tokens": tok, "counts": cnt}

    def replay(d):
        tok, cnt = REF.pick(d["scores"], d["positions"], npools, kpool, width)
        return {"tokens": tok, "counts": cnt}

    def ctl(k, d):
        tok, cnt = ops_pick.pick(k, d["stale"], d["positions"], npools, kpool, width)
        return {"tokens": tok, "counts": cnt}

    return case(Case(f"pick[{label}]", ("dsa_pick",), make, run, replay, ctl))


#      label       positions                          pools npools
_pick("decode",   [100],                                  32,   8)      # tiny model: 8 pools of 4
_pick("verify",   list(range(30, 46)),                    16,   8)      # 16 rows across the dense limit (35)
_pick("prompt64", list(range(64)),                        16,   8)      # a prompt chunk from position 0
_pick("long",     [1000, 1001, 1203, 1207, 1211],        303,  64)      # 64 of up to 303 pools, width 259
_pick("window",   [200_003, 196_611],                 50_001, 300)      # past the old kernel's 49,152-pool cap


SLOTS, SLOT = 5, 1             # guards.PICK_MESSAGES' 3 slots from slot 1 (slot 0 must stay clear)


def _flags_case(label: str, positions, p: int, npools: int, kpool: int) -> Case:
    positions = np.asarray(positions, dtype=np.int32)
    width = npools * kpool                                           # the least the launcher allows
    q = positions.astype(np.int64)
    v = (q + 1) // kpool
    sparse = v > npools
    need = np.where(sparse, npools * kpool + (q + 1 - v * kpool), q + 1)
    bad = [q < 0, (q >= 0) & (need > width), (q >= 0) & sparse & (v > p)]
    good = np.flatnonzero(~(bad[0] | bad[1] | bad[2]))

    def make(rng):
        return {"scores": _scores(rng, np.maximum(positions, 0), p, kpool), "positions": positions.copy()}

    def launch(kn, dd, variant):
        t = positions.shape[0]
        tok, cnt = kn.empty((t, width), np.int32), kn.empty((t,), np.int32)
        flags = kn.xp.zeros((SLOTS, 2), dtype=np.uint32)
        kv = kn.variant("PICK_PLANT_FLAG") if variant else kn
        ops_pick.launch(kv, dd["scores"], dd["positions"], tok, cnt, npools, kpool, width, (flags, SLOT))
        g = kn.xp.asarray(good)
        return {"tokens": tok[g], "counts": cnt[g], "flags": flags}

    def replay(dd):
        tok, cnt = REF.pick(dd["scores"][good], dd["positions"][good], npools, kpool, width)
        f = np.zeros((SLOTS, 2), dtype=np.uint32)
        for i, b in enumerate(bad):
            idx = np.flatnonzero(b)
            if idx.size:
                f[SLOT + i] = (idx.size, ~np.uint32(idx.min()))
        return {"tokens": tok, "counts": cnt, "flags": f}

    return case(Case(f"pick.flags[{label}]", ("dsa_pick",), make,
                     lambda kn, dd: launch(kn, dd, False), replay, lambda kn, dd: launch(kn, dd, True)))


# width 32 = npools * kpool: position 32 is dense and needs 33 = width + 1 slots (the planted variant lets it
# pass), position 36 sparse and needs 33; position 39 sees 10 pools of P = 9; -5 is negative.
_flags_case("edges", [3, -5, 39, 12, 32, 7, 36, 35, 31], 9, 8, 4)
