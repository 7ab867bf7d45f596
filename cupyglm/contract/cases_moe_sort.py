"""Contract cases of cuda_src/moe_sort.cu (ops moe_sort, moe_route_sort) and of moe.cu's moe_combine_sorted (op
moe_combine with pos, the combine that reads moe_sort's order without a scatter): decode, verify and prompt-sized
pair lists (more pairs than one tile of the block), experts repeated across rows, and ids outside [0, E) (sorted
last, in pair order).

Control: two pairs' experts exchanged (a row routed as another row was), which moves both in the order."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.contract.cases_moe import ROUTE_ULPS, ROUTE_WHY
from cupyglm.kernels import ops_moe

REF = NumpyOps()


def _sort(label: str, t: int, k: int, e: int, used: int, bad: bool = False) -> Case:
    def make(rng):
        ids = np.stack([rng.choice(used, k, replace=False) for _ in range(t)]).astype(np.int32)   # [T, k]
        if bad:
            ids[0, 0], ids[t - 1, k - 1] = -1, e
        stale = ids.copy()
        a = next(i for i in range(1, t * k) if stale.flat[i] != stale.flat[0]) if t * k > 1 else 0
        stale.flat[0], stale.flat[a] = stale.flat[a], stale.flat[0]
        return {"ids": ids, "stale": stale}

    def run(kn, d):
        return dict(zip(("order", "group", "src", "pos"), ops_moe.moe_sort(kn, d["ids"], e)))

    def replay(d):
        return dict(zip(("order", "group", "src", "pos"), REF.moe_sort(d["ids"], e)))

    def ctl(kn, d):
        return dict(zip(("order", "group", "src", "pos"), ops_moe.moe_sort(kn, d["stale"], e)))

    return case(Case(f"moe_sort[{label}]", ("moe_sort",), make, run, replay, ctl))


#     label        T    k    E   used
_sort("decode",    1,   8, 288, 288)       # one token, the full model's 288 experts
_sort("verify",   16,   8,  64,  12)       # 16 rows over few experts: long runs of one expert
_sort("prompt",  300,   8, 288, 288)       # 2,400 pairs: many tiles
_sort("bad-ids",  40,   4,  16,  16, bad=True)


def _combine_sorted(label: str, t: int, k: int, d: int) -> Case:
    """moe_combine with pos: the experts' outputs left in sorted order (no scatter) against the reference's
    gather-then-combine. Control: pos of two pairs of one row exchanged (slots read each other's rows)."""
    def make(rng):
        pos = rng.permutation(t * k).astype(np.int32)
        bad = pos.copy()
        bad[0], bad[1] = pos[1], pos[0]
        return {"ys": rng.standard_normal((t * k, d)).astype(np.float32), "pos": pos, "bad": bad,
                "w": rng.uniform(0.0, 1.0, (t, k)).astype(np.float32),
                "shared": rng.standard_normal((t, d)).astype(np.float32)}

    def run(kn, x):
        return {"o": ops_moe.moe_combine(kn, x["ys"], x["w"], x["shared"], x["pos"])}

    def replay(x):
        return {"o": REF.moe_combine(x["ys"], x["w"], x["shared"], x["pos"])}

    def ctl(kn, x):
        return {"o": ops_moe.moe_combine(kn, x["ys"], x["w"], x["shared"], x["bad"])}

    return case(Case(f"moe_combine.sorted[{label}]", ("moe_combine_sorted",), make, run, replay, ctl))


_combine_sorted("decode",   1, 8, 256)
_combine_sorted("prompt37", 37, 8, 64)
_combine_sorted("full",     3, 8, 4096)


def _route_sort(label: str, t: int, k: int, e: int) -> Case:
    """moe_route_sort (routing and sort in one block) against moe_route then moe_sort of the reference.
    Control: the same launch with the bias reversed (other experts picked)."""
    def make(rng):
        return {"logits": (rng.standard_normal((t, e)) * 2.0).astype(np.float32),
                "bias": (rng.standard_normal(e) * 0.1).astype(np.float32)}

    names = ("ids", "w", "order", "group", "src", "pos")

    def run(kn, d):
        return dict(zip(names, ops_moe.moe_route_sort(kn, d["logits"], d["bias"], k, 2.5, e)))

    def replay(d):
        return dict(zip(names, REF.moe_route_sort(d["logits"], d["bias"], k, 2.5, e)))

    def ctl(kn, d):
        bias = kn.xp.ascontiguousarray(d["bias"][::-1])
        return dict(zip(names, ops_moe.moe_route_sort(kn, d["logits"], bias, k, 2.5, e)))

    return case(Case(f"moe_route_sort[{label}]", ("moe_route_sort",), make, run, replay, ctl, ROUTE_ULPS,
                     ROUTE_WHY))


#           label      T   k    E
_route_sort("decode",  1,  8, 288)       # one token of the full model
_route_sort("verify", 16,  8, 288)       # 16 verify rows: several tokens per warp
_route_sort("tiny",    3,  2,   8)       # few experts: runs of one expert
