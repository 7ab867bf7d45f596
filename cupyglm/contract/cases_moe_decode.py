"""Contract cases of cuda_src/moe_decode.cu: moe_route_swiglu_lane16 (routing, sort and the experts' gate/up
SwiGLU of the decode rows in one launch) against moe_route_sort then gemm_grouped_swiglu of x[src] of the
reference; moe_down_combine_lane16 (the experts' and the shared expert's down projections and the combine in one
launch) against gemm_grouped_dense then moe_combine; and op moe_experts (both launches) against NumpyOps.

Quantised experts (FP8 block-scaled, NVFP4; the shared down quantised or bf16) take the kernels' _fp8 / _nvfp4
forms, replayed by the same reference ops over the QWeights (backend/tc_quant.py's order).

Controls: -DCONTROL_MOE_ROWS (the pairs' rows read in place instead of through src), -DCONTROL_MOE_FIRST_DONE
(a tile combined by the first block to finish instead of the last), the bias reversed (other experts), and for the
quantised forms dequant.cuh's scale and nibble controls (cases_gemm_q)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.qweight import QWeight, stack
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.cases_moe import ROUTE_ULPS, ROUTE_WHY
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_moe_decode

REF = NumpyOps()
SCALE, LIMIT = 2.5, 10.0


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def _experts(rng, t, e, d, n, ns, used):
    """Inputs of one MoE layer's decode rows; routing favours the first `used` experts (long runs when few)."""
    bias = (rng.standard_normal(e) * 0.1).astype(np.float32)
    bias[used:] -= 100.0
    return {"x": _bf(rng, (t, d)), "logits": (rng.standard_normal((t, e)) * 2.0).astype(np.float32), "bias": bias,
            "gate": _bf(rng, (e, n, d), d ** -0.5), "up": _bf(rng, (e, n, d), d ** -0.5),
            "down": _bf(rng, (e, d, n), n ** -0.5), "sh_act": _bf(rng, (t, ns)), "sh_down": _bf(rng, (d, ns), ns ** -0.5)}


def _route_swiglu(label: str, t: int, k: int, e: int, d: int, n: int, used: int, control: str) -> Case:
    names = ("ids", "w", "group", "pos", "a", "tickets")
    tiles = 5

    def make(rng):
        return _experts(rng, t, e, d, n, 8, used)

    def launch(kn, dd, bias):
        busy = kn.xp.full((tiles,), 0xFFFFFFFF, dtype=np.uint32)      # left over: the kernel must zero it
        return dict(zip(names, ops_moe_decode.route_swiglu(kn, dd["x"], dd["logits"], bias, k, SCALE, dd["gate"],
                                                           dd["up"], LIMIT, tiles, busy)))

    def run(kn, dd):
        return launch(kn, dd, dd["bias"])

    def replay(dd):
        ids, w, _, group, src, pos = REF.moe_route_sort(dd["logits"], dd["bias"], k, SCALE, e)
        a = REF.gemm_grouped_swiglu(dd["x"][src], dd["gate"], dd["up"], group, LIMIT, decode=t * k)
        return {"ids": ids, "w": w, "group": group, "pos": pos, "a": a, "tickets": np.zeros(tiles, np.uint32)}

    if control == "rows":
        def ctl(kn, dd):
            return launch(kn.variant("CONTROL_MOE_ROWS"), dd, dd["bias"])
    else:
        def ctl(kn, dd):
            return launch(kn, dd, kn.xp.ascontiguousarray(dd["bias"][::-1]))

    return case(Case(f"moe_route_swiglu[{label}]", ("moe_route_swiglu_lane16",), make, run, replay, ctl,
                     ROUTE_ULPS, ROUTE_WHY))


#               label        T   k    E    D    N  used  control
_route_swiglu("decode",      1,  8, 288, 256,  48, 288, "bias")    # one token of the full model's 288 experts
_route_swiglu("verify16",   16,  8, 288, 256,  40, 288, "rows")    # 128 pairs, N % 16 = 8
_route_swiglu("long-runs",  40,  2,   8, 100,  24,   4, "rows")    # runs over 16 rows, K % 8 = 4: scalar loads


