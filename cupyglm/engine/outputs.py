"""Rank 0's outputs of a step: one RequestOutput per request from the scheduler's events, in order.

What must stay true: the text a client sees is what serial decoding would give. A verify group gives several
tokens in one step; a stop string ends the request at the token that completes it and the tokens after it
are dropped from the request's output. Every request that finishes here ends through the front end's one
`end` (`cupyglm.engine.frontend`); its record (text, logprobs, prompt logprobs, drafts) is read here.
"""
from __future__ import annotations

from cupyglm.engine.request import RequestOutput
from cupyglm.engine.sampling import FINISH_STOP


def step_outputs(events, records: dict, end, drafts_on: bool) -> list[RequestOutput]:
    """One output per request from its events in order (a verify group gives several tokens); a stop
    string ends a request at its token, dropping the tokens after it, as serial decoding would.
    `records`: the live requests' records; `end(record, reason)`: the front end's one end."""
    out, by_id, base = [], {}, {}
    for r, _, _ in events:
        base[r.id] = base.get(r.id, len(r.output)) - 1
    for r, tok, reason in events:
        o = by_id.get(r.id)
        if o is not None and o.finished:
            continue
        rec = records[r.id]
        base[r.id] += 1
        done = base[r.id] + 1                               # tokens generated with this one
        finished = reason is not None
        include = reason != FINISH_STOP                     # a stop id / EOS adds no text
        if rec.text.push(tok, finished, include) and not finished:
            finished, reason = True, FINISH_STOP            # a stop string: the tokens after it are dropped
            del r.output[done:]
        elif rec.text.stopped:
            reason = FINISH_STOP                            # the last token also completed a stop string
        piece = rec.text.take(finished)
        if finished:
            end(rec, reason)
        lp = rec.logprobs.pop(0) if rec.logprobs else None
        if o is None:
            on = drafts_on and r.params.draft is not False
            o = by_id[r.id] = RequestOutput(r.id, [], "", False, None, r.prompt_len, 0, r.cached,
                                            None if r.cached else r.miss_reason,
                                            prompt_logprobs=rec.take_prompt_logprobs(),
                                            draft=rec.drafts if on else None)
            out.append(o)
        o.new_token_ids.append(tok)
        o.new_text += piece
        o.finished, o.finish_reason, o.completion_tokens = finished, reason, done
        if lp is not None:
            o.logprobs = (o.logprobs or []) + [lp]
    return out
