"""Launcher of cuda_src/gemm_tc.cu: the prompt-row GEMM on the tensor core (mma.m16n8k16), summing in the decode
GEMV's order (backend/tc_order.py's tc_rows), so a row's bits equal the decode row's for the same x and w; and its
grouped-experts form (gemm_tc_grouped: each row against its expert's slice).

Not an op of its own: ops_gemm sends the prompt rows of bf16 GEMMs here (their role, backend/roles.py)."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32

SRC = "gemm_tc.cu"
DENSE_TILE_M = 128       # GTS_M: rows a block of the staged tile (every kernel of gemm_tc.cu)
DENSE_TILE_N = 256       # GTS_N
DENSE_THREADS = (256, 1)
STAGES = 2               # GTS_STAGES: k-tiles in flight, each (tile M + tile N) rows of 64 bf16
SMALL_TILE_M = 64        # -DGTS_SMALL: the tile of GPUs with less shared memory a block (the same bits)
SMALL_TILE_N = 128
SMALL = "GTS_SMALL"
MAX_GRID = 65535
MAX_K = 2 ** 23          # the staged tile's 32-bit byte offsets: 2 DENSE_TILE_N K bytes a block's w rows
OUTS = ("f32", "bf16")


def shared_bytes(tile_m: int, tile_n: int) -> int:
    """The stages, then the running fp32 sums of the block's tile (GtsAcc)."""
    return STAGES * (tile_m + tile_n) * 64 * 2 + tile_m * tile_n * 4


DENSE_SHARED = shared_bytes(DENSE_TILE_M, DENSE_TILE_N)     # 224 KiB: sm_90 / sm_100 (the speed model's)
SMALL_SHARED = shared_bytes(SMALL_TILE_M, SMALL_TILE_N)     # 80 KiB: fits sm_80 / sm_86 / sm_89 / sm_120's 99 KB


def grid(m: int, n: int, h: int = 1, tile_m: int = DENSE_TILE_M, tile_n: int = DENSE_TILE_N) -> tuple[int, int, int]:
    """(row blocks, column blocks, heads): the rows' blocks on grid.x (2^31 - 1), N's and H on y and z (65,535)."""
    cols = -(-n // tile_n)
    if cols > MAX_GRID or h > MAX_GRID:
        raise ValueError(f"gemm_tc: N={n} ({cols} column blocks of {tile_n}) or H={h} exceeds the grid's 65,535 "
                         f"limit")
    return -(-m // tile_m), cols, h


def tile(k: Kernels) -> tuple[Kernels, int, int, int]:
    """(kernels, tile M, tile N, shared bytes): the big tile where the device's opt-in limit takes it, else the
    GTS_SMALL build of the same file."""
    kt, i = k.fitting("gemm_tc", ((DENSE_SHARED, ()), (SMALL_SHARED, (SMALL,))))
    return (kt, *((DENSE_TILE_M, DENSE_TILE_N, DENSE_SHARED), (SMALL_TILE_M, SMALL_TILE_N, SMALL_SHARED))[i])


def _check_k(name: str, kk: int) -> None:
    if kk > MAX_K:
        raise ValueError(f"{name}: K={kk} exceeds {MAX_K} (the staged tile's 32-bit offsets)")


def _launch(k: Kernels, name: str, m: int, n: int, h: int, args: tuple) -> None:
    """One staged-tile launch: DENSE_THREADS threads, the tile's dynamic shared memory (opted in)."""
    kt, tm, tn, smem = tile(k)
    kt.launch_opted(SRC, name, grid(m, n, h, tm, tn), DENSE_THREADS, args, smem)


def gemm_tc(k: Kernels, x, w, out: str = "f32"):
    """x [M, K] bf16 @ w [N, K] bf16 -> [M, N] fp32 (out="bf16": rounded once to bf16), in the tensor core's
    decode order; per head with x [H, M, K] and w [H, N, K] -> [H, M, N]."""
    if out not in OUTS:
        raise ValueError(f"gemm_tc: out must be one of {OUTS}, got {out!r}")
    if getattr(x, "ndim", None) not in (2, 3):
        raise ValueError(f"gemm_tc: parameter x must be [M, K] or [H, M, K], got shape {np.shape(x)}")
    heads = x.ndim == 3
    check("gemm_tc", "x", x, (None,) * x.ndim, k.bf16)
    check("gemm_tc", "w", w, ((x.shape[0], None, x.shape[2]) if heads else (None, x.shape[1])), k.bf16)
    x3, w3 = (x, w) if heads else (x[None], w[None])
    h, m, kk = x3.shape
    n = w3.shape[1]
    _check_k("gemm_tc", kk)
    y = k.empty((h, m, n), k.bf16 if out == "bf16" else np.float32)
    if h and m and n:
        if kk == 0:
            y[...] = 0                           # an empty sum is +0.0 (bf16 +0.0 is bit pattern 0)
        else:
            _launch(k, "gemm_tc" + ("_bf16" if out == "bf16" else ""), m, n, h,
                    (x3, w3, y, i32(m), i32(n), i32(kk)))
    return y if heads else y[0]


def gemm_tc_grouped(k: Kernels, x, w, group, out: str = "f32"):
    """Grouped experts: x [M, K] bf16, w [E, N, K] bf16, group [M] int32 -> [M, N] fp32 (out="bf16": rounded once
    to bf16); row m is gemm_tc(x[m:m+1], w[group[m]]) bit for bit, rows in any order. Ids outside [0, E) are
    refused (a host array at once, a device array by the step's device checks; such a row gets NaN)."""
    if out not in OUTS:
        raise ValueError(f"gemm_tc_grouped: out must be one of {OUTS}, got {out!r}")
    check("gemm_tc_grouped", "x", x, (None, None), k.bf16)
    check("gemm_tc_grouped", "w", w, (None, None, x.shape[1]), k.bf16)
    check("gemm_tc_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    e, n = w.shape[0], w.shape[1]
    _check_k("gemm_tc_grouped", kk)
    guards.ids_in_range(k, "gemm_tc_grouped", "group", group, e, "expert ids")     # no host sync of a device array
    y = k.empty((m, n), k.bf16 if out == "bf16" else np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0                           # an empty sum is +0.0 (bf16 +0.0 is bit pattern 0)
        else:
            _launch(k, "gemm_tc_grouped" + ("_bf16" if out == "bf16" else ""), m, n, 1,
                    (x, w, group, y, i32(m), i32(n), i32(kk), i32(e)))
    return y