def _down_combine(label: str, t: int, k: int, e: int, d: int, n: int, ns: int) -> Case:
    def make(rng):
        ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
        _, group, _, pos = REF.moe_sort(ids, e)
        dd = _experts(rng, t, e, d, n, ns, e)
        return {"a": _bf(rng, (t * k, n)), "down": dd["down"], "group": group, "pos": pos,
                "w": rng.uniform(0.0, 1.0, (t, k)).astype(np.float32), "sh_act": dd["sh_act"],
                "sh_down": dd["sh_down"]}

    def launch(kn, dd):
        tickets = kn.xp.zeros((-(-d // 16),), dtype=np.uint32)
        return {"o": ops_moe_decode.down_combine(kn, dd["a"], dd["down"], dd["group"], dd["pos"], dd["w"],
                                                 dd["sh_act"], dd["sh_down"], tickets)}

    def run(kn, dd):
        return launch(kn, dd)

    def replay(dd):
        ys, shared = REF.gemm_grouped_dense(dd["a"], dd["down"], dd["group"], dd["sh_act"], dd["sh_down"],
                                            decode=t * k, decode2=t)
        return {"o": REF.moe_combine(ys, dd["w"], shared, dd["pos"])}

    def ctl(kn, dd):
        return launch(kn.variant("CONTROL_MOE_FIRST_DONE"), dd)

    return case(Case(f"moe_down_combine[{label}]", ("moe_down_combine_lane16",), make, run, replay, ctl))


#               label        T   k    E    D    N   Ns
_down_combine("decode",      1,  8, 288,  72, 256, 128)    # D % 16 = 8: a partial last tile
_down_combine("verify17",   17,  8,  32,  48,  96,  40)    # two shared row groups, experts shared by rows
_down_combine("scalar",      5,  4,   6,  32,  36,  20)    # K % 8 = 4: scalar loads


def _experts_op(label: str, t: int, k: int, e: int, d: int, n: int, used: int) -> Case:
    def make(rng):
        return _experts(rng, t, e, d, n, 24, used)

    def launch(kn, dd, bias):
        return {"o": ops_moe_decode.moe_experts(kn, dd["x"], dd["logits"], bias, k, SCALE, dd["gate"], dd["up"],
                                                dd["down"], LIMIT, dd["sh_act"], dd["sh_down"])}

    def run(kn, dd):
        return launch(kn, dd, dd["bias"])

    def replay(dd):
        return {"o": REF.moe_experts(dd["x"], dd["logits"], dd["bias"], k, SCALE, dd["gate"], dd["up"], dd["down"],
                                     LIMIT, dd["sh_act"], dd["sh_down"])}

    def ctl(kn, dd):
        return launch(kn, dd, kn.xp.ascontiguousarray(dd["bias"][::-1]))

    return case(Case(f"moe_experts[{label}]", ("moe_route_swiglu_lane16", "moe_down_combine_lane16"), make, run,
                     replay, ctl, ROUTE_ULPS, ROUTE_WHY))


#            label      T   k    E    D   N  used
_experts_op("decode",   1,  8,  64,  64, 32,  64)
_experts_op("verify",   9,  4,  16,  48, 16,   6)


# ---- quantised experts --------------------------------------------------------------------------------------------
def _qexperts(rng, fmt: str, t, e, d, n, ns, used, sh_q: bool, block=(128, 128), parts=("gate", "up", "down")):
    """_experts' inputs with the experts' `parts` of gate / up / down (and, sh_q, the shared down) quantised in
    fmt."""
    dd = _experts(rng, t, 1, d, n, ns, 1)
    bias = (rng.standard_normal(e) * 0.1).astype(np.float32)
    bias[used:] -= 100.0

    def q(rows, cols):
        return qweight(rng, fmt, rows, cols, block)

    dd.update(logits=(rng.standard_normal((t, e)) * 2.0).astype(np.float32), bias=bias)
    dd.update({p: stack([q(d, n) if p == "down" else q(n, d) for _ in range(e)]) for p in parts})
    if sh_q:
        dd["sh_down"] = q(d, ns)
    return dd


def _on(kn, w):
    return w.to(kn.xp) if isinstance(w, QWeight) else w


def _q_control(kn, control: str):
    return kn.variant(f"CONTROL_{control}")


def _route_swiglu_q(label, fmt, t, k, e, d, n, used, control, block=(128, 128)) -> Case:
    names, tiles = ("ids", "w", "group", "pos", "a", "tickets"), 3

    def make(rng):
        return _qexperts(rng, fmt, t, e, d, n, 8, used, False, block, ("gate", "up"))

    def launch(kn, dd):
        busy = kn.xp.full((tiles,), 0xFFFFFFFF, dtype=np.uint32)      # left over: the kernel must zero it
        return dict(zip(names, ops_moe_decode.route_swiglu(kn, dd["x"], dd["logits"], dd["bias"], k, SCALE,
                                                           _on(kn, dd["gate"]), _on(kn, dd["up"]), LIMIT, tiles,
                                                           busy)))

    def replay(dd):
        ids, w, _, group, src, pos = REF.moe_route_sort(dd["logits"], dd["bias"], k, SCALE, e)
        a = REF.gemm_grouped_swiglu(dd["x"][src], dd["gate"], dd["up"], group, LIMIT, decode=t * k)
        return {"ids": ids, "w": w, "group": group, "pos": pos, "a": a, "tickets": np.zeros(tiles, np.uint32)}

    def ctl(kn, dd):
        return launch(_q_control(kn, control), dd)

    return case(Case(f"moe_route_swiglu_{fmt}[{label}.{control.lower()}]", (f"moe_route_swiglu_{fmt}_lane16",),
                     make, launch, replay, ctl, ROUTE_ULPS, ROUTE_WHY))


def _down_combine_q(label, fmt, t, k, e, d, n, ns, sh_q: bool, control, block=(128, 128)) -> Case:
    def make(rng):
        ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
        _, group, _, pos = REF.moe_sort(ids, e)
        dd = _qexperts(rng, fmt, t, e, d, n, ns, e, sh_q, block, ("down",))
        return {"a": _bf(rng, (t * k, n)), "down": dd["down"], "group": group, "pos": pos,
                "w": rng.uniform(0.0, 1.0, (t, k)).astype(np.float32), "sh_act": dd["sh_act"],
                "sh_down": dd["sh_down"]}

    def launch(kn, dd):
        tickets = kn.xp.zeros((-(-d // 16),), dtype=np.uint32)
        return {"o": ops_moe_decode.down_combine(kn, dd["a"], _on(kn, dd["down"]), dd["group"], dd["pos"], dd["w"],
                                                 dd["sh_act"], _on(kn, dd["sh_down"]), tickets)}

    def replay(dd):
        ys, shared = REF.gemm_grouped_dense(dd["a"], dd["down"], dd["group"], dd["sh_act"], dd["sh_down"],
                                            decode=t * k, decode2=t)
        return {"o": REF.moe_combine(ys, dd["w"], shared, dd["pos"])}

    def ctl(kn, dd):
        return launch(_q_control(kn, control), dd)

    shared = "q" if sh_q else "bf16"
    return case(Case(f"moe_down_combine_{fmt}[{label}.shared-{shared}.{control.lower()}]",
                     (f"moe_down_combine_{fmt}_lane16",), make, launch, replay, ctl))


def _experts_op_q(label, fmt, t, k, e, d, n, used, sh_q: bool) -> Case:
    def make(rng):
        return _qexperts(rng, fmt, t, e, d, n, 32, used, sh_q, (32, 32))

    def launch(kn, dd, bias):
        return {"o": ops_moe_decode.moe_experts(kn, dd["x"], dd["logits"], bias, k, SCALE, _on(kn, dd["gate"]),
                                                _on(kn, dd["up"]), _on(kn, dd["down"]), LIMIT, dd["sh_act"],
                                                _on(kn, dd["sh_down"]))}

    def replay(dd):
        return {"o": REF.moe_experts(dd["x"], dd["logits"], dd["bias"], k, SCALE, dd["gate"], dd["up"], dd["down"],
                                     LIMIT, dd["sh_act"], dd["sh_down"])}

    return case(Case(f"moe_experts_{fmt}[{label}]", (f"moe_route_swiglu_{fmt}_lane16",
                                                     f"moe_down_combine_{fmt}_lane16"), make,
                     lambda kn, dd: launch(kn, dd, dd["bias"]), replay,
                     lambda kn, dd: launch(kn, dd, kn.xp.ascontiguousarray(dd["bias"][::-1])), ROUTE_ULPS, ROUTE_WHY))


for _f, _scale_ctl in (("fp8", "SCALE_NEXT_BLOCK"), ("nvfp4", "NIBBLE_SWAP")):
    #                label        fmt  T   k    E    D    N  used  control
    _route_swiglu_q("decode",     _f,  1,  8, 288, 256,  48, 288, _scale_ctl)       # the full model's 288 experts
    _route_swiglu_q("verify16",   _f, 16,  8,  64, 256,  40,  64, "MOE_ROWS")       # 128 pairs, N % 16 = 8
    _route_swiglu_q("long-runs",  _f, 40,  2,   8, 112,  24,   4, "MOE_ROWS", (32, 32))   # runs over 16 rows
    #                label        fmt  T   k    E    D    N   Ns  shared q  control            FP8 block
    _down_combine_q("decode",     _f,  1,  8, 288,  72, 256, 128, True, "MOE_FIRST_DONE")   # D % 16 = 8
    _down_combine_q("verify17",   _f, 17,  8,  32,  48,  96,  48, False, "SCALE_TRANSPOSED", (32, 32))
    _down_combine_q("tiny",       _f,  5,  4,   6,  32,  64,  32, True, _scale_ctl, (32, 32))
    #              label      fmt  T  k   E   D   N  used  shared q
    _experts_op_q("decode",   _f,  1, 8, 64, 64, 32,  64, True)
    _experts_op_q("verify",   _f,  9, 4, 16, 64, 32,   6, False)
