"""Structured-output fields of a request into the engine's Guide (cupyglm.engine.grammar), checked by name.

OpenAI: `response_format` {"type": "text"} (none), {"type": "json_object"} (any JSON object), {"type":
"json_schema", "json_schema": {"name", "schema", "strict", "description"}} (the schema, enforced whether strict or
not). vLLM: `structured_outputs` with exactly one of json / regex / choice / grammar / json_object, and the older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`. A request may carry one of these sources; a
second one is refused naming it. Parts that would change the output and are not built are refused by name
(`response_format` type structural_tag, structured_outputs.structural_tag / whitespace_pattern /
disable_additional_properties true). JSON is generated compact (no whitespace between tokens of JSON), which
structured_outputs.disable_any_whitespace asks for and any schema allows. `tool_choice` "required" or a named
function becomes a tool_call guide (cupyglm.engine.tool_grammar), exactly one call under parallel_tool_calls false;
so does "auto" with a strict tool or parallel_tool_calls false (text, then calls; at most one when not parallel).

Bounds, refused by name before anything compiles: at most MAX_GUIDED_CHOICES choices, at most MAX_GUIDE_CHARS
characters of choices, regex, grammar or schema text; a schema given as a string is parsed under the body's
nesting limit. The check that a guide compiles runs off the event loop (cupyglm.server.guide_prep).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cupyglm.engine.grammar import Guide
from cupyglm.engine.tool_values import Unenforceable
from cupyglm.server.errors import bad
from cupyglm.server.fields import get_bool, json_kind, parse_json_text, short

ANY_OBJECT = '{"type": "object"}'
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")
SO_OPTIONS = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
              "structural_tag"}
SCHEMA_KEYS = {"name", "schema", "strict", "description"}
MAX_GUIDED_CHOICES = 1024      # llguidance fails a row of more than 2000 items while decoding
MAX_GUIDE_CHARS = 256 * 1024   # of a regex, grammar, schema or the choices together


def _sized(param: str, chars: int) -> None:
    if chars > MAX_GUIDE_CHARS:
        raise bad(param, f"'{param}' holds {chars} characters; at most {MAX_GUIDE_CHARS}", "too_large")


def _schema(v: Any, param: str) -> Guide:
    if isinstance(v, str):
        _sized(param, len(v))
        v = parse_json_text(v, param)
    if not isinstance(v, dict):
        raise bad(param, f"'{param}' must be a JSON schema object, got {json_kind(v)}", "invalid_type")
    text = json.dumps(v)
    _sized(param, len(text))
    return Guide("json_schema", text)


def _text(v: Any, param: str, kind: str) -> Guide:
    if not isinstance(v, str):
        raise bad(param, f"'{param}' must be a string, got {json_kind(v)}", "invalid_type")
    if not v:
        raise bad(param, f"'{param}' must not be empty")
    _sized(param, len(v))
    return Guide(kind, v)


def _choice(v: Any, param: str) -> Guide:
    if not isinstance(v, list) or not v or not all(isinstance(c, str) and c for c in v):
        raise bad(param, f"'{param}' must be a non-empty array of non-empty strings")
    if len(v) > MAX_GUIDED_CHOICES:
        raise bad(param, f"'{param}' holds {len(v)} choices; at most {MAX_GUIDED_CHOICES}", "too_large")
    text = json.dumps(v)
    _sized(param, len(text))
    return Guide("choice", text)


def _response_format(rf: Mapping) -> Guide | None:
    kind = rf.get("type")
    for k in rf:
        if k not in ("type", "json_schema"):
            raise bad(f"response_format.{short(k)}", f"'response_format.{short(k)}' is not a known field",
                      "unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json_schema", ANY_OBJECT)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad("response_format.json_schema", "'response_format.json_schema' must be an object",
                      "missing_required_parameter" if js is None else "invalid_type")
        for k in js:
            if k not in SCHEMA_KEYS:
                raise bad(f"response_format.json_schema.{short(k)}",
                          f"'response_format.json_schema.{short(k)}' is not a known field", "unknown_parameter")
        get_bool(js, "strict", None, param="response_format.json_schema.strict")
        if "schema" not in js:
            return Guide("json_schema", ANY_OBJECT)
        return _schema(js["schema"], "response_format.json_schema.schema")
    if kind == "structural_tag":
        raise bad("response_format.type", "'response_format.type' = 'structural_tag' is not supported yet",
                  "unsupported_parameter")
    raise bad("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema'")


def _structured_outputs(so: Any) -> Guide:
    if not isinstance(so, dict):
        raise bad("structured_outputs", f"'structured_outputs' must be an object, got {json_kind(so)}",
                  "invalid_type")
    for k, v in so.items():
        p = f"structured_outputs.{short(k)}"
        if k not in SO_KINDS and k not in SO_OPTIONS:
            raise bad(p, f"'{p}' is not a known field", "unknown_parameter")
        if k in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            get_bool(so, k, None, param=p)
        if (k in ("structural_tag", "whitespace_pattern") and v is not None) or (
                k == "disable_additional_properties" and v is True):
            raise bad(p, f"'{p}' is not supported yet", "unsupported_parameter")
    given = [k for k in SO_KINDS if so.get(k) is not None and so.get(k) is not False]
    if len(given) != 1:
        raise bad("structured_outputs", "'structured_outputs' must hold exactly one of "
                  f"{', '.join(SO_KINDS)}" + (f" (got {', '.join(given)})" if given else ""))
    k = given[0]
    p = f"structured_outputs.{k}"
    if k == "json":
        return _schema(so[k], p)
    if k == "json_object":
        get_bool(so, k, None, param=p)
        return Guide("json_schema", ANY_OBJECT)
    if k == "choice":
        return _choice(so[k], p)
    return _text(so[k], p, k)


def structured_guide(body: Mapping) -> Guide | None:
    """The request's output constraint from its structured-output fields; None when it has none."""
    found: list[tuple[str, Guide]] = []
    rf = body.get("response_format")
    if isinstance(rf, dict):                     # its type was checked (cupyglm.server.unsupported)
        g = _response_format(rf)
        if g is not None:
            found.append(("response_format", g))
    if body.get("structured_outputs") is not None:
        found.append(("structured_outputs", _structured_outputs(body["structured_outputs"])))
    for name in GUIDED:
        v = body.get(name)
        if v is None:
            continue
        g = (_schema(v, name) if name == "guided_json" else _choice(v, name) if name == "guided_choice"
             else _text(v, name, "regex" if name == "guided_regex" else "grammar"))
        found.append((name, g))
    if not found:
        return None
    if len(found) > 1:
        raise bad(found[1][0], f"'{found[1][0]}' and '{found[0][0]}' both constrain the output; send one")
    param, guide = found[0]
    err = guide.check()
    if err:
        raise bad(param, f"'{param}' does not compile: {err}")
    return guide


