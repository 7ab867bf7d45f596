"""Contract cases of the decode GEMVs' row tiles (gemv_tc.cuh / gemv_q_tc.cuh: a block's rows run in one or two
8-row mma tiles): the same 16 rows called alone at 1, 2, 3, 5, 8, 9 and 16 rows
(buckets 1, 2, 4, 8, 8, 16, 16), every output replayed from the one 16-row reference, so a row's bits are shown
equal whichever bucket computes it.  The grouped forms take runs of 1, 2, 3, 5, 8, 9 and 16 rows of one expert in
one call (the bucket follows the run).  bf16, FP8 and NVFP4 weights; dense, grouped and SwiGLU forms.

Controls for fp32 outputs: the order's planted mutant, CONTROL_TC_REVERSED (a block's mma steps in the other
order, gemv_tc.cuh / gemv_q_tc.cuh); gate and up exchanged for the SwiGLU forms (bf16 outputs, where a reordering
rarely survives the rounding).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.backend.qweight import QWeight, stack
from cupyglm.contract.cases_gemm_q import qweight
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm, ops_gemm_swiglu

REF = NumpyOps()
COUNTS = (1, 2, 3, 5, 8, 9, 16)        # rows of each call: every bucket, and rows past a bucket's first
ROWS = max(COUNTS)


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def _weight(rng, fmt: str, n: int, k: int):
    return _bf(rng, (n, k), k ** -0.5) if fmt == "bf16" else qweight(rng, fmt, n, k)


def _dev(kn, w):
    return w.to(kn.xp) if isinstance(w, QWeight) else w


def _alone(label: str, fmt: str, n: int, k: int, swiglu: bool = False) -> None:
    """Rows [0, d) alone for each d of COUNTS, against rows [0, d) of the 16-row reference."""
    q = "" if fmt == "bf16" else f"_{fmt}"
    kernel = f"gemv_swiglu{q}_lane16" if swiglu else f"gemv{q}_lane16"

    def make(rng):
        dd = {"x": _bf(rng, (ROWS, k), 3.0 if swiglu else 1.0), "w": _weight(rng, fmt, n, k)}
        if swiglu:
            dd["u"] = _weight(rng, fmt, n, k)
        return dd

    def one(kn, dd, x, swap=False):
        if not swiglu:
            return ops_gemm.gemm(kn, x, _dev(kn, dd["w"]), out="f32", decode=x.shape[0])
        g, u = _dev(kn, dd["w"]), _dev(kn, dd["u"])
        g, u = (u, g) if swap else (g, u)
        return ops_gemm_swiglu.gemm_swiglu(kn, x, g, u, None, decode=x.shape[0])

    def run(kn, dd, swap=False):
        return {f"y{d}": one(kn, dd, kn.xp.ascontiguousarray(kn.xp.asarray(dd["x"])[:d]), swap) for d in COUNTS}

    def replay(dd):
        y = (REF.gemm_swiglu(dd["x"], dd["w"], dd["u"], None, decode=ROWS) if swiglu
             else REF.gemm(dd["x"], dd["w"], out="f32", decode=ROWS))
        return {f"y{d}": y[:d] for d in COUNTS}

    if swiglu:
        def ctl(kn, dd):
            return run(kn, dd, swap=True)
    else:
        def ctl(kn, dd):
            return run(kn.variant(_order_control(fmt)), dd)

    name = "gemv_swiglu" if swiglu else "gemv"
    case(Case(f"{name}{q.replace('_', '.')}.buckets[{label}]", (kernel,), make, run, replay, ctl))


def _order_control(fmt: str) -> str:
    return "CONTROL_TC_REVERSED"


def _runs(label: str, fmt: str, n: int, k: int) -> None:
    """One grouped call whose expert runs are COUNTS rows long (expert i takes the i-th run)."""
    q = "" if fmt == "bf16" else f"_{fmt}"
    kernel = f"gemv_grouped{q}_lane16"
    group = np.concatenate([np.full(c, i, np.int32) for i, c in enumerate(COUNTS)])
    m, e = len(group), len(COUNTS)

    def make(rng):
        if fmt == "bf16":
            w = _bf(rng, (e, n, k), k ** -0.5)
        else:
            w = stack([qweight(rng, fmt, n, k) for _ in range(e)])
        return {"x": _bf(rng, (m, k)), "w": w, "group": group}

    def run(kn, dd):
        return {"y": ops_gemm.gemm_grouped(kn, dd["x"], _dev(kn, dd["w"]), dd["group"], out="f32", decode=m)}

    def replay(dd):
        return {"y": REF.gemm_grouped(dd["x"], dd["w"], dd["group"], out="f32", decode=m)}

    def ctl(kn, dd):
        return run(kn.variant(_order_control(fmt)), dd)

    case(Case(f"gemv_grouped{q.replace('_', '.')}.buckets[{label}]", (kernel,), make, run, replay, ctl))


#      label        fmt      N    K
_alone("bf16",      "bf16",  20,  600)          # two stages (the second partial), two column blocks
_alone("fp8",       "fp8",   20,  640)
_alone("nvfp4",     "nvfp4", 20,  640)
_alone("bf16",      "bf16",  20,  256, swiglu=True)
_alone("nvfp4",     "nvfp4", 20,  256, swiglu=True)
_runs("bf16",       "bf16",  20,  600)
_runs("fp8",        "fp8",   20,  640)
_runs("nvfp4",      "nvfp4", 20,  640)
