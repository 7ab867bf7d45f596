"""The request body as a JSON object and its typed fields: each getter refuses a wrong type or range by name."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from cupyglm.server.errors import ApiError, bad


MAX_DEPTH = 32            # nesting of arrays and objects in a request body
MAX_SHOWN = 40            # characters of a client's value repeated in an error message


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object: 400 on invalid UTF-8, invalid JSON, nesting deeper than MAX_DEPTH,
    a duplicate key, a lone surrogate in any string (named by its path), or a body that is not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(None, f"request body is not valid UTF-8 (byte {e.start})", "invalid_utf8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise bad(None, "request body is empty; send a JSON object", "invalid_json")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise bad(None, f"request body nests arrays or objects deeper than {MAX_DEPTH} levels",
                  "invalid_json") from None
    except _DuplicateKey as e:
        raise bad(e.path, f"request body repeats the key {e.path!r}", "invalid_json") from None
    except ValueError as e:
        raise bad(None, f"request body is not valid JSON: {short(str(e), 200)}", "invalid_json") from None
    if not isinstance(value, dict):
        raise bad(None, f"request body must be a JSON object, got {json_kind(value)}", "invalid_type")
    check_tree(value)
    return value


def parse_json_text(text: str, param: str) -> Any:
    """JSON given as a string inside a field (a schema), under the body's limits: 400 naming `param` for invalid
    JSON, nesting deeper than MAX_DEPTH or a lone surrogate."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise bad(param, f"'{param}' nests arrays or objects deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        raise bad(param, f"'{param}' is not valid JSON") from None
    try:
        check_tree(value)
    except ApiError as e:
        raise bad(param, f"'{param}' (JSON text): {e.message}") from None
    return value


class _DuplicateKey(ValueError):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(short(k, MAX_SHOWN))
            seen.add(k)
    return d


def _has_surrogate(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_tree(value: Any) -> None:
    """400 for nesting deeper than MAX_DEPTH or a lone surrogate anywhere; the error names the field's path."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise bad(path or None, f"'{path}' nests arrays or objects deeper than {MAX_DEPTH} levels",
                      "invalid_json")
        if isinstance(v, dict):
            for k, item in v.items():
                p = f"{path}.{k}" if path else k
                if _has_surrogate(k):
                    p = f"{path}.<key>" if path else "<key>"
                    raise bad(p, f"a key of '{path or 'the body'}' holds a lone UTF-16 surrogate", "invalid_string")
                if isinstance(item, str):
                    if _has_surrogate(item):
                        raise _surrogate(p)
                elif isinstance(item, (dict, list)):
                    stack.append((item, p, depth + 1))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, str):
                    if _has_surrogate(item):
                        raise _surrogate(f"{path}[{i}]")
                elif isinstance(item, (dict, list)):
                    stack.append((item, f"{path}[{i}]", depth + 1))


def _surrogate(path: str):
    return bad(path, f"'{path}' holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
               "invalid_string")


def short(s: str, n: int = MAX_SHOWN) -> str:
    """`s` cut to n characters, safe to put in a reply (surrogates escaped)."""
    s = s if len(s) <= n else s[:n] + "..."
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(v: Any) -> str:
    """A client's value as an error message repeats it: repr, cut to MAX_SHOWN characters."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**MAX_SHOWN:
        return f"an integer of {len(str(abs(v)))} digits"
    return short(repr(v))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# bool before int: a JSON true is a Python int too
_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "an array"),
          (dict, "an object"))


def json_kind(v: Any) -> str:
    """What a JSON value is, as error messages name it ("an integer", "null", ...)."""
    if v is None:
        return "null"
    for t, name in _KINDS:
        if isinstance(v, t):
            return name
    return type(v).__name__


def _get_typed(body: Mapping, name: str, types: type, what: str, default: Any, param: str | None) -> Any:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, types):
        raise bad(param or name, f"'{param or name}' must be {what}, got {json_kind(v)}", "invalid_type")
    return v


def get_bool(body: Mapping, name: str, default: bool | None = None, param: str | None = None) -> bool | None:
    return _get_typed(body, name, bool, "a boolean", default, param)


def get_int(body: Mapping, name: str, default: int | None = None, *, lo: int | None = None,
            hi: int | None = None, param: str | None = None) -> int | None:
    p = param or name
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(p, f"'{p}' must be an integer, got {json_kind(v)}", "invalid_type")
    if lo is not None and v < lo:
        raise bad(p, f"'{p}' must be at least {lo}, got {shown(v)}")
    if hi is not None and v > hi:
        raise bad(p, f"'{p}' must be at most {hi}, got {shown(v)}")
    return v


def get_float(body: Mapping, name: str, default: float | None = None, *, lo: float | None = None,
              hi: float | None = None, lo_open: bool = False, param: str | None = None) -> float | None:
    p = param or name
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(p, f"'{p}' must be a number, got {json_kind(v)}", "invalid_type")
    if isinstance(v, float) and not math.isfinite(v):
        raise bad(p, f"'{p}' must be a finite number")
    # compared before float(): an integer of hundreds of digits does not fit a float
    if isinstance(v, int) and abs(v) > 2**1000:
        raise bad(p, f"'{p}' must be a number in range, got {shown(v)}")
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        got = shown(v) if isinstance(v, int) else f"{v:g}"
        raise bad(p, f"'{p}' must be in {rng}, got {got}")
    return float(v)


def get_str(body: Mapping, name: str, default: str | None = None, param: str | None = None) -> str | None:
    return _get_typed(body, name, str, "a string", default, param)


def get_dict(body: Mapping, name: str, param: str | None = None) -> dict:
    return _get_typed(body, name, dict, "an object", {}, param)


def get_list(body: Mapping, name: str, param: str | None = None) -> list:
    return _get_typed(body, name, list, "an array", [], param)


def check_token_ids(v: Any, param: str, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(v, list):
        raise bad(param, f"'{param}' must be an array of token ids, got {json_kind(v)}", "invalid_type")
    if not v and not allow_empty:
        raise bad(param, f"'{param}' must not be empty")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad(param, f"'{param}[{i}]' must be an integer token id, got {json_kind(t)}", "invalid_type")
        if t < 0 or t >= vocab_size:
            raise bad(param, f"'{param}[{i}]' = {t} is not a token id of this model (0..{vocab_size - 1})",
                      "invalid_token_id")
    return list(v)
