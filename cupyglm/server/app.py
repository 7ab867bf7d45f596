"""The HTTP routes (starlette) of rank 0: OpenAI chat/completions, models, health, metrics, tokenize/detokenize.

`create_app(state)` builds the ASGI app around a `ServerState` whose bridge drives the engine. Every error is
the OpenAI error JSON; errors found before a stream opens get their HTTP status (400/401/404/413/429/503), an
error after a stream opened is one SSE `data: {"error": ...}` event followed by `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import re
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cupyglm.server.bridge import EngineBridge, EngineDied, RequestStream
from cupyglm.server.errors import ApiError, bad
from cupyglm.server.fields import parse_json_object
from cupyglm.server.metrics import CONTENT_TYPE, Metrics
from cupyglm.server.requests import (GenRequest, ModelInfo, fit_context, parse_chat, parse_completion,
                                     parse_detokenize, parse_tokenize)
from cupyglm.server.responses import (Reply, chat_response, chunk, completion_response, models_response, new_id,
                                      now, usage_chunk)
from cupyglm.server.sse import SSE_DONE, sse, sse_error

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
RETRY_AFTER_S = 1
PUBLIC_PATHS = ("/health", "/metrics")


@dataclasses.dataclass
class ServerState:
    """Everything the routes need. `info`, `tokenizer` and `make_params` are set once the engine is ready."""

    bridge: EngineBridge
    metrics: Metrics
    served_id: str
    root: str
    api_keys: tuple[bytes, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    info: ModelInfo | None = None
    tokenizer: Any = None
    make_params: Callable[..., Any] | None = None
    created: int = dataclasses.field(default_factory=now)

    @property
    def ready(self) -> bool:
        return self.bridge.ready and self.bridge.dead is None and not self.bridge.closing and self.info is not None


def json_error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# ---- middleware: API keys ---------------------------------------------------------------------------------------

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


# ---- helpers ----------------------------------------------------------------------------------------------------

async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) a declared or streamed size over `limit`."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise bad(None, f"invalid Content-Length header {cl!r}", "invalid_header") from None
        if n > limit:
            raise _too_large(n, limit)
    chunks: list[bytes] = []
    total = 0
    try:
        async for part in request.stream():
            total += len(part)
            if total > limit:
                raise _too_large(total, limit, at_least=True)
            chunks.append(part)
    except ClientDisconnect:
        raise
    return b"".join(chunks)


def _too_large(n: int, limit: int, at_least: bool = False) -> ApiError:
    size = f"at least {n}" if at_least else str(n)
    return ApiError(413, f"request body of {size} bytes exceeds the limit of {limit} bytes (--max-body-bytes)",
                    code="request_too_large")


def _not_ready(state: ServerState) -> ApiError:
    b = state.bridge
    if b.dead is not None:
        why = "the engine stopped"
    elif b.closing:
        why = "the server is shutting down"
    else:
        why = "the model is loading"
    return ApiError(503, f"not ready: {why}", code="service_unavailable", headers={"Retry-After": "1"})


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


_FIELD = re.compile(r"\b(temperature|top_p|top_k|min_p|seed|max_tokens|min_tokens|stop_token_ids|stop|"
                    r"ignore_eos)\b")


def _engine_error(e: BaseException, req: GenRequest | None = None) -> ApiError:
    name = type(e).__name__
    if name == "QueueFull":
        return ApiError(429, f"the request queue is full ({e}); retry later", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if name == "RequestTooLong":
        return ApiError(400, str(e), param=req.prompt_param if req else None, code="context_length_exceeded")
    if isinstance(e, EngineDied):
        return ApiError(503, str(e), code="service_unavailable")
    if isinstance(e, ValueError):
        m = _FIELD.search(str(e))
        return bad(m.group(1) if m else None, str(e))
    return ApiError(500, f"internal error: {name}: {e}", code="internal_error")


# ---- the app ----------------------------------------------------------------------------------------------------

def create_app(state: ServerState, *, lifespan: Any = None) -> Starlette:
    async def body_json(request: Request) -> dict:
        return parse_json_object(await read_body(request, state.max_body_bytes))

    def need_ready() -> ModelInfo:
        if not state.ready:
            raise _not_ready(state)
        assert state.info is not None
        return state.info

    def prompt_ids_of(req: GenRequest) -> list[int]:
        tok = state.tokenizer
        if req.kind == "chat":
            try:
                text = tok.apply_chat_template(req.messages, add_generation_prompt=req.add_generation_prompt,
                                               **req.chat_kwargs)
            except (ValueError, TypeError) as e:
                raise bad("messages", f"cannot render the chat template: {e}") from None
            except Exception as e:  # noqa: BLE001 - jinja errors raised by the template itself
                raise bad("messages", f"cannot render the chat template: {type(e).__name__}: {e}") from None
            return tok.encode(text)
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        return tok.encode(req.prompt_text)

    async def generate(request: Request, kind: str) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
            req = parse_chat(body, info) if kind == "chat" else parse_completion(body, info)
            prompt = prompt_ids_of(req)
            sampling = fit_context(req, len(prompt), info)
            try:
                params = state.make_params(**sampling)
            except ValueError as e:
                raise _engine_error(e, req) from None
            need_ready()
            try:
                stream = state.bridge.submit(prompt, params)
            except Exception as e:  # noqa: BLE001 - QueueFull, RequestTooLong, ValueError, EngineDied
                raise _engine_error(e, req) from None
        except ApiError as e:
            return json_error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        reply = Reply(id=new_id("chatcmpl" if kind == "chat" else "cmpl"), model=req.model, created=now(),
                      prompt_ids=prompt)
        if req.stream:
            return StreamingResponse(_stream(req, stream, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(request, req, stream, reply)

    async def _stream(req: GenRequest, stream: RequestStream, reply: Reply):
        first = True
        try:
            while True:
                try:
                    d = await stream.next()
                except EngineDied as e:
                    yield sse_error(ApiError(503, str(e), code="service_unavailable"))
                    yield SSE_DONE
                    return
                reply.add(d)
                if first or d.text or d.finished or (req.return_token_ids and d.token_ids):
                    yield sse(chunk(req.kind, reply, text=d.text, first=first,
                                    token_ids=d.token_ids if req.return_token_ids else None,
                                    prompt_ids=reply.prompt_ids if (first and req.return_token_ids) else None,
                                    finish_reason=reply.finish_reason if d.finished else None))
                    first = False
                if d.finished:
                    break
            if req.include_usage:
                yield sse(usage_chunk(req.kind, reply))
            yield SSE_DONE
        finally:
            stream.abort()       # no-op once finished; a client gone mid-stream frees its pages

    async def _collect(request: Request, req: GenRequest, stream: RequestStream, reply: Reply) -> Response:
        async def watch() -> None:
            await _wait_disconnect(request)
            stream.abort()
            stream.queue.put_nowait(EngineDied("client disconnected"))

        watcher = asyncio.ensure_future(watch())
        try:
            while True:
                try:
                    d = await stream.next()
                except EngineDied as e:
                    return json_error(ApiError(503, str(e), code="service_unavailable"))
                reply.add(d)
                if d.finished:
                    break
        finally:
            watcher.cancel()
            stream.abort()
        build = chat_response if req.kind == "chat" else completion_response
        return JSONResponse(build(reply, req.return_token_ids))

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def models(request: Request) -> Response:
        try:
            info = need_ready()
        except ApiError as e:
            return json_error(e)
        return JSONResponse(models_response(info, state.root, state.created))

    async def health(request: Request) -> Response:
        b = state.bridge
        if state.ready and b.alive:
            return JSONResponse({"status": "ok"})
        status = "dead" if b.dead is not None else ("stopping" if b.closing else "loading")
        return JSONResponse({"status": status}, status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def tokenize(request: Request) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
            t = parse_tokenize(body, info)
            tok = state.tokenizer
            if "messages" in t:
                try:
                    text = tok.apply_chat_template(t["messages"], add_generation_prompt=t["add_generation_prompt"],
                                                   **t["chat_kwargs"])
                except Exception as e:  # noqa: BLE001
                    raise bad("messages", f"cannot render the chat template: {e}") from None
                ids = tok.encode(text)
            elif "ids" in t:
                ids = t["ids"]
            else:
                ids = tok.encode(t["text"])
        except ApiError as e:
            return json_error(e)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": info.max_model_len})

    async def detokenize(request: Request) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
            ids = parse_detokenize(body, info)
        except ApiError as e:
            return json_error(e)
        return JSONResponse({"prompt": state.tokenizer.decode(ids)})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: " + (
            "no such route" if exc.status_code == 404 else str(exc.detail))
        return json_error(ApiError(exc.status_code, msg, code=code, headers=getattr(exc, "headers", None)))

    async def server_error(request: Request, exc: Exception) -> Response:
        return json_error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"))

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
    middleware = [Middleware(ApiKeyMiddleware, keys=state.api_keys)] if state.api_keys else []
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


def model_info(served_id: str, root: str, max_model_len: int, vocab_size: int) -> ModelInfo:
    import os

    aliases = {root, os.path.basename(root.rstrip("/"))} - {""}
    return ModelInfo(served_id=served_id, aliases=frozenset(aliases), max_model_len=max_model_len,
                     vocab_size=vocab_size)

