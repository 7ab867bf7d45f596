"""Prompt logprobs (`echo` with logprobs, vLLM's `prompt_logprobs`): the logprob of every prompt token given the
tokens before it, from the prompt chunks' own logits rows (the model is asked for every row of those chunks).

Row j of a chunk fed at positions start.. predicts the prompt token at start + j + 1; the chunk's last row at
the prompt's end predicts the first generated token (that one is the sampler's, with the sampled logprobs).
The values come from `ops.logprobs` on the raw fp32 logits (no penalty, ban or temperature: the model's own
distribution), every prompt row of a step in one call and one copy back. Prompt token 0 has none. A prompt
restored from a cache has no logits: such a request must re-feed its prompt (it asks for every row here).
"""
from __future__ import annotations

import numpy as np

from cupyglm.engine.logprobs import unpack


def wants(params) -> bool:
    return params.prompt_logprobs is not None


def collect(ops, groups, outs, reqs) -> dict[int, list[tuple[int, float, list]]]:
    """(request id -> [(prompt token, logprob, top)]) for the prompt chunks of a step whose requests asked."""
    xp = ops.xp
    picks, meta = [], []
    for g, out in zip(groups, outs):
        r = reqs[g.request_id]
        if g.decode or not wants(r.params):
            continue
        n = min(g.count, r.prompt_len - 1 - g.start)        # rows with a next prompt token
        if n <= 0:
            continue
        picks.append(xp.asarray(out.logits[:n], dtype=xp.float32).reshape(n, -1))
        targets = r.prompt[g.start + 1:g.start + 1 + n]
        meta.append((g.request_id, r.params.prompt_logprobs, list(targets)))
    if not picks:
        return {}
    logits = xp.concatenate(picks, axis=0)
    targets = np.concatenate([np.asarray(t, dtype=np.int32) for _, _, t in meta])
    top = max(k for _, k, _ in meta)
    packed = ops.asnumpy(ops.logprobs(logits, targets, top))
    got: dict[int, list] = {}
    row = 0
    for rid, k, tgt in meta:
        for t in tgt:
            lp, tops = unpack(packed, row, k)
            got.setdefault(rid, []).append((int(t), lp, tops))
            row += 1
    return got
