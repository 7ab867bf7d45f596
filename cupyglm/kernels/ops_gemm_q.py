"""Launchers of the quantised-weight kernels of cuda_src/gemm.cu and gemm_swiglu.cu (FP8 block-scaled and NVFP4
weights, cupyglm.backend.qweight.QWeight, dequantised in registers by cuda_src/dequant.cuh). The ops gemm,
gemm_grouped, gemm_swiglu and gemm_grouped_swiglu come here when their weight is a QWeight; activations are
bf16 and the lane-16 order is gemm_lane16's, so the bits are the reference's gemm(x, dequant(w))."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.backend.qweight import QWeight
from cupyglm.kernels import guards
from cupyglm.kernels.ops import Kernels, check, i32
from cupyglm.kernels.ops_gemm import MAX_ROWS, OUTS, grid


def _weight_args(op: str, w: QWeight, ndim: int, k_in: int) -> tuple:
    """The pointer arguments of one quantised weight, checked against its declared layout."""
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


def _extra(w: QWeight) -> tuple:
    return (i32(w.block[0]), i32(w.block[1])) if w.fmt == "fp8" else ()


def _same(op: str, a: QWeight, b: QWeight) -> None:
    if a.fmt != b.fmt or a.shape != b.shape or a.block != b.block:
        raise ValueError(f"{op}: gate and up weights differ in format, shape or block")


def gemm(k: Kernels, x, w: QWeight, out: str = "f32"):
    """[M, K] bf16 x quantised [N, K] -> [M, N] fp32 (out="bf16": rounded once), lane-16 order over K."""
    bf = out_kind("gemm", out) == "bf16"
    check("gemm", "x", x, (None, None), k.bf16)
    m, kk = x.shape
    args = _weight_args("gemm", w, 2, kk)
    n = w.shape[0]
    y = k.empty((m, n), k.bf16 if bf else np.float32)
    if m and n:
        k.launch("gemm.cu", f"gemm_{w.fmt}_lane16" + ("_bf16" if bf else ""), grid(m, n), (16, OUTS),
                 (x, *args, y, i32(m), i32(n), i32(kk), *_extra(w), i32(min(MAX_ROWS, m))))
    return y


def gemm_grouped(k: Kernels, x, w: QWeight, group, out: str = "f32"):
    """x [M, K] bf16, quantised experts [E, N, K], group [M] int32 -> [M, N] fp32 (or bf16)."""
    bf = out_kind("gemm_grouped", out) == "bf16"
    check("gemm_grouped", "x", x, (None, None), k.bf16)
    check("gemm_grouped", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    args = _weight_args("gemm_grouped", w, 3, kk)
    e, n = w.shape[0], w.shape[1]
    guards.ids_in_range(k, "gemm_grouped", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16 if bf else np.float32)
    if m and n:
        k.launch("gemm.cu", f"gemm_grouped_{w.fmt}_lane16" + ("_bf16" if bf else ""), grid(m, n), (16, OUTS),
                 (x, *args, group, y, i32(m), i32(n), i32(kk), i32(e), *_extra(w), i32(min(MAX_ROWS, m))))
    return y


def gemm_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, limit_args: tuple):
    """x [M, K] bf16, quantised gate / up [N, K] -> [M, N] bf16 swiglu activation."""
    check("gemm_swiglu", "x", x, (None, None), k.bf16)
    m, kk = x.shape
    _same("gemm_swiglu", w_gate, w_up)
    ga, ua = _weight_args("gemm_swiglu", w_gate, 2, kk), _weight_args("gemm_swiglu", w_up, 2, kk)
    n = w_gate.shape[0]
    y = k.empty((m, n), k.bf16)
    if m and n:
        k.launch("gemm_swiglu.cu", f"gemm_swiglu_{w_gate.fmt}_lane16", grid(m, n), (16, OUTS),
                 (x, *ga, *ua, y, i32(m), i32(n), i32(kk), *_extra(w_gate), i32(min(MAX_ROWS, m)), *limit_args))
    return y


def gemm_grouped_swiglu(k: Kernels, x, w_gate: QWeight, w_up: QWeight, group, limit_args: tuple):
    """x [M, K] bf16, quantised expert gate / up [E, N, K], group [M] int32 -> [M, N] bf16."""
    check("gemm_grouped_swiglu", "x", x, (None, None), k.bf16)
    check("gemm_grouped_swiglu", "group", group, (x.shape[0],), np.int32)
    m, kk = x.shape
    _same("gemm_grouped_swiglu", w_gate, w_up)
    ga = _weight_args("gemm_grouped_swiglu", w_gate, 3, kk)
    ua = _weight_args("gemm_grouped_swiglu", w_up, 3, kk)
    e, n = w_gate.shape[0], w_gate.shape[1]
    guards.ids_in_range(k, "gemm_grouped_swiglu", "group", group, e, "expert ids")
    y = k.empty((m, n), k.bf16)
    if m and n:
        k.launch("gemm_swiglu.cu", f"gemm_grouped_swiglu_{w_gate.fmt}_lane16", grid(m, n), (16, OUTS),
                 (x, *ga, *ua, group, y, i32(m), i32(n), i32(kk), i32(e), *_extra(w_gate),
                  i32(min(MAX_ROWS, m)), *limit_args))
    return y
