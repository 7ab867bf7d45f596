"""Presence, frequency and repetition penalties and logit_bias: deterministic edits of a step's logits rows.

The NumPy definition of cuda_src/penalties.cu (same float32 steps, see there). The host lists the edits of a
step, one per distinct (row, token id) a request has seen (prompt or output, for the repetition penalty),
generated (presence, frequency) or biased; the op applies them in place before the min_tokens bans and the
draw, so the sampler and the logprobs see the edited logits. A row's edits depend on its request only.

    repetition (vLLM / Hugging Face): x > 0 ? x / r : x * r, for ids in the prompt or the output
    frequency, presence (OpenAI):     x - frequency * count - presence, for ids in the output
    logit_bias (OpenAI):              x + bias
"""
from __future__ import annotations

from collections import Counter

import numpy as np

THREADS = 256            # cuda_src/penalties.cu PN_THREADS


def wants(params) -> bool:
    """Whether sampling parameters (fields presence_penalty, frequency_penalty, repetition_penalty, logit_bias)
    edit any logit."""
    return bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
                or params.logit_bias)


def edits(rows: list[tuple[int, object, tuple[int, ...], list[int]]], vocab: int) -> dict | None:
    """The edits of a step: rows = [(row index, params, prompt, output)] of the rows that want them -> the
    op's arrays (row, id, count, seen, bias [N]; repetition, frequency, presence [R] for R = max row + 1)."""
    if not rows:
        return None
    r_count = max(i for i, *_ in rows) + 1
    rep = np.ones(r_count, np.float32)
    freq = np.zeros(r_count, np.float32)
    pres = np.zeros(r_count, np.float32)
    cols: list[list] = [[], [], [], [], []]
    for i, p, prompt, output in rows:
        rep[i], freq[i], pres[i] = p.repetition_penalty, p.frequency_penalty, p.presence_penalty
        counts = Counter(output)
        seen = set(counts)
        if p.repetition_penalty != 1.0:
            seen |= set(prompt)
        bias = dict(p.logit_bias)
        for t in sorted(seen | set(bias)):
            if 0 <= t < vocab:
                for col, v in zip(cols, (i, t, counts.get(t, 0), int(t in seen), bias.get(t, 0.0))):
                    col.append(v)
    row, ids, cnt, sn, b = (np.array(c, dtype=dt) for c, dt in
                             zip(cols, (np.int32, np.int32, np.int32, np.int32, np.float32)))
    return dict(row=row, id=ids, count=cnt, seen=sn, bias=b, repetition=rep, frequency=freq, presence=pres)


def penalize_rows(logits: np.ndarray, row, id, count, seen, bias, repetition, frequency, presence) -> None:
    """The edits applied to logits [R, V] f32 in place (cuda_src/penalties.cu penalize_rows)."""
    if len(row) == 0:
        return
    x = logits[row, id].astype(np.float32)
    rp = repetition[row]
    nan = np.isnan(x)
    rep = (seen != 0) & (rp != np.float32(1.0))
    x = np.where(rep, np.where(x > 0, x / rp, x * rp), x).astype(np.float32)
    c = count.astype(np.float32)
    x = np.where(count > 0, (x - frequency[row] * c) - presence[row], x).astype(np.float32)
    x = (x + bias).astype(np.float32)
    logits[row, id] = np.where(nan, logits[row, id], x)
