"""The main reduction order of cupyglm ("lane-16"), in NumPy: every sum over a model dimension uses it but the
weight GEMMs of every row (tc_order.py and tc_quant.py, the tensor core's order).

A sum over K terms puts term k in lane k % 16; each lane adds its terms in increasing k from +0.0; the 16
lanes then fold as a butterfly: lane i += lane i+8, then +4, +2, +1. The order depends only on K, never on
how many rows share the call, so every result row is bit-identical whatever batch it sits in. A CUDA kernel
gets the same order from 16 threads each summing a strided lane, then __shfl_down_sync by 8, 4, 2, 1.
Products of two bf16 values are exact in fp32, so a GEMM of bf16 inputs is fixed by this order alone.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

LANES = 16
BF16 = np.dtype(ml_dtypes.bfloat16)
# How each backend stores a bf16 value: numpy arrays of ml_dtypes.bfloat16; cupy (no bf16 dtype) uint16 arrays
# holding the bit patterns, read and written as __nv_bfloat16 by the kernels.
BF16_BITS = np.dtype(np.uint16)


def bf16(x) -> np.ndarray:
    """Round float32 to bf16 (nearest even; NaN stays NaN): an ml_dtypes.bfloat16 array (the numpy storage)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def f32(x) -> np.ndarray:
    """The float32 values of an array (bf16 widened exactly; float32 as is, no copy)."""
    return np.asarray(x, dtype=np.float32)


def to_bits(x) -> np.ndarray:
    """A numpy bf16 array as the uint16 bit patterns the cuda backend stores (a view, no rounding)."""
    x = np.ascontiguousarray(x)
    if x.dtype != BF16:
        raise ValueError(f"to_bits: expects a bfloat16 array, got {x.dtype}")
    return x.view(np.uint16)


def from_bits(x) -> np.ndarray:
    """uint16 bf16 bit patterns (the cuda storage, on the host) as a numpy bf16 array (a view)."""
    x = np.ascontiguousarray(x)
    if x.dtype != BF16_BITS:
        raise ValueError(f"from_bits: expects a uint16 array, got {x.dtype}")
    return x.view(BF16)


def stored_weight(array) -> np.ndarray:
    """A tensor in its stored dtype: bf16 as is, fp32 (A_log, dt_bias, hc base/scale, the router's correction
    bias are stored F32) as is; other floats only when every value is a bf16 value (else ValueError)."""
    a = np.asarray(array)
    if a.dtype == BF16 or a.dtype == np.float32:
        return a
    if a.dtype.kind != "f":
        raise ValueError(f"weight: expects a bf16 (or float holding bf16 values) tensor, got {a.dtype}")
    b = a.astype(BF16)
    if not np.array_equal(b.astype(a.dtype), a, equal_nan=True):
        raise ValueError(f"weight: a {a.dtype} tensor whose values are not all bf16 values; weights are stored "
                         "in bf16 and are never rounded on load")
    return b


GEMM_TILE = 8192            # outputs per gemm tile: its [tile, 16] fp32 partials stay in cache
OUTS = ("f32", "bf16")      # the output choices of gemm, gemm_heads, gemm_grouped and sigmoid


def out_kind(op: str, out: str) -> str:
    """The output choice of an op that writes fp32 or rounds to bf16 in its epilogue; refused by name."""
    if out not in OUTS:
        raise ValueError(f"{op}: out must be one of {OUTS}, got {out!r}")
    return out


def _fold(acc: np.ndarray) -> np.ndarray:
    """[..., 16] lanes -> [...] by the butterfly 8, 4, 2, 1."""
    width = LANES
    while width > 1:
        width //= 2
        acc = acc[..., :width] + acc[..., width:2 * width]
    return acc[..., 0]


def _pad_lanes(x: np.ndarray) -> np.ndarray:
    k = x.shape[-1]
    if k % LANES == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 1) + [(0, LANES - k % LANES)]
    return np.pad(x, pad)


