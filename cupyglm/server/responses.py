"""The OpenAI reply shapes: chat/completion responses, streamed chunks, usage, the model list, the tokenizer info,
ids and token_sha."""
from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cupyglm.server.logprob_shapes import chat_logprobs, completion_logprobs

if TYPE_CHECKING:
    from cupyglm.server.requests import ModelInfo


def token_sha(ids: Sequence[int]) -> str:
    """First 12 hex chars of SHA-256 over the token ids joined by commas (the receipts' exactness hash)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:12]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, miss: str | None = None,
          draft: tuple[int, int] | None = None) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if miss and not cached_tokens:
        out["cache_miss_reason"] = miss          # why nothing was restored from the prompt cache
    if draft is not None:                        # the request drafted: MTP drafts verified and accepted
        out["draft_tokens"] = {"proposed": draft[0], "accepted": draft[1]}
    return out


@dataclasses.dataclass
class Reply:
    """What one finished request produced (filled by the app from the bridge's outputs)."""

    id: str
    model: str
    created: int
    prompt_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    cached_tokens: int = 0
    cache_miss_reason: str | None = None
    logprobs: list | None = None     # [(token id, logprob, top)] when asked (logprob_shapes.Entry)
    prompt_lp: list | None = None    # [(prompt token, logprob, top)] from prompt token 1, when asked
    echo_text: str | None = None     # completion echo: the prompt's text, put before the reply's
    glm: Any = None                  # chat: the GlmOutput splitting reasoning / content / tool calls
    fields: dict = dataclasses.field(default_factory=dict)    # chat: the delta fields of the last add
    index: int = 0                   # the choice's index in the reply
    counts_prompt: bool = True       # the first choice of its prompt: its prompt counts in usage
    draft: tuple[int, int] | None = None   # (MTP drafts proposed, accepted) when the request drafted

    def usage(self) -> dict:
        return usage(len(self.prompt_ids), len(self.token_ids), self.cached_tokens, self.cache_miss_reason,
                     self.draft)

    def add(self, delta) -> None:
        """Fold one engine step's Delta for this request into the reply."""
        self.token_ids.extend(delta.token_ids)
        self.text += delta.text
        self.cached_tokens = delta.cached_tokens or self.cached_tokens
        self.cache_miss_reason = getattr(delta, "cache_miss_reason", None) or self.cache_miss_reason
        step = getattr(delta, "draft", None)
        if step is not None:
            self.draft = (step[0] + (self.draft or (0, 0))[0], step[1] + (self.draft or (0, 0))[1])
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + entries(delta)
        if delta.prompt_logprobs is not None:
            self.prompt_lp = list(delta.prompt_logprobs)
        if delta.finished:
            self.finish_reason = delta.finish_reason or "stop"
        if self.glm is not None:
            self.fields = {}
            for part in self.glm.feed(delta.text, final=bool(delta.finished)):
                for k, v in part.items():
                    self.fields[k] = self.fields.get(k, [] if k == "tool_calls" else "") + v
            if delta.finished and self.glm.calls and self.finish_reason == "stop":
                self.finish_reason = "tool_calls"

    def echo_entries(self) -> list:
        """The prompt's logprob entries as echo shows them: token 0 has none."""
        return [(self.prompt_ids[0], None, None)] + list(self.prompt_lp or [])


def entries(delta) -> list:
    """A Delta's logprobs as (token id, logprob, top) entries."""
    return [(t, lp, top) for t, (lp, top) in zip(delta.token_ids, delta.logprobs or ())]


def prompt_only(delta):
    """A Delta of an echo-only request (max_tokens 0) with the token it generated dropped: the prompt's logprobs,
    the cache counts and the end ("length") stay."""
    return dataclasses.replace(delta, token_ids=[], text="", draft=None,
                               logprobs=None if delta.logprobs is None else [],
                               finish_reason="length" if delta.finished else None)


def usage_of(replies: Sequence[Reply]) -> dict:
    """Usage over every choice: each prompt counted once, every choice's completion tokens."""
    misses = [r.cache_miss_reason for r in replies if r.counts_prompt and r.cache_miss_reason]
    return usage(sum(len(r.prompt_ids) for r in replies if r.counts_prompt),
                 sum(len(r.token_ids) for r in replies),
                 sum(r.cached_tokens for r in replies if r.counts_prompt), misses[0] if misses else None,
                 _draft_sum(replies))


def _draft_sum(replies: Sequence[Reply]) -> tuple[int, int] | None:
    drafted = [r.draft for r in replies if r.draft is not None]
    return (sum(d[0] for d in drafted), sum(d[1] for d in drafted)) if drafted else None


def _many(r: Reply | Sequence[Reply]) -> list[Reply]:
    return [r] if isinstance(r, Reply) else list(r)


def _response(rs: list[Reply], obj: str, choices: list[dict[str, Any]], return_token_ids: bool) -> dict:
    for r, choice in zip(rs, choices):
        if return_token_ids:
            choice["token_ids"] = list(r.token_ids)
            choice["prompt_token_ids"] = list(r.prompt_ids)
        if len(rs) > 1:
            choice["token_sha"] = token_sha(r.token_ids)
    r0 = rs[0]
    return {"id": r0.id, "object": obj, "created": r0.created, "model": r0.model,
            "choices": choices, "usage": usage_of(rs), "token_sha": token_sha(r0.token_ids)}


def chat_response(replies: Reply | Sequence[Reply], return_token_ids: bool, text_of=None) -> dict:
    rs = _many(replies)
    choices = [{"index": r.index, "message": r.glm.message() if r.glm is not None else
                {"role": "assistant", "content": r.text},
                "logprobs": _lp("chat", r.logprobs, text_of), "finish_reason": r.finish_reason} for r in rs]
    for r, c in zip(rs, choices):
        if r.prompt_lp is not None:
            c["prompt_logprobs"] = prompt_logprobs_of(r, text_of)
    return _response(rs, "chat.completion", choices, return_token_ids)


def completion_response(replies: Reply | Sequence[Reply], return_token_ids: bool, text_of=None) -> dict:
    rs = _many(replies)
    choices = []
    for r in rs:
        ents = r.logprobs
        if r.echo_text is not None and ents is not None:
            ents = r.echo_entries() + ents
        choices.append({"index": r.index, "text": (r.echo_text or "") + r.text,
                        "logprobs": _lp("completion", ents, text_of), "finish_reason": r.finish_reason})
    for r, c in zip(rs, choices):
        if r.prompt_lp is not None:
            c["prompt_logprobs"] = prompt_logprobs_of(r, text_of)
    return _response(rs, "text_completion", choices, return_token_ids)


def prompt_logprobs_of(r: Reply, text_of) -> list:
    """vLLM's `prompt_logprobs`: None for token 0, then {id: {logprob, rank, decoded_token}} per prompt token
    (the token itself and the top k; rank given for the top k, 1-based)."""
    out: list = [None]
    for t, lp, top in r.prompt_lp or []:
        d = {str(t): {"logprob": lp, "decoded_token": text_of(t)}}
        for j, (i, v) in enumerate(top):
            d[str(i)] = {"logprob": v, "rank": j + 1, "decoded_token": text_of(i)}
        out.append(d)
    return out


def _lp(kind: str, ents, text_of, offset: int = 0):
    if ents is None:
        return None
    if kind == "chat":
        return chat_logprobs(ents, text_of)
    return completion_logprobs(ents, text_of, offset)


def chunk(kind: str, r: Reply, *, text: str, token_ids: Sequence[int] | None = None, first: bool = False,
          finish_reason: str | None = None, prompt_ids: Sequence[int] | None = None, logprobs=None,
          text_of=None, text_offset: int = 0) -> dict:
    """One streamed chunk: chat deltas (with `role` in the first) or completion text."""
    if kind == "chat":
        fields = r.fields if r.glm is not None else {"content": text}
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if "content" in fields or len(fields) == 0:
            delta["content"] = fields.get("content", "")
        delta.update((k, v) for k, v in fields.items() if k != "content")
        choice: dict[str, Any] = {"index": r.index, "delta": delta, "logprobs": _lp(kind, logprobs, text_of),
                                  "finish_reason": finish_reason}
    else:
        choice = {"index": r.index, "text": text, "logprobs": _lp(kind, logprobs, text_of, text_offset),
                  "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    out: dict[str, Any] = {"id": r.id, "object": _chunk_object(kind), "created": r.created, "model": r.model,
                           "choices": [choice]}
    if prompt_ids is not None:
        out["prompt_token_ids"] = list(prompt_ids)
    if finish_reason is not None:
        out["token_sha"] = token_sha(r.token_ids)
    return out


def usage_chunk(kind: str, replies: Reply | Sequence[Reply]) -> dict:
    rs = _many(replies)
    r = rs[0]
    return {"id": r.id, "object": _chunk_object(kind), "created": r.created, "model": r.model, "choices": [],
            "usage": usage_of(rs)}


def _chunk_object(kind: str) -> str:
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


def model_card(info: ModelInfo, root: str, created: int) -> dict:
    return {"id": info.served_id, "object": "model", "created": created, "owned_by": "cupyglm", "root": root,
            "parent": None, "max_model_len": info.max_model_len}


def tokenizer_info_of(tokenizer: Any, info: ModelInfo) -> dict:
    """What vLLM's /tokenizer_info returns: the tokenizer's config (tokenizer_config.json) with its class, the
    chat template and the context length filled in."""
    out = {k: v for k, v in tokenizer.config.items() if k != "added_tokens_decoder"}
    out.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    out["chat_template"] = tokenizer.chat_template
    out["model_max_length"] = info.max_model_len
    return out


def models_response(info: ModelInfo, root: str, created: int) -> dict:
    return {"object": "list", "data": [model_card(info, root, created)]}
