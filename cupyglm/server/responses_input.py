"""A `POST /v1/responses` body as the chat request it runs as: `input` items to chat messages, the Responses flat
function tools to chat tools, `text.format` to `response_format`, `reasoning.effort` to the thinking switch.
The fields are checked by name first (cupyglm.server.responses_fields); each value is then checked where it
is converted, or by chat's validation of the request it becomes.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cupyglm.server.errors import bad
from cupyglm.server.fields import get_bool, get_int, json_kind, shown
from cupyglm.server.responses_fields import PASSED, check_responses_fields
from cupyglm.server.thinking import effort_thinking

TEXT_PARTS = ("input_text", "output_text", "text")
MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
REASONING_KEYS = {"type", "id", "summary", "content", "encrypted_content", "status"}


def _keys(item: Mapping, allowed: set[str], p: str) -> None:
    for k in item:
        if k not in allowed:
            raise bad(f"{p}.{k}", f"'{p}.{k}' is not a known field of this item", "unknown_parameter")


def _text(content: Any, p: str, kinds: tuple[str, ...] = TEXT_PARTS) -> str:
    """A string, or an array of text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(p, f"'{p}' must be a string or an array of text parts, got {json_kind(content)}", "invalid_type")
    out = []
    for j, part in enumerate(content):
        pp = f"{p}[{j}]"
        if not isinstance(part, dict):
            raise bad(pp, f"'{pp}' must be an object, got {json_kind(part)}", "invalid_type")
        if part.get("type") not in kinds:
            raise bad(f"{pp}.type", f"'{pp}.type' = {shown(part.get('type'))} is not supported (only "
                      f"{', '.join(kinds)})", "unsupported_parameter")
        if not isinstance(part.get("text"), str):
            raise bad(f"{pp}.text", f"'{pp}.text' must be a string", "invalid_type")
        out.append(part["text"])
    return "".join(out)


def _string(item: Mapping, key: str, p: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise bad(f"{p}.{key}", f"'{p}.{key}' must be a string, got {json_kind(v)}",
                  "missing_required_parameter" if v is None else "invalid_type")
    return v


class _Messages:
    """Chat messages built item by item: consecutive function calls (and a reasoning item before them) join one
    assistant message, as GLM's template renders them."""

    def __init__(self) -> None:
        self.out: list[dict] = []
        self.reasoning: str | None = None

    def assistant(self) -> dict:
        last = self.out[-1] if self.out else None
        if last is None or last["role"] != "assistant" or last.get("closed"):
            last = {"role": "assistant", "content": ""}
            self.out.append(last)
        if self.reasoning is not None:
            last["reasoning_content"] = self.reasoning
            self.reasoning = None
        return last

    def add(self, i: int, item: Any) -> None:
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(p, f"'{p}' must be an object, got {json_kind(item)}", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, p)
        elif kind == "function_call":
            _keys(item, CALL_KEYS, p)
            args = _string(item, "arguments", p)
            self.assistant().setdefault("tool_calls", []).append(
                {"id": _string(item, "call_id", p), "type": "function",
                 "function": {"name": _string(item, "name", p), "arguments": _json_object(args, f"{p}.arguments")}})
        elif kind == "function_call_output":
            _keys(item, OUTPUT_KEYS, p)
            self.out.append({"role": "tool", "tool_call_id": _string(item, "call_id", p),
                             "content": _text(item.get("output"), f"{p}.output", ("input_text", "output_text"))})
        elif kind == "reasoning":
            _keys(item, REASONING_KEYS, p)
            if item.get("encrypted_content") is not None:
                raise bad(f"{p}.encrypted_content", f"'{p}.encrypted_content' is not supported (this server "
                          "never sends encrypted reasoning)", "unsupported_parameter")
            parts = item.get("content") or item.get("summary") or []
            self.reasoning = _text(parts, f"{p}.content", ("reasoning_text", "summary_text"))
        else:
            raise bad(f"{p}.type", f"'{p}.type' = {shown(kind)} is not supported (message, function_call, "
                      "function_call_output, reasoning)", "unsupported_parameter")

    def _message(self, item: Mapping, p: str) -> None:
        _keys(item, MESSAGE_KEYS, p)
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise bad(f"{p}.role", f"'{p}.role' = {shown(role)} must be user, system, developer or assistant")
        text = _text(item.get("content"), f"{p}.content")
        if role == "assistant":
            m = self.assistant()
            if m.get("tool_calls"):                       # text after calls starts the next assistant turn
                m["closed"] = True
                m = self.assistant()
            m["content"] += text
        else:
            self.out.append({"role": "system" if role == "developer" else role, "content": text})

    def messages(self) -> list[dict]:
        return [{k: v for k, v in m.items() if k != "closed"} for m in self.out]


def _json_object(s: str, p: str) -> str:
    try:
        v = json.loads(s)
    except ValueError:
        raise bad(p, f"'{p}' is not valid JSON") from None
    if not isinstance(v, dict):
        raise bad(p, f"'{p}' must be a JSON object, got {json_kind(v)}", "invalid_type")
    return s


def input_messages(body: Mapping) -> list[dict]:
    """`instructions` and `input` as chat messages."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", f"'instructions' must be a string, got {json_kind(instructions)}", "invalid_type")
    v = body.get("input")
    if v is None:
        raise bad("input", "'input' is required", "missing_required_parameter")
    msgs = _Messages()
    if instructions:
        msgs.out.append({"role": "system", "content": instructions})
    if isinstance(v, str):
        msgs.out.append({"role": "user", "content": v})
    elif isinstance(v, list) and v:
        for i, item in enumerate(v):
            msgs.add(i, item)
    else:
        raise bad("input", "'input' must be a string or a non-empty array of items, got "
                  f"{'an empty array' if v == [] else json_kind(v)}", "invalid_type")
    return msgs.messages()


TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
FORMAT_KEYS = {"type", "name", "schema", "strict", "description"}
REASONING_FIELDS = {"effort", "summary", "generate_summary"}


def _tools(v: Any) -> list[dict] | None:
    """The Responses flat function tools as chat tools."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise bad("tools", f"'tools' must be an array, got {json_kind(v)}", "invalid_type")
    out = []
    for i, t in enumerate(v):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad(p, f"'{p}' must be an object, got {json_kind(t)}", "invalid_type")
        if t.get("type") != "function":
            raise bad(f"{p}.type", f"'{p}.type' = {shown(t.get('type'))} is not supported (only function tools)",
                      "unsupported_parameter")
        _keys(t, TOOL_KEYS, p)
        fn = {"name": _string(t, "name", p)}
        for k in ("description", "parameters", "strict"):
            if t.get(k) is not None:
                fn[k] = t[k]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: Any) -> Any:
    if v is None or v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str) and set(v) <= {
            "type", "name"}:
        return {"type": "function", "function": {"name": v["name"]}}
    raise bad("tool_choice", f"'tool_choice' = {shown(v)} must be 'none', 'auto', 'required' or "
              "{'type': 'function', 'name': ...}", "unsupported_parameter")


