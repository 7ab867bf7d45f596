"""Launchers of cuda_src/gemv_norm.cu and gemv_q_norm.cu (quantised parts): DSA's q_a norm and the decode GEMVs of
q_b / wq_b that consume it in one launch, the norm computed in the GEMV's prologue (op rmsnorm_gemm_multi). The
call's leading `decode` rows (decode/verify rows) take the fused kernel, the prompt rows the norm kernel and then
the tensor-core gemm, as ops_gemm does: a row's path is set by its role, never by how many rows share the call; both
give the bits of the norm followed by the GEMM. More parts than a kernel holds, quantised parts of two formats or
blocks, and empty shapes run the two ops separately (the same bits)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_gemm import multi_parts
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import ops_gemm_multi, ops_gemv, ops_norm
from cupyglm.kernels.ops import Kernels, check, f32, i32, op
from cupyglm.kernels.ops_gemv_q import tc_block_args, weight_args

SRC = "gemv_norm.cu"
SRC_Q = "gemv_q_norm.cu"
PARTS = 4         # GEMV_NORM_PARTS
Q_PARTS = 2       # GEMV_Q_NORM_PARTS: quantised parts, and bf16 parts, of gemv_multi_rmsnorm_{fmt}


def _groups(name: str, rows: int) -> int:
    groups = -(-rows // ops_gemv.ROWS)
    if groups > ops_gemv.MAX_GRID:
        raise ValueError(f"{name}: {rows} decode rows exceed the grid's 65,535 row groups")
    return groups


def _bf16_parts(k: Kernels, name: str, parts, m: int, kk: int, slots: int, pad) -> tuple[list, int]:
    """The (w, y, n, kind) arguments of bf16 parts (w [N, K] bf16, y [M, N] fp32 for kind 0, bf16 for 1 and 2),
    `slots` of them with the unused ones `pad` with no columns; and the column blocks they take."""
    args, blocks = [], 0
    for p, (w, y, kind) in enumerate(parts):
        check(name, f"w{p}", w, (None, kk), k.bf16)
        check(name, f"y{p}", y, (m, w.shape[0]), np.float32 if kind == 0 else k.bf16)
        args += [w, y, i32(w.shape[0]), i32(kind)]
        blocks += -(-w.shape[0] // ops_gemv.OUTS)
    for _ in range(len(parts), slots):                      # unused parts: no columns, no blocks
        args += [*pad, i32(0), i32(0)]
    return args, blocks


def _checked(name: str, k: Kernels, x, w_norm, rows: int) -> tuple[int, int]:
    """(M, K) of x [M, K] bf16 with its norm weight [K] bf16 and the call's decode rows checked."""
    check(name, "x", x, (None, None), k.bf16)
    m, kk = x.shape
    check(name, "w_norm", w_norm, (kk,), k.bf16)
    if not 0 < rows <= m:
        raise ValueError(f"{name}: rows must be in (0, {m}], got {rows}")
    return m, kk


def gemv_multi_rmsnorm(k: Kernels, x, w_norm, ws, ys, kinds, rows: int, eps: float) -> None:
    """ys[p][:rows] = epilogue_p(rmsnorm(x, w_norm, eps)[:rows] @ ws[p].T) in the decode order, all parts in one launch.
    x [M, K] bf16, w_norm [K] bf16, ws[p] [N_p, K] bf16, ys[p] [M, N_p] (fp32 for kind 0, bf16 for 1, 2)."""
    name = "gemv_multi_rmsnorm_lane16"
    m, kk = _checked(name, k, x, w_norm, rows)
    if not 0 < len(ws) <= PARTS:
        raise ValueError(f"{name}: 1..{PARTS} parts, got {len(ws)}")
    args, blocks = _bf16_parts(k, name, list(zip(ws, ys, kinds)), m, kk, PARTS, (ws[0], ys[0]))
    k.launch(SRC, name, (blocks, _groups(name, rows), 1), ops_gemv.THREADS,
             (x, w_norm, f32(eps), *args, i32(kk), i32(rows)))