def tool_guide(tools: list[dict] | None, choice: Any, parallel: bool = True, thinking: bool = True) -> Guide | None:
    """tool_choice "required" (one or more calls of any tool, exactly one when not `parallel`) or {"type":
    "function", "function": {"name"}} (one call of that tool) as a guide; auto with a `strict: true` tool or not
    `parallel`: text, then calls that keep their schemas (at most one when not `parallel`); None otherwise."""
    if not tools or choice == "none":
        return None
    auto = choice in (None, "auto")
    if auto and parallel and not any(t["function"].get("strict") is True for t in tools):
        return None
    name = None if auto or choice == "required" else choice["function"]["name"]
    return Guide("tool_call", json.dumps({"tools": tools, "name": name, "parallel": parallel, "auto": auto,
                                          "thinking": thinking}))


def tool_grammar(sampling: dict, tools: list[dict] | None, choice, parallel: bool, thinking: bool) -> None:
    """The tool-call grammar as the sampling guide: a forced call always (refused with another guide, ignore_eos
    or min_tokens); under auto (strict tools or parallel_tool_calls false) only where no other guide, ignore_eos
    or min_tokens is set, else the parser alone reads the calls."""
    guide = tool_guide(tools, choice, parallel, thinking)
    if guide is None:
        return
    forced = choice not in (None, "auto")
    clash = sampling["guide"] is not None or sampling["ignore_eos"] or sampling["min_tokens"]
    if clash and not forced:
        return
    if sampling["guide"] is not None:
        raise bad("tool_choice", "'tool_choice' forces a tool call and the request also constrains the output "
                  "(response_format / structured_outputs / guided_*); send one")
    if clash:
        raise bad("tool_choice", "a forced tool call cannot be combined with ignore_eos or min_tokens")
    try:
        err = guide.check()
    except Unenforceable as e:
        raise bad(e.path, str(e)) from None
    if err:
        raise bad("tools", f"the tools' parameters do not compile into a tool-call grammar: {short(err, 300)}")
    sampling["guide"] = guide
