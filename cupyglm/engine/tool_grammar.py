"""A grammar (llguidance's Lark) forcing GLM's tool-call format, for tool_choice "required" or a named function.

The format is the one cupyglm.server.glm_output parses (and the chat template renders):

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

NAME is one of the tools' names (the named one only, for a named choice); the keys are the tool's `parameters`
properties in the schema's order, the required ones always, the others optional; a value whose property has a
non-string type is JSON of that property's schema (llguidance's %json), a string value is text without '<'
(the parser reads a value up to the next '</arg_value>'). "required" allows several calls, a named choice one.
A tag the tokenizer holds as an added token is referenced as that token (llguidance never builds a special token
from bytes); otherwise it is text.
"""
from __future__ import annotations

import json

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
STRING_VALUE = r"/[^<]*/"


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _tag(tag: str, added: frozenset[str]) -> str:
    return tag if tag in added else _lit(tag)


def tool_call_lark(tools: list[dict], name: str | None, added: frozenset[str] = frozenset()) -> str:
    """The Lark text: tools as OpenAI sends them ({"type": "function", "function": {...}}); name None = any tool,
    one or more calls ("required"), else exactly one call of that tool."""
    fns = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not fns:
        raise ValueError(f"tool_choice names the function {name!r}, which is not in 'tools'")
    kv = (_tag(KEY_OPEN, added), _tag(KEY_CLOSE, added), _tag(VALUE_OPEN, added), _tag(VALUE_CLOSE, added))
    lines = [f"start: call{'' if name is not None else ' (_NL? call)*'}", "_NL: \"\\n\"",
             f"call: {_tag(CALL_OPEN, added)} ({' | '.join(f'fn{i}' for i in range(len(fns)))}) "
             f"{_tag(CALL_CLOSE, added)}"]
    for i, fn in enumerate(fns):
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        required = set(params.get("required") or ())
        body = [_lit(fn["name"] + "\n")]
        for j, (key, schema) in enumerate(props.items()):
            schema = schema if isinstance(schema, dict) else {}
            value = STRING_VALUE if schema.get("type", "string") == "string" else "%json " + json.dumps(schema)
            lines.append(f"a{i}_{j}: {kv[0]} {_lit(key)} {kv[1]} \"\\n\" {kv[2]} {value} {kv[3]} \"\\n\"")
            body.append(f"a{i}_{j}" + ("" if key in required else "?"))
        lines.append(f"fn{i}: " + " ".join(body))
    return "\n".join(lines) + "\n"
