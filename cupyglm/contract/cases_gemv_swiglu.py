"""Contract cases of cuda_src/gemv_swiglu.cu: the decode/verify rows (the leading `decode` rows) of ops
gemm_swiglu and gemm_grouped_swiglu against the unfused reference (two decode-order GEMMs rounded to bf16,
then swiglu), with and without the swiglu limit; mixed calls also run gemm_tc.cu and swiglu for their prompt rows.

Controls: gate and up weights exchanged (the epilogue's operands swapped); for the grouped form one decode row
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


def _dense(label: str, m: int, dec: int, n: int, k: int, limit):
    def make(rng):
        return {"x": _bf(rng, (m, k)), "wg": _bf(rng, (n, k), 3 * k ** -0.5), "wu": _bf(rng, (n, k), 3 * k ** -0.5)}

    def run(kn, d):
        return {"y": ops_gemm_swiglu.gemm_swiglu(kn, d["x"], d["wg"], d["wu"], limit, decode=dec)}

    def replay(d):
        return {"y": REF.gemm_swiglu(d["x"], d["wg"], d["wu"], limit, decode=dec)}

    def ctl(kn, d):
        return {"y": ops_gemm_swiglu.gemm_swiglu(kn, d["x"], d["wu"], d["wg"], limit, decode=dec)}

    kernels = ("gemv_swiglu_lane16",) if dec == m else ("gemv_swiglu_lane16", "gemm_tc_bf16", "swiglu")
    return case(Case(f"gemv_swiglu[{label}]", kernels, make, run, replay, ctl))


def _grouped(label: str, m: int, dec: int, e: int, used: int, n: int, k: int, limit, control: str):
    def make(rng):
        wg, wu = _bf(rng, (e, n, k), 3 * k ** -0.5), _bf(rng, (e, n, k), 3 * k ** -0.5)
        ids = rng.permutation(np.arange(m) % used)
        group = np.concatenate([np.sort(ids[:dec]), np.sort(ids[dec:])]).astype(np.int32)   # per role, as the MoE
        absent = np.setdiff1d(np.arange(e), group)
        wg[absent] = np.nan
        wu[absent] = np.nan
        return {"x": _bf(rng, (m, k)), "wg": wg, "wu": wu, "group": group}

    def run(kn, d):
        return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wg"], d["wu"], d["group"], limit,
                                                          decode=dec)}

    def replay(d):
        return {"y": REF.gemm_grouped_swiglu(d["x"], d["wg"], d["wu"], d["group"], limit, decode=dec)}

    if control == "swap":
        def ctl(kn, d):
            return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wu"], d["wg"], d["group"], limit,
                                                              decode=dec)}
    else:
        def ctl(kn, d):
            group = d["group"].copy()
            r = dec // 2
            group[r] = (group[r] + 1) % max(used, 2)
            return {"y": ops_gemm_swiglu.gemm_grouped_swiglu(kn, d["x"], d["wg"], d["wu"], kn.xp.asarray(group),
                                                              limit, decode=dec)}

    return case(Case(f"gemv_grouped_swiglu[{label}]", ("gemv_grouped_swiglu_lane16",), make, run, replay, ctl))


#      label          M    d    N    K    limit
_dense("decode",      1,   1,  64, 256,   2.0)       # one token, the clamp bites
_dense("verify",     16,  16,  48, 600,  None)       # MTP verify rows, three stages of 256
_dense("odd-k",       5,   5,  33, 100,   2.0)       # K % 8 = 4: scalar loads
_dense("mixed",      12,   3,  40, 256,   2.0)       # 3 decode rows, 9 prompt rows
#        label          M    d    E  used   N    K   limit  control
_grouped("decode-8",    8,   8,   8,   5,  64, 256,   2.0, "route")    # one token's 8 (row, slot) pairs
_grouped("verify",     64,  64,   8,   3,  32, 128,  None, "swap")     # runs longer than 16 rows
_grouped("mixed",      40,  16,   8,   6,  40, 100,   2.0, "route")    # decode pairs, then prompt pairs
