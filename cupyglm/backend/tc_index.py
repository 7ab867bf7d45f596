"""The DSA indexer's dots on the tensor core, exactly: the CPU model of cuda_src/index_mma.cuh (index_scores and
index_scores_rows in cuda_src/indexer.cu), one order for every row whatever its role.

For one row, its Hi index heads are the A operand (16-head tiles; heads past Hi are zero rows) and the pooled keys
the B operand (8 pools a tile); each dot qi[t, h] . pk[p] over the index head dimension I is an mma chain from +0.0
over ascending k blocks of 16 (tensor_core.py's model), I padded with zeros to a multiple of 16 (zero products take
no part). Inside a block, the step's k position p holds k = 4 ((p % 8) // 2) + p % 2 + 2 (p // 8): lane (g, t)'s
registers a[0], a[2] of head row g (and b[0], b[1] of pool g) are the 4 consecutive k 4t .. 4t + 3 of one 8-byte
load (mma.cuh's fragment layout; the kernel puts the keys in A and the heads in B, the same bits: the model's
element is symmetric in its operands). The order within a block matters only where a block is split (sm_80's
groups of 8). Each dot depends on its own head and pool only, so the rows of a call can share one chain over T * Hi
rows.
The epilogue (NumpyOps.index_scores) is fp32: times I^-0.5, relu, times the head weight, the head sum in lane-16
order (head h in lane h % 16, lanes folded 8, 4, 2, 1).
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import BF16, bf16
from cupyglm.backend.tensor_core import DEFAULT_ARCH, K_STEP, mma_chain


def _block_perm() -> np.ndarray:
    """The model's k order over one 16-block: position p holds k = 4 ((p % 8) // 2) + p % 2 + 2 (p // 8)."""
    p = np.arange(K_STEP)
    return 4 * ((p % 8) // 2) + p % 2 + 2 * (p // 8)


PERM = _block_perm()


def ordered(a) -> np.ndarray:
    """[R, K] bf16 (or float32 holding bf16 values) -> [R, K16] bf16: K zero-padded to a multiple of 16, every
    16-block in the model's k order."""
    a = np.asarray(a)
    a = a if a.dtype == BF16 else bf16(a)
    r, k = a.shape
    k16 = -(-k // K_STEP) * K_STEP
    p = np.zeros((r, k16), dtype=BF16)
    p[:, :k] = a
    return p.reshape(r, -1, K_STEP)[:, :, PERM].reshape(r, k16)


def index_dots(qi, pk, arch: str = DEFAULT_ARCH) -> np.ndarray:
    """dots[t, h, p] = qi[t, h] . pk[p] as the tensor core's chain: qi [T, Hi, I] bf16, pk [P, I] bf16 (or
    float32 holding bf16 values) -> [T, Hi, P] float32."""
    qi = np.asarray(qi)
    t, h, i = qi.shape
    pk = np.asarray(pk)
    if pk.ndim != 2 or pk.shape[1] != i:
        raise ValueError(f"index_dots: pk {pk.shape} must be [P, {i}]")
    if t * h == 0 or pk.shape[0] == 0 or i == 0:
        return np.zeros((t, h, pk.shape[0]), dtype=np.float32)
    return mma_chain(ordered(qi.reshape(t * h, i)), ordered(pk).T, arch=arch).reshape(t, h, -1)
