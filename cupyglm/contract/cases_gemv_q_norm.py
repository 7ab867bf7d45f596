"""Contract cases of cuda_src/gemv_q_norm.cu: the decode rows of ops rmsnorm_gemm_multi with quantised parts (a DSA
layer's q_a norm in the prologue of its quantised q_b beside the indexer's bf16 wq_b), one launch, every output
against the NumPy reference's norm followed by its gemm, 0 ULPs; mixed calls also run the prompt rows' norm and
tensor-core GEMMs.

Planted controls, each a kernel variant, in turn per format (cases_gemv_q's pool: scales, nibbles, the tensor
core's order), and CONTROL_NORM_EPS on rows small enough for eps to matter; _cover adds a case for any variant the
table leaves out.
"""
from __future__ import annotations

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.cases_gemv_q import _define, _pool, _tag, _x
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemv_norm

REF = NumpyOps()
EPS = 1e-5
_USED: dict[str, list[str]] = {}


def _norm(label: str, fmt: str, m: int, d: int, k: int, parts, define: str | None = None, block=(128, 128)) -> None:
    """parts: (N, out, quantised) in the call's order, every part reading rmsnorm(x [M, K])."""
    kernel = f"gemv_multi_rmsnorm_{fmt}_lane16"
    define = define or _define(kernel, fmt, any(o == "f32" for _, o, _ in parts), _USED)
    outs = tuple(o for _, o, _ in parts)
    std = 0.01 if define == "CONTROL_NORM_EPS" else 1.0

    def make(rng):
        dd = {"x": _x(rng, m, k, std), "w_norm": _x(rng, 1, k, 0.2)[0] + 1}
        for p, (n, _, q) in enumerate(parts):
            dd[f"w{p}"] = qweight(rng, fmt, n, k, block) if q else _x(rng, n, k, k ** -0.5)
        return dd

    def ws(dd, xp=None):
        return tuple(dd[f"w{p}"].to(xp) if q and xp is not None else dd[f"w{p}"] for p, (*_, q) in enumerate(parts))

    def run(kn, dd):
        ys = ops_gemv_norm.rmsnorm_gemm_multi(kn, dd["x"], dd["w_norm"], EPS, ws(dd, kn.xp), outs, decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    def replay(dd):
        ys = REF.rmsnorm_gemm_multi(dd["x"], dd["w_norm"], EPS, ws(dd), outs, decode=d)
        return {f"y{p}": y for p, y in enumerate(ys)}

    prompt = ("rmsnorm_rows", "gemm_tc", "gemm_tc_bf16", f"gemm_tc_{fmt}_bf16") if d < m else ()
    case(Case(f"gemv_multi_rmsnorm_{fmt}[{label},{_tag(define)}]", (kernel,) + prompt, make, run, replay,
              lambda kn, dd: run(kn.variant(define), dd)))


for _f in ("fp8", "nvfp4"):
    #      label     fmt   M   d     K   parts (N, out, quantised)
    _norm("dsa",     _f,   1,  1,  512, ((96, "bf16", True), (64, "bf16", False)))          # q_b, wq_b
    _norm("verify",  _f,  16, 16, 1536, ((40, "f32", True), (24, "bf16", False)))           # q_lora 1536
    _norm("rows17",  _f,  17, 17,  256, ((17, "bf16", True), (33, "f32", True)))            # quantised only
    _norm("mixed",   _f,  12,  4,  256, ((24, "f32", True), (5, "sigmoid_bf16", False), (16, "bf16", True),
                                         (8, "f32", False)))                                 # 4 decode + 8 prompt
    _norm("scalar",  _f,   3,  3, 1104, ((33, "f32", True),))                                # scalar weight loads
    _norm("eps",     _f,   2,  2,  512, ((48, "f32", True), (16, "bf16", False)), "CONTROL_NORM_EPS")


def _cover() -> None:
    """Every kernel meets every planted variant of its format."""
    for kernel, used in list(_USED.items()):
        fmt = "fp8" if "_fp8_" in kernel else "nvfp4"
        for define in _pool(fmt, True):
            if define not in used:
                _norm("cover", fmt, 2, 2, 768, ((144, "f32", True), (24, "f32", False)), define)


_cover()
