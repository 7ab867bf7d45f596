"""Contract cases of cuda_src/moe.cu (ops moe_route, swiglu, moe_combine, sigmoid).

moe_route's inputs plant exact ties of score + bias across the top-k cut (equal logits and biases), so ties
to the lower id are exercised. Controls: moe_route breaking ties to the higher id (the kernel run on the
reversed expert axis, ids mapped back); swiglu without its limit; moe_combine with two slots' weights swapped;
sigmoid of -x.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_moe

REF = NumpyOps()
SCALE = 2.5
BF16_ULP = 1 << 16
# The kernels compute exp with exp_f32 (cuda_src/exp_f32.cuh: +, *, rint and 2**k only, the same bits on GPU,
# emulator and NumPy). While the NumPy reference still uses np.exp (SIMD, <= 2 ULP, rounds differently) the
# tolerances below hold; once lanes.exp_f32 (the NumPy twin) is the reference's exp they are all 0.
EXACT_EXP = hasattr(lanes, "exp_f32")

ROUTE_ULPS = 0 if EXACT_EXP else 8
ROUTE_WHY = "scores = sigmoid(logits): exp_f32 vs NumPy exp (<= 2 fp32 ULPs), then a sum and a division (measured <= 3)"
SWIGLU_ULPS, SWIGLU_WHY = 0 if EXACT_EXP else 2 * BF16_ULP, ("SiLU's exp_f32 vs NumPy exp (<= 2 fp32 ULPs) may flip the inner bf16 rounding, "
                                         "then the outer one: 2 bf16 ULPs (measured 0)")
SIG_ULPS, SIG_WHY = 0 if EXACT_EXP else 8, "exp_f32 vs NumPy exp (<= 2 fp32 ULPs) under 1 / (1 + e) (measured <= 4)"


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _route(label: str, t: int, e: int, topk: int) -> None:
    def make(rng):
        logits = (rng.standard_normal((t, e)) * 2.0).astype(np.float32)
        bias = (rng.standard_normal(e) * 0.1).astype(np.float32)           # stored F32
        # ties: in every other row a block of 2k experts shares the largest bias and the row's largest logit,
        # so the whole top k is one tie (picked by lower id); the other rows stay untied
        grp = rng.choice(e, size=min(e, 2 * topk), replace=False)
        bias[grp] = bias.max()
        for i in range(0, t, 2):
            logits[i, grp] = logits[i].max()
        return {"logits": logits, "bias": bias}

    def run(k, d):
        ids, w = ops_moe.moe_route(k, d["logits"], d["bias"], topk, SCALE)
        return {"ids": ids, "w": w}

    def replay(d):
        ids, w = REF.moe_route(d["logits"], d["bias"], topk, SCALE)
        return {"ids": ids, "w": w}

    def ctl(k, d):                                     # ties to the higher id
        xp = k.xp
        ids, w = ops_moe.moe_route(k, xp.ascontiguousarray(d["logits"][:, ::-1]),
                                   xp.ascontiguousarray(d["bias"][::-1]), topk, SCALE)
        return {"ids": (e - 1 - ids).astype(np.int32), "w": w}

    case(Case(f"moe_route[{label}]", ("moe_route",), make, run, replay, ctl, ROUTE_ULPS, ROUTE_WHY))


def _swiglu(label: str, shape, limit) -> None:
    def make(rng):
        return {"gate": _bf(rng, shape, 6.0), "up": _bf(rng, shape, 6.0)}

    def run(k, d):
        return {"a": ops_moe.swiglu(k, d["gate"], d["up"], limit)}

    def replay(d):
        return {"a": REF.swiglu(d["gate"], d["up"], limit)}

    def ctl(k, d):                                     # limit dropped (or, unlimited, one applied)
        return {"a": ops_moe.swiglu(k, d["gate"], d["up"], None if limit is not None else 3.0)}

    case(Case(f"swiglu[{label}]", ("swiglu",), make, run, replay, ctl, SWIGLU_ULPS, SWIGLU_WHY))


def _combine(label: str, t: int, topk: int, d: int) -> None:
    def make(rng):
        return {"y": rng.standard_normal((t, topk, d)).astype(np.float32),        # the experts' fp32 down_proj
                "w": rng.uniform(0.0, 1.0, (t, topk)).astype(np.float32),
                "shared": rng.standard_normal((t, d)).astype(np.float32)}

    def run(k, x):
        return {"o": ops_moe.moe_combine(k, x["y"], x["w"], x["shared"])}

    def replay(x):
        return {"o": REF.moe_combine(x["y"], x["w"], x["shared"])}

    def ctl(k, x):                                     # weights of slots 0 and 1 swapped
        w = x["w"].copy()
        w[:, 0], w[:, 1] = x["w"][:, 1], x["w"][:, 0]
        return {"o": ops_moe.moe_combine(k, x["y"], w, x["shared"])}

    case(Case(f"moe_combine[{label}]", ("moe_combine",), make, run, replay, ctl))


def _sigmoid(label: str, shape, out: str = "f32") -> None:
    """out="bf16": the sigmoid_bf16 kernel (beta = bf16(sigmoid(b)), rounded in its epilogue)."""
    def make(rng):
        return {"x": (rng.standard_normal(shape) * 4).astype(np.float32)}

    def run(k, d):
        return {"y": ops_moe.sigmoid(k, d["x"], out=out)}

    def replay(d):
        return {"y": REF.sigmoid(d["x"], out=out)}

    def ctl(k, d):                                     # the sign of the exponent flipped
        return {"y": ops_moe.sigmoid(k, -d["x"], out=out)}

    name, kernel = ("sigmoid", "sigmoid") if out == "f32" else ("sigmoid.bf16", "sigmoid_bf16")
    case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl, SIG_ULPS, SIG_WHY))


#       label        T    E   k
_route("decode",     1,   8,  2)      # tiny: 8 experts, top 2
_route("verify",    16,   8,  2)
_route("prompt37",  37,   8,  2)
_route("full",       5, 288,  8)      # full model: 288 experts, top 8
_route("odd",        7,  45,  5)
_swiglu("decode",   (1, 64), 10.0)
_swiglu("prompt37", (37, 64), 10.0)
_swiglu("dense",    (16, 256), None)  # the dense MLP: no limit
_swiglu("full",     (3, 2048), 10.0)
_combine("decode",   1, 2, 256)
_combine("prompt37", 37, 2, 256)
_combine("full",     3, 8, 4096)
_sigmoid("decode",  (1, 4))
_sigmoid("prompt37", (37, 4))
_sigmoid("odd",     (3, 301))
_sigmoid("decode",  (1, 4), "bf16")       # beta of one token, 4 heads
_sigmoid("prompt37", (37, 4), "bf16")
_sigmoid("odd",     (3, 301), "bf16")
