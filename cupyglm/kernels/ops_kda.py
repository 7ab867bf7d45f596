"""KDA launchers (cuda_src/kda.cu: kda_conv, kda_gate, l2norm, kda_recurrence, kda_out; cuda_src/kda_step.cu:
kda_step, kda_step_slots, the decode steps with the low-rank second factors fused in; op kda_out_gemm, kda_out then
o_proj's GEMM), with NumpyOps' signatures.
bf16 parameters are checked against the backend's bf16 storage (`k.bf16`); S, g, q, k are fp32."""
from __future__ import annotations

import numpy as np

from cupyglm.kernels import ops_gemm
from cupyglm.kernels.ops import Kernels, aligned16, check, f32, i32, op

SRC = "kda.cu"
SRC_STEP = "kda_step.cu"    # kda_step, kda_step_slots
ROWS = 16                   # KDA_STEP_ROWS: value rows per block (threadIdx.y; threadIdx.x the 16 lanes)
F32 = np.float32


def _arg(k: Kernels, kernel: str, name: str, a, shape=None, dtype=F32):
    """An input as the kernel takes it: C-contiguous (views are copied), shape and dtype checked."""
    return check(kernel, name, k.xp.ascontiguousarray(a), shape, dtype)


def _rows(shape) -> int:
    n = 1
    for s in shape[:-1]:
        n *= int(s)
    return n


