"""Contract cases of cuda_src/gemv_q_multi.cu: the decode rows of ops gemm_and_swiglu (the MoE's bf16 router beside
its quantised shared expert) and gemm_multi with quantised parts (a DSA layer's q_a, kv_a and wk beside the
indexer's bf16 gate and head weights), one launch each, every output against the NumPy reference's own gemm /
swiglu, 0 ULPs; mixed calls also run the prompt rows' tensor-core GEMMs.

Planted controls, each a kernel variant, in turn per format (cases_gemv_q's pool: scales, nibbles, the tensor
core's order); _cover adds a case for any variant the table leaves out.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.cases_gemv_q import _define, _pool, _tag, _x
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_multi

REF = NumpyOps()
_USED: dict[str, list[str]] = {}


def _and_swiglu(label: str, fmt: str, m: int, d: int, na: int, ns: int, k: int, out: str, limit) -> None:
    kernel = f"gemv_multi_swiglu_{fmt}_lane16"
    define = _define(kernel, fmt, out == "f32", _USED)

    def make(rng):
        return {"x": _x(rng, m, k, 3.0), "w": _x(rng, na, k, k ** -0.5), "g": qweight(rng, fmt, ns, k),
                "u": qweight(rng, fmt, ns, k)}

    def run(kn, dd):
        ya, ys = ops_gemm_multi.gemm_and_swiglu(kn, dd["x"], dd["w"], out, dd["g"].to(kn.xp), dd["u"].to(kn.xp),
                                                limit, decode=d)
        return {"y": ya, "act": ys}

    def replay(dd):
        ya, ys = REF.gemm_and_swiglu(dd["x"], dd["w"], out, dd["g"], dd["u"], limit, decode=d)
        return {"y": ya, "act": ys}

    prompt = ("gemm_tc" if out == "f32" else "gemm_tc_bf16", f"gemm_tc_{fmt}_bf16", "swiglu")
    case(Case(f"gemv_multi_swiglu_{fmt}[{label},{_tag(define)}]", (kernel,) + (prompt if d < m else ()), make,
              run, replay, lambda kn, dd: run(kn.variant(define), dd)))


def _multi(label: str, fmt: str, m: int, d: int, parts, block=(128, 128)) -> None:
    """parts: (N, K, out, quantised) in the call's order, every part reading its own x [M, K]."""
    kernel = f"gemv_multi_{fmt}_lane16"
    define = _define(kernel, fmt, any(o == "f32" for _, _, o, _ in parts), _USED)

    def make(rng):
        dd = {}
        for p, (n, k, _, q) in enumerate(parts):
            dd[f"x{p}"] = _x(rng, m, k)
            dd[f"w{p}"] = qweight(rng, fmt, n, k, block) if q else _x(rng, n, k, k ** -0.5)
        return dd

    def run(kn, dd):
        ws = tuple(dd[f"w{p}"].to(kn.xp) if q else dd[f"w{p}"] for p, (*_, q) in enumerate(parts))
        ys = ops_gemm_multi.gemm_multi(kn, tuple(dd[f"x{p}"] for p in range(len(parts))), ws,
                                       tuple(o for _, _, o, _ in parts), decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    def replay(dd):
        ys = REF.gemm_multi(tuple(dd[f"x{p}"] for p in range(len(parts))),
                            tuple(dd[f"w{p}"] for p in range(len(parts))), tuple(o for _, _, o, _ in parts), decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    prompt = ("gemm_tc", f"gemm_tc_{fmt}_bf16") if d < m else ()
    case(Case(f"gemv_multi_{fmt}[{label},{_tag(define)}]", (kernel,) + prompt, make, run, replay,
              lambda kn, dd: run(kn.variant(define), dd)))


for _f in ("fp8", "nvfp4"):
    #             label       fmt   M   d  N_a  N_s    K    out    limit
    _and_swiglu("decode",     _f,   1,  1,  64,  48, 512, "f32",  2.0)   # router of 64 experts + shared expert
    _and_swiglu("verify",     _f,  16, 16,  24,  40, 608, "f32",  None)  # a pair block of 8 columns, 3 stages
    _and_swiglu("rows17",     _f,  17, 17,  17,  20, 256, "bf16", 2.0)   # two row groups, partial blocks
    _and_swiglu("mixed",      _f,  12,  3,  16,  24, 256, "f32",  2.0)   # 3 decode + 9 prompt rows
    #        label      fmt  M   d   parts (N, K, out, quantised)
    _multi("dsa",       _f,  1,  1, ((48, 512, "bf16", True), (40, 512, "bf16", True), (24, 512, "bf16", True),
                                     (16, 512, "sigmoid_bf16", False), (8, 512, "f32", False)))
    _multi("verify",    _f, 16, 16, ((33, 1104, "f32", True), (20, 256, "bf16", False)))     # scalar loads
    _multi("rows17",    _f, 17, 17, ((17, 256, "bf16", True), (40, 768, "f32", True)))       # quantised only
    _multi("mixed",     _f, 12,  4, ((24, 256, "f32", True), (16, 256, "bf16", False), (32, 512, "f32", True)))


def _cover() -> None:
    """Every kernel meets every planted variant of its format."""
    for kernel, used in list(_USED.items()):
        fmt = "fp8" if "_fp8_" in kernel else "nvfp4"
        for define in _pool(fmt, True):
            if define in used:
                continue
            if kernel.startswith("gemv_multi_swiglu"):
                _and_swiglu("cover", fmt, 2, 2, 24, 144, 768, "f32", 2.0)
            else:
                _multi("cover", fmt, 2, 2, ((144, 768, "f32", True), (24, 768, "f32", False)))


_cover()
