"""Test doubles: a small OpenAI-compatible server (starlette + uvicorn in a thread on 127.0.0.1, port 0).

    with FakeServer(DoubleConfig(deterministic=False)) as srv:
        srv.base_url   # http://127.0.0.1:PORT/v1

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (SSE streaming only), POST /tokenize.
Tokens are a function of (prompt tokens, temperature, seed), so the deterministic double is exact; knobs make it
misbehave on purpose: `deterministic=False` perturbs tokens from position `diverge_at` on every request,
`cached="always"` reports cached_tokens > 0, `fail_every=k` answers every k-th generation request with an error
(alternating 500 and 429 with Retry-After), `stream_error_every=k` breaks the stream of every k-th request
with an SSE error event. It records the request bodies and the most requests it had in flight at once.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import zlib
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .client import token_sha


@dataclass
class DoubleConfig:
    model: str = "fake-glm"
    max_model_len: int = 32768
    vocab_size: int = 5000
    deterministic: bool = True
    diverge_at: int = 3             # nondeterministic: tokens from this position on change per request
    cached: str = "real"            # real (a simulated prefix cache) | always | never | absent
    block: int = 16                 # cache granularity of the simulated prefix cache
    send_token_sha: bool = True     # put token_sha on the final chunk
    honour_token_ids: bool = True   # token_ids / prompt_token_ids when return_token_ids
    tokenize: bool = True           # serve /tokenize
    models_route: bool = True       # serve /v1/models
    fail_every: int = 0             # every k-th generation request fails before the stream opens
    stream_error_every: int = 0     # every k-th generation request sends an SSE error event mid-stream
    ttft_s: float = 0.0             # delay before the first token
    itl_s: float = 0.0              # delay between tokens
    tokens_per_chunk: int = 1
    draft_differs: bool = False     # "draft": false gives different tokens (a drafting bug)


def tokenize_text(text: str, vocab: int) -> list[int]:
    """Whitespace words -> ids in [10, vocab) by CRC32 (stable across processes)."""
    return [10 + zlib.crc32(w.encode()) % (vocab - 10) for w in text.split()]


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)       # salt -> list of prompt tuples seen


class FakeServer:
    def __init__(self, cfg: DoubleConfig | None = None):
        self.cfg = cfg or DoubleConfig()
        self.state = _State()
        self.app = Starlette(routes=[
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
        ])
        self._server = None
        self._thread = None
        self.port = None

    # ---- lifecycle ----
    def start(self) -> "FakeServer":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="error", lifespan="off",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def max_in_flight(self) -> int:
        return self.state.max_in_flight

    @property
    def bodies(self) -> list:
        return list(self.state.bodies)

    # ---- routes ----
    async def _models(self, request: Request):
        c = self.cfg
        if not c.models_route:
            return _error(404, "not found", "not_found")
        return JSONResponse({"object": "list", "data": [
            {"id": c.model, "object": "model", "root": c.model, "owned_by": "doubles",
             "max_model_len": c.max_model_len}]})

    async def _tokenize(self, request: Request):
        if not self.cfg.tokenize:
            return _error(404, "not found", "not_found")
        body = await request.json()
        toks = tokenize_text(body.get("prompt", ""), self.cfg.vocab_size)
        return JSONResponse({"tokens": toks, "count": len(toks), "max_model_len": self.cfg.max_model_len})

    async def _completions(self, request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, str):
            ids = tokenize_text(prompt, self.cfg.vocab_size)
        else:
            return _error(400, "prompt must be a string or a list of token ids", "invalid_request_error")
        return await self._generate(body, ids, chat=False)

    async def _chat(self, request: Request):
        body = await request.json()
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return _error(400, "messages must be a non-empty list", "invalid_request_error")
        think = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        text = "".join(f"<|{m.get('role')}|> {m.get('content', '')} " for m in msgs) + \
            ("<|assistant|> " if think else "<|assistant|> <think></think> ")
        return await self._generate(body, tokenize_text(text, self.cfg.vocab_size), chat=True)

    # ---- generation ----
    def _tokens(self, body: dict, ids: list[int], n: int, counter: int) -> list[int]:
        c = self.cfg
        temp = float(body.get("temperature", 1.0) or 0.0)
        seed = body.get("seed") if temp > 0 else 0
        key = f"{ids}|{temp}|{seed}|{c.draft_differs and body.get('draft') is False}"
        h = hashlib.sha256(key.encode()).digest()
        toks = []
        for i in range(n):
            x = int.from_bytes(hashlib.sha256(h + i.to_bytes(4, "little")).digest()[:4], "little")
            if temp > 0 and seed is None:
                x ^= counter * 7919                     # unseeded sampling: differs every time
            if not c.deterministic and i >= c.diverge_at:
                x += counter
            toks.append(10 + x % (c.vocab_size - 10))
        return toks

    def _cached(self, salt, ids: list[int]) -> int | None:
        c = self.cfg
        if c.cached == "absent":
            return None
        if c.cached == "never":
            return 0
        if c.cached == "always":
            return max(1, (len(ids) - 1) // c.block * c.block)
        with self.state.lock:
            seen = self.state.cache.setdefault(str(salt), [])
            best = 0
            for prev in seen:
                k = 0
                for a, b in zip(prev, ids):
                    if a != b:
                        break
                    k += 1
                best = max(best, k)
            seen.append(tuple(ids))
        best = min(best, len(ids) - 1)
        return best // c.block * c.block

    async def _generate(self, body: dict, ids: list[int], chat: bool):
        c = self.cfg
        st = self.state
        with st.lock:
            st.requests += 1
            counter = st.requests
            st.bodies.append(body)
            st.arrivals.append(time.perf_counter())
        if body.get("model") not in (None, c.model):
            return _error(404, f"model {body.get('model')!r} not found", "not_found_error")
        if c.fail_every and counter % c.fail_every == 0:
            if (counter // c.fail_every) % 2:
                return _error(500, "injected failure", "server_error")
            return _error(429, "queue full", "rate_limit_exceeded", headers={"Retry-After": "1"})
        if not body.get("stream"):
            return _error(400, "this double only streams", "invalid_request_error")
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if len(ids) + n > c.max_model_len:
            return _error(400, "context too long", "invalid_request_error", code="context_length_exceeded")
        toks = self._tokens(body, ids, n, counter)
        cached = self._cached(body.get("cache_salt"), ids)
        want_ids = bool(body.get("return_token_ids")) and c.honour_token_ids
        usage_on = bool((body.get("stream_options") or {}).get("include_usage"))
        broken = bool(c.stream_error_every and counter % c.stream_error_every == 0)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{counter}"
        with st.lock:
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)

        def frame(choice: dict, **top) -> str:
            obj = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": int(time.time()), "model": c.model, "choices": [choice], **top}
            return f"data: {json.dumps(obj)}\n\n"

        async def gen():
            try:
                if c.ttft_s:
                    await asyncio.sleep(c.ttft_s)
                first = {"prompt_token_ids": ids} if want_ids else {}
                if chat:
                    yield frame({"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "finish_reason": None}, **first)
                    first = {}
                step = max(1, c.tokens_per_chunk)
                for i in range(0, n, step):
                    if i and c.itl_s:
                        await asyncio.sleep(c.itl_s)
                    if broken and i >= n // 2:
                        yield 'data: {"error": {"message": "injected stream error", "type": "server_error", ' \
                              '"param": null, "code": 500}}\n\n'
                        break
                    part = toks[i:i + step]
                    text = "".join(f" t{t}" for t in part)
                    last = i + step >= n
                    ch = {"index": 0, "finish_reason": "length" if last else None}
                    if chat:
                        ch["delta"] = {"content": text}
                    else:
                        ch["text"] = text
                    if want_ids:
                        ch["token_ids"] = part
                    extra = dict(first)
                    first = {}
                    if last and c.send_token_sha:
                        extra["token_sha"] = token_sha(toks)
                    yield frame(ch, **extra)
                if usage_on and not broken:
                    usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
                    if cached is not None:
                        usage["prompt_tokens_details"] = {"cached_tokens": cached}
                    obj = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": c.model, "choices": [], "usage": usage}
                    yield f"data: {json.dumps(obj)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                with st.lock:
                    st.in_flight -= 1

        return StreamingResponse(gen(), media_type="text/event-stream")


def _error(status: int, message: str, typ: str, code=None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": typ, "param": None, "code": code or status}},
                        status_code=status, headers=headers)
