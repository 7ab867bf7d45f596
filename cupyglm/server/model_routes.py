"""`GET /v1/models`, `GET /v1/models/{model_id}` (the served id or one of its aliases, else 404) and
`GET /tokenizer_info`: what the server serves, answered once the engine is ready."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cupyglm.server.errors import ApiError
from cupyglm.server.fields import short
from cupyglm.server.gen_path import GenPath
from cupyglm.server.responses import model_card, models_response, tokenizer_info_of


def model_routes(path: GenPath) -> list[Route]:
    state = path.state

    async def models(request: Request) -> Response:
        info = path.need_ready()
        return JSONResponse(models_response(info, state.root, state.created))

    async def model(request: Request) -> Response:
        info = path.need_ready()
        name = request.path_params["model_id"]
        if name != info.served_id and name not in info.aliases:
            raise ApiError(404, f"The model '{short(name)}' does not exist; this server serves "
                           f"'{info.served_id}'", param="model", code="model_not_found")
        return JSONResponse(model_card(info, state.root, state.created))

    async def tokenizer_info(request: Request) -> Response:
        info = path.need_ready()
        return JSONResponse(tokenizer_info_of(state.tokenizer, info))

    return [Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model, methods=["GET"]),
            Route("/tokenizer_info", tokenizer_info, methods=["GET"])]
