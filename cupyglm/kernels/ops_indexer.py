"""DSA indexer launchers (cuda_src/indexer.cu): index_pool, index_scores, index_scores_rows, index_tail_pool, with
NumpyOps' signatures."""
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


@op("index_scores_rows")
def index_scores_rows(k: Kernels, qi, hw, hscale: float, pooled, rows):
    """qi: [T, Hi, I] bf16, hw: [T, Hi] fp32 (before hscale), pooled: [R, I] bf16, rows: [T, Pw] int32 row t's
    pooled-key rows -> [T, Pw] fp32 (NumpyOps.index_scores_rows)."""
    name = "index_scores_rows"
    qi = _arg(k, name, "qi", qi, (None, None, None), k.bf16)
    t, h, i = qi.shape
    hw = _arg(k, name, "hw", hw, (t, h))
    pooled = _arg(k, name, "pooled", pooled, (None, i), k.bf16)
    rows = _arg(k, name, "rows", rows, (t, None), np.int32)
    pw = rows.shape[1]
    if i > MAX_I:
        raise ValueError(f"{name}: index head dimension <= {MAX_I} supported, got {i}")
    blocks = t * -(-pw // POOLS)
    if blocks > 2**31 - 1:
        raise ValueError(f"{name}: T={t} rows x {pw} pools exceed the grid's 2^31 - 1 blocks")
    out = k.empty((t, pw))
    if t and pw:
        k.launch(SRC, name, (blocks,), (16 * POOLS,),
                 (qi, hw, pooled, rows, out, i32(t), i32(h), i32(i), i32(pw), i32(pooled.shape[0]), f32(i ** -0.5),
                  f32(hscale)))
    return out


@op("index_tail_pool", inplace=(0, 1, 5))
def index_tail_pool(k: Kernels, tail_ik, tail_ig, ik, ig, ape, pooled, pool_rows, r0: int, n: int,
                    start: int) -> None:
    """A segment's index tail in place and the pools its rows complete (NumpyOps.index_tail_pool)."""
    name = "index_tail_pool"
    check(name, "tail_ik", tail_ik, (None, None), k.bf16)
    kp, i = tail_ik.shape
    if not 1 <= kp <= 8:
        raise ValueError(f"{name}: 1..8 pool members supported, got {kp}")
    check(name, "tail_ig", tail_ig, (kp, i), k.bf16)
    ik = _arg(k, name, "ik", ik, (None, i), k.bf16)
    ig = _arg(k, name, "ig", ig, ik.shape, k.bf16)
    ape = _arg(k, name, "ape", ape, (kp, i), k.bf16)
    check(name, "pooled", pooled, (None, i), k.bf16)
    complete = (start + n) // kp - start // kp
    pool_rows = _arg(k, name, "pool_rows", pool_rows, (complete,), np.int32)
    if start < 0 or n < 0 or r0 < 0 or r0 + n > ik.shape[0]:
        raise ValueError(f"{name}: rows {r0}..{r0 + n} at {start} outside the call's {ik.shape[0]} rows")
    for a, what in ((tail_ik, "tail_ik"), (tail_ig, "tail_ig"), (pooled, "pooled")):
        if not getattr(a.flags, "writeable", True) or not a.flags.c_contiguous:
            raise ValueError(f"{name}: parameter {what} must be writeable and C-contiguous")
    if n and i:
        k.launch(SRC, name, (-(-i // 128), max(complete, 1)), (128,),
                 (ik, ig, ape, tail_ik, tail_ig, pooled, pool_rows, i32(r0), i32(n), i32(start), i32(kp), i32(i),
                  i32(complete), i32(pooled.shape[0])))