@op("kda_conv")
def kda_conv(k: Kernels, x, window, w):
    """x: [n, C] bf16, window: [taps - 1, C] bf16, w: [C, taps] -> (y [n, C] bf16, window' [taps - 1, C])."""
    x = _arg(k, "kda_conv", "x", x, (None, None), k.bf16)
    n, c = x.shape
    w = _arg(k, "kda_conv", "w", w, (c, None), k.bf16)
    taps = w.shape[1]
    if not 1 <= taps <= 8:
        raise ValueError(f"kda_conv: 1..8 taps supported, got {taps}")
    window = _arg(k, "kda_conv", "window", window, (taps - 1, c), k.bf16)
    y = k.empty((n, c), k.bf16)
    win = k.empty((taps - 1, c), k.bf16)
    if c:
        k.launch(SRC, "kda_conv", ((c + 127) // 128,), (128,), (x, window, w, y, win, i32(n), i32(c), i32(taps)))
    return y, win


@op("kda_gate")
def kda_gate(k: Kernels, a, a_log, dt_bias, lower):
    """g = exp(lower * sigmoid(exp(A_log) * (a + dt_bias))). a: [n, H, K] -> [n, H, K] fp32."""
    a = _arg(k, "kda_gate", "a", a, (None, None, None), k.bf16)
    n, h, kk = a.shape
    a_log = _arg(k, "kda_gate", "a_log", a_log, (h,), np.float32)
    dt_bias = _arg(k, "kda_gate", "dt_bias", dt_bias, (h, kk), np.float32)
    g = k.empty(a.shape)
    total = n * h * kk
    if total:
        k.launch(SRC, "kda_gate", ((total + 255) // 256,), (256,),
                 (a, a_log, dt_bias, g, np.int64(total), i32(h), i32(kk), f32(lower)))
    return g


@op("l2norm")
def l2norm(k: Kernels, x, eps, scale=None):
    """x / sqrt(sum(x^2) + eps) over the last axis: x bf16 -> fp32; then times scale (fp32) when given."""
    x = _arg(k, "l2norm", "x", x, None, k.bf16)
    if x.ndim < 1:
        raise ValueError("l2norm: parameter x must have at least one axis")
    rows, kk = _rows(x.shape), x.shape[-1]
    out = k.empty(x.shape)
    if rows and kk:
        k.launch(SRC, "l2norm", ((rows + 7) // 8,), (128,), (x, out, np.int64(rows), i32(kk), f32(eps),
                                                                i32(scale is not None), f32(scale or 0.0)))
    return out


STAGED_K = (32, 128)         # key columns kda_recurrence_k{K}_r{R} is built for (others: the generic kernel)
GROUP_ROWS = (1, 2, 4)       # value rows a 16-thread group may own (R)
REC_THREADS = 128            # KDA_REC_GROUPS groups of 16 threads
SATURATE = 1024              # warps that give each scheduler of a 132-SM GPU two


def rec_rows(h: int, vd: int) -> int:
    """The value rows a group owns: the most (1, 2, 4) that leave at least SATURATE warps (a token's chain is a
    warp's; fewer warps leave schedulers idle, more rows a group read q, k, g once for them). Any choice has the
    same bits."""
    warps = h * vd // 2
    return 4 if warps >= 4 * SATURATE else 2 if warps >= 2 * SATURATE else 1


def rec_kernel(kd: int, rows: int) -> tuple[str, int]:
    """(kernel, value rows a block) of a launch at kd key columns and `rows` rows a group."""
    if kd in STAGED_K:
        return f"kda_recurrence_k{kd}_r{rows}", REC_THREADS // 16 * rows
    return "kda_recurrence", 8


@op("kda_recurrence")
def kda_recurrence(k: Kernels, S, q, kk, v, g, beta):
    """S: [H, V, K] fp32; q, k, g: [n, H, K] fp32; v: [n, H, V] bf16; beta: [n, H] bf16 -> (y [n, H, V] bf16,
    S' fp32)."""
    return kda_recurrence_rows(k, S, q, kk, v, g, beta, None)


def kda_recurrence_rows(k: Kernels, S, q, kk, v, g, beta, rows: int | None):
    """kda_recurrence with `rows` value rows a group (1, 2, 4; None: rec_rows), the same bits for every choice."""
    S = _arg(k, "kda_recurrence", "S", S, (None, None, None))
    h, vd, kd = S.shape
    if kd > 256:
        raise ValueError(f"kda_recurrence: K <= 256 supported, got {kd}")
    q = _arg(k, "kda_recurrence", "q", q, (None, h, kd))
    n = q.shape[0]
    kk = _arg(k, "kda_recurrence", "k", kk, (n, h, kd))
    g = _arg(k, "kda_recurrence", "g", g, (n, h, kd))
    v = _arg(k, "kda_recurrence", "v", v, (n, h, vd), k.bf16)
    beta = _arg(k, "kda_recurrence", "beta", beta, (n, h), k.bf16)
    if kd in STAGED_K:         # the staged kernels copy 16-byte pieces (cp.async)
        q, kk, g = (aligned16(k, a) for a in (q, kk, g))
    rows = rec_rows(h, vd) if rows is None else rows
    if rows not in GROUP_ROWS:
        raise ValueError(f"kda_recurrence: 1, 2 or 4 value rows a group, got {rows}")
    y = k.empty((n, h, vd), k.bf16)
    S_out = k.empty(S.shape)
    if h and vd and n:
        name, block_rows = rec_kernel(kd, rows)
        tail = (i32(n), i32(h), i32(vd)) + ((i32(kd),) if name == "kda_recurrence" else ())
        k.launch(SRC, name, (-(-vd // block_rows), h), (REC_THREADS,), (S, q, kk, v, g, beta, y, S_out) + tail)
    else:
        S_out[...] = S
    return y, S_out


def _step_rows(k: Kernels, kernel: str, h: int, kd: int, x, w, fa, ga, f_b, g_b, a_log, dt_bias, beta,
               min_taps: int):
    """The row inputs and weights both decode steps take: x [n, 3HK] bf16, conv taps w [3HK, taps] bf16
    (min_taps..8), the low-rank first factors fa, ga [n, r] bf16 and second factors f_b, g_b [HK, r] bf16 (r >= 1),
    a_log [H] fp32, dt_bias [H, K] fp32, beta [n, H] bf16."""
    c = 3 * h * kd
    x = _arg(k, kernel, "x", x, (None, c), k.bf16)
    n = x.shape[0]
    w = _arg(k, kernel, "w", w, (c, None), k.bf16)
    taps = w.shape[1]
    if not min_taps <= taps <= 8:
        raise ValueError(f"{kernel}: {min_taps}..8 taps supported, got {taps}")
    f_b = _arg(k, kernel, "f_b", f_b, (h * kd, None), k.bf16)
    r = f_b.shape[1]
    if r < 1:
        raise ValueError(f"{kernel}: the low rank r must be at least 1, got f_b of shape {tuple(f_b.shape)}")
    g_b = _arg(k, kernel, "g_b", g_b, (h * kd, r), k.bf16)
    fa = _arg(k, kernel, "fa", fa, (n, r), k.bf16)
    ga = _arg(k, kernel, "ga", ga, (n, r), k.bf16)
    a_log = _arg(k, kernel, "a_log", a_log, (h,), np.float32)
    dt_bias = _arg(k, kernel, "dt_bias", dt_bias, (h, kd), np.float32)
    beta = _arg(k, kernel, "beta", beta, (n, h), k.bf16)
    return x, w, taps, fa, ga, f_b, g_b, r, a_log, dt_bias, beta


def _out_view(k: Kernels, kernel: str, name: str, a, shape):
    """A caller's output view the kernel writes: the shape, bf16, C-contiguous and writeable (a copy would lose
    the writes)."""
    check(kernel, f"out {name}", a, shape, k.bf16)
    if not getattr(a.flags, "writeable", True):
        raise ValueError(f"{kernel}: out {name} must be writeable")
    return a


@op("kda_step")
def kda_step(k: Kernels, S, x, window, w, fa, ga, f_b, g_b, a_log, dt_bias, beta, lower, eps, q_scale, out=None):
    """The low-rank second factors a = gemm(fa, f_b, bf16) and gate = gemm(ga, g_b, bf16) (the decode GEMV's
    bits), kda_conv of x (the q, k, v heads), l2norm of q (times q_scale) and k, kda_gate of a and kda_recurrence
    in one launch. S: [H, K, K] fp32; x: [n, 3HK] bf16; window: [taps - 1, 3HK] bf16; w: [3HK, taps] bf16; fa, ga:
    [n, r] bf16; f_b, g_b: [HK, r] bf16; beta: [n, H] bf16 -> (y [n, H, K] bf16, gate [n, H, K] bf16, S',
    window'). out: None, or (y, gate) views of the caller's rows ([n, H, K] bf16, C-contiguous) written in place
    and returned."""
    S = _arg(k, "kda_step", "S", S, (None, None, None))
    h, vd, kd = S.shape
    if vd != kd or kd > 256:
        raise ValueError(f"kda_step: value rows = key columns <= 256 supported, got S of shape {tuple(S.shape)}")
    c = 3 * h * kd
    x, w, taps, fa, ga, f_b, g_b, r, a_log, dt_bias, beta = _step_rows(k, "kda_step", h, kd, x, w, fa, ga, f_b, g_b,
                                                                       a_log, dt_bias, beta, 1)
    n = x.shape[0]
    window = _arg(k, "kda_step", "window", window, (taps - 1, c), k.bf16)
    if out is None:
        y, gate = k.empty((n, h, kd), k.bf16), k.empty((n, h, kd), k.bf16)
    else:
        if len(out) != 2:
            raise ValueError(f"kda_step: out must be (y, gate) views, got {len(out)} arrays")
        y, gate = (_out_view(k, "kda_step", nm, a, (n, h, kd)) for nm, a in zip(("y", "gate"), out))
    S_out = k.empty(S.shape)
    win = k.empty((taps - 1, c), k.bf16)
    if h and kd and n:
        k.launch(SRC_STEP, "kda_step", (-(-kd // ROWS), h), (16, ROWS),
                 (S, x, window, w, fa, ga, f_b, g_b, a_log, dt_bias, beta, y, gate, S_out, win, i32(n), i32(h),
                  i32(kd), i32(r), i32(taps), f32(lower), f32(eps), f32(q_scale)))
    else:
        S_out[...] = S
        win[...] = window
    return y, gate, S_out, win


def _inplace(k: Kernels, kernel: str, name: str, a, shape, dtype):
    """An array the kernel writes in place: it must already be C-contiguous (a copy would lose the writes)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"{kernel}: parameter {name} is written in place and must be C-contiguous")
    return check(kernel, name, a, shape, dtype)


@op("kda_step_slots", inplace=(0, 2, 12))
def kda_step_slots(k: Kernels, S, x, window, w, fa, ga, f_b, g_b, a_log, dt_bias, beta, seg, done, lower, eps,
                   q_scale):
    """kda_step of several sequences' decode/verify rows in one launch, their states in slots written in place.
    S: [slots, H, K, K] fp32; x: [R, 3HK] bf16; window: [slots, taps - 1, 3HK] bf16; w: [3HK, taps] bf16; fa, ga:
    [R, r] bf16; f_b, g_b: [HK, r] bf16; beta: [R, H] bf16; seg: [E, 3] int32 (row0, n, slot) per sequence, its
    rows in order inside [0, R), no row in two entries (n = 0: none; slot < 0: a padding row on a zero state,
    nothing written back; a row in no entry: y and gate zero); done: [E, H] int32 zeros, left zero -> (y, gate)
    [R, H, K] bf16."""
    S = _inplace(k, "kda_step_slots", "S", S, (None, None, None, None), F32)
    slots, h, vd, kd = S.shape
    if vd != kd or kd > 256:
        raise ValueError(f"kda_step_slots: value rows = key columns <= 256 supported, got S of shape {tuple(S.shape)}")
    c = 3 * h * kd
    x, w, taps, fa, ga, f_b, g_b, r, a_log, dt_bias, beta = _step_rows(k, "kda_step_slots", h, kd, x, w, fa, ga,
                                                                       f_b, g_b, a_log, dt_bias, beta, 2)
    rows = x.shape[0]
    window = _inplace(k, "kda_step_slots", "window", window, (slots, taps - 1, c), k.bf16)
    seg = _arg(k, "kda_step_slots", "seg", seg, (None, 3), np.int32)
    e = seg.shape[0]
    done = _inplace(k, "kda_step_slots", "done", done, (e, h), np.int32)
    y = k.empty((rows, h, kd), k.bf16)
    gate = k.empty((rows, h, kd), k.bf16)
    if rows and h and kd:      # a block per (value rows, head) steps every entry: f_b/g_b read once per 16 rows
        k.launch(SRC_STEP, "kda_step_slots", (-(-kd // ROWS), h), (16, ROWS),
                 (S, x, window, w, fa, ga, f_b, g_b, a_log, dt_bias, beta, seg, y, gate, done, i32(rows), i32(e),
                  i32(h), i32(kd), i32(r), i32(taps), f32(lower), f32(eps), f32(q_scale)))
    return y, gate


@op("kda_out")
def kda_out(k: Kernels, y, w, gate, eps):
    """Per head: bf16(w * (y * rsqrt(mean(y^2) + eps)) * sigmoid(gate)). y, gate: [n, H, V] bf16, w: [V] bf16
    -> bf16."""
    y = _arg(k, "kda_out", "y", y, None, k.bf16)
    vd = y.shape[-1]
    w = _arg(k, "kda_out", "w", w, (vd,), k.bf16)
    gate = _arg(k, "kda_out", "gate", gate, tuple(y.shape), k.bf16)
    rows = _rows(y.shape)
    out = k.empty(y.shape, k.bf16)
    if rows and vd:
        k.launch(SRC, "kda_out", ((rows + 7) // 8,), (128,), (y, w, gate, out, np.int64(rows), i32(vd), f32(eps)))
    return out


@op("kda_out_gemm")
def kda_out_gemm(k: Kernels, y, w_norm, gate, eps, w, decode: int = 0):
    """gemm(kda_out(y, w_norm, gate, eps) viewed [T, H * V], w) fp32, the leading `decode` rows decode rows: the
    norm once (kda_out), then the plain GEMM. A norm in o_proj's GEMV prologue would be recomputed by every column
    block (an exp per element), far above the weights' stream in instructions."""
    o = kda_out(k, y, w_norm, gate, eps)
    return ops_gemm.gemm(k, o.reshape(o.shape[0], -1), w, decode=decode)
