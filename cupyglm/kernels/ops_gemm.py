"""The weight GEMMs by row role (DESIGN §3b): dense, per head and grouped (per-row expert, the MoE), over bf16 or
quantised weights (FP8 block-scaled, NVFP4: cupyglm.backend.qweight.QWeight). Inputs are bf16 storage
(`k.bf16`); the output is fp32, or bf16 rounded once in the kernel's epilogue with out="bf16".

A row's role picks its kernel, never the number of rows: the call's leading `decode` rows (decode/verify rows,
cupyglm/backend/roles.py) go to the weight-streaming GEMVs (ops_gemv, ops_gemv_q), the rest to the tiled
tensor-core GEMMs (ops_gemm_tc, ops_gemm_tc_q). Both sum in the tensor core's order (backend/tc_order.py,
tc_quant.py), so a row has the same bits on either path."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemm_tc, ops_gemm_tc_q, ops_gemv, ops_gemv_q
from cupyglm.kernels.ops import Kernels, check, op


def prompt_gemm(k: Kernels, x, w, out: str):
    """Prompt rows on the tensor core: x [M, K] (or [H, M, K] with bf16 w [H, N, K]) -> [M, N] (or [H, M, N])."""
    if isinstance(w, QWeight):
        return ops_gemm_tc_q.gemm_tc_q(k, x, w, out=out)
    return ops_gemm_tc.gemm_tc(k, x, w, out=out)


def prompt_grouped(k: Kernels, x, w, group, out: str):
    """Prompt rows of the grouped GEMM on the tensor core (the launcher checks the ids): x [M, K], w [E, N, K]."""
    if isinstance(w, QWeight):
        return ops_gemm_tc_q.gemm_tc_grouped_q(k, x, w, group, out=out)
    return ops_gemm_tc.gemm_tc_grouped(k, x, w, group, out=out)


def _checked(k: Kernels, name: str, x, w, ndim: int):
    """Check x [M, K] bf16 against a bf16 or quantised weight of `ndim` dims; the weight's gemv module."""
    check(name, "x", x, (None, None), k.bf16)
    if isinstance(w, QWeight):
        ops_gemv_q.weight_args(name, w, ndim, x.shape[1])
        return ops_gemv_q
    check(name, "w", w, (None,) * (ndim - 1) + (x.shape[1],), k.bf16)
    return ops_gemv


def _suffix(name: str, out: str) -> str:
    return "_bf16" if out_kind(name, out) == "bf16" else ""


@op("gemm")
def gemm(k: Kernels, x, w, out: str = "f32", decode: int = 0):
    """[M, K] bf16 x [N, K] (bf16 or QWeight) -> [M, N] fp32 (out="bf16": rounded once to bf16); the leading
    `decode` rows are decode/verify rows (the gemv), the rest prompt rows (the tensor-core gemm)."""
    suffix = _suffix("gemm", out)
    gemv = _checked(k, "gemm", x, w, 2)
    m, kk = x.shape
    n = w.shape[0]
    d = decode_rows("gemm", decode, m)
    y = k.empty((m, n), k.bf16 if suffix else np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0                       # an empty sum is +0.0 (bf16 +0.0 is bit pattern 0)
            return y
        if d and gemv is ops_gemv_q:
            ops_gemv_q.gemv(k, x, w, y, d, suffix)
        elif d:
            ops_gemv.gemv(k, x[None], w[None], y[None], d, suffix)
        if d < m:
            y[d:] = prompt_gemm(k, x[d:], w, out)
    return y


@op("gemm_heads")
def gemm_heads(k: Kernels, x, w, out: str = "f32", decode: int = 0):
    """Per-head GEMM: [H, M, K] bf16 x [H, N, K] bf16 -> [H, M, N] fp32 (or bf16); rows [0, decode) of every head
    are decode/verify rows (the gemv), the rest prompt rows (the tensor-core gemm)."""
    suffix = _suffix("gemm_heads", out)
    check("gemm_heads", "x", x, (None, None, None), k.bf16)
    check("gemm_heads", "w", w, (x.shape[0], None, x.shape[2]), k.bf16)
    h, m, kk = x.shape
    n = w.shape[1]
    d = decode_rows("gemm_heads", decode, m)
    y = k.empty((h, m, n), k.bf16 if suffix else np.float32)
    if h and m and n:
        if kk == 0:
            y[...] = 0
            return y
        if d:
            ops_gemv.gemv(k, x, w, y, d, suffix)
        if d < m:
            y[:, d:] = prompt_gemm(k, k.xp.ascontiguousarray(x[:, d:]) if d else x, w, out)
    return y


@op("gemm_grouped")
def gemm_grouped(k: Kernels, x, w, group, out: str = "f32", decode: int = 0):
    """Grouped expert GEMM: x [M, K] bf16, w [E, N, K] (bf16 or QWeight), group [M] int32 -> [M, N] fp32 (or
    bf16); row m is gemm(x[m:m+1], w[group[m]]) bit for bit, whatever else shares the call. Rows [0, decode) are
    decode/verify rows (the grouped gemv: each expert's slice read once per run of its rows)."""
    suffix = _suffix("gemm_grouped", out)
    gemv = _checked(k, "gemm_grouped", x, w, 3)
    check("gemm_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w.shape[0], w.shape[1]
    d = decode_rows("gemm_grouped", decode, m)
    if not (m and n and kk):                 # no kernel reads the ids: checked here (no host sync of a device array)
        guards.ids_in_range(k, "gemm_grouped", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16 if suffix else np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0
            return y
        if d:                                # each kernel checks the ids it reads (no check launch for the gemv)
            guard = guards.kernel_guard(k, "gemm_grouped", "group", group[:d], e, "expert ids", own=True)
            gemv.gemv_grouped(k, x[:d], w, group[:d], y[:d], suffix, guard)
        if d < m:
            y[d:] = prompt_grouped(k, x[d:], w, group[d:], out)
    return y
