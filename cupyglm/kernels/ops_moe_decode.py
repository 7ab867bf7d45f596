"""Launchers of cuda_src/moe_decode.cu: op moe_experts, the routed experts of a MoE layer's decode/verify rows
and the combine in two launches (moe_route_swiglu_lane16, then moe_down_combine_lane16), bit for bit NumpyOps'
moe_experts (moe_route_sort, the grouped gate/up SwiGLU of x[src], the down projections, moe_combine).

Quantised experts (FP8 block-scaled, NVFP4: gate, up and down in one format; the shared down in it or bf16) take
the kernels' _fp8 / _nvfp4 forms, the bits of the quantised grouped GEMVs (ops_gemv_q). A call the fused kernels
cannot take (mixed formats, more pairs or experts than the shared memory holds, an empty dimension) runs the same
ops one launch each: the same bits."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.qweight import QWeight
from cupyglm.kernels import ops_gemm_multi, ops_gemm_swiglu, ops_gemv, ops_gemv_q, ops_moe
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "moe_decode.cu"
F32 = np.float32
ROUTE_FLOATS = 2 * ops_gemv.OUTS * ops_gemv.ROWS * 17    # moe_decode.cu's MOE_ROUTE_FLOATS: the routing scratch
ROUTE_MAX_E = (ROUTE_FLOATS - 1 - ops_moe.SORT_THREADS) // (2 * 8 + 1)   # MOE_ROUTE_MAX_E
MAX_PAIRS = 512      # T * k: 6 ints a pair of dynamic shared memory beside the static routing scratch (48 KiB in all)


def fused(x, w_gate, w_up, w_down, sh_act, sh_down, topk: int, n_experts: int) -> bool:
    """Whether moe_experts' two fused launches take this call (else the ops one launch each)."""
    fmt = _fmt(w_gate)
    if _fmt(w_up) != fmt or _fmt(w_down) != fmt or _fmt(sh_down) not in (fmt, "bf16"):
        return False
    t, d = x.shape
    return (0 < t * topk <= MAX_PAIRS and n_experts <= ROUTE_MAX_E and d > 0 and w_gate.shape[1] > 0
            and sh_act.shape[1] > 0)


def _fmt(w) -> str:
    """A weight's stored format: bf16 (an array), fp8 / nvfp4 (a QWeight)."""
    return w.fmt if isinstance(w, QWeight) else "bf16"


def _name(base: str, fmt: str) -> str:
    return base if fmt == "bf16" else base.replace("_lane16", f"_{fmt}_lane16")


def _experts(k: Kernels, name: str, w_gate, w_up, e: int, kk: int) -> tuple:
    """The gate / up arguments ([E, N, K] bf16, or one QWeight format) and FP8's block scalars."""
    if not isinstance(w_gate, QWeight):
        check(name, "w_gate", w_gate, (e, None, kk), k.bf16)
        check(name, "w_up", w_up, tuple(w_gate.shape), k.bf16)
        return (w_gate, w_up), ()
    ops_gemv_q.same(name, w_gate, w_up)
    args = ops_gemv_q.weight_args(name, w_gate, 3, kk) + ops_gemv_q.weight_args(name, w_up, 3, kk)
    if w_gate.shape[0] != e:
        raise ValueError(f"{name}: the experts' weights hold {w_gate.shape[0]} experts, the logits {e}")
    return args, ops_gemv_q.tc_block_args(w_gate)


def route_swiglu(k: Kernels, x, logits, bias, topk: int, scale, w_gate, w_up, limit, tiles: int, tickets=None):
    """moe_route_swiglu_lane16 (_fp8 / _nvfp4 for quantised experts) -> (ids [T, k] int32, weights [T, k] fp32,
    group [T*k] int32, pos [T*k] int32, a [T*k, N] bf16 the sorted pairs' activation, tickets [tiles] uint32
    zeroed; `tickets` given: that buffer)."""
    name = _name("moe_route_swiglu_lane16", _fmt(w_gate))
    t, kk = check(name, "x", x, (None, None), k.bf16).shape
    e = check(name, "logits", logits, (t, None), F32).shape[1]
    check(name, "bias", bias, (e,), F32)
    wargs, blk = _experts(k, name, w_gate, w_up, e, kk)
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
             (logits, bias, x, *wargs, a, ids, weights, group, pos, tickets, i32(tiles), i32(t), i32(e),
              i32(topk), f32(scale), i32(n), i32(kk), *blk, *ops_gemm_swiglu._limit(limit)), shared_mem=6 * p * 4)
    return ids, weights, group, pos, a, tickets


