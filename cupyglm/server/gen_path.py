"""The steps every generating route shares (/v1/chat/completions, /v1/completions, /v1/responses): read the body
as JSON, require a ready engine, parse the request off the event loop, build the prompts' token ids and submit one
engine request per choice; and the API errors of the engine's refusals.
"""
from __future__ import annotations

import re

from starlette.requests import Request

from cupyglm.server.bridge import EngineDied, RequestStream
from cupyglm.server.errors import ApiError, bad, internal_error
from cupyglm.server.fields import parse_json_object
from cupyglm.server.guards import check_json_type, read_body
from cupyglm.server.guide_prep import parse_request
from cupyglm.server.images import image_parts
from cupyglm.server.requests import GenRequest, ModelInfo, choice_seed, fit_context
from cupyglm.server.state import ServerState, not_ready

RETRY_AFTER_S = 1
INLINE_JSON_BYTES = 64 * 1024      # larger bodies are parsed in the worker pool
PROCESS_JSON_BYTES = 1024 * 1024   # and larger still in its process (json.loads holds the GIL throughout)

_FIELD = re.compile(r"\b(temperature|top_p|top_k|min_p|seed|max_tokens|min_tokens|stop_token_ids|stop|"
                    r"ignore_eos)\b")


def engine_error(e: BaseException, req: GenRequest | None = None) -> ApiError:
    """The API error of an exception the engine raised on submit (queue full, too long, dead, a bad value)."""
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


def refused(d) -> ApiError | None:
    """The error reply for a request the engine refused while running it (finish_reason "error", e.g. the KV
    host rows' slot guard): 400 invalid_request_error, since the same request fails again on this server while the
    next one is served (a 5xx would invite the client's retries, and the server is healthy)."""
    if not (d.finished and d.finish_reason == "error"):
        return None
    return ApiError(400, d.error or "the engine refused the request", code="request_refused")


class GenPath:
    """The shared steps, reading `state` at each call (the tokenizer and info arrive once the engine is ready)."""

    def __init__(self, state: ServerState):
        self.state = state

    async def body_json(self, request: Request) -> dict:
        check_json_type(request)
        raw = await read_body(request, self.state.max_body_bytes, self.state.body_timeout_s)
        if len(raw) <= INLINE_JSON_BYTES:
            return parse_json_object(raw)
        if len(raw) <= PROCESS_JSON_BYTES:
            return await self.state.pool.run(parse_json_object, raw)
        return await self.state.pool.parse_big(raw)

    def need_ready(self) -> ModelInfo:
        if not self.state.ready:
            raise not_ready(self.state)
        assert self.state.info is not None
        return self.state.info

    async def parse(self, kind: str, body: dict, info: ModelInfo) -> GenRequest:
        """The request of `kind` ("chat" or "completion"), parsed in the worker pool."""
        guides = getattr(self.state.bridge.engine, "guides", None)
        return await parse_request(self.state.pool, kind, body, info, guides)

    def token_text(self, token_id: int) -> str:
        return self.state.tokenizer.decode([token_id])

    async def prompts_of(self, req: GenRequest) -> list[list[int]]:
        pool, pb = self.state.pool, self.state.prompts()
        if req.kind == "chat":
            pb.check_messages(req.messages)
            parts = image_parts(req.messages)
            if parts:                  # decoded, preprocessed and expanded in the pool too
                ids, req.images = await pool.run(self._image_prompt, pb, req, parts)
                return [ids]
            return [await pool.run(pb.chat_ids, req.messages, req.add_generation_prompt, req.chat_kwargs,
                                   pb.max_model_len - 1)]
        out = []
        for p in req.prompts:
            if isinstance(p, list):
                out.append(list(p))
            else:
                pb.check_chars("prompt", len(p))
                out.append(await pool.run(pb.text_ids, p, pb.max_model_len - 1))
        return out

    def _image_prompt(self, pb, req: GenRequest, parts: list[dict]):
        """(prompt ids, images) of a chat request with image parts (a worker thread)."""
        if self.state.vision is None:
            raise bad("messages", "this server serves no images")
        ids = pb.chat_ids(req.messages, req.add_generation_prompt, req.chat_kwargs, pb.max_model_len - 1)
        return self.state.vision.prompt(ids, parts)

    def submit_all(self, req: GenRequest, prompts: list[list[int]], info: ModelInfo) -> list[RequestStream]:
        """One engine request per choice (prompt j, choice i: index j * n + i, seed choice_seed(seed, i)); all or
        none: a refusal part-way aborts the ones already queued."""
        plans = []
        for ids in prompts:
            sampling = fit_context(req, len(ids), info)
            if req.per > req.n and sampling["logprobs"] is None:
                sampling["logprobs"] = 0                  # best_of ranks by them (left out of the reply)
            for i in range(req.per):
                try:
                    params = self.state.make_params(**{**sampling, "seed": choice_seed(sampling["seed"], i)})
                except ValueError as e:
                    raise engine_error(e, req) from None
                plans.append((ids, params))
        self.need_ready()
        streams: list[RequestStream] = []
        try:
            for ids, params in plans:
                streams.append(self.state.bridge.submit(ids, params, cache_salt=req.cache_salt, images=req.images))
        except Exception as e:  # noqa: BLE001 - QueueFull, RequestTooLong, ValueError, EngineDied
            for st in streams:
                st.abort()
            raise engine_error(e, req) from None
        return streams
