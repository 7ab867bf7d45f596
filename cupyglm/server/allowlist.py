"""The one allow-list of request fields: every field of a chat or completion request is in exactly one list.

IMPLEMENTED: validated and honoured (cupyglm.server.requests). IGNORED: accepted and dropped because it cannot
change the output (accounting, storage, scheduling hints of a server whose output does not depend on the batch).
REFUSED: a field this server does not build yet; it is accepted only with its neutral value (the value that
means "off", e.g. `n: 1`, `use_beam_search: false`) and otherwise answered 400 `unsupported_parameter` naming it.
A field in no list is answered 400 `unknown_parameter` naming it, so nothing that could change the output is ever
silently ignored.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cupyglm.server.errors import bad

_COMMON_IMPLEMENTED = frozenset({
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens", "n", "return_token_ids", "cache_salt",
    "draft", "max_completion_tokens", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logit_bias", "prompt_logprobs", "best_of", "response_format", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar",
})
CHAT_IMPLEMENTED = _COMMON_IMPLEMENTED | {"messages", "chat_template_kwargs", "top_logprobs", "tools", "tool_choice",
                                          "add_generation_prompt", "reasoning_effort", "thinking",
                                          "parallel_tool_calls"}
COMPLETION_IMPLEMENTED = _COMMON_IMPLEMENTED | {"prompt", "echo"}

# name -> why it cannot change the output
IGNORED: dict[str, str] = {
    "user": "an end-user id for the provider's abuse tracking",
    "safety_identifier": "an end-user id for the provider's abuse tracking",
    "metadata": "tags stored with the request",
    "store": "whether the provider stores the reply",
    "service_tier": "a billing / latency tier; every request here is served the same way",
    "prompt_cache_key": "a routing hint for the provider's prompt cache; cached prompts give the same tokens",
    "prompt_cache_retention": "how long the provider keeps cached prompts; cached prompts give the same tokens",
    "prompt_cache_options": "the provider's prompt-cache settings; cached prompts give the same tokens",
    "priority": "a scheduling priority; outputs do not depend on the batch (concurrent = solo)",
    "request_id": "a client-chosen id for logs",
}


def _off(v: Any) -> bool:
    return v is None or v is False or v == [] or v == {} or v == ""


def _is(*neutral: float) -> Callable[[Any], bool]:
    """Neutral when absent or a number equal to one of `neutral` (a boolean is not a number here)."""
    return lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v in neutral)


# name -> (is the value neutral, what to tell the client)
_COMMON_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "use_beam_search": (_off, ""),
    "length_penalty": (_is(1, 1.0), "only 1 (it applies to beam search)"),
    "include_stop_str_in_output": (_off, ""),
    "spaces_between_special_tokens": (lambda v: v is None or v is True, "only true"),
    "truncate_prompt_tokens": (_is(), ""),
    "allowed_token_ids": (_is(), ""),
    "bad_words": (_off, ""),
    "add_special_tokens": (_is(), ""),
    "guided_decoding_backend": (_is(), "the server's grammar library is llguidance"),
    "guided_whitespace_pattern": (_is(), "JSON is generated compact"),
    "structural_tag": (_is(), ""),
    "logits_processors": (_off, ""),
    "return_tokens_as_token_ids": (_off, ""),
    "kv_transfer_params": (_is(), ""),
    "vllm_xargs": (_off, ""),
    "mm_processor_kwargs": (_off, ""),
}
CHAT_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    **_COMMON_REFUSED,
    "functions": (_off, ""),
    "function_call": (lambda v: v is None or v in ("none", "auto"), ""),
    "audio": (_is(), ""),
    "modalities": (lambda v: v is None or v == ["text"], "only ['text']"),
    "prediction": (_is(), ""),
    "verbosity": (_is(), ""),
    "web_search_options": (_is(), ""),
    "moderation": (_is(), ""),
    "echo": (_off, ""),
    "continue_final_message": (_off, ""),
    "documents": (_is(), ""),
    "chat_template": (_is(), ""),
}
COMPLETION_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    **_COMMON_REFUSED,
    "suffix": (_off, ""),
    "prompt_embeds": (_is(), ""),
}

# stream_options: sub-field -> the list it is in
STREAM_OPTIONS_IMPLEMENTED = frozenset({"include_usage", "continuous_usage_stats"})
STREAM_OPTIONS_IGNORED = {"include_obfuscation": "random padding of SSE frames against side channels"}


def lists(kind: str) -> tuple[frozenset[str], dict[str, str], dict[str, tuple[Callable[[Any], bool], str]]]:
    """(implemented, ignored, refused) for kind "chat" | "completion"."""
    if kind == "chat":
        return CHAT_IMPLEMENTED, IGNORED, CHAT_REFUSED
    return COMPLETION_IMPLEMENTED, IGNORED, COMPLETION_REFUSED


def check_fields(body: Mapping, kind: str) -> None:
    """400 naming the first field of `body` that is refused with a non-neutral value or is in no list."""
    implemented, ignored, refused = lists(kind)
    for name, value in body.items():
        if name in implemented or name in ignored:
            continue
        rule = refused.get(name)
        if rule is None:
            raise bad(name, f"'{name}' is not a known field of a {kind} request; remove it",
                      "unknown_parameter")
        neutral, note = rule
        if not neutral(value):
            raise bad(name, f"'{name}' is not supported yet" + (f" ({note})" if note else ""),
                      "unsupported_parameter")
    so = body.get("stream_options")
    if isinstance(so, dict):
        for name in so:
            if name not in STREAM_OPTIONS_IMPLEMENTED and name not in STREAM_OPTIONS_IGNORED:
                raise bad(f"stream_options.{name}", f"'stream_options.{name}' is not a known stream option",
                          "unknown_parameter")
