"""Launchers of cuda_src/moe_decode.cu: op moe_experts, the routed experts of a MoE layer's decode/verify rows
and the combine in two launches (moe_route_swiglu_lane16, then moe_down_combine_lane16), bit for bit NumpyOps'
moe_experts (moe_route_sort, the grouped gate/up SwiGLU of x[src], the down projections, moe_combine).

A call the fused kernels cannot take (quantised weights, more pairs or experts than the shared memory holds, an
empty dimension) runs the same ops one launch each: the same bits."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.kernels import ops_gemm_multi, ops_gemm_swiglu, ops_gemv, ops_moe
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "moe_decode.cu"
F32 = np.float32
ROUTE_FLOATS = 2 * ops_gemv.OUTS * ops_gemv.ROWS * 17    # moe_decode.cu's MOE_ROUTE_FLOATS: the routing scratch
ROUTE_MAX_E = (ROUTE_FLOATS - 1 - ops_moe.SORT_THREADS) // (2 * 8 + 1)   # MOE_ROUTE_MAX_E
MAX_PAIRS = 512      # T * k: 6 ints a pair of dynamic shared memory beside the static routing scratch (48 KiB in all)


def fused(x, w_gate, w_up, w_down, sh_act, sh_down, topk: int, n_experts: int) -> bool:
    """Whether moe_experts' two fused launches take this call (else the ops one launch each)."""
    if any(isinstance(w, QWeight) for w in (w_gate, w_up, w_down, sh_down)):
        return False
    t, d = x.shape
    return (0 < t * topk <= MAX_PAIRS and n_experts <= ROUTE_MAX_E and d > 0 and w_gate.shape[1] > 0
            and sh_act.shape[1] > 0)


