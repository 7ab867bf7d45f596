"""A grammar (llguidance's Lark) of GLM's tool-call format: forced for tool_choice "required" or a named function,
after free text under auto (with a strict tool or parallel_tool_calls false).

The format is the one cupyglm.server.glm_output parses (and the chat template renders):

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

NAME is one of the tools' names (the named one only, for a named choice); the keys are the tool's `parameters`
properties in the schema's order, the required ones always, the others optional, no other key; each value follows
its property's schema (cupyglm.engine.tool_values: raw text for a string, JSON otherwise). "required" allows several
calls, or exactly one when parallel calls are off; a named choice one. A tool with `strict: true` is refused
(Unenforceable, naming the part) where its schema holds what the grammar cannot enforce.
A tag the tokenizer holds as an added token is referenced as that token (llguidance never builds a special token
from bytes); otherwise it is text.
"""
from __future__ import annotations

import json

from cupyglm.engine.tool_values import ANNOTATIONS, Unenforceable, is_raw, json_value, raw_lexeme

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
PARAM_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "$defs", "definitions"}) | ANNOTATIONS


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _tag(tag: str, added: frozenset[str]) -> str:
    return tag if tag in added else _lit(tag)


def _params(fn: dict, path: str, strict: bool) -> tuple[dict, set, dict]:
    """(properties, required names, definitions) of a tool's parameters; under strict, what the call layout
    cannot honour is refused."""
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    if not isinstance(props, dict):
        raise Unenforceable(f"{path}.properties", "must be an object")
    required = params.get("required") or []
    if not isinstance(required, list):
        raise Unenforceable(f"{path}.required", "must be an array")
    if strict:
        for k in params:
            if k not in PARAM_KEYS:
                raise Unenforceable(f"{path}.{k}", "is not enforced on a tool's parameters (enforced: properties, "
                                    "required, additionalProperties false, $defs)")
        if params.get("type", "object") != "object":
            raise Unenforceable(f"{path}.type", "must be 'object' (a call's arguments are named)")
        for r in required:
            if r not in props:
                raise Unenforceable(f"{path}.required", f"names {r!r}, which is not in its properties")
    defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
    return props, set(required), defs


def _call_rules(i: int, fn: dict, path: str, kv: tuple, strict: bool) -> list[str]:
    props, required, defs = _params(fn, path + ".parameters", strict)
    lines, body = [], [_lit(fn["name"] + "\n")]
    for j, (key, schema) in enumerate(props.items()):
        p = f"{path}.parameters.properties.{key}"
        if not is_raw(schema):
            value = f"{json_value(schema, defs, p, strict)} {kv[3]}"
        elif kv[3].startswith('"'):          # a text close tag ends the same lexeme: the value is its first match
            lines.append(f"V{i}_{j}: ({raw_lexeme(schema, p, strict)}) {kv[3]}")
            value = f"V{i}_{j}"
        else:
            lines.append(f"V{i}_{j}: {raw_lexeme(schema, p, strict)}")
            value = f"V{i}_{j} {kv[3]}"
        lines.append(f"a{i}_{j}: {kv[0]} {_lit(key)} {kv[1]} \"\\n\" {kv[2]} {value} \"\\n\"")
        body.append(f"a{i}_{j}" + ("" if key in required else "?"))
    return lines + [f"fn{i}: " + " ".join(body)]


def _auto_head(added: frozenset[str], thinking: bool) -> list[str]:
    """Under tool_choice auto: the text before the calls (a thinking block first, after a newline or not, when
    thinking is on), any text but the tags that would open a call or close the block."""
    lines = [f"TEXT: ~/(?s:.*){_rx_tag(CALL_OPEN)}(?s:.*)/ & /(?s:.+)/"]
    if not thinking:
        return ["head: TEXT?"] + lines
    return ["head: (_NL? think)? TEXT?", f"think: {_tag(THINK_OPEN, added)} REASON? {_tag(THINK_CLOSE, added)}",
            f"REASON: ~/(?s:.*){_rx_tag(THINK_CLOSE)}(?s:.*)/ & /(?s:.+)/"] + lines


def _rx_tag(tag: str) -> str:
    return tag.replace("/", "\\/")


def tool_call_lark(tools: list[dict], name: str | None, added: frozenset[str] = frozenset(),
                   parallel: bool = True, auto: bool = False, thinking: bool = True) -> str:
    """The Lark text: tools as OpenAI sends them ({"type": "function", "function": {...}}); name None = any tool,
    one or more calls ("required"; exactly one when not `parallel`), else exactly one call of that tool; `auto`:
    text (after a thinking block when `thinking`) then any number of calls (at most one when not `parallel`).
    Unenforceable names what a strict tool's schema holds that the grammar cannot enforce."""
    fns = [(i, t["function"]) for i, t in enumerate(tools) if name is None or t["function"]["name"] == name]
    if not fns:
        raise ValueError(f"tool_choice names the function {name!r}, which is not in 'tools'")
    kv = (_tag(KEY_OPEN, added), _tag(KEY_CLOSE, added), _tag(VALUE_OPEN, added), _tag(VALUE_CLOSE, added))
    calls = f"call{' (_NL? call)*' if name is None and parallel else ''}"
    lines = [f"start: head ({calls})?" if auto else f"start: {calls}", "_NL: \"\\n\"",
             f"call: {_tag(CALL_OPEN, added)} ({' | '.join(f'fn{i}' for i, _ in fns)}) "
             f"{_tag(CALL_CLOSE, added)}"] + (_auto_head(added, thinking) if auto else [])
    for i, fn in fns:
        lines += _call_rules(i, fn, f"tools[{i}].function", kv, fn.get("strict") is True)
    return "\n".join(lines) + "\n"
