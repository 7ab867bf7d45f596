"""Sampling launcher (cuda_src/sample.cu): one token per row of logits, NumpyOps.sample's signature."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32, op

SRC = "sample.cu"
THREADS = 1024       # one block per row (the sort's passes spread over the whole block); a power of two, <= 1024
BINS = 256           # the sorted path's radix digits (SMP_BINS in cuda_src/sample_tile.cuh)


def _arg(k: Kernels, name: str, a, shape, dtype):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check("sample_rows", name, k.xp.ascontiguousarray(a), shape, dtype)


def _scratch(k: Kernels, r: int, v: int):
    """The sorted path's scratch: its two key buffers and its digit counts per (digit, thread)."""
    return (k.empty((r, 2, v), np.uint64),            # [R, 2, V] u64: (ordered value bits, id) keys
            k.empty((r, BINS, THREADS), np.uint32))   # [R, 256, THREADS] u32: counts, then first slots


@op("sample")
def sample(k: Kernels, logits, temperature, top_k, top_p, min_p, seed, position):
    """logits [R, V] f32, temperature [R] f32 (< 1e-5: greedy), top_k [R] i32, top_p [R] f32, min_p [R] f32,
    seed [R] u64, position [R] i32 -> tokens [R] int32 (-1: the row holds NaN)."""
    logits = _arg(k, "logits", logits, (None, None), np.float32)
    r, v = logits.shape
    if not 1 <= v < 2**30:
        raise ValueError(f"sample_rows: the vocabulary must hold 1..2**30-1 ids, got V={v}")
    temperature = _arg(k, "temperature", temperature, (r,), np.float32)
    top_k = _arg(k, "top_k", top_k, (r,), np.int32)
    top_p = _arg(k, "top_p", top_p, (r,), np.float32)
    min_p = _arg(k, "min_p", min_p, (r,), np.float32)
    seed = _arg(k, "seed", seed, (r,), np.uint64)
    position = _arg(k, "position", position, (r,), np.int32)
    tokens = k.empty((r,), np.int32)
    if r:
        keys, counts = _scratch(k, r, v)
        probs = k.empty((r, v), np.float32)           # scratch: e, then p, then the draw's prefix q
        k.launch(SRC, "sample_rows", (r,), (THREADS,),
                 (logits, temperature, top_k, top_p, min_p, seed, position, keys, counts, probs, tokens, i32(v)))
    return tokens


STATS = ("s_visits", "c_visits", "min_p_visits", "q_visits", "select_passes", "tails", "why", "fell_back",
         "S", "q", "tail_passes", "sort_passes", "sort_s_visits", "sort_c_visits", "sort_q_visits", "sort_windows")


def sample_stats(k: Kernels, logits, temperature, top_k, top_p, min_p, seed, position) -> dict:
    """The tile path's counters per sampled row (the kernel compiled with -DSAMPLE_STATS, V >= 16): ids each
    sequential sum visited, radix-select passes, exact tails run (1 S, 2 q), why a row was left undecided
    (1 S tail, 2 top-p past the tile, 4 min-p, 8 q tail, 16 the draw past the tile), whether it fell back to
    the sorted path, the S and q[n' - 1] found (by the sorted path on the rows that fell back), the tails'
    passes over the row; then the sorted path's radix passes, the ids its S, c and q scans reached and their
    windows (-1 on rows the tile decided) -> {name: [R] array}. Rows the tile path does not run (greedy, NaN,
    top_k between 2048 and V) hold -1 tile counters."""
    logits = _arg(k, "logits", logits, (None, None), np.float32)
    r, v = logits.shape
    if v < len(STATS):
        raise ValueError(f"sample_stats: the counters need V >= {len(STATS)}, got V={v}")
    args = [_arg(k, n, a, (r,), dt) for n, a, dt in (
        ("temperature", temperature, np.float32), ("top_k", top_k, np.int32), ("top_p", top_p, np.float32),
        ("min_p", min_p, np.float32), ("seed", seed, np.uint64), ("position", position, np.int32))]
    probs = k.empty((r, v), np.float32)
    k.variant("SAMPLE_STATS").launch(SRC, "sample_rows", (r,), (THREADS,),
                                     (logits, *args, *_scratch(k, r, v), probs, k.empty((r,), np.int32), i32(v)))
    out = k.xp.asnumpy(probs[:, :len(STATS)]) if hasattr(k.xp, "asnumpy") else np.asarray(probs[:, :len(STATS)])
    return {n: (out[:, i] if n in ("S", "q") else np.where(np.isnan(out[:, i]), -1, out[:, i]).astype(np.int64))
            for i, n in enumerate(STATS)}
