"""`POST /v1/chat/completions` and `POST /v1/completions`: one engine request per choice (cupyglm.server.gen_path),
given back as SSE chunks or as one reply (best_of picks the n best of the candidates). An error after a stream
opened is one SSE `data: {"error": ...}` event followed by `data: [DONE]`.
"""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cupyglm.server import best_of
from cupyglm.server.bridge import EngineDied, RequestStream, merge_streams
from cupyglm.server.errors import ApiError
from cupyglm.server.gen_path import GenPath, refused
from cupyglm.server.guards import json_error, wait_disconnect
from cupyglm.server.requests import GenRequest
from cupyglm.server.responses import (Reply, chat_response, chunk, completion_response, entries, new_id, now,
                                      prompt_only, usage_chunk, usage_of)
from cupyglm.server.sse import SSE_DONE, sse, sse_error


def completion_routes(path: GenPath) -> list[Route]:
    async def generate(request: Request, kind: str) -> Response:
        body = await path.body_json(request)
        info = path.need_ready()
        req = await path.parse(kind, body, info)
        prompts = await path.prompts_of(req)
        streams = path.submit_all(req, prompts, info)
        replies = _replies(path, req, prompts, len(streams))
        if req.stream:
            return StreamingResponse(_stream(path, req, streams, replies), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(path, request, req, streams, replies)

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    return [Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"])]


def _replies(path: GenPath, req: GenRequest, prompts: list[list[int]], n: int) -> list[Reply]:
    """One reply per engine request (k = prompt j * per + choice i); chat replies parse the GLM output."""
    rid, created = new_id("chatcmpl" if req.kind == "chat" else "cmpl"), now()
    replies = [Reply(id=rid, model=req.model, created=created, prompt_ids=prompts[k // req.per], index=k,
                     counts_prompt=k % req.per == 0) for k in range(n)]
    if req.kind == "chat":
        for r in replies:
            r.glm = req.glm_output()
    if req.echo:
        for r in replies:
            p = req.prompts[r.index // req.per]
            r.echo_text = p if isinstance(p, str) else path.state.tokenizer.decode(r.prompt_ids)
    return replies


async def _stream(path: GenPath, req: GenRequest, streams: list[RequestStream], replies: list[Reply]):
    first = [True] * len(replies)
    try:
        try:
            async for k, d in merge_streams(streams):
                err = refused(d)
                if err is not None:
                    yield sse_error(err)
                    yield SSE_DONE
                    return
                c = _chunk_of(path, req, replies[k], prompt_only(d) if req.prompt_only else d, first[k])
                if c is not None:
                    yield sse(c)
                    first[k] = False
        except EngineDied as e:
            yield sse_error(ApiError(503, str(e), code="service_unavailable"))
            yield SSE_DONE
            return
        if req.include_usage:
            yield sse(usage_chunk(req.kind, replies))
        yield SSE_DONE
    finally:
        for st in streams:
            st.abort()       # no-op once finished; a client gone mid-stream frees its pages


def _chunk_of(path: GenPath, req: GenRequest, reply: Reply, d, first: bool) -> dict | None:
    """Add delta `d` to `reply`; its SSE chunk, or None when it carries nothing to send."""
    offset = len(reply.text) + len(reply.echo_text or "")
    reply.add(d)
    lp = entries(d) if d.logprobs is not None else None
    text = d.text
    if first and reply.echo_text is not None:      # echo: the prompt comes first
        text, offset = reply.echo_text + text, 0
        lp = None if lp is None else reply.echo_entries() + lp
    if not (first or d.text or d.finished or (req.return_token_ids and d.token_ids) or lp):
        return None
    c = chunk(req.kind, reply, text=text, first=first,
              token_ids=d.token_ids if req.return_token_ids else None,
              prompt_ids=reply.prompt_ids if (first and req.return_token_ids) else None,
              finish_reason=reply.finish_reason if d.finished else None,
              logprobs=lp, text_of=path.token_text, text_offset=offset)
    if req.continuous_usage:
        c["usage"] = reply.usage()
    return c


async def _collect(path: GenPath, request: Request, req: GenRequest, streams: list[RequestStream],
                   replies: list[Reply]) -> Response:
    async def watch() -> None:
        await wait_disconnect(request)
        for st in streams:
            st.abort()
            st.queue.put_nowait(EngineDied("client disconnected"))

    watcher = asyncio.ensure_future(watch())
    try:
        try:
            async for k, d in merge_streams(streams):
                err = refused(d)
                if err is not None:
                    return json_error(err)
                replies[k].add(prompt_only(d) if req.prompt_only else d)
        except EngineDied as e:
            return json_error(ApiError(503, str(e), code="service_unavailable"))
    finally:
        watcher.cancel()
        for st in streams:
            st.abort()
    build = chat_response if req.kind == "chat" else completion_response
    if req.per == req.n:
        return JSONResponse(build(replies, req.return_token_ids, path.token_text))
    body = build(best_of.pick(replies, req.per, req.n, req.sampling["logprobs"] is not None),
                 req.return_token_ids, path.token_text)
    return JSONResponse({**body, "usage": usage_of(replies)})      # every candidate's tokens count
