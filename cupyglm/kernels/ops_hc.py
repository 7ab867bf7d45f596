"""Hyper-connection launchers (cuda_src/hc.cu): hc_pre, hc_post, stream_mean, with NumpyOps' signatures."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, check, f32, i32, op

SRC = "hc.cu"
F32 = np.float32


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("hc_pre")
def hc_pre(k: Kernels, X, fn, base, scale, norm_eps, hc_eps, iters):
    """X: [T, S, D] bf16 streams -> (x [T, D] bf16, post [T, S] fp32, comb [T, S, S] fp32)."""
    X = _arg(k, "hc_pre", "X", X, (None, None, None))
    t, s, d = X.shape
    nm = s * (s + 2)
    if s > 8:
        raise ValueError(f"hc_pre: at most 8 streams, got {s}")
    fn = _arg(k, "hc_pre", "fn", fn, (nm, s * d))
    base = _arg(k, "hc_pre", "base", base, (nm,))
    scale = _arg(k, "hc_pre", "scale", scale, (3,))
    x = k.empty((t, d))
    post = k.empty((t, s))
    comb = k.empty((t, s, s))
    if t:
        k.launch(SRC, "hc_pre", (t,), (128,),
                 (X, fn, base, scale, x, post, comb, i32(t), i32(s), i32(d), f32(norm_eps), f32(hc_eps),
                  i32(iters)), shared_mem=(nm + 1 + s) * 4)
    return x, post, comb


@op("hc_post")
def hc_post(k: Kernels, X, branch, post, comb):
    """X'[s] = bf16(post_s * branch + sum_j comb[j, s] * X[j]). -> [T, S, D] bf16."""
    X = _arg(k, "hc_post", "X", X, (None, None, None))
    t, s, d = X.shape
    branch = _arg(k, "hc_post", "branch", branch, (t, d))
    post = _arg(k, "hc_post", "post", post, (t, s))
    comb = _arg(k, "hc_post", "comb", comb, (t, s, s))
    out = k.empty(X.shape)
    if t:
        k.launch(SRC, "hc_post", ((d + 255) // 256, t), (256,),
                 (X, branch, post, comb, out, i32(t), i32(s), i32(d)))
    return out


@op("stream_mean")
def stream_mean(k: Kernels, X):
    """[T, S, D] -> bf16((((X0 + X1) + X2) + X3) * (1/S))."""
    X = _arg(k, "stream_mean", "X", X, (None, None, None))
    t, s, d = X.shape
    out = k.empty((t, d))
    if t:
        k.launch(SRC, "stream_mean", ((d + 255) // 256, t), (256,), (X, out, i32(t), i32(s), i32(d),
                                                                     f32(1.0 / s)))
    return out
