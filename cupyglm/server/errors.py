"""The OpenAI error object and `ApiError`, the exception every wire-format check raises.

An error reply is the HTTP status plus `{"error": {"message", "type", "param", "code"}}`, with `param` naming the
offending field.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping

# type strings of the OpenAI error object, by status
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    """An error reply: HTTP status + OpenAI error object (+ extra headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def __reduce__(self):          # crosses the JSON-parsing process (cupyglm.server.prompt.WorkPool)
        return (_rebuild, (self.status, self.message, self.param, self.code, self.type, self.headers))


def _rebuild(status, message, param, code, type, headers) -> ApiError:
    return ApiError(status, message, param=param, code=code, type=type, headers=headers)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def internal_error(e: BaseException) -> ApiError:
    """A 500 for a failure of the server itself: the details go to the log (stderr), never into the reply (no
    exception class, path or backtrace reaches a client)."""
    print(f"rank 0: internal error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return ApiError(500, "internal error (the server logged it); retry, or report it", code="internal_error")
