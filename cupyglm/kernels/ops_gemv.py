"""Launchers of cuda_src/gemv.cu: the decode/verify GEMM, which streams each bf16 weight once per call for all of
the call's decode/verify rows (DESIGN §3b). Not ops of their own: ops_gemm's gemm, gemm_heads and gemm_grouped
send a call's leading `decode` rows here (the rows whose role is decode or verify) and the rest to the
tensor-core GEMMs, as ops_gemm_swiglu does with gemv_swiglu.cu, so a row's path is set by its role, never by how
many rows share the call. Both paths sum in the tensor core's order (backend/tc_order.py): the reference's bits."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32

SRC = "gemv.cu"
SRC_SWIGLU = "gemv_swiglu.cu"
OUTS = 16          # GEMV_OUTS: output columns per block
ROWS = 16          # GEMV_ROWS: rows per block (a block reads its columns' weights once for these rows)
THREADS = (16, OUTS)
MAX_GRID = 65535


def grid(rows: int, n: int, h: int = 1) -> tuple[int, int, int]:
    """(column blocks, row groups, heads): N is split, K never; grid.x takes the columns (up to 2^31 - 1)."""
    groups = -(-rows // ROWS)
    if groups > MAX_GRID or h > MAX_GRID:
        raise ValueError(f"gemv: {rows} decode rows ({groups} row groups) or H={h} exceeds the grid's 65,535 limit")
    return -(-n // OUTS), groups, h


def gemv(k: Kernels, x, w, y, rows: int, suffix: str) -> None:
    """y[h, :rows] = x[h, :rows] @ w[h].T in the decode order. x [H, M, K] bf16, w [H, N, K] bf16, y [H, M, N]
    (fp32, or bf16 with suffix "_bf16"); rows in (0, M]; rows past `rows` are left as they are."""
    check("gemv_lane16", "x", x, (None, None, None), k.bf16)
    check("gemv_lane16", "w", w, (x.shape[0], None, x.shape[2]), k.bf16)
    h, m, kk = x.shape
    n = w.shape[1]
    check("gemv_lane16", "y", y, (h, m, n))
    if not 0 < rows <= m:
        raise ValueError(f"gemv_lane16: rows must be in (0, {m}], got {rows}")
    k.launch(SRC, "gemv_lane16" + suffix, grid(rows, n, h), THREADS, (x, w, y, i32(m), i32(n), i32(kk), i32(rows)))


def gemv_grouped(k: Kernels, x, w, group, y, suffix: str, guard) -> None:
    """y[m] = x[m] @ w[group[m]].T for every row (all decode/verify rows) in the decode order; a run of equal ids
    reads its expert's slice once. x [M, K] bf16, w [E, N, K] bf16, group [M] int32, y [M, N]; an id outside
    [0, E) gives a NaN row and is counted by the kernel into guard = (flags, slot) (guards.range_slot)."""
    check("gemv_grouped_lane16", "x", x, (None, None), k.bf16)
    check("gemv_grouped_lane16", "w", w, (None, None, x.shape[1]), k.bf16)
    check("gemv_grouped_lane16", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w.shape[0], w.shape[1]
    check("gemv_grouped_lane16", "y", y, (m, n))
    if m > MAX_GRID:
        raise ValueError(f"gemv_grouped_lane16: {m} decode rows exceed the grid's 65,535 limit")
    k.launch(SRC, "gemv_grouped_lane16" + suffix, (-(-n // OUTS), m, 1), THREADS,
             (x, w, group, y, i32(m), i32(n), i32(kk), i32(e), guard[0], i32(guard[1])))


def gemv_swiglu(k: Kernels, x, w_gate, w_up, y, rows: int, limit_args) -> None:
    """y[:rows] = swiglu of x[:rows]'s gate and up projections (bf16). x [M, K], w_* [N, K], y [M, N] bf16."""
    check("gemv_swiglu_lane16", "x", x, (None, None), k.bf16)
    check("gemv_swiglu_lane16", "w_gate", w_gate, (None, x.shape[1]), k.bf16)
    check("gemv_swiglu_lane16", "w_up", w_up, tuple(w_gate.shape), k.bf16)
    m, kk = x.shape
    n = w_gate.shape[0]
    check("gemv_swiglu_lane16", "y", y, (m, n), k.bf16)
    if not 0 < rows <= m:
        raise ValueError(f"gemv_swiglu_lane16: rows must be in (0, {m}], got {rows}")
    k.launch(SRC_SWIGLU, "gemv_swiglu_lane16", grid(rows, n)[:2], THREADS,
             (x, w_gate, w_up, y, i32(m), i32(n), i32(kk), i32(rows), *limit_args))


def gemv_grouped_swiglu(k: Kernels, x, w_gate, w_up, group, y, limit_args, guard) -> None:
    """Every row (all decode/verify rows): y[m] = swiglu of x[m] against expert group[m]'s gate and up slices;
    ids outside [0, E) counted into guard = (flags, slot) by the kernel."""
    check("gemv_grouped_swiglu_lane16", "x", x, (None, None), k.bf16)
    check("gemv_grouped_swiglu_lane16", "w_gate", w_gate, (None, None, x.shape[1]), k.bf16)
    check("gemv_grouped_swiglu_lane16", "w_up", w_up, tuple(w_gate.shape), k.bf16)
    check("gemv_grouped_swiglu_lane16", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w_gate.shape[0], w_gate.shape[1]
    check("gemv_grouped_swiglu_lane16", "y", y, (m, n), k.bf16)
    if m > MAX_GRID:
        raise ValueError(f"gemv_grouped_swiglu_lane16: {m} decode rows exceed the grid's 65,535 limit")
    k.launch(SRC_SWIGLU, "gemv_grouped_swiglu_lane16", (-(-n // OUTS), m, 1), THREADS,
             (x, w_gate, w_up, group, y, i32(m), i32(n), i32(kk), i32(e), *limit_args, guard[0], i32(guard[1])))
