"""Contract cases of cuda_src/gemv_norm.cu: op rmsnorm_gemm_multi (DSA's q_a norm in the prologue of q_b and wq_b)
against the reference's norm followed by its gemm (the numpy twin). Mixed calls send their prompt rows to
rmsnorm_rows and gemm_tc.cu, so one output checks both paths.

Controls: -DCONTROL_NORM_EPS (the RMSNorm's eps left out; its rows are small, so eps matters),
-DCONTROL_TC_REVERSED (a 32-block's two mma steps in the other order).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemv_norm

REF = NumpyOps()
EPS = 1e-5
VARIANT = {"eps": "CONTROL_NORM_EPS", "order": "CONTROL_TC_REVERSED"}


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _rms_case(label: str, t: int, d: int, k: int, parts, control: str) -> Case:
    """parts: (N_p, out_p); the rows' scale is small (std 0.01) where the control leaves eps out."""
    std = 0.01 if control == "eps" else 1.0
    outs = tuple(o for _, o in parts)

    def make(rng):
        dd = {f"w{p}": _bf(rng, (n, k), k ** -0.5) for p, (n, _) in enumerate(parts)}
        dd.update({"x": _bf(rng, (t, k), std), "w_norm": _bf(rng, (k,), 0.2, 1.0)})
        return dd

    def ws_of(dd):
        return tuple(dd[f"w{p}"] for p in range(len(parts)))

    def launch(kn, dd):
        ys = ops_gemv_norm.rmsnorm_gemm_multi(kn, dd["x"], dd["w_norm"], EPS, ws_of(dd), outs, decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    def replay(dd):
        ys = REF.rmsnorm_gemm_multi(dd["x"], dd["w_norm"], EPS, ws_of(dd), outs, decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    kernels = ("gemv_multi_rmsnorm_lane16",) if d == t else ("gemv_multi_rmsnorm_lane16", "rmsnorm_rows",
                                                            "gemm_tc", "gemm_tc_bf16")
    return case(Case(f"gemv_multi_rmsnorm[{label}]", kernels, make, launch, replay,
                     lambda kn, dd: launch(kn.variant(VARIANT[control]), dd)))


#          label       T   d     K  parts                                        control
_rms_case("dsa",       1,  1,  256, ((96, "bf16"), (64, "bf16")),               "eps")     # q_b, wq_b
_rms_case("verify",   16, 16, 1536, ((40, "f32"), (24, "bf16")),                "order")   # q_lora 1536: 3 stages
_rms_case("mixed",    20,  4,  100, ((17, "f32"), (5, "sigmoid_bf16"), (33, "bf16")), "eps")  # scalar loads
_rms_case("four",     18, 18,   64, ((16, "f32"), (1, "f32"), (17, "f32"), (2, "f32")), "order")
