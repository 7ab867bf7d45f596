"""The gate/up GEMMs and SwiGLU (dense MLP and MoE experts; bf16 or quantised weights), bit for bit
NumpyOps.gemm_swiglu / gemm_grouped_swiglu (two GEMMs rounded to bf16, then swiglu). The call's leading `decode`
rows (decode/verify rows) go to the fused gemv_swiglu kernels in one launch (ops_gemv, ops_gemv_q), the rest to
the tensor-core GEMMs (ops_gemm) and the swiglu kernel."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemm, ops_gemv, ops_gemv_q, ops_moe
from cupyglm.kernels.ops import Kernels, check, f32, i32, op


def _limit(limit):
    return i32(limit is not None), f32(0.0 if limit is None else limit)


def _weights(k: Kernels, name: str, x, w_gate, w_up, ndim: int):
    """Check x [M, K] bf16 and the gate / up weights ([N, K] or [E, N, K], bf16 or one QWeight format)."""
    check(name, "x", x, (None, None), k.bf16)
    kk = x.shape[1]
    if isinstance(w_gate, QWeight):
        ops_gemv_q.same(name, w_gate, w_up)
        ops_gemv_q.weight_args(name, w_gate, ndim, kk)
        ops_gemv_q.weight_args(name, w_up, ndim, kk)
        return ops_gemv_q
    check(name, "w_gate", w_gate, (None,) * (ndim - 1) + (kk,), k.bf16)
    check(name, "w_up", w_up, tuple(w_gate.shape), k.bf16)
    return ops_gemv


@op("gemm_swiglu")
def gemm_swiglu(k: Kernels, x, w_gate, w_up, limit, decode: int = 0):
    """x [M, K] bf16, w_gate / w_up [N, K] (bf16 or QWeight) -> [M, N] bf16 swiglu activation; rows [0, decode)
    decode rows."""
    gemv = _weights(k, "gemm_swiglu", x, w_gate, w_up, 2)
    m = x.shape[0]
    n = w_gate.shape[0]
    d = decode_rows("gemm_swiglu", decode, m)
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:
            gemv.gemv_swiglu(k, x, w_gate, w_up, y, d, _limit(limit))
        if d < m:
            gate, up = (ops_gemm.prompt_gemm(k, x[d:], w, out="bf16") for w in (w_gate, w_up))
            y[d:] = ops_moe.swiglu(k, gate, up, limit)
    return y


@op("gemm_grouped_swiglu")
def gemm_grouped_swiglu(k: Kernels, x, w_gate, w_up, group, limit, decode: int = 0):
    """x [M, K] bf16, w_gate / w_up [E, N, K] (bf16 or QWeight), group [M] int32 -> [M, N] bf16; row m uses expert
    group[m]; rows [0, decode) are decode/verify rows."""
    gemv = _weights(k, "gemm_grouped_swiglu", x, w_gate, w_up, 3)
    check("gemm_grouped_swiglu", "group", group, (x.shape[0],), np.int32)
    m = x.shape[0]
    e, n = w_gate.shape[0], w_gate.shape[1]
    d = decode_rows("gemm_grouped_swiglu", decode, m)
    if not (m and n):                        # no kernel reads the ids: checked here
        guards.ids_in_range(k, "gemm_grouped_swiglu", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:                                # each kernel checks the ids it reads (no check launch for the gemv)
            guard = guards.kernel_guard(k, "gemm_grouped_swiglu", "group", group[:d], e, "expert ids", own=True)
            gemv.gemv_grouped_swiglu(k, x[:d], w_gate, w_up, group[:d], y[:d], _limit(limit), guard)
        if d < m:
            gate, up = (ops_gemm.prompt_grouped(k, x[d:], w, group[d:], out="bf16") for w in (w_gate, w_up))
            y[d:] = ops_moe.swiglu(k, gate, up, limit)
    return y
