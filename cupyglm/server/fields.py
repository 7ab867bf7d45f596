"""The request body as a JSON object and its typed fields: each getter refuses a wrong type or range by name."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from cupyglm.server.errors import bad


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object: 400 on invalid UTF-8, invalid JSON, or a body that is not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(None, f"request body is not valid UTF-8 (byte {e.start})", "invalid_utf8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:
        raise bad(None, f"request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(value, dict):
        raise bad(None, f"request body must be a JSON object, got {json_kind(value)}", "invalid_type")
    return value


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
    if isinstance(v, float) and v.is_integer() and math.isfinite(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(p, f"'{p}' must be an integer, got {json_kind(v)}", "invalid_type")
    if lo is not None and v < lo:
        raise bad(p, f"'{p}' must be at least {lo}, got {v}")
    if hi is not None and v > hi:
        raise bad(p, f"'{p}' must be at most {hi}, got {v}")
    return v


def get_float(body: Mapping, name: str, default: float | None = None, *, lo: float | None = None,
              hi: float | None = None, lo_open: bool = False, param: str | None = None) -> float | None:
    p = param or name
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(p, f"'{p}' must be a number, got {json_kind(v)}", "invalid_type")
    v = float(v)
    if not math.isfinite(v):
        raise bad(p, f"'{p}' must be a finite number")
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise bad(p, f"'{p}' must be in {rng}, got {v:g}")
    return v


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
