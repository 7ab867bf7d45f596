"""Penalties launcher (cuda_src/penalties.cu): NumpyOps.penalize's signature (cupyglm.backend.numpy_penalties)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_penalties import THREADS
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "penalties.cu"


@op("penalize", inplace=(0,))
def penalize(k: Kernels, logits, row, id, count, seen, bias, repetition, frequency, presence) -> None:
    """logits [R, V] f32 (edited in place); row, id, count, seen [N] i32, bias [N] f32 (distinct (row, id)
    pairs); repetition, frequency, presence [R'] f32 with R' <= R (the rows an edit names)."""
    check("penalize_rows", "logits", logits, (None, None), np.float32)
    if not logits.flags.c_contiguous:
        raise ValueError("penalize_rows: logits must be C-contiguous (it is edited in place)")
    r, v = logits.shape
    n = row.shape[0]
    args = [check("penalize_rows", name, k.xp.ascontiguousarray(a), (n,), dt) for name, a, dt in
            (("row", row, np.int32), ("id", id, np.int32), ("count", count, np.int32), ("seen", seen, np.int32),
             ("bias", bias, np.float32))]
    rr = repetition.shape[0]
    if rr > r:
        raise ValueError(f"penalize_rows: {rr} rows of parameters for {r} rows of logits")
    args += [check("penalize_rows", name, k.xp.ascontiguousarray(a), (rr,), np.float32) for name, a in
             (("repetition", repetition), ("frequency", frequency), ("presence", presence))]
    if n:
        k.launch(SRC, "penalize_rows", ((n + THREADS - 1) // THREADS,), (THREADS,),
                 (logits, *args, i32(n), i32(v)))
