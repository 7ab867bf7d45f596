"""Type checks of the refused fields, then the allow-list (cupyglm.server.allowlist) decides by name.

A refused field with a wrong type gets `invalid_type` (as a built field would); with a right type but a value
other than its neutral one it gets `unsupported_parameter`; a field in no list gets `unknown_parameter`.
"""
from __future__ import annotations

from collections.abc import Mapping

from cupyglm.server.allowlist import check_fields
from cupyglm.server.errors import bad
from cupyglm.server.fields import get_bool, get_dict, get_int, get_list, json_kind


def refuse_unsupported(body: Mapping, kind: str) -> None:
    """400 for the first field of a `kind` ("chat" | "completion") request that is mistyped, refused or unknown."""
    get_int(body, "best_of", 1, lo=1)
    if kind == "chat":
        get_bool(body, "logprobs", False)
        get_list(body, "tools")
    elif (lp := body.get("logprobs")) is not None and (isinstance(lp, bool) or not isinstance(lp, int)):
        raise bad("logprobs", f"'logprobs' must be an integer, got {json_kind(lp)}", "invalid_type")
    if kind == "completion" or "echo" in body:
        get_bool(body, "echo", False)
    get_dict(body, "response_format")
    get_bool(body, "use_beam_search", False)
    check_fields(body, kind)
