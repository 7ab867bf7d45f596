"""Structured output's token mask: a grammar's allowed-token bitmask applied to logits rows, the NumPy definition of
cuda_src/token_mask.cu.

The layout is llguidance's: mask m is int32 words [W = ceil(V / 32)], id v allowed iff bit v % 32 of word v // 32
is set. The op sets every disallowed id of logits row row[m] to -inf (a NaN stays NaN, so a NaN row is still
refused by the sampler); rows no mask names are not touched, so a request without a grammar samples exactly as
it would alone.
"""
from __future__ import annotations

import numpy as np

THREADS = 256            # cuda_src/token_mask.cu TM_THREADS


def words(vocab: int) -> int:
    """int32 words of one row's mask."""
    return (vocab + 31) // 32


def allowed(bits: np.ndarray, vocab: int) -> np.ndarray:
    """bits [M, W] i32 -> [M, vocab] bool, True where the id is allowed."""
    b = np.ascontiguousarray(bits, dtype=np.int32).view(np.uint8).reshape(bits.shape[0], -1)
    return np.unpackbits(b, axis=1, bitorder="little")[:, :vocab].astype(bool)


def mask_rows(logits: np.ndarray, row, bits) -> None:
    """logits [R, V] f32 edited in place; row [M] i32 (distinct rows), bits [M, W] i32."""
    row = np.asarray(row, dtype=np.int64)
    if row.shape[0] == 0:
        return
    x = logits[row]
    off = ~allowed(bits, logits.shape[1]) & ~np.isnan(x)
    x[off] = np.float32(-np.inf)
    logits[row] = x