def _response_format(text: Any) -> dict | None:
    """`text.format` as chat's response_format (validated there)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("text", f"'text' must be an object, got {json_kind(text)}", "invalid_type")
    _keys(text, {"format", "verbosity"}, "text")
    if text.get("verbosity") is not None:
        raise bad("text.verbosity", "'text.verbosity' is not supported", "unsupported_parameter")
    f = text.get("format")
    if f is None:
        return None
    if not isinstance(f, dict):
        raise bad("text.format", f"'text.format' must be an object, got {json_kind(f)}", "invalid_type")
    _keys(f, FORMAT_KEYS, "text.format")
    kind = f.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise bad("text.format.type", f"'text.format.type' = {shown(kind)} must be text, json_object or json_schema")
    if not isinstance(f.get("schema"), dict):
        raise bad("text.format.schema", "'text.format.schema' must be a JSON schema object", "invalid_type")
    return {"type": "json_schema", "json_schema": {k: f[k] for k in ("name", "schema", "strict", "description")
                                                   if f.get(k) is not None}}


def _thinking(reasoning: Any) -> bool | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise bad("reasoning", f"'reasoning' must be an object, got {json_kind(reasoning)}", "invalid_type")
    _keys(reasoning, REASONING_FIELDS, "reasoning")
    for k in ("summary", "generate_summary"):            # the reasoning item carries the whole text instead
        if reasoning.get(k) not in (None, "auto", "concise", "detailed"):
            raise bad(f"reasoning.{k}", f"'reasoning.{k}' must be auto, concise or detailed")
    return effort_thinking(reasoning.get("effort"), "reasoning.effort")


def to_chat(body: Mapping) -> dict:
    """The chat request body a Responses body runs as (its remaining checks are chat's)."""
    check_responses_fields(body)
    get_bool(body, "store", None)
    get_int(body, "max_output_tokens", None, lo=1)
    chat: dict[str, Any] = {PASSED[k]: v for k, v in body.items() if k in PASSED and v is not None}
    chat["messages"] = input_messages(body)
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"))
    if tools:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    rf = _response_format(body.get("text"))
    if rf is not None and choice != "required" and not isinstance(choice, dict):
        chat["response_format"] = rf                       # a forced call writes no text to constrain
    thinking = _thinking(body.get("reasoning"))
    if thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": thinking}
    return chat
