"""Launcher of cuda_src/attention_tc.cu: prefill attention on the tensor core (backend/tc_attention.py is its exact
model). The op attention_paged (kernels/ops_attention.py) runs its prompt rows through it."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32

SRC = "attention_tc.cu"
KERNEL = "attention_tc"
WARPS = 8              # ATC_WARPS
THREADS = 32 * WARPS
TILE = 16              # (query row, head) pairs an mma tile (its M)
TILES = 2              # ATC_TILES: mma tiles a block
ROWS = 2               # ATC_ROWS: the most query rows a block (= TILES, as in the ATC_ONE_TILE build)
BLOCK = 64             # ATC_BLOCK: key positions a block, on the absolute grid
MAX_R = 512            # ATC_MAX_R
PAD = 8                # ATC_PAD
STATE = 5              # ATC_ST: ints of a query row's state


ONE_TILE = "ATC_ONE_TILE"   # the variant of GPUs with less shared memory a block: 4 warps, one tile (the same bits)


def heads_a_block(h: int, tiles: int = TILES) -> int:
    """hb: 16 heads of two query rows a block where a row has at most 16 heads (the tiles share each key block's
    tile), else 32 heads of one row; one tile: 16 heads of one row."""
    return TILE if h <= TILE else TILE * tiles


def shared_bytes(r: int, tiles: int = TILES) -> int:
    """A block's dynamic shared memory: the step's latent rows, the tiles' queries and the step's P (bf16, padded
    rows), each key quarter's row maxima (fp32), the slot map, each query row's slots and state, the step's block
    and flag (int32). A block has as many query rows at most as tiles."""
    rows = TILE * tiles
    return ((BLOCK + rows) * (r + PAD) * 2 + rows * (BLOCK + PAD) * 2 + 4 * rows * 4
            + (BLOCK + tiles * BLOCK + tiles * STATE + 2) * 4)


def variant(k: Kernels, r: int) -> tuple[Kernels, int, int]:
    """(kernels, tiles, threads): two tiles where the device's opt-in limit takes them at this R, else the
    ATC_ONE_TILE build of the same file."""
    kt, i = k.fitting(f"{KERNEL} at R={r}", ((shared_bytes(r), ()), (shared_bytes(r, 1), (ONE_TILE,))))
    return (kt, TILES, THREADS) if i == 0 else (kt, 1, THREADS // TILES)


def attention_tc(k: Kernels, qa, store, tokens, table, seg, page_tokens, counts, scale, out=None):
    """qa [T, H, R] bf16, store [N, R] bf16, tokens [T, W] int32 positions (strictly ascending, -1 padded) mapped
    through table [S, width] int32 row seg[t] (seg [T] int32) with page_tokens tokens a page, counts [T] int32
    -> [T, H, R] bf16. Any H (blocks of heads_a_block(H) heads, the last padded with zero queries), R a multiple
    of 64 up to 512; the positions' order and seg's range are the caller's contract (checking them on the device
    would cost a sync). out: the [T, H, R] bf16 rows to write (a view of a call's output), else a new array."""
    xp = k.xp
    qa = check(KERNEL, "qa", xp.ascontiguousarray(qa), (None, None, None), k.bf16)
    t, h, r = qa.shape
    store = check(KERNEL, "store", store, (None, r), k.bf16)
    tokens = check(KERNEL, "tokens", xp.ascontiguousarray(tokens), (t, None), np.int32)
    table = check(KERNEL, "table", xp.ascontiguousarray(table), (None, None), np.int32)
    seg = check(KERNEL, "seg", xp.ascontiguousarray(seg), (t,), np.int32)
    counts = check(KERNEL, "counts", xp.ascontiguousarray(counts), (t,), np.int32)
    pt = int(page_tokens)
    if pt < 1:
        raise ValueError(f"{KERNEL}: page_tokens must be positive, got {pt}")
    if r % 64 or not 0 < r <= MAX_R:
        raise ValueError(f"{KERNEL}: R must be a multiple of 64 up to {MAX_R} (4 warps of 16-column pairs), got {r}")
    kt, tiles, threads = variant(k, r)
    hb = heads_a_block(h, tiles)
    groups = -(-h // hb)                     # blocks of hb heads (grid.y)
    if groups > 65535:
        raise ValueError(f"{KERNEL}: at most {65535 * hb} heads (grid.y), got {h}")
    if t and 0 in table.shape:
        raise ValueError(f"{KERNEL}: an empty page table {table.shape} for {t} rows")
    out = k.empty((t, h, r), k.bf16) if out is None else check(KERNEL, "out", out, (t, h, r), k.bf16)
    if t and h:
        kt.launch_opted(SRC, KERNEL, (-(-t // (TILE * tiles // hb)), groups), (threads,),
                        (qa, store, tokens, table, seg, counts, out, i32(t), i32(h), i32(r), i32(tokens.shape[1]),
                         f32(scale), i32(table.shape[1]), i32(pt), i32(hb)), shared_bytes(r, tiles))
    return out
