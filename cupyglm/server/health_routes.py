"""`GET /health` (and `/ping`, GET or POST): 200 {"status": "ok"} while the engine serves, else 503 with "loading",
"stopping" or "dead" and its reason; `GET /metrics`: the Prometheus text. Both are public (no API key)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cupyglm.server.metrics import CONTENT_TYPE
from cupyglm.server.state import ServerState


def health_routes(state: ServerState) -> list[Route]:
    async def health(request: Request) -> Response:
        b = state.bridge
        if state.ready and b.alive:
            return JSONResponse({"status": "ok"})
        if b.dead is not None:
            return JSONResponse({"status": "dead", "reason": str(b.dead)}, status_code=503)
        return JSONResponse({"status": "stopping" if b.closing else "loading"}, status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    return [Route("/health", health, methods=["GET"]), Route("/ping", health, methods=["GET", "POST"]),
            Route("/metrics", metrics, methods=["GET"])]
