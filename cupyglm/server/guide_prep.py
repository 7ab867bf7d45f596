"""A generation request parsed, and its output guide checked and compiled, off the event loop within a time bound.

The parse runs in the WorkPool (cupyglm.server.prompt): checking that a guide compiles (llguidance) and compiling
it for the engine (`Guides.prepare`, whose matcher the engine then copies instead of compiling on the thread that
adds the request) both drop the GIL, so the event loop keeps answering. The sizes were bounded before
(cupyglm.server.structured); the time is bounded here: past GUIDE_TIMEOUT_S the request gets 400 naming the field
that carries the guide, and the worker finishes in the background, holding its pool slot until then.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from cupyglm.server.errors import bad
from cupyglm.server.requests import GenRequest, ModelInfo, parse_chat, parse_completion
from cupyglm.server.structured import GUIDED

GUIDE_TIMEOUT_S = 10.0
_SOURCES = ("response_format", "structured_outputs", *GUIDED)


def guide_param(body: Mapping) -> str:
    """The field that carries the request's guide (for an error past the time bound)."""
    for name in _SOURCES:
        if body.get(name) is not None:
            return name
    return "tool_choice"


def _parse(kind: str, body: Mapping, info: ModelInfo, guides: Any) -> GenRequest:
    req = parse_chat(body, info) if kind == "chat" else parse_completion(body, info)
    guide = req.sampling.get("guide")
    if guide is not None and guides is not None:
        try:
            guides.prepare(guide)
        except ValueError as e:
            raise bad(guide_param(body), str(e)) from None
    return req


async def parse_request(pool, kind: str, body: Mapping, info: ModelInfo, guides: Any,
                        timeout_s: float = GUIDE_TIMEOUT_S) -> GenRequest:
    """The validated request (ApiError naming the problem), its guide compiled for the engine (`guides`: the
    engine's Guides, None on an engine without one)."""
    try:
        return await pool.run_within(timeout_s, _parse, kind, body, info, guides)
    except asyncio.TimeoutError:
        p = guide_param(body)
        raise bad(p, f"'{p}' did not compile within {timeout_s:g} s; send a smaller grammar or schema",
                  "too_large") from None
