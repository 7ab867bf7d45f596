"""Contract cases of cuda_src/gemv.cu: the decode/verify rows of ops gemm, gemm_heads and gemm_grouped (their
leading `decode` rows), at the shapes the tiny and full models decode at; the prompt rows of mixed calls go to
the tensor-core gemm (gemm_tc.cu), so a mixed case checks both paths in one output.

Controls (gemv_tc.cuh, the decode order of backend/tc_order.py): -DCONTROL_TC_REVERSED (a 32-block's two mma
steps taken in the other order: the k-chain reversed), -DCONTROL_TC_IEEE (IEEE fp32 multiply-adds in place of the
tensor core's model), -DCONTROL_TC_TRANSPOSED (an A fragment's two k halves swapped); a misrouted row for the
grouped form (absent experts' weights are NaN).
bf16 outputs (the epilogue rounds) use a dropped last K term, as a reordering rarely survives the rounding.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm, ops_gemv

REF = NumpyOps()


def prompt_kernel(gemv: str) -> str:
    """The tensor-core GEMM a mixed call's prompt rows take beside a decode GEMV: gemv_grouped_fp8_lane16_bf16 ->
    gemm_tc_grouped_fp8_bf16; a SwiGLU GEMV's prompt rows run the bf16-out GEMMs (then the swiglu kernel)."""
    name = gemv.replace("_lane16", "").replace("gemv", "gemm_tc", 1)
    if "_swiglu" in name:
        name = name.replace("_swiglu", "") + "_bf16"
    return name


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))

def _tail(kn, x):
    x = x.copy()
    x[..., -1] = 0                             # the last K term dropped (tail off-by-one)
    return kn.xp.asarray(x)


def _gemv_case(label: str, m: int, d: int, n: int, k: int, out: str = "f32",
               control: str = "CONTROL_TC_REVERSED") -> Case:
    def make(rng):
        return {"x": _bf(rng, (m, k)), "w": _bf(rng, (n, k), k ** -0.5)}

    def run(kn, dd):
        return {"y": ops_gemm.gemm(kn, dd["x"], dd["w"], out=out, decode=d)}

    def replay(dd):
        return {"y": REF.gemm(dd["x"], dd["w"], out=out, decode=d)}

    if out == "f32":
        def ctl(kn, dd):
            return {"y": ops_gemm.gemm(kn.variant(control), dd["x"], dd["w"], out=out, decode=d)}
    else:
        def ctl(kn, dd):
            return {"y": ops_gemm.gemm(kn, _tail(kn, dd["x"]), dd["w"], out=out, decode=d)}

    kernel = "gemv_lane16" if out == "f32" else "gemv_lane16_bf16"
    kernels = (kernel,) if d == m else (kernel, prompt_kernel(kernel))
    name = "gemv" if out == "f32" else "gemv.bf16"
    return case(Case(f"{name}[{label}]", kernels, make, run, replay, ctl))


def _heads_case(label: str, h: int, m: int, d: int, n: int, k: int, out: str = "f32") -> Case:
    def make(rng):
        return {"x": _bf(rng, (h, m, k)), "w": _bf(rng, (h, n, k), k ** -0.5)}

    def run(kn, dd):
        return {"y": ops_gemm.gemm_heads(kn, dd["x"], dd["w"], out=out, decode=d)}

    def replay(dd):
        return {"y": REF.gemm_heads(dd["x"], dd["w"], out=out, decode=d)}

    if out == "f32":
        def ctl(kn, dd):
            return {"y": ops_gemm.gemm_heads(kn.variant("CONTROL_TC_IEEE"), dd["x"], dd["w"], decode=d)}
    else:
        def ctl(kn, dd):                        # the heads' weights shifted by one head
            w = kn.xp.ascontiguousarray(kn.xp.roll(dd["w"], 1, axis=0))
            return {"y": ops_gemm.gemm_heads(kn, dd["x"], w, out=out, decode=d)}

    kernel = "gemv_lane16" if out == "f32" else "gemv_lane16_bf16"
    name = "gemv_heads" if out == "f32" else "gemv_heads.bf16"
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


