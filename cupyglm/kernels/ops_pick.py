"""Launchers of cuda_src/pick.cu: the DSA pick (token lists for sparse attention)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "pick.cu"
THREADS = 128                 # PICK_THREADS in pick.cu (its block scans assume exactly this many)


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
    """dsa_pick: each row's preconditions counted by the kernel into guard = (flags, first of 3 slots)
    (guards.PICK_MESSAGES; slot -1: nothing counted). Also the contract's entry point."""
    check("dsa_pick", "flags", guard[0], (None, 2), np.uint32)
    t, p = scores.shape
    k.launch(SRC, "dsa_pick", (t,), (THREADS,),
             (scores, pos, tokens, counts, i32(p), i32(npools), i32(kpool), i32(width), guard[0], i32(guard[1])))
