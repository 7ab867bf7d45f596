"""Validation of a chat request's `messages`: roles, text and image content parts, string names; text parts joined
(a message with images keeps its parts in order: text runs and image parts, cupyglm.server.images)."""
from __future__ import annotations

from typing import Any

from cupyglm.checkpoint.chat_template import CHAT_ROLES
from cupyglm.server.errors import bad
from cupyglm.server.fields import json_kind, shown
from cupyglm.server.images import IMAGE_TYPES, count_images, image_part


def _check_message(i: int, m: Any, images: bool) -> dict:
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(p, f"'{p}' must be an object, got {json_kind(m)}", "invalid_type")
    role = m.get("role")
    if not isinstance(role, str):
        raise bad(f"{p}.role", f"'{p}.role' must be a string, got {json_kind(role)}", "invalid_type")
    if role == "developer":          # OpenAI's newer name for the system role
        m = {**m, "role": "system"}
        role = "system"
    if role not in CHAT_ROLES:
        raise bad(f"{p}.role",
                  f"'{p}.role' = {shown(role)} is not a supported role ({', '.join(CHAT_ROLES)}, developer)")
    content = m.get("content")
    if content is None:
        if role != "assistant":
            raise bad(f"{p}.content", f"'{p}.content' is required for role {role!r}", "missing_required_parameter")
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            pp = f"{p}.content[{j}]"
            if not isinstance(part, dict):
                raise bad(pp, f"'{pp}' must be an object, got {json_kind(part)}", "invalid_type")
            if part.get("type") in IMAGE_TYPES and images:
                parts.append(image_part(pp, part))
                continue
            if part.get("type") in IMAGE_TYPES:
                raise bad(pp, f"'{pp}.type' = {shown(part.get('type'))} is not supported here (images are taken by "
                          "/v1/chat/completions when the checkpoint has a vision tower and --vision is on)",
                          "unsupported_parameter")
            if part.get("type") != "text":
                raise bad(pp, f"'{pp}.type' = {shown(part.get('type'))} is not supported (only 'text')",
                          "unsupported_parameter")
            if not isinstance(part.get("text"), str):
                raise bad(pp, f"'{pp}.text' must be a string", "invalid_type")
            parts.append(part)
        m = {**m, "content": parts}
    elif not isinstance(content, str):
        raise bad(f"{p}.content",
                  f"'{p}.content' must be a string or an array of text parts, got {json_kind(content)}",
                  "invalid_type")
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not isinstance(m.get(key), str):
            raise bad(f"{p}.{key}", f"'{p}.{key}' must be a string", "invalid_type")
    return m


def _flatten(m: dict) -> dict:
    """A message with list-of-text-parts content joined into one string (what the chat template expects); with
    image parts, a list of its text runs (strings) and image parts."""
    c = m.get("content")
    if isinstance(c, list) and all(part["type"] == "text" for part in c):
        m = {**m, "content": "".join(part["text"] for part in c)}
    elif isinstance(c, list):
        runs: list = []
        for part in c:
            if part["type"] != "text":
                runs.append(part)
            elif runs and isinstance(runs[-1], str):
                runs[-1] += part["text"]
            else:
                runs.append(part["text"])
        m = {**m, "content": runs}
    return m


def check_messages(v: Any, max_images: int = 0) -> list[dict]:
    """`messages` checked and flattened; image parts only while `max_images` > 0 (at most that many)."""
    if v is None:
        raise bad("messages", "'messages' is required", "missing_required_parameter")
    if not isinstance(v, list):
        raise bad("messages", f"'messages' must be an array, got {json_kind(v)}", "invalid_type")
    if not v:
        raise bad("messages", "'messages' must not be empty")
    out = [_flatten(_check_message(i, m, max_images > 0)) for i, m in enumerate(v)]
    count_images(out, max_images)
    return out


def check_tools(body: dict) -> list[dict] | None:
    """`tools` (function tools) under `tool_choice` "auto" (default with tools), "none" (not rendered, not
    parsed), "required" or {"type": "function", "function": {"name": ...}} naming one of them (a grammar forces
    the call: cupyglm.server.structured.tool_guide)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "'tool_choice' names a tool but 'tools' is empty")
        return None
    if not isinstance(tools, list):
        raise bad("tools", f"'tools' must be an array, got {json_kind(tools)}", "invalid_type")
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise bad(p, f"'{p}' must be an object with type 'function' and a 'function' object")
        name = t["function"].get("name")
        if not isinstance(name, str) or not name or "\n" in name or "<" in name:
            raise bad(f"{p}.function.name", f"'{p}.function.name' must be a non-empty name")
        params = t["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"{p}.function.parameters", f"'{p}.function.parameters' must be an object", "invalid_type")
    if choice is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad("tool_choice", f"'tool_choice' = {shown(choice)} must be 'none', 'auto', 'required' or "
                  "{'type': 'function', 'function': {'name': ...}}")
    if fn["name"] not in {t["function"]["name"] for t in tools}:
        raise bad("tool_choice", f"'tool_choice' names the function {shown(fn['name'])}, which is not in 'tools'")
    return tools
