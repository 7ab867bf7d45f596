"""Rank 0's outputs of a step: one RequestOutput per request from the scheduler's events, in order.

What must stay true: the text a client sees is what serial decoding would give. A verify group gives several
tokens in one step; a stop string ends the request at the token that completes it and the tokens after it
are dropped from the request's output (`texts`, `logprobs`, `prompt_lp` are the engine's per-request maps,
consumed here).
"""
from __future__ import annotations

from cupyglm.engine.request import RequestOutput
from cupyglm.engine.sampling import FINISH_STOP


def step_outputs(events, drafted: dict[int, tuple[int, int]], texts: dict, logprobs: dict, prompt_lp: dict,
                 scheduler, guides, drafts_on: bool) -> list[RequestOutput]:
    """One output per request from its events in order (a verify group gives several tokens); a stop
    string ends a request at its token, dropping the tokens after it, as serial decoding would."""
    out, by_id, base = [], {}, {}
    for r, _, _ in events:
        base[r.id] = base.get(r.id, len(r.output)) - 1
    for r, tok, reason in events:
        if r.id in by_id and by_id[r.id].finished:
            continue
        base[r.id] += 1
        done = base[r.id] + 1                               # tokens generated with this one
        text = texts.get(r.id)
        finished = reason is not None
        if text is not None:
            include = reason != FINISH_STOP                 # a stop id / EOS adds no text
            if text.push(tok, finished, include) and not finished:
                scheduler.finish(r.id, FINISH_STOP)
                finished, reason = True, FINISH_STOP
                del r.output[done:]
            elif text.stopped:
                reason = FINISH_STOP                        # the last token also completed a stop string
                r.finish_reason = reason
            piece = text.take(finished)
        else:
            piece = ""
        if finished:
            texts.pop(r.id, None)
            guides.drop(r.id)
        lps = logprobs.get(r.id)
        lp = lps.pop(0) if lps else None
        o = by_id.get(r.id)
        if o is None:
            on = drafts_on and r.params.draft is not False
            o = by_id[r.id] = RequestOutput(r.id, [], "", False, None, r.prompt_len, 0, r.cached,
                                            None if r.cached else r.miss_reason,
                                            prompt_logprobs=prompt_lp.pop(r.id, None),
                                            draft=drafted.get(r.id, (0, 0)) if on else None)
            out.append(o)
        o.new_token_ids.append(tok)
        o.new_text += piece
        o.finished, o.finish_reason, o.completion_tokens = finished, reason, done
        if lp is not None:
            o.logprobs = (o.logprobs or []) + [lp]
    return out
