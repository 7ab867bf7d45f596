"""DSA attention launchers, with NumpyOps.attention's signatures: the call's leading `decode` rows (decode/verify
rows, cupyglm/backend/roles.py) run cuda_src/attention_split.cu (scores by key tile and head group, P.V by
chunk, head group and column slice, each loaded latent row reused from registers by several heads and keys,
merged in list order by the last block of each row's head group and slice); the prompt rows of
attention_paged run cuda_src/attention_tc.cu (the tensor core, key blocks on the absolute position grid), those of
attention (store rows, no positions) cuda_src/attention.cu (a block per row and head, the decode rows' bits)."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.roles import decode_rows
from cupyglm.kernels import ops_attention_tc
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "attention.cu"
SRC_SPLIT = "attention_split.cu"
SHG = 16           # ATT_SHG: heads per attention_chunk_scores block
SKT = 32           # ATT_SKT: keys per attention_chunk_scores block
PHG = 8            # ATT_PHG: heads per attention_chunk_pv block
PRB = 64           # ATT_PRB: latent columns per attention_chunk_pv block
PV_SHARED_MAX = 48 * 1024
F32 = np.float32


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


def split_grids(t: int, h: int, r: int, w: int, chunk: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The grids of attention_chunk_scores (row, key tile, head group) and attention_chunk_pv (row, chunk,
    head group x column slice) for T rows of H heads, latent R, lists of width W."""
    c = max(1, -(-w // chunk))
    return (t, c * -(-chunk // SKT), -(-h // SHG)), (t, c, -(-h // PHG) * -(-r // PRB))


def pv_shared(chunk: int) -> int:
    """attention_chunk_pv's dynamic shared memory: P [chunk, PHG] f32 and the keys' row pointers [chunk]."""
    return chunk * (PHG * 4 + 8)


def _split(k: Kernels, qa, store, rows, table, seg, pt: int, counts, out, scale: float, chunk: int) -> None:
    """attention_split.cu on rows [0, T) of these (decode/verify rows): scores by key tile, then P.V per chunk and
    column slice with the merge done by each (row, head group, slice)'s last block;
    pt > 0: rows hold positions mapped through table[seg[t]] (table [S, width], seg [T]: attention_rows.cuh)."""
    t, h, r = qa.shape
    w = rows.shape[1]
    if r % 8:
        raise ValueError(f"attention: decode rows need R % 8 == 0 (16-byte latent rows), got {r}")
    if pv_shared(chunk) > PV_SHARED_MAX:
        raise ValueError(f"attention: chunk {chunk} needs {pv_shared(chunk)} bytes of shared memory on decode rows")
    gs, gp = split_grids(t, h, r, w, chunk)
    if max(gs[1], gs[2], gp[2]) > 65535:
        raise ValueError(f"attention: grids {gs} / {gp} exceed the 65,535 limit of grid.y / grid.z")
    c = gp[1]
    rsl = -(-r // PRB)
    s = k.empty((t, h, w), np.float32)               # scratch: scores
    cm = k.empty((t, h, gs[1]), np.float32)          # key tile max
    ps = k.empty((t, rsl, h, c), np.float32)         # chunk sum of P, per column slice
    pv = k.empty((t, h, c, r), np.float32)           # chunk P.V
    done = k.empty((t, gp[2]), np.uint32)            # finished pv blocks per (row, head group, slice), zeroed by scores
    width = i32(table.shape[1])
    k.launch(SRC_SPLIT, "attention_chunk_scores", gs, (256,),
             (qa, store, rows, table, seg, counts, s, cm, done, i32(t), i32(h), i32(r), i32(w), i32(c), f32(scale),
              i32(chunk), width, i32(pt), i32(gp[2])))
    k.launch(SRC_SPLIT, "attention_chunk_pv", gp, (256,),
             (store, rows, table, seg, counts, s, cm, ps, pv, done, out, i32(t), i32(h), i32(r), i32(w), i32(c),
              i32(chunk), width, i32(pt)), shared_mem=pv_shared(chunk))


@op("attention")
def attention(k: Kernels, qa, store, rows, counts, scale, chunk, decode: int = 0):
    """qa: [T, H, R] bf16, store: [N, R] bf16, rows: [T, W] int32 row ids (-1 padded), counts: [T] int32
    -> [T, H, R] bf16. Online softmax over `chunk`-key chunks merged in list order; rows [0, decode) are
    decode/verify rows (attention_split.cu)."""
    return _attend(k, "attention", qa, store, rows, None, None, 0, counts, scale, chunk, decode)


@op("attention_paged")
def attention_paged(k: Kernels, qa, store, tokens, table, seg, page_tokens, counts, scale, chunk, decode: int = 0):
    """attention over tokens [T, W] int32 positions (-1 padded), row t's mapped through its segment's page table
    (table [S, width] int32 one row per segment, seg [T] int32 row t's segment: the call's row map):
    row = table[seg[t], p // page_tokens] * page_tokens + p % page_tokens, inside the kernels (no row array per
    layer). Prompt rows [decode, T) on the tensor core (attention_tc.cu: positions strictly ascending, R a multiple
    of 64). seg in [0, S) is the caller's contract (checking it on the device would cost a sync)."""
    pt = int(page_tokens)
    if pt < 1:
        raise ValueError(f"attention_paged: page_tokens must be positive, got {pt}")
    return _attend(k, "attention_paged", qa, store, tokens, table, seg, pt, counts, scale, chunk, decode)


def _attend(k: Kernels, name: str, qa, store, rows, table, seg, pt: int, counts, scale, chunk, decode: int):
    qa = _arg(k, name, "qa", qa, (None, None, None), k.bf16)
    t, h, r = qa.shape
    store = check(name, "store", store, (None, r), k.bf16)   # never copied: the KV rows
    rows = _arg(k, name, "rows" if table is None else "tokens", rows, (t, None), np.int32)
    counts = _arg(k, name, "counts", counts, (t,), np.int32)
    if table is not None:
        table = _arg(k, name, "table", table, (None, None), np.int32)                       # [S, width] int32
        seg = _arg(k, name, "seg", seg, (t,), np.int32)                                     # [T] int32
        if t and 0 in table.shape:
            raise ValueError(f"{name}: an empty page table {table.shape} for {t} rows")

    def maps(lo: int, hi: int):
        """(table, seg) of a launch on rows [lo, hi); pt == 0: the launch's own rows and counts stand in (never
        read, and the emulator accepts only whole overlaps)"""
        return (rows[lo:hi], counts[lo:hi]) if table is None else (table, seg[lo:hi])
    chunk = int(chunk)
    if chunk < 1:
        raise ValueError(f"{name}: chunk must be positive, got {chunk}")
    threads = 128 if r <= 8 * 128 else 256
    if r > 8 * threads:
        raise ValueError(f"{name}: R <= {8 * threads} supported, got {r}")
    if h > 65535:
        raise ValueError(f"{name}: at most 65,535 heads (grid.y), got {h}")
    d = decode_rows(name, decode, t)
    out = k.empty((t, h, r), k.bf16)
    if t and h:
        if d:
            _split(k, qa[:d], store, rows[:d], *maps(0, d), pt, counts[:d], out[:d], scale, chunk)
        if d < t and table is not None:      # prompt rows: the tensor core on the absolute position grid
            ops_attention_tc.attention_tc(k, qa[d:], store, rows[d:], table, seg[d:], pt, counts[d:], scale,
                                          out=out[d:])
        elif d < t:
            tab, sg = maps(d, t)
            k.launch(SRC, "attention", (t - d, h), (threads,),
                     (qa[d:], store, rows[d:], tab, sg, counts[d:], out[d:], i32(t - d), i32(h), i32(r),
                      i32(rows.shape[1]), f32(scale), i32(chunk), i32(tab.shape[1]), i32(pt)),
                     shared_mem=(2 * chunk + 1) * 4)
    return out
