"""The grammar of one tool-call argument's value, from its JSON schema, as GLM writes it inside `<arg_value>`.

A property whose schema has `"type": "string"` is written raw (the text itself, no quotes or escapes), so its
schema becomes one Lark lexeme: regexes intersected with llguidance's `&` -- enum / const (the literal strings),
minLength / maxLength (code points), pattern (JSON Schema's search semantics: a branch anchored by `^` / `$` is
anchored there, otherwise any text may surround it), format date / time / date-time (RFC 3339) / ipv4 / uuid --
and always "contains neither `</arg_value>` nor `</tool_call>`" (the parser ends the value or the call at those
texts). Any other property (another type, a type list, no type, `$ref`, `anyOf`, ...) is written as JSON and
embedded as llguidance's `%json` with the parameters' `$defs` / `definitions`, compact: the same compiler as
response_format json_schema (enum, const, pattern, lengths, numeric bounds, nested objects and arrays, required,
additionalProperties).

`strict` (the tool's `strict: true`): a keyword the grammar does not enforce is refused (Unenforceable, naming its
path) rather than ignored; without strict, llguidance's lenient mode skips what it cannot enforce and a raw string
ignores keywords beyond the ones above. Annotations (title, description, ...) never constrain.
"""
from __future__ import annotations

import functools
import json
import re

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                         "writeOnly"})
RAW_KEYS = frozenset({"type", "enum", "const", "pattern", "minLength", "maxLength", "format"}) | ANNOTATIONS
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
FORMATS = {"date": _DATE, "time": _TIME, "date-time": f"{_DATE}[Tt]{_TIME}", "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
           "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"}
NO_CLOSE = r"~/(?s:.*)(<\/arg_value>|<\/tool_call>)(?s:.*)/"
_META = set(r"\.+*?()|[]{}^$#&-~/")


class Unenforceable(ValueError):
    """A schema the tool-call grammar cannot enforce (or an invalid one): `path` names the offending part."""

    def __init__(self, path: str, what: str):
        self.path = path
        super().__init__(f"'{path}' {what}")


def _llg():
    import llguidance                   # imported on first use, as cupyglm.engine.grammar does
    return llguidance


def is_raw(schema) -> bool:
    """Whether GLM writes this property's value as raw text (the parser keeps it a string) rather than JSON."""
    return isinstance(schema, dict) and schema.get("type") == "string"


def _escape(s: str) -> str:
    """s as a literal inside a Lark /regex/ (Rust regex syntax)."""
    return "".join("\\" + c if c in _META else "\\n" if c == "\n" else "\\r" if c == "\r" else
                   "\\t" if c == "\t" else c for c in s)


def _branches(p: str) -> list[str]:
    """p split at its top-level '|' (outside groups, classes and escapes)."""
    out, depth, cls, esc, cur = [], 0, False, False, ""
    for c in p:
        if not esc and not cls and depth == 0 and c == "|":
            out.append(cur)
            cur = ""
            continue
        cur += c
        if esc:
            esc = False
        elif c == "\\":
            esc = True
        elif cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c in "()":
            depth += 1 if c == "(" else -1
    return out + [cur]


def _search(p: str) -> str:
    """A JSON Schema pattern (found anywhere in the text unless anchored) as a whole-text regex."""
    parts = []
    for b in _branches(p):
        lead = b.startswith("^")
        trail = b.endswith("$") and (len(b) - 1 - len(b[:-1].rstrip("\\"))) % 2 == 0
        core = b[1 if lead else 0:len(b) - 1 if trail else len(b)]
        parts.append(("" if lead else "(?s:.*)") + f"(?:{core})" + ("" if trail else "(?s:.*)"))
    return "(?:" + "|".join(parts) + ")"


@functools.lru_cache(maxsize=4096)
def _problem(kind: str, text: str) -> str:
    """'' when llguidance compiles the grammar (kind "lark" or "json_schema"), else the first line of its message;
    cached: clients send the same tools with every turn."""
    llg = _llg()
    try:
        err, msgs = llg.LLMatcher.validate_grammar_with_warnings(llg.grammar_from(kind, text))
    except ValueError as e:
        err, msgs = True, [str(e)]
    return ((msgs[0] if msgs else "") or "invalid").splitlines()[0] if err else ""


def _regex_ok(rx: str) -> str:
    """'' when the Lark regex lexeme compiles, else llguidance's message."""
    return _problem("lark", f"start: V\nV: {rx}\n")


def _length(schema: dict, key: str, path: str) -> int | None:
    v = schema.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise Unenforceable(f"{path}.{key}", "must be a non-negative integer")
    return v


def raw_lexeme(schema: dict, path: str, strict: bool) -> str:
    """The Lark lexeme body of a raw string value (schema: is_raw)."""
    if strict:
        for k in schema:
            if k not in RAW_KEYS:
                raise Unenforceable(f"{path}.{k}", "is not enforced in a string argument, which GLM writes as raw "
                                    "text (enforced: enum, const, pattern, minLength, maxLength, format)")
    parts = [NO_CLOSE]
    if "enum" in schema or "const" in schema:
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not any(isinstance(v, str) for v in values):
            raise Unenforceable(f"{path}.{key}", "holds no string, so no string value satisfies it")
        parts.append("/(?:" + "|".join(_escape(v) for v in values if isinstance(v, str)) + ")/")
    lo, hi = _length(schema, "minLength", path), _length(schema, "maxLength", path)
    if lo is not None or hi is not None:
        parts.append(f"/(?s:.){{{lo or 0},{'' if hi is None else hi}}}/")
    fmt = schema.get("format")
    if fmt in FORMATS:
        parts.append(f"/{FORMATS[fmt]}/")
    elif fmt is not None and strict:
        raise Unenforceable(f"{path}.format", f"= {fmt!r} is not enforced in a string argument (enforced formats: "
                            f"{', '.join(FORMATS)})")
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise Unenforceable(f"{path}.pattern", "must be a string")
        rx = "/" + re.sub(r"(?<!\\)/", r"\/", _search(pattern)) + "/"
        err = _regex_ok(rx)
        if not err:
            parts.append(rx)
        elif strict:
            raise Unenforceable(f"{path}.pattern", f"cannot be enforced: {err}")
    return " & ".join(parts)


def json_value(schema, defs: dict, path: str, strict: bool) -> str:
    """The `%json {...}` of a JSON-written value: the property's schema with the parameters' definitions."""
    s = dict(schema) if isinstance(schema, dict) else {}
    s.update(defs)
    s["x-guidance"] = {"whitespace_flexible": False, "lenient": not strict, **(s.get("x-guidance") or {})}
    text = json.dumps(s, ensure_ascii=False)
    if err := _problem("json_schema", text):
        raise Unenforceable(path, f"cannot be enforced: {err}")
    return "%json " + text
