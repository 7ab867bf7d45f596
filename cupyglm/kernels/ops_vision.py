"""Launchers of cuda_src/vision.cu (the vision tower's own ops) with NumpyOps' signatures: bias_add, gelu and
vision_attention. bf16 arrays are `k.bf16` storage."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import out_kind
from cupyglm.backend.numpy_vision import check_attention_args
from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "vision.cu"
THREADS = 128
ELEMS = 256                     # elementwise kernels' block
SHARED_BYTES = 48 * 1024        # one (row, head)'s scores stay in a block's default shared memory
MAX_PATCHES = SHARED_BYTES // 4


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=np.float32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("bias_add")
def bias_add(k: Kernels, y, b, out: str = "f32"):
    """A linear's bias: y [M, N] fp32 + b [N] bf16 in fp32; out="bf16" rounds it once."""
    out = out_kind("bias_add", out)
    y = _arg(k, "bias_add", "y", y, (None, None))
    n_cols = y.shape[1]
    b = _arg(k, "bias_add", "b", b, (n_cols,), k.bf16)
    res = k.empty(y.shape, k.bf16 if out == "bf16" else np.float32)
    n = y.size
    if n:
        k.launch(SRC, "bias_add_bf16" if out == "bf16" else "bias_add_f32", ((n + ELEMS - 1) // ELEMS,), (ELEMS,),
                 (y, b, res, np.int64(n), i32(n_cols)))
    return res


@op("gelu")
def gelu(k: Kernels, x):
    """Exact (erf) GELU of bf16 x, elementwise, rounded to bf16."""
    x = _arg(k, "gelu", "x", x, None, k.bf16)
    out = k.empty(x.shape, k.bf16)
    n = x.size
    if n:
        k.launch(SRC, "gelu_rows", ((n + ELEMS - 1) // ELEMS,), (ELEMS,), (x, out, np.int64(n)))
    return out


@op("vision_attention")
def vision_attention(k: Kernels, qkv, q_w, k_w, eps: float, cos, sin, scale: float):
    """Non-causal attention over one image's patches: qkv [n, 3, H, D] bf16 -> [n, H * D] bf16 (NumpyOps'
    docstring). Two launches: q and k normed and turned (vision_qk_rows), then one block per (row, head)."""
    n, h, d = check_attention_args(qkv, q_w, k_w, cos, sin)
    if n > MAX_PATCHES:
        raise ValueError(f"vision_attention: at most {MAX_PATCHES} patches per image (one row's scores in shared "
                         f"memory), got {n}")
    qkv = _arg(k, "vision_attention", "qkv", qkv, (n, 3, h, d), k.bf16)
    q_w = _arg(k, "vision_attention", "q_w", q_w, (d,), k.bf16)
    k_w = _arg(k, "vision_attention", "k_w", k_w, (d,), k.bf16)
    cos = _arg(k, "vision_attention", "cos", cos, (n, d))
    sin = _arg(k, "vision_attention", "sin", sin, (n, d))
    out = k.empty((n, h * d), k.bf16)
    if not n or not h or not d:
        return out
    normed = k.empty((2, h, n, d), k.bf16)
    qk = k.empty((2, h, n, d), k.bf16)
    k.launch(SRC, "vision_qk_rows", (n, h, 2), (THREADS,),
             (qkv, q_w, k_w, cos, sin, normed, qk, i32(n), i32(h), i32(d), f32(eps)))
    k.launch(SRC, "vision_attention_rows", (n, h), (THREADS,), (qk, qkv, out, i32(n), i32(h), i32(d), f32(scale)),
             shared_mem=n * 4)
    return out
