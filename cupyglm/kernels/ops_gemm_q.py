"""Launchers of the quantised-weight kernels (FP8 block-scaled and NVFP4 weights, cupyglm.backend.qweight.QWeight,
dequantised in registers by cuda_src/dequant.cuh). The ops gemm, gemm_grouped, gemm_swiglu and
gemm_grouped_swiglu come here when their weight is a QWeight; a call's leading `decode` rows (decode/verify rows,
cupyglm/backend/roles.py) go to the weight-streaming gemv_q.cu (ops_gemv_q), the rest to gemm.cu /
gemm_swiglu.cu, by role, never by the number of rows. Activations are bf16 and the lane-16 order is
gemm_lane16's, so either path gives the reference's gemm(x, dequant(w)) bit for bit."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemv_q
from cupyglm.kernels.ops import Kernels, check, i32
from cupyglm.kernels.ops_gemm import MAX_ROWS, OUTS, grid
from cupyglm.kernels.ops_gemv_q import block_args as _extra, same as _same, weight_args as _weight_args


def gemm(k: Kernels, x, w: QWeight, out: str = "f32", decode: int = 0):
    """[M, K] bf16 x quantised [N, K] -> [M, N] fp32 (out="bf16": rounded once), lane-16 order over K; rows
    [0, decode) through the quantised gemv."""
    bf = out_kind("gemm", out) == "bf16"
    suffix = "_bf16" if bf else ""
    check("gemm", "x", x, (None, None), k.bf16)
    m, kk = x.shape
    args = _weight_args("gemm", w, 2, kk)
    d = decode_rows("gemm", decode, m)
    n = w.shape[0]
    y = k.empty((m, n), k.bf16 if bf else np.float32)
    if m and n:
        if d:
            ops_gemv_q.gemv(k, x, w, y, d, suffix)
        if d < m:
            k.launch("gemm.cu", f"gemm_{w.fmt}_lane16" + suffix, grid(m - d, n), (16, OUTS),
                     (x[d:], *args, y[d:], i32(m - d), i32(n), i32(kk), *_extra(w), i32(min(MAX_ROWS, m - d))))
    return y


def gemm_grouped(k: Kernels, x, w: QWeight, group, out: str = "f32", decode: int = 0):
    """x [M, K] bf16, quantised experts [E, N, K], group [M] int32 -> [M, N] fp32 (or bf16); rows [0, decode)
    through the grouped quantised gemv (it checks the ids it reads itself)."""
    bf = out_kind("gemm_grouped", out) == "bf16"
    suffix = "_bf16" if bf else ""
    check("gemm_grouped", "x", x, (None, None), k.bf16)
    check("gemm_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    args = _weight_args("gemm_grouped", w, 3, kk)
    e, n = w.shape[0], w.shape[1]
    d = decode_rows("gemm_grouped", decode, m)
    if d < m or not n:
        guards.ids_in_range(k, "gemm_grouped", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16 if bf else np.float32)
    if m and n:
        if d:
            guard = guards.kernel_guard(k, "gemm_grouped", "group", group, e, "expert ids", own=d == m)
            ops_gemv_q.gemv_grouped(k, x[:d], w, group[:d], y[:d], suffix, guard)
        if d < m:
            k.launch("gemm.cu", f"gemm_grouped_{w.fmt}_lane16" + suffix, grid(m - d, n), (16, OUTS),
                     (x[d:], *args, group[d:], y[d:], i32(m - d), i32(n), i32(kk), i32(e), *_extra(w),
                      i32(min(MAX_ROWS, m - d))))
    return y


def gemm_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, limit_args: tuple, decode: int = 0):
    """x [M, K] bf16, quantised gate / up [N, K] -> [M, N] bf16 swiglu activation; rows [0, decode) decode rows."""
    check("gemm_swiglu", "x", x, (None, None), k.bf16)
    m, kk = x.shape
    _same("gemm_swiglu", w_gate, w_up)
    ga, ua = _weight_args("gemm_swiglu", w_gate, 2, kk), _weight_args("gemm_swiglu", w_up, 2, kk)
    d = decode_rows("gemm_swiglu", decode, m)
    n = w_gate.shape[0]
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:
            ops_gemv_q.gemv_swiglu(k, x, w_gate, w_up, y, d, limit_args)
        if d < m:
            k.launch("gemm_swiglu.cu", f"gemm_swiglu_{w_gate.fmt}_lane16", grid(m - d, n), (16, OUTS),
                     (x[d:], *ga, *ua, y[d:], i32(m - d), i32(n), i32(kk), *_extra(w_gate),
                      i32(min(MAX_ROWS, m - d)), *limit_args))
    return y


def gemm_grouped_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, group, limit_args: tuple, decode: int = 0):
    """x [M, K] bf16, quantised expert gate / up [E, N, K], group [M] int32 -> [M, N] bf16; rows [0, decode)
    decode rows."""
    check("gemm_grouped_swiglu", "x", x, (None, None), k.bf16)
    check("gemm_grouped_swiglu", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    _same("gemm_grouped_swiglu", w_gate, w_up)
    ga = _weight_args("gemm_grouped_swiglu", w_gate, 3, kk)
    ua = _weight_args("gemm_grouped_swiglu", w_up, 3, kk)
    e, n = w_gate.shape[0], w_gate.shape[1]
    d = decode_rows("gemm_grouped_swiglu", decode, m)
    if d < m or not n:
        guards.ids_in_range(k, "gemm_grouped_swiglu", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16)
    if m and n:
        if d:
            guard = guards.kernel_guard(k, "gemm_grouped_swiglu", "group", group, e, "expert ids", own=d == m)
            ops_gemv_q.gemv_grouped_swiglu(k, x[:d], w_gate, w_up, group[:d], y[:d], limit_args, guard)
        if d < m:
            k.launch("gemm_swiglu.cu", f"gemm_grouped_swiglu_{w_gate.fmt}_lane16", grid(m - d, n), (16, OUTS),
                     (x[d:], *ga, *ua, group[d:], y[d:], i32(m - d), i32(n), i32(kk), i32(e), *_extra(w_gate),
                      i32(min(MAX_ROWS, m - d)), *limit_args))
    return y
