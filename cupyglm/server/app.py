"""The HTTP routes (starlette) of rank 0: OpenAI chat/completions, models, health (and /ping), metrics,
tokenize/detokenize, the prompt cache's save and clear (`cupyglm.server.cache_routes`), the Responses API and
/version (`cupyglm.server.responses_routes`).

`create_app(state)` builds the ASGI app around a `ServerState` whose bridge drives the engine. Every error is
the OpenAI error JSON; errors found before a stream opens get their HTTP status (400/401/404/413/429/503), an
error after a stream opened is one SSE `data: {"error": ...}` event followed by `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cupyglm.server import best_of
from cupyglm.server.bridge import EngineBridge, EngineDied, RequestStream, merge_streams
from cupyglm.server.cache_routes import cache_routes
from cupyglm.server.errors import ApiError, bad, internal_error
from cupyglm.server.fields import parse_json_object, short
from cupyglm.server.guards import (BODY_TIMEOUT_S, ApiKeyMiddleware, check_json_type, json_error, read_body,
                                   wait_disconnect)
from cupyglm.server.guide_prep import parse_request
from cupyglm.server.metrics import CONTENT_TYPE, Metrics
from cupyglm.server.prompt import PromptBuilder, WorkPool
from cupyglm.server.requests import (GenRequest, ModelInfo, choice_seed, fit_context, parse_detokenize,
                                     parse_tokenize)
from cupyglm.server.responses import (Reply, chat_response, chunk, completion_response, entries, model_card,
                                      models_response, new_id, now, prompt_only, tokenizer_info_of, usage_chunk,
                                      usage_of)
from cupyglm.server.responses_routes import ChatPath, responses_routes
from cupyglm.server.sse import SSE_DONE, sse, sse_error

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
RETRY_AFTER_S = 1
INLINE_JSON_BYTES = 64 * 1024      # larger bodies are parsed in the worker pool
PROCESS_JSON_BYTES = 1024 * 1024   # and larger still in its process (json.loads holds the GIL throughout)


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
    allow_control_tokens: bool = False
    body_timeout_s: float = BODY_TIMEOUT_S
    created: int = dataclasses.field(default_factory=now)
    pool: WorkPool = dataclasses.field(default_factory=WorkPool)
    _prompts: PromptBuilder | None = None

    def prompts(self) -> PromptBuilder:
        """The prompt builder of the loaded tokenizer (built on first use, once `info` and `tokenizer` are set)."""
        if self._prompts is None or self._prompts.tok is not self.tokenizer:
            assert self.info is not None
            self._prompts = PromptBuilder(self.tokenizer, self.info.max_model_len,
                                          allow_control_tokens=self.allow_control_tokens)
        return self._prompts

    @property
    def ready(self) -> bool:
        return self.bridge.ready and self.bridge.dead is None and not self.bridge.closing and self.info is not None


def _not_ready(state: ServerState) -> ApiError:
    b = state.bridge
    if b.dead is not None:
        why = f"the engine stopped ({b.dead})"
    elif b.closing:
        why = "the server is shutting down"
    else:
        why = "the model is loading"
    return ApiError(503, f"not ready: {why}", code="service_unavailable", headers={"Retry-After": "1"})


_FIELD = re.compile(r"\b(temperature|top_p|top_k|min_p|seed|max_tokens|min_tokens|stop_token_ids|stop|"
                    r"ignore_eos)\b")


def _engine_error(e: BaseException, req: GenRequest | None = None) -> ApiError:
    name = type(e).__name__
    if name == "QueueFull":
        return ApiError(429, f"{e}; retry later", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if name == "RequestTooLong":
        return ApiError(400, str(e), param=req.prompt_param if req else None, code="context_length_exceeded")
    if isinstance(e, EngineDied):
        return ApiError(503, str(e), code="service_unavailable")
    if isinstance(e, ValueError):
        m = _FIELD.search(str(e))
        return bad(m.group(1) if m else None, str(e))
    return internal_error(e)


def _refused(d) -> ApiError | None:
    """The error reply for a request the engine refused while running it (finish_reason "error", e.g. the KV
    host rows' slot guard): 400 invalid_request_error, since the same request fails again on this server while the
    next one is served (a 5xx would invite the client's retries, and the server is healthy)."""
    if not (d.finished and d.finish_reason == "error"):
        return None
    return ApiError(400, d.error or "the engine refused the request", code="request_refused")


# ---- the app ----------------------------------------------------------------------------------------------------

def create_app(state: ServerState, *, lifespan: Any = None) -> Starlette:
    async def body_json(request: Request) -> dict:
        check_json_type(request)
        raw = await read_body(request, state.max_body_bytes, state.body_timeout_s)
        if len(raw) <= INLINE_JSON_BYTES:
            return parse_json_object(raw)
        if len(raw) <= PROCESS_JSON_BYTES:
            return await state.pool.run(parse_json_object, raw)
        return await state.pool.parse_big(raw)

    def need_ready() -> ModelInfo:
        if not state.ready:
            raise _not_ready(state)
        assert state.info is not None
        return state.info

    async def parse_off_loop(kind: str, body: dict, info: ModelInfo) -> GenRequest:
        return await parse_request(state.pool, kind, body, info, getattr(state.bridge.engine, "guides", None))

    def token_text(token_id: int) -> str:
        return state.tokenizer.decode([token_id])

    async def prompts_of(req: GenRequest) -> list[list[int]]:
        pb = state.prompts()
        if req.kind == "chat":
            pb.check_messages(req.messages)
            return [await state.pool.run(pb.chat_ids, req.messages, req.add_generation_prompt, req.chat_kwargs,
                                         pb.max_model_len - 1)]
        out = []
        for p in req.prompts:
            if isinstance(p, list):
                out.append(list(p))
            else:
                pb.check_chars("prompt", len(p))
                out.append(await state.pool.run(pb.text_ids, p, pb.max_model_len - 1))
        return out

    def submit_all(req: GenRequest, prompts: list[list[int]], info: ModelInfo) -> list[RequestStream]:
        """One engine request per choice (prompt j, choice i: index j * n + i, seed choice_seed(seed, i)); all or
        none: a refusal part-way aborts the ones already queued."""
        plans = []
        for ids in prompts:
            sampling = fit_context(req, len(ids), info)
            if req.per > req.n and sampling["logprobs"] is None:
                sampling["logprobs"] = 0                  # best_of ranks by them (left out of the reply)
            for i in range(req.per):
                try:
                    params = state.make_params(**{**sampling, "seed": choice_seed(sampling["seed"], i)})
                except ValueError as e:
                    raise _engine_error(e, req) from None
                plans.append((ids, params))
        need_ready()
        streams: list[RequestStream] = []
        try:
            for ids, params in plans:
                streams.append(state.bridge.submit(ids, params, cache_salt=req.cache_salt))
        except Exception as e:  # noqa: BLE001 - QueueFull, RequestTooLong, ValueError, EngineDied
            for st in streams:
                st.abort()
            raise _engine_error(e, req) from None
        return streams

    async def generate(request: Request, kind: str) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
            req = await parse_off_loop(kind, body, info)
            prompts = await prompts_of(req)
            streams = submit_all(req, prompts, info)
        except ApiError as e:
            return json_error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        rid, created = new_id("chatcmpl" if kind == "chat" else "cmpl"), now()
        replies = [Reply(id=rid, model=req.model, created=created, prompt_ids=prompts[k // req.per], index=k,
                         counts_prompt=k % req.per == 0) for k in range(len(streams))]
        if req.kind == "chat":
            for r in replies:
                r.glm = req.glm_output()
        if req.echo:
            for r in replies:
                p = req.prompts[r.index // req.per]
                r.echo_text = p if isinstance(p, str) else state.tokenizer.decode(r.prompt_ids)
        if req.stream:
            return StreamingResponse(_stream(req, streams, replies), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(request, req, streams, replies)

    async def _stream(req: GenRequest, streams: list[RequestStream], replies: list[Reply]):
        first = [True] * len(replies)
        try:
            try:
                async for k, d in merge_streams(streams):
                    refused = _refused(d)
                    if refused is not None:
                        yield sse_error(refused)
                        yield SSE_DONE
                        return
                    d = prompt_only(d) if req.prompt_only else d
                    reply = replies[k]
                    offset = len(reply.text) + len(reply.echo_text or "")
                    reply.add(d)
                    lp = entries(d) if d.logprobs is not None else None
                    text = d.text
                    if first[k] and reply.echo_text is not None:      # echo: the prompt comes first
                        text, offset = reply.echo_text + text, 0
                        lp = None if lp is None else reply.echo_entries() + lp
                    if first[k] or d.text or d.finished or (req.return_token_ids and d.token_ids) or lp:
                        c = chunk(req.kind, reply, text=text, first=first[k],
                                  token_ids=d.token_ids if req.return_token_ids else None,
                                  prompt_ids=reply.prompt_ids if (first[k] and req.return_token_ids) else None,
                                  finish_reason=reply.finish_reason if d.finished else None,
                                  logprobs=lp, text_of=token_text, text_offset=offset)
                        if req.continuous_usage:
                            c["usage"] = reply.usage()
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

    async def _collect(request: Request, req: GenRequest, streams: list[RequestStream],
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
                    refused = _refused(d)
                    if refused is not None:
                        return json_error(refused)
                    d = prompt_only(d) if req.prompt_only else d
                    replies[k].add(d)
            except EngineDied as e:
                return json_error(ApiError(503, str(e), code="service_unavailable"))
        finally:
            watcher.cancel()
            for st in streams:
                st.abort()
        build = chat_response if req.kind == "chat" else completion_response
        if req.per == req.n:
            return JSONResponse(build(replies, req.return_token_ids, token_text))
        body = build(best_of.pick(replies, req.per, req.n, req.sampling["logprobs"] is not None),
                     req.return_token_ids, token_text)
        return JSONResponse({**body, "usage": usage_of(replies)})      # every candidate's tokens count

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

    async def model(request: Request) -> Response:
        try:
            info = need_ready()
            name = request.path_params["model_id"]
            if name != info.served_id and name not in info.aliases:
                raise ApiError(404, f"The model '{short(name)}' does not exist; this server serves "
                               f"'{info.served_id}'", param="model", code="model_not_found")
        except ApiError as e:
            return json_error(e)
        return JSONResponse(model_card(info, state.root, state.created))

    async def tokenizer_info(request: Request) -> Response:
        try:
            info = need_ready()
        except ApiError as e:
            return json_error(e)
        return JSONResponse(tokenizer_info_of(state.tokenizer, info))

    async def health(request: Request) -> Response:
        b = state.bridge
        if state.ready and b.alive:
            return JSONResponse({"status": "ok"})
        if b.dead is not None:
            return JSONResponse({"status": "dead", "reason": str(b.dead)}, status_code=503)
        return JSONResponse({"status": "stopping" if b.closing else "loading"}, status_code=503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def tokenize(request: Request) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
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
        except ApiError as e:
            return json_error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": info.max_model_len})

    async def detokenize(request: Request) -> Response:
        try:
            body = await body_json(request)
            info = need_ready()
            ids = parse_detokenize(body, info)
            text = await state.pool.run(state.tokenizer.decode, ids)
        except ApiError as e:
            return json_error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse({"prompt": text})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{short(request.method)} {short(request.scope.get('path', ''), 200)}: " + (
            "no such route" if exc.status_code == 404 else str(exc.detail))
        return json_error(ApiError(exc.status_code, msg, code=code, headers=getattr(exc, "headers", None)))

    async def server_error(request: Request, exc: Exception) -> Response:
        return json_error(internal_error(exc))

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        *cache_routes(state, _not_ready),
        *responses_routes(ChatPath(body_json, need_ready, functools.partial(parse_off_loop, "chat"), prompts_of, submit_all, _refused)),
    ]
    middleware = [Middleware(ApiKeyMiddleware, keys=state.api_keys)] if state.api_keys else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.router.redirect_slashes = False          # a redirect would be built from the client's Host header
    return app


def model_info(served_id: str, root: str, max_model_len: int, vocab_size: int, prompt_cache: bool = False,
               mtp_drafts: int = 0) -> ModelInfo:
    import os

    aliases = {root, os.path.basename(root.rstrip("/"))} - {""}
    return ModelInfo(served_id=served_id, aliases=frozenset(aliases), max_model_len=max_model_len,
                     vocab_size=vocab_size, prompt_cache=prompt_cache, mtp_drafts=mtp_drafts)

