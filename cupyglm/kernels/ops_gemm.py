"""Launchers of cuda_src/gemm.cu: the row-invariant GEMM (lane-16 order over K, DESIGN §1) and its grouped
(per-row expert) form for the MoE. Inputs are bf16 storage (`k.bf16`); the output is fp32, or bf16 rounded in
the kernel's epilogue with out="bf16" (the `_bf16` kernels).

A row's role picks its kernel: the call's leading `decode` rows (decode/verify rows, cupyglm/backend/roles.py) go
to the weight-streaming gemv.cu (ops_gemv, the tensor core's decode order: backend/tc_order.py), the rest to
gemm.cu; never the number of rows."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.backend.qweight import QWeight
from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import guards, ops_gemv
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "gemm.cu"
OUTS = 16          # GEMM_OUTS: output columns per block
MAX_ROWS = 8       # GEMM_ROWS: rows per block at most
MAX_GRID_Y = 65535


def grid(m: int, n: int, h: int = 1) -> tuple[int, int, int]:
    """(row blocks, column blocks, heads): the rows on grid.x (2^31 - 1), never on y or z (65,535)."""
    rows = min(MAX_ROWS, m)
    cols = -(-n // OUTS)
    if cols > MAX_GRID_Y or h > MAX_GRID_Y:
        raise ValueError(f"gemm: N={n} (grid.y {cols}) or H={h} exceeds the grid's 65,535 limit")
    return -(-m // rows), cols, h


def _out(k: Kernels, name: str, out: str):
    """(dtype of y, kernel suffix) for the output choice."""
    return (k.bf16, "_bf16") if out_kind(name, out) == "bf16" else (np.float32, "")


def _zero(k: Kernels, y):
    """An empty sum (K = 0) is +0.0 in both storages (bf16 +0.0 is bit pattern 0)."""
    y[...] = 0
    return y


def _launch(k: Kernels, x, w, y, h: int, m: int, n: int, kk: int, suffix: str) -> None:
    rows = min(MAX_ROWS, m)
    k.launch(SRC, "gemm_lane16" + suffix, grid(m, n, h), (16, OUTS), (x, w, y, i32(m), i32(n), i32(kk), i32(rows)))


def _by_role(k: Kernels, x, w, y, d: int, suffix: str) -> None:
    """x [H, M, K], w [H, N, K], y [H, M, N]: rows [0, d) through the gemv, rows [d, M) through the gemm."""
    h, m, kk = x.shape
    n = w.shape[1]
    if d:
        ops_gemv.gemv(k, x, w, y, d, suffix)
    if d < m:
        if d and h > 1:                          # a mixed per-head call: the prompt rows as their own block
            yp = k.empty((h, m - d, n), y.dtype)
            _launch(k, k.xp.ascontiguousarray(x[:, d:]), w, yp, h, m - d, n, kk, suffix)
            y[:, d:] = yp
        else:
            _launch(k, x[:, d:], w, y[:, d:], h, m - d, n, kk, suffix)


@op("gemm")
def gemm(k: Kernels, x, w, out: str = "f32", decode: int = 0):
    """[M, K] bf16 x [N, K] bf16 -> [M, N] fp32 (out="bf16": rounded once to bf16), the leading
    `decode` rows are decode/verify rows (the gemv, decode order), the rest prompt rows (the gemm, lane-16 order)."""
    if isinstance(w, QWeight):                      # FP8 / NVFP4 weights, dequantised in registers (by role)
        from cupyglm.kernels import ops_gemm_q
        return ops_gemm_q.gemm(k, x, w, out, decode)
    dt, suffix = _out(k, "gemm", out)
    check("gemm", "x", x, (None, None), k.bf16)
    check("gemm", "w", w, (None, x.shape[1]), k.bf16)
    m, kk = x.shape
    n = w.shape[0]
    d = decode_rows("gemm", decode, m)
    y = k.empty((m, n), dt)
    if m and n:
        if kk == 0:
            _zero(k, y)
        else:
            _by_role(k, x[None], w[None], y[None], d, suffix)
    return y


@op("gemm_heads")
def gemm_heads(k: Kernels, x, w, out: str = "f32", decode: int = 0):
    """Per-head GEMM: [H, M, K] bf16 x [H, N, K] bf16 -> [H, M, N] fp32 (or bf16); rows [0, decode) of
    every head are decode/verify rows (the gemv, decode order), the rest lane-16 order over K."""
    dt, suffix = _out(k, "gemm_heads", out)
    check("gemm_heads", "x", x, (None, None, None), k.bf16)
    check("gemm_heads", "w", w, (x.shape[0], None, x.shape[2]), k.bf16)
    h, m, kk = x.shape
    n = w.shape[1]
    d = decode_rows("gemm_heads", decode, m)
    y = k.empty((h, m, n), dt)
    if h and m and n:
        if kk == 0:
            _zero(k, y)
        else:
            _by_role(k, x, w, y, d, suffix)
    return y


@op("gemm_grouped")
def gemm_grouped(k: Kernels, x, w, group, out: str = "f32", decode: int = 0):
    """Grouped expert GEMM: x [M, K] bf16, w [E, N, K] bf16, group [M] int32 -> [M, N] fp32 (or bf16); row m
    is gemm(x[m:m+1], w[group[m]], decode=int(m < decode)) bit for bit, whatever else shares the call. Rows
    [0, decode) are decode/verify rows (the grouped gemv: each expert's slice read once per run of its rows)."""
    if isinstance(w, QWeight):
        from cupyglm.kernels import ops_gemm_q
        return ops_gemm_q.gemm_grouped(k, x, w, group, out, decode)
    dt, suffix = _out(k, "gemm_grouped", out)
    check("gemm_grouped", "x", x, (None, None), k.bf16)
    check("gemm_grouped", "w", w, (None, None, x.shape[1]), k.bf16)
    check("gemm_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w.shape[0], w.shape[1]
    d = decode_rows("gemm_grouped", decode, m)
    if d < m or not (n and kk):              # the gemv checks the ids it reads itself (no check launch)
        guards.ids_in_range(k, "gemm_grouped", "group", group, e, "expert ids")   # no host sync of a device array
    y = k.empty((m, n), dt)
    if m and n:
        if kk == 0:
            _zero(k, y)
            return y
        if d:
            guard = guards.kernel_guard(k, "gemm_grouped", "group", group, e, "expert ids", own=d == m)
            ops_gemv.gemv_grouped(k, x[:d], w, group[:d], y[:d], suffix, guard)
        if d < m:
            rows = min(MAX_ROWS, m - d)
            k.launch(SRC, "gemm_grouped_lane16" + suffix, grid(m - d, n), (16, OUTS),
                     (x[d:], w, group[d:], y[d:], i32(m - d), i32(n), i32(kk), i32(e), i32(rows)))
    return y
