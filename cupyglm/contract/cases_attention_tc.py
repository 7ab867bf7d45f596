"""Contract cases of cuda_src/attention_tc.cu (prefill attention on the tensor core) against its exact model,
backend/tc_attention.py, bit for bit.

Rows of two segments (each its own shuffled page table of 16-token pages over one store; every store row no
list reaches is NaN, entries past a row's count -1): dense causal rows of a prompt chunk that begins off the
64-position grid, and sparse rows (random ascending positions ending at the row's own, starting off the grid,
some blocks holding one key, some none). R 64, 128 and 512 (the model's). A kernel block holds two rows of up to
16 heads (H 4, the tiny model's: 12 zero queries a tile; 8, TP=8's; 16), whose rows of one segment share each
key block's tile (neighbours of two segments take turns: seg_run rows a segment), or one row of 32 heads in two
tiles (H 20: the second tile partial; 32, TP=2's; 40: the second block's second tile wholly past H). The "one."
cases run on a device with less shared memory a block: the one-tile build (one row of 16 heads a block).

Controls (compile flags of attention_tc.cu): TRANSPOSED_FRAGMENT (Q's fragments with each 8x8 quadrant
transposed), CHAIN_REVERSED (both chains' k steps descending), IEEE_SUM (P V summed in IEEE fp32 in key order),
OFF_GRID (blocks of 64 counted from a row's first position, not from position 0).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import tc_attention as ta
from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.numpy_ops import paged_rows
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_attention_tc as op
from cupyglm.kernels.sim_build import TC_ARCH

PAGE = 16
BIG_COLS = 8          # columns of the cancelling pairs (_cancelling)
KERNELS = (op.KERNEL,)


def _lists(rng, start: int, dense: int, sparse: int):
    """dense rows at positions start.., then sparse rows past them: (positions per row, each ascending)."""
    out = [np.arange(p + 1, dtype=np.int32) for p in range(start, start + dense)]
    for _ in range(sparse):
        q = int(rng.integers(start + 140, start + 260))
        first = int(rng.integers(1, 63))
        picked = rng.choice(np.arange(first, q), int(rng.integers(20, 90)), replace=False)
        picked = np.concatenate([picked[picked // 64 != 2], [q]])      # block 2 left empty, the row's own last
        out.append(np.unique(picked).astype(np.int32))
    return out


def _inputs(rng, h: int, r: int, start: int, dense: int, sparse: int, seg_run: int = 1) -> dict:
    """seg_run consecutive rows a segment, the segments alternating (1: neighbours never share a page table)."""
    lists = _lists(rng, start, dense, sparse)
    t, width = len(lists), max(len(x) for x in lists)
    pages = -(-(max(int(x[-1]) for x in lists) + 1) // PAGE)
    perm = rng.permutation(2 * pages + 2)
    table = np.stack([perm[:pages], perm[pages:2 * pages]]).astype(np.int32)      # disjoint: a row, one position
    tokens = np.full((t, width), -1, np.int32)
    counts = np.array([len(x) for x in lists], np.int32)
    for i, x in enumerate(lists):
        tokens[i, :len(x)] = x
    seg = (np.arange(t) // seg_run % 2).astype(np.int32)
    rows = paged_rows(tokens, table, seg, PAGE)
    store = np.full(((2 * pages + 2) * PAGE, r), np.nan, dtype=BF16)
    used = np.unique(rows[rows >= 0])
    store[used] = bf16(rng.standard_normal((used.size, r)).astype(np.float32))
    _cancelling(store, table, pages * PAGE)
    qa = bf16(rng.standard_normal((t, h, r)).astype(np.float32) * np.float32(0.5))
    qa[:, :, :BIG_COLS] = 0
    return {"qa": qa, "store": store, "tokens": tokens, "table": table, "seg": seg, "counts": counts}


def _cancelling(store, table, length: int) -> None:
    """Position p (p % 64 < 16) holds +2^20 in the first BIG_COLS columns, p + 32 the same row with -2^20 there:
    equal scores (the queries are zero there), so the two cancel in P V and what is left shows how the terms
    beside them were cut (the chain's order and the tensor core's alignment, not an IEEE sum's rounding)."""
    for seg_table in table:
        def row(p):
            return int(seg_table[p // PAGE]) * PAGE + p % PAGE
        for p in range(length - 32):
            a, b = row(p), row(p + 32)
            if p % 64 < 16 and not (np.isnan(store[a, 0]) or np.isnan(store[b, 0])):
                store[a, :BIG_COLS] = BF16.type(2.0 ** 20)
                store[b] = store[a]
                store[b, :BIG_COLS] = BF16.type(-2.0 ** 20)


def _case(label: str, h: int, r: int, start: int, dense: int, sparse: int, control: str, seg_run: int = 1,
          optin: int = 0) -> Case:
    """optin > 0: the device lets a block opt in to that much shared memory (smaller GPUs: the one-tile build)."""
    scale = r ** -0.5

    def make(rng):
        return _inputs(rng, h, r, start, dense, sparse, seg_run)

    def run(k, d):
        k = k.with_shared_optin(optin) if optin else k
        return {"o": op.attention_tc(k, d["qa"], d["store"], d["tokens"], d["table"], d["seg"], PAGE, d["counts"],
                                     scale)}

    def replay(d):
        rows = paged_rows(d["tokens"], d["table"], d["seg"], PAGE)
        return {"o": ta.attention_tc(d["qa"], d["store"], d["tokens"], rows, d["counts"], scale, arch=TC_ARCH)}

    return case(Case(f"attention_tc[{label}]", KERNELS, make, run, replay,
                     lambda kn, dd: run(kn.variant(control), dd)))


#      label          H   R   start dense sparse  control               rows a segment
_case("fragment",    32,  64,   70,   4,    2,   "TRANSPOSED_FRAGMENT")
_case("chain",       16, 128,  112,   4,    2,   "CHAIN_REVERSED")
_case("ieee",        16,  64,  120,   3,    3,   "IEEE_SUM")
_case("grid",        16,  64,   33,   2,    8,   "OFF_GRID")
_case("full",        32, 512,  240,   2,    1,   "CHAIN_REVERSED")      # the model's R at TP=2's 32 heads
_case("heads4",       4,  64,   70,   3,    2,   "TRANSPOSED_FRAGMENT")
_case("heads20",     20,  64,   10,   2,    2,   "CHAIN_REVERSED")
_case("pairs",        8,  64,   60,   5,    4,   "OFF_GRID",           3)   # TP=8's heads: two rows a block
_case("pairs16",     16, 128,  100,   4,    3,   "TRANSPOSED_FRAGMENT", 2)
_case("heads40",     40,  64,   20,   2,    1,   "TRANSPOSED_FRAGMENT")  # a 32-head block's second tile empty

# one tile of 16 heads (ATC_ONE_TILE): sm_120's 99 KB at the model's R, else just the one tile's bytes
SM120 = 101_376
_case("one.full",    32, 512,  240,   2,    1,   "CHAIN_REVERSED",     1, SM120)
_case("one.pairs",    8,  64,   60,   5,    4,   "OFF_GRID",           3, op.shared_bytes(64, 1))
_case("one.heads20", 20,  64,   10,   2,    2,   "TRANSPOSED_FRAGMENT", 1, op.shared_bytes(64, 1))
