"""Rank 0's sampling of one step: every logits row of the step in one `ops.sample` call.

A plain group samples its last row at position `end`. A verify group's row j (token T or draft d_j fed at
start + j) samples the token at start + j + 1 exactly as serial decoding would there: the same (seed,
position) draw, min_tokens bans and penalties as if d_1..d_j were already generated (a row whose drafts before
it are rejected is never used, so only the rows serial decoding would reach count). `verify.accept` then takes
the longest agreeing prefix.

Structured output (`guides`, rank 0's grammar matchers): the masks started while the step ran are applied after
the penalties and before the bans; a guided request never drafts, so its group is one row.

min_tokens bans are logits edits before the op (a NaN stays NaN, so a NaN row is still refused); the tokens
come back to the host for the stops and the bookkeeping. The draw is engine/draw.py's (the one sampler): the
sampling parameters travel in one upload a step.

A plain step (`plain_rows`: graphs on, every group a decode/verify group whose rows have no penalties, grammar,
min_tokens bans or logprobs) hands its columns to the runner, whose captured exit draws the same tokens with the
same kernel on the same rows (engine/graph_ends.py, engine/draw.packed); the step then only reads them back.
"""
from __future__ import annotations

import numpy as np

from cupyglm.backend import numpy_penalties as penalties
from cupyglm.engine import draw
from cupyglm.engine.draw import SampleRows
from cupyglm.engine.logprobs import tokens_and_logprobs
from cupyglm.engine.request import EngineError
from cupyglm.engine.sampling import banned_ids
from cupyglm.engine.verify import accept


def sample_step(ops, cfg, plan, outs, reqs, seeds: dict, drafts: dict, guides=None, masks=None,
                plain: SampleRows | None = None):
    """-> ({request id: token, or the list of tokens of a verify group}, {request id: [(logprob, top)] per
    token} for requests that asked, [requests whose grammar failed]). `seeds`: request id -> its seed; `drafts`: rank 0's engine.verify Pending
    per verify group (its `tokens`: T, d1..dn); `masks`: the handle of `guides.start(sampled_rows(plan))`;
    `plain`: the step's `plain_rows`, whose tokens the forward drew when it set them."""
    rows = []                                   # (group, logits row, output before it, position)
    for g, out in zip(plan.groups, outs):
        if not g.logits:
            continue
        r = reqs[g.request_id]
        if g.drafts:
            d = drafts[g.request_id].tokens[1:]
            rows += [(g, out.logits[j], r.output + list(d[:j]), g.start + j + 1) for j in range(g.drafts + 1)]
        else:
            rows.append((g, out.logits[-1], r.output, g.end))
    if not rows:
        ops.raise_device_errors()
        return {}, {}, []
    if plain is not None and plain.tokens is not None:
        tokens, lps, failed = ops.asnumpy_checked(plain.tokens), {}, []
    else:
        tokens, lps, failed = _sample_rows(ops, cfg, rows, reqs, seeds, guides, masks)
    per_group: dict[int, list[int]] = {}
    lp_of: dict[int, list] = {}
    at: dict[int, int] = {}
    for i, ((g, _, _, position), tok) in enumerate(zip(rows, tokens)):
        at.setdefault(g.request_id, position)
        per_group.setdefault(g.request_id, []).append(int(tok))
        if i in lps:
            lp_of.setdefault(g.request_id, []).append(lps[i])
    sampled, logprobs = {}, {}
    for g in plan.groups:
        if g.request_id not in per_group:
            continue
        got = per_group[g.request_id]
        if g.drafts:
            sampled[g.request_id] = accept(drafts[g.request_id].tokens[1:], got)
        else:
            sampled[g.request_id] = got[0]
        toks = sampled[g.request_id] if g.drafts else [got[0]]
        if min(toks) < 0:                      # only rows serial decoding reaches are checked
            bad = at[g.request_id] + toks.index(min(toks))
            raise EngineError(f"request {g.request_id} at position {bad}: logits hold NaN")
        if g.request_id in lp_of:
            logprobs[g.request_id] = lp_of[g.request_id][:len(sampled[g.request_id]) if g.drafts else 1]
        if guides is not None and not g.drafts and not guides.consume(g.request_id, toks[0]):
            failed.append(g.request_id)
    return sampled, logprobs, failed


def _sample_rows(ops, cfg, rows, reqs, seeds, guides, masks) -> tuple:
    """Eager: the rows' logits stacked, penalties, grammar masks and min_tokens bans applied, then ops.sample
    (and logprobs where asked) -> (tokens [R] on the host, {row: (logprob, top)}, [requests whose grammar failed])."""
    xp = ops.xp
    logits = xp.stack([xp.asarray(lg, dtype=xp.float32).reshape(-1) for _, lg, _, _ in rows])
    vocab = logits.shape[1]
    pen = penalties.edits([(i, reqs[g.request_id].params, reqs[g.request_id].prompt, output)
                           for i, (g, _, output, _) in enumerate(rows) if penalties.wants(reqs[g.request_id].params)],
                          vocab)
    if pen is not None:                 # before the bans: a banned id stays -inf
        ops.penalize(logits, *pen.values())
    failed = guides.apply(ops, logits, masks, [g.request_id for g, *_ in rows]) if guides is not None else []
    params = []
    for i, (g, _, output, position) in enumerate(rows):
        r = reqs[g.request_id]
        p = r.params
        ban = [b for b in banned_ids(p, len(output), cfg.eos_token_ids) if 0 <= b < vocab]
        if ban:
            ban = xp.asarray(ban, dtype=xp.int64)
            cur = logits[i, ban]
            logits[i, ban] = xp.where(xp.isnan(cur), cur, xp.float32(-np.inf))
        params.append(_columns(r, seeds[g.request_id], position))
    drawn = draw.eager(ops, logits, params)
    tokens, lps = tokens_and_logprobs(ops, logits, drawn, [reqs[g.request_id].params.logprobs for g, *_ in rows])
    return tokens, lps, failed


def plain_rows(runner, plan, reqs, seeds, guides, cfg) -> SampleRows | None:
    """Rank 0: the step's sampling columns in the call's row order (each group's logits rows: a decode row, or
    a verify group's 1 + drafts rows at start + j + 1) when the runner replays graphs and no sampled row needs
    a logits edit or logprobs; else None (sample_step samples them)."""
    if runner.graphs is None or not plan.groups:
        return None
    params = []
    for g in plan.groups:
        r = reqs[g.request_id]
        p = r.params
        if not (g.decode and g.logits) or penalties.wants(p) or p.logprobs is not None or (
                guides is not None and g.request_id in guides):
            return None
        for j in range(g.drafts + 1):
            if banned_ids(p, len(r.output) + j, cfg.eos_token_ids):
                return None
            params.append(_columns(r, seeds[g.request_id], g.start + j + 1))
    return SampleRows(params)


def _columns(r, seed: int, position: int) -> tuple:
    """A row's (temperature, top_k, top_p, min_p, seed, position): ops.sample's columns (temperature 0: greedy)."""
    p = r.params
    return (0.0 if p.greedy else p.temperature, p.top_k, p.top_p, p.min_p, seed, position)


def sampled_rows(plan) -> list[int]:
    """The request id of each logits row `sample_step` samples, in its order (a verify group: 1 + drafts rows)."""
    return [g.request_id for g in plan.groups if g.logits for _ in range(g.drafts + 1)]
