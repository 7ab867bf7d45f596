"""The sampling algorithm's NumPy definition: the counter-based RNG and the fp32 draw on logits rows.

A draw depends only on the row's logits, the request's parameters, its seed and the position of the token being
drawn, never on the batch, so a CUDA kernel can reproduce it bit for bit by following these steps.

RNG (counter-based, keyed by (seed, position); u64 arithmetic modulo 2**64):

    splitmix64(x):  x += 0x9E3779B97F4A7C15; z = x
                    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
                    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
                    return z ^ (z >> 31)
    bits(seed, position) = splitmix64(splitmix64(seed) + position)
    u = float32(bits >> 40) * 2**-24          a float32 uniform in [0, 1) with 24 random bits, exact

`position` is the absolute position the drawn token will take in the sequence (prompt length + tokens
generated before it).

The algorithm on one row of fp32 logits x[V] (every step in float32, sums strictly left to right):

 0. min_tokens: the bans of cupyglm.engine.sampling.banned_ids, applied by the caller as logits edits.
 1. greedy when temperature < 1e-5 (0 in practice): the lowest id among the maxima of x; done.
 2. x = x / float32(temperature).
 3. order the ids by (x desc, id asc); with top_k > 0 keep the first top_k. Call the kept values s[0..n).
 4. softmax: e[i] = exp(s[i] - s[0]); S = e[0] + e[1] + ... (left to right); p[i] = e[i] / S.
 5. top_p < 1: c[i] = p[0] + ... + p[i] (left to right); keep i = 0 and every i >= 1 with c[i - 1] < top_p
    (the smallest prefix whose mass reaches top_p).
 6. min_p > 0: keep the prefix with p[i] >= float32(min_p) * p[0].
 7. renormalise and draw: q[i] = p[0] + ... + p[i] over the kept n' ids (left to right); r = u * q[n' - 1];
    the drawn token is the first kept i (in the order of step 3) with q[i] > r, else the last kept one.

Ids whose e[i] underflows to 0 change no sum and are never drawn, so a kernel may skip them.

Where it runs: `draw` is steps 1-7 on one row (bans already applied), the one NumPy definition;
cupyglm.engine.sampling.sample is one request (bans + draw, for tests and tools); `sample_rows` (= NumpyOps.sample,
the op `sample`) is a batch of rows with per-row float32 temperature / top_p / min_p, int32 top_k, uint64 seed and
int32 position. The engine applies step 0 on rank 0 as logits edits (a NaN stays NaN) and samples every row of a
step with one `ops.sample` call: the NumPy reference on `numpy`, the kernel cuda_src/sample.cu (sample_rows) on
`sim` and `cuda`, token ids identical (the kernel contract, cupyglm/contract/cases_sample.py). The op takes the
parameters in float32: greedy iff float32(temperature) < float32(1e-5) (the engine passes 0 for a greedy request),
top_p applies iff float32(top_p) < 1, min_p iff float32(min_p) > 0. A row holding NaN gives -1.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend.lanes import exp_f32

MASK64 = (1 << 64) - 1
GREEDY_EPS = 1e-5


# ---- the RNG --------------------------------------------------------------------------------------------------

def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rng_bits(seed: int, position: int) -> int:
    return splitmix64((splitmix64(seed & MASK64) + position) & MASK64)


def uniform(seed: int, position: int) -> np.float32:
    """The float32 uniform in [0, 1) of (seed, position): the top 24 bits of rng_bits, exact."""
    return np.float32(rng_bits(seed, position) >> 40) * np.float32(2.0 ** -24)



def _ordered(x: np.ndarray, top_k: int) -> np.ndarray:
    """Ids by (x desc, id asc); with top_k > 0 only the first top_k (exact, ties at the cut by lower id)."""
    v = x.shape[0]
    if 0 < top_k < v:
        thr = np.partition(x, v - top_k)[v - top_k]          # the top_k-th largest value
        cand = np.nonzero(x >= thr)[0]
        order = cand[np.lexsort((cand, -x[cand]))]
        return order[:top_k]
    return np.lexsort((np.arange(v), -x))


def draw(x: np.ndarray, temperature, top_k, top_p, min_p, seed: int, position: int) -> int:
    """Steps 1-7 on one row of fp32 logits x[V] (bans already applied): a pure function of the row, its
    parameters, its seed and the position of the drawn token. -1 when x holds NaN.

    This is THE definition: the engine's `sample` (one request), `sample_rows` / NumpyOps.sample (a batch) and
    the kernel cuda_src/sample.cu (sample_rows) all follow it. The parameters are taken as float32 / int32 / uint64 as
    the op passes them: greedy iff float32(temperature) < float32(1e-5) (the engine passes 0 for greedy
    requests), top_p is applied iff float32(top_p) < 1, min_p iff float32(min_p) > 0."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if np.isnan(x).any():
        return -1
    t = np.float32(temperature)
    if t < np.float32(GREEDY_EPS):
        return int(np.argmax(x))                            # first maximum: ties go to the lower id
    x = x / t
    order = _ordered(x, int(top_k))
    s = x[order]
    e = exp_f32(s - s[0])
    p = (e / np.cumsum(e, dtype=np.float32)[-1]).astype(np.float32)
    keep = p.shape[0]
    top_p, min_p = np.float32(top_p), np.float32(min_p)
    if top_p < np.float32(1.0):
        c = np.cumsum(p, dtype=np.float32)
        keep = min(keep, 1 + int(np.count_nonzero(c[:-1] < top_p)))
    if min_p > np.float32(0.0):
        thr = min_p * p[0]
        keep = min(keep, max(1, int(np.count_nonzero(p[:keep] >= thr))))
    q = np.cumsum(p[:keep], dtype=np.float32)
    r = uniform(int(seed), int(position)) * q[-1]
    idx = int(np.searchsorted(q, r, side="right"))
    return int(order[min(idx, keep - 1)])


def sample_rows(logits: np.ndarray, temperature, top_k, top_p, min_p, seed, position) -> np.ndarray:
    """`draw` on every row of logits [R, V] fp32 with per-row temperature [R] f32 (0 = greedy), top_k [R] i32
    (0 = off), top_p [R] f32, min_p [R] f32, seed [R] u64 and position [R] i32 -> tokens [R] int32 (-1 for
    a row holding NaN). Row i's token depends on row i's inputs alone."""
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"sample: logits must be [R, V], got shape {x.shape}")
    cols = [np.asarray(a).reshape(-1) for a in (temperature, top_k, top_p, min_p, seed, position)]
    for name, a in zip(("temperature", "top_k", "top_p", "min_p", "seed", "position"), cols):
        if a.shape[0] != x.shape[0]:
            raise ValueError(f"sample: {name} must have {x.shape[0]} entries, got {a.shape[0]}")
    t, k, tp, mp, sd, pos = cols
    return np.array([draw(x[i], np.float32(t[i]), int(k[i]), np.float32(tp[i]), np.float32(mp[i]),
                          int(np.uint64(sd[i])), int(pos[i])) for i in range(x.shape[0])], dtype=np.int32)
