"""The canonical order of a decode/verify row's bf16 GEMV (DESIGN §3b): the tensor core's, fixed by K alone.

K is cut into slices of SLICE_K (the last one shorter); a slice is a chain of mma.m16n8k16 steps from +0.0
accumulators, each step's D the next step's C (tensor_core.py's model); the slices' fp32 results are added in
slice order in fp32 (the first slice's result is the start). Inside a slice, 32 k values make two steps: step s
of the 32 at k0 takes k0 + 8t + 4s + i (t = 0..3, i = 0..3), so each lane of cuda_src/gemv_tc.cuh feeds both
steps from one 16-byte load (8 consecutive k of one row); the model's k position p of the step holds
t = (p % 8) // 2, i = p % 2 + 2 (p // 8), the A/B fragment layout of mma.cuh. A slice's K is padded with zeros to
a multiple of 32 (zero products take no part). Each output element depends on its own row and column only, so a
row's bits never depend on how many rows share the call.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.tensor_core import DEFAULT_ARCH, mma_chain

SLICE_K = 512
BLOCK_K = 32            # the k of one 16-byte load per lane: two mma steps


def _block_perm() -> np.ndarray:
    """The model's k order over one 32-block: position 16 s + p holds k = 8t + 4s + i (module doc)."""
    p = np.arange(16)
    t, i = (p % 8) // 2, p % 2 + 2 * (p // 8)
    return np.concatenate([8 * t + 4 * s + i for s in (0, 1)])


_PERM = _block_perm()


def _as_bf16(a) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == BF16 else bf16(a)


def _ordered(a: np.ndarray) -> np.ndarray:
    """[R, K] bf16 -> [R, K32] with K zero-padded to a multiple of 32 and every 32-block in the model's order."""
    r, k = a.shape
    k32 = -(-k // BLOCK_K) * BLOCK_K
    p = np.zeros((r, k32), dtype=BF16)
    p[:, :k] = a
    return p.reshape(r, -1, BLOCK_K)[:, :, _PERM].reshape(r, k32)


def tc_rows(x, w, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """y[m, n] = sum_k x[m, k] * w[n, k] in the decode order: x [M, K], w [N, K] bf16 -> [M, N] fp32."""
    x, w = _as_bf16(x), _as_bf16(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"tc_rows: x {x.shape} and w {w.shape} must be [M, K] and [N, K]")
    m, k = x.shape
    n = w.shape[0]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.float32)
    y = None
    for k0 in range(0, k, SLICE_K):
        k1 = min(k, k0 + SLICE_K)
        part = mma_chain(_ordered(x[:, k0:k1]), _ordered(w[:, k0:k1]).T, arch=arch)
        y = part if y is None else (y + part).astype(np.float32)
    return y


def tc_rows_batched(x, w, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """Per-head tc_rows: x [H, M, K], w [H, N, K] -> [H, M, N] fp32."""
    if np.ndim(x) != 3 or np.ndim(w) != 3 or x.shape[0] != w.shape[0]:
        raise ValueError(f"tc_rows_batched: x {np.shape(x)} and w {np.shape(w)} must be [H, M, K] and [H, N, K]")
    return np.stack([tc_rows(x[h], w[h], arch) for h in range(x.shape[0])]).reshape(
        x.shape[0], x.shape[1], w.shape[1])