def route_swiglu(k: Kernels, x, logits, bias, topk: int, scale, w_gate, w_up, limit, tiles: int, tickets=None):
    """moe_route_swiglu_lane16 -> (ids [T, k] int32, weights [T, k] fp32, group [T*k] int32, pos [T*k] int32,
    a [T*k, N] bf16 the sorted pairs' activation, tickets [tiles] uint32 zeroed; `tickets` given: that buffer)."""
    name = "moe_route_swiglu_lane16"
    t, kk = check(name, "x", x, (None, None), k.bf16).shape
    e = check(name, "logits", logits, (t, None), F32).shape[1]
    check(name, "bias", bias, (e,), F32)
    check(name, "w_gate", w_gate, (e, None, kk), k.bf16)
    check(name, "w_up", w_up, tuple(w_gate.shape), k.bf16)
    n, p = w_gate.shape[1], t * int(topk)
    if not 1 <= topk <= min(32, e):
        raise ValueError(f"{name}: k must be in 1..min(32, E={e}), got {topk}")
    if not (0 < p <= MAX_PAIRS and e <= ROUTE_MAX_E and n > 0 and tiles > 0):
        raise ValueError(f"{name}: {p} pairs (1..{MAX_PAIRS}), E={e} (<= {ROUTE_MAX_E}), N={n}, tiles={tiles}")
    ids, group, pos = k.empty((t, topk), np.int32), k.empty((p,), np.int32), k.empty((p,), np.int32)
    weights = k.empty((t, topk))
    a = k.empty((p, n), k.bf16)
    tickets = k.empty((tiles,), np.uint32) if tickets is None else check(name, "tickets", tickets, (tiles,),
                                                                          np.uint32)
    k.launch(SRC, name, (-(-n // ops_gemv.OUTS), min(p, e), 1), ops_gemv.THREADS,
             (logits, bias, x, w_gate, w_up, a, ids, weights, group, pos, tickets, i32(tiles), i32(t), i32(e),
              i32(topk), f32(scale), i32(n), i32(kk), *ops_gemm_swiglu._limit(limit)), shared_mem=6 * p * 4)
    return ids, weights, group, pos, a, tickets


def down_combine(k: Kernels, a, w_down, group, pos, weights, sh_act, sh_down, tickets):
    """moe_down_combine_lane16: the experts' down projection of the sorted pairs a [T*k, N] bf16 (w_down [E, D, N]),
    the shared expert's of sh_act [T, Ns] bf16 (sh_down [D, Ns]), combined in slot order -> [T, D] fp32; tickets
    [ceil(D / 16)] uint32 must be zero (route_swiglu's)."""
    name = "moe_down_combine_lane16"
    p, kk = check(name, "a", a, (None, None), k.bf16).shape
    t, topk = check(name, "weights", weights, (None, None), F32).shape
    e, d = check(name, "w_down", w_down, (None, None, kk), k.bf16).shape[:2]
    k2 = check(name, "sh_act", sh_act, (t, None), k.bf16).shape[1]
    check(name, "sh_down", sh_down, (d, k2), k.bf16)
    check(name, "group", group, (p,), np.int32)
    check(name, "pos", pos, (p,), np.int32)
    tiles = -(-d // ops_gemv.OUTS)
    check(name, "tickets", tickets, (tiles,), np.uint32)
    if p != t * topk or not (0 < p <= MAX_PAIRS and d > 0 and kk > 0 and k2 > 0):
        raise ValueError(f"{name}: {p} pairs of {t} rows x {topk} (1..{MAX_PAIRS}), D={d}, N={kk}, Ns={k2}")
    ys, y2, out = k.empty((p, d)), k.empty((t, d)), k.empty((t, d))
    k.launch(SRC, name, (tiles, p + -(-t // ops_gemv.ROWS), 1), ops_gemv.THREADS,
             (a, w_down, group, ys, i32(p), i32(d), i32(kk), i32(e), sh_act, sh_down, y2, i32(t),
              i32(k2), pos, weights, i32(topk), tickets, out))
    return out


def _separate(k: Kernels, x, logits, bias, topk, scale, w_gate, w_up, w_down, limit, sh_act, sh_down):
    """The same ops one launch each (quantised weights, or a call too large for the fused kernels' shared memory)."""
    t = x.shape[0]
    ids, weights, _, group, src, pos = ops_moe.moe_route_sort(k, logits, bias, topk, scale, logits.shape[1])
    pairs = t * ids.shape[1]
    a = ops_gemm_swiglu.gemm_grouped_swiglu(k, x[src], w_gate, w_up, group, limit, decode=pairs)
    ys, shared = ops_gemm_multi.gemm_grouped_dense(k, a, w_down, group, sh_act, sh_down, decode=pairs, decode2=t)
    return ops_moe.moe_combine(k, ys, weights, shared, pos)


@op("moe_experts")
def moe_experts(k: Kernels, x, logits, bias, topk, scale, w_gate, w_up, w_down, limit, sh_act, sh_down):
    """x [T, D] bf16 decode/verify rows, logits [T, E] fp32, bias [E] fp32, experts' w_gate / w_up [E, N, D] and
    w_down [E, D, N], the shared expert's activation sh_act [T, Ns] bf16 and down_proj sh_down [D, Ns] -> [T, D]
    fp32: the routed experts' combine in slot order plus the shared expert's output."""
    x = check("moe_experts", "x", k.xp.ascontiguousarray(x), (None, None), k.bf16)
    topk = int(topk)
    if not fused(x, w_gate, w_up, w_down, sh_act, sh_down, topk, logits.shape[1]):
        return _separate(k, x, logits, bias, topk, scale, w_gate, w_up, w_down, limit, sh_act, sh_down)
    tiles = -(-w_down.shape[1] // ops_gemv.OUTS)
    _, weights, group, pos, a, tickets = route_swiglu(k, x, logits, bias, topk, scale, w_gate, w_up, limit, tiles)
    return down_combine(k, a, w_down, group, pos, weights, k.xp.ascontiguousarray(sh_act), sh_down, tickets)
