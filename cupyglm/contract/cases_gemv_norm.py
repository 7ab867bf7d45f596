"""Contract cases of cuda_src/gemv_norm.cu: ops kda_out_gemm (KDA's gated output norm computed in o_proj's GEMV
prologue) and rmsnorm_gemm_multi (DSA's q_a norm in the prologue of q_b and wq_b), each against the reference's
norm followed by its gemm (the numpy twins). Mixed calls send their prompt rows to kda_out / rmsnorm_rows and
gemm_tc.cu, so one output checks both paths.

Controls: -DCONTROL_NORM_HEAD (a KDA element normed by the next head's scalar), -DCONTROL_NORM_EPS (the RMSNorm's
eps left out; its rows are small, so eps matters), -DCONTROL_TC_REVERSED (a 32-block's two mma steps in the other
order), or the gates of two heads swapped.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemv_norm

REF = NumpyOps()
EPS = 1e-5
VARIANT = {"head": "CONTROL_NORM_HEAD", "eps": "CONTROL_NORM_EPS", "order": "CONTROL_TC_REVERSED"}


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _kda_case(label: str, t: int, d: int, h: int, v: int, n: int, control: str) -> Case:
    def make(rng):
        return {"y": _bf(rng, (t, h, v), 0.3), "w_norm": _bf(rng, (v,), 0.2, 1.0), "gate": _bf(rng, (t, h, v), 2.0),
                "w": _bf(rng, (n, h * v), (h * v) ** -0.5)}

    def launch(kn, dd, gate):
        return {"out": ops_gemv_norm.kda_out_gemm(kn, dd["y"], dd["w_norm"], gate, EPS, dd["w"], decode=d)}

    def replay(dd):
        return {"out": REF.kda_out_gemm(dd["y"], dd["w_norm"], dd["gate"], EPS, dd["w"], decode=d)}

    if control == "swap":
        def ctl(kn, dd):                        # the gates of heads 0 and 1 swapped
            g = dd["gate"].copy()
            g[:, 0], g[:, 1] = dd["gate"][:, 1], dd["gate"][:, 0]
            return launch(kn, dd, kn.xp.asarray(g))
    else:
        def ctl(kn, dd):
            return launch(kn.variant(VARIANT[control]), dd, dd["gate"])

    kernels = ("gemv_kda_out_lane16",) if d == t else ("gemv_kda_out_lane16", "kda_out", "gemm_tc")
    return case(Case(f"gemv_kda_out[{label}]", kernels, make, lambda kn, dd: launch(kn, dd, dd["gate"]), replay,
                     ctl))


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


#          label       T   d   H    V    N  control
_kda_case("decode",    1,  1,  4,  32,  64, "head")    # the tiny model's 4 heads x 32
_kda_case("verify",   16, 16,  4,  32,  40, "swap")    # 16 MTP verify rows, one weight read
_kda_case("mixed",    20,  4,  3,  40,  33, "order")   # 4 decode rows + 16 prompt rows
_kda_case("odd",       3,  3,  3,  20,  17, "head")    # K = 60: scalar loads, heads straddle 8-value chunks
_kda_case("rows17",   17, 17,  2,  64,  24, "head")    # two row groups
_kda_case("heads64",   2,  2, 64,  16,  16, "head")    # GEMV_NORM_HEADS heads
_kda_case("full",      2,  2, 32, 128,  48, "order")   # a TP=2 rank's 32 heads x 128: K = 4096, 8 stages
#          label       T   d     K  parts                                        control
_rms_case("dsa",       1,  1,  256, ((96, "bf16"), (64, "bf16")),               "eps")     # q_b, wq_b
_rms_case("verify",   16, 16, 1536, ((40, "f32"), (24, "bf16")),                "order")   # q_lora 1536: 3 stages
_rms_case("mixed",    20,  4,  100, ((17, "f32"), (5, "sigmoid_bf16"), (33, "bf16")), "eps")  # scalar loads
_rms_case("four",     18, 18,   64, ((16, "f32"), (1, "f32"), (17, "f32"), (2, "f32")), "order")
