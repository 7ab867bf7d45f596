"""Token-mask launcher (cuda_src/token_mask.cu): NumpyOps.mask_tokens's signature (cupyglm.backend.numpy_token_mask)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_token_mask import THREADS, words
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "token_mask.cu"


@op("mask_tokens", inplace=(0,))
def mask_tokens(k: Kernels, logits, row, bits) -> None:
    """logits [R, V] f32 (edited in place); row [M] i32 distinct rows in 0..R-1; bits [M, ceil(V / 32)] i32."""
    check("mask_rows", "logits", logits, (None, None), np.float32)
    if not logits.flags.c_contiguous:
        raise ValueError("mask_rows: logits must be C-contiguous (it is edited in place)")
    r, v = logits.shape
    m = row.shape[0]
    if m > r:
        raise ValueError(f"mask_rows: {m} masks for {r} rows of logits")
    row = check("mask_rows", "row", k.xp.ascontiguousarray(row), (m,), np.int32)
    bits = check("mask_rows", "bits", k.xp.ascontiguousarray(bits), (m, words(v)), np.int32)
    if m:
        k.launch(SRC, "mask_rows", ((v + THREADS - 1) // THREADS, m), (THREADS,),
                 (logits, row, bits, i32(m), i32(v), i32(words(v))))
