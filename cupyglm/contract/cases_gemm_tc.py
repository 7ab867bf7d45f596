"""Contract cases of cuda_src/gemm_tc.cu: the prompt-row GEMM on the tensor core, replayed by tc_order.tc_rows (the
decode GEMV's order), at tile edges (M % 32, N % 64), several K slices and unaligned K (scalar loads), per head.

Controls (the decode order's, gemv_tc.cuh's gtc_block): -DCONTROL_TC_REVERSED (a 32-block's two mma steps in the
other order: the k-chain reversed), -DCONTROL_TC_TRANSPOSED (a fragment's two k halves swapped), -DCONTROL_TC_IEEE
(IEEE fp32 multiply-adds in place of the tensor core's model); bf16 outputs drop the last K term, as a reordering
rarely survives the rounding.
"""
from __future__ import annotations

from cupyglm.backend.lanes import bf16
from cupyglm.backend.tc_order import tc_rows, tc_rows_batched
from cupyglm.contract.cases_gemv import _bf, _tail
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_tc


def _gemm_tc_case(label: str, h: int, m: int, n: int, k: int, out: str = "f32",
                  control: str = "CONTROL_TC_REVERSED") -> Case:
    """h = 0: the plain [M, K] x [N, K] form; h > 0: per head."""
    xs, ws = ((h, m, k), (h, n, k)) if h else ((m, k), (n, k))

    def make(rng):
        return {"x": _bf(rng, xs), "w": _bf(rng, ws, k ** -0.5)}

    def run(kn, dd):
        return {"y": ops_gemm_tc.gemm_tc(kn, dd["x"], dd["w"], out=out)}

    def replay(dd):
        y = tc_rows_batched(dd["x"], dd["w"]) if h else tc_rows(dd["x"], dd["w"])
        return {"y": bf16(y) if out == "bf16" else y}

    if out == "f32":
        def ctl(kn, dd):
            return {"y": ops_gemm_tc.gemm_tc(kn.variant(control), dd["x"], dd["w"], out=out)}
    else:
        def ctl(kn, dd):
            return {"y": ops_gemm_tc.gemm_tc(kn, _tail(kn, dd["x"]), dd["w"], out=out)}

    kernel = "gemm_tc" if out == "f32" else "gemm_tc_bf16"
    name = "gemm_tc" + ("_heads" if h else "") + (".bf16" if out == "bf16" else "")
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#               label        H    M    N     K   out    control
_gemm_tc_case("edges",       0,  40,  70,  600)                                  # partial row and column tiles
_gemm_tc_case("slices",      0,  33,  64, 1100, "f32", "CONTROL_TC_TRANSPOSED")  # three slices, K % 8 = 4
_gemm_tc_case("ieee",        0,  17,  24,  256, "f32", "CONTROL_TC_IEEE")        # one slice, one row tile
_gemm_tc_case("heads",       3,   9,  20,  100, "f32", "CONTROL_TC_IEEE")        # per head, K % 32 = 4
_gemm_tc_case("edges",       0,  40,  70,  600, "bf16")
_gemm_tc_case("heads",       3,   9,  20,  100, "bf16")