def _grouped_case(label: str, m: int, d: int, e: int, used: int, n: int, k: int, control: str,
                  out: str = "f32") -> Case:
    """m rows (the first d decode rows) over the first `used` of e experts, sorted by expert within each role as
    the MoE sorts them; experts >= used get NaN weights."""
    def make(rng):
        w = _bf(rng, (e, n, k), k ** -0.5)
        ids = rng.permutation(np.arange(m) % used).astype(np.int32)
        group = np.concatenate([np.sort(ids[:d]), np.sort(ids[d:])]).astype(np.int32)
        w[np.setdiff1d(np.arange(e), group)] = np.nan       # poisoned: no row may read them
        return {"x": _bf(rng, (m, k)), "w": w, "group": group}

    def run(kn, dd):
        return {"y": ops_gemm.gemm_grouped(kn, dd["x"], dd["w"], dd["group"], out=out, decode=d)}

    def replay(dd):
        return {"y": REF.gemm_grouped(dd["x"], dd["w"], dd["group"], out=out, decode=d)}

    if control == "order":
        def ctl(kn, dd):
            return {"y": ops_gemm.gemm_grouped(kn.variant("CONTROL_TC_TRANSPOSED"), dd["x"], dd["w"], dd["group"],
                                               out=out, decode=d)}
    else:
        def ctl(kn, dd):
            group = dd["group"].copy()
            r = d // 2
            group[r] = (group[r] + 1) % max(used, 2)    # one decode row routed to the wrong expert
            return {"y": ops_gemm.gemm_grouped(kn, dd["x"], dd["w"], kn.xp.asarray(group), out=out, decode=d)}

    kernel = "gemv_grouped_lane16" if out == "f32" else "gemv_grouped_lane16_bf16"
    name = "gemv_grouped" if out == "f32" else "gemv_grouped.bf16"
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#            label              M    d    N     K
_gemv_case("decode",             1,   1, 256,  256)          # one token, hidden 256
_gemv_case("verify",            16,  16,  96,  256, "f32", "CONTROL_TC_IEEE")   # MTP verify: 16 rows, one read
_gemv_case("rows17",            17,  17,  40,  320, "f32", "CONTROL_TC_TRANSPOSED")   # two row groups
_gemv_case("long-k",             3,   3,  20, 1100)          # three slices, K % 512 = 76, K % 8 = 4 (scalar loads)
_gemv_case("slices",             2,   2,  33, 1536, "f32", "CONTROL_TC_IEEE")   # three full slices, N % 16 = 1
_gemv_case("rounds",             9,   9,  17, 4640)          # ten slices: two rounds of the block's 8 warps
_gemv_case("mixed",             20,   4,  24,  256)          # 4 decode rows + 16 prompt rows in one call
_gemv_case("decode",             1,   1, 256,  256, "bf16")
_gemv_case("verify",            16,  16,  96,  256, "bf16")
_gemv_case("odd-k",              7,   7,  33,  100, "bf16")
#            label              H    M    d    N    K
_heads_case("decode",            4,   1,   1,  32,  64)       # absorbed q x w_k_t, one token
_heads_case("mixed",             3,   9,   2,  20, 100)       # 2 decode rows of 9, per head
_heads_case("decode",            4,   1,   1,  32,  64, "bf16")
_heads_case("mixed",             3,   9,   2,  20, 100, "bf16")
#               label              M    d    E  used   N    K   control
_grouped_case("decode",             8,   8,   8,   5,  64, 1040, "order")   # one token's 8 slots, 3 slices
_grouped_case("verify-runs",       48,  48,   6,   2,  40,  256, "route")   # runs longer than 16 rows
_grouped_case("mixed",             30,  10,   6,   4,  33,  100, "route")   # decode pairs, then prompt pairs
_grouped_case("decode",             8,   8,   8,   5,  64,  256, "route", "bf16")
_grouped_case("mixed",             30,  10,   6,   4,  33,  100, "route", "bf16")


def _flags_case(label: str, m: int, e: int, n: int, k: int, bad: int) -> Case:
    """The grouped gemv counting ids outside [0, E) into its guard slot itself: the last `bad` rows carry ids E
    and E + 3 (sorted last, as moe_sort puts them); their rows are NaN, flags = [bad, ~first bad row].
    Control: the kernel given slot -1 (nothing counted)."""
    def make(rng):
        ids = np.sort(rng.integers(0, e, m - bad)).astype(np.int32)
        tail = np.where(np.arange(bad) < bad // 2, e, e + 3).astype(np.int32)
        return {"x": _bf(rng, (m, k)), "w": _bf(rng, (e, n, k), k ** -0.5), "group": np.concatenate([ids, tail])}

    def launch(kn, dd, slot):
        y = kn.empty((m, n), np.float32)
        flags = kn.xp.zeros((1, 2), dtype=np.uint32)
        ops_gemv.gemv_grouped(kn, dd["x"], dd["w"], dd["group"], y, "", (flags, slot))
        return {"y": y, "flags": flags}

    def replay(dd):
        y = np.full((m, n), np.nan, np.float32)
        for r in range(m - bad):
            y[r] = REF.gemm(dd["x"][r:r + 1], dd["w"][dd["group"][r]], decode=1)[0]
        first = m - bad
        return {"y": y, "flags": np.array([[bad, ~np.uint32(first)]], dtype=np.uint32)}

    return case(Case(f"gemv_grouped.flags[{label}]", ("gemv_grouped_lane16",), make,
                     lambda kn, dd: launch(kn, dd, 0), replay, lambda kn, dd: launch(kn, dd, -1)))


#             label      M   E   N    K  bad
_flags_case("decode",    8,  4, 40, 256,  3)     # one token's 8 pairs, 3 of them with bad ids
_flags_case("runs",     40,  3, 17, 100, 20)     # bad runs longer than 16 rows
