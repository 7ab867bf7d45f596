"""Sampling: a request's parameters, its min_tokens bans, the one-request draw and the stop rules.

The draw itself (the counter-based RNG and the fp32 algorithm, steps 1-7) is defined in
cupyglm.backend.numpy_sample, the reference of the op `sample`. Step 0, the min_tokens bans, is `banned_ids`
here: while fewer than min_tokens tokens are generated, x[id] = -inf for every stop token id and, unless
ignore_eos, every EOS id. `sample` is one request (bans + draw, for tests and tools). A request without a seed
gets one from the engine: (settings.seed + request counter).

Stops: a stop token id or an EOS id (unless ignore_eos) ends the request with "stop" once min_tokens tokens
came before it; max_tokens ends it with "length"; a stop string (matched on rank 0's detokenized text) ends it
with "stop" and the text is cut before the match (OpenAI/vLLM behaviour; the token ids keep every token).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from cupyglm.backend.numpy_sample import GREEDY_EPS, MASK64, draw

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
    presence_penalty: float = 0.0         # -2..2, ids in the output (cupyglm.backend.numpy_penalties)
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


# ---- bans and one request's draw --------------------------------------------------------------------------------

def banned_ids(params: SamplingParams, n_generated: int, eos_ids: Iterable[int]) -> list[int]:
    """Ids masked to -inf while fewer than min_tokens tokens are generated (stop ids, and EOS unless ignored)."""
    if n_generated >= params.min_tokens:
        return []
    ids = list(params.stop_token_ids)
    if not params.ignore_eos:
        ids += list(eos_ids)
    return ids


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
