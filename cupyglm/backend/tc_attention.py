"""Prefill attention on the tensor core, exactly: the CPU model of cuda_src/attention_tc.cu, the numpy reference of
the prompt rows of NumpyOps.attention_paged (the DSA layers' prompt rows; decode/verify rows keep its list order).

Absorbed MLA over latent rows (keys equal values). Row t's visible keys are the positions tokens[t, :counts[t]]
(strictly ascending, each one's store row given by rows_of). They fall into key blocks of BLOCK positions aligned
to absolute positions (block b holds positions [b BLOCK, (b + 1) BLOCK)); a block is a BLOCK-slot tile whose
absent slots hold zero keys. The blocks a row touches are merged one by one in position order, for each head:

  S = Q K^T              mma_chain over R in ascending k blocks of 16 from +0.0 (tensor_core.py's model)
  s = S * scale          fp32; absent slots -inf
  m' = max(m, max s)     exact in any order
  P = bf16(exp(s - m'))  exp_f32 (lanes.py); absent slots exactly 0 (zero products take no part)
  alpha = exp(m - m')
  l = chain(P, ones, C = l * alpha)      the sum of P on the tensor core (P against a column of ones)
  o = chain(P, V, C = o * alpha)         P V over the block's slots in ascending position
and out = bf16(o / l). Each output element depends on its own row's queries and its own key positions only, so
a row's bits do not depend on which rows share the call or on where its prompt chunk began.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16, exp_f32, f32
from cupyglm.backend.tensor_core import DEFAULT_ARCH, mma_chain

BLOCK = 64          # key positions a block: the grid every row's blocks sit on
HEADS = 16          # heads a warp's mma tile holds (the kernel's M)
NEG_INF = np.float32(-np.inf)


def dense_tokens(start: int, rows: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Causal position lists of prompt rows at positions start .. start + rows - 1 (each sees 0 .. its own):
    (tokens [rows, width] int32, -1 padded; counts [rows] int32)."""
    width = start + rows if width is None else width
    pos = start + np.arange(rows, dtype=np.int32)
    tokens = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width))
    tokens = np.where(tokens <= pos[:, None], tokens, np.int32(-1)).astype(np.int32)
    return tokens, (pos + 1).astype(np.int32)


def blocks_of(positions: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """A row's ascending positions -> [(block, index of each of its positions)] in position order."""
    p = np.asarray(positions, dtype=np.int64)
    if p.size and (p[0] < 0 or np.any(np.diff(p) <= 0)):
        raise ValueError("attention_tc: a row's positions must be non-negative and strictly ascending")
    out = []
    for b in np.unique(p // BLOCK):
        out.append((int(b), np.nonzero(p // BLOCK == b)[0]))
    return out


def attention_tc(qa, store, tokens, rows_of, counts, scale: float, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """qa [T, H, R] bf16, store [N, R] bf16, tokens [T, W] int32 positions (ascending, -1 padded), rows_of
    [T, W] int32 the store row of each listed position, counts [T] int32 -> [T, H, R] bf16 (module doc)."""
    qa, store = np.asarray(qa), np.asarray(store)
    if qa.dtype != BF16 or store.dtype != BF16:
        raise ValueError(f"attention_tc: qa and store must be bfloat16, got {qa.dtype} and {store.dtype}")
    t, h, r = qa.shape
    if store.ndim != 2 or store.shape[1] != r or r % 16:
        raise ValueError(f"attention_tc: store {store.shape} must be [N, R] with R = {r} a multiple of 16")
    tokens, rows_of = np.asarray(tokens, np.int32), np.asarray(rows_of, np.int32)
    counts = np.asarray(counts, np.int32)
    if tokens.shape != rows_of.shape or tokens.shape[0] != t or counts.shape != (t,):
        raise ValueError(f"attention_tc: tokens {tokens.shape}, rows_of {rows_of.shape}, counts {counts.shape} "
                         f"for {t} rows")
    out = np.empty((t, h, r), dtype=BF16)
    for i in range(t):
        n = int(counts[i])
        out[i] = row_tc(qa[i], store, tokens[i, :n], rows_of[i, :n], np.float32(scale), arch)
    return out


def row_tc(q, store, positions, rows, scale: np.float32, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """One query row's heads q [H, R] bf16 over its positions and their store rows -> [H, R] bf16."""
    h, r = q.shape
    m = np.full(h, NEG_INF, np.float32)
    l = np.zeros((h, 1), np.float32)
    o = np.zeros((h, r), np.float32)
    ones = np.ones((BLOCK, 1), BF16)
    for b, idx in blocks_of(positions):
        slot = np.asarray(positions)[idx] - b * BLOCK
        kv = np.zeros((BLOCK, r), BF16)
        kv[slot] = store[np.asarray(rows)[idx]]
        s = mma_chain(q, np.ascontiguousarray(kv.T), arch=arch) * scale
        present = np.zeros(BLOCK, bool)
        present[slot] = True
        s = np.where(present[None, :], s, NEG_INF).astype(np.float32)
        m_new = np.maximum(m, s.max(axis=1))
        p = np.where(present[None, :], bf16(exp_f32(s - m_new[:, None])), np.zeros((), BF16)).astype(BF16)
        alpha = exp_f32(m - m_new)[:, None]
        l = mma_chain(p, ones, (l * alpha).astype(np.float32), arch=arch)
        o = mma_chain(p, kv, (o * alpha).astype(np.float32), arch=arch)
        m = m_new
    with np.errstate(invalid="ignore", divide="ignore"):
        return bf16(o / l)


def reference_f64(qa, store, tokens, rows_of, counts, scale: float) -> np.ndarray:
    """The same attention in float64 (plain softmax, no rounding): the tolerance oracle."""
    qa, store = f32(qa).astype(np.float64), f32(store).astype(np.float64)
    t, h, r = qa.shape
    out = np.empty((t, h, r))
    for i in range(t):
        kv = store[np.asarray(rows_of)[i, :int(counts[i])]]
        s = qa[i] @ kv.T * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[i] = (p @ kv) / p.sum(axis=1, keepdims=True)
    return out
