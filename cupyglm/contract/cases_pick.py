"""Contract cases of cuda_src/pick.cu (op pick): rows on both sides of the dense limit, tied and zero scores
(relu makes many exact zeros; -0.0 ties +0.0), pools a row cannot see yet poisoned with NaN, and a window past
any shared-memory cap (the radix select keeps no per-pool state).

Control: a stale score row (the scores of an earlier step, as if the pick read scores before they were
updated).

pick.parts: rows of one part and of several (ops_pick.PART pools a dsa_pick block, then dsa_pick_merge), a last
part of one pool, exact ties cut across a part boundary, a row of +0/-0 ties only; the same rows each alone in
its own call with scores exactly its visible pools wide (another grid, the same ids). Controls: the variants
PICK_PLANT_TIE_HIGH (equal keys taken from the highest pool), PICK_PLANT_MERGE_ORDER (the merge reads the parts
last first) and PICK_PLANT_RANGE (a later part's range starts one pool late).

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

    kernels = ("dsa_pick", "dsa_pick_merge") if pools > ops_pick.PART else ("dsa_pick",)
    return case(Case(f"pick[{label}]", kernels, make, run, replay, ctl))


#      label       positions                          pools npools
_pick("decode",   [100],                                  32,   8)      # tiny model: 8 pools of 4
_pick("verify",   list(range(30, 46)),                    16,   8)      # 16 rows across the dense limit (35)
_pick("prompt64", list(range(64)),                        16,   8)      # a prompt chunk from position 0
_pick("long",     [1000, 1001, 1203, 1207, 1211],        303,  64)      # 64 of up to 303 pools, width 259
_pick("window",   [200_003, 196_611],                 50_001, 300)      # past the old kernel's 49,152-pool cap



# pick.parts rows (visible pools v, position 4 v - 1 + extra): dense; exactly one part; a last part of one pool
# (its pool the best); two full parts; the tie-cut row; +0/-0 ties only.
_PART = ops_pick.PART
_PARTS_V = (25, _PART, _PART + 1, 2 * _PART, 3 * _PART + 100, 2 * _PART + 3)
_PARTS_POS = np.array([4 * v - 1 + e for v, e in zip(_PARTS_V, (2, 2, 0, 3, 1, 0))], dtype=np.int64)
_PARTS_P, _PARTS_N = 3 * _PART + 120, 64


def _parts_scores(rng) -> np.ndarray:
    s = _scores(rng, _PARTS_POS, _PARTS_P, 4)
    s[2, _PART] = 40.0                                               # the lone pool of the last part
    cut = (rng.standard_normal(_PARTS_V[4]) - 10).astype(np.float32)  # all below the planted values
    edges = [2 * _PART - 1, 2 * _PART, 3 * _PART - 1, 3 * _PART]     # picked pools on part boundaries
    free = np.setdiff1d(np.arange(_PARTS_V[4]), np.r_[_PART - 10:_PART + 10, edges])
    cut[np.r_[edges, rng.choice(free, _PARTS_N - 4 - len(edges), replace=False)]] = 30.0
    cut[_PART - 2:_PART + 6] = 25.0                                  # 8 ties, 4 taken: 2 each side of the edge
    s[4, :_PARTS_V[4]] = cut
    zeros = np.zeros(_PARTS_V[5], dtype=np.float32)
    zeros[1::2] = -0.0
    s[5, :_PARTS_V[5]] = zeros
    return s


def _parts_case(label: str, ctl_define: str | None) -> Case:
    width = _PARTS_N * 4 + 3

    def make(rng):
        return {"scores": _parts_scores(rng), "positions": _PARTS_POS.copy(), "stale": _parts_scores(rng)}

    def run(kn, d, define=None, key="scores"):
        kv = kn.variant(define) if define else kn
        tok, cnt = ops_pick.pick(kv, d[key], d["positions"], _PARTS_N, 4, width)
        return {"tokens": tok, "counts": cnt}

    def replay(d):
        tok, cnt = REF.pick(d["scores"], d["positions"], _PARTS_N, 4, width)
        return {"tokens": tok, "counts": cnt}

    def alone(kn, d, key="scores"):                                 # each row its own call, scores v wide
        xp = kn.xp
        outs = [ops_pick.pick(kn, xp.ascontiguousarray(d[key][r:r + 1, :v]), d["positions"][r:r + 1], _PARTS_N, 4,
                              width) for r, v in enumerate(_PARTS_V)]
        return {"tokens": xp.concatenate([o[0] for o in outs]), "counts": xp.concatenate([o[1] for o in outs])}

    if label == "alone":
        run, ctl = alone, (lambda kn, d: alone(kn, d, "stale"))
    else:
        ctl = (lambda kn, d: run(kn, d, ctl_define)) if ctl_define else (lambda kn, d: run(kn, d, key="stale"))
    return case(Case(f"pick.parts[{label}]", ("dsa_pick", "dsa_pick_merge"), make, run, replay, ctl))


_parts_case("stale", None)
_parts_case("alone", None)                                           # the same ids whatever the batch and P
_parts_case("tie-high", "PICK_PLANT_TIE_HIGH")
_parts_case("merge-order", "PICK_PLANT_MERGE_ORDER")
_parts_case("range", "PICK_PLANT_RANGE")


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
