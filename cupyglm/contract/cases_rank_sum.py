"""Contract cases of cuda_src/rank_sum.cu (op rank_sum): a collective's gathered partials added in rank order.

Inputs span eight decades of magnitude so that fp32 (and bf16) addition is visibly non-associative: another
order gives other bits. Controls: with three or more ranks the ranks added from the last down
(-DRANK_SUM_PLANT_REVERSED); with two ranks, where IEEE addition is commutative and so no order can show, the
last rank left out (-DRANK_SUM_PLANT_DROP_LAST).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_rank_sum

REF = NumpyOps()


def _case(label: str, shape: tuple[int, ...], dtype: str) -> Case:
    name = "rank_sum_bf16" if dtype == "bf16" else "rank_sum_f32"

    def make(rng):
        v = rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)
        v = v.astype(np.float32)
        return {"parts": bf16(v) if dtype == "bf16" else v}

    def run(k, d):
        return {"sum": ops_rank_sum.rank_sum(k, d["parts"])}

    def replay(d):
        return {"sum": REF.rank_sum(d["parts"])}

    plant = "RANK_SUM_PLANT_REVERSED" if shape[0] > 2 else "RANK_SUM_PLANT_DROP_LAST"

    def ctl(k, d):
        return {"sum": ops_rank_sum.rank_sum(k.variant(plant), d["parts"])}

    return case(Case(f"rank_sum[{label}]", (name,), make, run, replay, ctl))


#      label            [ranks, rows, width]  dtype
_case("tp2-decode",     (2, 1, 256),          "f32")     # a decode row's sublayer partial at TP=2
_case("tp8-verify",     (8, 16, 96),          "f32")     # 16 verify rows at TP=8
_case("tp3-odd",        (3, 7, 100),          "f32")     # a width no block size divides
_case("tp4-flat",       (4, 5000),            "f32")     # several blocks
_case("tp2-bf16",       (2, 3, 64),           "bf16")
_case("tp8-bf16",       (8, 4, 130),          "bf16")
