"""Contract cases of the ops gemm, gemm_grouped, gemm_swiglu and gemm_grouped_swiglu on the prompt rows of
quantised weights (FP8 block-scaled, NVFP4; decode=0: cuda_src/gemm_tc_q.cu, then the swiglu kernel for the
SwiGLU forms): replayed by the NumPy reference (backend/tc_quant.py's order over exact bf16 weights), 0 ULPs.

Inputs: real quantised weights (cupyglm.backend.qweight.quantize_*) of random projections whose block and group
scales differ (rows and columns scaled), N and K not multiples of the FP8 block (partial edge blocks), every
e4m3 and e2m1 code in use. Planted controls, each a kernel variant (-D...): the scale of the next block along K
(CONTROL_SCALE_NEXT_BLOCK), the scale grid read transposed (CONTROL_SCALE_TRANSPOSED), and for NVFP4 the two
nibbles of a byte swapped (CONTROL_NIBBLE_SWAP).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.qweight import QWeight, quantize_fp8, quantize_nvfp4, stack
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm, ops_gemm_swiglu

REF = NumpyOps()
CONTROLS = {"fp8": ("CONTROL_SCALE_NEXT_BLOCK", "CONTROL_SCALE_TRANSPOSED"),
            "nvfp4": ("CONTROL_SCALE_NEXT_BLOCK", "CONTROL_SCALE_TRANSPOSED", "CONTROL_NIBBLE_SWAP")}


def _w(rng, n: int, k: int) -> np.ndarray:
    """A projection whose rows and columns carry different magnitudes, so every block has its own scale."""
    w = rng.standard_normal((n, k)).astype(np.float32) * np.float32(k ** -0.5)
    return w * np.exp2(rng.integers(-3, 4, size=(n, 1))).astype(np.float32) \
             * np.exp2(rng.integers(-2, 3, size=(1, k))).astype(np.float32)


def qweight(rng, fmt: str, n: int, k: int, block=(128, 128)) -> QWeight:
    w = _w(rng, n, k)
    if fmt == "fp8":
        v, s = quantize_fp8(w, block)
        return QWeight("fp8", (n, k), v, s, None, block)
    v, s, s2 = quantize_nvfp4(w)
    return QWeight("nvfp4", (n, k), v, s, s2.reshape(1))


_USED: dict[str, int] = {}


def _register(name: str, kernel: str, fmt: str, make, run, replay) -> None:
    """One case; its planted control is the next of the format's variants in turn, so every kernel family
    meets each of them."""
    i = _USED[fmt] = _USED.get(fmt, -1) + 1
    define = CONTROLS[fmt][i % len(CONTROLS[fmt])]

    def ctl(kn, d):
        return run(kn.variant(define), d)

    case(Case(f"{name}[{define.removeprefix('CONTROL_').lower()}]", (kernel,), make, run, replay, ctl))


def _gemm(label: str, fmt: str, m: int, n: int, k: int, out: str, block=(128, 128)) -> None:
    def make(rng):
        return {"x": bf16(rng.standard_normal((m, k)).astype(np.float32)), "w": qweight(rng, fmt, n, k, block)}

    def run(kn, d):
        return {"y": ops_gemm.gemm(kn, d["x"], d["w"].to(kn.xp), out=out)}

    def replay(d):
        return {"y": REF.gemm(d["x"], d["w"], out=out)}

    suffix = "" if out == "f32" else "_bf16"
    _register(f"gemm_{fmt}{suffix.replace('_', '.')}.{label}", f"gemm_tc_{fmt}{suffix}", fmt, make, run, replay)


def _experts(rng, fmt: str, e: int, n: int, k: int, block) -> QWeight:
    return stack([qweight(rng, fmt, n, k, block) for _ in range(e)])


def _grouped(label: str, fmt: str, m: int, e: int, n: int, k: int, out: str, block=(128, 128)) -> None:
    def make(rng):
        group = rng.permutation(np.arange(m) % e).astype(np.int32)
        return {"x": bf16(rng.standard_normal((m, k)).astype(np.float32)),
                "w": _experts(rng, fmt, e, n, k, block), "group": group}

    def run(kn, d):
        return {"y": ops_gemm.gemm_grouped(kn, d["x"], d["w"].to(kn.xp), d["group"], out=out)}

    def replay(d):
        return {"y": REF.gemm_grouped(d["x"], d["w"], d["group"], out=out)}

    suffix = "" if out == "f32" else "_bf16"
    _register(f"gemm_grouped_{fmt}{suffix.replace('_', '.')}.{label}", f"gemm_tc_grouped_{fmt}{suffix}", fmt,
              make, run, replay)


def _swiglu(label: str, fmt: str, m: int, e: int, n: int, k: int, block=(128, 128)) -> None:
    """e = 0: the dense MLP kernel; e > 0: the grouped experts' kernel."""
    limit = 10.0

    def make(rng):
        x = bf16(rng.standard_normal((m, k)).astype(np.float32) * np.float32(3.0))   # some pass the limit
        if e == 0:
            return {"x": x, "g": qweight(rng, fmt, n, k, block), "u": qweight(rng, fmt, n, k, block)}
        return {"x": x, "g": _experts(rng, fmt, e, n, k, block), "u": _experts(rng, fmt, e, n, k, block),
                "group": rng.permutation(np.arange(m) % e).astype(np.int32)}

    def run(kn, d):
        g, u = d["g"].to(kn.xp), d["u"].to(kn.xp)
        if e == 0:
            return {"y": ops_gemm_swiglu.gemm_swiglu(kn, d["x"], g, u, limit)}
        return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], g, u, d["group"], limit)}

    def replay(d):
        if e == 0:
            return {"y": REF.gemm_swiglu(d["x"], d["g"], d["u"], limit)}
        return {"y": REF.gemm_grouped_swiglu(d["x"], d["g"], d["u"], d["group"], limit)}

    kind, kernel = ("gemm_swiglu", "gemm_tc") if e == 0 else ("gemm_grouped_swiglu", "gemm_tc_grouped")
    _register(f"{kind}_{fmt}.{label}", f"{kernel}_{fmt}_bf16", fmt, make, run, replay)


for _f in ("fp8", "nvfp4"):
    #        label        fmt  M    N    K    out
    _gemm("decode",       _f,  1, 272, 512, "f32")        # N, K past whole blocks: a partial FP8 edge block in N
    _gemm("prompt",       _f, 19, 200, 272, "f32")        # rows not a multiple of 32; partial blocks both ways
    _gemm("decode",       _f,  1, 272, 512, "bf16")
    _gemm("prompt",       _f, 19, 200, 272, "bf16")
    _grouped("moe",       _f, 21, 3, 144, 256, "f32")
    _grouped("moe",       _f, 21, 3, 144, 256, "bf16")
    _grouped("tiny",      _f, 9, 4, 32, 64, "bf16", (32, 32))   # the tiny checkpoint's 32 x 32 FP8 blocks
    _swiglu("dense",      _f, 5, 0, 160, 256)
    _swiglu("moe",        _f, 13, 3, 144, 256)
