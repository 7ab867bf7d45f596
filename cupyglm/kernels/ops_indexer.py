"""DSA indexer launchers (cuda_src/indexer.cu): index_pool, index_scores, with NumpyOps' signatures."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "indexer.cu"
F32 = np.float32
POOLS = 16         # IDX_POOLS: pools per index_scores block (their keys read once for all its rows and heads)
ROWS = 16          # IDX_ROWS: rows per index_scores block
MAX_I = 256        # IDX_MAX_I


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("index_pool")
def index_pool(k: Kernels, ik, ig, ape):
    """Pooled keys of complete pools. ik, ig: [P, KP, I] bf16, ape: [KP, I] -> [P, I] bf16."""
    ik = _arg(k, "index_pool", "ik", ik, (None, None, None), k.bf16)
    p, kp, i = ik.shape
    if not 1 <= kp <= 8:
        raise ValueError(f"index_pool: 1..8 pool members supported, got {kp}")
    ig = _arg(k, "index_pool", "ig", ig, (p, kp, i), k.bf16)
    ape = _arg(k, "index_pool", "ape", ape, (kp, i), k.bf16)
    out = k.empty((p, i), k.bf16)
    if p * i:
        k.launch(SRC, "index_pool", ((p * i + 255) // 256,), (256,), (ik, ig, ape, out, i32(p), i32(kp), i32(i)))
    return out


@op("index_scores")
def index_scores(k: Kernels, qi, hw, pk):
    """qi: [T, Hi, I] bf16, hw: [T, Hi] fp32, pk: [P, I] bf16 -> [T, P] fp32 pool scores."""
    qi = _arg(k, "index_scores", "qi", qi, (None, None, None), k.bf16)
    t, h, i = qi.shape
    hw = _arg(k, "index_scores", "hw", hw, (t, h))
    pk = _arg(k, "index_scores", "pk", pk, (None, i), k.bf16)
    p = pk.shape[0]
    if i > MAX_I:
        raise ValueError(f"index_scores: index head dimension <= {MAX_I} supported, got {i}")
    blocks = -(-t // ROWS) * -(-p // POOLS)
    if blocks > 2**31 - 1:
        raise ValueError(f"index_scores: T={t} rows x {p} pools exceed the grid's 2^31 - 1 blocks")
    out = k.empty((t, p))
    if t and p:
        k.launch(SRC, "index_scores", (blocks,), (16 * POOLS,),
                 (qi, hw, pk, out, i32(t), i32(h), i32(i), i32(p), f32(i ** -0.5)))
    return out
