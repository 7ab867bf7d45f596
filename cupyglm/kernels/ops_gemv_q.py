"""Launchers of cuda_src/gemv_q.cu: the decode/verify GEMV for quantised weights (FP8 block-scaled, NVFP4;
cupyglm.backend.qweight.QWeight), which streams the packed bytes and scales once per call for every 16 of the
call's decode/verify rows and dequantises them in registers (dequant.cuh). Not ops of their own: ops_gemm sends
a call's leading `decode` rows here (their role, cupyglm/backend/roles.py) and the rest to the tensor-core GEMMs
(ops_gemm_tc_q); both have the bits of the reference's tc_quant.quant_rows (the tensor core's order over exact
bf16 weights)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.backend.tc_quant import fp8_block
from cupyglm.kernels.ops import Kernels, check, i32
from cupyglm.kernels.ops_gemv import MAX_GRID, OUTS, THREADS, grid

SRC = "gemv_q.cu"
PAIR_OUTS = 8   # gemv_q_block.cuh's GEMV_Q_PAIR_OUTS: output columns of a dense SwiGLU block (gate and up in one chain)


def weight_args(op: str, w: QWeight, ndim: int, k_in: int) -> tuple:
    """The pointer arguments of one quantised weight (values, scales), checked against its declared layout."""
    if not isinstance(w, QWeight) or w.ndim != ndim:
        raise ValueError(f"{op}: weight must be a {ndim}-d QWeight")
    if w.shape[-1] != k_in:
        raise ValueError(f"{op}: x has K={k_in} but the weight has K={w.shape[-1]}")
    check(op, "weight values", w.values, None, np.uint8)
    if w.fmt == "fp8":
        check(op, "weight_scale_inv", w.scale, None, np.float32)
        return (w.values, w.scale)
    check(op, "weight_scale", w.scale, None, np.uint8)
    check(op, "weight_scale_2", w.scale2, None, np.float32)
    return (w.values, w.scale, w.scale2)


def block_args(w: QWeight) -> tuple:
    """FP8's (bn, bk) scalars; NVFP4 has none (its group is 16)."""
    return (i32(w.block[0]), i32(w.block[1])) if w.fmt == "fp8" else ()


def tc_block_args(w: QWeight) -> tuple:
    """block_args of a decode GEMV: FP8's bk whole 32-k units (tc_quant.fp8_block refuses others)."""
    if w.fmt == "fp8":
        fp8_block(w)
    return block_args(w)


def same(op: str, a: QWeight, b: QWeight) -> None:
    if not isinstance(a, QWeight) or not isinstance(b, QWeight):
        raise ValueError(f"{op}: gate and up weights must both be QWeights")
    if a.fmt != b.fmt or a.shape != b.shape or a.block != b.block:
        raise ValueError(f"{op}: gate and up weights differ in format, shape or block")


def _rows(op: str, rows: int, m: int) -> None:
    if not 0 < rows <= m:
        raise ValueError(f"{op}: rows must be in (0, {m}], got {rows}")


def gemv(k: Kernels, x, w: QWeight, y, rows: int, suffix: str) -> None:
    """y[:rows] = x[:rows] @ dequant(w).T in the quantised decode order (tc_quant). x [M, K] bf16, w quantised
    [N, K], y [M, N] (fp32, or bf16 with suffix "_bf16"); rows past `rows` are left as they are."""
    name = f"gemv_{w.fmt}_lane16"
    check(name, "x", x, (None, None), k.bf16)
    m, kk = x.shape
    args = weight_args(name, w, 2, kk)
    n = w.shape[0]
    check(name, "y", y, (m, n), k.bf16 if suffix else np.float32)
    _rows(name, rows, m)
    k.launch(SRC, name + suffix, grid(rows, n)[:2], THREADS,
             (x, *args, y, i32(m), i32(n), i32(kk), *tc_block_args(w), i32(rows)))


def gemv_grouped(k: Kernels, x, w: QWeight, group, y, suffix: str, guard) -> None:
    """y[m] = x[m] @ dequant(w[group[m]]).T for every row (all decode/verify rows); a run of equal ids reads its
    expert's bytes once. x [M, K] bf16, w quantised [E, N, K], group [M] int32, y [M, N]; an id outside [0, E)
    gives a NaN row and is counted by the kernel into guard = (flags, slot) (guards.range_slot)."""
    name = f"gemv_grouped_{w.fmt}_lane16"
    check(name, "x", x, (None, None), k.bf16)
    check(name, "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    args = weight_args(name, w, 3, kk)
    e, n = w.shape[0], w.shape[1]
    check(name, "y", y, (m, n), k.bf16 if suffix else np.float32)
    if m > MAX_GRID:
        raise ValueError(f"{name}: {m} decode rows exceed the grid's 65,535 limit")
    k.launch(SRC, name + suffix, (-(-n // OUTS), m, 1), THREADS,
             (x, *args, group, y, i32(m), i32(n), i32(kk), i32(e), *tc_block_args(w), guard[0], i32(guard[1])))


def gemv_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, y, rows: int, limit_args) -> None:
    """y[:rows] = swiglu of x[:rows]'s gate and up projections (bf16). x [M, K], w_* quantised [N, K]."""
    name = f"gemv_swiglu_{w_gate.fmt}_lane16"
    check(name, "x", x, (None, None), k.bf16)
    same(name, w_gate, w_up)
    m, kk = x.shape
    ga, ua = weight_args(name, w_gate, 2, kk), weight_args(name, w_up, 2, kk)
    n = w_gate.shape[0]
    check(name, "y", y, (m, n), k.bf16)
    _rows(name, rows, m)
    k.launch(SRC, name, (-(-n // PAIR_OUTS), grid(rows, n)[1]), THREADS,
             (x, *ga, *ua, y, i32(m), i32(n), i32(kk), *tc_block_args(w_gate), i32(rows), *limit_args))


def gemv_grouped_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, group, y, limit_args, guard) -> None:
    """Every row (all decode/verify rows): y[m] = swiglu of x[m] against expert group[m]'s quantised gate and up;
    ids outside [0, E) counted into guard = (flags, slot) by the kernel."""
    name = f"gemv_grouped_swiglu_{w_gate.fmt}_lane16"
    check(name, "x", x, (None, None), k.bf16)
    check(name, "group", group, (x.shape[0],), np.int32)
    same(name, w_gate, w_up)
    m, kk = x.shape
    ga, ua = weight_args(name, w_gate, 3, kk), weight_args(name, w_up, 3, kk)
    e, n = w_gate.shape[0], w_gate.shape[1]
    check(name, "y", y, (m, n), k.bf16)
    if m > MAX_GRID:
        raise ValueError(f"{name}: {m} decode rows exceed the grid's 65,535 limit")
    k.launch(SRC, name, (-(-n // OUTS), m, 1), THREADS,
             (x, *ga, *ua, group, y, i32(m), i32(n), i32(kk), i32(e), *tc_block_args(w_gate), *limit_args,
              guard[0], i32(guard[1])))

