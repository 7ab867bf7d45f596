"""Contract cases of cuda_src/attention.cu (op attention).

Token lists are mapped to store rows through a random page table (pages of 16 rows); every store row no list
points at is NaN, and list entries past a row's count are -1, so a kernel that reads outside the lists
poisons its output. Lists are dense (positions 0..q) below the sparse limit and picked pools + tail tokens
above it, as the model builds them.

Controls: `attention[..]` with a wrong page mapping (16 list entries read another page's rows);
`attention.chunks[..]` with the chunks of each list merged in reverse order (same keys, other merge order).
`attention_split[..]`: the leading `decode` rows as decode/verify rows (cuda_src/attention_split.cu: heads
sharing each latent row, chunks in parallel, merged in list order), the same controls.
`attention_paged[..]`: the lists as positions, a call of segments (table [S, width] one page table per segment,
seg [T] each row's), its prompt rows on the tensor core (cuda_src/attention_tc.cu, R a multiple of 64); controls
as below, `.seg[..]` each row reading the next segment's table (planted) and `.tc[..]` the prompt rows' Q fragments
loaded transposed (planted; attention_tc's own cases hold its finer controls).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import lanes
from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.numpy_ops import NumpyOps, expand_pools
from cupyglm.contract.registry import Case, case
from cupyglm.kernels import ops_attention

REF = NumpyOps()
PAGE = 16
BF16_ULP = 1 << 16
# The kernels compute exp with exp_f32 (cuda_src/exp_f32.cuh: +, *, rint and 2**k only, the same bits on GPU,
# emulator and NumPy). While the NumPy reference still uses np.exp (SIMD, <= 2 ULP, rounds differently) the
# tolerances below hold; once lanes.exp_f32 (the NumPy twin) is the reference's exp they are all 0.
EXACT_EXP = hasattr(lanes, "exp_f32")

# Outputs near 0 (heads whose values cancel) can move by many of their own ULPs when one P flips: over 40 other
# seeds up to 20 bf16 ULPs were seen, while the contract's fixed inputs move <= 1. 4 bf16 ULPs keeps the
# chunk-order control red (it moves outputs by 7-15 bf16 ULPs); with EXACT_EXP the tolerance is 0.
ULPS = 0 if EXACT_EXP else 4 * BF16_ULP
WHY = ("P = bf16(exp(s - m)) and alpha = exp(m - m'): exp_f32 vs NumPy exp (<= 2 fp32 ULPs) flips a bf16 rounding "
       "of P now and then, which moves outputs near 0 by a few of their ULPs (measured <= 1 bf16 ULP here)")


def _lists(rng, positions, npools, kpool=4):
    """Per row: dense tokens 0..q, or npools random visible pools (ascending) expanded + the tail."""
    out = []
    for q in positions:
        visible = (q + 1) // kpool
        if visible <= npools:
            out.append(np.arange(q + 1, dtype=np.int32))
        else:
            pools = np.sort(rng.choice(visible, npools, replace=False))
            out.append(expand_pools(pools, q, kpool))
    return out


def _inputs(rng, positions, h, r, npools, qstd):
    t = len(positions)
    width = npools * 4 + 3
    lists = _lists(rng, positions, npools)
    length = max(positions) + 1
    pages = (length + PAGE - 1) // PAGE
    table = rng.permutation(pages + 3)[:pages]                      # page -> physical page (3 spare pages)
    store = np.full(((pages + 3) * PAGE, r), np.nan, dtype=BF16)   # [rows, R] bf16 latent rows
    rows = np.full((t, width), -1, dtype=np.int32)
    counts = np.zeros(t, dtype=np.int32)
    for i, toks in enumerate(lists):
        phys = (table[toks // PAGE] * PAGE + toks % PAGE).astype(np.int32)
        rows[i, :phys.size] = phys
        counts[i] = phys.size
    used = np.unique(rows[rows >= 0])
    store[used] = bf16(rng.standard_normal((used.size, r)).astype(np.float32))
    qa = bf16(rng.standard_normal((t, h, r)).astype(np.float32) * np.float32(qstd))
    return {"qa": qa, "store": store, "rows": rows, "counts": counts}


SPLIT = ("attention_chunk_scores", "attention_chunk_pv")


def _attention(label: str, positions, h: int, r: int, chunk: int, npools: int, qstd: float = 1.0,
               decode: int = 0) -> None:
    positions = list(positions)
    scale = r ** -0.5 if r < 256 else 256 ** -0.5

    def make(rng):
        return _inputs(rng, positions, h, r, npools, qstd)

    def run(k, d):
        return {"o": ops_attention.attention(k, d["qa"], d["store"], d["rows"], d["counts"], scale, chunk,
                                             decode=decode)}

    def replay(d):
        return {"o": REF.attention(d["qa"], d["store"], d["rows"], d["counts"], scale, chunk, decode=decode)}

    def ctl_page(k, d):                                # a wrong page: list entries 0..15 read entries 16..31's rows
        rows = d["rows"].copy()                        # (lists shorter than 32: entry 1 reads entry 0's row)
        host_counts = np.asarray(d["counts"].get() if hasattr(d["counts"], "get") else d["counts"])
        for i, c in enumerate(host_counts.tolist()):
            if c >= 2 * PAGE:
                rows[i, :PAGE] = d["rows"][i, PAGE:2 * PAGE]
            elif c > 1:
                rows[i, 1] = d["rows"][i, 0]
        return {"o": ops_attention.attention(k, d["qa"], d["store"], rows, d["counts"], scale, chunk, decode=decode)}

    def ctl_chunks(k, d):                              # the chunks of every list merged last to first
        rows = d["rows"].copy()
        host_counts = np.asarray(d["counts"].get() if hasattr(d["counts"], "get") else d["counts"])
        for i, c in enumerate(host_counts.tolist()):
            starts = list(range(0, c, chunk))
            order = [j for s in reversed(starts) for j in range(s, min(s + chunk, c))]
            rows[i, :c] = d["rows"][i, order]
        return {"o": ops_attention.attention(k, d["qa"], d["store"], rows, d["counts"], scale, chunk, decode=decode)}

    name, kernels = "attention", ("attention",)
    if decode:
        name, kernels = "attention_split", SPLIT + (("attention",) if decode < len(positions) else ())
    case(Case(f"{name}[{label}]", kernels, make, run, replay, ctl_page, ULPS, WHY))
    if any(p + 1 > chunk for p in positions):
        case(Case(f"{name}.chunks[{label}]", kernels, make, run, replay, ctl_chunks, ULPS, WHY))


# tiny model: 4 heads, latent 64, chunks of 32, 8 pools of 4 (sparse from position 35), width 35
#           label       positions              H    R  chunk npools
_attention("decode",    [100],                  4,  64,  32,  8, 2.0)
_attention("verify",    range(30, 46),          4,  64,  32,  8, 2.0)
_attention("prompt37",  range(37),              4,  64,  32,  8, 2.0)
_attention("odd",       [0, 5, 77, 200],        3,  72,  20,  8, 2.0)   # R % 16 = 8, chunk 20
# full model: latent 512, chunks of 512, 512 pools (sparse from 2051), two of its heads
_attention("full",      [2050, 2051, 3000],     2, 512, 512, 512, 6.0)
# decode/verify rows (attention_split.cu): one token, MTP verify rows, a mixed call, heads not a multiple of 4
_attention("decode",    [100],                  4,  64,  16,  8, 2.0, decode=1)     # 3 chunks (16, 16, 3)
_attention("verify",    range(30, 46),          4,  64,  32,  8, 2.0, decode=16)
_attention("mixed",     [0, 5, 77, 200],        3,  72,  20,  8, 2.0, decode=2)     # 2 decode rows, 2 prompt rows
_attention("heads6",    [40, 90],               6,  64,  16,  8, 2.0, decode=2)     # 2 head groups, one partial
_attention("full",      [2050, 3000],           2, 512, 512, 512, 6.0, decode=2)
# two scores head groups (16 + 4), three pv head groups (8, 8, 4), column slices 64 + 64 + 8 (a scores slice of
# 128 + a padded one of 8), key tiles 32 + 8 a chunk with tiles past the count
_attention("heads20",   [60, 150],             20, 136,  40,  32, 2.0, decode=2)


# ---- attention_paged: the lists as positions, each row mapped through its segment's page table in the kernels ----
# Controls: the page of a row's first token moved (table), the chunks merged last to first, (decode rows of several
# chunks) the variant ATT_PLANT_FIRST_DONE, whose first finished pv block merges instead of the last, and (calls of
# several segments) the variant ATT_PLANT_NEXT_SEG, whose rows read the next segment's table.
def _paged_inputs(rng, positions, seqs, h, r, npools, qstd):
    """Segment j holds seqs[j] consecutive rows of the call, one sequence: a page table of distinct physical
    pages (no page in two segments), zero padded to the widest as CallMaps pads it; unused store rows NaN."""
    t, ns = len(positions), len(seqs)
    seg = np.repeat(np.arange(ns, dtype=np.int32), seqs)                     # [T] int32 row t's segment
    npages = [(max(positions[i] for i in np.flatnonzero(seg == j)) + PAGE) // PAGE for j in range(ns)]
    perm = rng.permutation(sum(npages) + 3).astype(np.int32)
    table = np.zeros((ns, max(npages)), dtype=np.int32)                      # [S, width] int32
    for j, at in enumerate(np.cumsum([0] + npages[:-1])):
        table[j, :npages[j]] = perm[at:at + npages[j]]
    width = npools * 4 + 3
    tokens = np.full((t, width), -1, dtype=np.int32)
    counts = np.zeros(t, dtype=np.int32)
    for i, toks in enumerate(_lists(rng, positions, npools)):
        tokens[i, :toks.size] = toks
        counts[i] = toks.size
    store = np.full(((sum(npages) + 3) * PAGE, r), np.nan, dtype=BF16)
    safe = np.maximum(tokens, 0)
    rows = table[seg[:, None], safe // PAGE] * PAGE + safe % PAGE
    used = np.unique(rows[tokens >= 0])
    store[used] = bf16(rng.standard_normal((used.size, r)).astype(np.float32))
    qa = bf16(rng.standard_normal((t, h, r)).astype(np.float32) * np.float32(qstd))
    return {"qa": qa, "store": store, "tokens": tokens, "table": table, "seg": seg, "counts": counts}


def _host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _paged(label: str, positions, seqs: tuple[int, ...], h: int, r: int, chunk: int, npools: int,
           qstd: float = 1.0, decode: int = 0) -> None:
    positions = list(positions)
    if sum(seqs) != len(positions):
        raise ValueError(f"attention_paged[{label}]: segments {seqs} do not cover {len(positions)} rows")
    scale = r ** -0.5 if r < 256 else 256 ** -0.5

    def make(rng):
        return _paged_inputs(rng, positions, seqs, h, r, npools, qstd)

    def launch(k, d, tokens, table):
        return {"o": ops_attention.attention_paged(k, d["qa"], d["store"], tokens, table, d["seg"], PAGE,
                                                   d["counts"], scale, chunk, decode=decode)}

    def replay(d):
        return {"o": REF.attention_paged(d["qa"], d["store"], d["tokens"], d["table"], d["seg"], PAGE, d["counts"],
                                         scale, chunk, decode=decode)}

    def ctl_table(k, d):                               # the page of the last row's first token moved on
        table = _host(d["table"]).copy()
        p, s = int(_host(d["tokens"])[-1, 0]) // PAGE, int(_host(d["seg"])[-1])
        table[s, p] = (int(table[s, p]) + 1) % (_host(d["store"]).shape[0] // PAGE)
        return launch(k, d, d["tokens"], k.xp.asarray(table))

    def ctl_chunks(k, d):                              # the chunks of every list merged last to first
        tokens = _host(d["tokens"]).copy()
        for i, c in enumerate(_host(d["counts"]).tolist()):
            starts = list(range(0, c, chunk))
            order = [j for s in reversed(starts) for j in range(s, min(s + chunk, c))]
            tokens[i, :c] = _host(d["tokens"])[i, order]
        return launch(k, d, k.xp.asarray(tokens), d["table"])

    def ctl_first_done(k, d):                          # planted: the first pv block to finish merges, not the last
        return launch(k.variant("ATT_PLANT_FIRST_DONE"), d, d["tokens"], d["table"])

    def ctl_next_seg(k, d):                            # planted: every row reads the next segment's table
        return launch(k.variant("ATT_PLANT_NEXT_SEG"), d, d["tokens"], d["table"])

    def ctl_fragment(k, d):                            # planted: the prompt rows' Q fragments transposed
        return launch(k.variant("TRANSPOSED_FRAGMENT"), d, d["tokens"], d["table"])

    kernels = (SPLIT if decode else ()) + (("attention_tc",) if decode < len(positions) else ())
    run = (lambda k, d: launch(k, d, d["tokens"], d["table"]))
    if decode and any(p + 1 > chunk for p in positions[:decode]):
        case(Case(f"attention_paged.last_block[{label}]", kernels, make, run, replay, ctl_first_done, ULPS, WHY))
    case(Case(f"attention_paged[{label}]", kernels, make, run, replay, ctl_table, ULPS, WHY))
    if any(p + 1 > chunk for p in positions[:decode]):      # the prompt rows' order does not follow the chunks
        case(Case(f"attention_paged.chunks[{label}]", kernels, make, run, replay, ctl_chunks, ULPS, WHY))
    if decode < len(positions):
        case(Case(f"attention_paged.tc[{label}]", kernels, make, run, replay, ctl_fragment, ULPS, WHY))
    seg = np.repeat(np.arange(len(seqs)), seqs)
    if len(set(seg[:decode])) > 1 or len(set(seg[decode:])) > 1:    # a row whose next segment is in its launch
        case(Case(f"attention_paged.seg[{label}]", kernels, make, run, replay, ctl_next_seg, ULPS, WHY))


#        label      positions                                segments      H    R  chunk npools      decode rows
_paged("decode",    [100],                                   (1,),         4,  64,  16,  8, 2.0, decode=1)
_paged("verify",    range(30, 46),                           (4, 4, 4, 4), 4,  64,  32,  8, 2.0, decode=16)
_paged("mixed",     [0, 5, 77, 200],                         (1, 1, 2),    3,  64,  20,  8, 2.0, decode=2)
_paged("prompt40",  range(40),                               (40,),        4,  64,  32,  8, 2.0)   # one table row
_paged("prompts",   list(range(10)) + list(range(30, 42)),   (10, 12),     4,  64,  16,  8, 2.0)   # two chunks
_paged("full",      [2050, 3000],                            (1, 1),       2, 512, 512, 512, 6.0, decode=2)
_paged("sparse",    [2050, 3000],                            (1, 1),       2, 512, 512, 512, 6.0)   # prompt rows
