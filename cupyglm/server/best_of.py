"""`best_of`: b candidates a prompt, the n with the highest cumulative logprob returned.

Candidate i of a prompt is the same request with seed choice_seed(seed, i) (cupyglm.server.requests), so a
returned choice's tokens equal a single request with its seed. A candidate's score is the sum of its sampled
tokens' logprobs as `logprobs` reports them (the model's distribution from the fp32 logits the sampler draws
from, before temperature: cupyglm.backend.numpy_logprobs), summed left to right in float64; the n best are returned best
first (ties to the lower candidate), indexed prompt * n + rank. The engine computes the logprobs for the ranking
even when the request did not ask for them; they are then left out of the reply. Usage counts every candidate's
completion tokens (they were generated). Not streamed: a stream cannot take back the choices it has sent.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from cupyglm.server.responses import Reply


def score(r: Reply) -> float:
    """The candidate's cumulative logprob (-inf when a token had none)."""
    total = 0.0
    for _, lp, _ in r.logprobs or ():
        total += lp if lp is not None else -math.inf
    return total


def pick(replies: Sequence[Reply], per: int, n: int, asked_logprobs: bool) -> list[Reply]:
    """replies: `per` candidates for each prompt, in order -> the `n` best of each, reindexed."""
    out = []
    for j in range(0, len(replies), per):
        group = list(replies[j:j + per])
        ranked = sorted(range(len(group)), key=lambda i: (-score(group[i]), i))[:n]
        for rank, i in enumerate(ranked):
            r = dataclasses.replace(group[i], index=(j // per) * n + rank, counts_prompt=rank == 0)
            if not asked_logprobs:
                r.logprobs = None
            out.append(r)
    return out
