"""Launchers of cuda_src/gemm.cu: the row-invariant GEMM (lane-16 order over K, DESIGN §1) and its grouped
(per-row expert) form for the MoE."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "gemm.cu"
OUTS = 16          # GEMM_OUTS: output columns per block
MAX_ROWS = 8       # GEMM_ROWS: rows per block at most


def _launch(k: Kernels, x, w, y, h: int, m: int, n: int, kk: int) -> None:
    rows = min(MAX_ROWS, m)
    grid = (-(-n // OUTS), -(-m // rows), h)
    k.launch(SRC, "gemm_lane16", grid, (16, OUTS), (x, w, y, i32(m), i32(n), i32(kk), i32(rows)))


@op("gemm")
def gemm(k: Kernels, x, w):
    """[M, K] bf16 x [N, K] bf16 -> [M, N] fp32, lane-16 order over K."""
    check("gemm", "x", x, (None, None), np.float32)
    check("gemm", "w", w, (None, x.shape[1]), np.float32)
    m, kk = x.shape
    n = w.shape[0]
    y = k.empty((m, n), np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0
        else:
            _launch(k, x, w, y, 1, m, n, kk)
    return y


@op("gemm_heads")
def gemm_heads(k: Kernels, x, w):
    """Per-head GEMM: [H, M, K] x [H, N, K] -> [H, M, N] fp32, lane-16 order over K."""
    check("gemm_heads", "x", x, (None, None, None), np.float32)
    check("gemm_heads", "w", w, (x.shape[0], None, x.shape[2]), np.float32)
    h, m, kk = x.shape
    n = w.shape[1]
    y = k.empty((h, m, n), np.float32)
    if h and m and n:
        if kk == 0:
            y[...] = 0
        else:
            _launch(k, x, w, y, h, m, n, kk)
    return y


@op("gemm_grouped")
def gemm_grouped(k: Kernels, x, w, group):
    """Grouped expert GEMM: x [M, K] bf16, w [E, N, K] bf16, group [M] int32 -> [M, N] fp32; row m is
    gemm(x[m:m+1], w[group[m]]) bit for bit (lane-16 order over K), whatever else shares the call."""
    check("gemm_grouped", "x", x, (None, None), np.float32)
    check("gemm_grouped", "w", w, (None, None, x.shape[1]), np.float32)
    check("gemm_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w.shape[0], w.shape[1]
    guards.ids_in_range(k, "gemm_grouped", "group", group, e, "expert ids")   # no host sync of a device array
    y = k.empty((m, n), np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0
        else:
            rows = min(MAX_ROWS, m)
            grid = (-(-n // OUTS), -(-m // rows), 1)
            k.launch(SRC, "gemm_grouped_lane16", grid, (16, OUTS),
                     (x, w, group, y, i32(m), i32(n), i32(kk), i32(e), i32(rows)))
    return y
