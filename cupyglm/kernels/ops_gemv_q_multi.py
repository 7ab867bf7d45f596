"""Launchers of cuda_src/gemv_q_multi.cu: several decode/verify GEMVs of quantised weights in one launch, each
part bit for bit its own launch's (ops_gemv_q, ops_gemm_multi). Not ops of their own: ops_gemm_multi sends a
call's decode rows here when a part is quantised."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.kernels.ops import Kernels, check, i32
from cupyglm.kernels.ops_gemv import OUTS, THREADS, grid
from cupyglm.kernels.ops_gemv_q import PAIR_OUTS, _rows, same, tc_block_args, weight_args

SRC = "gemv_q_multi.cu"
PARTS = 3       # gemv_q_multi.cu's GEMV_Q_MULTI_PARTS: quantised parts, and bf16 parts, of gemv_multi_{fmt}


def _groups(name: str, rows: int, m: int) -> int:
    """The grid's row groups of the call's leading `rows` rows (ops_gemv_q's row check, ops_gemv.grid's limit)."""
    _rows(name, rows, m)
    return grid(rows, 1)[1]


def _y(k: Kernels, name: str, label: str, y, m: int, n: int, kind: int) -> None:
    check(name, label, y, (m, n), np.float32 if kind == 0 else k.bf16)


def gemv_multi_swiglu(k: Kernels, x, w, ya, kind: int, w_gate: QWeight, w_up: QWeight, ys, rows: int,
                      limit_args) -> None:
    """ya[:rows] = x[:rows] @ w.T (bf16 w [N_a, K], gemv_multi.cu's epilogue `kind`) and ys[:rows] = the swiglu of
    x[:rows]'s quantised gate and up projections [N_s, K], in one launch (the MoE's router and shared expert)."""
    name = f"gemv_multi_swiglu_{w_gate.fmt}_lane16"
    check(name, "x", x, (None, None), k.bf16)
    same(name, w_gate, w_up)
    m, kk = x.shape
    check(name, "w", w, (None, kk), k.bf16)
    ga, ua = weight_args(name, w_gate, 2, kk), weight_args(name, w_up, 2, kk)
    na, ns = w.shape[0], w_gate.shape[0]
    _y(k, name, "ya", ya, m, na, kind)
    check(name, "ys", ys, (m, ns), k.bf16)
    blocks = -(-na // OUTS) + -(-ns // PAIR_OUTS)
    k.launch(SRC, name, (blocks, _groups(name, rows, m)), THREADS,
             (x, w, ya, i32(na), i32(kind), *ga, *ua, ys, i32(ns), i32(m), i32(kk), *tc_block_args(w_gate), i32(rows),
              *limit_args))


def gemv_multi(k: Kernels, qparts, bparts, rows: int) -> None:
    """Every part's y[:rows] = epilogue(x[:rows] @ w.T) in one launch: qparts up to PARTS (x, QWeight [N, K] of one
    format and block, y, kind), bparts up to PARTS (x, bf16 w [N, K], y, kind); x [M, K] bf16, y [M, N] (fp32 for
    kind 0, bf16 for 1 and 2)."""
    fmt = qparts[0][1].fmt
    name = f"gemv_multi_{fmt}_lane16"
    if not (0 < len(qparts) <= PARTS and len(bparts) <= PARTS):
        raise ValueError(f"{name}: 1..{PARTS} quantised and 0..{PARTS} bf16 parts, got {len(qparts)}, {len(bparts)}")
    m = qparts[0][0].shape[0]
    args, blocks = [], 0
    for p, (x, w, y, kind) in enumerate(qparts):
        check(name, f"xq{p}", x, (m, None), k.bf16)
        wa = weight_args(name, w, 2, x.shape[1])
        if w.fmt != fmt or w.block != qparts[0][1].block:
            raise ValueError(f"{name}: quantised parts differ in format or block")
        _y(k, name, f"yq{p}", y, m, w.shape[0], kind)
        args += [x, *wa, y, i32(w.shape[0]), i32(x.shape[1]), i32(kind)]
        blocks += -(-w.shape[0] // OUTS)
    x0, w0, y0 = qparts[0][0], qparts[0][1], qparts[0][2]
    for _ in range(len(qparts), PARTS):                    # unused parts: no columns, no blocks
        args += [x0, *weight_args(name, w0, 2, x0.shape[1]), y0, i32(0), i32(x0.shape[1]), i32(0)]
    args += list(tc_block_args(w0))
    for p, (x, w, y, kind) in enumerate(bparts):
        check(name, f"x{p}", x, (m, None), k.bf16)
        check(name, f"w{p}", w, (None, x.shape[1]), k.bf16)
        _y(k, name, f"y{p}", y, m, w.shape[0], kind)
        args += [x, w, y, i32(w.shape[0]), i32(x.shape[1]), i32(kind)]
        blocks += -(-w.shape[0] // OUTS)
    for _ in range(len(bparts), PARTS):
        args += [x0, x0, y0, i32(0), i32(x0.shape[1]), i32(0)]
    k.launch(SRC, name, (blocks, _groups(name, rows, m), 1), THREADS, (*args, i32(m), i32(rows)))
