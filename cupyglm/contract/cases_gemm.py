"""Contract cases of the ops gemm, gemm_heads and gemm_grouped on their prompt rows (every row of a call with
decode=0: cuda_src/gemm_tc.cu's tensor-core GEMMs): the shapes the tiny and full models run at.

Controls: a kernel variant taking a 32-block's two mma steps in the other order (-DCONTROL_TC_REVERSED, the
k-chain reversed) where K is long enough for the order to change bits; for short K (a sum of a few exact bf16 products
is
exact in fp32 whatever the order) a dropped last K term, i.e. an off-by-one in the K tail. The grouped expert
GEMM also has a misrouted row (one row's expert id changed) as control; the weights of experts no row uses are
NaN, so a kernel reading the wrong slice shows. The `.bf16` cases run the kernels that round the sum to bf16 in
their epilogue (out="bf16"); their controls change a term (a dropped K tail, shifted heads, a misrouted row),
since a reordered chain rarely survives the rounding.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm

REF = NumpyOps()
ORDER = "CONTROL_TC_REVERSED"       # gemv_tc.cuh's gtc_block: a 32-block's two mma steps swapped


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def _gemm_case(label: str, m: int, n: int, k: int, control: str, out: str = "f32") -> Case:
    """out="bf16": gemm_tc_bf16, the sum rounded in the epilogue."""
    def make(rng):
        return {"x": _bf(rng, (m, k)), "w": _bf(rng, (n, k), k ** -0.5)}

    def run(kn, d):
        return {"y": ops_gemm.gemm(kn, d["x"], d["w"], out=out)}

    def replay(d):
        return {"y": REF.gemm(d["x"], d["w"], out=out)}

    if control == "order":
        def ctl(kn, d):
            return {"y": ops_gemm.gemm(kn.variant(ORDER), d["x"], d["w"], out=out)}
    else:
        def ctl(kn, d):
            x = d["x"].copy()
            x[:, -1] = 0                       # the last K term dropped (tail off-by-one)
            return {"y": ops_gemm.gemm(kn, kn.xp.asarray(x), d["w"], out=out)}

    name, kernel = ("gemm", "gemm_tc") if out == "f32" else ("gemm.bf16", "gemm_tc_bf16")
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


def _heads_case(label: str, h: int, m: int, n: int, k: int, out: str = "f32") -> Case:
    def make(rng):
        return {"x": _bf(rng, (h, m, k)), "w": _bf(rng, (h, n, k), k ** -0.5)}

    def run(kn, d):
        return {"y": ops_gemm.gemm_heads(kn, d["x"], d["w"], out=out)}

    def replay(d):
        return {"y": REF.gemm_heads(d["x"], d["w"], out=out)}

    if out == "f32":
        def ctl(kn, d):
            return {"y": ops_gemm.gemm_heads(kn.variant(ORDER), d["x"], d["w"])}
    else:
        def ctl(kn, d):                        # the heads' weights shifted by one head
            w = kn.xp.ascontiguousarray(kn.xp.roll(d["w"], 1, axis=0))
            return {"y": ops_gemm.gemm_heads(kn, d["x"], w, out=out)}

    name, kernel = ("gemm_heads", "gemm_tc") if out == "f32" else ("gemm_heads.bf16", "gemm_tc_bf16")
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#            label            M    N    K    control
_gemm_case("decode",           1, 256, 256, "order")      # one token, hidden 256
_gemm_case("verify",          16,  96, 256, "order")      # MTP verify: 16 rows
_gemm_case("prompt64",        64,  64, 256, "order")      # a prompt chunk
_gemm_case("prompt100",      100,  40, 160, "order")      # rows not a multiple of the 32 rows per block
_gemm_case("odd-k",            7,  33, 100, "order")      # K % 32 = 4, N % 64 = 33
_gemm_case("n1",               5,   1, 300, "order")      # one output column (a gate)
_gemm_case("short-k",          3,  20,   5, "tail")       # K < 8: one partial 16-byte chunk
_heads_case("decode",          4,   1,  32,  64)          # absorbed q x w_k_t, one token
_heads_case("prompt",          4,  37,  64,  32)          # 37 rows, per head
# out="bf16" (the epilogue rounds): the projections whose output the model keeps in bf16; the dropped last K
# term as control (a wrong fold order rarely survives the rounding)
_gemm_case("decode",           1, 256, 256, "tail", "bf16")
_gemm_case("verify",          16,  96, 256, "tail", "bf16")
_gemm_case("prompt100",      100,  40, 160, "tail", "bf16")
_gemm_case("odd-k",            7,  33, 100, "tail", "bf16")
_heads_case("decode",          4,   1,  32,  64, "bf16")
_heads_case("prompt",          4,  37,  64,  32, "bf16")


def _grouped_case(label: str, m: int, e: int, used: int, n: int, k: int, control: str, out: str = "f32") -> Case:
    """m rows over the first `used` of e experts (ids shuffled; experts >= used get NaN weights)."""
    def make(rng):
        w = _bf(rng, (e, n, k), k ** -0.5)
        group = rng.permutation(np.arange(m) % used).astype(np.int32)
        absent = np.setdiff1d(np.arange(e), group)
        w[absent] = np.nan                        # poisoned: no row may read them
        return {"x": _bf(rng, (m, k)), "w": w, "group": group}

    def run(kn, d):
        return {"y": ops_gemm.gemm_grouped(kn, d["x"], d["w"], d["group"], out=out)}

    def replay(d):
        return {"y": REF.gemm_grouped(d["x"], d["w"], d["group"], out=out)}

    if control == "order":
        def ctl(kn, d):
            return {"y": ops_gemm.gemm_grouped(kn.variant(ORDER), d["x"], d["w"], d["group"],
                                               out=out)}
    else:
        def ctl(kn, d):
            group = d["group"].copy()
            r = m // 2
            group[r] = (group[r] + 1) % max(used, 2)  # one row routed to the wrong expert
            return {"y": ops_gemm.gemm_grouped(kn, d["x"], d["w"], kn.xp.asarray(group), out=out)}

    name, kernel = (("gemm_grouped", "gemm_tc_grouped") if out == "f32"
                    else ("gemm_grouped.bf16", "gemm_tc_grouped_bf16"))
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#               label              M    E  used   N    K    control
_grouped_case("decode",            1,   8,   1,  64, 256, "route")    # one (token, slot) pair
_grouped_case("verify-4e",        16,   4,   4,  96, 256, "order")    # 16 rows over 4 experts
_grouped_case("prompt100-8e",    100,   8,   5,  40, 160, "route")    # 100 rows, experts 5..7 absent
_grouped_case("prompt100-order", 100,   8,   6,  40, 160, "order")    # 100 rows, experts 6, 7 absent
_grouped_case("odd-k",            23,   6,   3,  33, 100, "order")    # K % 32 = 4, N % 64 = 33
_grouped_case("odd-k-route",      23,   6,   3,  33, 100, "route")
_grouped_case("decode",            1,   8,   1,  64, 256, "route", "bf16")
_grouped_case("prompt100-8e",    100,   8,   5,  40, 160, "route", "bf16")
_grouped_case("odd-k-route",      23,   6,   3,  33, 100, "route", "bf16")
