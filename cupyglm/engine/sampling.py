"""Sampling: parameters, the counter-based RNG, the fp32 sampling algorithm, and stop rules.

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
generated before it). A request without a seed gets one from the engine: (settings.seed + request counter).

The algorithm on one row of fp32 logits x[V] (every step in float32, sums strictly left to right):

 0. min_tokens: while fewer than min_tokens tokens are generated, x[id] = -inf for every stop token id and,
    unless ignore_eos, every EOS id.
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

Where it runs: `draw` is steps 1-7 on one row (bans already applied), the one NumPy definition; `sample` is one
request (bans + draw, for tests and tools); `sample_rows` (= NumpyOps.sample, the op `sample`) is a batch of
rows with per-row float32 temperature / top_p / min_p, int32 top_k, uint64 seed and int32 position. The engine
applies step 0 on rank 0 as logits edits (a NaN stays NaN) and samples every row of a step with one
`ops.sample` call: the NumPy reference on `numpy`, the kernel cuda_src/sample.cu (sample_rows) on `sim` and
`cuda`, token ids identical (the kernel contract, cupyglm/contract/cases_sample.py). The op takes the
parameters in float32: greedy iff float32(temperature) < float32(1e-5) (the engine passes 0 for a greedy
request), top_p applies iff float32(top_p) < 1, min_p iff float32(min_p) > 0. A row holding NaN gives -1.

Stops: a stop token id or an EOS id (unless ignore_eos) ends the request with "stop" once min_tokens tokens
came before it; max_tokens ends it with "length"; a stop string (matched on rank 0's detokenized text) ends it
with "stop" and the text is cut before the match (OpenAI/vLLM behaviour; the token ids keep every token).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from cupyglm.backend.lanes import exp_f32

MASK64 = (1 << 64) - 1
GREEDY_EPS = 1e-5
FINISH_STOP, FINISH_LENGTH, FINISH_ABORT = "stop", "length", "abort"


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (vLLM / OpenAI defaults). Invalid values raise ValueError naming the field.

    max_tokens None means "up to the context window". top_k 0 or -1 is off. stop is a string or a list of
    strings; stop_token_ids a list of ids.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None           # None: off; k: each token's logprob and its k most likely (0..20)
    presence_penalty: float = 0.0         # -2..2, ids in the output (cupyglm.engine.penalties)
    frequency_penalty: float = 0.0        # -2..2, times the id is in the output
    repetition_penalty: float = 1.0       # (0, 10], ids in the prompt or the output
    logit_bias: tuple[tuple[int, float], ...] = ()   # (id, bias in -100..100) pairs, distinct ids
    prompt_logprobs: int | None = None    # None: off; k: each prompt token's logprob and its k most likely
    guide: object | None = None           # structured output: a cupyglm.engine.grammar.Guide the output matches
    draft: bool | None = None             # MTP drafts for this request; None: the server's --mtp-drafts decides

    def __post_init__(self) -> None:
        def num(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            return float(v)

        def integer(name: str, v) -> int:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {v!r}")
            return int(v)

        if num("temperature") < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < num("top_p") <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        k = integer("top_k", self.top_k)
        if k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or a positive integer, got {k}")
        if not 0 <= num("min_p") <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not 0 <= integer("seed", self.seed) <= MASK64:
            raise ValueError(f"seed must be in 0..2**64-1, got {self.seed}")
        if self.max_tokens is not None and integer("max_tokens", self.max_tokens) < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if integer("min_tokens", self.min_tokens) < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}")
        ids = tuple(integer("stop_token_ids", i) for i in (self.stop_token_ids or ()))
        for i in ids:
            if not 0 <= i < 2**32:
                raise ValueError(f"stop_token_ids must hold token ids >= 0, got {i}")
        if self.draft is not None and not isinstance(self.draft, bool):
            raise ValueError(f"draft must be true or false, got {self.draft!r}")
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not 0 <= integer(name, getattr(self, name)) <= 20:
                raise ValueError(f"{name} must be in 0..20, got {getattr(self, name)}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= num(name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < num("repetition_penalty") <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        bias = dict(self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias)
        for t, b in bias.items():
            if not 0 <= integer("logit_bias", t) < 2**31 or not -100.0 <= float(b) <= 100.0:
                raise ValueError(f"logit_bias must map token ids to biases in [-100, 100], got {t!r}: {b!r}")
        if self.guide is not None and (self.ignore_eos or self.min_tokens):
            raise ValueError("structured output cannot be combined with ignore_eos or min_tokens (EOS ends the match)")
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias.items())))
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", ids)
        object.__setattr__(self, "top_k", max(k, 0))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


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


# ---- the algorithm --------------------------------------------------------------------------------------------

def banned_ids(params: SamplingParams, n_generated: int, eos_ids: Iterable[int]) -> list[int]:
    """Ids masked to -inf while fewer than min_tokens tokens are generated (stop ids, and EOS unless ignored)."""
    if n_generated >= params.min_tokens:
        return []
    ids = list(params.stop_token_ids)
    if not params.ignore_eos:
        ids += list(eos_ids)
    return ids


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

    This is THE definition: `sample` (one request), `sample_rows` / NumpyOps.sample (a batch) and the kernel
    cuda_src/sample.cu (sample_rows) all follow it. The parameters are taken as float32 / int32 / uint64 as
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


def sample(logits: np.ndarray, params: SamplingParams, seed: int, position: int, n_generated: int = 0,
           eos_ids: Sequence[int] = ()) -> int:
    """One token from one row of logits [V] (module docstring); raises ValueError on NaN logits."""
    x = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
    if np.isnan(x).any():
        raise ValueError("logits hold NaN")
    ban = [i for i in banned_ids(params, n_generated, eos_ids) if 0 <= i < x.shape[0]]
    if ban:
        x[ban] = -np.inf
    return draw(x, 0.0 if params.greedy else params.temperature, params.top_k, params.top_p, params.min_p,
                seed, position)


# ---- stops ----------------------------------------------------------------------------------------------------

def token_finish(params: SamplingParams, token: int, n_generated: int, max_tokens: int,
                 eos_ids: Iterable[int]) -> str | None:
    """Finish reason after `token` became the n_generated-th generated token, or None to go on."""
    if n_generated > params.min_tokens:
        if token in params.stop_token_ids or (not params.ignore_eos and token in tuple(eos_ids)):
            return FINISH_STOP
    if n_generated >= max_tokens:
        return FINISH_LENGTH
    return None


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """Index where the earliest stop string match in text[start':] begins (start' lets a match straddle the
    previous end), or -1."""
    best = -1
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0 and (best < 0 or i < best):
            best = i
    return best


def holdback(stops: Sequence[str]) -> int:
    """Characters a stream keeps back while a stop string might still complete."""
    return max((len(s) for s in stops), default=1) - 1
