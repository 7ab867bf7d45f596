"""Logprobs launcher (cuda_src/logprobs.cu): NumpyOps.logprobs's signature (cupyglm.backend.numpy_logprobs)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_logprobs import MAX_TOP, THREADS
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "logprobs.cu"


@op("logprobs")
def logprobs(k: Kernels, logits, tokens, top: int):
    """logits [R, V] f32, tokens [R] i32 (the sampled ids), top in 0..MAX_TOP -> [R, 2 + 2 top] int32 packed."""
    logits = check("logprobs_rows", "logits", k.xp.ascontiguousarray(logits), (None, None), np.float32)
    r, v = logits.shape
    tokens = check("logprobs_rows", "tokens", k.xp.ascontiguousarray(tokens), (r,), np.int32)
    top = int(top)
    if not 0 <= top <= MAX_TOP:
        raise ValueError(f"logprobs_rows: top must be in 0..{MAX_TOP}, got {top}")
    if not 1 <= v < 2**31:
        raise ValueError(f"logprobs_rows: the vocabulary must hold at least one id, got V={v}")
    out = k.empty((r, 2 + 2 * top), np.int32)
    if r:
        k.launch(SRC, "logprobs_rows", (r,), (THREADS,), (logits, tokens, out, i32(v), i32(top)))
    return out
