"""DSA indexer launchers (cuda_src/indexer.cu): index_pool, index_scores, index_scores_rows, index_tail_pool, with
NumpyOps' signatures. The scores run on the tensor core (cuda_src/index_mma.cuh; backend/tc_index.py)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "indexer.cu"
F32 = np.float32
WARPS = 8          # index_scores: warps a block, WARP_POOLS pools each (keys read once for its rows and heads)
ROWS_WARPS = 4     # index_scores_rows: warps a block (one row)
ROWS = 16          # IDX_ROWS: rows per index_scores block
MAX_I = 256        # IDX_MAX_I
PAD = 8            # IDX_PAD
WARP_POOLS = 32    # IDX_WARP_POOLS


def shared_bytes(i: int, warps: int) -> int:
    """A block's dynamic shared memory: WARP_POOLS pools a warp, each key's I bf16 rounded up to 16, plus the pad."""
    return WARP_POOLS * warps * (-(-i // 16) * 16 + PAD) * 2


def _check_i(name: str, i: int) -> None:
    if i > MAX_I or i % 8:
        raise ValueError(f"{name}: index head dimension a multiple of 8 up to {MAX_I} supported (16-byte key "
                         f"copies, 8-byte query loads), got {i}")


def _launch(k: Kernels, name: str, blocks: int, warps: int, i: int, args) -> None:
    k.launch_opted(SRC, name, (blocks,), (32 * warps,), args, shared_bytes(i, warps))


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
    _check_i("index_scores", i)
    blocks = -(-t // ROWS) * -(-p // (WARP_POOLS * WARPS))
    if blocks > 2**31 - 1:
        raise ValueError(f"index_scores: T={t} rows x {p} pools exceed the grid's 2^31 - 1 blocks")
    out = k.empty((t, p))
    if t and p:
        _launch(k, "index_scores", blocks, WARPS, i, (qi, hw, pk, out, i32(t), i32(h), i32(i), i32(p), f32(i ** -0.5)))
    return out


@op("index_scores_rows")
def index_scores_rows(k: Kernels, qi, hw, hscale: float, pooled, tables, seg):
    """qi: [T, Hi, I] bf16, hw: [T, Hi] fp32 (before hscale), pooled: [R, I] bf16, tables: [S, Pw] int32 each
    segment's pooled-key rows, seg: [T] int32 row t's segment (its row of tables) -> [T, Pw] fp32
    (NumpyOps.index_scores_rows). seg in [0, S) is the caller's contract; the kernel scores a row outside it
    against zero keys (as a table entry outside [0, R)), never reading past tables."""
    name = "index_scores_rows"
    qi = _arg(k, name, "qi", qi, (None, None, None), k.bf16)
    t, h, i = qi.shape
    hw = _arg(k, name, "hw", hw, (t, h))
    pooled = _arg(k, name, "pooled", pooled, (None, i), k.bf16)
    tables = _arg(k, name, "tables", tables, (None, None), np.int32)
    seg = _arg(k, name, "seg", seg, (t,), np.int32)
    s, pw = tables.shape
    _check_i(name, i)
    blocks = t * -(-pw // (WARP_POOLS * ROWS_WARPS))
    if blocks > 2**31 - 1:
        raise ValueError(f"{name}: T={t} rows x {pw} pools exceed the grid's 2^31 - 1 blocks")
    out = k.empty((t, pw))
    if t and pw:
        _launch(k, name, blocks, ROWS_WARPS, i, (qi, hw, pooled, tables, seg, out, i32(t), i32(h), i32(i), i32(pw),
                                                  i32(pooled.shape[0]), i32(s), f32(i ** -0.5), f32(hscale)))
    return out


@op("index_tail_pool", inplace=(0, 1, 5))
def index_tail_pool(k: Kernels, tails_ik, tails_ig, ik, ig, ape, pooled, seg, done, items: int = 0) -> None:
    """A call's index tails in place and the pools its segments' rows complete, one launch
    (NumpyOps.index_tail_pool). tails_*: [NS, KP, I] bf16; seg: [S, 5] int32 (row0, n, start, slot, done0); done:
    [D] int32. items: the call's work items (max(C, 1) per segment with rows) as grid.y; any value >= 1 gives the
    same bits (the kernel strides over them), 0: one per segment row of seg."""
    name = "index_tail_pool"
    check(name, "tails_ik", tails_ik, (None, None, None), k.bf16)
    ns, kp, i = tails_ik.shape
    if not 1 <= kp <= 8:
        raise ValueError(f"{name}: 1..8 pool members supported, got {kp}")
    check(name, "tails_ig", tails_ig, (ns, kp, i), k.bf16)
    ik = _arg(k, name, "ik", ik, (None, i), k.bf16)
    ig = _arg(k, name, "ig", ig, ik.shape, k.bf16)
    ape = _arg(k, name, "ape", ape, (kp, i), k.bf16)
    check(name, "pooled", pooled, (None, i), k.bf16)
    seg = _arg(k, name, "seg", seg, (None, 5), np.int32)
    done = _arg(k, name, "done", done, (None,), np.int32)
    for a, what in ((tails_ik, "tails_ik"), (tails_ig, "tails_ig"), (pooled, "pooled")):
        if not getattr(a.flags, "writeable", True) or not a.flags.c_contiguous:
            raise ValueError(f"{name}: parameter {what} must be writeable and C-contiguous")
    if items < 0:
        raise ValueError(f"{name}: items must be >= 0, got {items}")
    s = seg.shape[0]
    y = items or s
    if s and i and ns:
        k.launch(SRC, name, (-(-i // 128), min(y, 65535)), (128,),
                 (ik, ig, ape, tails_ik, tails_ig, pooled, seg, done, i32(s), i32(ik.shape[0]), i32(kp), i32(i),
                  i32(ns), i32(done.shape[0]), i32(pooled.shape[0])))
