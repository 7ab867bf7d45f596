"""Server-sent events framing: one JSON object per `data:` frame, `[DONE]` last, errors as frames."""
from __future__ import annotations

import json
from typing import Any

from cupyglm.server.errors import ApiError


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> bytes:
    """One SSE frame: `data: {json}\\n\\n`."""
    return f"data: {dumps(obj)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(err: ApiError) -> bytes:
    return sse(err.body())
