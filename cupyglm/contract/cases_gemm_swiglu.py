"""Contract cases of the ops gemm_swiglu and gemm_grouped_swiglu on their prompt rows (decode=0: the gate and up
GEMMs on the tensor core, rounded to bf16, then the swiglu kernel) against the reference (the same two GEMMs,
then swiglu), with and without the swiglu limit (sums large enough that the clamp bites), at decode, verify and
prompt shapes.

Controls: gate and up weights exchanged (the epilogue's operands swapped), and for the grouped form one row
routed to the wrong expert (experts no row uses have NaN weights, so reading a wrong slice shows)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_swiglu

REF = NumpyOps()


def _bf(rng, shape, std=1.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std))


def _dense(label: str, m: int, n: int, k: int, limit):
    def make(rng):
        return {"x": _bf(rng, (m, k)), "wg": _bf(rng, (n, k), 3 * k ** -0.5), "wu": _bf(rng, (n, k), 3 * k ** -0.5)}

    def run(kn, d):
        return {"y": ops_gemm_swiglu.gemm_swiglu(kn, d["x"], d["wg"], d["wu"], limit)}

    def replay(d):
        return {"y": REF.gemm_swiglu(d["x"], d["wg"], d["wu"], limit)}

    def ctl(kn, d):
        return {"y": ops_gemm_swiglu.gemm_swiglu(kn, d["x"], d["wu"], d["wg"], limit)}

    return case(Case(f"gemm_swiglu[{label}]", ("gemm_tc_bf16", "swiglu"), make, run, replay, ctl))


def _grouped(label: str, m: int, e: int, used: int, n: int, k: int, limit, control: str):
    def make(rng):
        wg, wu = _bf(rng, (e, n, k), 3 * k ** -0.5), _bf(rng, (e, n, k), 3 * k ** -0.5)
        group = np.sort(rng.permutation(np.arange(m) % used)).astype(np.int32)    # sorted by expert, as the MoE
        absent = np.setdiff1d(np.arange(e), group)
        wg[absent] = np.nan
        wu[absent] = np.nan
        return {"x": _bf(rng, (m, k)), "wg": wg, "wu": wu, "group": group}

    def run(kn, d):
        return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wg"], d["wu"], d["group"], limit)}

    def replay(d):
        return {"y": REF.gemm_grouped_swiglu(d["x"], d["wg"], d["wu"], d["group"], limit)}

    if control == "swap":
        def ctl(kn, d):
            return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wu"], d["wg"], d["group"], limit)}
    else:
        def ctl(kn, d):
            group = d["group"].copy()
            r = m // 2
            group[r] = (group[r] + 1) % max(used, 2)
            return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wg"], d["wu"], kn.xp.asarray(group),
                                                              limit)}

    return case(Case(f"gemm_grouped_swiglu[{label}]", ("gemm_tc_grouped_bf16", "swiglu"), make, run, replay, ctl))


#      label          M    N    K    limit
_dense("decode",      1,  64, 256,   2.0)       # one token, the clamp bites
_dense("verify",     16,  48, 256,  None)       # MTP verify rows, no limit
_dense("prompt100", 100,  40, 100,   2.0)       # rows not a multiple of 32, K % 32 = 4
#        label          M    E  used   N    K   limit  control
_grouped("decode-8",    8,   8,   5,  64, 256,   2.0, "route")    # one token's 8 (row, slot) pairs
_grouped("verify",     64,   8,   8,  32, 128,  None, "swap")
_grouped("prompt100", 100,   8,   6,  40, 100,   2.0, "route")    # experts 6, 7 absent (NaN weights)
