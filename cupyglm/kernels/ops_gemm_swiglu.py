"""Launchers of cuda_src/gemm_swiglu.cu: the gate/up GEMMs and SwiGLU in one kernel (dense MLP and MoE experts),
bit for bit NumpyOps.gemm_swiglu / gemm_grouped_swiglu (two GEMMs rounded to bf16, then swiglu). The
call's leading `decode` rows (decode/verify rows) go to gemv_swiglu.cu (ops_gemv), the rest to gemm_swiglu.cu."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemm_q, ops_gemv
from cupyglm.kernels.ops import Kernels, check, f32, i32, op
from cupyglm.kernels.ops_gemm import MAX_ROWS, OUTS, grid

SRC = "gemm_swiglu.cu"


def _limit(limit):
    return i32(limit is not None), f32(0.0 if limit is None else limit)


@op("gemm_swiglu")
def gemm_swiglu(k: Kernels, x, w_gate, w_up, limit, decode: int = 0):
    """x [M, K] bf16, w_gate / w_up [N, K] bf16 -> [M, N] bf16 swiglu activation; rows [0, decode) decode rows."""
    if isinstance(w_gate, QWeight):                 # FP8 / NVFP4 weights, dequantised in registers (by role)
        return ops_gemm_q.gemm_swiglu(k, x, w_gate, w_up, _limit(limit), decode)
    check("gemm_swiglu", "x", x, (None, None), k.bf16)
    check("gemm_swiglu", "w_gate", w_gate, (None, x.shape[1]), k.bf16)
    check("gemm_swiglu", "w_up", w_up, tuple(w_gate.shape), k.bf16)
    m, kk = x.shape
    n = w_gate.shape[0]
    d = decode_rows("gemm_swiglu", decode, m)
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:
            ops_gemv.gemv_swiglu(k, x, w_gate, w_up, y, d, _limit(limit))
        if d < m:
            k.launch(SRC, "gemm_swiglu_lane16", grid(m - d, n), (16, OUTS),
                     (x[d:], w_gate, w_up, y[d:], i32(m - d), i32(n), i32(kk), i32(min(MAX_ROWS, m - d)),
                      *_limit(limit)))
    return y


@op("gemm_grouped_swiglu")
def gemm_grouped_swiglu(k: Kernels, x, w_gate, w_up, group, limit, decode: int = 0):
    """x [M, K] bf16, w_gate / w_up [E, N, K] bf16, group [M] int32 -> [M, N] bf16; row m uses expert group[m];
    rows [0, decode) are decode/verify rows."""
    if isinstance(w_gate, QWeight):
        return ops_gemm_q.gemm_grouped_swiglu(k, x, w_gate, w_up, group, _limit(limit), decode)
    check("gemm_grouped_swiglu", "x", x, (None, None), k.bf16)
    check("gemm_grouped_swiglu", "w_gate", w_gate, (None, None, x.shape[1]), k.bf16)
    check("gemm_grouped_swiglu", "w_up", w_up, tuple(w_gate.shape), k.bf16)
    check("gemm_grouped_swiglu", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w_gate.shape[0], w_gate.shape[1]
    d = decode_rows("gemm_grouped_swiglu", decode, m)
    if d < m or not n:                       # the gemv checks the ids it reads itself (no check launch)
        guards.ids_in_range(k, "gemm_grouped_swiglu", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:
            guard = guards.kernel_guard(k, "gemm_grouped_swiglu", "group", group, e, "expert ids", own=d == m)
            ops_gemv.gemv_grouped_swiglu(k, x[:d], w_gate, w_up, group[:d], y[:d], _limit(limit), guard)
        if d < m:
            k.launch(SRC, "gemm_grouped_swiglu_lane16", grid(m - d, n), (16, OUTS),
                     (x[d:], w_gate, w_up, group[d:], y[d:], i32(m - d), i32(n), i32(kk), i32(e),
                      i32(min(MAX_ROWS, m - d)), *_limit(limit)))
    return y
