"""Contract cases of cuda_src/gemm_tc.cu: the prompt-row GEMM on the tensor core, replayed by tc_order.tc_rows (the
decode GEMV's order), at tile edges (M % 128, N % 256), several k-stages (gemm_tc_stage.cuh), several K slices (their
running sums in shared memory) and unaligned K (element loads), per head.

Controls (the decode order's, gemv_tc.cuh's gtc_block): -DCONTROL_TC_REVERSED (a 32-block's two mma steps in the
other order: the k-chain reversed), -DCONTROL_TC_TRANSPOSED (a fragment's two k halves swapped), -DCONTROL_TC_IEEE
(IEEE fp32 multiply-adds in place of the tensor core's model); bf16 outputs drop the last K term, as a reordering
rarely survives the rounding.  The grouped experts (gemm_tc_grouped) replay tc_rows per row against its expert's
slice, rows in shuffled or sorted order, the experts no row uses poisoned with NaN; their controls are the order's
variants or a misrouted row (one row's id changed).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import bf16
from cupyglm.backend.tc_order import tc_rows, tc_rows_batched
from cupyglm.contract.cases_gemv import _bf, _tail
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_gemm_tc


SM120 = 101_376          # a block's opt-in shared memory on sm_86 / sm_89 / sm_120 (the GTS_SMALL tile)
SM80 = 166_912


def _dev(kn, optin: int):
    """kn, or kn as if on a device whose blocks opt in to `optin` bytes of shared memory."""
    return kn.with_shared_optin(optin) if optin else kn


def _gemm_tc_case(label: str, h: int, m: int, n: int, k: int, out: str = "f32",
                  control: str = "CONTROL_TC_REVERSED", optin: int = 0) -> Case:
    """h = 0: the plain [M, K] x [N, K] form; h > 0: per head. optin > 0: a device whose blocks opt in to that
    much shared memory (the GTS_SMALL tile)."""
    xs, ws = ((h, m, k), (h, n, k)) if h else ((m, k), (n, k))

    def make(rng):
        return {"x": _bf(rng, xs), "w": _bf(rng, ws, k ** -0.5)}

    def run(kn, dd):
        return {"y": ops_gemm_tc.gemm_tc(_dev(kn, optin), dd["x"], dd["w"], out=out)}

    def replay(dd):
        y = tc_rows_batched(dd["x"], dd["w"]) if h else tc_rows(dd["x"], dd["w"])
        return {"y": bf16(y) if out == "bf16" else y}

    if out == "f32":
        def ctl(kn, dd):
            return {"y": ops_gemm_tc.gemm_tc(_dev(kn.variant(control), optin), dd["x"], dd["w"], out=out)}
    else:
        def ctl(kn, dd):
            return {"y": ops_gemm_tc.gemm_tc(_dev(kn, optin), _tail(kn, dd["x"]), dd["w"], out=out)}

    kernel = "gemm_tc" if out == "f32" else "gemm_tc_bf16"
    name = "gemm_tc" + ("_heads" if h else "") + (".bf16" if out == "bf16" else "")
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#               label        H    M    N     K   out    control
_gemm_tc_case("edges",       0,  40,  70,  600)                                  # partial row and column tiles
_gemm_tc_case("slices",      0,  33,  64, 1100, "f32", "CONTROL_TC_TRANSPOSED")  # three slices, K % 8 = 4
_gemm_tc_case("ieee",        0,  17,  24,  256, "f32", "CONTROL_TC_IEEE")        # one slice, one row tile
_gemm_tc_case("heads",       3,   9,  20,  100, "f32", "CONTROL_TC_IEEE")        # per head, K % 32 = 4
_gemm_tc_case("stages",      0,  70, 140, 1000)                                  # 16 k-stages, 16-byte copies
_gemm_tc_case("tiles",       0, 140, 270, 1056)                                  # 2 x 2 blocks, 3 slices
_gemm_tc_case("edges",       0,  40,  70,  600, "bf16")
_gemm_tc_case("stages",      0,  70, 140, 1056, "bf16")                          # the last stage's 2nd block empty
_gemm_tc_case("heads",       3,   9,  20,  100, "bf16")
# the GTS_SMALL tile (64 x 128): a 99 KB (sm_120) or 163 KB (sm_80) device
_gemm_tc_case("small.tiles", 0, 140, 270, 1056, "f32", "CONTROL_TC_REVERSED", SM120)   # 3 x 3 blocks, 3 slices
_gemm_tc_case("small.slices", 0, 33, 64, 1100, "f32", "CONTROL_TC_TRANSPOSED", SM80)   # K % 8 = 4
_gemm_tc_case("small.heads", 3,   9,  20,  100, "f32", "CONTROL_TC_IEEE", SM120)
_gemm_tc_case("small.stages", 0, 70, 140, 1056, "bf16", "", SM120)


def _grouped_replay(x, w, group) -> np.ndarray:
    """Row m: tc_rows(x[m:m+1], w[group[m]]) (taken an expert at a time: tc_rows is row by row)."""
    y = np.zeros((x.shape[0], w.shape[1]), dtype=np.float32)
    for e in np.unique(group):
        rows = np.flatnonzero(group == e)
        y[rows] = tc_rows(x[rows], w[e])
    return y


def _gemm_tc_grouped_case(label: str, m: int, e: int, used: int, n: int, k: int, out: str = "f32",
                          control: str = "route", order: str = "shuffled", optin: int = 0) -> Case:
    """m rows over the first `used` of e experts (the rest NaN), ids shuffled or sorted (the MoE's prefill order)."""
    def make(rng):
        w = _bf(rng, (e, n, k), k ** -0.5)
        group = (np.arange(m) % used).astype(np.int32)
        group = np.sort(group) if order == "sorted" else rng.permutation(group)
        w[np.setdiff1d(np.arange(e), group)] = np.nan         # poisoned: no row may read them
        return {"x": _bf(rng, (m, k)), "w": w, "group": group}

    def run(kn, dd, variant=None):
        kk = _dev(kn.variant(variant) if variant else kn, optin)
        return {"y": ops_gemm_tc.gemm_tc_grouped(kk, dd["x"], dd["w"], dd["group"], out=out)}

    def replay(dd):
        y = _grouped_replay(dd["x"], dd["w"], dd["group"])
        return {"y": bf16(y) if out == "bf16" else y}

    def ctl(kn, dd):
        if control != "route":
            return run(kn, dd, control)
        group = dd["group"].copy()
        group[m // 2] = (group[m // 2] + 1) % used           # one row routed to another used expert
        return run(kn, dict(dd, group=kn.xp.asarray(group)))

    kernel = "gemm_tc_grouped" + ("_bf16" if out == "bf16" else "")
    name = "gemm_tc_grouped" + (".bf16" if out == "bf16" else "")
    return case(Case(f"{name}[{label}]", (kernel,), make, run, replay, ctl))


#                      label          M   E used   N     K   out    control                  order
_gemm_tc_grouped_case("unsorted",     40,  5,  4,  70,  600, "f32", "CONTROL_TC_REVERSED")   # edges, expert 4 absent
_gemm_tc_grouped_case("slices",       33,  4,  3,  64, 1100, "f32", "CONTROL_TC_TRANSPOSED", "sorted")  # K % 8 = 4
_gemm_tc_grouped_case("ieee",         17,  3,  2,  24,  256, "f32", "CONTROL_TC_IEEE")
_gemm_tc_grouped_case("route",        50,  6,  5,  20,  100, "f32", "route", "sorted")      # K % 32 = 4, 2 absent
_gemm_tc_grouped_case("unsorted",     40,  5,  4,  70,  600, "bf16")
_gemm_tc_grouped_case("slices",       33,  4,  3,  64, 1100, "bf16", "route", "sorted")
_gemm_tc_grouped_case("small",        70,  5,  4, 140, 1056, "f32", "CONTROL_TC_REVERSED", "shuffled", SM120)
_gemm_tc_grouped_case("small",        70,  5,  4, 140, 1056, "bf16", "route", "sorted", SM120)
