"""Hyper-connection launchers (cuda_src/hc.cu): hc_pre, hc_pre_norm, hc_post, hc_post_pre_norm, stream_mean and
the MTP layer's plain residual_add, with NumpyOps' signatures. Streams and weights are bf16 storage (`k.bf16`);
gates fp32."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels.ops import Kernels, aligned16, check, f32, i32, op

SRC = "hc.cu"
SPLIT = "hc_split.cu"
# hc_post_pre_norm runs hc_split.cu's two launches (a row's mix dots over several blocks) up to this many rows;
# a prompt chunk's rows fill the GPU one block a row (hc.cu). Both give the same bits.
SPLIT_ROWS = 64
SPLIT_OUTS = 2                 # hc_split.cu HC_MIX_OUTS: the dots a block
SPLIT_THREADS = 256            # hc_split.cu HC_MIX_THREADS
SPLIT_STAGE = 3 * 16 * (4096 // 16 + 4) * 4     # hc_mix_norm's stage: HC_MIX_ROWS x 16 lanes x HC_MIX_PITCH floats
SPLIT_STATIC = 1024             # hc_mix_norm's static shared memory, rounded up (gates, Sinkhorn, the norm's lanes)
F32 = np.float32
MAX_SHARED = 48 * 1024     # dynamic shared memory without an opt-in


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


@op("hc_pre")
def hc_pre(k: Kernels, X, fn, base, scale, norm_eps, hc_eps, iters):
    """X: [T, S, D] bf16 streams -> (x [T, D] bf16, post [T, S] fp32, comb [T, S, S] fp32)."""
    X = _arg(k, "hc_pre", "X", X, (None, None, None), k.bf16)
    t, s, d = X.shape
    nm = s * (s + 2)
    if s > 8:
        raise ValueError(f"hc_pre: at most 8 streams, got {s}")
    fn = _arg(k, "hc_pre", "fn", fn, (nm, s * d), k.bf16)
    base = _arg(k, "hc_pre", "base", base, (nm,), np.float32)
    scale = _arg(k, "hc_pre", "scale", scale, (3,), np.float32)
    x = k.empty((t, d), k.bf16)
    post = k.empty((t, s))
    comb = k.empty((t, s, s))
    if t:
        k.launch(SRC, "hc_pre", (t,), (128,),
                 (X, fn, base, scale, x, post, comb, i32(t), i32(s), i32(d), f32(norm_eps), f32(hc_eps),
                  i32(iters)), shared_mem=(nm + 1 + s) * 4)
    return x, post, comb


def _branch(k: Kernels, kernel: str, branch, t: int, d: int):
    """The sublayer's fp32 output as hc_post reads it: [T, D] (already summed) or [R, T, D] (each rank's partial as
    gathered, summed in rank order by the kernel) -> (branch, R)."""
    if branch.ndim == 2:
        return _arg(k, kernel, "branch", branch, (t, d)), 1
    if branch.ndim != 3 or branch.shape[0] < 1:
        raise ValueError(f"{kernel}: parameter branch must be [T, D] or [ranks, T, D] with ranks >= 1, got "
                         f"{tuple(branch.shape)}")
    return _arg(k, kernel, "branch", branch, (None, t, d)), int(branch.shape[0])


def _pre_norm_args(k: Kernels, name: str, X, fn, base, scale, norm_w):
    """The hc_pre + norm parameters checked; (t, s, d, dynamic shared bytes, fn, base, scale, norm_w)."""
    t, s, d = X.shape
    nm = s * (s + 2)
    if s > 8:
        raise ValueError(f"{name}: at most 8 streams, got {s}")
    shared = (nm + 1 + s + d) * 4
    if shared > MAX_SHARED:
        raise ValueError(f"{name}: D={d} needs {shared} bytes of shared memory (at most {MAX_SHARED})")
    fn = _arg(k, name, "fn", fn, (nm, s * d), k.bf16)
    base = _arg(k, name, "base", base, (nm,), np.float32)
    scale = _arg(k, name, "scale", scale, (3,), np.float32)
    norm_w = _arg(k, name, "norm_w", norm_w, (d,), k.bf16)
    return t, s, d, shared, fn, base, scale, norm_w


@op("hc_pre_norm")
def hc_pre_norm(k: Kernels, X, fn, base, scale, norm_w, norm_eps, hc_eps, iters):
    """hc_pre, then rmsnorm(x, norm_w, norm_eps) in the same launch: X [T, S, D] bf16 -> (h [T, D] bf16, post
    [T, S] fp32, comb [T, S, S] fp32)."""
    X = _arg(k, "hc_pre_norm", "X", X, (None, None, None), k.bf16)
    t, s, d, shared, fn, base, scale, norm_w = _pre_norm_args(k, "hc_pre_norm", X, fn, base, scale, norm_w)
    x = k.empty((t, d), k.bf16)                  # the collapsed row (scratch: the caller keeps h)
    h = k.empty((t, d), k.bf16)
    post = k.empty((t, s))
    comb = k.empty((t, s, s))
    if t:
        k.launch(SRC, "hc_pre_norm", (t,), (128,),
                 (X, fn, base, scale, norm_w, x, h, post, comb, i32(t), i32(s), i32(d), f32(norm_eps),
                  f32(hc_eps), i32(iters)), shared_mem=shared)
    return h, post, comb


@op("hc_post_pre_norm")
def hc_post_pre_norm(k: Kernels, X, branch, post, comb, fn, base, scale, norm_w, norm_eps, hc_eps, iters):
    """hc_post(X, branch, post, comb), then hc_pre_norm of the result -> (X' [T, S, D] bf16, h [T, D] bf16, post'
    [T, S] fp32, comb' [T, S, S] fp32). branch: [T, D] or [R, T, D] fp32 (see hc_post). Up to SPLIT_ROWS rows in
    hc_split.cu's two launches, else hc.cu's one (one block a row)."""
    X = _arg(k, "hc_post_pre_norm", "X", X, (None, None, None), k.bf16)
    t, s, d, shared, fn, base, scale, norm_w = _pre_norm_args(k, "hc_post_pre_norm", X, fn, base, scale, norm_w)
    branch, ranks = _branch(k, "hc_post_pre_norm", branch, t, d)
    post = _arg(k, "hc_post_pre_norm", "post", post, (t, s))
    comb = _arg(k, "hc_post_pre_norm", "comb", comb, (t, s, s))
    X2 = k.empty(X.shape, k.bf16)
    x = k.empty((t, d), k.bf16)                  # the collapsed row (scratch)
    h = k.empty((t, d), k.bf16)
    post2 = k.empty((t, s))
    comb2 = k.empty((t, s, s))
    outs = (x, h, post2, comb2)
    if t and t <= SPLIT_ROWS and (s * d) % 8 == 0 and SPLIT_STAGE + d * 4 + SPLIT_STATIC <= k.shared_optin:
        _split(k, X, branch, post, comb, aligned16(k, fn), base, scale, norm_w, X2, outs, ranks, norm_eps, hc_eps,
               iters)
    elif t:
        k.launch(SRC, "hc_post_pre_norm", (t,), (128,),
                 (X, branch, post, comb, fn, base, scale, norm_w, X2, *outs, i32(t), i32(s), i32(d),
                  f32(norm_eps), f32(hc_eps), i32(iters), i32(ranks)), shared_mem=shared)
    return X2, h, post2, comb2


def _split(k: Kernels, X, branch, post, comb, fn, base, scale, norm_w, X2, outs, ranks, norm_eps, hc_eps, iters):
    """hc_post_pre_norm's decode form (hc_split.cu): hc_post_split writes X' and zeroes the tickets, then
    hc_mix_norm's (T, ceil((NM + 1) / SPLIT_OUTS)) blocks sum the mix dots, each row's last block the tail."""
    t, s, d = X.shape
    nm = s * (s + 2)
    tickets = k.empty((t,), np.uint32)           # [T] blocks of the row done (zeroed by hc_post_split)
    dots = k.empty((t, nm + 1))                  # [T, NM + 1] fp32 the row's mix dots and sum of squares
    k.launch(SPLIT, "hc_post_split", (t, (d + 255) // 256), (256,),
             (X, branch, post, comb, X2, tickets, i32(t), i32(s), i32(d), i32(ranks)))
    k.launch_opted(SPLIT, "hc_mix_norm", (t, -(-(nm + 1) // SPLIT_OUTS)), (SPLIT_THREADS,),
                   (X2, fn, base, scale, norm_w, dots, tickets, *outs, i32(t), i32(s), i32(d), f32(norm_eps),
                    f32(hc_eps), i32(iters)), shared_mem=SPLIT_STAGE + d * 4)


@op("hc_post")
def hc_post(k: Kernels, X, branch, post, comb):
    """X'[s] = bf16(post_s * bf16(branch) + sum_j comb[j, s] * X[j]). X: [T, S, D] bf16, branch: [T, D] fp32, or
    [R, T, D] fp32 the ranks' partials, added in rank order as they are read -> [T, S, D] bf16."""
    X = _arg(k, "hc_post", "X", X, (None, None, None), k.bf16)
    t, s, d = X.shape
    branch, ranks = _branch(k, "hc_post", branch, t, d)
    post = _arg(k, "hc_post", "post", post, (t, s))
    comb = _arg(k, "hc_post", "comb", comb, (t, s, s))
    out = k.empty(X.shape, k.bf16)
    if t and d:
        k.launch(SRC, "hc_post", (t, (d + 255) // 256), (256,),
                 (X, branch, post, comb, out, i32(t), i32(s), i32(d), i32(ranks)))
    return out


@op("stream_mean")
def stream_mean(k: Kernels, X):
    """[T, S, D] bf16 -> [T, D] bf16((((X0 + X1) + X2) + X3) * (1/S))."""
    X = _arg(k, "stream_mean", "X", X, (None, None, None), k.bf16)
    t, s, d = X.shape
    out = k.empty((t, d), k.bf16)
    if t and d:
        k.launch(SRC, "stream_mean", (t, (d + 255) // 256), (256,), (X, out, i32(t), i32(s), i32(d),
                                                                     f32(1.0 / s)))
    return out


@op("residual_add")
def residual_add(k: Kernels, x, partial):
    """bf16(x + bf16(partial)). x: [T, D] bf16, partial: [T, D] fp32 -> [T, D] bf16."""
    x = _arg(k, "residual_add", "x", x, None, k.bf16)
    partial = _arg(k, "residual_add", "partial", partial, tuple(x.shape))
    out = k.empty(x.shape, k.bf16)
    n = x.size
    if n:
        k.launch(SRC, "residual_add", ((n + 255) // 256,), (256,), (x, partial, out, np.int64(n)))
    return out
