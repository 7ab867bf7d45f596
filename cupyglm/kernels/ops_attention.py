"""DSA attention launcher (cuda_src/attention.cu), with NumpyOps.attention's signature."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "attention.cu"
F32 = np.float32


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("attention")
def attention(k: Kernels, qa, store, rows, counts, scale, chunk):
    """qa: [T, H, R] bf16, store: [N, R] bf16, rows: [T, W] int32 row ids (-1 padded), counts: [T] int32
    -> [T, H, R] bf16. Online softmax over `chunk`-key chunks merged in list order."""
    qa = _arg(k, "attention", "qa", qa, (None, None, None), k.bf16)
    t, h, r = qa.shape
    store = check("attention", "store", store, (None, r), k.bf16)   # never copied: the KV rows
    rows = _arg(k, "attention", "rows", rows, (t, None), np.int32)
    counts = _arg(k, "attention", "counts", counts, (t,), np.int32)
    chunk = int(chunk)
    if chunk < 1:
        raise ValueError(f"attention: chunk must be positive, got {chunk}")
    threads = 128 if r <= 8 * 128 else 256
    if r > 8 * threads:
        raise ValueError(f"attention: R <= {8 * threads} supported, got {r}")
    if h > 65535:
        raise ValueError(f"attention: at most 65,535 heads (grid.y), got {h}")
    out = k.empty((t, h, r), k.bf16)
    if t and h:
        k.launch(SRC, "attention", (t, h), (threads,),
                 (qa, store, rows, counts, out, i32(t), i32(h), i32(r), i32(rows.shape[1]), f32(scale), i32(chunk)),
                 shared_mem=(2 * chunk + 1) * 4)
    return out
