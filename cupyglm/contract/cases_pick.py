"""Contract cases of cuda_src/pick.cu (op pick): rows on both sides of the dense limit, tied and zero scores
(relu makes many exact zeros; -0.0 ties +0.0), pools a row cannot see yet poisoned with NaN, and a window past
any shared-memory cap (the radix select keeps no per-pool state).

Control: a stale score row (the scores of an earlier step, as if the pick read scores before they were
updated)."""
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
