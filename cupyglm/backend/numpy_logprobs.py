"""Log-probabilities of the sampled tokens and of the top ids: the NumPy definition of cuda_src/logprobs.cu.

They are computed from the very fp32 logits row `ops.sample` draws from (after the min_tokens bans), before
temperature, top-k/p and min-p: the model's own distribution, as vLLM's default ("raw") logprobs. Every step in
float32, in the kernel's order, so NumPy, the emulator and the GPU give the same bits:

    m = max(x) (+0 for a zero); e[i] = exp_f32(x[i] - m)
    S: partial[t] = e[t] + e[t + T] + ... (left to right, T = THREADS), S = partial[0] + ... + partial[T - 1]
    L = log_f32(S); logprob(i) = (x[i] - m) - L
    top K: the ids by (x desc, id asc), the first K

A row's values depend on that row only (never on the batch, nor on K: the first k of a top-K list are the top
k). The op packs a step's results in one int32 array [R, 2 + 2K] (token, logprob bits, K ids, K logprob bits)
so one device-to-host copy brings them back; cupyglm.engine.logprobs.unpack reads it.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import exp_f32

THREADS = 256           # cuda_src/logprobs.cu LP_THREADS: the partial sums' stride
MAX_TOP = 20            # cuda_src/logprobs.cu LP_MAX_K: OpenAI's bound on top_logprobs

_SQRT2 = np.float32(float.fromhex("0x1.6a09e6p+0"))
_P = [np.float32(float.fromhex(h)) for h in ("0x1.745d18p-4", "0x1.c71c72p-4", "0x1.24924ap-3", "0x1.99999ap-3",
                                              "0x1.555556p-2")]
_LN2_HI = np.float32(float.fromhex("0x1.63p-1"))
_LN2_LO = np.float32(float.fromhex("-0x1.bd0106p-13"))


def log_f32(x) -> np.ndarray:
    """log for finite float32 x >= 1 from IEEE +, -, *, / and exponent arithmetic: cuda_src/logprobs.cu log_f32."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    e = (b >> np.uint32(23)).astype(np.int32) - 127
    m = ((b & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32)
    big = m > _SQRT2
    m = np.where(big, m * np.float32(0.5), m).astype(np.float32)
    e = np.where(big, e + 1, e)
    f = m - np.float32(1.0)
    s = f / (np.float32(2.0) + f)
    z = s * s
    p = np.full_like(z, _P[0])
    for c in _P[1:]:
        p = p * z + c
    s2 = s + s
    lm = s2 + (s2 * z) * p
    ef = e.astype(np.float32)
    return (ef * _LN2_HI + (lm + ef * _LN2_LO)).astype(np.float32)


def logprobs_rows(logits: np.ndarray, tokens: np.ndarray, k: int) -> np.ndarray:
    """logits [R, V] f32, tokens [R] i32, k in 0..MAX_TOP -> [R, 2 + 2k] int32 packed (see the module doc)."""
    x = np.asarray(logits, dtype=np.float32)
    r, v = x.shape
    out = np.zeros((r, 2 + 2 * k), dtype=np.int32)
    if r == 0:
        return out
    m = (x.max(axis=1) + np.float32(0.0)).astype(np.float32)
    d = (x - m[:, None]).astype(np.float32)
    e = exp_f32(d)
    cols = -(-v // THREADS) * THREADS
    e = np.concatenate([e, np.zeros((r, cols - v), np.float32)], axis=1).reshape(r, -1, THREADS)
    part = np.cumsum(e, axis=1, dtype=np.float32)[:, -1, :]           # each thread's sum, left to right
    S = np.cumsum(part, axis=1, dtype=np.float32)[:, -1]              # the partials, left to right
    L = log_f32(S)
    lp = (d - L[:, None]).astype(np.float32)
    tok = np.asarray(tokens, dtype=np.int32)
    out[:, 0] = tok
    ok = (tok >= 0) & (tok < v)
    chosen = np.where(ok, lp[np.arange(r), np.where(ok, tok, 0)], np.float32(np.nan)).astype(np.float32)
    out[:, 1] = chosen.view(np.int32)
    if k:
        top = np.stack([np.lexsort((np.arange(v), -x[i]))[:k] for i in range(r)]).astype(np.int32)
        out[:, 2:2 + k] = top
        out[:, 2 + k:] = np.take_along_axis(lp, top, axis=1).view(np.int32)
    return out