def lane_sum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis in lane-16 order. x: [..., K] float32 or bf16 -> [...] float32."""
    x = _pad_lanes(np.asarray(x, dtype=np.float32))
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // LANES, LANES))
    acc = np.zeros(x.shape[:-1] + (LANES,), dtype=np.float32)
    for j in range(blocks.shape[-2]):
        acc += blocks[..., j, :]
    return _fold(acc)


def gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[m, n] = sum_k x[m, k] * w[n, k] in lane-16 order, fp32.

    x: [M, K] bf16, w: [N, K] bf16 (float32 arrays holding bf16 values too) -> [M, N] float32.
    """
    x, w = f32(x), f32(w)
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"gemm: x has K={k} but w has K={k2}")
    xb = _pad_lanes(x).reshape(m, -1, LANES)          # [M, K/16, 16]
    wb = _pad_lanes(w).reshape(n, -1, LANES)          # [N, K/16, 16]
    out = np.empty((m, n), dtype=np.float32)
    tn = max(1, min(n, GEMM_TILE // LANES))
    tm = max(1, min(m, GEMM_TILE // tn))
    for n0 in range(0, n, tn):                        # tiles only bound the working set: each output's order is fixed
        for m0 in range(0, m, tm):
            out[m0:m0 + tm, n0:n0 + tn] = _gemm_tile(xb[m0:m0 + tm], wb[n0:n0 + tn])
    return out


def _gemm_tile(xb: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """xb [m, K/16, 16], wb [n, K/16, 16] fp32 -> [m, n] fp32: the 16 lanes accumulated over K in order, folded."""
    acc = np.zeros((xb.shape[0], wb.shape[0], LANES), dtype=np.float32)   # [m, n, 16] lane partials
    prod = np.empty_like(acc)
    for j in range(xb.shape[1]):
        np.multiply(xb[:, None, j, :], wb[None, :, j, :], out=prod)
        acc += prod
    return _fold(acc)


def gemm_batched(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-group GEMM: x [G, M, K], w [G, N, K] -> [G, M, N], lane-16 order (heads of attention)."""
    x, w = f32(x), f32(w)
    g, m, k = x.shape
    g2, n, k2 = w.shape
    if (g, k) != (g2, k2):
        raise ValueError(f"gemm_batched: x {x.shape} and w {w.shape} disagree")
    xb = _pad_lanes(x).reshape(g, m, -1, LANES)
    wb = _pad_lanes(w).reshape(g, n, -1, LANES)
    acc = np.zeros((g, m, n, LANES), dtype=np.float32)
    for j in range(xb.shape[2]):
        acc += xb[:, :, None, j, :] * wb[:, None, :, j, :]
    return _fold(acc)


# ---- exp: the same bits on every backend (twin of cuda_src/exp_f32.cuh) ------------------------------------

_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.63p-1"))
_LN2_LO = np.float32(float.fromhex("-0x1.bd0106p-13"))
_C = [np.float32(float.fromhex(h)) for h in ("0x1.a01a02p-13", "0x1.6c16c2p-10", "0x1.111112p-7", "0x1.555556p-5",
                                              "0x1.555556p-3", "0x1p-1", "0x1p+0", "0x1p+0")]
_LO, _HI = np.float32(-104.0), np.float32(89.0)


def exp_f32(x):
    """exp in float32 from +, *, rint and exact 2**k scaling: bit-identical to cuda_src/exp_f32.cuh."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    xc = np.where(nan, np.float32(0.0), np.where(x < _LO, _LO, np.where(x > _HI, _HI, x)))
    n = np.rint(xc * _LOG2E)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = np.full_like(r, _C[0])
    for c in _C[1:]:
        p = p * r + c
    ni = n.astype(np.int32)
    h = ni >> 1
    s1 = ((h + 127) << 23).astype(np.int32).view(np.float32)
    s2 = ((ni - h + 127) << 23).astype(np.int32).view(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        y = (p * s1) * s2
    return np.where(nan, x, y).astype(np.float32)


def sigmoid_f32(x: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) / (np.float32(1.0) + exp_f32(-x))).astype(np.float32)


def rsqrt_f32(x: np.ndarray) -> np.ndarray:
    return (np.float32(1.0) / np.sqrt(x)).astype(np.float32)


def seq_sum(parts) -> np.ndarray:
    """Left-to-right sum of a short list of arrays (streams, taps)."""
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def rank_sum(parts):
    """parts [R, ...] (numpy or cupy) -> parts[0] + parts[1] + ... added left to right in parts' dtype: the
    cross-rank sum's one order (cuda_src/rank_sum.cu on cuda); bf16 rounds after every add."""
    acc = parts[0].copy()
    for i in range(1, parts.shape[0]):
        acc += parts[i]
    return acc
