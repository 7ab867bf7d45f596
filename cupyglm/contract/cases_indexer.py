"""Contract cases of cuda_src/indexer.cu (ops index_pool, index_tail_pool, index_scores, index_scores_rows).

Controls: index_pool with a missing pool member (member 3's gate -inf, so it weighs 0); index_tail_pool with the
tail written before the first pool reads its members (-DCONTROL_TAIL_EARLY) or the pooled rows of two pools
swapped, or the rows read one early; index_scores with the pooled keys of two pools swapped (a wrong page mapping);
index_scores_rows with each row reading the next row's table (-DCONTROL_ROW_TABLE) or two pools' rows swapped.
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


def _tail(label: str, t: int, r0: int, n: int, start: int, i: int, control: str, kp: int = 4, rows: int = 12) -> None:
    """index_tail_pool on one segment: rows r0..r0+n-1 of a T-row call at positions start..; one pool row -1."""
    complete = (start + n) // kp - start // kp

    def make(rng):
        pool_rows = rng.permutation(rows)[:complete].astype(np.int32)
        if complete > 2:
            pool_rows[1] = -1                          # a pool whose row this rank does not hold
        return {"tail_ik": _bf(rng, (kp, i)), "tail_ig": _bf(rng, (kp, i), 2.0), "ik": _bf(rng, (t, i)),
                "ig": _bf(rng, (t, i), 2.0), "ape": _bf(rng, (kp, i), 0.5), "pooled": _bf(rng, (rows, i)),
                "pool_rows": pool_rows}

    def call(fn, d, pool_rows=None, row0=r0):
        fn(d["tail_ik"], d["tail_ig"], d["ik"], d["ig"], d["ape"], d["pooled"],
           d["pool_rows"] if pool_rows is None else pool_rows, row0, n, start)
        return {"tail_ik": d["tail_ik"], "tail_ig": d["tail_ig"], "pooled": d["pooled"]}

    def run(k, d):
        return call(lambda *a: ops_indexer.index_tail_pool(k, *a), d)

    def replay(d):
        return call(REF.index_tail_pool, d)

    if control == "early":
        def ctl(k, d):                                 # the tail overwritten before pool 0 reads its members
            return call(lambda *a: ops_indexer.index_tail_pool(k.variant("CONTROL_TAIL_EARLY"), *a), d)
    elif control == "row":
        def ctl(k, d):                                 # the segment's rows read one row early
            return call(lambda *a: ops_indexer.index_tail_pool(k, *a), d, row0=r0 - 1)
    elif control == "swap":
        def ctl(k, d):                                 # pools 0 and C - 1 written to each other's rows
            bad = d["pool_rows"].copy()
            bad[0], bad[complete - 1] = d["pool_rows"][complete - 1], d["pool_rows"][0]
            return call(lambda *a: ops_indexer.index_tail_pool(k, *a), d, bad)
    else:
        def ctl(k, d):                                 # the next pooled row (a page table off by one)
            bad = d["pool_rows"].copy()
            bad[0] = (bad[0] + 1) % rows
            return call(lambda *a: ops_indexer.index_tail_pool(k, *a), d, bad)

    case(Case(f"index_tail_pool[{label}]", ("index_tail_pool",), make, run, replay, ctl, POOL_ULPS, POOL_WHY))


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


def _scores_rows(label: str, seqs: tuple[int, ...], hi: int, i: int, pw: int, r: int, control: str) -> None:
    """index_scores_rows over a call of len(seqs) segments (seqs[j] rows each): a segment's rows share a table of
    distinct pooled rows out of r, padded with its first; one entry -1 and one r (outside: a zero key)."""
    t = sum(seqs)

    def make(rng):
        rows = np.empty((t, pw), dtype=np.int32)
        at = 0
        for n in seqs:
            table = rng.permutation(r)[:pw].astype(np.int32)
            table[pw - pw // 3:] = table[0]                # past the visible pools: the row's first pool
            rows[at:at + n] = table
            at += n
        rows[t - 1, pw - 1], rows[0, pw - 2] = -1, r
        return {"qi": _bf(rng, (t, hi, i)), "hw": rng.standard_normal((t, hi)).astype(np.float32),
                "pooled": _bf(rng, (r, i)), "rows": rows}

    def call(fn, d, rows=None):
        return {"s": fn(d["qi"], d["hw"], np.float32(hi ** -0.5), d["pooled"], d["rows"] if rows is None else rows)}

    def run(k, d):
        return call(lambda *a: ops_indexer.index_scores_rows(k, *a), d)

    def replay(d):
        return call(REF.index_scores_rows, d)

    if control == "table":
        def ctl(k, d):                                 # row t reads row t + 1's table
            return call(lambda *a: ops_indexer.index_scores_rows(k.variant("CONTROL_ROW_TABLE"), *a), d)
    else:
        def ctl(k, d):                                 # row 0's first two pools swapped (a wrong page mapping)
            bad = d["rows"].copy()
            bad[0, 0], bad[0, 1] = d["rows"][0, 1], d["rows"][0, 0]
            return call(lambda *a: ops_indexer.index_scores_rows(k, *a), d, bad)

    case(Case(f"index_scores_rows[{label}]", ("index_scores_rows",), make, run, replay, ctl))


#      label         P    I
_pool("one",          1,  32)      # decode completing one pool
_pool("prompt",       9,  32)      # a prompt chunk's pools
_pool("full",        64, 128)
_pool("odd",          5,  40)
#      label         T  r0   n  start    I  control
_tail("decode",      3,  1,  1,    11,  32, "shift")    # a decode row completing pool 2 from 3 tail members
_tail("crossing",    9,  2,  5,     2,  32, "early")    # verify rows: a pool from the tail, slots 0, 1 rewritten
_tail("verify",     16,  0, 16,    13,  40, "swap")     # 16 rows: 4 pools, one without a row, I % 16 = 8
_tail("prompt",     37,  0, 37,     0, 128, "swap")     # a prompt chunk from position 0: 9 pools
_tail("none",        3,  1,  2,     5,  32, "row")      # no pool completes: the tail alone (slots 1, 2)
#        label       T  Hi    I     P
_scores("decode",    1,  4,  32,    9)   # tiny: 9 visible pools (sparse from position 35)
_scores("verify",   16,  4,  32,   40)
_scores("prompt37", 37,  4,  32,   17)
_scores("odd",       3, 20,  40,   33)   # Hi > 16 and not a multiple; I % 16 = 8
_scores("full",      2, 32, 128,  600)   # full model: 32 heads x 128, past the 512-pool dense limit
#            label      seqs            Hi    I    Pw     R  control
_scores_rows("decode1", (1,),            4,  32,   16,   40, "swap")    # one decode row: a width bucket of 16
_scores_rows("decode4", (1, 1, 1, 1),    4,  32,   16,   90, "table")   # four sequences, four tables
_scores_rows("mixed",   (1, 1, 7, 16),   4,  32,   32,  120, "table")   # decode rows, a prompt chunk, verify rows
_scores_rows("odd",     (2, 3),         20,  40,   33,   70, "table")   # Hi > 16, I % 16 = 8, Pw % 16 = 1
_scores_rows("full",    (1, 1),         32, 128, 1024, 2100, "table")   # full model: past the 512-pool dense limit