def down_combine(k: Kernels, a, w_down, group, pos, weights, sh_act, sh_down, tickets):
    """moe_down_combine_lane16 (_fp8 / _nvfp4 for quantised experts): the experts' down projection of the sorted
    pairs a [T*k, N] bf16 (w_down [E, D, N]), the shared expert's of sh_act [T, Ns] bf16 (sh_down [D, Ns], bf16 or
    as the experts), combined in slot order -> [T, D] fp32; tickets [ceil(D / 16)] uint32 must be zero
    (route_swiglu's)."""
    fmt = _fmt(w_down)
    name = _name("moe_down_combine_lane16", fmt)
    p, kk = check(name, "a", a, (None, None), k.bf16).shape
    t, topk = check(name, "weights", weights, (None, None), F32).shape
    if fmt == "bf16":
        e, d = check(name, "w_down", w_down, (None, None, kk), k.bf16).shape[:2]
        wargs, blk = (w_down,), ()
    else:
        wargs, blk = ops_gemv_q.weight_args(name, w_down, 3, kk), ops_gemv_q.tc_block_args(w_down)
        e, d = w_down.shape[:2]
    k2 = check(name, "sh_act", sh_act, (t, None), k.bf16).shape[1]
    shared = _shared(k, name, fmt, sh_down, d, k2)
    check(name, "group", group, (p,), np.int32)
    check(name, "pos", pos, (p,), np.int32)
    tiles = -(-d // ops_gemv.OUTS)
    check(name, "tickets", tickets, (tiles,), np.uint32)
    if p != t * topk or not (0 < p <= MAX_PAIRS and d > 0 and kk > 0 and k2 > 0):
        raise ValueError(f"{name}: {p} pairs of {t} rows x {topk} (1..{MAX_PAIRS}), D={d}, N={kk}, Ns={k2}")
    ys, y2, out = k.empty((p, d)), k.empty((t, d)), k.empty((t, d))
    k.launch(SRC, name, (tiles, p + -(-t // ops_gemv.ROWS), 1), ops_gemv.THREADS,
             (a, *wargs, group, ys, i32(p), i32(d), i32(kk), i32(e), *blk, sh_act, *shared, y2, i32(t), i32(k2),
              pos, weights, i32(topk), tickets, out))
    return out


def _shared(k: Kernels, name: str, fmt: str, sh_down, d: int, k2: int) -> tuple:
    """The shared down's arguments [D, Ns]: bf16 (fmt bf16); else the quantised form's (values, scales, FP8's
    block), the bf16 pointer and sh_q, with 1-element stand-ins (never read, never written: no kernel) for the form
    not read."""
    if fmt == "bf16":
        return (check(name, "sh_down", sh_down, (d, k2), k.bf16),)
    if isinstance(sh_down, QWeight):
        if sh_down.fmt != fmt or tuple(sh_down.shape) != (d, k2):
            raise ValueError(f"{name}: the shared down must be {fmt} [{d}, {k2}] or bf16")
        qargs = ops_gemv_q.weight_args(name, sh_down, 2, k2) + ops_gemv_q.tc_block_args(sh_down)
        return (*qargs, k.empty((1,), k.bf16), i32(1))
    check(name, "sh_down", sh_down, (d, k2), k.bf16)
    u8, f = k.empty((1,), np.uint8), k.empty((1,))
    qargs = (u8, f, i32(1), i32(32)) if fmt == "fp8" else (u8, u8, f)
    return (*qargs, sh_down, i32(0))


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
