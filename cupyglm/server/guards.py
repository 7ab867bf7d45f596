"""What stands between a client's socket and the routes: API keys, body size and read deadlines.

Read deadlines (a slow client never holds a connection or an engine slot; a request reaches the engine only once
its whole body is read):

- headers: `GuardedH11Protocol` closes a connection whose request line and headers are not complete within
  HEAD_TIMEOUT_S of its opening or of the previous response's end (an idle socket, partial headers);
- body: `read_body` answers 408 (and closes) when the body is not complete within BODY_TIMEOUT_S of the route
  starting to read it (a chunked body that never ends, a body shorter than its Content-Length);
- idle keep-alive: uvicorn's `timeout_keep_alive` (KEEP_ALIVE_S).
"""
from __future__ import annotations

import asyncio
import hmac
import time

import h11
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from cupyglm.server.errors import ApiError, bad

HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 5
PUBLIC_PATHS = ("/health", "/metrics", "/ping", "/version")
JSON_TYPES = ("application/json",)


class ErrorResponse(JSONResponse):
    """An error reply; ASCII-escaped JSON, so no client text (a lone surrogate included) can break its encoding."""

    def render(self, content) -> bytes:
        import json

        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def json_error(err: ApiError) -> JSONResponse:
    return ErrorResponse(err.body(), status_code=err.status, headers=err.headers)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on the request line and headers (see the module docstring)."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def _arm_head(self) -> None:
        self._disarm_head()
        self._head_task = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _disarm_head(self) -> None:
        task = getattr(self, "_head_task", None)
        if task is not None:
            task.cancel()
        self._head_task = None

    def _head_expired(self) -> None:
        self._head_task = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head()

    def connection_lost(self, exc) -> None:
        self._disarm_head()
        super().connection_lost(exc)


class ApiKeyMiddleware:
    """401 + `WWW-Authenticate: Bearer` unless `Authorization: Bearer <key>` matches (constant-time compare)."""

    def __init__(self, app: ASGIApp, keys: tuple[bytes, ...]):
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope.get("path") in PUBLIC_PATHS \
                or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        auth = b""
        for k, v in scope.get("headers") or ():
            if k == b"authorization":
                auth = v
                break
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        ok = False
        for key in self.keys:          # compare against every key, no early exit
            ok |= hmac.compare_digest(given, key)
        if ok and given:
            await self.app(scope, receive, send)
            return
        msg = "missing API key (send 'Authorization: Bearer <key>')" if not auth else "invalid API key"
        err = ApiError(401, msg, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await json_error(err)(scope, receive, send)


def check_json_type(request: Request) -> None:
    """415 unless the Content-Type is absent or JSON (`application/json`, `application/*+json`)."""
    ct = request.headers.get("content-type")
    if ct is None:
        return
    media = ct.split(";", 1)[0].strip().lower()
    if media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json")):
        return
    raise ApiError(415, f"Content-Type {ct[:60]!r} is not supported; send 'Content-Type: application/json'",
                   param=None, code="unsupported_media_type")


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body, refusing (413) a declared or streamed size over `limit`, and (408) one not complete in time."""
    cl = request.headers.get("content-length")
    if cl is not None:
        if not (cl.isascii() and cl.isdigit()) or len(cl) > 19:
            raise bad(None, f"invalid Content-Length header {cl[:40]!r}", "invalid_header")
        n = int(cl)
        if n > limit:
            raise too_large(n, limit)
    chunks: list[bytes] = []
    total = 0
    deadline = time.monotonic() + timeout_s
    stream = request.stream().__aiter__()
    while True:
        left = deadline - time.monotonic()
        try:
            part = await asyncio.wait_for(stream.__anext__(), max(left, 0.001))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body was not complete within {timeout_s:g} s", code="request_timeout",
                           headers={"Connection": "close"}) from None
        except ClientDisconnect:
            raise
        total += len(part)
        if total > limit:
            raise too_large(total, limit, at_least=True)
        chunks.append(part)
    return b"".join(chunks)


def too_large(n: int, limit: int, at_least: bool = False) -> ApiError:
    size = f"at least {n}" if at_least else str(n)
    return ApiError(413, f"request body of {size} bytes exceeds the limit of {limit} bytes (--max-body-bytes)",
                    code="request_too_large", headers={"Connection": "close"})


async def wait_disconnect(request: Request) -> None:
    """Returns when the client of a non-streamed request has gone."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
