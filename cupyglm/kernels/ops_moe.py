"""MoE launchers (cuda_src/moe.cu): moe_route, swiglu, moe_combine and the elementwise sigmoid, with
NumpyOps' signatures."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "moe.cu"
F32 = np.float32
ROUTE_WARPS = 4      # token rows per moe_route block (one warp each)


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("moe_route")
def moe_route(k: Kernels, logits, bias, topk, scale):
    """logits: [T, E] fp32, bias: [E] fp32 -> (ids [T, k] int32 in pick order, weights [T, k] fp32)."""
    logits = _arg(k, "moe_route", "logits", logits, (None, None))
    t, e = logits.shape
    bias = _arg(k, "moe_route", "bias", bias, (e,), np.float32)
    topk = int(topk)
    if not 1 <= topk <= min(32, e):
        raise ValueError(f"moe_route: k must be in 1..min(32, E={e}), got {topk}")
    ids = k.empty((t, topk), np.int32)
    weights = k.empty((t, topk))
    if t:
        k.launch(SRC, "moe_route", ((t + ROUTE_WARPS - 1) // ROUTE_WARPS,), (32 * ROUTE_WARPS,),
                 (logits, bias, ids, weights, i32(t), i32(e), i32(topk), f32(scale)),
                 shared_mem=ROUTE_WARPS * 2 * e * 4)
    return ids, weights


@op("swiglu")
def swiglu(k: Kernels, gate, up, limit):
    """bf16(bf16(silu(min(gate, L))) * clip(up, -L, L)); no clamp when limit is None. gate, up bf16 -> bf16."""
    gate = _arg(k, "swiglu", "gate", gate, None, k.bf16)
    up = _arg(k, "swiglu", "up", up, tuple(gate.shape), k.bf16)
    out = k.empty(gate.shape, k.bf16)
    n = gate.size
    if n:
        k.launch(SRC, "swiglu", ((n + 255) // 256,), (256,),
                 (gate, up, out, np.int64(n), i32(limit is not None), f32(0.0 if limit is None else limit)))
    return out


@op("moe_combine")
def moe_combine(k: Kernels, y, weights, shared, pos=None):
    """sum_k w_k y_k in slot order, then + shared; fp32. y: [T, k, D], weights: [T, k], shared: [T, D]; with pos
    ([T*k] int32, moe_sort's), y is [T*k, D] in expert-sorted order and slot j of row t is y[pos[t*k + j]]."""
    t, kk = weights.shape if pos is not None else (None, None)
    if pos is None:
        y = _arg(k, "moe_combine", "y", y, (None, None, None))
        t, kk, d = y.shape
    else:
        y = _arg(k, "moe_combine", "y", y, (t * kk, None))
        d = y.shape[1]
        pos = _arg(k, "moe_combine", "pos", pos, (t * kk,), np.int32)
    weights = _arg(k, "moe_combine", "weights", weights, (t, kk))
    shared = _arg(k, "moe_combine", "shared", shared, (t, d))
    out = k.empty((t, d))
    if t and d:
        kernel, first = ("moe_combine", (y,)) if pos is None else ("moe_combine_sorted", (y, pos))
        k.launch(SRC, kernel, (t, (d + 255) // 256), (256,), (*first, weights, shared, out, i32(t), i32(kk), i32(d)))
    return out


@op("sigmoid")
def sigmoid(k: Kernels, x, out: str = "f32"):
    """1 / (1 + exp(-x)) elementwise of fp32 x -> fp32, or bf16 rounded in the epilogue with out="bf16"."""
    bf = out_kind("sigmoid", out) == "bf16"
    x = _arg(k, "sigmoid", "x", x)
    y = k.empty(x.shape, k.bf16 if bf else F32)
    if x.size:
        k.launch(SRC, "sigmoid_bf16" if bf else "sigmoid", ((x.size + 255) // 256,), (256,), (x, y, np.int64(x.size)))
    return y


SORT_THREADS = 256   # moe_sort.cu's SORT_THREADS


@op("moe_sort")
def moe_sort(k: Kernels, ids, n_experts: int):
    """ids: [T, k] int32 -> (order, group, src, pos) [T*k] int32: pairs sorted by expert, pair order within one;
    pos: each pair's sorted position."""
    ids = _arg(k, "moe_sort", "ids", ids, (None, None), np.int32)
    t, kk = ids.shape
    p, e = t * kk, int(n_experts)
    if e < 1:
        raise ValueError(f"moe_sort: n_experts must be positive, got {e}")
    order, group, src, pos = (k.empty((p,), np.int32) for _ in range(4))
    if p:
        k.launch("moe_sort.cu", "moe_sort", (1,), (SORT_THREADS,),
                 (ids, order, group, src, pos, i32(p), i32(e), i32(kk)), shared_mem=(e + 1 + SORT_THREADS) * 4)
    return order, group, src, pos


@op("moe_route_sort")
def moe_route_sort(k: Kernels, logits, bias, topk, scale, n_experts: int):
    """moe_route then moe_sort of its ids in one launch (one block: the decode rows' few tokens) -> (ids, weights,
    order, group, src, pos) as the two ops give them."""
    logits = _arg(k, "moe_route_sort", "logits", logits, (None, None))
    t, e = logits.shape
    bias = _arg(k, "moe_route_sort", "bias", bias, (e,), np.float32)
    topk = int(topk)
    if not 1 <= topk <= min(32, e):
        raise ValueError(f"moe_route_sort: k must be in 1..min(32, E={e}), got {topk}")
    if int(n_experts) != e:
        raise ValueError(f"moe_route_sort: n_experts must be the logits' E={e}, got {n_experts}")
    ids = k.empty((t, topk), np.int32)
    weights = k.empty((t, topk))
    order, group, src, pos = (k.empty((t * topk,), np.int32) for _ in range(4))
    if t:
        shared = (SORT_THREADS // 32 * 2 * e + e + 1 + SORT_THREADS) * 4
        k.launch("moe_sort.cu", "moe_route_sort", (1,), (SORT_THREADS,),
                 (logits, bias, ids, weights, order, group, src, pos, i32(t), i32(e), i32(topk), f32(scale)),
                 shared_mem=shared)
    return ids, weights, order, group, src, pos
