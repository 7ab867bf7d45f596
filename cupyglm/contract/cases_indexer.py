"""Contract cases of cuda_src/indexer.cu (ops index_pool, index_scores).

Controls: index_pool with a missing pool member (member 3's gate -inf, so it weighs 0); index_scores with the
pooled keys of two pools swapped (a wrong page mapping).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_indexer

REF = NumpyOps()
BF16_ULP = 1 << 16
# The kernels compute exp with exp_f32 (cuda_src/exp_f32.cuh: +, *, rint and 2**k only, the same bits on GPU,
# emulator and NumPy). While the NumPy reference still uses np.exp (SIMD, <= 2 ULP, rounds differently) the
# tolerances below hold; once lanes.exp_f32 (the NumPy twin) is the reference's exp they are all 0.
EXACT_EXP = hasattr(lanes, "exp_f32")

POOL_ULPS = 0 if EXACT_EXP else 4 * BF16_ULP
POOL_WHY = ("the 4-way softmax's exp_f32 vs NumPy exp (<= 2 fp32 ULPs) may flip the bf16 rounding of a weight; where "
            "the 4 members cancel that moves the pooled key by more ULPs (measured <= 2 bf16 ULPs)")


def _bf(rng, shape, std=1.0, mean=0.0):
    return bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))


def _pool(label: str, p: int, i: int, kp: int = 4) -> None:
    def make(rng):
        return {"ik": _bf(rng, (p, kp, i)), "ig": _bf(rng, (p, kp, i), 2.0), "ape": _bf(rng, (kp, i), 0.5)}

    def run(k, d):
        return {"pk": ops_indexer.index_pool(k, d["ik"], d["ig"], d["ape"])}

    def replay(d):
        return {"pk": REF.index_pool(d["ik"], d["ig"], d["ape"])}

    def ctl(k, d):                                     # member kp - 1 missing from every pool
        ig = d["ig"].copy()
        ig[:, kp - 1] = 0xFF80 if ig.dtype == np.uint16 else -np.inf     # -inf (as bf16 bits on cuda)
        return {"pk": ops_indexer.index_pool(k, d["ik"], ig, d["ape"])}

    case(Case(f"index_pool[{label}]", ("index_pool",), make, run, replay, ctl, POOL_ULPS, POOL_WHY))


def _scores(label: str, t: int, hi: int, i: int, p: int) -> None:
    def make(rng):
        return {"qi": _bf(rng, (t, hi, i)), "hw": (rng.standard_normal((t, hi)) * hi ** -0.5).astype(np.float32),
                "pk": _bf(rng, (p, i))}

    def run(k, d):
        return {"s": ops_indexer.index_scores(k, d["qi"], d["hw"], d["pk"])}

    def replay(d):
        return {"s": REF.index_scores(d["qi"], d["hw"], d["pk"])}

    def ctl(k, d):                                     # pools 0 and p - 1 swapped
        pk = d["pk"].copy()
        pk[0], pk[p - 1] = d["pk"][p - 1], d["pk"][0]
        return {"s": ops_indexer.index_scores(k, d["qi"], d["hw"], pk)}

    case(Case(f"index_scores[{label}]", ("index_scores",), make, run, replay, ctl))


#      label         P    I
_pool("one",          1,  32)      # decode completing one pool
_pool("prompt",       9,  32)      # a prompt chunk's pools
_pool("full",        64, 128)
_pool("odd",          5,  40)
#        label       T  Hi    I     P
_scores("decode",    1,  4,  32,    9)   # tiny: 9 visible pools (sparse from position 35)
_scores("verify",   16,  4,  32,   40)
_scores("prompt37", 37,  4,  32,   17)
_scores("odd",       3, 20,  40,   33)   # Hi > 16 and not a multiple; I % 16 = 8
_scores("full",      2, 32, 128,  600)   # full model: 32 heads x 128, past the 512-pool dense limit
