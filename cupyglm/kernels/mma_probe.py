"""Launcher of cuda_src/mma_probe.cu: the tensor-core primitive (cuda_src/mma.cuh) alone, D = A @ B + C as a
chain of mma.m16n8k16 over ascending k blocks of 16 (tensor_core.mma_chain on the CPU). Not a model op: the
contract and bench/tc_probe.py call it."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, i32

SRC = "mma_probe.cu"
KERNEL = "mma_probe_chain"


def mma_chain(k: Kernels, a, b, c, ldmatrix: bool = False):
    """a [M, K] bf16, b [K, N] bf16, c [M, N] fp32 -> d [M, N] fp32; M % 16, N % 8 and K % 16 must be 0.
    ldmatrix: A's fragments through shared memory and ldmatrix.x4 instead of straight from global memory."""
    check(KERNEL, "a", a, (None, None), k.bf16)
    m, kk = a.shape
    check(KERNEL, "b", b, (kk, None), k.bf16)
    n = b.shape[1]
    check(KERNEL, "c", c, (m, n), np.float32)
    if m % 16 or n % 8 or kk % 16:
        raise ValueError(f"{KERNEL}: M {m}, N {n}, K {kk} must be multiples of 16, 8 and 16")
    d = k.empty((m, n), np.float32)
    if m and n:
        k.launch(SRC, KERNEL, (n // 8, m // 16), (32,), (a, b, c, d, i32(n), i32(kk), i32(int(ldmatrix))))
    return d
