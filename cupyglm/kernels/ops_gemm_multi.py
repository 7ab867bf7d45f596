"""Launcher of cuda_src/gemv_multi.cu: gemm_multi, several GEMMs of the same rows (one layer's projections of one
input row, or of consecutive low-rank factors). The call's leading `decode` rows of every part go to one
gemv_multi_lane16 launch (each part bit for bit its own gemv), the prompt rows to the tensor-core gemm part by part, as
ops_gemm does: a row's path is set by its role, never by how many rows share the call. gemm_and_swiglu: one plain
projection and one SwiGLU pair of the same rows (the MoE router and the shared expert's gate/up, bf16 or quantised:
gemv_q_multi.cu) in one launch; a call with quantised parts runs its decode rows in one gemv_q_multi.cu launch."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_gemm import MULTI_OUTS, MULTI_PARTS, multi_parts
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemm, ops_gemv, ops_gemv_q_multi, ops_moe
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "gemv_multi.cu"
KIND = {o: i for i, o in enumerate(MULTI_OUTS)}     # the kernel's kind_p


def _separate(k: Kernels, x, w, o: str, d: int):
    """One part as its own op (quantised weights, K = 0, or a call without decode rows)."""
    if o == "sigmoid_bf16":
        return ops_moe.sigmoid(k, ops_gemm.gemm(k, x, w, decode=d), out="bf16")
    return ops_gemm.gemm(k, x, w, out=o, decode=d)


def gemv_multi(k: Kernels, xs, ws, ys, kinds, rows: int) -> None:
    """ys[p][:rows] = epilogue_p(xs[p][:rows] @ ws[p].T) in the decode order, all parts in one launch.
    xs[p] [M, K_p] bf16, ws[p] [N_p, K_p] bf16, ys[p] [M, N_p] (fp32 for kind 0, bf16 for 1 and 2); rows in (0, M]."""
    m = xs[0].shape[0]
    if not 0 < rows <= m:
        raise ValueError(f"gemv_multi_lane16: rows must be in (0, {m}], got {rows}")
    args, blocks = [], 0
    for p, (x, w, y, kind) in enumerate(zip(xs, ws, ys, kinds)):
        check("gemv_multi_lane16", f"x{p}", x, (m, None), k.bf16)
        check("gemv_multi_lane16", f"w{p}", w, (None, x.shape[1]), k.bf16)
        check("gemv_multi_lane16", f"y{p}", y, (m, w.shape[0]), np.float32 if kind == 0 else k.bf16)
        args += [x, w, y, i32(w.shape[0]), i32(x.shape[1]), i32(kind)]
        blocks += -(-w.shape[0] // ops_gemv.OUTS)
    for _ in range(len(xs), MULTI_PARTS):                   # unused parts: no columns, no blocks
        args += [xs[0], ws[0], ys[0], i32(0), i32(xs[0].shape[1]), i32(0)]
    groups = -(-rows // ops_gemv.ROWS)
    if groups > ops_gemv.MAX_GRID:
        raise ValueError(f"gemv_multi_lane16: {rows} decode rows exceed the grid's 65,535 row groups")
    k.launch(SRC, "gemv_multi_lane16", (blocks, groups, 1), ops_gemv.THREADS, (*args, i32(m), i32(rows)))


def _one_q_launch(ws, quant, plain) -> bool:
    """Can the quantised parts and the bf16 parts go in one gemv_multi_{fmt} launch (one format and block, 2-d,
    at most PARTS of each)?"""
    first = ws[quant[0]]
    return (len(quant) <= ops_gemv_q_multi.PARTS and len(plain) <= ops_gemv_q_multi.PARTS
            and all(ws[p].ndim == 2 and ws[p].fmt == first.fmt and ws[p].block == first.block for p in quant))


@op("gemm_multi")
def gemm_multi(k: Kernels, xs, ws, outs, decode: int = 0):
    """Part p: gemm(xs[p], ws[p], outs[p]) (outs "sigmoid_bf16": bf16(sigmoid(fp32 sum))); the decode rows of
    all parts in one launch."""
    multi_parts("gemm_multi", xs, ws, outs)
    xs = tuple(k.xp.ascontiguousarray(x) for x in xs)
    m = xs[0].shape[0]
    d = decode_rows("gemm_multi", decode, m)
    apart = [p for p, (x, w) in enumerate(zip(xs, ws)) if x.shape[1] == 0 or w.shape[0] == 0]
    quant = [p for p, w in enumerate(ws) if isinstance(w, QWeight) and p not in apart]
    plain = [p for p in range(len(xs)) if p not in apart and p not in quant]
    if quant and not _one_q_launch(ws, quant, plain):
        apart = apart + quant                                # each quantised part its own launch
        quant = []
    if not d or len(apart) == len(xs):
        return tuple(_separate(k, x, w, o, d) for x, w, o in zip(xs, ws, outs))
    ys = [None] * len(xs)
    for p in apart:
        ys[p] = _separate(k, xs[p], ws[p], outs[p], d)
    fused = quant + plain
    for p in fused:
        ys[p] = k.empty((m, ws[p].shape[0]), np.float32 if outs[p] == "f32" else k.bf16)
    if quant:
        ops_gemv_q_multi.gemv_multi(k, [(xs[p], ws[p], ys[p], KIND[outs[p]]) for p in quant],
                                    [(xs[p], ws[p], ys[p], KIND[outs[p]]) for p in plain], d)
    else:
        gemv_multi(k, [xs[p] for p in fused], [ws[p] for p in fused], [ys[p] for p in fused],
                   [KIND[outs[p]] for p in fused], d)
    if d < m:                                               # the prompt rows, part by part (tensor-core gemm)
        for p in fused:
            ys[p][d:] = _separate(k, xs[p][d:], ws[p], outs[p], 0)
    return tuple(ys)


@op("gemm_and_swiglu")
def gemm_and_swiglu(k: Kernels, x, w, out, w_gate, w_up, limit, decode: int = 0):
    """(gemm(x, w, out), gemm_swiglu(x, w_gate, w_up, limit)) of the same rows; the decode rows of both in one
    launch (gemv_multi_swiglu_lane16), the prompt rows through the tensor-core GEMMs."""
    from cupyglm.kernels import ops_gemm_swiglu
    x = check("gemm_and_swiglu", "x", k.xp.ascontiguousarray(x), (None, None), k.bf16)
    m, kk = x.shape
    d = decode_rows("gemm_and_swiglu", decode, m)
    if out not in ("f32", "bf16"):
        raise ValueError(f"gemm_and_swiglu: out must be 'f32' or 'bf16', got {out!r}")
    plain = isinstance(w, QWeight) or not (d and kk and w.shape[0] and w_gate.shape[0])
    if plain or isinstance(w_gate, QWeight) != isinstance(w_up, QWeight):
        return (ops_gemm.gemm(k, x, w, out=out, decode=d),
                ops_gemm_swiglu.gemm_swiglu(k, x, w_gate, w_up, limit, decode=d))
    if isinstance(w_gate, QWeight):
        return _and_swiglu_q(k, x, w, out, w_gate, w_up, limit, d)
    check("gemv_multi_swiglu_lane16", "w", w, (None, kk), k.bf16)
    check("gemv_multi_swiglu_lane16", "w_gate", w_gate, (None, kk), k.bf16)
    check("gemv_multi_swiglu_lane16", "w_up", w_up, tuple(w_gate.shape), k.bf16)
    na, ns = w.shape[0], w_gate.shape[0]
    ya = k.empty((m, na), np.float32 if out == "f32" else k.bf16)
    ys = k.empty((m, ns), k.bf16)
    groups = -(-d // ops_gemv.ROWS)
    if groups > ops_gemv.MAX_GRID:
        raise ValueError(f"gemv_multi_swiglu_lane16: {d} decode rows exceed the grid's 65,535 row groups")
    blocks = -(-na // ops_gemv.OUTS) + -(-ns // ops_gemv.OUTS)
    k.launch(SRC, "gemv_multi_swiglu_lane16", (blocks, groups, 1), ops_gemv.THREADS,
             (x, w, ya, i32(na), i32(KIND[out]), w_gate, w_up, ys, i32(ns), i32(m), i32(kk), i32(d),
              *ops_gemm_swiglu._limit(limit)))
    if d < m:                                               # the prompt rows (tensor-core GEMMs)
        ya[d:] = ops_gemm.gemm(k, x[d:], w, out=out)
        ys[d:] = ops_gemm_swiglu.gemm_swiglu(k, x[d:], w_gate, w_up, limit)
    return ya, ys


def _and_swiglu_q(k: Kernels, x, w, out, w_gate, w_up, limit, d: int):
    """gemm_and_swiglu of a bf16 w and a quantised shared expert: the decode rows in one gemv_q_multi.cu launch."""
    from cupyglm.kernels import ops_gemm_swiglu
    m = x.shape[0]
    ya = k.empty((m, w.shape[0]), np.float32 if out == "f32" else k.bf16)
    ys = k.empty((m, w_gate.shape[0]), k.bf16)
    ops_gemv_q_multi.gemv_multi_swiglu(k, x, w, ya, KIND[out], w_gate, w_up, ys, d, ops_gemm_swiglu._limit(limit))
    if d < m:                                               # the prompt rows (tensor-core GEMMs)
        ya[d:] = ops_gemm.gemm(k, x[d:], w, out=out)
        ys[d:] = ops_gemm_swiglu.gemm_swiglu(k, x[d:], w_gate, w_up, limit)
    return ya, ys


@op("gemm_grouped_dense")
def gemm_grouped_dense(k: Kernels, x, w, group, x2, w2, decode: int = 0, decode2: int = 0):
    """(gemm_grouped(x, w, group), gemm(x2, w2)) fp32; when every row of both is a decode row, one launch
    (gemv_grouped_dense_lane16: the experts' and the shared expert's down projections)."""
    x = check("gemm_grouped_dense", "x", k.xp.ascontiguousarray(x), (None, None), k.bf16)
    x2 = check("gemm_grouped_dense", "x2", k.xp.ascontiguousarray(x2), (None, None), k.bf16)
    m, kk = x.shape
    m2, k2 = x2.shape
    d = decode_rows("gemm_grouped_dense", decode, m)
    d2 = decode_rows("gemm_grouped_dense", decode2, m2)
    separate = (isinstance(w, QWeight) or isinstance(w2, QWeight) or d < m or d2 < m2 or not (m and m2 and kk
                and k2) or w.shape[1] != w2.shape[0] or not w.shape[1])
    if separate:
        return (ops_gemm.gemm_grouped(k, x, w, group, decode=d), ops_gemm.gemm(k, x2, w2, decode=d2))
    check("gemv_grouped_dense_lane16", "w", w, (None, None, kk), k.bf16)
    check("gemv_grouped_dense_lane16", "group", group, (m,), np.int32)
    check("gemv_grouped_dense_lane16", "w2", w2, (None, k2), k.bf16)
    e, n = w.shape[0], w.shape[1]
    groups = -(-m2 // ops_gemv.ROWS)
    if m + groups > ops_gemv.MAX_GRID:
        raise ValueError(f"gemv_grouped_dense_lane16: {m} pairs and {m2} rows exceed the grid's 65,535 limit")
    guard = guards.kernel_guard(k, "gemm_grouped", "group", group, e, "expert ids", own=True)
    y = k.empty((m, n), np.float32)
    y2 = k.empty((m2, n), np.float32)
    k.launch(SRC, "gemv_grouped_dense_lane16", (-(-n // ops_gemv.OUTS), m + groups, 1), ops_gemv.THREADS,
             (x, w, group, y, i32(m), i32(n), i32(kk), i32(e), guard[0], i32(guard[1]), x2, w2, y2, i32(m2),
              i32(k2)))
    return y, y2
