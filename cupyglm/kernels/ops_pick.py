"""Launchers of cuda_src/pick.cu: the DSA pick (token lists for sparse attention)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "pick.cu"
THREADS = 256                 # PICK_THREADS in pick_select.cuh (its block scans assume exactly this many)
PART = THREADS * 16           # PICK_PART in pick.cu: pools a dsa_pick block selects from


def parts(p: int) -> int:
    """dsa_pick blocks a row of scores p pools wide (grid.y): one a PICK_PART pools."""
    return max(1, -(-p // PART))


def scratch_cols(p: int, npools: int) -> int:
    """Columns of the candidates scratch a row (keys u32, pools i32; 0 when one part covers the row): each part
    of a multi-part row keeps min(npools, PART) (key, pool) pairs."""
    n = parts(p)
    return 0 if n == 1 else n * min(npools, PART)


@op("pick")
def pick(k: Kernels, scores, positions, npools: int, kpool: int, width: int):
    """scores: [T, P] fp32 (P >= visible pools of every row), positions: [T] int ->
    (tokens [T, width] int32 padded with -1, counts [T] int32)."""
    xp = k.xp
    check("pick", "scores", scores, (None, None), np.float32)
    if positions.ndim != 1 or positions.shape[0] != scores.shape[0]:
        raise ValueError(f"pick: parameter positions must have shape ({scores.shape[0]},), got {positions.shape}")
    if positions.dtype.kind not in "iu":
        raise ValueError(f"pick: parameter positions must be integers, got {positions.dtype}")
    npools, kpool, width = int(npools), int(kpool), int(width)
    if npools < 1 or kpool < 1 or width < 1:
        raise ValueError(f"pick: npools, kpool, width must be positive, got {npools}, {kpool}, {width}")
    if width < npools * kpool:
        raise ValueError(f"pick: parameter width={width} must be at least npools * kpool = {npools * kpool}")
    t, p = scores.shape
    pos = xp.ascontiguousarray(positions, dtype=xp.int32)
    tokens = k.empty((t, width), np.int32)
    counts = k.empty((t,), np.int32)
    if t == 0:
        return tokens, counts
    launch(k, scores, pos, tokens, counts, npools, kpool, width, guards.pick_slot(k, pos, p, npools, kpool, width))
    return tokens, counts


def launch(k: Kernels, scores, pos, tokens, counts, npools: int, kpool: int, width: int, guard) -> None:
    """dsa_pick (grid (T, parts)), then dsa_pick_merge when a row of P pools can span several parts (P > PART):
    one launch up to PART pools, two above. Each row's preconditions are counted by dsa_pick into guard =
    (flags, first of 3 slots) (guards.PICK_MESSAGES; slot -1: nothing counted). Also the contract's entry point."""
    check("dsa_pick", "flags", guard[0], (None, 2), np.uint32)
    t, p = scores.shape
    cols = scratch_cols(p, npools)
    ck = k.empty((t, cols) if cols else (1,), np.uint32)       # [T, cols] u32 candidate keys
    cp = k.empty((t, cols) if cols else (1,), np.int32)        # [T, cols] i32 their pool ids
    k.launch(SRC, "dsa_pick", (t, parts(p)), (THREADS,),
             (scores, pos, tokens, counts, ck, cp, i32(p), i32(npools), i32(kpool), i32(width), i32(cols),
              guard[0], i32(guard[1])))
    if cols:
        k.launch(SRC, "dsa_pick_merge", (t,), (THREADS,),
                 (ck, cp, pos, tokens, counts, i32(p), i32(npools), i32(kpool), i32(width), i32(cols)))
