"""The canonical order of a decode/verify row's GEMV over quantised weights (DESIGN §3b): the tensor core's, as
backend/tc_order.py's for bf16, with each weight first made an exact bf16 (cuda_src/gemv_q_tc.cuh):
  nvfp4  w = e2m1(q) * e4m3(group scale), exact in bf16 (<= 6 significant bits, exponent 2^-10 .. 2688); the
         slices' sum is multiplied by the tensor scale_2 once per output (fp32).
  fp8    w = e4m3(v), exact in bf16; the chain restarts at every bk-block of k (and every slice), each chain's
         fp32 result is multiplied by its block's scale_inv and added in k order (the slice's start: its first).
A slice is SLICE_K of k (the last shorter), slices added in order. Inside a slice, BLOCK_C[fmt] x 32 k make a
lane's one load (16 bytes of nvfp4, 8 of fp8); step s of a block at k0 takes k0 + 8 c t + 4 s + i (t = 0..3,
i = 0..3, s = 0..2c-1), the model's k position p of the step holding t = (p % 8) // 2, i = p % 2 + 2 (p // 8).
A block's k past the slice is zero in both operands (zero products take no part). Depends on K alone.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.qweight import E2M1, E4M3, NVFP4_GROUP, QWeight
from cupyglm.backend.tc_order import SLICE_K
from cupyglm.backend.tensor_core import DEFAULT_ARCH, mma_chain

BLOCK_C = {"fp8": 1, "nvfp4": 4}     # 32-k units a lane's load holds
# e4m3 codes as the kernel makes them bf16 (bits placed, times 2^120): the NaN codes, never quantised, as +-480
E4M3_TC = np.where(np.isnan(E4M3), np.copysign(np.float32(480.0), E4M3), E4M3).astype(np.float32)


def block_perm(c: int) -> np.ndarray:
    """The model's k order over one 32c block: position 16 s + p holds k = 8 c t + 4 s + i (module doc)."""
    p = np.arange(16)
    t, i = (p % 8) // 2, p % 2 + 2 * (p // 8)
    return np.concatenate([8 * c * t + 4 * s + i for s in range(2 * c)])


def _ordered(a: np.ndarray, c: int) -> np.ndarray:
    """[R, K] bf16 -> [R, Kc] zero-padded to a multiple of 32c, every block in the model's order."""
    r, k = a.shape
    blk = 32 * c
    kc = -(-k // blk) * blk
    p = np.zeros((r, kc), dtype=BF16)
    p[:, :k] = a
    return p.reshape(r, -1, blk)[:, :, block_perm(c)].reshape(r, kc)


def _chain(x: np.ndarray, w: np.ndarray, c: int, arch: str) -> np.ndarray:
    return mma_chain(_ordered(x, c), _ordered(w, c).T, arch=arch)


def nvfp4_bf16(q: QWeight) -> np.ndarray:
    """[N, K] bf16: e2m1 x its group's e4m3 scale (exact; scale_2 not applied)."""
    values, scale = np.asarray(q.values), np.asarray(q.scale)
    n, k = q.shape[-2:]
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2] = values & 15
    codes[:, 1::2] = values >> 4
    return bf16(E2M1[codes] * np.repeat(E4M3_TC[scale], NVFP4_GROUP, axis=-1))


def fp8_block(q: QWeight) -> int:
    """FP8's bk, refused unless whole 32-k blocks (the chain restarts at a block's first k)."""
    bk = int(q.block[1])
    if bk % 32:
        raise ValueError(f"quant_rows: FP8 block bk={bk} is not a multiple of 32 (the decode GEMV's k unit)")
    return bk


def _fp8_slice(x, wb, scale, bn: int, bk: int, k0: int, k1: int, arch: str) -> np.ndarray:
    """One slice's fp32 result: its bk-block chains, each scaled by its column's block scale, added in order."""
    cols = np.arange(wb.shape[0]) // bn
    y, a = None, k0
    while a < k1:                                   # a slice may start inside a block (bk not dividing SLICE_K)
        b = min(k1, (a // bk + 1) * bk)
        part = (_chain(x[:, a:b], wb[:, a:b], 1, arch) * scale[cols, a // bk][None, :]).astype(np.float32)
        y = part if y is None else (y + part).astype(np.float32)
        a = b
    return y


def quant_rows(x, q: QWeight, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """y[m, n] = sum_k x[m, k] * w[n, k] of a 2-D QWeight in the quantised decode order -> [M, N] fp32."""
    x = np.asarray(x)
    x = x if x.dtype == BF16 else bf16(x)
    if not isinstance(q, QWeight) or q.ndim != 2 or x.ndim != 2 or x.shape[1] != q.shape[1]:
        raise ValueError(f"quant_rows: x {x.shape} and w must be [M, K] and a [N, K] QWeight")
    m, k = x.shape
    n = q.shape[0]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.float32)
    if q.fmt == "nvfp4":
        y = None
        wb = nvfp4_bf16(q)
        for k0 in range(0, k, SLICE_K):
            part = _chain(x[:, k0:k0 + SLICE_K], wb[:, k0:k0 + SLICE_K], BLOCK_C["nvfp4"], arch)
            y = part if y is None else (y + part).astype(np.float32)
        return (y * np.asarray(q.scale2, dtype=np.float32)[0]).astype(np.float32)
    bk = fp8_block(q)
    wb = bf16(E4M3_TC[np.asarray(q.values)])
    scale = np.asarray(q.scale, dtype=np.float32)
    y = None
    for k0 in range(0, k, SLICE_K):
        part = _fp8_slice(x, wb, scale, int(q.block[0]), bk, k0, min(k, k0 + SLICE_K), arch)
        y = part if y is None else (y + part).astype(np.float32)
    return y

