"""Contract cases of cuda_src/indexer.cu (ops index_pool, index_tail_pool, index_scores, index_scores_rows).

Controls: index_pool with a missing pool member (member 3's gate -inf, so it weighs 0); index_tail_pool (a whole
call: a segment table naming each sequence's tail slot) with the tail written before the first pool reads its
members (-DCONTROL_TAIL_EARLY), the pooled rows of two pools swapped, the rows read one early, or a segment
writing another sequence's slot; index_scores with the pooled keys of two pools swapped (a wrong page mapping);
index_scores_rows with each row reading the next row's segment's table (-DCONTROL_ROW_TABLE) or two pools' rows
swapped; both scores kernels with a planted order of the tensor core's dots or their head sum (PLANTED). The scores
replay by NumpyOps, whose dots are backend/tc_index.py's chains.
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

# The scores' planted orders (cuda_src/index_mma.cuh): the k chain descending, the heads' lanes folded 1, 2, 4, 8
# after the in-thread 8, each mma step an IEEE fp32 multiply-add chain.
PLANTED = {"reversed": "CONTROL_IDX_REVERSED", "fold": "CONTROL_IDX_FOLD", "ieee": "CONTROL_IDX_IEEE"}

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


def _tail(label: str, t: int, segs: list, i: int, control: str, kp: int = 4, rows: int = 12, ns: int = 5,
          items: int = 0) -> None:
    """index_tail_pool on one call: segs (r0, n, start, slot) of a T-row call, ns tail slots; one pool row -1."""
    cs = [(start + n) // kp - start // kp for _, n, start, _ in segs]
    d0 = np.concatenate([[0], np.cumsum(cs)]).astype(int)
    table = np.array([(r0, n, start, slot, d0[j]) for j, (r0, n, start, slot) in enumerate(segs)], dtype=np.int32)

    def make(rng):
        done = rng.permutation(max(rows, int(d0[-1])))[:d0[-1]].astype(np.int32) % rows
        if d0[-1] > 2:
            done[1] = -1                               # a pool whose row this rank does not hold
        return {"tails_ik": _bf(rng, (ns, kp, i)), "tails_ig": _bf(rng, (ns, kp, i), 2.0), "ik": _bf(rng, (t, i)),
                "ig": _bf(rng, (t, i), 2.0), "ape": _bf(rng, (kp, i), 0.5), "pooled": _bf(rng, (rows, i)),
                "done": done, "seg": table.copy()}

    def call(fn, d, seg=None, done=None):
        fn(d["tails_ik"], d["tails_ig"], d["ik"], d["ig"], d["ape"], d["pooled"], d["seg"] if seg is None else seg,
           d["done"] if done is None else done, items=items)
        return {"tails_ik": d["tails_ik"], "tails_ig": d["tails_ig"], "pooled": d["pooled"]}

    def run(k, d):
        return call(lambda *a, **kw: ops_indexer.index_tail_pool(k, *a, **kw), d)

    def replay(d):
        return call(REF.index_tail_pool, d)

    def launch(k, d, seg=None, done=None):
        return call(lambda *a, **kw: ops_indexer.index_tail_pool(k, *a, **kw), d, seg, done)

    if control == "early":
        def ctl(k, d):                                 # the tail overwritten before pool 0 reads its members
            return call(lambda *a, **kw: ops_indexer.index_tail_pool(k.variant("CONTROL_TAIL_EARLY"), *a, **kw), d)
    elif control == "row":
        def ctl(k, d):                                 # the last segment's rows read one row early
            bad = d["seg"].copy()
            bad[-1, 0] -= 1
            return launch(k, d, bad)
    elif control == "slot":
        def ctl(k, d):                                 # the last segment writes the next (another sequence's) slot
            bad = d["seg"].copy()
            bad[-1, 3] = (bad[-1, 3] + 1) % ns
            return launch(k, d, bad)
    elif control == "swap":
        def ctl(k, d):                                 # the first and the last completed pools in each other's rows
            bad = d["done"].copy()
            bad[0], bad[-1] = d["done"][-1], d["done"][0]
            return launch(k, d, None, bad)
    else:
        def ctl(k, d):                                 # the next pooled row (a page table off by one)
            bad = d["done"].copy()
            bad[0] = (bad[0] + 1) % rows
            return launch(k, d, None, bad)

    case(Case(f"index_tail_pool[{label}]", ("index_tail_pool",), make, run, replay, ctl, POOL_ULPS, POOL_WHY))


def _scores(label: str, t: int, hi: int, i: int, p: int, control: str = "swap") -> None:
    def make(rng):
        return {"qi": _bf(rng, (t, hi, i)), "hw": (rng.standard_normal((t, hi)) * hi ** -0.5).astype(np.float32),
                "pk": _bf(rng, (p, i))}

    def run(k, d):
        return {"s": ops_indexer.index_scores(k, d["qi"], d["hw"], d["pk"])}

    def replay(d):
        return {"s": REF.index_scores(d["qi"], d["hw"], d["pk"])}

    if control in PLANTED:
        def ctl(k, d):                                 # a planted order (PLANTED)
            return {"s": ops_indexer.index_scores(k.variant(PLANTED[control]), d["qi"], d["hw"], d["pk"])}
    else:
        def ctl(k, d):                                 # pools 0 and p - 1 swapped
            pk = d["pk"].copy()
            pk[0], pk[p - 1] = d["pk"][p - 1], d["pk"][0]
            return {"s": ops_indexer.index_scores(k, d["qi"], d["hw"], pk)}

    case(Case(f"index_scores[{label}]", ("index_scores",), make, run, replay, ctl))


def _scores_rows(label: str, seqs: tuple[int, ...], hi: int, i: int, pw: int, r: int, control: str) -> None:
    """index_scores_rows over a call of len(seqs) segments (seqs[j] rows each): each segment's table of distinct
    pooled rows out of r, padded with its first, and each row's segment; one entry -1 and one r (outside: a zero
    key)."""
    t, ns = sum(seqs), len(seqs)

    def make(rng):
        tables = np.empty((ns, pw), dtype=np.int32)                  # [S, Pw] int32
        for j in range(ns):
            tables[j] = rng.permutation(r)[:pw]
            tables[j, pw - pw // 3:] = tables[j, 0]      # past the visible pools: the segment's first pool
        tables[ns - 1, pw - 1], tables[0, pw - 2] = -1, r
        seg = np.repeat(np.arange(ns, dtype=np.int32), seqs)           # [T] int32
        return {"qi": _bf(rng, (t, hi, i)), "hw": rng.standard_normal((t, hi)).astype(np.float32),
                "pooled": _bf(rng, (r, i)), "tables": tables, "seg": seg}

    def call(fn, d, tables=None):
        return {"s": fn(d["qi"], d["hw"], np.float32(hi ** -0.5), d["pooled"],
                        d["tables"] if tables is None else tables, d["seg"])}

    def run(k, d):
        return call(lambda *a: ops_indexer.index_scores_rows(k, *a), d)

    def replay(d):
        return call(REF.index_scores_rows, d)

    if control in PLANTED:
        def ctl(k, d):                                 # a planted order (PLANTED)
            return call(lambda *a: ops_indexer.index_scores_rows(k.variant(PLANTED[control]), *a), d)
    elif control == "table":
        def ctl(k, d):                                 # row t reads row t + 1's segment's table
            return call(lambda *a: ops_indexer.index_scores_rows(k.variant("CONTROL_ROW_TABLE"), *a), d)
    else:
        def ctl(k, d):                                 # segment 0's first two pools swapped (a wrong page mapping)
            bad = d["tables"].copy()
            bad[0, 0], bad[0, 1] = d["tables"][0, 1], d["tables"][0, 0]
            return call(lambda *a: ops_indexer.index_scores_rows(k, *a), d, bad)

    case(Case(f"index_scores_rows[{label}]", ("index_scores_rows",), make, run, replay, ctl))


#      label         P    I
_pool("one",          1,  32)      # decode completing one pool
_pool("prompt",       9,  32)      # a prompt chunk's pools
_pool("full",        64, 128)
_pool("odd",          5,  40)
#      label         T  segments (r0, n, start, slot)              I  control
_tail("decode",      3, [(1, 1, 11, 2)],                           32, "shift")  # one row: pool 2 from 3 tail members
_tail("crossing",    9, [(2, 5, 2, 0)],                            32, "early")  # verify rows: slots 0, 1 rewritten
_tail("verify",     16, [(0, 16, 13, 4)],                          40, "swap")   # 16 rows: 4 pools, I % 16 = 8
_tail("prompt",     37, [(0, 37, 0, 1)],                          128, "swap")   # a prompt chunk from 0: 9 pools
_tail("none",        3, [(1, 2, 5, 3)],                            32, "row")    # no pool completes: the tail alone
_tail("decode4",     4, [(0, 1, 7, 3), (1, 1, 12, 0), (2, 1, 3, 4), (3, 1, 9, 1)], 32, "slot")  # 4 sequences
_tail("mixed",      24, [(0, 1, 11, 2), (1, 5, 2, 0), (6, 18, 0, 3)], 40, "slot")  # decode, verify, prompt rows
_tail("strided",    24, [(0, 1, 11, 2), (1, 5, 2, 0), (6, 18, 0, 3)], 40, "swap", items=2)  # 2 blocks stride 8 items
_tail("empty",       4, [(0, 1, 3, 1), (1, 0, 0, 2), (1, 3, 6, 0)],  32, "early")  # a segment without rows
#        label       T  Hi    I     P  control
_scores("decode",    1,  4,  32,    9)               # tiny: 9 visible pools (sparse from position 35)
_scores("verify",   16,  4,  32,   40, "reversed")
_scores("prompt37", 37,  4,  32,   17, "fold")       # 3 row blocks, the last partial
_scores("odd",       3, 20,  40,   33, "ieee")       # Hi > 16 and not a multiple (zero heads); I % 16 = 8
_scores("full",      2, 32, 128,  600, "reversed")   # full model: 32 heads x 128, past the 512-pool dense limit
_scores("wide",     17, 32, 128,  300, "fold")       # full model: two row blocks, two pool blocks of 256
_scores("blocks",    5, 32, 128,  260)               # full model: pools 0 and 259 in different blocks
#            label      seqs            Hi    I    Pw     R  control
_scores_rows("decode1", (1,),            4,  32,   16,   40, "swap")    # one decode row: a width bucket of 16
_scores_rows("decode4", (1, 1, 1, 1),    4,  32,   16,   90, "table")   # four sequences, four tables
_scores_rows("mixed",   (1, 1, 7, 16),   4,  32,   32,  120, "table")   # decode rows, a prompt chunk, verify rows
_scores_rows("chunk",   (37,),           4,  32,   16,   50, "swap")    # one prompt chunk: 37 rows, one table
_scores_rows("odd",     (2, 3),         20,  40,   33,   70, "table")   # Hi > 16, I % 16 = 8, Pw % 16 = 1
_scores_rows("full",    (1, 1),         32, 128, 1024, 2100, "table")   # full model: past the 512-pool dense limit
_scores_rows("chain",   (1, 3),         32, 128,  100,  300, "reversed")  # full model: the k chain descending
_scores_rows("fold",    (1, 1, 7),       4,  32,   48,   90, "fold")      # the heads' lanes folded 1, 2, 4, 8
_scores_rows("ieee",    (2, 3),         20,  40,   33,   70, "ieee")      # IEEE steps; zero heads, I % 16 = 8
