"""Contract cases of cuda_src/gemm_tc_q.cu: the prompt-row GEMM on the tensor core for FP8 block-scaled and NVFP4
weights, dense and grouped, replayed by tc_quant.quant_rows (the quantised decode GEMV's order) per row (grouped:
per expert), 0 ULPs; at tile edges (M % 128, N % 128), several K slices, K past whole FP8 blocks and rows of packed
bytes not a multiple of the load (scalar loads) as well as whole 16-byte loads, FP8 blocks of 128, 32 and 256 (a
chain over two stages); the "small" cases run the GTQ_SMALL tile an sm_120-sized device picks (Kernels.fitting).

Grouped inputs: ids unsorted over a subset of the experts; the experts no row uses get NaN scales, so reading one
shows. Planted controls, each a kernel variant, in turn per format (as cases_gemv_q): the next block's scale
(CONTROL_SCALE_NEXT_BLOCK), the scale grid read transposed (CONTROL_SCALE_TRANSPOSED), NVFP4's two nibbles of a
byte swapped (CONTROL_NIBBLE_SWAP), an A fragment's two k halves swapped (CONTROL_TC_TRANSPOSED), a block's mma
steps reversed (CONTROL_TC_REVERSED), IEEE fp32 multiply-adds for the tensor core's model (CONTROL_TC_IEEE; the
last two only where the output is fp32); grouped "route" cases send one row to an expert no row uses, "store-all"
cases store every row of a warp in each expert's pass (CONTROL_GROUP_STORE_ALL).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.tc_quant import quant_rows
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.cases_gemv_q import _define, _experts, _pool, _tag, _x
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_tc_q

_USED: dict[str, list[str]] = {}


def _out(y: np.ndarray, out: str) -> np.ndarray:
    return bf16(y) if out == "bf16" else y


SM120 = 101_376          # a block's opt-in shared memory on sm_86 / sm_89 / sm_120 (the GTQ_SMALL tile)


def _dev(kn, optin: int):
    """kn, or kn as if on a device whose blocks opt in to `optin` bytes of shared memory."""
    return kn.with_shared_optin(optin) if optin else kn


def _dense(label: str, fmt: str, m: int, n: int, k: int, out: str, block=(128, 128), optin: int = 0) -> None:
    suffix = "" if out == "f32" else "_bf16"
    kernel = f"gemm_tc_{fmt}{suffix}"
    define = _define(kernel, fmt, out == "f32", _USED)

    def make(rng):
        return {"x": _x(rng, m, k), "w": qweight(rng, fmt, n, k, block)}

    def run(kn, dd):
        return {"y": ops_gemm_tc_q.gemm_tc_q(_dev(kn, optin), dd["x"], dd["w"].to(kn.xp), out=out)}

    def replay(dd):
        return {"y": _out(quant_rows(dd["x"], dd["w"]), out)}

    case(Case(f"gemm_tc_q_{fmt}{suffix.replace('_', '.')}[{label},{_tag(define)}]", (kernel,), make, run, replay,
              lambda kn, dd: run(kn.variant(define), dd)))


def _ids(rng, m: int, e: int, used: int) -> np.ndarray:
    """[M] int32: `used` experts of e (not the first ones only), every one of them present, in no order."""
    experts = np.sort(rng.choice(e, used, replace=False))
    return experts[rng.permutation(np.arange(m) % used)].astype(np.int32)


def _grouped(label: str, fmt: str, m: int, e: int, used: int, n: int, k: int, out: str, control: str,
             block=(128, 128), optin: int = 0) -> None:
    suffix = "" if out == "f32" else "_bf16"
    kernel = f"gemm_tc_grouped_{fmt}{suffix}"
    define = (_define(kernel, fmt, out == "f32", _USED) if control == "variant"
              else "CONTROL_GROUP_STORE_ALL" if control == "store-all" else None)

    def make(rng):
        group = _ids(rng, m, e, used)
        return {"x": _x(rng, m, k), "w": _experts(rng, fmt, e, np.setdiff1d(np.arange(e), group), n, k, block),
                "group": group}

    def run(kn, dd, group=None):
        g = dd["group"] if group is None else group
        return {"y": ops_gemm_tc_q.gemm_tc_grouped_q(_dev(kn, optin), dd["x"], dd["w"].to(kn.xp), g, out=out)}

    def replay(dd):
        x, w, group = dd["x"], dd["w"], dd["group"]
        y = np.zeros((m, n), np.float32)
        for ex in np.unique(group):
            rows = np.flatnonzero(group == ex)
            y[rows] = quant_rows(x[rows], w[ex])
        return {"y": _out(y, out)}

    if define is None:
        def ctl(kn, dd):
            g = np.array(dd["group"] if kn.xp is np else kn.xp.asnumpy(dd["group"]))    # a host copy
            g[m // 2] = np.setdiff1d(np.arange(e), g)[0]           # one row to an expert no row uses (NaN scales)
            return run(kn, dd, kn.xp.asarray(g))
    else:
        def ctl(kn, dd):
            return run(kn.variant(define), dd)

    case(Case(f"gemm_tc_q_grouped_{fmt}{suffix.replace('_', '.')}[{label},{_tag(define) if define else 'route'}]",
              (kernel,), make, run, replay, ctl))


for _f, _odd in (("fp8", 1100), ("nvfp4", 1104)):   # K with rows of packed bytes not a multiple of 16
    #        label      fmt   M    N     K     out
    _dense("edges",     _f,  40,  70, _odd, "f32")               # partial tiles, three slices, scalar loads
    _dense("whole",     _f,  33,  64, 1536, "f32")               # 16-byte loads, three full slices
    _dense("rows",      _f, 129, 136,  512, "f32")               # three row blocks, three column blocks
    _dense("tiny",      _f,   9,  20,  256, "f32", (32, 32))     # FP8 blocks of 32: a chain a 32-block
    _dense("edges",     _f,  40,  70, _odd, "bf16")
    _dense("whole",     _f,  33, 130, 1024, "bf16")
    _dense("tiny",      _f,   9,  20,  288, "bf16", (32, 32))
    #          label      fmt   M    E  used   N     K     out    control
    _grouped("unsorted",  _f,  45,   6,   4,  70, _odd, "f32",  "variant")   # partial tiles, scalar loads
    _grouped("whole",     _f,  40,   5,   3,  64, 1024, "f32",  "variant")   # 16-byte loads, two slices
    _grouped("route",     _f,  37,   6,   4,  72,  512, "f32",  "route")
    _grouped("unsorted",  _f,  45,   6,   4,  70, _odd, "bf16", "variant")
    _grouped("tiny",      _f,  20,   4,   2,  33,  256, "bf16", "route", (32, 32))
    _grouped("mixed",     _f,  48,   5,   4,  40,  256, "f32",  "store-all")  # 2+ experts in every warp
    _grouped("mixed",     _f,  48,   5,   4,  40,  256, "bf16", "store-all")
    # the GTQ_SMALL tile (64 x 128) on a 99 KB (sm_120) device: three row blocks, two column blocks, three slices
    _dense("small",       _f, 140, 136, 1536, "f32", optin=SM120)
    _dense("small",       _f,  70, 130, _odd, "bf16", optin=SM120)
    _grouped("small",     _f,  90,   5,   3, 140, 1024, "f32",  "variant", optin=SM120)

_dense("bk256", "fp8", 40, 70, 1100, "f32", (128, 256))   # FP8 chains across stages, K's partial stage in one


def _cover() -> None:
    """Every kernel meets every planted variant of its format: one more case (two slices, two row and column
    tiles, several FP8 blocks) for each the table leaves out."""
    for kernel, used in list(_USED.items()):
        fmt = "fp8" if "_fp8" in kernel else "nvfp4"
        out = "bf16" if kernel.endswith("_bf16") else "f32"
        for define in _pool(fmt, out == "f32"):
            if define in used:
                continue
            if "_grouped_" in kernel:
                _grouped("cover", fmt, 40, 4, 3, 72, 768, out, "variant")
            else:
                _dense("cover", fmt, 40, 72, 768, out)


_cover()
