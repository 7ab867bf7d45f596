"""The OpenAI shapes of logprobs: chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` and completions'
`{tokens, token_logprobs, top_logprobs, text_offset}`, from the engine's per-token (id, logprob, top) entries.

A token's text is its own decode (a piece of a multi-byte character decodes to U+FFFD; `bytes` holds that
text's UTF-8). Logprobs are the model's (before temperature), a banned id's -inf written as -9999.0.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

Entry = tuple[int, float, list[tuple[int, float]]]      # (token id, logprob, [(id, logprob)] top k); echo's
                                                        # prompt token 0: (id, None, None)


def chat_logprobs(entries: Sequence[Entry], text_of: Callable[[int], str]) -> dict:
    def item(tid: int, lp: float) -> dict:
        s = text_of(tid)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return {"content": [{**item(t, lp), "top_logprobs": [item(i, v) for i, v in top]} for t, lp, top in entries]}


def completion_logprobs(entries: Sequence[Entry], text_of: Callable[[int], str], offset: int = 0) -> dict:
    tokens, offsets = [], []
    for t, _, _ in entries:
        s = text_of(t)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [None if top is None else {text_of(i): v for i, v in top} for _, _, top in entries],
            "text_offset": offsets}
