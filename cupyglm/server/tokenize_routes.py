"""`POST /tokenize` (chat messages, a text or token ids -> ids, with the count and max_model_len) and
`POST /detokenize` (ids -> text), both run in the worker pool off the event loop."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cupyglm.server.gen_path import GenPath
from cupyglm.server.requests import parse_detokenize, parse_tokenize


def tokenize_routes(path: GenPath) -> list[Route]:
    state = path.state

    async def tokenize(request: Request) -> Response:
        body = await path.body_json(request)
        info = path.need_ready()
        t = parse_tokenize(body, info)
        pb = state.prompts()
        if "messages" in t:
            pb.check_messages(t["messages"])
            ids = await state.pool.run(pb.chat_ids, t["messages"], t["add_generation_prompt"], t["chat_kwargs"])
        elif "ids" in t:
            ids = t["ids"]
        else:
            pb.check_chars("prompt", len(t["text"]))
            ids = await state.pool.run(pb.text_ids, t["text"])
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": info.max_model_len})

    async def detokenize(request: Request) -> Response:
        body = await path.body_json(request)
        info = path.need_ready()
        ids = parse_detokenize(body, info)
        text = await state.pool.run(state.tokenizer.decode, ids)
        return JSONResponse({"prompt": text})

    return [Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"])]
