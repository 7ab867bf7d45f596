"""The thinking switch of a chat request: `reasoning_effort` (OpenAI), `thinking` (z.ai) and
`chat_template_kwargs.enable_thinking` (vLLM), each mapped onto the one template flag `enable_thinking`.

GLM thinks or does not; it has no effort levels: "none" / "minimal" turn thinking off, "low" / "medium" / "high" /
"xhigh" / "max" turn it on. Two of these fields that disagree are refused naming the second.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cupyglm.server.errors import bad
from cupyglm.server.fields import json_kind, shown

EFFORT_OFF = ("none", "minimal")
EFFORT_ON = ("low", "medium", "high", "xhigh", "max")
THINKING_TYPES = {"enabled": True, "disabled": False}


def effort_thinking(v: Any, param: str) -> bool | None:
    """An effort level as the thinking flag; None when not given."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad(param, f"'{param}' must be a string, got {json_kind(v)}", "invalid_type")
    if v in EFFORT_OFF:
        return False
    if v in EFFORT_ON:
        return True
    raise bad(param, f"'{param}' = {shown(v)} must be one of {', '.join(EFFORT_OFF + EFFORT_ON)}")


def _zai_thinking(v: Any) -> bool | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("thinking", f"'thinking' must be an object, got {json_kind(v)}", "invalid_type")
    for k in v:
        if k != "type":
            raise bad(f"thinking.{k}", f"'thinking.{k}' is not a known field (only 'type')", "unknown_parameter")
    t = v.get("type")
    if t not in THINKING_TYPES:
        raise bad("thinking.type", f"'thinking.type' = {shown(t)} must be 'enabled' or 'disabled'")
    return THINKING_TYPES[t]


def apply_thinking(body: Mapping, kwargs: dict) -> None:
    """Set kwargs["enable_thinking"] from `reasoning_effort` / `thinking` when given; 400 when they disagree with
    each other or with an explicit chat_template_kwargs.enable_thinking."""
    given = [(name, v) for name, v in (("reasoning_effort", effort_thinking(body.get("reasoning_effort"),
                                                                             "reasoning_effort")),
                                       ("thinking", _zai_thinking(body.get("thinking")))) if v is not None]
    explicit = isinstance(body.get("chat_template_kwargs"), dict) and "enable_thinking" in body["chat_template_kwargs"]
    if explicit:
        given.insert(0, ("chat_template_kwargs.enable_thinking", kwargs["enable_thinking"]))
    for name, v in given[1:]:
        if v != given[0][1]:
            raise bad(name, f"'{name}' turns thinking {'on' if v else 'off'} but '{given[0][0]}' turns it "
                      f"{'on' if given[0][1] else 'off'}; send one")
    if given:
        kwargs["enable_thinking"] = given[0][1]
