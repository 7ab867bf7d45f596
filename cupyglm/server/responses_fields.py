"""The allow-list of a `POST /v1/responses` body: every field in exactly one list, as for chat
(cupyglm.server.allowlist): implemented, ignored, or refused with anything but its neutral value; any other field
is 400 unknown_parameter naming it. Nothing is stored: `store` is accepted and nothing is kept, a
`previous_response_id` (or `conversation`) is refused by name.
"""
from __future__ import annotations

from collections.abc import Mapping

from cupyglm.server.allowlist import IGNORED, _is, _off
from cupyglm.server.errors import bad
from cupyglm.server.fields import json_kind, shown

# Responses field -> the chat field it becomes (validated there)
PASSED = {"model": "model", "stream": "stream", "temperature": "temperature", "top_p": "top_p",
          "max_output_tokens": "max_tokens", "parallel_tool_calls": "parallel_tool_calls",
          # vLLM's extra sampling parameters of its Responses API
          "seed": "seed", "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
          "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
          "stop": "stop", "cache_salt": "cache_salt"}
IMPLEMENTED = frozenset(PASSED) | {"input", "instructions", "tools", "tool_choice", "text", "reasoning",
                                   "stream_options", "include"}
RESPONSES_IGNORED = {
    **{k: v for k, v in IGNORED.items() if k not in PASSED},
    "prompt_cache_options": "the provider's prompt-cache settings; cached prompts give the same tokens",
    "store": "whether the provider stores the reply; this server stores nothing",
}
REFUSED = {
    "previous_response_id": (_is(), "nothing is stored; send the whole conversation in 'input'"),
    "conversation": (_is(), "nothing is stored; send the whole conversation in 'input'"),
    "background": (_off, ""),
    "truncation": (lambda v: v in (None, "disabled"), "only 'disabled'"),
    "top_logprobs": (_is(0), ""),
    "max_tool_calls": (_is(), ""),
    "prompt": (_is(), ""),
    "context_management": (_off, ""),
    "moderation": (_is(), ""),
    "access_programs": (_is(), ""),
    "background_options": (_is(), ""),
    "image": (_is(), ""),
}

def check_responses_fields(body: Mapping) -> None:
    """400 naming the first field that is refused with a non-neutral value or is in no list."""
    for name, value in body.items():
        if name in IMPLEMENTED or name in RESPONSES_IGNORED:
            continue
        rule = REFUSED.get(name)
        if rule is None:
            raise bad(name, f"'{name}' is not a known field of a responses request; remove it", "unknown_parameter")
        neutral, note = rule
        if not neutral(value):
            raise bad(name, f"'{name}' is not supported" + (f" ({note})" if note else ""), "unsupported_parameter")
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("stream_options", f"'stream_options' must be an object, got {json_kind(so)}", "invalid_type")
        for k in so:
            if k != "include_obfuscation":
                raise bad(f"stream_options.{k}", f"'stream_options.{k}' is not a known stream option",
                          "unknown_parameter")
    include = body.get("include")
    if include is not None and include != []:
        if not isinstance(include, list):
            raise bad("include", f"'include' must be an array, got {json_kind(include)}", "invalid_type")
        raise bad("include", f"'include' = {shown(include)}: no extra output data is built yet; send []",
                  "unsupported_parameter")
