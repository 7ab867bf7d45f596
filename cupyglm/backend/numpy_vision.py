"""The vision tower's own ops in the numpy reference (NumpyOps inherits them; cuda_src/vision.cu runs them on the
kernel backends): a linear's bias, exact GELU, and non-causal attention over one image's patches."""
from __future__ import annotations

import numpy as np

from cupyglm.backend.erf_f32 import gelu_f32
from cupyglm.backend.lanes import bf16, exp_f32, f32, gemm_batched, lane_sum, out_kind, rsqrt_f32


def check_attention_args(qkv, q_w, k_w, cos, sin) -> tuple[int, int, int]:
    """(n, H, D) of a vision_attention call, its shapes refused by name where they disagree."""
    if qkv.ndim != 4 or qkv.shape[1] != 3:
        raise ValueError(f"vision_attention: qkv must be [n, 3, heads, head_dim], got {tuple(qkv.shape)}")
    n, _, h, d = qkv.shape
    if d % 2:
        raise ValueError(f"vision_attention: head_dim must be even (the rotary's halves), got {d}")
    for name, a, shape in (("q_w", q_w, (d,)), ("k_w", k_w, (d,)), ("cos", cos, (n, d)), ("sin", sin, (n, d))):
        if tuple(a.shape) != shape:
            raise ValueError(f"vision_attention: {name} must have shape {shape}, got {tuple(a.shape)}")
    return n, h, d


def _rmsnorm(x, w, eps: float) -> np.ndarray:
    """NumpyOps.rmsnorm's form (the kernel shares norm_row.cuh with rmsnorm_rows): a head's q or k norm."""
    x = f32(x)
    r = rsqrt_f32(lane_sum(x * x) / np.float32(x.shape[-1]) + np.float32(eps))
    return bf16(f32(w) * f32(bf16(x * r[..., None])))


class VisionOps:
    def bias_add(self, y: np.ndarray, b: np.ndarray, out: str = "f32") -> np.ndarray:
        """A linear's bias: y [M, N] fp32 (the GEMM's sums) + b [N] bf16 in fp32; out="bf16" rounds it once."""
        y = f32(y) + f32(b)
        return bf16(y) if out_kind("bias_add", out) == "bf16" else y

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """Exact (erf) GELU of bf16 x, elementwise, in fp32 (backend/erf_f32.py), rounded to bf16."""
        return bf16(gelu_f32(f32(x)))

    def vision_attention(self, qkv: np.ndarray, q_w: np.ndarray, k_w: np.ndarray, eps: float, cos: np.ndarray,
                         sin: np.ndarray, scale: float) -> np.ndarray:
        """Non-causal attention over one image's n patches. qkv: [n, 3, H, D] bf16; q and k each head RMSNormed
        (q_w, k_w [D] bf16, eps) and turned by the 2-D rotary (cos, sin [n, D] fp32: x * cos +
        rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]]), rounded to bf16; scores q.k * scale;
        p = bf16(exp_f32(s - max) / sum) (the sum lane-16 over keys); out = bf16(p . v) -> [n, H * D] bf16."""
        n, h, d = check_attention_args(qkv, q_w, k_w, cos, sin)
        cos, sin = f32(cos)[:, None, :], f32(sin)[:, None, :]

        def turn(x):                                                      # [n, H, D] bf16 -> bf16
            x = f32(x)
            half = d // 2
            t = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
            return bf16(x * cos + t * sin)

        q = turn(_rmsnorm(qkv[:, 0], q_w, eps)).transpose(1, 0, 2)
        k = turn(_rmsnorm(qkv[:, 1], k_w, eps)).transpose(1, 0, 2)
        v = qkv[:, 2].transpose(1, 2, 0)                                   # [H, D, n]
        scores = gemm_batched(q, k) * np.float32(scale)                   # [H, n, n]
        e = exp_f32(scores - scores.max(axis=-1, keepdims=True))
        p = bf16(e / lane_sum(e)[..., None])
        return bf16(gemm_batched(p, v)).transpose(1, 0, 2).reshape(n, h * d)

