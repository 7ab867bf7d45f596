"""The admin routes of the prompt cache: `POST /v1/cache/save` writes every kept state in memory to disk (every
rank its own shard, waiting for the writes), `POST /v1/cache/clear` drops every kept state in memory and on disk.
Both are behind the API key when one is set (the key middleware guards every path but the public ones)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cupyglm.server.bridge import EngineDied
from cupyglm.server.errors import ApiError
from cupyglm.server.guards import json_error


def cache_routes(state, not_ready) -> list[Route]:
    async def run(op: str) -> Response:
        if not state.ready:
            return json_error(not_ready(state))
        try:
            result = await state.bridge.admin(op)
        except ValueError as e:
            return json_error(ApiError(400, str(e), code="cache_unavailable"))
        except EngineDied as e:
            return json_error(ApiError(503, str(e), code="service_unavailable"))
        return JSONResponse({"object": f"cache.{op}", **result})

    async def save(request: Request) -> Response:
        return await run("save")

    async def clear(request: Request) -> Response:
        return await run("clear")

    return [Route("/v1/cache/save", save, methods=["POST"]), Route("/v1/cache/clear", clear, methods=["POST"])]
