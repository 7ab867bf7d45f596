"""Refusal by name of known OpenAI fields that would change the output but are not built yet.

Such fields (logprobs, penalties, drafts, ...) are never accepted and ignored; fields that change nothing (`user`,
`metadata`, ...) and unknown extension fields are accepted as vLLM does.
"""
from __future__ import annotations

from collections.abc import Mapping

from cupyglm.server.errors import ApiError, bad
from cupyglm.server.fields import get_bool, get_dict, get_float, get_int, get_list, get_str, json_kind


def _unsupported(param: str, what: str = "") -> ApiError:
    return bad(param, f"'{param}' is not supported yet{what}", "unsupported_parameter")


def refuse_unsupported(body: Mapping, kind: str) -> None:
    """400 unsupported_parameter for the first field of a `kind` ("chat" | "completion") request not built yet."""
    # n / best_of: one choice per request
    n = get_int(body, "n", 1, lo=1)
    if n != 1:
        raise bad("n", f"'n' = {n} is not supported: only n = 1", "unsupported_parameter")
    best_of = get_int(body, "best_of", 1, lo=1)
    if best_of != 1:
        raise bad("best_of", f"'best_of' = {best_of} is not supported: only 1", "unsupported_parameter")
    # logprobs in every shape
    if kind == "chat":
        if get_bool(body, "logprobs", False):
            raise _unsupported("logprobs")
    elif (lp := body.get("logprobs")) is not None:
        if isinstance(lp, bool) or not isinstance(lp, int):
            raise bad("logprobs", f"'logprobs' must be an integer, got {json_kind(lp)}", "invalid_type")
        raise _unsupported("logprobs")
    for name in ("top_logprobs", "prompt_logprobs"):
        if body.get(name) is not None:
            raise _unsupported(name)
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_float(body, name, 0.0, lo=-2.0, hi=2.0)
        if v != 0.0:
            raise _unsupported(name, " (only 0)")
    rp = get_float(body, "repetition_penalty", 1.0, lo=0.0, hi=10.0)
    if rp != 1.0:
        raise _unsupported("repetition_penalty", " (only 1)")
    if get_dict(body, "logit_bias"):
        raise _unsupported("logit_bias")
    if get_dict(body, "response_format").get("type", "text") != "text":
        raise _unsupported("response_format", " (only type 'text')")
    if kind == "chat":
        if get_list(body, "tools"):
            raise _unsupported("tools")
        tc = body.get("tool_choice")
        if tc is not None and tc not in ("none", "auto"):
            raise _unsupported("tool_choice")
    else:
        if get_bool(body, "echo", False):
            raise _unsupported("echo")
        if get_str(body, "suffix"):
            raise _unsupported("suffix")
    d = get_bool(body, "draft", False)
    if d:
        raise bad("draft", "'draft': true is not supported yet (MTP drafts are not available); send false",
                  "unsupported_parameter")
