"""`POST /v1/responses` (OpenAI's Responses API, as vLLM serves it) and `GET /version`.

A Responses request runs as the chat request it converts to (cupyglm.server.responses_input): the same
validation, prompt, engine requests and GLM output parsing as /v1/chat/completions, given back as output items
(cupyglm.server.responses_output). Streamed, it is the Responses event sequence: `response.created`,
`response.in_progress`, the item / content-part / delta events, then `response.completed` (or
`response.incomplete` when max_output_tokens ended it), each with its `sequence_number`; an error after the stream
opened is one `error` event.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cupyglm.server.bridge import EngineDied, RequestStream, merge_streams
from cupyglm.server.errors import ApiError
from cupyglm.server.guards import json_error, wait_disconnect
from cupyglm.server.requests import GenRequest
from cupyglm.server.responses import Reply, now
from cupyglm.server.responses_input import to_chat
from cupyglm.server.responses_output import OutputItems, response_object, responses_usage, status_of
from cupyglm.server.sse import dumps


@dataclasses.dataclass(frozen=True)
class ChatPath:
    """The chat route's steps, shared with /v1/responses (built in cupyglm.server.app)."""

    body_json: Callable[[Request], Any]          # async: the request body as a JSON object
    need_ready: Callable[[], Any]                # the ModelInfo, or ApiError 503
    parse: Callable[[dict, Any], Any]            # async: (chat body, ModelInfo) -> GenRequest, off the event loop
    prompts_of: Callable[[GenRequest], Any]      # async: the prompt ids of each prompt
    submit_all: Callable[..., list[RequestStream]]
    refused: Callable[[Any], ApiError | None]    # the error of a Delta the engine refused, else None


@dataclasses.dataclass
class _Run:
    """One Responses request being answered: its reply (chat fields, tokens) and its output items."""

    body: dict
    reply: Reply
    items: OutputItems = dataclasses.field(default_factory=OutputItems)
    reasoning_tokens: int = 0

    def step(self, d) -> list[dict]:
        self.reply.add(d)
        if self.reply.glm.mode == "reasoning" or "reasoning_content" in self.reply.fields:
            self.reasoning_tokens += len(d.token_ids)       # tokens written inside the thinking block
        ev = self.items.feed(self.reply.fields)
        return ev + self.items.close() if d.finished else ev

    def response(self, status: str | None = None) -> dict:
        r = self.reply
        usage = None if status else responses_usage(len(r.prompt_ids), len(r.token_ids), r.cached_tokens,
                                                    self.reasoning_tokens)
        return response_object(r.id, r.created, r.model, self.body, status or status_of(r.finish_reason),
                               [] if status else self.items.output(), usage)


def _event(ev: dict, seq: int) -> bytes:
    return f"event: {ev['type']}\ndata: {dumps({**ev, 'sequence_number': seq})}\n\n".encode()


def _error_event(e: ApiError) -> dict:
    return {"type": "error", "code": e.code, "message": e.message, "param": e.param}


def responses_routes(path: ChatPath) -> list[Route]:
    async def create(request: Request) -> Response:
        body = await path.body_json(request)
        info = path.need_ready()
        req = await path.parse(to_chat(body), info)
        prompts = await path.prompts_of(req)
        streams = path.submit_all(req, prompts, info)
        reply = Reply(id=f"resp_{uuid.uuid4().hex}", model=req.model, created=now(), prompt_ids=prompts[0])
        reply.glm = req.glm_output()
        run = _Run(body, reply)
        if req.stream:
            return StreamingResponse(_stream(run, streams[0]), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(request, run, streams[0])

    async def _stream(run: _Run, stream: RequestStream):
        seq = 0
        try:
            for kind in ("response.created", "response.in_progress"):
                yield _event({"type": kind, "response": run.response("in_progress")}, seq)
                seq += 1
            try:
                async for _, d in merge_streams([stream]):
                    refused = path.refused(d)
                    if refused is not None:
                        yield _event(_error_event(refused), seq)
                        return
                    for ev in run.step(d):
                        yield _event(ev, seq)
                        seq += 1
            except EngineDied as e:
                yield _event(_error_event(ApiError(503, str(e), code="service_unavailable")), seq)
                return
            final = run.response()
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield _event({"type": kind, "response": final}, seq)
        finally:
            stream.abort()           # no-op once finished; a client gone mid-stream frees its pages

    async def _collect(request: Request, run: _Run, stream: RequestStream) -> Response:
        async def watch() -> None:
            await wait_disconnect(request)
            stream.abort()
            stream.queue.put_nowait(EngineDied("client disconnected"))

        watcher = asyncio.ensure_future(watch())
        try:
            try:
                async for _, d in merge_streams([stream]):
                    refused = path.refused(d)
                    if refused is not None:
                        return json_error(refused)
                    run.step(d)
            except EngineDied as e:
                return json_error(ApiError(503, str(e), code="service_unavailable"))
        finally:
            watcher.cancel()
            stream.abort()
        return JSONResponse(run.response())

    async def version(request: Request) -> Response:
        return JSONResponse({"version": _version()})

    return [Route("/v1/responses", create, methods=["POST"]), Route("/version", version, methods=["GET"])]


def _version() -> str:
    try:
        return importlib.metadata.version("cupyglm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