def gemv_multi_rmsnorm_q(k: Kernels, x, w_norm, qparts, bparts, rows: int, eps: float) -> None:
    """As gemv_multi_rmsnorm with qparts (QWeight [N, K] of one format and block, y, kind) up to Q_PARTS and bparts
    (bf16 w [N, K], y, kind) up to Q_PARTS, in one launch; y [M, N] fp32 for kind 0, bf16 for 1 and 2."""
    fmt = qparts[0][0].fmt
    name = f"gemv_multi_rmsnorm_{fmt}_lane16"
    m, kk = _checked(name, k, x, w_norm, rows)
    if not (0 < len(qparts) <= Q_PARTS and len(bparts) <= Q_PARTS):
        raise ValueError(f"{name}: 1..{Q_PARTS} quantised and 0..{Q_PARTS} bf16 parts, got {len(qparts)}, "
                         f"{len(bparts)}")
    args, blocks = [], 0
    for p, (w, y, kind) in enumerate(qparts):
        wa = weight_args(name, w, 2, kk)
        if w.fmt != fmt or w.block != qparts[0][0].block:
            raise ValueError(f"{name}: quantised parts differ in format or block")
        check(name, f"yq{p}", y, (m, w.shape[0]), np.float32 if kind == 0 else k.bf16)
        args += [*wa, y, i32(w.shape[0]), i32(kind)]
        blocks += -(-w.shape[0] // ops_gemv.OUTS)
    w0, y0 = qparts[0][0], qparts[0][1]
    for _ in range(len(qparts), Q_PARTS):                  # unused parts: no columns, no blocks
        args += [*weight_args(name, w0, 2, kk), y0, i32(0), i32(0)]
    bargs, bblocks = _bf16_parts(k, name, bparts, m, kk, Q_PARTS, (x, y0))
    k.launch(SRC_Q, name, (blocks + bblocks, _groups(name, rows), 1), ops_gemv.THREADS,
             (x, w_norm, f32(eps), *args, *tc_block_args(w0), *bargs, i32(m), i32(kk), i32(rows)))


def _q_fits(ws) -> bool:
    """Can rmsnorm_gemm_multi's parts go in one gemv_multi_rmsnorm_{fmt} launch (quantised parts 2-d, of one
    format and block, at most Q_PARTS quantised and Q_PARTS bf16)?"""
    quant = [w for w in ws if isinstance(w, QWeight)]
    return (0 < len(quant) <= Q_PARTS and len(ws) - len(quant) <= Q_PARTS
            and all(w.ndim == 2 and w.fmt == quant[0].fmt and w.block == quant[0].block for w in quant))


@op("rmsnorm_gemm_multi")
def rmsnorm_gemm_multi(k: Kernels, x, w_norm, eps, ws, outs, decode: int = 0):
    """gemm_multi((rmsnorm(x, w_norm, eps),) * len(ws), ws, outs); the decode rows of every part in one launch."""
    x = check("rmsnorm_gemm_multi", "x", k.xp.ascontiguousarray(x), (None, None), k.bf16)
    multi_parts("rmsnorm_gemm_multi", (x,) * len(ws), ws, outs)
    m, kk = x.shape
    d = decode_rows("rmsnorm_gemm_multi", decode, m)
    quant = any(isinstance(w, QWeight) for w in ws)
    if ((not _q_fits(ws) if quant else len(ws) > PARTS) or not (d and kk) or not all(w.shape[0] for w in ws)):
        xn = ops_norm.rmsnorm(k, x, w_norm, eps)
        return ops_gemm_multi.gemm_multi(k, (xn,) * len(ws), ws, outs, decode=d)
    ys = [k.empty((m, w.shape[0]), np.float32 if o == "f32" else k.bf16) for w, o in zip(ws, outs)]
    kinds = [ops_gemm_multi.KIND[o] for o in outs]
    if quant:
        parts = list(zip(ws, ys, kinds))
        gemv_multi_rmsnorm_q(k, x, w_norm, [t for t in parts if isinstance(t[0], QWeight)],
                             [t for t in parts if not isinstance(t[0], QWeight)], d, eps)
    else:
        gemv_multi_rmsnorm(k, x, w_norm, ws, ys, kinds, d, eps)
    if d < m:                                               # the prompt rows: norm.cu, then the gemm part by part
        xn = ops_norm.rmsnorm(k, x[d:], w_norm, eps)
        for y, w, o in zip(ys, ws, outs):
            y[d:] = ops_gemm_multi._separate(k, xn, w, o, 0)
    return tuple(ys)
