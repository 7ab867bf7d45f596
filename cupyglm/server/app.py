"""The HTTP app (starlette) of rank 0, assembled from its route families: chat/completions
(`cupyglm.server.completion_routes`), models and tokenizer_info (`model_routes`), health, /ping and metrics
(`health_routes`), tokenize/detokenize (`tokenize_routes`), the prompt cache's save and clear (`cache_routes`), the
Responses API and /version (`responses_routes`).

`create_app(state)` builds the ASGI app around a `ServerState` (`cupyglm.server.state`) whose bridge drives the
engine. Every error is the OpenAI error JSON; errors found before a stream opens get their HTTP status
(400/401/404/413/429/503), an error after a stream opened is one SSE `data: {"error": ...}` event followed by
`data: [DONE]`. Routes raise `ApiError` and let it go: the app's handler answers it.
"""
from __future__ import annotations

import functools
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from cupyglm.server.cache_routes import cache_routes
from cupyglm.server.completion_routes import completion_routes
from cupyglm.server.errors import ApiError, internal_error
from cupyglm.server.fields import short
from cupyglm.server.gen_path import GenPath, refused
from cupyglm.server.guards import ApiKeyMiddleware, json_error
from cupyglm.server.health_routes import health_routes
from cupyglm.server.model_routes import model_routes
from cupyglm.server.responses_routes import ChatPath, responses_routes
from cupyglm.server.state import ServerState, model_info, not_ready
from cupyglm.server.tokenize_routes import tokenize_routes

__all__ = ["ServerState", "create_app", "model_info"]


def create_app(state: ServerState, *, lifespan: Any = None) -> Starlette:
    path = GenPath(state)
    chat_path = ChatPath(path.body_json, path.need_ready, functools.partial(path.parse, "chat"), path.prompts_of,
                         path.submit_all, refused)
    routes = [*completion_routes(path), *model_routes(path), *health_routes(state), *tokenize_routes(path),
              *cache_routes(state, not_ready), *responses_routes(chat_path)]
    middleware = [Middleware(ApiKeyMiddleware, keys=state.api_keys)] if state.api_keys else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, ClientDisconnect: _client_gone,
                                        HTTPException: _http_error, Exception: _server_error})
    app.router.redirect_slashes = False          # a redirect would be built from the client's Host header
    return app


async def _api_error(request: Request, exc: ApiError) -> Response:
    """A route's refusal raised before its response began (a stream's later errors are SSE events)."""
    return json_error(exc)


async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
    return Response(status_code=499)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{short(request.method)} {short(request.scope.get('path', ''), 200)}: " + (
        "no such route" if exc.status_code == 404 else str(exc.detail))
    return json_error(ApiError(exc.status_code, msg, code=code, headers=getattr(exc, "headers", None)))


async def _server_error(request: Request, exc: Exception) -> Response:
    return json_error(internal_error(exc))
