"""Logprobs on the engine side: one step's drawn tokens and packed logprobs back in one copy, and replies' values.

The op `logprobs` and its packed layout [R, 2 + 2K] are defined in cupyglm.backend.numpy_logprobs.
"""
from __future__ import annotations

import numpy as np

FLOOR = -9999.0         # what a reply says for -inf (a banned id): JSON has no infinity (vLLM's value)


def tokens_and_logprobs(ops, logits, drawn, tops: list[int | None]) -> tuple[np.ndarray, dict[int, tuple]]:
    """The step's drawn tokens on the host and, for each row i whose request asked (tops[i] not None), its
    (logprob, top) from `ops.logprobs` on the same logits: tokens, logprobs and the step's device-check flags come
    back in one copy."""
    if all(t is None for t in tops):
        return ops.asnumpy_checked(drawn), {}
    packed = ops.asnumpy_checked(ops.logprobs(logits, drawn, max(t for t in tops if t is not None)))
    return packed[:, 0], {i: unpack(packed, i, t) for i, t in enumerate(tops) if t is not None}


def unpack(packed: np.ndarray, row: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """Row `row` of a packed array: (the sampled token's logprob, its top min(k, K) (id, logprob) pairs)."""
    w = packed.shape[1]
    kk = (w - 2) // 2
    vals = packed[row].view(np.float32)
    tops = [(int(packed[row, 2 + j]), _floor(vals[2 + kk + j])) for j in range(min(k, kk))]
    return _floor(vals[1]), tops


def _floor(v) -> float:
    return max(float(v), FLOOR)
