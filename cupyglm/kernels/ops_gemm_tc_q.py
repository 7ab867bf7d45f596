"""Launchers of cuda_src/gemm_tc_q.cu: the prompt-row GEMM on the tensor core for quantised weights (FP8
block-scaled, NVFP4; cupyglm.backend.qweight.QWeight), dense and grouped, summing in the quantised decode GEMV's
order (backend/tc_quant.py's quant_rows), so a prompt row's bits equal the decode row's for the same x and w.

Not ops of their own: the ops interface's prompt rows still go to the dequantising lane-16 kernels (ops_gemm_q);
these are what a backend routes them to once the reference sums prompt rows in the tensor core's order too."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32
from cupyglm.kernels.ops_gemv_q import tc_block_args, weight_args

SRC = "gemm_tc_q.cu"
TILE_M = 128       # GTQ_M: rows a block of the staged tile
TILE_N = 128       # GTQ_N: columns a block
SMALL_TILE_M = 64  # -DGTQ_SMALL: the tile of GPUs with less shared memory a block (the same bits)
SMALL = "GTQ_SMALL"
THREADS = (256, 1)
STAGE_K = 128      # GTQ_SK: k a stage
MAX_GRID = 65535
MAX_K = 2 ** 23    # the staged tile's 32-bit offsets: TILE_M K bf16 a block's x rows
OUTS = ("f32", "bf16")


def shared_bytes(tile_m: int, fmt: str = "nvfp4") -> int:
    """Two stages (x rows as bf16, weight columns at FP8's byte a k, NVFP4's group codes), then the running fp32
    sums of the block's tile (GtqAcc); FP8 on the big tile: a second GtqAcc, its slice sums (GTQ_VSH)."""
    sums = 2 if fmt == "fp8" and tile_m == TILE_M else 1
    return 2 * (tile_m * STAGE_K * 2 + TILE_N * STAGE_K + TILE_N * STAGE_K // 16) + sums * tile_m * TILE_N * 4


SHARED = {f: shared_bytes(TILE_M, f) for f in ("fp8", "nvfp4")}   # 226 / 162 KiB: sm_90 / sm_100 (the speed model's)
SMALL_SHARED = shared_bytes(SMALL_TILE_M)    # 98 KiB: fits sm_80 / sm_86 / sm_89 / sm_120's 99 KB


def grid(name: str, m: int, n: int, tile_m: int = TILE_M) -> tuple[int, int, int]:
    """(row blocks, column blocks, 1): the rows' blocks on grid.x (2^31 - 1), N's on y (65,535)."""
    cols = -(-n // TILE_N)
    if cols > MAX_GRID:
        raise ValueError(f"{name}: N={n} ({cols} column blocks of {TILE_N}) exceeds the grid's 65,535 limit")
    return -(-m // tile_m), cols, 1


def tile(k: Kernels, fmt: str) -> tuple[Kernels, int, int]:
    """(kernels, tile M, shared bytes) of fmt's kernels: the big tile where the device's opt-in limit takes it,
    else the GTQ_SMALL build of the same file."""
    kt, i = k.fitting("gemm_tc_q", ((SHARED[fmt], ()), (SMALL_SHARED, (SMALL,))))
    return (kt, *((TILE_M, SHARED[fmt]), (SMALL_TILE_M, SMALL_SHARED))[i])


def _launch(k: Kernels, name: str, fmt: str, m: int, n: int, kk: int, args: tuple) -> None:
    """One staged-tile launch: THREADS threads, the tile's dynamic shared memory (opted in)."""
    if kk > MAX_K:
        raise ValueError(f"{name}: K={kk} exceeds {MAX_K} (the staged tile's 32-bit offsets)")
    kt, tm, smem = tile(k, fmt)
    kt.launch_opted(SRC, name, grid(name, m, n, tm), THREADS, args, smem)


def _out(name: str, out: str) -> str:
    if out not in OUTS:
        raise ValueError(f"{name}: out must be one of {OUTS}, got {out!r}")
    return "_bf16" if out == "bf16" else ""


def _x(k: Kernels, name: str, x, w) -> tuple[int, int]:
    if not isinstance(w, QWeight):
        raise ValueError(f"{name}: weight must be a QWeight, got {type(w).__name__}")
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"{name}: parameter x must be [M, K], got shape {np.shape(x)}")
    check(name, "x", x, (None, None), k.bf16)
    return x.shape


def gemm_tc_q(k: Kernels, x, w: QWeight, out: str = "f32"):
    """x [M, K] bf16 @ dequant(w [N, K]).T -> [M, N] fp32 (out="bf16": rounded once), in the quantised decode
    order: every row's bits are tc_quant.quant_rows(x[m:m + 1], w)'s."""
    name = f"gemm_tc_{getattr(w, 'fmt', '?')}"
    suffix = _out(name, out)
    m, kk = _x(k, name, x, w)
    args = weight_args(name, w, 2, kk)
    n = w.shape[0]
    blocks = tc_block_args(w)
    y = k.empty((m, n), k.bf16 if out == "bf16" else np.float32)
    if m and n:
        if kk == 0:
            y[...] = 0                           # an empty sum is +0.0 (bf16 +0.0 is bit pattern 0)
        else:
            _launch(k, name + suffix, w.fmt, m, n, kk, (x, *args, y, i32(m), i32(n), i32(kk), *blocks))
    return y


def gemm_tc_grouped_q(k: Kernels, x, w: QWeight, group, out: str = "f32"):
    """y[m] = x[m] @ dequant(w[group[m]]).T -> [M, N] fp32 (or bf16), x [M, K] bf16, w an [E, N, K] QWeight stack,
    group [M] int32 in any order: every row's bits are quant_rows(x[m:m + 1], w[group[m]])'s. Ids outside [0, E)
    are refused (a host array at once, a device array by a device check read after the step; their rows NaN)."""
    name = f"gemm_tc_grouped_{getattr(w, 'fmt', '?')}"
    suffix = _out(name, out)
    m, kk = _x(k, name, x, w)
    check(name, "group", group, (m,), np.int32)
    args = weight_args(name, w, 3, kk)
    e, n = w.shape[0], w.shape[1]
    blocks = tc_block_args(w)
    y = k.empty((m, n), k.bf16 if out == "bf16" else np.float32)
    if not (m and n):
        return y
    guards.ids_in_range(k, name, "group", group, e, "expert ids")    # no host sync of a device array
    if kk == 0:
        y[...] = 0
    else:
        _launch(k, name + suffix, w.fmt, m, n, kk, (x, *args, group, y, i32(m), i32(n), i32(kk), i32(e), *blocks))
    return y
